// numerics/fp8_block_mx.h: recipe fp8-block's power-of-two block scales as MXFP8 E8M0 scales in
// cuBLASLt's swizzled layout (what the Blackwell GEMM reads). References, independent of the
// code under test: powers of two from std::ldexp, the MXFP8 decode of each element (E4M3 code
// x E8M0 scale through the numerics decoders) against quantize_fp8_block's own dequantized
// value, bit for bit, and the scale's byte found by the 128x4-tile index formula written out
// here from the cuBLAS description (tile = (r / 128) * ceil(kb / 4) + k / 4; inside it byte
// 16 (r % 32) + 4 ((r % 128) / 32) + k % 4), checked also against block_scale_layout.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "numerics/block_scale_layout.h"
#include "numerics/fp8_block_mx.h"
#include "numerics/quantize.h"

using namespace mx::numerics;

namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TEST(Fp8BlockMx, E8M0FromPowerOfTwo) {
  for (int k = -127; k <= 127; ++k) {
    const float s = std::ldexp(1.0f, k);  // 2^-127 is the subnormal 0x00400000
    ASSERT_EQ(int(e8m0_from_pow2_scale(s)), k + 127) << "2^" << k;
  }
  EXPECT_EQ(bits_of(std::ldexp(1.0f, -127)), 0x00400000u);
  // Not convertible: not a power of two, zero, negative, inf, NaN, below E8M0's 2^-127.
  const float bad[] = {0.0f, -0.0f, -1.0f, -std::ldexp(1.0f, -127), 3.0f, 1.5f,
                       std::nextafter(1.0f, 2.0f), std::nextafter(1.0f, 0.0f), 448.0f / 3.0f,
                       FLT_MAX, std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), std::ldexp(1.0f, -128),
                       std::ldexp(1.0f, -149), float_of(0x00400001u), float_of(0x00600000u)};
  for (float s : bad)
    EXPECT_EQ(e8m0_from_pow2_scale(s), kE8M0NotConvertible) << "bits " << std::hex << bits_of(s);
}

// Every decode scale quantize_fp8_block can store with pow2_scales (1 / fp8_scale_from_amax of
// a block amax) converts exactly: every fp32 exponent field with several mantissas, a stride
// through all positive patterns, and the special amaxes (0, inf, NaN: scale 1). The range
// reached is [2^-127 (tiny amax: 448 / amax overflows to FLT_MAX -> 2^127), 2^119 (amax above
// FLT_MAX / 2: the scale is held at 448 / (FLT_MAX / 2) = 2^-118.2 -> 2^-119, so that no code
// decodes to infinity; those blocks' largest elements saturate to 448, still finite)].
TEST(Fp8BlockMx, EveryPow2BlockScaleConverts) {
  std::vector<uint32_t> amax_bits = {0u, 0x7F800000u, 0x7FC00000u, 0x7F7FFFFFu, 1u};
  for (uint32_t e = 0; e < 255; ++e)
    for (uint32_t m : {0u, 1u, 0x200000u, 0x400000u, 0x600001u, 0x7FFFFFu})
      amax_bits.push_back(e << 23 | m);
  for (uint64_t b = 0; b < 0x7F800000u; b += 40009u) amax_bits.push_back(uint32_t(b));
  int min_code = 255, max_code = -1;
  for (uint32_t ab : amax_bits) {
    const float amax = float_of(ab);
    const float scale_inv = 1.0f / fp8_scale_from_amax(amax, 448.0f, 0.0f, true);  // as stored
    const uint8_t code = e8m0_from_pow2_scale(scale_inv);
    ASSERT_NE(code, kE8M0NotConvertible) << "amax bits " << std::hex << ab;
    ASSERT_EQ(bits_of(std::ldexp(1.0f, int(code) - 127)), bits_of(scale_inv))
        << "amax bits " << std::hex << ab;
    ASSERT_EQ(bits_of(decode_e8m0(code)), bits_of(scale_inv));
    if (std::isfinite(amax) && amax > 0 && amax <= FLT_MAX / 2) {
      // never saturates: the block amax fits in E4M3
      ASSERT_LE(double(amax) / double(scale_inv), 448.0) << "amax bits " << std::hex << ab;
    } else if (std::isfinite(amax) && amax > 0) {
      // saturates, and the largest code still decodes finite
      ASSERT_TRUE(std::isfinite(448.0f * scale_inv)) << "amax bits " << std::hex << ab;
    }
    min_code = std::min(min_code, int(code));
    max_code = std::max(max_code, int(code));
  }
  EXPECT_EQ(min_code, 0);          // 2^-127
  EXPECT_EQ(max_code, 127 + 119);  // 2^119
}

