// Which attention the CUDA backend runs, and the host-side rules of cuDNN's SDPA that are
// checked before a graph is built. Plain C++ (no CUDA, no cuDNN): part of the engine library,
// so the CPU test suite covers it (tests/cpp/backend/test_attention_choice.cpp); the CUDA backend
// (backend/cuda/cudnn_attention.cpp, cuda_backend.cu) uses it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
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
// B is the sequences of one call: at most kCudnnMaxSequences (see below), as are the heads.
std::string cudnn_sdpa_shape_problem(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

// cuDNN's SDPA fails at run time (a non-good status from the graph's execute, after
// check_support passed) with 65536 or more sequences in a call, or heads: PyTorch found the
// limit exact (batch 65535 runs, 65536 fails; H100, cuDNN 9.2) and routes such shapes
// elsewhere (pytorch/pytorch#181235, #180718). The CUDA backend gives cuDNN at most this many
// sequences a call (cudnn_group_sequences) and takes more heads to the fp32 kernel.
constexpr int64_t kCudnnMaxSequences = 65535;
// The sequences a micro-batch's B are asked about in one cuDNN call: min(B, the limit).
inline int64_t cudnn_batch(int64_t B) { return B < kCudnnMaxSequences ? B : kCudnnMaxSequences; }

// The multiple of sequences a group of fewer than all B must be, so that each group's softmax
// statistics (lse + b0 H T floats) start 16-byte aligned as the graphs declare them (cuDNN
// does not check it): 4 / gcd(H T, 4).
inline int64_t cudnn_group_multiple(int64_t H, int64_t T) {
  return 4 / std::gcd<int64_t>(H * T, 4);
}
// How many of a micro-batch's B sequences (T tokens, H query heads) go to cuDNN in one call:
// all B where need(B) <= free_bytes and B is within kCudnnMaxSequences; else the largest of
// B's halvings (and halvings again) that is, then cut down to cudnn_group_multiple. 0 when
// even that leaves none. need(n): the scratch bytes n sequences take; free_bytes: the scratch
// arena's free bytes.
template <typename Need>
int64_t cudnn_group_sequences(int64_t B, int64_t T, int64_t H, std::size_t free_bytes,
                              Need&& need) {
  int64_t g = cudnn_batch(B);
  while (g > 1 && need(g) > free_bytes) g = (g + 1) / 2;
  if (g < B) g -= g % cudnn_group_multiple(H, T);
  return g;
}

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
