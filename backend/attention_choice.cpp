#include "backend/attention_choice.h"

#include "core/error.h"

namespace mx {

CudaAttention parse_cuda_attention(const char* value) {
  if (!value || !*value) return CudaAttention::kCudnn;
  const std::string v = value;
  if (v == "cudnn") return CudaAttention::kCudnn;
  if (v == "fp32") return CudaAttention::kFp32;
  throw UserError(str("MXTRAIN_CUDA_ATTENTION must be cudnn or fp32 (got '", v, "')"));
}

const char* cuda_attention_name(CudaAttention a) {
  return a == CudaAttention::kCudnn ? "cudnn" : "fp32";
}

std::string cudnn_sdpa_shape_problem(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  if (B < 1 || T < 1 || H < 1 || KV < 1) return str("empty shape (B=", B, " T=", T, " H=", H,
                                                    " KV=", KV, ")");
  if (H % KV != 0) return str("query heads ", H, " not a multiple of kv heads ", KV);
  // Both limits are in cuDNN's support checks (frontend 1.32, sdpa_support_surface.h and the
  // backward node): head dims a multiple of 8, at most 256 (Hopper; 128 on other GPUs except
  // special pairs, left to check_support).
  if (D % 8 != 0) return str("head_dim ", D, " is not a multiple of 8");
  if (D > 256) return str("head_dim ", D, " is above 256");
  // The backward refuses s_q = s_kv = 1; one implementation per shape for both directions.
  if (T < 2) return "sequence length 1 (cuDNN's SDPA backward refuses s_q = s_kv = 1)";
  // (attention_choice.h, kCudnnMaxSequences: past these cuDNN's execute fails)
  if (H > kCudnnMaxSequences)
    return str(H, " heads (cuDNN's SDPA fails at run time past ", kCudnnMaxSequences, ")");
  if (B > kCudnnMaxSequences)
    return str(B, " sequences in one call (cuDNN's SDPA fails at run time past ",
               kCudnnMaxSequences, ")");
  return "";
}

TensorView4 bshd_view(int64_t B, int64_t T, int64_t heads, int64_t D) {
  return {{B, heads, T, D}, {T * heads * D, D, heads * D, 1}};
}

TensorView4 stats_view(int64_t B, int64_t H, int64_t T) {
  return {{B, H, T, 1}, {H * T, T, 1, 1}};
}

}  // namespace mx
