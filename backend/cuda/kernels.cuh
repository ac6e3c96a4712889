// Launchers of the backend's own kernels (one .cu per idea; the class in cuda_backend.cu calls
// these). All take device pointers and the backend's stream; scratch comes from the caller.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/device_arena.h"

namespace mx::cuda {

// Grid y and z are at most 65535 (CUDA's limit); kernels with more rows, heads or sequences
// than that take them in chunks (attention.cu) or in turn (the transposes in
// quantize_kernels.cu). MXTRAIN_TEST_GRID_YZ lowers the limit so the op check runs those paths
// at small shapes.
int64_t max_grid_yz();

// attention.cu: causal GQA flash attention, fp32, head_dim D <= kMaxHeadDim.
constexpr int kMaxHeadDim = 128;
// fp8 (both null for plain attention): FP8 attention's rounding inside the kernels, the CPU
// twin's steps (backend/cpu/attention.cpp), on q, k, v (and out, dout) that are FP8 values
// already. slots: numerics::attn_fp8_scale_slots on the device. Forward: the normalized
// probabilities rounded to E4M3 at slot kAttnScaleS before P V (a second pass over the keys,
// after the row's lse); their max goes to amax (atomic max: it must start at 0 or below).
// Backward: P rounded likewise for dV, dS rounded to E5M2 at kAttnScaleDP before dQ and dK;
// max |dS| before its rounding to amax.
struct AttnFp8Kernel {
  const float* slots = nullptr;
  float* amax = nullptr;
};
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s,
                       AttnFp8Kernel fp8 = {});
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DeviceArena& scratch, cudaStream_t s, AttnFp8Kernel fp8 = {});
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      int64_t T_ctx, int64_t H, int64_t KV, int64_t D, cudaStream_t s);

}  // namespace mx::cuda
