// The training path of the quantizers (numerics/quantize.h "into caller memory"): the value-only
// RNE form against the codecs, every *_into quantizer against the Quantized-returning one (whose
// codes the Python tests compare with ml_dtypes and the numpy reference), NVFP4's column mode
// against the transpose-quantize-transpose it replaces, and the same bytes with 1 and 2 threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "numerics/quantize.h"

using namespace mx::numerics;

namespace {

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gaussian values over ~16 binades, so every format sees saturation, normals, subnormals and
// flushes, plus the specials (inf, NaN, -0, fp32 subnormals) sprinkled in.
std::vector<float> test_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(size_t(rows * cols));
  for (float& x : v) x = d(gen) * std::exp2(float(int(gen() % 16)) - 8.0f);
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), -0.0f, 1e-40f, -3e-39f};
  for (size_t i = 0; i < v.size(); i += 97) v[i] = specials[(i / 97) % 6];
  return v;
}

TEST(QuantizeInto, RneValueMatchesCodecsOnBitPatterns) {
  // every 65521st fp32 bit pattern (about 65k values across all exponents, both signs, the
  // NaNs and infs) plus the neighbourhood of every representable value of each format
  std::vector<float> xs;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 65521) xs.push_back(bits_float(uint32_t(u)));
  for (int c = 0; c < 256; ++c)
    for (float v : {decode_e4m3(uint8_t(c)), decode_e5m2(uint8_t(c)), decode_e2m1(uint8_t(c & 15))})
      for (int k = -3; k <= 3; ++k) {
        uint32_t b = float_bits(v) + uint32_t(k);
        xs.push_back(bits_float(b));
        // midpoints to the next value (the ties)
        xs.push_back(0.5f * (v + decode_e4m3(uint8_t(c + 1 < 256 ? c + 1 : c))));
      }
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  for (float v : xs) {
    const uint32_t e4 = float_bits(decode_e4m3(encode_e4m3(v, Saturation::kSatFinite)));
    const uint32_t e5 = float_bits(decode_e5m2(encode_e5m2(v, Saturation::kSatFinite)));
    const uint32_t e2 = float_bits(decode_e2m1(encode_e2m1(v, Saturation::kSatFinite)));
    ASSERT_EQ(float_bits(rne_satfinite_value(v, Format::kE4M3)), e4) << std::hex << float_bits(v);
    ASSERT_EQ(float_bits(rne_satfinite_value(v, Format::kE5M2)), e5) << std::hex << float_bits(v);
    ASSERT_EQ(float_bits(rne_satfinite_value(v, Format::kE2M1)), e2) << std::hex << float_bits(v);
  }
}

// Runs f with 1 and then 2 OpenMP threads and checks both give `want` byte for byte.
void expect_same_any_threads(const std::vector<float>& want,
                             const std::function<std::vector<float>()>& f, const char* what) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = f();
  omp_set_num_threads(2);
  const std::vector<float> two = f();
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bytes(one, want)) << what << " (1 thread)";
  EXPECT_TRUE(same_bytes(two, want)) << what << " (2 threads)";
}

// shapes: partial blocks in both dimensions; the big one crosses the parallel threshold
const int64_t kShapes[][2] = {{45, 77}, {130, 300}, {256, 384}};

