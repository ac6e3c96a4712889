// Causal grouped-query attention in fp32: a FlashAttention-2 style kernel of our own, written for
// correctness and readability first (no tensor cores yet; see docs/cuda.md).
//
// Layout (backend.h): q, out [B, T, H, D]; k, v [B, T, KV, D]; lse [B, H, T]. Query head h reads
// kv head h / (H / KV). Scores are scaled by 1/sqrt(D); lse = max + log(sum exp) of the scaled
// scores, natural log, as the CPU backend writes it.
//
// Work split, forward: one thread block per (32-query tile, head, batch), 4 warps, each warp
// owns 8 query rows. Keys come in tiles of 32 through shared memory; lane j of a warp scores key
// j of the tile against the warp's row, so a row's max and sum are warp shuffles, and the output
// accumulator of a row is spread over the lanes by head dimension (lane owns d = lane + 32 c).
// Backward recomputes P = exp(S - lse) (never stored) in two kernels: dq per query tile
// (loops over key tiles), dk/dv per key tile (loops over the heads of its group and the query
// tiles at or after it). No atomics: results are deterministic.
#include <cmath>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.cuh"
#include "numerics/attention_fp8.h"
#include "numerics/quantize.h"

namespace mx::cuda {
int64_t max_grid_yz() {
  static const int64_t limit = [] {
    const char* v = std::getenv("MXTRAIN_TEST_GRID_YZ");
    const long n = v ? std::strtol(v, nullptr, 10) : 0;
    return n >= 1 && n < 65535 ? int64_t(n) : int64_t(65535);
  }();
  return limit;
}

namespace {

constexpr int kTile = 32;        // queries per query tile = keys per key tile = warp size
constexpr int kWarps = 4;        // warps per block
constexpr int kRowsPerWarp = kTile / kWarps;
// Head dimension per lane: lane owns d = lane + 32 c, c < kPerLane. One instantiation only
// (compile time on CI): D <= 128 covers Llama's 64 and 128.
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// acc[c] += sum over j < count of x_j rows[j * stride + 32 c + lane], x_j being lane j's x: a
// P V-style product whose row weights are spread one to a lane. One shuffle a row serves all
// of the lane's K columns; each column's sum runs in j order. count is uniform in the warp.
template <int K>
__device__ __forceinline__ void accumulate_rows(float (&acc)[K], float x,
                                                const float* __restrict__ rows, int64_t stride,
                                                int count, int D, int lane) {
  #pragma unroll 4  // not 32: compile time; 4 keeps a few loads in flight
  for (int j = 0; j < count; ++j) {
    const float xj = __shfl_sync(kFull, x, j);
#pragma unroll
    for (int c = 0; c < K; ++c) {
      const int d = c * 32 + lane;
      if (d < D) acc[c] += xj * rows[j * stride + d];
    }
  }
}

// dot(a[0..D), b[0..D)) by one thread.
__device__ inline float dot_row(const float* a, const float* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// FP8 attention (AttnFp8Kernel): x as the FP8 value of format f at encode scale `scale` (a
// power of two) stands for, the bits numerics::attn_fp8_round gives on the host.
__device__ inline float fp8_round(float x, float scale, numerics::Format f) {
  return numerics::decode_fp8_elem(numerics::encode_fp8_elem(x * scale, f, false, 0u), f) / scale;
}
__device__ inline float fp8_slot(const float* slots, numerics::AttnFp8Slot s) {
  return slots[s * numerics::kAttnFp8SlotFloats];
}
// amax = max(amax, x) for x >= 0 (a warp's values folded first, one atomic a warp).
__device__ inline void warp_atomic_max(float* amax, float x) {
  x = warp_max(x);
  if (threadIdx.x % 32 == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(x));
}

// Copies rows [t0, t0 + kTile) of one head of a [B, T, heads, D] tensor into smem rows of
// stride `ld` (zeros past T).
__device__ inline void load_tile(float* dst, int ld, const float* src, int64_t b, int64_t t0,
                                 int64_t T, int64_t heads, int64_t head, int D) {
  for (int idx = threadIdx.x; idx < kTile * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    const int64_t t = t0 + r;
    dst[r * ld + d] = t < T ? src[((b * T + t) * heads + head) * D + d] : 0.0f;
  }
}

// ---- forward ----------------------------------------------------------------------------------
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32)
flash_forward_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ q,
                     const float* __restrict__ k, const float* __restrict__ v, int64_t T,
                     int64_t H, int64_t KV, int D, float scale, int64_t h0, int64_t b0,
                     AttnFp8Kernel fp8) {
  extern __shared__ float smem[];
  float* Qs = smem;                       // [kTile][D]      rows read whole by one warp
  float* Ks = Qs + kTile * D;             // [kTile][D + 1]  lane j reads row j: padded
  float* Vs = Ks + kTile * (D + 1);       // [kTile][D]      lane reads column d
  const int64_t b = b0 + blockIdx.z, h = h0 + blockIdx.y, i0 = int64_t(blockIdx.x) * kTile;
  const int64_t kvh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile(Qs, D, q, b, i0, T, H, h, D);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[rr][c] = 0.0f;
  }
  const int64_t i_last = min(T, i0 + kTile) - 1;  // the tile's last query: keys up to it
  // FP8: P8 = the normalized probabilities rounded, which needs the row's lse first: a first
  // pass for the row max and sum only, a second for P8 V (m then holds lse, l 1).
  const bool rounded = fp8.slots != nullptr;
  const float prob_scale = rounded ? fp8_slot(fp8.slots, numerics::kAttnScaleS) : 0.0f;
  float pmax = 0.0f;
  for (int pass = 0; pass < (rounded ? 2 : 1); ++pass) {
    const bool stats_only = rounded && pass == 0, second = pass == 1;
    if (second)
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) m[rr] += logf(l[rr]), l[rr] = 1.0f;
    for (int64_t j0 = 0; j0 <= i_last; j0 += kTile) {
      __syncthreads();
      load_tile(Ks, D + 1, k, b, j0, T, KV, kvh, D);
      if (!stats_only) load_tile(Vs, D, v, b, j0, T, KV, kvh, D);
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const int r = warp * kRowsPerWarp + rr;
        const int64_t i = i0 + r, j = j0 + lane;
        if (i >= T || j0 > i) continue;  // uniform across the warp
        const float s =
            j <= i ? dot_row(Qs + r * D, Ks + lane * (D + 1), D) * scale : -INFINITY;
        float p, alpha = 1.0f;
        if (second) {  // P8 from the final lse
          p = j <= i ? expf(s - m[rr]) : 0.0f;
          pmax = fmaxf(pmax, p);
          p = fp8_round(p, prob_scale, numerics::Format::kE4M3);
        } else {
          const float m_new = fmaxf(m[rr], warp_max(s));  // finite: key j0 <= i is in the tile
          p = j <= i ? expf(s - m_new) : 0.0f;
          alpha = expf(m[rr] - m_new);                    // 0 on the first tile (m = -inf)
          l[rr] = l[rr] * alpha + warp_sum(p);
          m[rr] = m_new;
          if (stats_only) continue;
        }
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) acc[rr][c] *= alpha;
        accumulate_rows(acc[rr], p, Vs, D, kTile, D, lane);
      }
    }
  }
  if (rounded && fp8.amax) warp_atomic_max(fp8.amax, pmax);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= T) continue;
    const float inv_l = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) out[((b * T + i) * H + h) * D + d] = acc[rr][c] * inv_l;
    }
    if (lane == 0) lse[(b * H + h) * T + i] = m[rr] + logf(l[rr]);
  }
}

