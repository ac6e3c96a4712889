// The recipes' quantizers on the GPU. Each kernel calls the inline rules of numerics/formats.h
// and numerics/quantize.h (the ones numerics/quantize.cpp uses on the CPU), so codes, scales and
// dequantized values are meant to be the same bytes as numerics::quantize_* writes; the op check
// (tests/cuda/op_check.cu) compares them byte for byte. Output buffers are device memory with
// the shapes of numerics::Quantized: codes [rows, cols] (NVFP4: [rows, ceil(cols / 2)]), scales
// [scale_rows, scale_cols], dequant [rows, cols].
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_arena.h"
#include "numerics/quantize.h"

namespace mx::cuda {

// Per-tensor FP8 with a given encode scale (host value): scale_inv[0] = 1 / scale.
void quantize_fp8_tensor(const float* x, int64_t rows, int64_t cols, numerics::Format fmt,
                         float scale, const numerics::RoundingOptions& ro, uint8_t* codes,
                         float* scale_inv, float* dequant, DeviceArena& scratch, cudaStream_t s);

// Per-tensor FP8, current scaling: the amax is reduced on the device and the scale computed
// there (numerics::fp8_scale_from_amax), no host round trip.
void quantize_fp8_current(const float* x, int64_t rows, int64_t cols, numerics::Format fmt,
                          float margin, const numerics::RoundingOptions& ro, uint8_t* codes,
                          float* scale_inv, float* dequant, DeviceArena& scratch, cudaStream_t s);

// Blockwise FP8 E4M3 (1x128, 128x128, ...): scales_f32 [ceil(rows/br), ceil(cols/bc)].
// dequant may be null (codes and scales only: the tensor-core path).
void quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                        uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s);
// The same reading x as bf16 codes (the bf16 path's activations; values widened exactly, so the
// same bytes as the fp32 form on the widened tensor). So for every `const uint16_t* x` overload
// below.
void quantize_fp8_block(const uint16_t* x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                        uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s);

// The same quantization with the codes written transposed: codes_t [cols, rows] = the codes
// quantize_fp8_block writes, transposed (the bytes quantize_fp8_block + transpose_bytes give,
// from one pass: no row-major copy), scales_f32 as quantize_fp8_block's ([sr, sc], untransposed),
// no dequant. For an fp8-block GEMM operand x^T (128x1 blocks of activations and gradients,
// 128x128 of weights).
void quantize_fp8_block_t(const float* x, int64_t rows, int64_t cols, int block_rows,
                          int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                          uint8_t* codes_t, float* scales_f32, cudaStream_t s);
void quantize_fp8_block_t(const uint16_t* x, int64_t rows, int64_t cols, int block_rows,
                          int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                          uint8_t* codes_t, float* scales_f32, cudaStream_t s);

// A gradient's two fp8-block operands from one read: the bytes and scales of
// quantize_fp8_block(x, 1, 128) (codes [rows, cols], row_scales [rows, ceil(cols / 128)]) and of
// quantize_fp8_block_t(x, 128, 1) (codes_t [cols, rows], col_scales [ceil(rows / 128), cols]),
// E4M3, no stochastic rounding. A fused kernel where cols % 4 == 0 and x and codes are aligned
// to their vectors, timed against the two calls by the cast tuner (family fp8_block_both); else
// the two calls.
void quantize_fp8_block_both(const float* x, int64_t rows, int64_t cols, bool pow2_scales,
                             uint8_t* codes, float* row_scales, uint8_t* codes_t,
                             float* col_scales, cudaStream_t s);
void quantize_fp8_block_both(const uint16_t* x, int64_t rows, int64_t cols, bool pow2_scales,
                             uint8_t* codes, float* row_scales, uint8_t* codes_t,
                             float* col_scales, cudaStream_t s);

// MXFP8: 1x32 (or 32x1 when columnwise) blocks, E8M0 scale bytes [ceil(rows/32), cols] when
// columnwise, else [rows, ceil(cols/32)]. dequant may be null (the tensor-core path).
void quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise,
                    numerics::Format elem, numerics::MxScaleRule rule,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* dequant, cudaStream_t s);
