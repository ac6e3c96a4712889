// SwiGLU's per-element math on the device, shared by cuda_backend.cu's SwiGLU kernels and the
// FP8 cast that makes the down projection's input from g and u as it reads them
// (quantize_kernels.cu, fp8_codes_both_swiglu): one definition, so both give the same bits.
// (`inline`, not __forceinline__: mxemu compiles both files as C++, where __forceinline__ is
// empty and two definitions would clash; nvcc inlines these calls all the same.)
#pragma once

#include "numerics/formats.h"

namespace mx::cuda {

__device__ inline float swiglu_value(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}
__device__ inline void swiglu_grads(float ds, float g, float u, float& dg, float& du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  du = ds * g * sig;
  dg = ds * u * sig * (1.0f + g * (1.0f - sig));
}
// The bf16 path's product of two codes: swiglu_value of the widened codes, rounded RNE to a
// bf16 code (what swiglu_forward_bf16 stores).
__device__ inline uint16_t swiglu_code(uint16_t g, uint16_t u) {
  return numerics::encode_bf16(swiglu_value(numerics::decode_bf16(g), numerics::decode_bf16(u)),
                               numerics::Saturation::kNoSat);
}

}  // namespace mx::cuda
