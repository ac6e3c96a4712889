// WindowSampler: epochs are exact permutations of the windows, fill() reads the right tokens,
// and a global batch split across ranks covers an epoch exactly once. Also split_train_val.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/data_split.h"
#include "data/token_dataset.h"
#include "data/window_sampler.h"

namespace mx {
namespace {

// seq_len 1 over W + 1 tokens gives exactly W windows.
TokenDataset tokens_for_windows(int64_t windows) {
  return TokenDataset::open("", TokenFormat::kRandom, 1000, windows + 1);
}

std::vector<int64_t> epoch_order(const WindowSampler& s, int64_t epoch) {
  std::vector<int64_t> order;
  for (int64_t j = 0; j < s.num_windows(); ++j) order.push_back(s.window_of(epoch * s.num_windows() + j));
  return order;
}

TEST(WindowSamplerTest, EachEpochIsABijection) {
  for (int64_t w : {1, 2, 7, 1000, 65537}) {
    TokenDataset data = tokens_for_windows(w);
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, ~uint64_t{0}}) {
      WindowSampler sampler(&data, 0, data.size(), 1, seed);
      ASSERT_EQ(sampler.num_windows(), w);
      for (int64_t epoch : {0, 3}) {
        std::vector<int> hits(static_cast<size_t>(w), 0);
        for (int64_t window : epoch_order(sampler, epoch)) {
          ASSERT_GE(window, 0);
          ASSERT_LT(window, w);
          ++hits[static_cast<size_t>(window)];
        }
        for (int64_t k = 0; k < w; ++k)
          ASSERT_EQ(hits[static_cast<size_t>(k)], 1) << "W=" << w << " seed=" << seed << " window " << k;
      }
    }
  }
}

TEST(WindowSamplerTest, SeedsAndEpochsGiveDifferentOrders) {
  TokenDataset data = tokens_for_windows(1000);
  WindowSampler a(&data, 0, data.size(), 1, 1);
  WindowSampler b(&data, 0, data.size(), 1, 2);
  std::vector<int64_t> identity;
  for (int64_t k = 0; k < 1000; ++k) identity.push_back(k);
  const auto a0 = epoch_order(a, 0), a1 = epoch_order(a, 1), b0 = epoch_order(b, 0);
  EXPECT_NE(a0, identity);
  EXPECT_NE(a0, a1);
  EXPECT_NE(a0, b0);
  EXPECT_NE(a1, b0);
  // A shuffle, not a rotation: few windows stay in place (about 1 expected).
  int fixed = 0;
  for (int64_t k = 0; k < 1000; ++k) fixed += a0[k] == k;
  EXPECT_LT(fixed, 10);
  // Same seed, same order: determinism is what makes resume exact.
  WindowSampler a_again(&data, 0, data.size(), 1, 1);
  EXPECT_EQ(epoch_order(a_again, 1), a1);
}

class WindowSamplerFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("mx_sampler_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    // A u16 file written by hand (little-endian), ids a function of position.
    for (int64_t i = 0; i < 1000; ++i) raw_.push_back(static_cast<int32_t>((i * 7919 + 13) % 50000));
    path_ = (dir_ / "tokens.u16").string();
    FILE* f = std::fopen(path_.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    for (int32_t v : raw_) {
      const unsigned char le[2] = {static_cast<unsigned char>(v & 0xFF), static_cast<unsigned char>(v >> 8)};
      ASSERT_EQ(std::fwrite(le, 1, 2, f), 2u);
    }
    std::fclose(f);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::string path_;
  std::vector<int32_t> raw_;
};

TEST_F(WindowSamplerFileTest, FillReadsTheRawTokensAtEachWindowStart) {
  TokenDataset data = TokenDataset::open(path_, TokenFormat::kU16, 50000);
  const int64_t begin = 5, end = 990, seq_len = 16;  // 984 tokens: 61 windows, 7 tokens left over
  WindowSampler sampler(&data, begin, end, seq_len, 42);
  ASSERT_EQ(sampler.num_windows(), (end - begin - 1) / seq_len);
  const int64_t first = 3, count = 2 * sampler.num_windows() + 5;  // crosses two epoch boundaries
  std::vector<int32_t> out(static_cast<size_t>(count * (seq_len + 1)));
  sampler.fill(first, count, out.data());
  for (int64_t k = 0; k < count; ++k) {
    const int64_t start = begin + sampler.window_of(first + k) * seq_len;
    ASSERT_LE(start + seq_len + 1, end);
    for (int64_t t = 0; t <= seq_len; ++t)
      ASSERT_EQ(out[k * (seq_len + 1) + t], raw_[start + t]) << "sample " << first + k << " token " << t;
  }
  // Resuming mid-run (restore the sample counter) reads the same windows.
  std::vector<int32_t> resumed(static_cast<size_t>(10 * (seq_len + 1)));
  sampler.fill(first + 40, 10, resumed.data());
  EXPECT_TRUE(std::equal(resumed.begin(), resumed.end(), out.begin() + 40 * (seq_len + 1)));
}

TEST_F(WindowSamplerFileTest, TooShortRangeNamesTheFile) {
  TokenDataset data = TokenDataset::open(path_, TokenFormat::kU16, 50000);
  EXPECT_NO_THROW(WindowSampler(&data, 100, 117, 16, 0));  // exactly seq_len + 1 tokens: 1 window
  try {
    WindowSampler(&data, 100, 116, 16, 0);
    FAIL() << "no error for 16 tokens at seq_len 16";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("too short for seq_len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
  }
  EXPECT_THROW(WindowSampler(&data, 0, 1000, 1000, 0), UserError);
}

TEST(WindowSamplerTest, RanksSplittingGlobalBatchesCoverAnEpochOnce) {
  for (int64_t w : {37, 40, 1000}) {
    TokenDataset data = tokens_for_windows(w);
    WindowSampler sampler(&data, 0, data.size(), 1, 7);
    const int64_t world = 4, global_batch = 8;
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::vector<int> hits(static_cast<size_t>(w), 0);
      // Walk the steps that touch this epoch; each rank takes its own indices of each batch.
      for (int64_t step = epoch * w / global_batch; step * global_batch < (epoch + 1) * w; ++step) {
        for (int64_t rank = 0; rank < world; ++rank) {
          for (int64_t j = 0; j < global_batch; ++j) {
            const int64_t i = step * global_batch + j;
            if (i % world != rank || sampler.epoch_of(i) != epoch) continue;
            ++hits[static_cast<size_t>(sampler.window_of(i))];
          }
        }
      }
      for (int64_t k = 0; k < w; ++k) ASSERT_EQ(hits[static_cast<size_t>(k)], 1) << "W=" << w << " window " << k;
    }
  }
}

TEST(DataSplitTest, ValidationIsTheTail) {
  const DataSplit s = split_train_val(1000, 0.1, 16);
  EXPECT_EQ(s.train_begin, 0);
  EXPECT_EQ(s.train_end, 900);
  EXPECT_EQ(s.val_begin, 900);
  EXPECT_EQ(s.val_end, 1000);
}

TEST(DataSplitTest, SmallFractionGetsOneWholeWindow) {
  const DataSplit s = split_train_val(1000, 0.001, 16);  // 1 token, raised to seq_len + 1
  EXPECT_EQ(s.val_begin, 983);
  EXPECT_EQ(s.val_end, 1000);
  EXPECT_EQ(s.train_end, 983);
}

TEST(DataSplitTest, NoValidationWhenZeroOrTooLittleData) {
  const DataSplit none = split_train_val(1000, 0.0, 16);
  EXPECT_EQ(none.train_end, 1000);
  EXPECT_EQ(none.val_begin, none.val_end);
  const DataSplit tiny = split_train_val(20, 0.1, 16);  // cannot hold a window for both
  EXPECT_EQ(tiny.train_end, 20);
  EXPECT_EQ(tiny.val_begin, tiny.val_end);
}

TEST(DataSplitTest, RejectsBadFractions) {
  EXPECT_THROW(split_train_val(1000, 1.0, 16), UserError);
  EXPECT_THROW(split_train_val(1000, -0.1, 16), UserError);
  EXPECT_THROW(split_train_val(1000, std::nan(""), 16), UserError);
  EXPECT_THROW(split_train_val(1000, 0.1, 0), UserError);
}

}  // namespace
}  // namespace mx

TEST(WindowSamplerTest, UnshuffledOrderIsSequential) {
  // shuffle = false: sample i reads window i % W (the order tests replay in PyTorch).
  mx::TokenDataset ds = mx::TokenDataset::open("", mx::TokenFormat::kRandom, 100, 1000);
  mx::WindowSampler s(&ds, 0, 1000, 10, 42, false);
  ASSERT_EQ(s.num_windows(), 99);
  for (int64_t i = 0; i < 300; ++i) EXPECT_EQ(s.window_of(i), i % 99);
}
