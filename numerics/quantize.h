// Quantizers of the low-precision recipes: per-tensor FP8 (current and delayed scaling),
// blockwise FP8 (1x128 / 128x128, DeepSeek-V3 / TE Float8BlockScaling), MXFP8 (1x32 blocks with
// E8M0 scales) and NVFP4 (E2M1 in 1x16 or 16x16 blocks, UE4M3 block scales, fp32 global scale),
// plus the 16-point random Hadamard transform used with NVFP4.
//
// Every quantizer views its input as a row-major [rows, cols] matrix and returns the codes, the
// scales and the dequantized fp32 tensor. Scales are always *decode* multipliers:
//   dequant = decode(code) * scale                      (FP8 per-tensor, FP8 block, MXFP8)
//   dequant = decode(code) * (decode(block_scale) / global_scale)      (NVFP4)
// Blocks at the right/bottom edge may be partial (cols or rows not a multiple of the block):
// a partial block's amax is taken over the elements it has. Exact formulas: docs/numerics.md.
//
// The per-element and per-block rules (scale from amax, E8M0 / UE4M3 block scales) are inline
// MX_HOST_DEVICE functions at the bottom of this file, so the CPU quantizers below and the CUDA
// kernels (backend/cuda/quantize_kernels.cu) compute the same bytes with the same code.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "numerics/formats.h"

namespace mx::numerics {

struct Quantized {
  int64_t rows = 0, cols = 0;
  // FP8: one code per element, [rows, cols]. NVFP4: two E2M1 codes per byte, low nibble first,
  // [rows, ceil(cols / 2)] (an odd last column leaves the high nibble 0).
  std::vector<uint8_t> codes;
  int64_t code_cols = 0;
  // Exactly one of the two is filled: fp32 scales (per-tensor FP8: [1, 1]; FP8 block:
  // [ceil(rows/br), ceil(cols/bc)]) or scale bytes (MXFP8 E8M0, NVFP4 UE4M3).
  std::vector<float> scales_f32;
  std::vector<uint8_t> scales_u8;
  int64_t scale_rows = 0, scale_cols = 0;
  float global_scale = 1.0f;  // NVFP4 only: the encode-side S_enc = 2688 / global_amax
  std::vector<float> dequant;  // [rows, cols]
};

// Stochastic rounding of the element codes (scales are never stochastically rounded). Element
// (r, c) draws rng.bits(r * cols + c).
struct RoundingOptions {
  bool stochastic = false;
  RandomStream rng;
};

// max |x| over n values (NaN values are skipped, as fmaxf does).
float abs_max(const float* x, int64_t n);

// ---- per-tensor FP8 -------------------------------------------------------------------------
// Transformer Engine's compute_scale_from_amax: the *encode* scale
//   scale = fp8_max / amax / 2^margin; 1 when amax is 0, inf or NaN; FLT_MAX when that
//   overflows; with pow2 the fp32 mantissa bits are cleared (rounds the scale down, i.e. the
//   decode multiplier 1/scale up, so no value saturates).
MX_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float fp8_max, float margin = 0.0f,
                                                bool pow2 = false);

// codes = fmt(x * scale) (RNE or stochastic, SATFINITE); scales_f32 = {1 / scale}.
// fmt is Format::kE4M3 or Format::kE5M2.
Quantized quantize_fp8_tensor(const float* x, int64_t rows, int64_t cols, Format fmt,
                              float scale, const RoundingOptions& rounding = {});

// Current scaling: scale = fp8_scale_from_amax(abs_max(x), fp8_max(fmt), margin).
Quantized quantize_fp8_current(const float* x, int64_t rows, int64_t cols, Format fmt,
                               float margin = 0.0f, const RoundingOptions& rounding = {});

struct QuantizeInto;
enum class AmaxAlgo : uint8_t { kMax, kMostRecent };

// Delayed scaling: a tensor is quantized with the scale computed from the amax history of the
// previous steps; its own amax then enters the history (newest first, length fixed), and the
// scale for the next step is recomputed: amax = max(history) or history[0], and the scale keeps
// its previous value when that amax is 0 (TE's torch.where(amax > 0, sf, scale)). Starts at 1.
inline constexpr int kAmaxHistoryLen = 1024;  // the recipes' history length (checkpoints hold it)
class DelayedScaling {
 public:
  explicit DelayedScaling(Format fmt = Format::kE4M3, int history_len = kAmaxHistoryLen,
                          AmaxAlgo algo = AmaxAlgo::kMax, float margin = 0.0f);
  float scale() const { return scale_; }
  const std::vector<float>& amax_history() const { return amax_history_; }
  void record(float amax);  // push a new amax and recompute the scale
  // Puts back a state saved from amax_history() and scale() (checkpoints); the history must
  // have this object's length.
  void restore(const std::vector<float>& history, float scale);
  Quantized quantize(const float* x, int64_t rows, int64_t cols,
                     const RoundingOptions& rounding = {});

 private:
  Format fmt_;
  AmaxAlgo algo_;
  float margin_;
  float scale_ = 1.0f;
  std::vector<float> amax_history_;
};