void quantize_mxfp8(const uint16_t* x, int64_t rows, int64_t cols, bool columnwise,
                    numerics::Format elem, numerics::MxScaleRule rule,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* dequant, cudaStream_t s);
// The columnwise (32x1) quantization with the codes written transposed (the MXFP8 GEMM's x^T
// and dy^T operands): codes_t [cols, rows] = quantize_mxfp8's columnwise codes transposed,
// scales_u8 as its [ceil(rows/32), cols]; RNE, no dequantized copy. Cast-tuned: the
// columnwise kernel into tmp (rows x cols bytes) and transpose_bytes, or one kernel writing
// codes^T directly (tmp unused).
void quantize_mxfp8_t(const float* x, int64_t rows, int64_t cols, numerics::Format elem,
                      numerics::MxScaleRule rule, uint8_t* tmp, uint8_t* codes_t,
                      uint8_t* scales_u8, cudaStream_t s);
void quantize_mxfp8_t(const uint16_t* x, int64_t rows, int64_t cols, numerics::Format elem,
                      numerics::MxScaleRule rule, uint8_t* tmp, uint8_t* codes_t,
                      uint8_t* scales_u8, cudaStream_t s);

// A gradient's two MXFP8 operands from one read: the bytes of quantize_mxfp8(x, rowwise)
// (codes [rows, cols], row_scales [rows, ceil(cols / 32)]) and of quantize_mxfp8_t (codes_t
// [cols, rows], col_scales [ceil(rows / 32), cols]). fp8_col_t_kernel's MX form writing the
// rowwise codes too where cols % E == 0 (E: elements in 4 bytes of x) and x, codes are aligned,
// timed against the two calls by the cast tuner (family mxfp8_both; tmp, rows x cols bytes,
// for the second call's two-step form); else the two calls.
void quantize_mxfp8_both(const float* x, int64_t rows, int64_t cols, numerics::Format elem,
                         numerics::MxScaleRule rule, uint8_t* codes, uint8_t* row_scales,
                         uint8_t* tmp, uint8_t* codes_t, uint8_t* col_scales, cudaStream_t s);
void quantize_mxfp8_both(const uint16_t* x, int64_t rows, int64_t cols, numerics::Format elem,
                         numerics::MxScaleRule rule, uint8_t* codes, uint8_t* row_scales,
                         uint8_t* tmp, uint8_t* codes_t, uint8_t* col_scales, cudaStream_t s);

// NVFP4: 1x16 (or 16x16) blocks, UE4M3 scale bytes, global_scale[0] = S_enc (device).
// dequant may be null (codes and scales only: the tensor-core path). An amax pass over x, or
// x_amax (device, unless null: max |x|, NaN skipped, taken before: a weight's, kept until
// the optimizer changes it) in its place.
void quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* global_scale, float* dequant, DeviceArena& scratch, cudaStream_t s,
                    const float* x_amax = nullptr);
// x^T's 16x16 quantization (the data gradient's W^T) read from x [rows, cols] (multiples of
// 16) without x^T in memory: the bytes quantize_nvfp4(x^T, cols, rows, true, ro, ...) writes
// (codes [cols, rows / 2], scale bytes [cols / 16, rows / 16], global_scale[0] = S_enc),
// stochastic bits by each element's index in x^T. An amax pass (or x_amax, as
// quantize_nvfp4's), then nvfp4_kernel<true>.
void quantize_nvfp4_16x16_t(const float* x, int64_t rows, int64_t cols,
                            const numerics::RoundingOptions& ro, uint8_t* codes_t,
                            uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                            cudaStream_t s, const float* x_amax = nullptr);

// nvfp4's GEMM operands of a whole tensor, a thread a 16-element block (quantize_nvfp4's
// warp a block leaves 24 of 32 lanes idle on 1x16 blocks), x as fp32 or as bf16 codes. Codes
// only (no dequantized copy), scale bytes unswizzled, global_scale[0] = S_enc; the bytes
// numerics::quantize_nvfp4_into writes (stochastic bits by each element's index in the
// operand).
// _rows: x [rows, cols] in 1x16 blocks along its rows (cols a multiple of 16; codes 8-byte
// aligned): quantize_nvfp4(x, rows, cols, false, ...)'s bytes, after an amax pass over x, or
// with x_amax (device, unless null: max |x|, NaN skipped, as x's producer took it) in its place.
void quantize_nvfp4_rows(const float* x, int64_t rows, int64_t cols,
                         const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                         float* global_scale, DeviceArena& scratch, cudaStream_t s,
                         const float* x_amax = nullptr);
