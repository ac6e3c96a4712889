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
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DeviceArena& scratch, cudaStream_t s);
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      int64_t T_ctx, int64_t H, int64_t KV, int64_t D, cudaStream_t s);

}  // namespace mx::cuda