// x [rows, cols] whose fp8 blocks (br x bc) have very different magnitudes: an all-zero block,
// fp32 subnormals, tiny, ordinary, huge (up to 3e38) values, and inside a block values spread
// over 2^0 .. 2^-20 of the block's magnitude (some flush to zero in E4M3).
std::vector<float> varied_blocks(int64_t rows, int64_t cols, int br, int bc, uint32_t seed) {
  const float magnitudes[] = {0.0f, 1e-42f, 1e-38f, 1e-36f, 1e-30f, 1e-7f, 1e-3f, 1.0f,
                              7.0f, 1e3f, 1e20f, 1e36f, 3e38f};
  const int n_mag = int(sizeof magnitudes / sizeof magnitudes[0]);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, n_mag - 1), shift(0, 20);
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  std::vector<float> mag(size_t(sr * sc));
  for (auto& m : mag) m = magnitudes[pick(gen)];
  mag[0] = 0.0f;                     // an all-zero block, always
  if (mag.size() > 2) mag[2] = 3e38f;  // and one near FLT_MAX
  if (mag.size() > 3) mag[3] = 1e-42f;  // and one of subnormals
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = u(gen) * mag[(r / br) * sc + c / bc] * std::ldexp(1.0f, -shift(gen));
  return x;
}

struct Case {
  int64_t rows, cols;  // the quantized matrix x
  int br, bc;
  bool transposed;  // the GEMM operand is x^T (the reduction runs down x's columns)
};

std::string name(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + " blocks " +
         std::to_string(c.br) + "x" + std::to_string(c.bc) + (c.transposed ? " transposed" : "");
}

// The fp8-block operand as the MXFP8 GEMM reads it decodes to the fp8-block dequantization,
// bit for bit, for the recipe's three operand shapes: 1x128 along K (activations, gradients),
// 128x1 down the columns read through x^T (the weight gradient's operands) and 128x128 (the
// weight, either way round); with padded rows (R not a multiple of 128), padded scale columns
// (K / 32 not a multiple of 4) and partial fp8 blocks (K = 416, rows = 300).
TEST(Fp8BlockMx, MxDecodeEqualsBlockDequant) {
  const Case cases[] = {{200, 384, 1, 128, false},  {256, 416, 1, 128, false},
                        {1, 128, 1, 128, false},    {384, 160, 128, 1, true},
                        {416, 96, 128, 1, true},    {256, 384, 128, 128, false},
                        {256, 384, 128, 128, true}, {300, 256, 128, 128, false},
                        {128, 416, 128, 128, true}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    const auto x = varied_blocks(c.rows, c.cols, c.br, c.bc, seed++);
    const Quantized q = quantize_fp8_block(x.data(), c.rows, c.cols, c.br, c.bc, true);
    const int64_t R = c.transposed ? c.cols : c.rows, K = c.transposed ? c.rows : c.cols;
    const int64_t kb = K / 32, col_tiles = (kb + 3) / 4;
    const int64_t bytes = (R + 127) / 128 * 128 * col_tiles * 4;
    ASSERT_EQ(swizzled_scale_bytes(R, kb), bytes);
    std::vector<uint8_t> sw(size_t(bytes), 0xAB);  // every byte must be written
    ASSERT_EQ(fp8_block_scales_to_mx(q.scales_f32.data(), c.rows, c.cols, c.br, c.bc,
                                     c.transposed, sw.data()),
              0);
    std::vector<bool> used(size_t(bytes), false);
    int64_t zero_blocks = 0, tiny_scales = 0, huge_scales = 0;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t b = k / 32;
        const int64_t off = ((r / 128) * col_tiles + b / 4) * 512 + 16 * (r % 32) +
                            4 * ((r % 128) / 32) + b % 4;
        ASSERT_EQ(off, swizzled_scale_offset(r, b, kb));
        used[size_t(off)] = true;
        const int64_t i = c.transposed ? k : r, j = c.transposed ? r : k;  // x's element
        const uint8_t code = q.codes[size_t(i * c.cols + j)];  // the K-major copy's code
        const uint8_t e8m0 = sw[size_t(off)];
        const float block_scale = q.scales_f32[size_t((i / c.br) * q.scale_cols + j / c.bc)];
        ASSERT_EQ(bits_of(std::ldexp(1.0f, int(e8m0) - 127)), bits_of(block_scale))
            << "r " << r << " k " << k;
        const float mx = decode_e4m3(code) * decode_e8m0(e8m0);
        ASSERT_EQ(bits_of(mx), bits_of(q.dequant[size_t(i * c.cols + j)]))
            << "r " << r << " k " << k << " x " << x[size_t(i * c.cols + j)] << " mx " << mx
            << " fp8-block " << q.dequant[size_t(i * c.cols + j)];
        if (k % 32 == 0) {
          zero_blocks += block_scale == 1.0f && x[size_t(i * c.cols + j)] == 0.0f;
          tiny_scales += e8m0 == 0;
          huge_scales += e8m0 >= 127 + 100;
        }
      }
    for (int64_t o = 0; o < bytes; ++o)
      if (!used[size_t(o)]) {
        ASSERT_EQ(sw[size_t(o)], 0) << "padding byte " << o;
      }
    // The inputs reached the edges they were built for (the three fixed blocks, where the
    // matrix has them).
    EXPECT_GT(zero_blocks, 0);
    if (q.scales_f32.size() >= 4) {
      EXPECT_GT(tiny_scales, 0);  // E8M0 code 0: 2^-127
      EXPECT_GT(huge_scales, 0);
    }
  }
}