void quantize_nvfp4_rows(const uint16_t* x, int64_t rows, int64_t cols,
                         const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                         float* global_scale, DeviceArena& scratch, cudaStream_t s,
                         const float* x_amax = nullptr);
// _rht_t: the weight gradient's operand RHT(x^T) [cols, rows] in 1x16 blocks along its rows
// (x's columns, 16 rows of x a block: rows a multiple of 16; codes_t 8-byte aligned): the
// bytes of transpose_f32, rht16_forward(seed) and quantize_nvfp4(.., cols, rows, false, ..),
// without the fp32 copies: each thread reads a column's 16 elements, transforms them in
// registers and quantizes them, after a pass that takes the transformed tensor's amax the
// same way.
void quantize_nvfp4_rht_t(const float* x, int64_t rows, int64_t cols, uint32_t seed,
                          const numerics::RoundingOptions& ro, uint8_t* codes_t,
                          uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                          cudaStream_t s);
void quantize_nvfp4_rht_t(const uint16_t* x, int64_t rows, int64_t cols, uint32_t seed,
                          const numerics::RoundingOptions& ro, uint8_t* codes_t,
                          uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                          cudaStream_t s);

// _both: an output gradient's two operands from one amax pass and one read (rows and cols
// multiples of 16): _rows' bytes (ro_rows: the data gradient's rounding) into `out` and
// _rht_t's (ro_t) into `out_t`, with x's and RHT(x^T)'s global scales.
struct Nvfp4Codes {
  uint8_t* codes;
  uint8_t* scales;  // unswizzled, as quantize_nvfp4 writes them
  float* global;    // S_enc (device)
};
void quantize_nvfp4_both(const float* x, int64_t rows, int64_t cols, uint32_t seed,
                         const numerics::RoundingOptions& ro_rows,
                         const numerics::RoundingOptions& ro_t, const Nvfp4Codes& out,
                         const Nvfp4Codes& out_t, DeviceArena& scratch, cudaStream_t s);
void quantize_nvfp4_both(const uint16_t* x, int64_t rows, int64_t cols, uint32_t seed,
                         const numerics::RoundingOptions& ro_rows,
                         const numerics::RoundingOptions& ro_t, const Nvfp4Codes& out,
                         const Nvfp4Codes& out_t, DeviceArena& scratch, cudaStream_t s);

// The per-tensor FP8 operands of the tensor-core Linears (codes only, no dequantized copy):
// scale[0] = the encode scale (numerics::fp8_scale_from_amax(amax[0], fp8_max(fmt)) when amax is
// not null: current scaling; `given` otherwise) and scale_inv[0] = 1 / scale[0], on the device.
void fp8_scales(float* scale, float* scale_inv, const float* amax, float given,
                numerics::Format fmt, cudaStream_t s);
// codes = fmt(x * scale[0]) (RNE, SATFINITE: the bytes numerics::quantize_fp8_tensor writes),
// row-major [rows, cols], or with `transposed` the same codes as [cols, rows] (the K-major copy
// an FP8 GEMM needs when the reduction runs down x's columns).
// amax (device, may be null): max |x| (NaN skipped, as abs_max) into amax[0] from the same
// read, for a scale that does not depend on it (delayed scaling: the cast + amax Transformer
// Engine fuses); one atomic max a block.
void fp8_codes(const float* x, int64_t rows, int64_t cols, numerics::Format fmt,
               const float* scale, uint8_t* codes, bool transposed, cudaStream_t s,
               float* amax = nullptr);
void fp8_codes(const uint16_t* x, int64_t rows, int64_t cols, numerics::Format fmt,
               const float* scale, uint8_t* codes, bool transposed, cudaStream_t s,
               float* amax = nullptr);
