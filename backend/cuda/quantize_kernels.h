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
void quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                        uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s);

// MXFP8: 1x32 (or 32x1 when columnwise) blocks, E8M0 scale bytes.
void quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise,
                    numerics::Format elem, numerics::MxScaleRule rule,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* dequant, cudaStream_t s);

// NVFP4: 1x16 (or 16x16) blocks, UE4M3 scale bytes, global_scale[0] = S_enc (device).
void quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* global_scale, float* dequant, DeviceArena& scratch, cudaStream_t s);

// max |x| over n values into amax[0] (device), NaN skipped as numerics::abs_max does.
void abs_max(float* amax, const float* x, int64_t n, DeviceArena& scratch, cudaStream_t s);

}  // namespace mx::cuda