// Scales that are not powers of two (fp8-block with pow2_scales = false: 448 / amax) cannot be
// E8M0: they are flagged (NaN code, counted), never rounded to a neighbour. So is 2^-128, a
// power of two below E8M0's range, which is what 1 / FLT_MAX rounds to (a tiny block's
// 448 / amax overflows to FLT_MAX).
TEST(Fp8BlockMx, NonPow2ScalesAreFlagged) {
  auto convertible = [](float s) {  // s = 2^k with k in [-127, 127], by frexp (s = m 2^e)
    int e = 0;
    const double m = std::frexp(double(s), &e);
    return s > 0.0f && std::isfinite(s) && m == 0.5 && e - 1 >= -127 && e - 1 <= 127;
  };
  const int64_t rows = 128, cols = 256;
  const auto x = varied_blocks(rows, cols, 1, 128, 99);
  const Quantized q = quantize_fp8_block(x.data(), rows, cols, 1, 128, false);
  int64_t bad = 0, below_range = 0;
  for (float s : q.scales_f32) {
    bad += !convertible(s);
    below_range += s == std::ldexp(1.0f, -128);
  }
  ASSERT_GT(bad, below_range);
  ASSERT_GT(below_range, 0);
  std::vector<uint8_t> sw(size_t(swizzled_scale_bytes(rows, cols / 32)));
  EXPECT_EQ(fp8_block_scales_to_mx(q.scales_f32.data(), rows, cols, 1, 128, false, sw.data()),
            4 * bad);  // four MX blocks per 1x128 block
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float s = q.scales_f32[size_t(r * 2 + b / 4)];
      const uint8_t e8m0 = sw[size_t(swizzled_scale_offset(r, b, cols / 32))];
      if (convertible(s)) {
        EXPECT_EQ(std::ldexp(1.0f, int(e8m0) - 127), s);
      } else {
        EXPECT_EQ(e8m0, kE8M0NotConvertible);
      }
    }
}

// Shapes the conversion cannot express: an MX block must lie inside one fp8 block along K.
TEST(Fp8BlockMx, RejectsBlocksAcrossK) {
  std::vector<float> scales(64, 1.0f);
  std::vector<uint8_t> sw(size_t(swizzled_scale_bytes(256, 8)));
  // 1x128 blocks read through x^T: each K-run of 32 crosses 32 blocks.
  EXPECT_THROW(fp8_block_scales_to_mx(scales.data(), 256, 128, 1, 128, true, sw.data()),
               mx::UserError);
  // 128x1 blocks read untransposed: likewise.
  EXPECT_THROW(fp8_block_scales_to_mx(scales.data(), 128, 256, 128, 1, false, sw.data()),
               mx::UserError);
  // K not a multiple of 32.
  EXPECT_THROW(fp8_block_scales_to_mx(scales.data(), 4, 100, 1, 128, false, sw.data()),
               mx::UserError);
}

}  // namespace
