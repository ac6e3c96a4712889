// Quantizers: the block bookkeeping around the codecs of numerics/formats.h.
#include "numerics/quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/error.h"

namespace mx::numerics {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_shape(int64_t rows, int64_t cols) {
  MX_REQUIRE(rows >= 0 && cols >= 0, "quantize: negative shape [", rows, ", ", cols, "]");
}

uint8_t encode_fp8(float v, Format fmt, const RoundingOptions& ro, int64_t index) {
  const uint32_t rand = ro.stochastic ? ro.rng.bits(uint64_t(index)) : 0u;
  return encode_fp8_elem(v, fmt, ro.stochastic, rand);
}

float decode_fp8(uint8_t code, Format fmt) { return decode_fp8_elem(code, fmt); }

void check_fp8_format(Format fmt) {
  MX_REQUIRE(fmt == Format::kE4M3 || fmt == Format::kE5M2,
             "FP8 quantizers take E4M3 or E5M2 elements");
}

// amax over the block [r0, r1) x [c0, c1).
float block_amax(const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float m = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) m = amax_fold(m, x[r * cols + c]);
  return m;
}

void init_result(Quantized& q, int64_t rows, int64_t cols, int64_t code_cols) {
  q.rows = rows;
  q.cols = cols;
  q.code_cols = code_cols;
  q.codes.assign(size_t(rows * code_cols), 0);
  q.dequant.assign(size_t(rows * cols), 0.0f);
}

}  // namespace

float abs_max(const float* x, int64_t n) {
  // max is exact and order-free, so threads give the same bits; fmax skips NaN in each part.
  float m = 0.0f;
#pragma omp parallel for schedule(static) reduction(max : m) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) m = amax_fold(m, x[i]);
  return m;
}

float fp8_max(Format fmt) {
  check_fp8_format(fmt);
  return fmt == Format::kE5M2 ? kE5M2Max : kE4M3Max;
}

Quantized quantize_fp8_tensor(const float* x, int64_t rows, int64_t cols, Format fmt,
                              float scale, const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(fmt);
  Quantized q;
  init_result(q, rows, cols, cols);
  const float scale_inv = 1.0f / scale;
  q.scales_f32 = {scale_inv};
  q.scale_rows = q.scale_cols = 1;
  const int64_t n = rows * cols;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    q.codes[i] = encode_fp8(x[i] * scale, fmt, ro, i);
    q.dequant[i] = decode_fp8(q.codes[i], fmt) * scale_inv;
  }
  return q;
}

Quantized quantize_fp8_current(const float* x, int64_t rows, int64_t cols, Format fmt,
                               float margin, const RoundingOptions& ro) {
  check_shape(rows, cols);
  const float scale = fp8_scale_from_amax(abs_max(x, rows * cols), fp8_max(fmt), margin);
  return quantize_fp8_tensor(x, rows, cols, fmt, scale, ro);
}

DelayedScaling::DelayedScaling(Format fmt, int history_len, AmaxAlgo algo, float margin)
    : fmt_(fmt), algo_(algo), margin_(margin) {
  check_fp8_format(fmt);
  MX_REQUIRE(history_len >= 1, "amax history length must be at least 1, got ", history_len);
  amax_history_.assign(size_t(history_len), 0.0f);
}

void DelayedScaling::record(float amax) {
  for (size_t i = amax_history_.size() - 1; i > 0; --i) amax_history_[i] = amax_history_[i - 1];
  amax_history_[0] = amax;
  float reduced = amax_history_[0];
  if (algo_ == AmaxAlgo::kMax)
    for (float a : amax_history_) reduced = std::fmax(reduced, a);
  if (reduced > 0.0f && std::isfinite(reduced))
    scale_ = fp8_scale_from_amax(reduced, fp8_max(fmt_), margin_);
}

void DelayedScaling::restore(const std::vector<float>& history, float scale) {
  MX_REQUIRE(history.size() == amax_history_.size(), "amax history of length ", history.size(),
             " does not fit a history of length ", amax_history_.size());
  MX_REQUIRE(std::isfinite(scale) && scale > 0.0f, "saved FP8 scale ", scale,
             " is not a positive finite number");
  amax_history_ = history;
  scale_ = scale;
}

Quantized DelayedScaling::quantize(const float* x, int64_t rows, int64_t cols,
                                   const RoundingOptions& ro) {
  Quantized q = quantize_fp8_tensor(x, rows, cols, fmt_, scale_, ro);
  record(abs_max(x, rows * cols));
  return q;
}

Quantized quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                             int block_cols, bool pow2_scales, const RoundingOptions& ro) {
  check_shape(rows, cols);
  MX_REQUIRE(block_rows >= 1 && block_cols >= 1, "block shape must be positive");
  Quantized q;
  init_result(q, rows, cols, cols);
  q.scale_rows = ceil_div(rows, block_rows);
  q.scale_cols = ceil_div(cols, block_cols);
  q.scales_f32.assign(size_t(q.scale_rows * q.scale_cols), 0.0f);
  const int64_t nblocks = q.scale_rows * q.scale_cols;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t br = b / q.scale_cols, bc = b % q.scale_cols;
    const int64_t r0 = br * block_rows, r1 = std::min(rows, r0 + block_rows);
    const int64_t c0 = bc * block_cols, c1 = std::min(cols, c0 + block_cols);
    const float scale =
        fp8_scale_from_amax(block_amax(x, cols, r0, r1, c0, c1), kE4M3Max, 0.0f, pow2_scales);
    const float scale_inv = 1.0f / scale;
    q.scales_f32[b] = scale_inv;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = r * cols + c;
        q.codes[i] = encode_fp8(x[i] * scale, Format::kE4M3, ro, i);
        q.dequant[i] = decode_e4m3(q.codes[i]) * scale_inv;
      }
  }
  return q;
}