// ---- backward -----------------------------------------------------------------------------------
// delta[b, h, i] = sum_d dout * out (the row term of the softmax backward).
__global__ void row_dot_kernel(float* __restrict__ delta, const float* __restrict__ dout,
                               const float* __restrict__ out, int64_t B, int64_t T, int64_t H,
                               int D) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (b, i, h)
  const int lane = threadIdx.x % 32;
  if (row >= B * T * H) return;
  float s = 0.0f;
  for (int d = lane; d < D; d += 32) s += dout[row * D + d] * out[row * D + d];
  s = warp_sum(s);
  const int64_t h = row % H, bt = row / H, i = bt % T, b = bt / T;
  if (lane == 0) delta[(b * H + h) * T + i] = s;
}

// dq for one (query tile, head, batch): dq_i = scale * sum_j P_ij (dP_ij - delta_i) k_j.
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32)
flash_backward_dq_kernel(float* __restrict__ dq, const float* __restrict__ dout,
                         const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ delta, int64_t T, int64_t H, int64_t KV, int D,
                         float scale, int64_t h0, int64_t b0, AttnFp8Kernel fp8) {
  extern __shared__ float smem[];
  float* Qs = smem;                   // [kTile][D]
  float* dOs = Qs + kTile * D;        // [kTile][D]
  float* Ks = dOs + kTile * D;        // [kTile][D + 1]
  float* Vs = Ks + kTile * (D + 1);   // [kTile][D + 1]
  const int64_t b = b0 + blockIdx.z, h = h0 + blockIdx.y, i0 = int64_t(blockIdx.x) * kTile;
  const int64_t kvh = h / (H / KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile(Qs, D, q, b, i0, T, H, h, D);
  load_tile(dOs, D, dout, b, i0, T, H, h, D);
  float acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[rr][c] = 0.0f;
  const int64_t i_last = min(T, i0 + kTile) - 1;
  const float ds_scale = fp8.slots ? fp8_slot(fp8.slots, numerics::kAttnScaleDP) : 0.0f;
  float ds_max = 0.0f;
  for (int64_t j0 = 0; j0 <= i_last; j0 += kTile) {
    __syncthreads();
    load_tile(Ks, D + 1, k, b, j0, T, KV, kvh, D);
    load_tile(Vs, D + 1, v, b, j0, T, KV, kvh, D);
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr;
      const int64_t i = i0 + r, j = j0 + lane;
      if (i >= T || j0 > i) continue;
      const float row_lse = lse[(b * H + h) * T + i], row_delta = delta[(b * H + h) * T + i];
      float ds = 0.0f;
      if (j <= i) {
        const float p = expf(dot_row(Qs + r * D, Ks + lane * (D + 1), D) * scale - row_lse);
        const float dp = dot_row(dOs + r * D, Vs + lane * (D + 1), D);
        ds = p * (dp - row_delta);
        if (fp8.slots) {  // dS rounded before its GEMMs (FP8)
          ds_max = fmaxf(ds_max, fabsf(ds));
          ds = fp8_round(ds, ds_scale, numerics::Format::kE5M2);
        }
      }
      accumulate_rows(acc[rr], ds, Ks, D + 1, kTile, D, lane);
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= T) continue;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) dq[((b * T + i) * H + h) * D + d] = acc[rr][c] * scale;
    }
  }
  if (fp8.slots && fp8.amax) warp_atomic_max(fp8.amax, ds_max);
}

