// Causal grouped-query attention on the CPU, memory-efficient (FlashAttention-2 style): scores
// are formed one (query tile x key tile) block at a time, so memory never grows with T x T.
#pragma once
#include <cstdint>

#include "numerics/attention_fp8.h"

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

// FP8 attention (the CPU twin of cuDNN's fused FP8 SDPA; numerics/attention_fp8.h, docs/
// numerics.md "FP8 attention"): q, k, v rounded to E4M3 at their current (pow2) scales, the
// scores and softmax in fp32 from those, P rounded to E4M3 (scale 256) for P V, the output
// rounded to E4M3 at v's scale / 2; out receives the output's values (each an E4M3 code times
// its decode scale), lse the statistics of the rounded q, k. Same shapes as attention_forward.
// amax (optional): receives q, k, v, p, o (the amaxes before encoding; numerics::AttnFp8Amax).
void attention_forward_fp8(float* out, float* lse, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, numerics::AttnFp8Amax* amax = nullptr);
// Its backward: q, k, v, out rounded as in the forward (out, the forward's output, is unchanged
// by it), dout to E5M2 at its current scale; dV from P rounded as in the forward; dS = P (dP -
// delta) rounded to E5M2 before dQ's and dK's products; dq, dk, dv written as E5M2 values at the
// bound-derived scales (numerics::attn_fp8_backward_scales).
// amax (optional): receives dO, dS, dQ, dK, dV (and q, k, v).
void attention_backward_fp8(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                            numerics::AttnFp8Amax* amax = nullptr);

}  // namespace mx::cpu
