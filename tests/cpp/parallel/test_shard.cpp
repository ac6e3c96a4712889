// Shard layout of FSDP units against hand-computed ranges and an element-by-element reference.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/shard.h"

namespace {

// [begin, end) of the real elements rank r holds, written out by hand.
struct Expected {
  int64_t numel;
  int n;
  int64_t shard;
  std::vector<std::pair<int64_t, int64_t>> owned;
};

TEST(ShardLayout, HandComputedRanges) {
  const std::vector<Expected> cases = {
      {10, 4, 3, {{0, 3}, {3, 6}, {6, 9}, {9, 10}}},
      {12, 4, 3, {{0, 3}, {3, 6}, {6, 9}, {9, 12}}},
      {5, 4, 2, {{0, 2}, {2, 4}, {4, 5}, {5, 5}}},  // rank 3: padding only
      {1, 4, 1, {{0, 1}, {1, 1}, {1, 1}, {1, 1}}},
      {0, 3, 0, {{0, 0}, {0, 0}, {0, 0}}},
      {7, 1, 7, {{0, 7}}},
      {7, 2, 4, {{0, 4}, {4, 7}}},
      {1000003, 8, 125001, {{0, 125001}, {125001, 250002}, {250002, 375003}, {375003, 500004},
                            {500004, 625005}, {625005, 750006}, {750006, 875007},
                            {875007, 1000003}}},
  };
  for (const auto& c : cases) {
    const mx::ShardLayout l = mx::make_shard_layout(c.numel, c.n);
    SCOPED_TRACE(testing::Message() << "numel " << c.numel << " n " << c.n);
    EXPECT_EQ(l.shard_numel, c.shard);
    EXPECT_EQ(l.padded_numel, c.shard * c.n);
    for (int r = 0; r < c.n; ++r) {
      EXPECT_EQ(l.shard_begin(r), r * c.shard);
      EXPECT_EQ(l.shard_end(r), (r + 1) * c.shard);
      const int64_t begin = c.owned[r].first, end = c.owned[r].second;
      EXPECT_EQ(l.valid_numel(r), end - begin) << "rank " << r;
      EXPECT_EQ(l.padding_numel(r), c.shard - (end - begin)) << "rank " << r;
      if (end > begin) {
        EXPECT_EQ(l.owner_of(begin), r);
        EXPECT_EQ(l.owner_of(end - 1), r);
      }
    }
  }
}

TEST(ShardLayout, Alignment) {
  // 1000 over 3 ranks: ceil = 334, aligned to 16 -> 336; padded 1008; rank 2 holds 1000 - 672.
  const mx::ShardLayout l = mx::make_shard_layout(1000, 3, 16);
  EXPECT_EQ(l.shard_numel, 336);
  EXPECT_EQ(l.padded_numel, 1008);
  EXPECT_EQ(l.valid_numel(0), 336);
  EXPECT_EQ(l.valid_numel(2), 328);
  EXPECT_EQ(mx::make_shard_layout(32, 2, 16).shard_numel, 16);  // already aligned: unchanged
  EXPECT_EQ(mx::make_shard_layout(33, 2, 16).shard_numel, 32);
}

TEST(ShardLayout, EveryElementOwnedOnceForManySizes) {
  for (int n = 1; n <= 9; ++n) {
    for (int64_t numel = 0; numel <= 70; ++numel) {
      const mx::ShardLayout l = mx::make_shard_layout(numel, n);
      SCOPED_TRACE(testing::Message() << "numel " << numel << " n " << n);
      // shard is the smallest s with s * n >= numel.
      EXPECT_GE(l.shard_numel * n, numel);
      if (l.shard_numel > 0) {
        EXPECT_LT((l.shard_numel - 1) * n, numel);
      }
      EXPECT_LT(l.padded_numel - numel, n);  // fewer than n padding elements in all
      std::vector<int> owners(numel, -1);
      int64_t valid_total = 0;
      for (int r = 0; r < n; ++r) {
        valid_total += l.valid_numel(r);
        for (int64_t k = 0; k < l.valid_numel(r); ++k) {
          const int64_t g = l.shard_begin(r) + k;  // real elements come first in a shard
          ASSERT_LT(g, numel);
          EXPECT_EQ(owners[g], -1) << "element " << g << " owned twice";
          owners[g] = r;
        }
      }
      EXPECT_EQ(valid_total, numel);
      for (int64_t g = 0; g < numel; ++g) {
        ASSERT_NE(owners[g], -1) << "element " << g << " owned by nobody";
        EXPECT_EQ(l.owner_of(g), owners[g]);
      }
    }
  }
}

TEST(ShardSlices, HandComputed) {
  const mx::ShardLayout l = mx::make_shard_layout(10, 4);  // shards of 3: 0-2 3-5 6-8 9
  using S = mx::ShardSlice;
  EXPECT_EQ(mx::shard_slices(l, 0, 10),
            (std::vector<S>{{0, 0, 0, 3}, {1, 3, 0, 3}, {2, 6, 0, 3}, {3, 9, 0, 1}}));
  EXPECT_EQ(mx::shard_slices(l, 2, 7), (std::vector<S>{{0, 2, 2, 1}, {1, 3, 0, 3}, {2, 6, 0, 1}}));
  EXPECT_EQ(mx::shard_slices(l, 4, 5), (std::vector<S>{{1, 4, 1, 1}}));
  EXPECT_EQ(mx::shard_slices(l, 9, 10), (std::vector<S>{{3, 9, 0, 1}}));
  EXPECT_TRUE(mx::shard_slices(l, 6, 6).empty());
  EXPECT_THROW(mx::shard_slices(l, 3, 11), std::logic_error);
  EXPECT_THROW(mx::shard_slices(l, 5, 4), std::logic_error);
}

TEST(ShardSlices, MatchElementByElementReferenceForManyRanges) {
  for (int n : {1, 2, 3, 4, 5, 8}) {
    for (int64_t numel : {1, 2, 7, 16, 17, 31}) {
      const mx::ShardLayout l = mx::make_shard_layout(numel, n);
      for (int64_t b = 0; b <= numel; ++b) {
        for (int64_t e = b; e <= numel; ++e) {
          SCOPED_TRACE(testing::Message() << "numel " << numel << " n " << n << " [" << b << ","
                                          << e << ")");
          // Reference: walk the elements, starting a new slice whenever the owner changes.
          std::vector<mx::ShardSlice> want;
          for (int64_t g = b; g < e; ++g) {
            const int r = static_cast<int>(g / l.shard_numel);
            if (want.empty() || want.back().rank != r)
              want.push_back({r, g, g - r * l.shard_numel, 0});
            ++want.back().numel;
          }
          EXPECT_EQ(mx::shard_slices(l, b, e), want);
        }
      }
    }
  }
}

TEST(ShardSlices, ReshardingFourRanksToThree) {
  // Checkpoint written by 4 ranks, read by 3: new rank r's real range, in old-layout slices.
  const int64_t numel = 1001;
  const mx::ShardLayout old_l = mx::make_shard_layout(numel, 4);  // shard 251
  const mx::ShardLayout new_l = mx::make_shard_layout(numel, 3);  // shard 334
  using S = mx::ShardSlice;
  auto range = [&](int r) {
    return mx::shard_slices(old_l, new_l.shard_begin(r), new_l.shard_begin(r) + new_l.valid_numel(r));
  };
  EXPECT_EQ(range(0), (std::vector<S>{{0, 0, 0, 251}, {1, 251, 0, 83}}));
  EXPECT_EQ(range(1), (std::vector<S>{{1, 334, 83, 168}, {2, 502, 0, 166}}));
  EXPECT_EQ(range(2), (std::vector<S>{{2, 668, 166, 85}, {3, 753, 0, 248}}));
}

TEST(ShardLayout, BadArgumentsAreBugs) {
  EXPECT_THROW(mx::make_shard_layout(10, 0), std::logic_error);
  EXPECT_THROW(mx::make_shard_layout(-1, 2), std::logic_error);
  EXPECT_THROW(mx::make_shard_layout(10, 2, 0), std::logic_error);
  const mx::ShardLayout l = mx::make_shard_layout(10, 4);
  EXPECT_THROW(l.owner_of(10), std::logic_error);
  EXPECT_THROW(l.valid_numel(4), std::logic_error);
}

}  // namespace
