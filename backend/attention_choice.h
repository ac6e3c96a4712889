// Which attention the CUDA backend runs, and the host-side rules of cuDNN's SDPA that are
// checked before a graph is built. Plain C++ (no CUDA, no cuDNN): part of the engine library,
// so the CPU test suite covers it (tests/cpp/backend/test_attention_choice.cpp); the CUDA backend
// (backend/cuda/cudnn_attention.cpp, cuda_backend.cu) uses it.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mx {

enum class CudaAttention : uint8_t {
  kCudnn,  // cuDNN's fused SDPA (flash attention on tensor cores) in bf16, fp32 accumulation
  kFp32,   // our own fp32 kernel (backend/cuda/attention.cu)
};

// MXTRAIN_CUDA_ATTENTION's value: "cudnn" or "fp32"; unset (nullptr) or empty: cudnn, the
// default (which still falls back to fp32 per shape where cuDNN is missing or refuses it).
// Anything else is a UserError naming the variable.
CudaAttention parse_cuda_attention(const char* value);
const char* cuda_attention_name(CudaAttention a);

// The shape rules of cuDNN's bf16 SDPA (forward and backward, causal, grouped-query) that hold
// on every GPU it serves, checked before asking cuDNN: "" when none is broken, else the reason.
// The graph's own check_support() has the last word (per GPU and cuDNN version), e.g. head
// dims above 128 are Hopper-only.
std::string cudnn_sdpa_shape_problem(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

// A 4-d tensor view as cuDNN's graph API takes it: dims and strides in elements.
struct TensorView4 {
  std::array<int64_t, 4> dim, stride;
};
// Our [B, T, heads, D] activations (q, out, dq, dout: heads = H; k, v, dk, dv: heads = KV) as
// cuDNN's [B, heads, T, D] with the strides of the BSHD layout: no copy, no transpose.
TensorView4 bshd_view(int64_t B, int64_t T, int64_t heads, int64_t D);
// Our lse [B, H, T] (fp32) as cuDNN's softmax statistics tensor [B, H, T, 1].
TensorView4 stats_view(int64_t B, int64_t H, int64_t T);

}  // namespace mx