float fp8_max(Format fmt);  // 448 for E4M3, 57344 for E5M2

// ---- blockwise FP8 (E4M3) -------------------------------------------------------------------
// Blocks of block_rows x block_cols (1x128 for activations/gradients, 128x128 for weights).
// Per block: scale = fp8_scale_from_amax(block_amax, 448, 0, pow2_scales);
// codes = e4m3(x * scale); scales_f32[block] = 1 / scale.
Quantized quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                             int block_cols, bool pow2_scales = true,
                             const RoundingOptions& rounding = {});

// ---- MXFP8 ----------------------------------------------------------------------------------
enum class MxScaleRule : uint8_t {
  kCeil,   // Transformer Engine / cuBLAS: b = e8m0_up_satfinite(amax * fp32(1 / elem_max))
  kFloor,  // OCP MX v1.0: b = floor(log2(amax)) - emax_elem + 127, clamped to [0, 254]
};
// 1x32 blocks along each row (columnwise = false) or 32x1 blocks along dim 0 (columnwise =
// true; scales are then [ceil(rows / 32), cols]). elem: kE4M3 or kE5M2.
Quantized quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise = false,
                         Format elem = Format::kE4M3, MxScaleRule rule = MxScaleRule::kCeil,
                         const RoundingOptions& rounding = {});

// ---- NVFP4 ----------------------------------------------------------------------------------
// 1x16 blocks (blocks_2d = false) or 16x16 blocks (weights). See docs/numerics.md.
Quantized quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d = false,
                         const RoundingOptions& rounding = {});
MX_HOST_DEVICE inline float nvfp4_global_encode_scale(float global_amax);  // TE: 2688 / amax

// ---- into caller memory (the training path) --------------------------------------------------
// The quantizers above with no allocation: they write the dequantized tensor [rows, cols] into
// `dequant` (which may be x itself: every element is read before it is written) and, where the
// pointer is not null, the codes and scales in Quantized's layouts. Same bytes as the
// Quantized-returning functions (which call these), for any OpenMP thread count.
struct QuantizeInto {
  float* dequant = nullptr;
  uint8_t* codes = nullptr;       // null: not written
  float* scales_f32 = nullptr;    // FP8 block
  uint8_t* scales_u8 = nullptr;   // MXFP8 E8M0 / NVFP4 UE4M3
};
void quantize_fp8_tensor_into(const float* x, int64_t rows, int64_t cols, Format fmt,
                              float scale, const QuantizeInto& out,
                              const RoundingOptions& rounding = {});
void quantize_fp8_block_into(const float* x, int64_t rows, int64_t cols, int block_rows,
                             int block_cols, bool pow2_scales, const QuantizeInto& out,
                             const RoundingOptions& rounding = {});
void quantize_mxfp8_into(const float* x, int64_t rows, int64_t cols, bool columnwise,
                         Format elem, MxScaleRule rule, const QuantizeInto& out,
                         const RoundingOptions& rounding = {});
// NVFP4 into caller memory; returns the global encode scale S_enc. columnwise (1-D blocks only,
// codes must be null): the blocks are 16x1 down the columns, i.e. exactly the rowwise
// quantization of x^T written back transposed (element (r, c) draws rng.bits(c * rows + r));
// scales are then [ceil(rows / 16), cols].
float quantize_nvfp4_into(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                          bool columnwise, const QuantizeInto& out,
                          const RoundingOptions& rounding = {});

// decode(encode(v, kSatFinite)) for E4M3, E5M2 or E2M1 with round-to-nearest-even, computed on
// the value (the form the *_into loops vectorize); the same bits as the codecs for every input.
float rne_satfinite_value(float v, Format fmt);

// ---- 16-point random Hadamard transform -----------------------------------------------------
// y = (1/4) * H16 * diag(s) * x on each group of 16 consecutive elements of a row, H16 the
// Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and s_j = +-1 = bit j of word 0 of
// philox4x32_10({0, 0, 0, 0}, seed, 0x52485431 ("RHT1")) (1 -> -1). The transform is
// orthogonal; rht16_inverse undoes it. cols must be a multiple of 16 (UserError otherwise).
void rht16_signs(uint32_t seed, float signs[16]);
void rht16_forward(float* x, int64_t rows, int64_t cols, uint32_t seed);
void rht16_inverse(float* x, int64_t rows, int64_t cols, uint32_t seed);

// ---- inline rules shared with the CUDA kernels ----------------------------------------------
// Only fminf/fmaxf/fabsf/exp2f/ilogbf/ldexpf (the same C functions on the host as std::fmin etc.
// of a float; CUDA's device versions are exact for these arguments: exp2f only for whole-number
// arguments, so a margin must be a whole number for the device to match) and bit tests for
// inf/NaN.