// Both layouts of fp8_codes from one read of x (the cast + transpose Transformer Engine fuses):
// codes [rows, cols] and codes_t [cols, rows], the same bytes as the two fp8_codes calls. For a
// Linear's output gradient, which the data gradient reads row-major and the weight gradient
// transposed (x as bf16 codes: the bf16 path's gradients).
void fp8_codes_both(const float* x, int64_t rows, int64_t cols, numerics::Format fmt,
                    const float* scale, uint8_t* codes, uint8_t* codes_t, cudaStream_t s,
                    float* amax = nullptr);
void fp8_codes_both(const uint16_t* x, int64_t rows, int64_t cols, numerics::Format fmt,
                    const float* scale, uint8_t* codes, uint8_t* codes_t, cudaStream_t s,
                    float* amax = nullptr);

// fp8_codes_both of the bf16 path's down-projection input s = silu(g) u (g, u: bf16 codes
// [rows, cols]; s as the bf16 code swiglu_forward_bf16 would store), computed as g and u are
// read: the same codes and amax as swiglu_forward_bf16 followed by fp8_codes_both, without s's
// codes written and read back. amax: zeroed, then max |s| (may be null).
void fp8_codes_both_swiglu(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                           numerics::Format fmt, const float* scale, uint8_t* codes,
                           uint8_t* codes_t, cudaStream_t s, float* amax);
// max |s| of that product into amax[0] (device), NaN skipped as abs_max: current scaling.
void swiglu_abs_max(float* amax, const uint16_t* g, const uint16_t* u, int64_t n,
                    cudaStream_t s);

// SwiGLU's backward on the bf16 path into the FP8 operands of gate's and up's backward, from
// one read of ds, g and u (bf16 codes [rows, cols]): dg and du as swiglu_backward_bf16 writes
// them (rounded RNE to bf16), encoded row-major (dg_rows, du_rows: the data gradients' operands,
// fmt_rows at scales[0] and scales[2]) and transposed [cols, rows] (dg_cols, du_cols: the weight
// gradients', fmt_cols at scales[1] and scales[3]); scales on the device. amax (device, may be
// null): zeroed, then max |dg| and max |du| into amax[0], amax[1]. The bytes fp8_codes_both
// (or fp8_codes) writes from swiglu_backward_bf16's codes at those scales.
void swiglu_backward_fp8(const uint16_t* ds, const uint16_t* g, const uint16_t* u, int64_t rows,
                         int64_t cols, numerics::Format fmt_rows, numerics::Format fmt_cols,
                         const float* scales, uint8_t* dg_rows, uint8_t* dg_cols,
                         uint8_t* du_rows, uint8_t* du_cols, float* amax, cudaStream_t s);
// The same for MXFP8: dg's and du's operands in both of mxfp8's backward layouts, the bytes
// quantize_mxfp8_both writes from their bf16 codes (codes [rows, cols] with E8M0 row_scales
// [rows, cols / 32], codes_t [cols, rows] with col_scales [rows / 32, cols], unswizzled), from
// one read of ds, g and u. cols even; ds, g, u 4-byte aligned, codes 2-byte aligned.
struct MxOperands {
  uint8_t* codes;
  uint8_t* row_scales;
  uint8_t* codes_t;
  uint8_t* col_scales;
};
void swiglu_backward_mxfp8(const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                           int64_t rows, int64_t cols, numerics::Format elem,
                           numerics::MxScaleRule rule, const MxOperands& dg,
                           const MxOperands& du, cudaStream_t s);
// The same for fp8-block: dg's and du's operands in both of its backward layouts, the bytes
// and scales quantize_fp8_block_both writes from their bf16 codes (codes [rows, cols] with
// row_scales [rows, cols / 128], codes_t [cols, rows] with col_scales [rows / 128, cols],
// floats 1 / scale), from one read of ds, g and u (and one from L2). cols a multiple of 4;
// ds, g, u 8-byte aligned, codes 4-byte aligned.
struct BlockOperands {
  uint8_t* codes;
  float* row_scales;
  uint8_t* codes_t;
  float* col_scales;
};
void swiglu_backward_fp8_block(const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                               int64_t rows, int64_t cols, bool pow2_scales,
                               const BlockOperands& dg, const BlockOperands& du,
                               cudaStream_t s);
