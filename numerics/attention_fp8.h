// FP8 attention's scales: per-tensor E4M3 for q, k, v, the probabilities and the output, E5M2
// for the gradients (Transformer Engine's HYBRID format), the graph cuDNN's fused FP8 SDPA runs
// (Graph::sdpa_fp8 / sdpa_fp8_backward). Every scale here is derived from tensors the caller can
// reduce before the fused kernel runs (q, k, v, and the output's gradient dO): the ones cuDNN
// needs for tensors that exist only inside the kernel (the probabilities P, their gradient dP,
// the outputs O, dQ, dK, dV) come from bounds on those tensors, so no amax history (and no
// checkpointed state) is needed. docs/numerics.md, "FP8 attention", derives each bound.
//
// Every scale is a power of two (numerics::fp8_scale_from_amax with pow2), so scaling and
// descaling are exact in fp32 and the CPU twin (backend/cpu/attention.cpp) and a GPU quantize at
// the same points with the same bytes. Inline and MX_HOST_DEVICE: the CUDA backend computes them
// on the device from device amaxes (no host round trip), the CPU twin on the host.
#pragma once
#include <cstdint>

#include "numerics/formats.h"
#include "numerics/quantize.h"

namespace mx::numerics {

inline constexpr float kAttnE4M3Max = 448.0f;
inline constexpr float kAttnE5M2Max = 57344.0f;
// P = softmax(...) lies in [0, 1] and, under the causal mask, query 0 sees key 0 alone, so
// amax(P) = 1 exactly: its encode scale is fp8_scale_from_amax(1, 448, pow2) = 256.
inline constexpr float kAttnProbScale = 256.0f;

// Encode scales (x * scale is encoded; decode multiplies by 1 / scale), forward.
struct AttnFp8ForwardScales {
  float q, k, v;  // current scaling: amax of each tensor (pow2)
  float s;        // the probabilities: kAttnProbScale
  float o;        // the output: v's scale / 2 (|O| <= 1.13 amax(v): headroom below 448)
};

MX_HOST_DEVICE inline AttnFp8ForwardScales attn_fp8_forward_scales(float amax_q, float amax_k,
                                                                   float amax_v) {
  AttnFp8ForwardScales s;
  s.q = fp8_scale_from_amax(amax_q, kAttnE4M3Max, 0.0f, true);
  s.k = fp8_scale_from_amax(amax_k, kAttnE4M3Max, 0.0f, true);
  s.v = fp8_scale_from_amax(amax_v, kAttnE4M3Max, 0.0f, true);
  s.s = kAttnProbScale;
  // O_i = sum_j P8_ij V8_j / (s.s s.v): a combination of V8's rows with weights summing to at
  // most about 1.1 (each P8 rounds up by at most 2^-4, a subnormal one by 2^-18 more), V8 at
  // most 448 (1 + 2^-4) / s.v: so |O| s.v / 2 < 280 < 448 (the scale is a power of two:
  // halving is exact).
  s.o = s.v * 0.5f;
  return s;
}

// Encode scales, backward. rows_per_key: the query rows that see one key, at most T x (H / KV)
// (the group's heads, every position): the bound on a column sum of P.
struct AttnFp8BackwardScales {
  float dO;  // current scaling of the output's gradient (E5M2)
  float dP;  // dS = P (dP - delta), the scores' gradient, before its two GEMMs (E5M2)
  float dQ, dK, dV;  // the outputs (E5M2)
};

// Bounds (each with a factor 2 for the rounding of the FP8 operands it is made of):
//   |dP_ij| = |dO_i . V_j| <= D amax(dO) amax(v), |delta_i| likewise, so
//   |dS_ij| <= P_ij 2 D amax(dO) amax(v) =: P_ij bS;          scale dP from 2 bS
//   |dQ_i| <= attn_scale sum_j |dS_ij| amax(k) <= attn_scale bS amax(k)        (sum_j P_ij = 1)
//   |dK_j| <= attn_scale sum_i |dS_ij| amax(q) <= attn_scale bS amax(q) rows_per_key
//   |dV_j| <= sum_i P_ij amax(dO) <= rows_per_key amax(dO)
MX_HOST_DEVICE inline AttnFp8BackwardScales attn_fp8_backward_scales(
    float amax_q, float amax_k, float amax_v, float amax_do, int64_t D, int64_t rows_per_key,
    float attn_scale) {
  AttnFp8BackwardScales s;
  s.dO = fp8_scale_from_amax(amax_do, kAttnE5M2Max, 0.0f, true);
  const float bS = 2.0f * float(D) * amax_do * amax_v;
  const float rows = float(rows_per_key);
  s.dP = fp8_scale_from_amax(2.0f * bS, kAttnE5M2Max, 0.0f, true);
  s.dQ = fp8_scale_from_amax(2.0f * attn_scale * bS * amax_k, kAttnE5M2Max, 0.0f, true);
  s.dK = fp8_scale_from_amax(2.0f * attn_scale * bS * amax_q * rows, kAttnE5M2Max, 0.0f, true);
  s.dV = fp8_scale_from_amax(2.0f * rows * amax_do, kAttnE5M2Max, 0.0f, true);
  return s;
}

// Numerics telemetry of FP8 attention: the amax of each tensor it encodes, taken before the
// encoding (for P, O, dS, dQ, dK, dV: inside the computation, where the bounds above must hold).
// Its headroom is the format's largest value over amax x scale: below 1 the encoding saturated.
struct AttnFp8Amax {
  float q = 0, k = 0, v = 0, p = 0, o = 0;  // forward
  float dO = 0, dS = 0, dQ = 0, dK = 0, dV = 0;  // backward
};

// The scales as one device array for the fused kernel (CUDA backend): slot i at floats
// [4 i, 4 i + 4) (16 bytes apart: cuDNN's execute() checks each tensor's pointer against the
// 16-byte alignment its graph declares), each encode scale beside its decode scale (1 / scale).
enum AttnFp8Slot : int {
  kAttnScaleQ, kAttnScaleK, kAttnScaleV, kAttnScaleS, kAttnScaleO,  // encode, forward
  kAttnDescaleQ, kAttnDescaleK, kAttnDescaleV, kAttnDescaleS, kAttnDescaleO,
  kAttnScaleDO, kAttnScaleDP, kAttnScaleDQ, kAttnScaleDK, kAttnScaleDV,  // encode, backward
  kAttnDescaleDO, kAttnDescaleDP, kAttnDescaleDQ, kAttnDescaleDK, kAttnDescaleDV,
  // cuDNN's FP8 backward encodes attn_scale dS, not dS (the frontend's sdpa_fp8_bwd.h scales
  // dP by the attention scale before its amax and scale_dP): its encode scale is dP's over
  // attn_scale, so that its codes are those of dS times dP's scale, as the CPU twin rounds
  // (up to the fp32 rounding of the two products), and its decode scale the reciprocal
  kAttnCudnnScaleDP, kAttnCudnnDescaleDP,
  kAttnFp8Slots
};
inline constexpr int kAttnFp8SlotFloats = 4;

// Every slot from the four amaxes (amax_do 0 for a forward: its backward slots are then unit
// scales, unused). out: kAttnFp8Slots * kAttnFp8SlotFloats floats; only each slot's first float
// is written.
MX_HOST_DEVICE inline void attn_fp8_scale_slots(float* out, float amax_q, float amax_k,
                                                float amax_v, float amax_do, int64_t D,
                                                int64_t rows_per_key, float attn_scale) {
  const AttnFp8ForwardScales f = attn_fp8_forward_scales(amax_q, amax_k, amax_v);
  const AttnFp8BackwardScales b =
      attn_fp8_backward_scales(amax_q, amax_k, amax_v, amax_do, D, rows_per_key, attn_scale);
  const float enc[] = {f.q, f.k, f.v, f.s, f.o};
  const float benc[] = {b.dO, b.dP, b.dQ, b.dK, b.dV};
  for (int i = 0; i < 5; ++i) {
    out[(kAttnScaleQ + i) * kAttnFp8SlotFloats] = enc[i];
    out[(kAttnDescaleQ + i) * kAttnFp8SlotFloats] = 1.0f / enc[i];
    out[(kAttnScaleDO + i) * kAttnFp8SlotFloats] = benc[i];
    out[(kAttnDescaleDO + i) * kAttnFp8SlotFloats] = 1.0f / benc[i];
  }
  const float cudnn_dp = b.dP / attn_scale;
  out[kAttnCudnnScaleDP * kAttnFp8SlotFloats] = cudnn_dp;
  out[kAttnCudnnDescaleDP * kAttnFp8SlotFloats] = 1.0f / cudnn_dp;
}

// One FP8 value with an encode scale, decoded back (what a GEMM on the codes reads): the code of
// x * scale (RNE, SATFINITE) times 1 / scale (exact: scale is a power of two). Host only (the
// CPU twin and tests): numerics::rne_satfinite_value, the codecs' value form.
inline float attn_fp8_round(float x, float scale, bool e5m2) {
  return rne_satfinite_value(x * scale, e5m2 ? Format::kE5M2 : Format::kE4M3) / scale;
}

}  // namespace mx::numerics
