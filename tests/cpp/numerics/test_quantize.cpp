// Quantizer properties that follow from the formulas: scale choice, never-saturating block
// scales, delayed-scaling history, NVFP4 packing, per-element SR independent of thread count,
// and the random Hadamard transform.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <limits>
#include <vector>

#include "core/error.h"
#include "numerics/quantize.h"

using namespace mx::numerics;

namespace {

std::vector<float> randn(size_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(Quantize, PerTensorCurrentScaling) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f, 3.5f};
  Quantized q = quantize_fp8_current(x.data(), 1, 4, Format::kE4M3);
  ASSERT_EQ(q.scales_f32.size(), 1u);
  EXPECT_EQ(q.scales_f32[0], 1.0f / (448.0f / 3.5f));
  EXPECT_EQ(q.codes[3], 0x7E);  // the amax element lands on max exactly
  Quantized m = quantize_fp8_current(x.data(), 1, 4, Format::kE4M3, 1.0f);
  EXPECT_EQ(decode_e4m3(m.codes[3]), 224.0f);  // one bit of margin
  std::vector<float> zeros(8, 0.0f);
  Quantized z = quantize_fp8_current(zeros.data(), 2, 4, Format::kE5M2);
  EXPECT_EQ(z.scales_f32[0], 1.0f);
  for (float d : z.dequant) EXPECT_EQ(d, 0.0f);
  EXPECT_EQ(fp8_scale_from_amax(1e-45f, 448.0f), 3.4028235e38f);  // overflow -> FLT_MAX
  EXPECT_EQ(fp8_scale_from_amax(3.0f, 448.0f, 0, true), 128.0f);  // 149.3 -> 2^7
}

TEST(Quantize, DelayedScalingHistory) {
  DelayedScaling ds(Format::kE4M3, 3, AmaxAlgo::kMax);
  EXPECT_EQ(ds.scale(), 1.0f);
  std::vector<float> a = {4.0f, -1.0f}, b = {0.5f, 1.0f};
  Quantized qa = ds.quantize(a.data(), 1, 2);
  EXPECT_EQ(qa.scales_f32[0], 1.0f);  // first step: the initial scale
  EXPECT_EQ(ds.scale(), 112.0f);      // 448 / 4
  ds.quantize(b.data(), 1, 2);
  EXPECT_EQ(ds.scale(), 112.0f);      // max over history keeps 4
  ds.record(1.0f);
  ds.record(1.0f);                    // 4 falls out of the 3-long history
  EXPECT_EQ(ds.scale(), 448.0f);
  EXPECT_EQ(ds.amax_history(), (std::vector<float>{1.0f, 1.0f, 1.0f}));
  DelayedScaling recent(Format::kE5M2, 1024, AmaxAlgo::kMostRecent);
  recent.record(8.0f);
  recent.record(2.0f);
  EXPECT_EQ(recent.scale(), 57344.0f / 2.0f);
  recent.record(0.0f);                // an all-zero step keeps the previous scale
  EXPECT_EQ(recent.scale(), 57344.0f / 2.0f);
  EXPECT_EQ(recent.amax_history().size(), 1024u);
}

TEST(Quantize, BlockFp8Pow2ScalesNeverSaturate) {
  const int64_t rows = 130, cols = 300;  // partial blocks in both dimensions
  std::vector<float> x = randn(size_t(rows * cols), 3.0f, 2);
  for (int br : {1, 128}) {
    Quantized q = quantize_fp8_block(x.data(), rows, cols, br, 128, true);
    EXPECT_EQ(q.scale_rows, br == 1 ? rows : 2);
    EXPECT_EQ(q.scale_cols, 3);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float s = q.scales_f32[(r / br) * 3 + c / 128];
        EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);        // a power of two
        EXPECT_LE(std::fabs(x[r * cols + c]) / s, 448.0f);        // no saturation
      }
  }
}

TEST(Quantize, Mxfp8ScalesAndShapes) {
  const int64_t rows = 5, cols = 70;
  std::vector<float> x = randn(size_t(rows * cols), 100.0f, 3);
  Quantized q = quantize_mxfp8(x.data(), rows, cols);
  EXPECT_EQ(q.scale_rows, 5);
  EXPECT_EQ(q.scale_cols, 3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 3; ++b) {
      float amax = 0;
      for (int64_t c = b * 32; c < std::min<int64_t>(cols, b * 32 + 32); ++c)
        amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      const int e = int(q.scales_u8[r * 3 + b]) - 127;
      // ceil rule: the smallest power of two with amax / 2^e <= 448 (up to 1/448's rounding)
      EXPECT_LE(amax / std::ldexp(1.0f, e), 448.0f * 1.0000001f);
      EXPECT_GT(amax / std::ldexp(1.0f, e - 1), 448.0f * 0.9999999f);
    }
  Quantized col = quantize_mxfp8(x.data(), rows, cols, true);
  EXPECT_EQ(col.scale_rows, 1);
  EXPECT_EQ(col.scale_cols, 70);
  Quantized ocp = quantize_mxfp8(x.data(), rows, cols, false, Format::kE4M3, MxScaleRule::kFloor);
  for (int64_t i = 0; i < 15; ++i) EXPECT_LE(ocp.scales_u8[i], q.scales_u8[i]);
}

