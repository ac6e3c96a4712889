// numerics/block_scale_layout.h against an independent construction of cuBLAS's 128x4 swizzled
// block-scale layout, written from the layout's description (cuBLAS docs, "1D Block Scaling
// Factors Layout"; the same arrangement as cuDNN's "128x4 tiled layout" and PyTorch's
// to_blocked): view the padded [R, C] scale matrix as [R/128, 4, 32, C/4, 4] (row = 128 rt +
// 32 s + l, column = 4 ct + j), permute to [rt, ct, l, s, j] and store that contiguously. Here
// the permuted order is walked with a running output counter (no offset formula), and two
// offsets quoted in NVIDIA's nvmath-python documentation (get_block_scale_offset) pin it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "numerics/block_scale_layout.h"

using namespace mx::numerics;

namespace {

// out[k] = index (row * C + col) of the scale stored at byte k, -1 for padding.
std::vector<int64_t> reference_layout(int64_t R, int64_t C) {
  const int64_t Rp = (R + 127) / 128 * 128, Cp = (C + 3) / 4 * 4;
  std::vector<int64_t> out;
  for (int64_t rt = 0; rt < Rp / 128; ++rt)
    for (int64_t ct = 0; ct < Cp / 4; ++ct)
      for (int64_t l = 0; l < 32; ++l)
        for (int64_t s = 0; s < 4; ++s)
          for (int64_t j = 0; j < 4; ++j) {
            const int64_t row = rt * 128 + s * 32 + l, col = ct * 4 + j;
            out.push_back(row < R && col < C ? row * C + col : -1);
          }
  return out;
}

TEST(BlockScaleLayout, MatchesTheDocumentedTiling) {
  for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {128, 4}, {128, 8}, {37, 3}, {129, 5}, {256, 64}, {300, 17}, {1024, 128}}) {
    const auto ref = reference_layout(R, C);
    ASSERT_EQ(int64_t(ref.size()), swizzled_scale_bytes(R, C)) << R << "x" << C;
    std::vector<int64_t> got(ref.size(), -1);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t off = swizzled_scale_offset(r, c, C);
        ASSERT_GE(off, 0);
        ASSERT_LT(off, int64_t(got.size()));
        ASSERT_EQ(got[size_t(off)], -1) << "two scales at byte " << off;
        got[size_t(off)] = r * C + c;
      }
    EXPECT_EQ(got, ref) << R << "x" << C;
  }
}

// swizzled_scale_position (byte -> padded position, for kernels that walk the buffer in order)
// against the same reference walk: every byte, padding included.
TEST(BlockScaleLayout, PositionOfEveryByte) {
  for (auto [R, C] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {128, 4}, {37, 3}, {129, 5}, {300, 17}, {1024, 128}}) {
    const auto ref = reference_layout(R, C);
    const int64_t Rp = (R + 127) / 128 * 128, Cp = (C + 3) / 4 * 4;
    std::vector<bool> seen(size_t(Rp * Cp), false);
    for (int64_t off = 0; off < int64_t(ref.size()); ++off) {
      int64_t r = -1, c = -1;
      swizzled_scale_position(off, C, &r, &c);
      ASSERT_TRUE(r >= 0 && r < Rp && c >= 0 && c < Cp) << R << "x" << C << " byte " << off;
      ASSERT_FALSE(seen[size_t(r * Cp + c)]) << "position twice, byte " << off;
      seen[size_t(r * Cp + c)] = true;
      ASSERT_EQ(ref[size_t(off)], r < R && c < C ? r * C + c : -1) << R << "x" << C << " byte " << off;
    }
  }
}

TEST(BlockScaleLayout, NvmathDocumentedOffsets) {
  // NVFP4 operand of shape M = 128, K = 128: 8 scale columns (16-element blocks).
  EXPECT_EQ(swizzled_scale_offset(5, 2, 8), 82);
  EXPECT_EQ(swizzled_scale_offset(5, 5, 8), 593);
}

}  // namespace