Quantized quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise,
                         Format elem, MxScaleRule rule, const RoundingOptions& ro) {
  check_shape(rows, cols);
  check_fp8_format(elem);
  constexpr int kBlock = 32;
  Quantized q;
  init_result(q, rows, cols, cols);
  q.scale_rows = columnwise ? ceil_div(rows, kBlock) : rows;
  q.scale_cols = columnwise ? cols : ceil_div(cols, kBlock);
  q.scales_u8.assign(size_t(q.scale_rows * q.scale_cols), 0);
  const int64_t nblocks = q.scale_rows * q.scale_cols;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t br = b / q.scale_cols, bc = b % q.scale_cols;
    const int64_t r0 = columnwise ? br * kBlock : br, r1 = columnwise ? std::min(rows, r0 + kBlock) : r0 + 1;
    const int64_t c0 = columnwise ? bc : bc * kBlock, c1 = columnwise ? c0 + 1 : std::min(cols, c0 + kBlock);
    const float amax = block_amax(x, cols, r0, r1, c0, c1);
    const Mxfp8BlockScale bs = mxfp8_block_scale(amax, elem, rule);
    q.scales_u8[b] = bs.code;
    const float multiplier = bs.encode_multiplier, scale = bs.decode_scale;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = r * cols + c;
        q.codes[i] = encode_fp8(x[i] * multiplier, elem, ro, i);
        q.dequant[i] = decode_fp8(q.codes[i], elem) * scale;
      }
  }
  return q;
}

Quantized quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                         const RoundingOptions& ro) {
  check_shape(rows, cols);
  constexpr int kBlock = 16;
  Quantized q;
  init_result(q, rows, cols, ceil_div(cols, 2));
  const int block_rows = blocks_2d ? kBlock : 1;
  q.scale_rows = ceil_div(rows, block_rows);
  q.scale_cols = ceil_div(cols, kBlock);
  q.scales_u8.assign(size_t(q.scale_rows * q.scale_cols), 0);
  const float s_enc = nvfp4_global_encode_scale(abs_max(x, rows * cols));
  q.global_scale = s_enc;
  const int64_t nblocks = q.scale_rows * q.scale_cols;
  // Elements of one byte (columns 2j, 2j+1) always share a block (16 is even), so blocks never
  // write the same byte and the loop parallelizes.
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t br = b / q.scale_cols, bc = b % q.scale_cols;
    const int64_t r0 = br * block_rows, r1 = std::min(rows, r0 + block_rows);
    const int64_t c0 = bc * kBlock, c1 = std::min(cols, c0 + kBlock);
    const float amax = block_amax(x, cols, r0, r1, c0, c1);
    const Nvfp4BlockScale bs = nvfp4_block_scale(amax, s_enc);
    q.scales_u8[b] = bs.code;
    const float scale_rcp = bs.encode_multiplier, dequant_scale = bs.decode_scale;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = r * cols + c;
        const uint32_t rand = ro.stochastic ? ro.rng.bits(uint64_t(i)) : 0u;
        const uint8_t code =
            encode_e2m1(x[i] * scale_rcp, Saturation::kSatFinite, ro.stochastic, rand);
        uint8_t& byte = q.codes[r * q.code_cols + c / 2];
        byte = uint8_t(byte | (c % 2 ? code << 4 : code));
        q.dequant[i] = decode_e2m1(code) * dequant_scale;
      }
  }
  return q;
}

void rht16_signs(uint32_t seed, float signs[16]) {
  const uint32_t word = philox4x32_10(Philox4{{0, 0, 0, 0}}, seed, 0x52485431u).v[0];
  for (int j = 0; j < 16; ++j) signs[j] = ((word >> j) & 1u) ? -1.0f : 1.0f;
}

namespace {

float hadamard16(int i, int j) { return (__builtin_popcount(unsigned(i & j)) & 1) ? -1.0f : 1.0f; }

void rht16_apply(float* x, int64_t rows, int64_t cols, uint32_t seed, bool inverse) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0,
             "the 16-point Hadamard transform needs cols a multiple of 16, got ", cols);
  float s[16];
  rht16_signs(seed, s);
  const int64_t groups = rows * (cols / 16);
#pragma omp parallel for schedule(static) if (groups > 4096)
  for (int64_t g = 0; g < groups; ++g) {
    float* v = x + g * 16;
    float in[16], out[16];
    for (int j = 0; j < 16; ++j) in[j] = inverse ? v[j] : s[j] * v[j];
    for (int i = 0; i < 16; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < 16; ++j) acc += hadamard16(i, j) * in[j];
      out[i] = 0.25f * acc;
    }
    // forward: y = H D x / 4; inverse: x = D H y / 4 (H symmetric, H H = 16 I, D D = I).
    for (int i = 0; i < 16; ++i) v[i] = inverse ? s[i] * out[i] : out[i];
  }
}

}  // namespace

void rht16_forward(float* x, int64_t rows, int64_t cols, uint32_t seed) {
  rht16_apply(x, rows, cols, seed, false);
}

void rht16_inverse(float* x, int64_t rows, int64_t cols, uint32_t seed) {
  rht16_apply(x, rows, cols, seed, true);
}

}  // namespace mx::numerics