// The floor rule with an infinite amax: ilogbf(inf) is INT_MAX, which the rule's sum used to
// overflow (undefined: gcc -O2 then decoded the block's scale as 0, the GPU as 2^-127). Now the
// largest scale, 254 (what the ceil rule's saturating encode gives), for both, in every build.
TEST(Quantize, Mxfp8FloorRuleWithInfinity) {
  std::vector<float> x(64, 1.0f);
  x[5] = -std::numeric_limits<float>::infinity();
  x[40] = 3.0f;
  for (MxScaleRule rule : {MxScaleRule::kFloor, MxScaleRule::kCeil})
    EXPECT_EQ(quantize_mxfp8(x.data(), 1, 64, false, Format::kE4M3, rule).scales_u8[0], 254);
  Quantized q = quantize_mxfp8(x.data(), 1, 64, false, Format::kE4M3, MxScaleRule::kFloor);
  // multiplier 2^(127 - 254) = 2^-127: -inf saturates to -448, whose dequantization 448 x 2^127
  // overflows fp32; 1 x 2^-127 encodes to 0 in E4M3
  EXPECT_EQ(q.dequant[5], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(q.dequant[0], 0.0f);
  EXPECT_EQ(q.scales_u8[1], 120);  // the finite block: floor(log2 3) - 8 + 127
}

TEST(Quantize, Nvfp4PackingAndScales) {
  // one block: amax 6 -> S_enc = 448, block scale e4m3(6/6*448) = 448, multiplier 1
  std::vector<float> x(17, 0.0f);
  x[0] = 6.0f, x[1] = -0.5f, x[2] = 1.0f, x[16] = 1.5f;
  Quantized q = quantize_nvfp4(x.data(), 1, 17);
  EXPECT_EQ(q.global_scale, 448.0f);
  EXPECT_EQ(q.code_cols, 9);
  EXPECT_EQ(q.codes[0], 0x7 | (0x9 << 4));  // 6 low nibble, -0.5 high nibble
  EXPECT_EQ(q.codes[1], 0x2);               // 1.0
  EXPECT_EQ(q.codes[8], 0x7);  // 1.5 is the amax of its own (partial) block: code 6, scale 112
  ASSERT_EQ(q.scales_u8.size(), 2u);
  EXPECT_EQ(decode_e4m3(q.scales_u8[0]), 448.0f);
  EXPECT_EQ(decode_e4m3(q.scales_u8[1]), 112.0f);
  EXPECT_EQ(q.dequant[0], 6.0f);
  EXPECT_EQ(q.dequant[16], 1.5f);
  std::vector<float> w = randn(40 * 40, 1.0f, 4);
  Quantized q2 = quantize_nvfp4(w.data(), 40, 40, true);
  EXPECT_EQ(q2.scale_rows, 3);
  EXPECT_EQ(q2.scale_cols, 3);
}

TEST(Quantize, StochasticRoundingIndependentOfThreadCount) {
  const int64_t rows = 64, cols = 2048;  // large enough for the parallel loops
  std::vector<float> x = randn(size_t(rows * cols), 1.0f, 5);
  RoundingOptions ro;
  ro.stochastic = true;
  ro.rng = RandomStream{42, 7, 1, 3};
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Quantized a = quantize_nvfp4(x.data(), rows, cols, false, ro);
  Quantized c = quantize_mxfp8(x.data(), rows, cols, false, Format::kE4M3, MxScaleRule::kCeil, ro);
  omp_set_num_threads(std::max(2, saved));
  Quantized b = quantize_nvfp4(x.data(), rows, cols, false, ro);
  Quantized d = quantize_mxfp8(x.data(), rows, cols, false, Format::kE4M3, MxScaleRule::kCeil, ro);
  omp_set_num_threads(saved);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(c.codes, d.codes);
  Quantized rne = quantize_nvfp4(x.data(), rows, cols);
  EXPECT_NE(a.codes, rne.codes);
  EXPECT_EQ(a.scales_u8, rne.scales_u8);
}

TEST(Quantize, RandomHadamardTransform) {
  float s1[16], s2[16];
  rht16_signs(1, s1);
  rht16_signs(2, s2);
  int diff = 0, neg = 0;
  for (int i = 0; i < 16; ++i) {
    EXPECT_TRUE(s1[i] == 1.0f || s1[i] == -1.0f);
    diff += s1[i] != s2[i];
    neg += s1[i] < 0;
  }
  EXPECT_GT(diff, 0);
  EXPECT_GT(neg, 0);
  std::vector<float> x = randn(3 * 32, 1.0f, 6), y = x;
  rht16_forward(y.data(), 3, 32, 9);
  for (int g = 0; g < 6; ++g) {  // orthogonal: each group keeps its norm
    double nx = 0, ny = 0;
    for (int i = 0; i < 16; ++i) nx += x[g * 16 + i] * x[g * 16 + i], ny += y[g * 16 + i] * y[g * 16 + i];
    EXPECT_NEAR(nx, ny, 1e-4 * nx);
  }
  // one spike spreads evenly: |y_i| = 1/4 for every i
  std::vector<float> e(16, 0.0f);
  e[5] = 1.0f;
  rht16_forward(e.data(), 1, 16, 9);
  for (float v : e) EXPECT_EQ(std::fabs(v), 0.25f);
  rht16_inverse(y.data(), 3, 32, 9);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5f);
  EXPECT_THROW(rht16_forward(y.data(), 1, 24, 9), mx::UserError);
}

}  // namespace