MX_HOST_DEVICE inline bool is_inf_f32(float x) { return (float_bits(x) & 0x7FFFFFFFu) == 0x7F800000u; }
MX_HOST_DEVICE inline bool is_nan_f32(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

// The amax fold: NaN values are skipped (fmaxf returns the other operand), so the result does
// not depend on the order of the fold (the CUDA reductions fold in another order).
MX_HOST_DEVICE inline float amax_fold(float m, float x) { return fmaxf(m, fabsf(x)); }

MX_HOST_DEVICE inline float fp8_scale_from_amax(float amax, float max_value, float margin,
                                                bool pow2) {
  if (!(amax > 0.0f) || is_inf_f32(amax)) return 1.0f;  // 0, NaN, inf: keep the unit scale
  float scale = max_value / amax;
  if (margin != 0.0f) scale = scale / exp2f(margin);
  // The smallest scale: max / (FLT_MAX / 2), so that the largest code decodes to FLT_MAX / 2,
  // finite. Only a margin or an amax above FLT_MAX / 2 goes below it: 448 / 1e30 / 2^64 is 0 in
  // fp32, whose 1 / scale is inf (Transformer Engine stores that: NaN dequantized values); a
  // tiny normal scale still sent x near FLT_MAX to codes whose decode overflowed.
  const float smallest = max_value / (FLT_MAX * 0.5f);
  if (scale < smallest) scale = smallest;
  if (is_inf_f32(scale)) scale = FLT_MAX;
  if (is_nan_f32(scale)) scale = 1.0f;
  if (pow2) {
    const uint32_t b = float_bits(scale) & 0xFF800000u;  // drop the mantissa: 2^floor(log2)
    scale = b ? bits_float(b) : 1.0f;
  }
  return scale;
}

// FP8 element encode (SATFINITE) of one quantizer; `rand` is used only when stochastic.
MX_HOST_DEVICE inline uint8_t encode_fp8_elem(float v, Format fmt, bool stochastic, uint32_t rand) {
  return fmt == Format::kE5M2 ? encode_e5m2(v, Saturation::kSatFinite, stochastic, rand)
                              : encode_e4m3(v, Saturation::kSatFinite, stochastic, rand);
}
MX_HOST_DEVICE inline float decode_fp8_elem(uint8_t code, Format fmt) {
  return fmt == Format::kE5M2 ? decode_e5m2(code) : decode_e4m3(code);
}

// One MXFP8 block's E8M0 scale from its amax: the code, the multiplier applied before encoding
// (2^(127 - code)) and the decode scale (decode_e8m0(code)).
struct Mxfp8BlockScale {
  uint8_t code;
  float encode_multiplier;
  float decode_scale;
};
MX_HOST_DEVICE inline Mxfp8BlockScale mxfp8_block_scale(float amax, Format elem, MxScaleRule rule) {
  const float elem_max = elem == Format::kE5M2 ? kE5M2Max : kE4M3Max;
  Mxfp8BlockScale s;
  if (rule == MxScaleRule::kCeil) {
    const float max_rcp = 1.0f / elem_max;  // TE's Quantized_Limits::max_norm_rcp
    s.code = encode_e8m0(amax * max_rcp, E8M0Rounding::kUp, Saturation::kSatFinite);
    // TE's exp2f_rcp: 2^(127 - b) from the bits, and 1 for b = 0.
    s.encode_multiplier = s.code == 0 ? 1.0f : bits_float(uint32_t(254 - int(s.code)) << 23);
  } else {
    const int emax_elem = elem == Format::kE5M2 ? 15 : 8;
    int code = 0;
    if (is_inf_f32(amax)) {  // ilogbf(inf) is INT_MAX: the sum below would overflow (UB)
      code = 254;            // the largest scale, as kCeil's saturating encode gives inf
    } else if (amax > 0.0f) {  // ilogb: floor(log2 |amax|), exact for subnormals too
      code = ilogbf(amax) - emax_elem + 127;
      if (code < 0) code = 0;
      if (code > 254) code = 254;
    }
    s.code = uint8_t(code);
    s.encode_multiplier = ldexpf(1.0f, 127 - code);  // exact: 2^(127 - b) is in fp32 range
  }
  s.decode_scale = decode_e8m0(s.code);
  return s;
}

MX_HOST_DEVICE inline float nvfp4_global_encode_scale(float global_amax) {
  float s = (kE4M3Max * kE2M1Max) / global_amax;  // 2688 / amax
  s = fminf(s, FLT_MAX);
  if (global_amax == 0.0f || s == 0.0f || is_nan_f32(s)) return 1.0f;
  return s;
}

// One NVFP4 block's UE4M3 scale from its amax and the global encode scale s_enc: the code, the
// multiplier applied before the E2M1 encode, and the dequantization scale.
struct Nvfp4BlockScale {
  uint8_t code;
  float encode_multiplier;
  float decode_scale;
};
MX_HOST_DEVICE inline Nvfp4BlockScale nvfp4_block_scale(float amax, float s_enc) {
  const float s_dec = 1.0f / s_enc;
  Nvfp4BlockScale s;
  s.code = encode_e4m3(fminf(amax / kE2M1Max * s_enc, FLT_MAX), Saturation::kSatFinite);
  const float block_scale = decode_e4m3(s.code);
  s.encode_multiplier = fminf(1.0f / (block_scale * s_dec), FLT_MAX);
  s.decode_scale = block_scale * s_dec;
  return s;
}

}  // namespace mx::numerics