// dk, dv for one (key tile, kv head, batch), summed over the query heads of the group and the
// query tiles at or after the key tile: dv_j = sum_i P_ij dout_i; dk_j = scale sum_i dS_ij q_i.
template <int kPerLane>
__global__ void __launch_bounds__(kWarps * 32)
flash_backward_dkdv_kernel(float* __restrict__ dk, float* __restrict__ dv,
                           const float* __restrict__ dout, const float* __restrict__ q,
                           const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ lse, const float* __restrict__ delta,
                           int64_t T, int64_t H, int64_t KV, int D, float scale, int64_t h0,
                           int64_t b0, AttnFp8Kernel fp8) {
  extern __shared__ float smem[];
  float* Ks = smem;                   // [kTile][D]      one key row read whole by a warp
  float* Vs = Ks + kTile * D;         // [kTile][D]
  float* Qs = Vs + kTile * D;         // [kTile][D + 1]  lane i reads query row i: padded
  float* dOs = Qs + kTile * (D + 1);  // [kTile][D + 1]
  float* lse_s = dOs + kTile * (D + 1);
  float* delta_s = lse_s + kTile;
  const int64_t b = b0 + blockIdx.z, kvh = h0 + blockIdx.y, j0 = int64_t(blockIdx.x) * kTile;
  const int64_t group = H / KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float prob_scale = fp8.slots ? fp8_slot(fp8.slots, numerics::kAttnScaleS) : 0.0f;
  const float ds_scale = fp8.slots ? fp8_slot(fp8.slots, numerics::kAttnScaleDP) : 0.0f;
  load_tile(Ks, D, k, b, j0, T, KV, kvh, D);
  load_tile(Vs, D, v, b, j0, T, KV, kvh, D);
  float dk_acc[kRowsPerWarp][kPerLane], dv_acc[kRowsPerWarp][kPerLane];
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk)
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) dk_acc[kk][c] = dv_acc[kk][c] = 0.0f;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = j0; i0 < T; i0 += kTile) {  // query tiles at or after the key tile
      __syncthreads();
      load_tile(Qs, D + 1, q, b, i0, T, H, h, D);
      load_tile(dOs, D + 1, dout, b, i0, T, H, h, D);
      if (threadIdx.x < kTile) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < T ? lse[(b * H + h) * T + i] : 0.0f;
        delta_s[threadIdx.x] = i < T ? delta[(b * H + h) * T + i] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kRowsPerWarp; ++kk) {
        const int jl = warp * kRowsPerWarp + kk;
        const int64_t j = j0 + jl, i = i0 + lane;
        if (j >= T) continue;  // uniform across the warp
        float p = 0.0f, ds = 0.0f;
        if (i < T && i >= j) {
          p = expf(dot_row(Qs + lane * (D + 1), Ks + jl * D, D) * scale - lse_s[lane]);
          const float dp = dot_row(dOs + lane * (D + 1), Vs + jl * D, D);
          ds = p * (dp - delta_s[lane]);
          if (fp8.slots) {  // P as the forward's P V read it; dS as the dq kernel rounds it
            p = fp8_round(p, prob_scale, numerics::Format::kE4M3);
            ds = fp8_round(ds, ds_scale, numerics::Format::kE5M2);
          }
        }
        accumulate_rows(dv_acc[kk], p, dOs, D + 1, kTile, D, lane);
        accumulate_rows(dk_acc[kk], ds, Qs, D + 1, kTile, D, lane);
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kRowsPerWarp; ++kk) {
    const int64_t j = j0 + warp * kRowsPerWarp + kk;
    if (j >= T) continue;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      const int d = c * 32 + lane;
      if (d < D) {
        dk[((b * T + j) * KV + kvh) * D + d] = dk_acc[kk][c] * scale;
        dv[((b * T + j) * KV + kvh) * D + d] = dv_acc[kk][c];
      }
    }
  }
}

