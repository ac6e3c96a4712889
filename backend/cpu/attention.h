// Causal grouped-query attention on the CPU, memory-efficient (FlashAttention-2 style): scores
// are formed one (query tile x key tile) block at a time, so memory never grows with T x T.
#pragma once
#include <cstdint>

namespace mx::cpu {

// q, out: [B, T, H, D]; k, v: [B, T, KV, D] (row-major, contiguous); lse: [B, H, T].
// Causal: query t attends keys 0..t. Scale 1/sqrt(D). H % KV == 0; query head h uses kv head
// h / (H/KV). lse[b,h,t] = log(sum_j exp(scale * q.k_j)) over allowed j (natural log).
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

// dq, dk, dv are WRITTEN (not accumulated), same shapes as q, k, v. Recomputes probabilities
// from q, k and lse (never stores T x T).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D);

}  // namespace mx::cpu
