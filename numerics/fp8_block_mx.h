// Recipe fp8-block on MXFP8 tensor cores (Blackwell): the fp8-block operand's power-of-two block
// scales rewritten as MXFP8 E8M0 scales, as Transformer Engine does on sm_100 (cuBLASLt there
// has no 1x128 / 128x128 scale modes, only VEC32_UE8M0 among the FP8 ones).
//
// Why it is exact: quantize_fp8_block with pow2_scales stores the decode scale 1 / scale with
// scale = fp8_scale_from_amax(amax, 448, 0, true), a power of two 2^e (the mantissa cleared).
// The amax is a finite non-negative fp32, so 448 / amax >= 448 / FLT_MAX > 2^-120 and
// e is in [-120, 127] (448 / amax overflowing to inf is clamped to FLT_MAX, whose power of
// two is 2^127; amax 0, inf or NaN give scale 1). The decode scale is then 2^-e in
// [2^-127, 2^120] (2^-127 is an fp32 subnormal, exact), and E8M0 holds every 2^k with k in
// [-127, 127] as code k + 127. The E4M3 codes stay what they are; a 1 x 32 piece of a row of a
// block lies inside that block when the block's extent along K is a multiple of 32, so it takes
// the block's code: a 1x128 block along K becomes four MX blocks with its code, a 128x128 block
// gives each of its rows' four 32-wide pieces its code. decode_e4m3(code) * decode_e8m0(e8m0)
// is then the same fp32 product the fp8-block dequantization forms, bit for bit.
//
// Host and device (MX_HOST_DEVICE): the CUDA kernel (backend/cuda/quantize_kernels.cu,
// fp8_block_scales_to_mx) and the CPU twin (fp8_block_scales_to_mx below) call the same
// functions. Tests: tests/cpp/numerics/test_fp8_block_mx.cpp.
#pragma once
#include <cstdint>

#include "numerics/block_scale_layout.h"
#include "numerics/formats.h"

namespace mx::numerics {

// What e8m0_from_pow2_scale returns for a scale E8M0 cannot hold exactly: E8M0's NaN code, so
// a GEMM that reads it anyway produces NaN (loud) instead of a silently different product.
constexpr uint8_t kE8M0NotConvertible = 0xFF;

// fp32 decode scale -> the E8M0 code c with decode_e8m0(c) == s exactly, for s = 2^k with k in
// [-127, 127] (k = -127 is the fp32 subnormal 0x00400000). Anything else returns
// kE8M0NotConvertible: a scale that is not a power of two (fp8-block with pow2_scales = false:
// 448 / amax), zero, negative, inf, NaN, or a power of two outside E8M0's range (below 2^-127:
// the fp32 subnormals 2^-128 ... 2^-149; fp32 has none above 2^127). quantize_fp8_block with
// pow2_scales = true only produces convertible scales (above).
MX_HOST_DEVICE inline uint8_t e8m0_from_pow2_scale(float s) {
  const uint32_t bits = float_bits(s);
  if (bits == 0x00400000u) return 0;  // 2^-127: E8M0's smallest code
  const uint32_t biased = bits >> 23;  // the sign bit makes negatives > 255
  // A normal fp32 power of two 2^(biased - 127) with a zero mantissa: E8M0 uses the same bias,
  // so the code is the exponent field (1..254). Exponent 0 (zero, other subnormals) and 255
  // (inf, NaN) are not convertible.
  if ((bits & 0x7FFFFFu) != 0 || biased == 0 || biased >= 255) return kE8M0NotConvertible;
  return uint8_t(biased);
}

// The E8M0 code of MX block (r, kb32) of an fp8-block operand used as a K-major GEMM operand
// [R, K]: the operand is the quantized matrix x [rows, cols] itself (R = rows, K = cols) or,
// when `transposed`, x^T (R = cols, K = rows: the codes are transposed, the scales are read
// in place). block_scales: quantize_fp8_block's decode scales of x, [ceil(rows / block_rows),
// scale_cols = ceil(cols / block_cols)] row-major. MX block (r, kb32) covers operand elements
// (r, 32 kb32 .. 32 kb32 + 31), i.e. x's (r, 32 kb32 ..) or, transposed, x's (32 kb32 .., r):
// one fp8 block when its extent along K (block_cols, or block_rows when transposed) is a
// multiple of 32, which the caller guarantees (fp8_block_scales_to_mx checks it).
MX_HOST_DEVICE inline uint8_t fp8_block_mx_code(const float* block_scales, int64_t scale_cols,
                                                int64_t block_rows, int64_t block_cols,
                                                bool transposed, int64_t r, int64_t kb32) {
  const int64_t i = transposed ? 32 * kb32 : r;  // x's row and column of the piece's first element
  const int64_t j = transposed ? r : 32 * kb32;
  return e8m0_from_pow2_scale(block_scales[(i / block_rows) * scale_cols + j / block_cols]);
}

// The converted operand's shape, checked once for the CPU twin and the CUDA launcher alike:
// R operand rows, kb = K / 32 scales per row, scale_cols block scales per row of x, and the
// swizzled buffer's size. UserError unless K and the blocks' extent along K are multiples of 32.
struct Fp8BlockMxShape {
  int64_t R = 0, kb = 0, scale_cols = 0, bytes = 0;
};
Fp8BlockMxShape fp8_block_mx_shape(int64_t rows, int64_t cols, int block_rows, int block_cols,
                                   bool transposed);

// CPU twin of the CUDA kernel fp8_block_scales_to_mx: the E8M0 scales of the operand above in
// cuBLASLt's swizzled VEC32_UE8M0 layout (block_scale_layout.h), for R operand rows and
// kb = K / 32 scales per row: dst gets swizzled_scale_bytes(R, kb) bytes, padding 0 (as
// swizzle_scales_u8 pads). Requires K a multiple of 32 and the blocks' extent along K a
// multiple of 32 (1x128 with transposed = false, 128x1 with transposed = true, 128x128 either
// way; UserError otherwise). Returns how many MX blocks got kE8M0NotConvertible (0 for every
// operand quantize_fp8_block produces with pow2_scales = true).
int64_t fp8_block_scales_to_mx(const float* block_scales, int64_t rows, int64_t cols,
                               int block_rows, int block_cols, bool transposed, uint8_t* dst);

}  // namespace mx::numerics