// ---- decode -----------------------------------------------------------------------------------
// One warp per query head; the query is at position T_ctx - 1, so every cached key is visible.
template <int kPerLane>
__global__ void decode_kernel(float* __restrict__ out, const float* __restrict__ q,
                              const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                              int64_t T_ctx, int64_t H, int64_t KV, int D, float scale) {
  const int64_t h = blockIdx.x, kvh = h / (H / KV);
  const int lane = threadIdx.x;
  const float* qh = q + h * D;
  float m = -INFINITY, l = 0.0f, acc[kPerLane];
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = 0.0f;
  for (int64_t t0 = 0; t0 < T_ctx; t0 += 32) {
    const int64_t t = t0 + lane;
    const float s = t < T_ctx ? dot_row(qh, k_cache + (t * KV + kvh) * D, D) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));
    const float p = t < T_ctx ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);
    l = l * alpha + warp_sum(p);
    m = m_new;
    const int n = T_ctx - t0 < 32 ? int(T_ctx - t0) : 32;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] *= alpha;
    accumulate_rows(acc, p, v_cache + (t0 * KV + kvh) * D, KV * D, n, D, lane);
  }
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int d = c * 32 + lane;
    if (d < D) out[h * D + d] = acc[c] / l;
  }
}

void check_shape(const char* op, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  MX_ASSERT(B >= 0 && T >= 0 && H > 0 && KV > 0 && H % KV == 0, op, ": B=", B, " T=", T,
            " H=", H, " KV=", KV);
  MX_REQUIRE(D > 0 && D <= kMaxHeadDim, op, ": head_dim ", D,
             " is not supported by the CUDA attention kernel (1..", kMaxHeadDim, ")");
}

// Dynamic shared memory beyond 48 KiB must be allowed per kernel first.
template <typename Kernel>
void launch_prepare(const char* op, Kernel kernel, size_t smem_bytes) {
  MX_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem_bytes)));
}