// The down projection's input under mxfp8 and fp8-block made from SwiGLU's operands: s =
// silu(g) u as the bf16 code swiglu_forward_bf16 stores (never stored itself), in the forward's
// rowwise layout (mxfp8 1x32, fp8-block 1x128) and the weight gradient's columnwise one
// (32x1, 128x1; codes_t [cols, rows]) with their scales: the bytes quantize_mxfp8_both /
// quantize_fp8_block_both write from s's codes, from one read of g and u. mxfp8: cols even,
// g, u 4-byte aligned, codes 2-byte aligned; fp8-block: cols a multiple of 4, g, u 8-byte
// aligned, codes 4-byte aligned.
void swiglu_forward_mxfp8(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                          numerics::Format elem, numerics::MxScaleRule rule,
                          const MxOperands& out, cudaStream_t s);
void swiglu_forward_fp8_block(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                              bool pow2_scales, const BlockOperands& out, cudaStream_t s);
// max |dg| and max |du| of those gradients into amax[0], amax[1] (device): current scaling.
void swiglu_grads_abs_max(float* amax, const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                          int64_t n, cudaStream_t s);

// dst[cols, rows] = src[rows, cols]^T, bytes (FP8 codes).
void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst,
                     cudaStream_t s);
// dst[cols, rows] = src[rows, cols]^T, fp32 (32 x 32 shared-memory tiles).
void transpose_f32(const float* src, int64_t rows, int64_t cols, float* dst, cudaStream_t s);
// numerics::rht16_forward on the device, in place: the same signs (computed on the host by
// numerics::rht16_signs) and the same fp32 operations in the same order, so the same bits.
void rht16_forward(float* x, int64_t rows, int64_t cols, uint32_t seed, cudaStream_t s);
// Scale matrices into a GEMM's layout: dst (dst_rows x ld, row-major) [i, j] = src[i, j], or
// src[j, i] when transposed (src row-major with src_cols columns), for j < valid_cols; padding
// columns 0.
void relayout_f32(const float* src, int64_t src_cols, bool transposed, int64_t dst_rows,
                  int64_t valid_cols, int64_t ld, float* dst, cudaStream_t s);

// MXFP8 scale bytes for a GEMM operand of R rows with kb = K / 32 scales each, into the
// swizzled layout cuBLASLt's VEC32_UE8M0 mode reads (numerics/block_scale_layout.h;
// swizzled_scale_bytes(R, kb) bytes, padding zeroed): src [R, kb] row-major, or with
// `transposed` [kb, R] (quantize_mxfp8's columnwise scales of the operand's transpose).
// NVFP4 (VEC16_UE4M3, kb = K / 16) uses the same layout; with row_div = 16 (16x16 weight
// blocks) src holds one scale row per 16 operand rows: [R / 16, kb] (or [kb, R / 16]).
void swizzle_scales_u8(const uint8_t* src, bool transposed, int64_t R, int64_t kb,
                       uint8_t* dst, cudaStream_t s, int64_t row_div = 1);

// Recipe fp8-block on Blackwell (numerics/fp8_block_mx.h): the E8M0 scales of an fp8-block
// operand for the MXFP8 GEMM (VEC32_UE8M0), from quantize_fp8_block's fp32 decode scales
// `block_scales` [ceil(rows / block_rows), ceil(cols / block_cols)] of x [rows, cols]. The
// operand is x (R = rows, K = cols) or, with `transposed`, x^T (R = cols, K = rows: its codes
// transposed by the caller); dst gets numerics::swizzled_scale_bytes(R, K / 32) bytes in the
// swizzled layout, every byte written (padding 0), the same bytes as the CPU twin
// numerics::fp8_block_scales_to_mx. K and the blocks' extent along K (block_cols, or
// block_rows when transposed) must be multiples of 32: 1x128, 128x1 transposed, 128x128. A
// scale that is not a power of two in [2^-127, 2^127] becomes E8M0's NaN code 0xFF (never for
// quantize_fp8_block's pow2 scales).
void fp8_block_scales_to_mx(const float* block_scales, int64_t rows, int64_t cols,
                            int block_rows, int block_cols, bool transposed, uint8_t* dst,
                            cudaStream_t s);