TEST(QuantizeInto, SameBytesAsQuantizedForAnyThreadCount) {
  for (const auto& sh : kShapes) {
    const int64_t rows = sh[0], cols = sh[1], n = rows * cols;
    const std::vector<float> x = test_tensor(rows, cols, uint32_t(rows));
    for (Format f : {Format::kE4M3, Format::kE5M2}) {
      const float scale = fp8_scale_from_amax(abs_max(x.data(), n), fp8_max(f));
      const Quantized q = quantize_fp8_tensor(x.data(), rows, cols, f, scale);
      expect_same_any_threads(q.dequant, [&] {
        std::vector<float> out(static_cast<size_t>(n));
        quantize_fp8_tensor_into(x.data(), rows, cols, f, scale, QuantizeInto{out.data()});
        return out;
      }, "fp8 per tensor");
    }
    for (auto [br, bc] : {std::pair{1, 128}, std::pair{128, 1}, std::pair{128, 128}}) {
      const Quantized q = quantize_fp8_block(x.data(), rows, cols, br, bc, true);
      expect_same_any_threads(q.dequant, [&] {
        std::vector<float> out(static_cast<size_t>(n));
        std::vector<float> scales(q.scales_f32.size());
        quantize_fp8_block_into(x.data(), rows, cols, br, bc, true,
                                QuantizeInto{out.data(), nullptr, scales.data()});
        EXPECT_EQ(scales, q.scales_f32);
        return out;
      }, "fp8 block");
    }
    for (bool col : {false, true})
      for (Format f : {Format::kE4M3, Format::kE5M2}) {
        const Quantized q = quantize_mxfp8(x.data(), rows, cols, col, f);
        expect_same_any_threads(q.dequant, [&] {
          std::vector<float> out(static_cast<size_t>(n));
          std::vector<uint8_t> scales(q.scales_u8.size());
          quantize_mxfp8_into(x.data(), rows, cols, col, f, MxScaleRule::kCeil,
                              QuantizeInto{out.data(), nullptr, nullptr, scales.data()});
          EXPECT_EQ(scales, q.scales_u8);
          return out;
        }, "mxfp8");
      }
    for (bool two_d : {false, true}) {
      const Quantized q = quantize_nvfp4(x.data(), rows, cols, two_d);
      expect_same_any_threads(q.dequant, [&] {
        std::vector<float> out(static_cast<size_t>(n));
        quantize_nvfp4_into(x.data(), rows, cols, two_d, false, QuantizeInto{out.data()});
        return out;
      }, "nvfp4");
    }
  }
}

TEST(QuantizeInto, InPlace) {
  const int64_t rows = 64, cols = 96;
  const std::vector<float> x = test_tensor(rows, cols, 3);
  const Quantized q = quantize_mxfp8(x.data(), rows, cols, true);
  std::vector<float> y = x;
  quantize_mxfp8_into(y.data(), rows, cols, true, Format::kE4M3, MxScaleRule::kCeil,
                      QuantizeInto{y.data()});
  EXPECT_TRUE(same_bytes(y, q.dequant));
}

// NVFP4 column blocks (16x1, rounding stochastic or not) are the rowwise quantization of x^T,
// transposed back, with element (r, c) drawing the random bits of x^T's element (c, r).
TEST(QuantizeInto, Nvfp4ColumnsAreTheTransposedRowwise) {
  for (const auto& sh : kShapes) {
    const int64_t rows = sh[0], cols = sh[1], n = rows * cols;
    const std::vector<float> x = test_tensor(rows, cols, 7);
    std::vector<float> xt(static_cast<size_t>(n));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    for (bool sr : {false, true}) {
      RoundingOptions ro;
      ro.stochastic = sr;
      ro.rng = RandomStream{5, 2, 0, 9};
      const Quantized qt = quantize_nvfp4(xt.data(), cols, rows, false, ro);
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = qt.dequant[c * rows + r];
      expect_same_any_threads(want, [&] {
        std::vector<float> out(static_cast<size_t>(n));
        std::vector<uint8_t> scales(size_t((rows + 15) / 16 * cols));
        const float s = quantize_nvfp4_into(x.data(), rows, cols, false, true,
                                            QuantizeInto{out.data(), nullptr, nullptr, scales.data()}, ro);
        EXPECT_EQ(s, qt.global_scale);
        for (int64_t rb = 0; rb < (rows + 15) / 16; ++rb)  // scales are qt's, transposed
          for (int64_t c = 0; c < cols; ++c)
            EXPECT_EQ(scales[rb * cols + c], qt.scales_u8[c * qt.scale_cols + rb]);
        return out;
      }, sr ? "nvfp4 columns, stochastic" : "nvfp4 columns");
    }
  }
}

TEST(QuantizeInto, StochasticCodesAndValuesForAnyThreadCount) {
  const int64_t rows = 256, cols = 384;
  const std::vector<float> x = test_tensor(rows, cols, 11);
  RoundingOptions ro;
  ro.stochastic = true;
  ro.rng = RandomStream{42, 7, 1, 3};
  const Quantized q = quantize_fp8_tensor(x.data(), rows, cols, Format::kE5M2, 0.5f, ro);
  const Quantized nv = quantize_nvfp4(x.data(), rows, cols, false, ro);
  expect_same_any_threads(q.dequant, [&] {
    return quantize_fp8_tensor(x.data(), rows, cols, Format::kE5M2, 0.5f, ro).dequant;
  }, "fp8 stochastic");
  expect_same_any_threads(nv.dequant, [&] {
    std::vector<float> out(size_t(rows * cols));
    quantize_nvfp4_into(x.data(), rows, cols, false, false, QuantizeInto{out.data()}, ro);
    return out;
  }, "nvfp4 stochastic");
}

}  // namespace