// Heads (grid y) and batch (z) beyond max_grid_yz() go in more launches, each kernel told its
// first head and batch (h0, b0). One launch at any real shape (65536 heads, or a micro-batch of
// 65536 sequences, made an invalid launch).
template <typename Launch>
void for_grid_chunks(int64_t heads, int64_t batch, Launch&& launch) {
  const int64_t m = max_grid_yz();
  for (int64_t b0 = 0; b0 < batch; b0 += m)
    for (int64_t h0 = 0; h0 < heads; h0 += m)
      launch(h0, std::min(m, heads - h0), b0, std::min(m, batch - b0));
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t s,
                       AttnFp8Kernel fp8) {
  check_shape("attention_forward", B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  const unsigned tiles = unsigned((T + kTile - 1) / kTile);
  const size_t smem = sizeof(float) * (kTile * D * 2 + kTile * (D + 1));
  const float scale = 1.0f / std::sqrt(float(D));
  launch_prepare("attention_forward", flash_forward_kernel<kPerLane>, smem);
  for_grid_chunks(H, B, [&](int64_t h0, int64_t nh, int64_t b0, int64_t nb) {
    flash_forward_kernel<kPerLane><<<dim3(tiles, unsigned(nh), unsigned(nb)), kWarps * 32, smem,
                                     s>>>(out, lse, q, k, v, T, H, KV, int(D), scale, h0, b0, fp8);
    MX_CUDA_LAUNCH_CHECK("attention_forward");
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        DeviceArena& scratch, cudaStream_t s, AttnFp8Kernel fp8) {
  check_shape("attention_backward", B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  DeviceArenaScope scope(scratch);
  float* delta = scratch.alloc_f32(B * H * T);
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t rows = B * T * H;
  row_dot_kernel<<<unsigned((rows + 7) / 8), 256, 0, s>>>(delta, dout, out, B, T, H, int(D));
  MX_CUDA_LAUNCH_CHECK("attention_backward (row dots)");

  const unsigned tiles = unsigned((T + kTile - 1) / kTile);
  const size_t smem_dq = sizeof(float) * (kTile * D * 2 + kTile * (D + 1) * 2);
  const size_t smem_dkdv = sizeof(float) * (kTile * D * 2 + kTile * (D + 1) * 2 + 2 * kTile);
  const int d = int(D);
  launch_prepare("attention_backward", flash_backward_dq_kernel<kPerLane>, smem_dq);
  launch_prepare("attention_backward", flash_backward_dkdv_kernel<kPerLane>, smem_dkdv);
  for_grid_chunks(H, B, [&](int64_t h0, int64_t nh, int64_t b0, int64_t nb) {
    flash_backward_dq_kernel<kPerLane><<<dim3(tiles, unsigned(nh), unsigned(nb)), kWarps * 32,
                                         smem_dq, s>>>(dq, dout, q, k, v, lse, delta, T, H, KV,
                                                       d, scale, h0, b0, fp8);
    MX_CUDA_LAUNCH_CHECK("attention_backward (dq)");
  });
  for_grid_chunks(KV, B, [&](int64_t h0, int64_t nh, int64_t b0, int64_t nb) {
    flash_backward_dkdv_kernel<kPerLane><<<dim3(tiles, unsigned(nh), unsigned(nb)), kWarps * 32,
                                           smem_dkdv, s>>>(dk, dv, dout, q, k, v, lse, delta, T,
                                                           H, KV, d, scale, h0, b0, fp8);
    MX_CUDA_LAUNCH_CHECK("attention_backward (dk, dv)");
  });
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      int64_t T_ctx, int64_t H, int64_t KV, int64_t D, cudaStream_t s) {
  check_shape("attention_decode", 1, T_ctx, H, KV, D);
  MX_REQUIRE(T_ctx > 0, "attention_decode: empty KV cache");
  const float scale = 1.0f / std::sqrt(float(D));
  decode_kernel<kPerLane><<<unsigned(H), 32, 0, s>>>(out, q, k_cache, v_cache, T_ctx, H, KV,
                                                     int(D), scale);
  MX_CUDA_LAUNCH_CHECK("attention_decode");
}

}  // namespace mx::cuda