// Cast tuning (docs/cuda.md, "Cast tuning"): the casts with several byte-identical kernel
// forms (fp8-block's 1x128 row-major, 128x1 transposed and 128x128 operands, MXFP8's 1x32 and
// 32x1 transposed ones, the per-tensor casts' vectors in flight, their transposing kernel)
// time each form at a shape's first call and keep the fastest; the bytes never depend on it.
// MXTRAIN_CUDA_CAST_TUNE: 1 (unset: the default) tunes casts of 2^22 elements and more, `all`
// every one, 0 none (each cast's first form); parse_cast_tune throws UserError for anything
// else. MXTRAIN_CUDA_CAST_TUNE_LOG=1 logs one line a tuned shape (`cuda cast tune: ...`: each
// form's time and GB/s, the one kept).
enum class CastTune { kOff, kLarge, kAll };
CastTune parse_cast_tune(const char* value);
void set_cast_tune(CastTune t);  // process-wide (the quantizers are free functions)
// Tests: every tuned cast runs form k (modulo its count of forms), untimed; -1 ends it.
void force_cast_form(int k);
struct CastTuneStats {
  int timed = 0;    // shapes timed
  int changed = 0;  // of them, kept a form other than the untuned one
};
CastTuneStats cast_tune_stats();

// The vectors of 4 elements a thread of the per-tensor FP8 cast and amax kernels loads before it
// uses any: MXTRAIN_FP8_CAST_UNROLL = 1 (unset: the default), 2 or 4, read once (the first call
// says a value that is set, `cuda fp8 casts: ...`); UserError for anything else.
int fp8_cast_unroll();

// max |x| over n values into amax[0] (device), NaN skipped as numerics::abs_max does.
void abs_max(float* amax, const float* x, int64_t n, DeviceArena& scratch, cudaStream_t s);
void abs_max(float* amax, const uint16_t* x, int64_t n, DeviceArena& scratch, cudaStream_t s);

// FP8 attention's scales (numerics::attn_fp8_scale_slots) on the device from amax[0..3] = the
// amaxes of q, k, v and dO (device): slots [numerics::kAttnFp8Slots * kAttnFp8SlotFloats].
void attn_fp8_scales(float* slots, const float* amax, int64_t D, int64_t rows_per_key,
                     float attn_scale, cudaStream_t s);
// dst[i * stride] = max(dst[i * stride], src[i * stride]) for i < n (device pointers): FP8
// attention's cuDNN amaxes, one group of sequences at a time, into the whole batch's.
void max_into(float* dst, const float* src, int n, int stride, cudaStream_t s);
// out[i] = decode(codes[i]) * scale_inv[0] over n values (FP8 codes of fmt, scale_inv on the
// device): the values the codes stand for (exact in fp32).
void fp8_decode(const uint8_t* codes, int64_t n, numerics::Format fmt, const float* scale_inv,
                float* out, cudaStream_t s);
// The same values as bf16 codes (exact for the power-of-two scales of FP8 attention, whose
// values are all bf16 values; otherwise rounded, RNE).
void fp8_decode(const uint8_t* codes, int64_t n, numerics::Format fmt, const float* scale_inv,
                uint16_t* out, cudaStream_t s);

// out[i] = decode(fmt(x[i] * scale[0])) * scale_inv[0] over n values (RNE, SATFINITE; the
// scales on the device): x's per-tensor FP8 values in fp32, the dequantized tensor
// quantize_fp8_tensor writes, with no codes buffer. out may alias x. (The FP8 head where its
// GEMMs are not FP8: HeadOperands::kFp8.)
void fp8_round(const float* x, int64_t n, numerics::Format fmt, const float* scale,
               const float* scale_inv, float* out, cudaStream_t s);

// Test support (the op check's fp8_encoder case): over the float bit patterns first ..
// first + count - 1, how many the kernels' FP8 encoder (the hardware conversion on compute
// capability >= 8.9) encodes differently from numerics::encode_fp8_elem (saturating, RNE);
// first_bad_bits (may be null): the smallest such pattern. Synchronizes.
uint64_t fp8_encoder_mismatches(numerics::Format fmt, uint64_t first, uint64_t count,
                                uint32_t* first_bad_bits, cudaStream_t s);

}  // namespace mx::cuda
