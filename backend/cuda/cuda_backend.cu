// The CUDA backend: elementwise and row kernels written out here, GEMMs through cuBLASLt
// (gemm.cu), attention in attention.cu. Each kernel mirrors the CPU backend's loop it replaces
// (backend/cpu/cpu_backend.cpp), with sums as accurate as the CPU's (compensated float per
// thread where the CPU sums in double, double across threads: KahanSum), so the op check can
// hold them to tight tolerances.
#include "backend/cuda/cuda_backend.h"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <array>
#include <numeric>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#ifdef MXTRAIN_HAVE_CUDNN
#include "backend/cuda/cudnn_attention.h"
#endif
#include "backend/cuda/device_arena.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/nccl_communicator.h"
#include "backend/cuda/quantize_kernels.h"
#include "backend/cuda/swiglu_math.cuh"
#include "numerics/attention_fp8.h"
#include "core/log.h"
#include "numerics/block_scale_layout.h"

namespace mx {
namespace {

constexpr int kThreads = 256;
// rmsnorm_backward's one-pass kernel: at most 512 blocks (each over rows b, b + blocks, ...),
// fewer where C is wide, so that dw's double partials (blocks x C) stay within 8 MiB of scratch
// (512 blocks at C = 2048, 128 at 8192; the two-kernel form took 64 x C).
constexpr int64_t kRmsnormBackwardBlocks = 512;
constexpr int64_t kRmsnormPartialBytes = int64_t(8) << 20;
constexpr unsigned kFull = 0xFFFFFFFFu;

unsigned grid_1d(int64_t n) {  // grid-stride loops: enough blocks to fill any GPU, capped
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

// Compensated (Kahan) float summation for the per-element loops of the row and norm kernels:
// error about one float ulp of the sum whatever the length, like the CPU backend's double sums,
// but without an FP64 operation per element: a B300 runs FP64 at about 1.3 TFLOP/s, 1/60 of its
// FP32 rate, where a double per element made the norms and the cross-entropy compute-bound.
// Only the per-thread results go on in double (block_sum). nvcc keeps float addition order
// (no fast-math), which the compensation relies on.
struct KahanSum {
  float s = 0.0f, c = 0.0f;  // running sum, and the low-order part it lost (negated)
  __device__ void add(float x) {
    const float y = x - c;
    const float t = s + y;
    c = (t - s) - y;
    s = t;
  }
  __device__ double value() const { return double(s) - double(c); }
};

#define MX_GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Block-wide sum of a double (blockDim.x a multiple of 32, at most 1024); result in thread 0.
__device__ double block_sum(double x) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

__device__ float block_max(float x) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : -INFINITY;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}

// ---- rmsnorm ----------------------------------------------------------------------------------
// One output element: fp32, or the bf16 path's RNE code (numerics::encode_bf16) of that value.
__device__ __forceinline__ void store_out(float* y, int64_t i, float v) { y[i] = v; }
__device__ __forceinline__ void store_out(uint16_t* y, int64_t i, float v) {
  y[i] = numerics::encode_bf16(v, numerics::Saturation::kNoSat);
}

// Four bf16 codes (one 8-byte load) widened, and four values as RNE codes (one 8-byte store):
// little-endian, the first element in the low half of the first word.
__device__ __forceinline__ float4 bf16x4(uint2 p) {
  return make_float4(numerics::decode_bf16(uint16_t(p.x & 0xFFFFu)),
                     numerics::decode_bf16(uint16_t(p.x >> 16)),
                     numerics::decode_bf16(uint16_t(p.y & 0xFFFFu)),
                     numerics::decode_bf16(uint16_t(p.y >> 16)));
}
__device__ __forceinline__ uint2 bf16x4_codes(float a, float b, float c, float d) {
  auto e = [](float v) { return uint32_t(numerics::encode_bf16(v, numerics::Saturation::kNoSat)); };
  return make_uint2(e(a) | e(b) << 16, e(c) | e(d) << 16);  // little-endian: a first
}
bool all_aligned(size_t bytes, std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % bytes != 0) return false;
  return true;
}
bool all_16_aligned(std::initializer_list<const void*> ptrs) { return all_aligned(16, ptrs); }

// Four outputs at 4-aligned i: one 16-byte fp32 store or one 8-byte store of bf16 codes.
__device__ __forceinline__ void store_out4(float* y, int64_t i, float4 v) {
  *reinterpret_cast<float4*>(y + i) = v;
}
__device__ __forceinline__ void store_out4(uint16_t* y, int64_t i, float4 v) {
  *reinterpret_cast<uint2*>(y + i) = bf16x4_codes(v.x, v.y, v.z, v.w);
}
__device__ __forceinline__ float4 ld4(const float* p, int64_t i) {
  return *reinterpret_cast<const float4*>(p + i);
}

// The row kernels below: vec (C a multiple of 4, every pointer 16-byte aligned) reads and
// writes four elements a thread an iteration (4-byte accesses ran them at about a third of the
// H200's bandwidth); else one by one. The same per-element math either way; each thread's
// Kahan sum takes its elements in a different order, as the block's sum already does.

// y fp32 (rmsnorm_forward) or bf16 codes (rmsnorm_forward_bf16): the same fp32 math either way.
// amax (bf16 codes only, unless null; the launch zeroed it): max |y| over the codes' values,
// NaN skipped (numerics::amax_fold), one atomic max a block on the bits (non-negative floats
// order as unsigned ints, +inf included): what abs_max of the codes would give, without
// reading them back.
template <typename Out>
__global__ void rmsnorm_forward_kernel(Out* __restrict__ y, float* __restrict__ rstd,
                                       const float* __restrict__ x, const float* __restrict__ w,
                                       int64_t C, float eps, bool vec, float* amax) {
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  const int64_t c4 = vec ? C : 0;  // elements [0, c4) four at a time
  KahanSum acc;
  for (int64_t c = 4 * int64_t(threadIdx.x); c < c4; c += 4 * int64_t(blockDim.x)) {
    const float4 v = ld4(xr, c);
    acc.add(v.x * v.x), acc.add(v.y * v.y), acc.add(v.z * v.z), acc.add(v.w * v.w);
  }
  for (int64_t c = c4 + threadIdx.x; c < C; c += blockDim.x) acc.add(xr[c] * xr[c]);
  const double ss = block_sum(acc.value());
  __shared__ float r_shared;
  if (threadIdx.x == 0) {
    r_shared = float(1.0 / sqrt(ss / double(C) + double(eps)));
    rstd[n] = r_shared;
  }
  __syncthreads();
  const float r = r_shared;
  float m = 0.0f;  // (amax's)
  for (int64_t c = 4 * int64_t(threadIdx.x); c < c4; c += 4 * int64_t(blockDim.x)) {
    const float4 v = ld4(xr, c), wv = ld4(w, c);
    const float4 o = make_float4(v.x * r * wv.x, v.y * r * wv.y, v.z * r * wv.z, v.w * r * wv.w);
    if constexpr (std::is_same_v<Out, uint16_t>) {
      const uint2 codes = bf16x4_codes(o.x, o.y, o.z, o.w);
      *reinterpret_cast<uint2*>(y + n * C + c) = codes;
      if (amax) {
        const float4 k = bf16x4(codes);
        m = numerics::amax_fold(numerics::amax_fold(m, k.x), k.y);
        m = numerics::amax_fold(numerics::amax_fold(m, k.z), k.w);
      }
    } else {
      store_out4(y, n * C + c, o);
    }
  }
  for (int64_t c = c4 + threadIdx.x; c < C; c += blockDim.x) {
    store_out(y, n * C + c, xr[c] * r * w[c]);
    if constexpr (std::is_same_v<Out, uint16_t>)
      if (amax) m = numerics::amax_fold(m, numerics::decode_bf16(y[n * C + c]));
  }
  if constexpr (std::is_same_v<Out, uint16_t>) {
    if (amax) {
      m = block_max(m);
      if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
    }
  }
}

// dx += r w dy - x r^3 / C * sum(dy w x), one block per row.
__global__ void rmsnorm_backward_dx_kernel(float* __restrict__ dx, const float* __restrict__ dy,
                                           const float* __restrict__ x,
                                           const float* __restrict__ w,
                                           const float* __restrict__ rstd, int64_t C, bool vec) {
  const int64_t n = blockIdx.x;
  const float* xr = x + n * C;
  const float* dyr = dy + n * C;
  const int64_t c4 = vec ? C : 0;
  KahanSum acc;
  for (int64_t c = 4 * int64_t(threadIdx.x); c < c4; c += 4 * int64_t(blockDim.x)) {
    const float4 d = ld4(dyr, c), wv = ld4(w, c), v = ld4(xr, c);
    acc.add(d.x * wv.x * v.x), acc.add(d.y * wv.y * v.y), acc.add(d.z * wv.z * v.z),
        acc.add(d.w * wv.w * v.w);
  }
  for (int64_t c = c4 + threadIdx.x; c < C; c += blockDim.x) acc.add(dyr[c] * w[c] * xr[c]);
  const double dot = block_sum(acc.value());
  __shared__ float k_shared;
  const float r = rstd[n];
  if (threadIdx.x == 0) k_shared = float(dot * double(r) * r * r / double(C));
  __syncthreads();
  const float k = k_shared;
  for (int64_t c = 4 * int64_t(threadIdx.x); c < c4; c += 4 * int64_t(blockDim.x)) {
    const float4 d = ld4(dyr, c), wv = ld4(w, c), v = ld4(xr, c);
    float4 o = ld4(dx + n * C, c);
    o.x += r * wv.x * d.x - v.x * k, o.y += r * wv.y * d.y - v.y * k,
        o.z += r * wv.z * d.z - v.z * k, o.w += r * wv.w * d.w - v.w * k;
    store_out4(dx, n * C + c, o);
  }
  for (int64_t c = c4 + threadIdx.x; c < C; c += blockDim.x) dx[n * C + c] += r * w[c] * dyr[c] - xr[c] * k;
}

// dx and dw's partials in one pass over dy and x (vec rows, C <= 4 K blockDim.x): block b takes
// rows b, b + gridDim.x, ...; thread t holds columns 4 (t + k blockDim.x) .. + 3, k < K, of
// the row in registers for both of dx's passes, and those columns' dw sums (dy x r,
// compensated) over its rows, written to part[b, c] in double. The separate kernels read dy
// and x once more for dw (a third of the op's traffic).
// A row costs one trip to memory and one barrier: dx's old values and rstd are loaded with dy
// and x (the sum does not need them), and the row's sum is the warps' partial sums, which
// every thread adds up itself in warp order after the one barrier (block_sum's three barriers
// and its second, serial shuffle, then a broadcast, left the H200 waiting on latency at about
// 1.8 TB/s). The partials alternate between two arrays: a warp writing row i + 2's may not
// overwrite row i's before every thread has read them, and row i + 1's barrier orders that.
// Threads and MinBlocks bound the registers: K = 2 (C = 2048) in at most 80, three 256-thread
// blocks a multiprocessor as before dx was held too (unbounded, ptxas took 84, room for two);
// K = 4 in at most 128 (two blocks of 256, one of 512).
// Codes: dx16 also gets the updated dx's bf16 codes (rmsnorm_backward_bf16), a second store of
// what the thread holds (8 bytes a float4).
template <int K, int Threads, int MinBlocks, bool Codes = false>
__global__ void __launch_bounds__(Threads, MinBlocks)
    rmsnorm_backward_fused_kernel(float* __restrict__ dx, double* __restrict__ part,
                                  const float* __restrict__ dy, const float* __restrict__ x,
                                  const float* __restrict__ w, const float* __restrict__ rstd,
                                  int64_t N, int64_t C, uint16_t* __restrict__ dx16,
                                  float* amax) {
  float4 wv[K] = {};
  KahanSum dw_acc[K][4];
  for (int k = 0; k < K; ++k) {
    const int64_t c = 4 * (int64_t(threadIdx.x) + int64_t(k) * blockDim.x);
    if (c < C) wv[k] = ld4(w, c);
  }
  __shared__ double partial[2][32];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int warps = int(blockDim.x / 32);
  int parity = 0;
  float m = 0.0f;  // (amax's: max |dx| of the updated values, NaN skipped)
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x, parity ^= 1) {
    float4 d[K] = {}, v[K] = {}, o[K] = {};
    const float r = rstd[n];
    for (int k = 0; k < K; ++k) {
      const int64_t c = 4 * (int64_t(threadIdx.x) + int64_t(k) * blockDim.x);
      if (c >= C) continue;
      d[k] = ld4(dy + n * C, c), v[k] = ld4(x + n * C, c), o[k] = ld4(dx + n * C, c);
    }
    KahanSum acc;
    for (int k = 0; k < K; ++k)
      acc.add(d[k].x * wv[k].x * v[k].x), acc.add(d[k].y * wv[k].y * v[k].y),
          acc.add(d[k].z * wv[k].z * v[k].z), acc.add(d[k].w * wv[k].w * v[k].w);
    double s = acc.value();
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFull, s, off);
    if (lane == 0) partial[parity][warp] = s;
    __syncthreads();
    double dot = 0.0;
    for (int i = 0; i < warps; ++i) dot += partial[parity][i];
    const float kk = float(dot * double(r) * r * r / double(C));
    for (int k = 0; k < K; ++k) {
      const int64_t c = 4 * (int64_t(threadIdx.x) + int64_t(k) * blockDim.x);
      if (c >= C) continue;
      o[k].x += r * wv[k].x * d[k].x - v[k].x * kk, o[k].y += r * wv[k].y * d[k].y - v[k].y * kk,
          o[k].z += r * wv[k].z * d[k].z - v[k].z * kk,
          o[k].w += r * wv[k].w * d[k].w - v[k].w * kk;
      store_out4(dx, n * C + c, o[k]);
      if constexpr (Codes) store_out4(dx16, n * C + c, o[k]);
      if (amax) {
        m = numerics::amax_fold(numerics::amax_fold(m, o[k].x), o[k].y);
        m = numerics::amax_fold(numerics::amax_fold(m, o[k].z), o[k].w);
      }
      dw_acc[k][0].add(d[k].x * v[k].x * r), dw_acc[k][1].add(d[k].y * v[k].y * r),
          dw_acc[k][2].add(d[k].z * v[k].z * r), dw_acc[k][3].add(d[k].w * v[k].w * r);
    }
  }
  for (int k = 0; k < K; ++k) {
    const int64_t c = 4 * (int64_t(threadIdx.x) + int64_t(k) * blockDim.x);
    if (c >= C) continue;
    for (int j = 0; j < 4; ++j) part[blockIdx.x * C + c + j] = dw_acc[k][j].value();
  }
  if (amax) {  // (the launch zeroed it; one atomic max a block on the bits)
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
  }
}

// dw partials: part[s, c] = sum over rows n = s, s + splits, ... of dy x r (compensated float,
// stored in double).
__global__ void rmsnorm_backward_dw_partial_kernel(double* __restrict__ part,
                                                   const float* __restrict__ dy,
                                                   const float* __restrict__ x,
                                                   const float* __restrict__ rstd, int64_t N,
                                                   int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t split = blockIdx.y, splits = gridDim.y;
  if (c >= C) return;
  KahanSum acc;
  for (int64_t n = split; n < N; n += splits) acc.add(dy[n * C + c] * x[n * C + c] * rstd[n]);
  part[split * C + c] = acc.value();
}

__global__ void rmsnorm_backward_dw_reduce_kernel(float* __restrict__ dw,
                                                  const double* __restrict__ part, int64_t splits,
                                                  int64_t C) {
  MX_GRID_STRIDE(c, C) {
    double s = 0;
    for (int64_t k = 0; k < splits; ++k) s += part[k * C + c];
    dw[c] += float(s);
  }
}

// ---- rope -------------------------------------------------------------------------------------
// y = rope(x): in place (y == x, fp32: rope_forward / rope_backward) or into bf16 codes from an
// unchanged fp32 x (rope_forward_bf16). Each thread reads its pair before writing it, so y may
// alias x (hence no __restrict__ on either).
// rope_backward_bf16 reads and writes codes, in place (x == y, uint16_t).
__device__ __forceinline__ float load_in(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float4 load_in4(const float* x, int64_t j) {  // elements 4j..4j+3
  return reinterpret_cast<const float4*>(x)[j];
}
__device__ __forceinline__ float4 load_in4(const uint16_t* x, int64_t j) {
  return bf16x4(reinterpret_cast<const uint2*>(x)[j]);
}
__device__ __forceinline__ float load_in(const uint16_t* x, int64_t i) {
  return numerics::decode_bf16(x[i]);
}
// y's tokens ld elements apart (ld = heads * D: x's own layout; wider: rope_backward_bf16_into).
template <typename Out, typename In>
__global__ void rope_kernel(Out* y, const In* x, const float* __restrict__ cos_t,
                            const float* __restrict__ sin_t, int64_t B, int64_t T, int64_t heads,
                            int64_t D, float sign, int64_t ld) {
  const int64_t half = D / 2;
  MX_GRID_STRIDE(idx, B * T * heads * half) {
    const int64_t i = idx % half, row = idx / half;  // row = (b, t, h)
    const int64_t token = row / heads, t = token % T;
    const int64_t out = token * ld + (row - token * heads) * D + i;
    const float c = cos_t[t * half + i], s = sign * sin_t[t * half + i];
    const float x1 = load_in(x, row * D + i), x2 = load_in(x, row * D + i + half);
    store_out(y, out, x1 * c - x2 * s);
    store_out(y, out + half, x2 * c + x1 * s);
  }
}

// copy_rows_bf16: out[r ld + c] = in[r cols + c], a block per row; 8-byte pieces where cols,
// ld and both pointers allow it.
__global__ void copy_rows_kernel(uint16_t* __restrict__ out, int64_t ld,
                                 const uint16_t* __restrict__ in, int64_t rows, int64_t cols,
                                 bool vec) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (vec) {
      const uint2* src = reinterpret_cast<const uint2*>(in + r * cols);
      uint2* dst = reinterpret_cast<uint2*>(out + r * ld);
      for (int64_t j = threadIdx.x; j < cols / 4; j += blockDim.x) dst[j] = src[j];
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[r * ld + c] = in[r * cols + c];
    }
  }
}

// ---- swiglu -----------------------------------------------------------------------------------
// The per-element math (swiglu_math.cuh: swiglu_value, swiglu_grads), shared by the fp32
// kernels and the bf16-code ones (which widen g and u, compute exactly this in fp32, and round
// the results RNE) and by the FP8 cast of the down projection's fused input.
using cuda::swiglu_grads;
using cuda::swiglu_value;

// s may alias g (generate's decode step passes one buffer for both): each element reads g
// before writing s, and nothing is __restrict__ that may alias.
__global__ void swiglu_forward_kernel(float* s, const float* g, const float* __restrict__ u,
                                      int64_t n) {
  MX_GRID_STRIDE(i, n) s[i] = swiglu_value(g[i], u[i]);
}

// dg may alias ds (as on the CPU): each element reads ds before writing dg.
__global__ void swiglu_backward_kernel(float* dg, float* du, const float* ds,
                                       const float* __restrict__ g, const float* __restrict__ u,
                                       int64_t n) {
  MX_GRID_STRIDE(i, n) {
    float dgi, dui;
    swiglu_grads(ds[i], g[i], u[i], dgi, dui);
    du[i] = dui;
    dg[i] = dgi;
  }
}

// The bf16 path's MLP: g, u as codes, the results as RNE codes (numerics::encode_bf16).
// vec (every pointer 16-byte aligned): four elements a thread an iteration, 8-byte loads and
// stores of codes and a 16-byte load of ds (2-byte accesses ran these at under half the H200's
// bandwidth); elements [4 (n / 4), n) one by one. The same per-element math either way.
__global__ void swiglu_forward_bf16_kernel(uint16_t* __restrict__ s16,
                                           const uint16_t* __restrict__ g16,
                                           const uint16_t* __restrict__ u16, int64_t n,
                                           bool vec) {
  const int64_t n4 = vec ? n / 4 : 0;
  MX_GRID_STRIDE(j, n4) {
    const float4 g = load_in4(g16, j), u = load_in4(u16, j);
    store_out4(s16, 4 * j, make_float4(swiglu_value(g.x, u.x), swiglu_value(g.y, u.y),
                                       swiglu_value(g.z, u.z), swiglu_value(g.w, u.w)));
  }
  for (int64_t i = 4 * n4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float s = swiglu_value(numerics::decode_bf16(g16[i]), numerics::decode_bf16(u16[i]));
    s16[i] = numerics::encode_bf16(s, numerics::Saturation::kNoSat);
  }
}

// ds and dg, du as RNE codes (swiglu_backward_bf16) or fp32 (swiglu_backward_codes: dg may
// then alias ds; each element reads ds before writing dg, so neither is __restrict__).
template <typename Out, typename Dy>
__global__ void swiglu_backward_codes_kernel(Out* dg, Out* __restrict__ du, const Dy* ds,
                                             const uint16_t* __restrict__ g16,
                                             const uint16_t* __restrict__ u16, int64_t n,
                                             bool vec) {
  const int64_t n4 = vec ? n / 4 : 0;
  MX_GRID_STRIDE(j, n4) {
    const float4 d = load_in4(ds, j), g = load_in4(g16, j), u = load_in4(u16, j);
    float4 dgv, duv;
    swiglu_grads(d.x, g.x, u.x, dgv.x, duv.x);
    swiglu_grads(d.y, g.y, u.y, dgv.y, duv.y);
    swiglu_grads(d.z, g.z, u.z, dgv.z, duv.z);
    swiglu_grads(d.w, g.w, u.w, dgv.w, duv.w);
    store_out4(du, 4 * j, duv);
    store_out4(dg, 4 * j, dgv);
  }
  for (int64_t i = 4 * n4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float dgi, dui;
    swiglu_grads(load_in(ds, i), numerics::decode_bf16(g16[i]), numerics::decode_bf16(u16[i]),
                 dgi, dui);
    store_out(du, i, dui);
    store_out(dg, i, dgi);
  }
}

// swiglu_backward_bf16_fused: a block per row (grid-stride over rows), its threads along the
// row; dg's codes at 2 r cols + c, du's at 2 r cols + cols + c. vec (cols a multiple of 4,
// every pointer 8-byte aligned): four elements a thread an iteration, 8-byte loads and stores.
__global__ void swiglu_backward_fused_kernel(uint16_t* __restrict__ dgu16,
                                             const uint16_t* __restrict__ ds16,
                                             const uint16_t* __restrict__ g16,
                                             const uint16_t* __restrict__ u16, int64_t rows,
                                             int64_t cols, bool vec) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t in = r * cols, out = 2 * r * cols;
    if (vec) {
      for (int64_t j = threadIdx.x; j < cols / 4; j += blockDim.x) {
        const float4 d = load_in4(ds16 + in, j), g = load_in4(g16 + in, j),
                     u = load_in4(u16 + in, j);
        float4 dgv, duv;
        swiglu_grads(d.x, g.x, u.x, dgv.x, duv.x);
        swiglu_grads(d.y, g.y, u.y, dgv.y, duv.y);
        swiglu_grads(d.z, g.z, u.z, dgv.z, duv.z);
        swiglu_grads(d.w, g.w, u.w, dgv.w, duv.w);
        store_out4(dgu16, out + 4 * j, dgv);
        store_out4(dgu16, out + cols + 4 * j, duv);
      }
      continue;
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float dgi, dui;
      swiglu_grads(load_in(ds16, in + c), load_in(g16, in + c), load_in(u16, in + c), dgi, dui);
      store_out(dgu16, out + c, dgi);
      store_out(dgu16, out + cols + c, dui);
    }
  }
}

// ---- embedding --------------------------------------------------------------------------------
__global__ void embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const float* __restrict__ table, int64_t N, int64_t C) {
  MX_GRID_STRIDE(idx, N * C) {
    const int64_t n = idx / C, c = idx % C;
    out[idx] = table[int64_t(tokens[n]) * C + c];
  }
}

// Embedding gradient in the CPU backend's summation order, in parallel. The positions
// 0..N-1 are sorted by token id with a stable radix sort, so each run of equal ids lists its
// positions in increasing order; block (i, y) starts work only where a run starts (i = 0 or a
// new id), and its thread for column c adds the run's dout rows to the table row in that
// order: per element the same fp32 additions as the CPU's loop over n, so the same bits.
// Parallel over distinct tokens x columns (it was over columns only: one serial pass over all
// N tokens per column, on a handful of SMs).
__global__ void iota_kernel(int32_t* p, int64_t n) {
  MX_GRID_STRIDE(i, n) p[i] = int32_t(i);
}

__global__ void embedding_backward_runs_kernel(float* __restrict__ dtable,
                                               const int32_t* __restrict__ sorted_tokens,
                                               const int32_t* __restrict__ sorted_positions,
                                               const float* __restrict__ dout, int64_t N,
                                               int64_t C) {
  const int64_t i = blockIdx.x;
  const int32_t t = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == t) return;  // inside a run: its start does the work
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = dtable[int64_t(t) * C + c];
  for (int64_t j = i; j < N && sorted_tokens[j] == t; ++j)
    acc += dout[int64_t(sorted_positions[j]) * C + c];
  dtable[int64_t(t) * C + c] = acc;
}

// ---- cross-entropy over one chunk of logits [R, V], in place ------------------------------------
// loss[r] = max + log(sum exp(l - max)) - l[target] (in double, as the CPU sums chunk losses);
// with grad: row <- grad_scale * (softmax - onehot).
// grad16 (null: not written): the bf16 head's copy of the logits gradient (RNE of the fp32
// value grad_scale * softmax - onehot), the operand of its two backward GEMMs; the fp32 row is
// then left as it was (nothing reads it: the GEMMs take the copy).
// Memory-bound: three reads of the row (max, sum, gradient) and one write, the softmax
// recomputed in the third pass rather than stored in the second (an H200 ran the head's
// cross-entropy at a quarter of its bandwidth with the store and 4-byte loads). vec: rows read
// as float4 (V a multiple of 4, logits 16-byte and grad16 8-byte aligned), each thread issuing
// kCeBatch loads before it uses them; else element by element. 1024 threads, one block an SM
// (__launch_bounds__ lets it use 64 registers). (With 512 threads and no batching the kernel
// moved 1.3 TB/s on the H200, a third of its bandwidth: at more than 32 registers a thread,
// three blocks an SM take 396 of a chunk's 512 rows and the rest run as a thin second wave.)
constexpr int kCeThreads = 1024, kCeBatch = 4;
struct CeRow {
  float mx, k;  // the row's max, and grad_scale / sum
};
// f(v, j) for the float4s j of a row (j < n4) this thread takes, kCeBatch loads at a time.
// (row4 not __restrict__: the fp32 gradient is written over the row it reads.)
template <typename F>
__device__ __forceinline__ void ce_for_vec(const float4* row4, int64_t n4, F&& f) {
  const int64_t step = int64_t(blockDim.x);
  for (int64_t j0 = threadIdx.x; j0 < n4; j0 += kCeBatch * step) {
    float4 v[kCeBatch];
#pragma unroll
    for (int u = 0; u < kCeBatch; ++u)
      if (j0 + u * step < n4) v[u] = row4[j0 + u * step];
#pragma unroll
    for (int u = 0; u < kCeBatch; ++u)
      if (j0 + u * step < n4) f(v[u], j0 + u * step);
  }
}
// The FP8 head's gradient row (HeadOperands::kFp8): E5M2 codes of v * scale (RNE, SATFINITE:
// numerics::encode_fp8_elem, the bytes fp8_codes writes for the same fp32 values), written by
// the gradient pass instead of an fp32 row that a cast would read back.
struct E5m2Row {
  uint8_t* codes;
  float scale;
};
__device__ __forceinline__ uint32_t e5m2_code(float v, float scale) {
  return numerics::encode_fp8_elem(v * scale, numerics::Format::kE5M2, false, 0u);
}
__device__ __forceinline__ void store_out(E5m2Row y, int64_t i, float v) {
  y.codes[i] = uint8_t(e5m2_code(v, y.scale));
}
__device__ __forceinline__ void store_out4(E5m2Row y, int64_t i, float4 v) {
  *reinterpret_cast<uint32_t*>(y.codes + i) =
      e5m2_code(v.x, y.scale) | e5m2_code(v.y, y.scale) << 8 | e5m2_code(v.z, y.scale) << 16 |
      e5m2_code(v.w, y.scale) << 24;  // little-endian: element i at byte 0
}
// HeadOperands::kFp8Bf16Dgrad: both, the E5M2 codes (the weight gradient's operand) and the
// bf16 copy (the data gradient's), from the same fp32 values in one pass.
struct E5m2Bf16Row {
  E5m2Row e5;
  uint16_t* bf16;
};
__device__ __forceinline__ void store_out(E5m2Bf16Row y, int64_t i, float v) {
  store_out(y.e5, i, v);
  store_out(y.bf16, i, v);
}
__device__ __forceinline__ void store_out4(E5m2Bf16Row y, int64_t i, float4 v) {
  store_out4(y.e5, i, v);
  store_out4(y.bf16, i, v);
}
// The gradient pass: out[j] = grad_scale * softmax_j, then grad_scale less at the target; out
// is the bf16 copy (codes), the FP8 head's E5M2 codes or the row itself (fp32, over the
// logits each thread has read). amax (null: none): the row's largest |out[j]| as the fp32
// values are (before any encoding), folded into *amax (atomic max of the bits: amaxes are
// never negative), the FP8 head's telemetry (Backend::head_fp8_grad_amax).
template <typename Out>
__device__ __forceinline__ void ce_gradient(Out out, const float* row, const float4* row4,
                                            int64_t n4, int64_t V, int32_t tgt,
                                            float target_logit, float mx, float k,
                                            float grad_scale, float* amax = nullptr) {
  float m = 0.0f;  // over this thread's elements but the target (whose value changes below)
  ce_for_vec(row4, n4, [&](float4 v, int64_t j) {
    const float4 g = make_float4(expf(v.x - mx) * k, expf(v.y - mx) * k, expf(v.z - mx) * k,
                                 expf(v.w - mx) * k);
    store_out4(out, 4 * j, g);
    if (amax) {
      const int64_t t = tgt - 4 * j;  // the target's lane in this float4, if any
      m = fmaxf(m, t == 0 ? 0.0f : fabsf(g.x)), m = fmaxf(m, t == 1 ? 0.0f : fabsf(g.y));
      m = fmaxf(m, t == 2 ? 0.0f : fabsf(g.z)), m = fmaxf(m, t == 3 ? 0.0f : fabsf(g.w));
    }
  });
  for (int64_t j = 4 * n4 + threadIdx.x; j < V; j += blockDim.x) {
    const float g = expf(row[j] - mx) * k;
    store_out(out, j, g);
    if (amax && j != tgt) m = fmaxf(m, fabsf(g));
  }
  __syncthreads();  // out[tgt] was written above
  const float gt = expf(target_logit - mx) * k - grad_scale;
  if (threadIdx.x == 0) store_out(out, tgt, gt);
  if (amax) {
    m = block_max(m);
    if (threadIdx.x == 0)
      atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(fmaxf(m, fabsf(gt))));
  }
}
__global__ void __launch_bounds__(kCeThreads, 1)
    cross_entropy_rows_kernel(float* __restrict__ logits, double* __restrict__ loss,
                              const int32_t* __restrict__ targets, int64_t V, float grad_scale,
                              bool grad, uint16_t* __restrict__ grad16, bool vec,
                              uint8_t* __restrict__ grad8 = nullptr, float grad8_scale = 1.0f,
                              float* __restrict__ grad_amax = nullptr) {
  const int64_t r = blockIdx.x;
  float* row = logits + r * V;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  const int64_t n4 = vec ? V / 4 : 0;
  const int32_t tgt = targets[r];
  const float target_logit = row[tgt];
  float mx = -INFINITY;
  {
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    ce_for_vec(row4, n4, [&](float4 v, int64_t) {
      m[0] = fmaxf(m[0], v.x), m[1] = fmaxf(m[1], v.y), m[2] = fmaxf(m[2], v.z),
      m[3] = fmaxf(m[3], v.w);
    });
    for (int64_t j = 4 * n4 + threadIdx.x; j < V; j += blockDim.x) m[0] = fmaxf(m[0], row[j]);
    mx = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
  }
  mx = block_max(mx);
  __shared__ CeRow shared;
  if (threadIdx.x == 0) shared.mx = mx;
  __syncthreads();
  mx = shared.mx;
  KahanSum acc;
  ce_for_vec(row4, n4, [&](float4 v, int64_t) {
    acc.add(expf(v.x - mx)), acc.add(expf(v.y - mx)), acc.add(expf(v.z - mx)),
        acc.add(expf(v.w - mx));
  });
  for (int64_t j = 4 * n4 + threadIdx.x; j < V; j += blockDim.x) acc.add(expf(row[j] - mx));
  const double sum = block_sum(acc.value());
  if (threadIdx.x == 0) {
    shared.k = grad_scale / float(sum);
    loss[r] = double(mx) + log(double(float(sum))) - double(target_logit);
  }
  __syncthreads();
  if (!grad) return;
  const float k = shared.k;
  uint16_t* row16 = grad16 ? grad16 + r * V : nullptr;
  if (grad8 && row16)
    ce_gradient(E5m2Bf16Row{{grad8 + r * V, grad8_scale}, row16}, row, row4, n4, V, tgt,
                target_logit, mx, k, grad_scale, grad_amax);
  else if (grad8)
    ce_gradient(E5m2Row{grad8 + r * V, grad8_scale}, row, row4, n4, V, tgt, target_logit, mx, k,
                grad_scale, grad_amax);
  else if (row16)
    ce_gradient(row16, row, row4, n4, V, tgt, target_logit, mx, k, grad_scale, grad_amax);
  else
    ce_gradient(row, row, row4, n4, V, tgt, target_logit, mx, k, grad_scale, grad_amax);
}
// Whether cross_entropy_rows_kernel may read the rows as float4 (see there).
bool ce_vec(const float* logits, int64_t V, const uint16_t* grad16,
            const uint8_t* grad8 = nullptr) {
  return V % 4 == 0 && all_aligned(16, {logits}) && all_aligned(8, {grad16}) &&
         all_aligned(4, {grad8});
}

__global__ void round_bf16_kernel(float* y, const float* x, int64_t n) {
  MX_GRID_STRIDE(i, n) {
    y[i] = numerics::bf16_rounded(x[i]);
  }
}

// precision.activations = bf16: round in place, and write the codes a block keeps.
__global__ void pack_bf16_kernel(float* x, uint16_t* codes, int64_t n) {
  MX_GRID_STRIDE(i, n) {
    const uint16_t c = numerics::encode_bf16(x[i], numerics::Saturation::kNoSat);
    x[i] = numerics::decode_bf16(c);
    if (codes) codes[i] = c;
  }
}

__global__ void unpack_bf16_kernel(float* x, const uint16_t* codes, int64_t n) {
  MX_GRID_STRIDE(i, n) x[i] = numerics::decode_bf16(codes[i]);
}

// ---- elementwise, reductions, optimizer -------------------------------------------------------
__global__ void add_kernel(float* y, const float* a, const float* b, int64_t n) {
  MX_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* x, float s, int64_t n) { MX_GRID_STRIDE(i, n) x[i] *= s; }
__global__ void fill_kernel(float* x, float value, int64_t n) { MX_GRID_STRIDE(i, n) x[i] = value; }

// A sum of squares to about twice float's precision in FP32 operations (Ogita, Rump and Oishi's
// Dot2): each square split exactly into x*x and its rounding error (an FMA), the running sum
// kept as s + c by an error-free TwoSum, the errors gathered in c. The CPU sums in double; this
// stays within the op check's 1e-10 of it without an FP64 multiply-add an element, which a
// B300 (FP64 at about 1/60 of its FP32 rate) would make the step's slowest pass over the
// gradients. Squares that float cannot hold exactly (|x| >= 2^60 overflows past 2^120, tiny
// ones lose their error term) go to a double sum beside it.
struct SquareSum {
  float s = 0.0f, c = 0.0f;
  double wide = 0.0;
  __device__ void add(float x) {
    const float a = fabsf(x);
    if (!(a < 0x1p60f && a > 0x1p-50f)) {  // NaN and infinities included: double keeps them
      if (a != 0.0f) wide += double(x) * x;
      return;
    }
    // The _rn operations are never fused into FMAs: each rounding is the one the algorithm
    // needs (nvcc contracts a * b + c by default, which would skip the product's).
    const float p = __fmul_rn(x, x);
    const float pe = fmaf(x, x, -p);  // x * x == p + pe exactly
    const float t = __fadd_rn(s, p);  // TwoSum: s + p == t + e exactly
    const float z = __fsub_rn(t, s);
    const float e = __fadd_rn(__fsub_rn(s, __fsub_rn(t, z)), __fsub_rn(p, z));
    s = t;
    c += e + pe;
  }
  __device__ double value() const { return double(s) + double(c) + wide; }
};
// Per-block partial sums of squares (SquareSum per thread, then double across the block), then
// one block folds the partials: a fixed grid and a fixed fold order, so the result is
// deterministic. vec: x 16-byte aligned, elements [0, n & ~3) four at a time.
__global__ void sum_squares_partial_kernel(double* __restrict__ part, const float* __restrict__ x,
                                           int64_t n, bool vec) {
  SquareSum acc;
  const int64_t n4 = vec ? n / 4 : 0;
  MX_GRID_STRIDE(j, n4) {
    const float4 v = reinterpret_cast<const float4*>(x)[j];
    acc.add(v.x), acc.add(v.y), acc.add(v.z), acc.add(v.w);
  }
  for (int64_t i = 4 * n4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    acc.add(x[i]);
  const double s = block_sum(acc.value());
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// (1024 threads: the bound keeps ptxas within 64 registers a thread, so the launch fits a
// multiprocessor's 65536 whatever the body becomes; likewise max_into_kernel's)
__global__ void __launch_bounds__(1024) sum_doubles_kernel(double* __restrict__ out,
                                                           const double* __restrict__ in,
                                                           int64_t n) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += in[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

__device__ __forceinline__ void adamw_elem(float& param, float grad, float& m, float& v,
                                           float beta1, float beta2, float eps, float step_size,
                                           float bc2_sqrt, float decay, float grad_scale) {
  const float g = grad * grad_scale;
  const float mi = m = beta1 * m + (1.0f - beta1) * g;
  const float vi = v = beta2 * v + (1.0f - beta2) * g * g;
  const float p = param * decay;
  param = p - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
}
// vec: every pointer 16-byte aligned; elements [0, n & ~3) as float4 (one 16-byte load or store
// per array and thread an iteration: the optimizer step is memory-bound, 28 bytes an element),
// the rest one by one. The same arithmetic per element either way.
// codes (optional; 8-byte aligned where vec): each updated parameter's RNE bf16 code too.
__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v,
                             uint16_t* __restrict__ codes, int64_t n, float beta1, float beta2,
                             float eps, float step_size, float bc2_sqrt, float decay,
                             float grad_scale, bool vec) {
  const int64_t n4 = vec ? n / 4 : 0;
  MX_GRID_STRIDE(j, n4) {
    float4 p = reinterpret_cast<float4*>(param)[j], mm = reinterpret_cast<float4*>(m)[j],
           vv = reinterpret_cast<float4*>(v)[j];
    const float4 g = reinterpret_cast<const float4*>(grad)[j];
    adamw_elem(p.x, g.x, mm.x, vv.x, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale);
    adamw_elem(p.y, g.y, mm.y, vv.y, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale);
    adamw_elem(p.z, g.z, mm.z, vv.z, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale);
    adamw_elem(p.w, g.w, mm.w, vv.w, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale);
    reinterpret_cast<float4*>(param)[j] = p, reinterpret_cast<float4*>(m)[j] = mm,
    reinterpret_cast<float4*>(v)[j] = vv;
    if (codes) reinterpret_cast<uint2*>(codes)[j] = bf16x4_codes(p.x, p.y, p.z, p.w);
  }
  for (int64_t i = 4 * n4 + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    adamw_elem(param[i], grad[i], m[i], v[i], beta1, beta2, eps, step_size, bc2_sqrt, decay,
               grad_scale);
    if (codes) store_out(codes, i, param[i]);
  }
}

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(const CudaBackendOptions& o)
      : opt_(o),
        scratch_(select_device(o.device), o.scratch_bytes, o.tracker,
                 str("the backend's scratch for per-op temporaries: MXTRAIN_CUDA_SCRATCH_MB, now ",
                     o.scratch_bytes >> 20, "; raise it, or lower it if the GPU lacks it")) {
    device_memory_.be = this;
    MX_CUDA_CHECK("make_cuda_backend", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    scratch_.set_stream(stream_);
    lt_.set_tune(opt_.gemm_tune);
    lt_.set_fp8_fast_accum(opt_.fp8_fast_accum);
    const char* env = std::getenv("MXTRAIN_CUDA_SYNC");
    if (env && env[0] == '1') opt_.sync_after_each_op = true;
    cudaDeviceProp prop{};
    MX_CUDA_CHECK("make_cuda_backend", cudaGetDeviceProperties(&prop, opt_.device));
    sm_count_ = std::max(1, prop.multiProcessorCount);
    // FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x).
    fp8_native_ = opt_.fp8_tensor_cores && prop.major * 10 + prop.minor >= 89;
    // The scale modes below need a cuBLASLt that has them: the headers built against and the
    // library loaded (an older libcublasLt on the machine refuses the attributes, which would
    // throw where the recipe should fall back to emulation).
    const size_t lt = std::min<size_t>(CUBLAS_VERSION, cublasLtGetVersion());
    // 1x128 / 128x128 block scales: compute capability 9.x (cuBLAS >= 12.9; Blackwell's
    // block-scaled GEMMs take VEC32_UE8M0 / VEC16_UE4M3 scales instead).
    fp8_block_native_ = opt_.fp8_tensor_cores && prop.major == 9 && lt >= 120900;
    // The Blackwell modes from 12.8.4: through 12.8.3 cuBLASLt's heuristic cache could hand a
    // block-scaled call an algorithm cached for a per-tensor one of the same shape (Transformer
    // Engine's cublaslt_gemm.cu works around it for those versions).
    const bool mx_lt = lt >= 120804;
    // fp8-block on Blackwell: the same E4M3 codes with the power-of-two block scales rewritten
    // as E8M0 (exact, numerics/fp8_block_mx.h) on the MXFP8 GEMM, as Transformer Engine does.
    fp8_block_via_mx_ = opt_.fp8_tensor_cores && prop.major == 10 && mx_lt;
    // MXFP8 (1x32 blocks, E8M0 scales, CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0): compute
    // capability 10.x. Hopper has no such scale mode: mxfp8 stays emulated there.
    mxfp8_native_ = opt_.fp8_tensor_cores && prop.major == 10 && mx_lt;
    // NVFP4 (E2M1 operands, 1x16 blocks, UE4M3 scales, VEC16_UE4M3): the same GPUs.
    nvfp4_native_ = opt_.fp8_tensor_cores && prop.major == 10 && mx_lt;
  }
  ~CudaBackendImpl() override {
    cudaStreamSynchronize(stream_);
    for (const PendingEvent& p : pending_) cudaEventDestroy(p.ev);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (last_event_) cudaEventDestroy(last_event_);
#ifdef MXTRAIN_HAVE_CUDNN
    cudnn_.reset();  // its handle is bound to the stream
#endif
    if (attn_amax_dev_) cudaFree(attn_amax_dev_);
    if (head_amax_dev_) cudaFree(head_amax_dev_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  // run.deterministic. What could differ run to run on this backend: GEMM tuning (each shape's
  // algorithm picked by timing candidates, so two runs, or a run and its resume, may pick
  // differently and round differently), and cuDNN's SDPA backward (dQ accumulated in whatever
  // order its thread blocks finish). The rest is deterministic as it is: cuBLASLt for one
  // algorithm on one kind of GPU (cuBLAS's reproducibility rule), our kernels (fixed grids
  // and reduction orders; their only atomics are max and counts, whose results do not depend
  // on order), the FP8 casts' tuned forms (every form writes the same bytes), NCCL for one
  // job's ranks and topology. The head's chunks the trainer fixes (train/trainer.cpp).
  std::string set_deterministic() override {
    const char* tune = std::getenv("MXTRAIN_CUDA_GEMM_TUNE");
    if (tune && parse_cuda_gemm_tune(tune) != CudaGemmTune::kOff)
      throw UserError(str("run.deterministic = true takes each GEMM shape's first algorithm "
                          "from cuBLASLt's heuristic, and MXTRAIN_CUDA_GEMM_TUNE=", tune,
                          " picks by timing, which can differ run to run: unset it or set 0"));
    opt_.gemm_tune = CudaGemmTune::kOff;
    lt_.set_tune(opt_.gemm_tune);
    deterministic_ = true;
#ifdef MXTRAIN_HAVE_CUDNN
    if (cudnn_) cudnn_->set_deterministic(true);
    return "each GEMM shape on cuBLASLt's heuristic first algorithm (no tuning), cuDNN's "
           "attention backward in its deterministic form";
#else
    return "each GEMM shape on cuBLASLt's heuristic first algorithm (no tuning)";
#endif
  }
  cudaStream_t stream() const override { return stream_; }
  int device() const override { return opt_.device; }

  // ---- memory: device memory, reached from the host only through these copies ----
  bool host_addressable() const override { return false; }
  std::string device_name() const override {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, opt_.device) != cudaSuccess) return "cuda";
    return prop.name;
  }
  MemoryResource* memory() override { return &device_memory_; }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    MX_CUDA_CHECK("copy_to_host",
                  cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK("copy_to_host", cudaStreamSynchronize(stream_));
  }
  void copy_from_host(void* dst, const void* host_src, size_t bytes) override {
    if (!bytes) return;
    MX_CUDA_CHECK("copy_from_host",
                  cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    // From pageable memory the copy may still be reading host_src after the call returns on
    // some drivers; waiting keeps the "host buffer reusable at once" contract simple.
    MX_CUDA_CHECK("copy_from_host", cudaStreamSynchronize(stream_));
  }
  bool set_bf16_gemm_operands(bool on) override {
    opt_.gemm_precision = on ? CudaGemmPrecision::kBf16 : base_precision_;
    return true;
  }
  void synchronize() override { MX_CUDA_CHECK("synchronize", cudaStreamSynchronize(stream_)); }

  // ---- run.profile (backend/op_profile.h, device form): an event on the stream as each op
  // finishes queueing (done()); the time from the previous op's event to it is the op's. ----
  void set_profiling(bool on) override {
    if (on && !profiling_) {  // the first op's time starts here
      resolve_events(true);
      if (last_event_) free_events_.push_back(last_event_);
      last_event_ = take_event();
      MX_CUDA_CHECK("profile", cudaEventRecord(last_event_, stream_));
      last_flops_ = stats_.flops;
    }
    profiling_ = on;
  }
  std::vector<OpProfile::Row> op_profile() override {
    resolve_events(true);
    return profile_.rows();
  }
  void reset_op_profile() override {
    resolve_events(true);  // what ran so far belongs before the reset
    profile_.clear();
  }
  void set_gemm_precision(CudaGemmPrecision p) override {
    opt_.gemm_precision = base_precision_ = p;
  }
  size_t scratch_peak_bytes() const override { return scratch_.peak(); }
  int64_t gemm_shapes_timed() const override { return lt_.tune_stats().timed; }
  int64_t gemm_shapes_retuned() const override { return lt_.tune_stats().changed; }
  int64_t fp8_fast_accum_gemms() const override { return lt_.fast_accum_gemms(); }

  // GEMM FLOPs are counted; GEMM seconds are not measured yet (0): timing asynchronous work
  // needs events read back at the step's end (TODO with the CUDA step loop).
  GemmStats gemm_stats() const override { return stats_; }
  void reset_gemm_stats() override { stats_ = {}; }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, const float* B, float beta, float* C) override {
    DeviceArenaScope scope(scratch_);
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    lt_.gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C, opt_.gemm_precision, ws, ws_bytes,
             scratch_, stream_);
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done("gemm");
  }

  // gemm's bf16 mode with operands given as codes or fp32 and an fp32 or bf16 result
  // (LtGemm::gemm_bf16: the fp32 operands' copies and the cuBLASLt workspace in scratch).
  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                 float beta, float* C, uint16_t* C16 = nullptr) override {
    bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, A16, B, B16, beta, C, C16, nullptr);
  }
  // The residual read by the epilogue (C from R, D into C, beta 1): the block's output
  // projections write x + proj in one pass, where a separate add read the product and x and
  // wrote the sum again (8 bytes an element saved, twice a block).
  void gemm_bf16_residual(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                          float alpha, const float* A, const uint16_t* A16, const float* B,
                          const uint16_t* B16, const float* R, float* C) override {
    MX_ASSERT(R != C, "gemm_bf16_residual: the residual must not be the output");
    bf16_gemm(trans_a, trans_b, M, N, K, alpha, A, A16, B, B16, 1.0f, C, nullptr, R);
  }
  // Both: LtGemm::gemm_bf16 (the fp32 operands' copies and the cuBLASLt workspace in scratch),
  // beta's term read from C_in where given.
  void bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                 float beta, float* C, uint16_t* C16, const float* C_in) {
    MX_ASSERT(opt_.gemm_precision == CudaGemmPrecision::kBf16,
              "gemm_bf16: called without set_bf16_gemm_operands(true)");
    DeviceArenaScope scope(scratch_);
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    lt_.gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, A16, B, B16, beta, C, C16, ws, ws_bytes,
                  scratch_, stream_, C_in);
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done("gemm_bf16");
  }

  void fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, numerics::Format a_fmt,
                const float* a_scale, const uint8_t* B, numerics::Format b_fmt,
                const float* b_scale, float beta, float* C) override {
    DeviceArenaScope scope(scratch_);
    tensor_fp8_gemm(M, N, K, A, a_fmt, a_scale, B, b_fmt, b_scale, beta, C, nullptr);
  }
  void set_fp8_bf16_output(bool on) override { fp8_bf16_output_ = on; }
  void set_fp8_residual_epilogue(bool on) override { fp8_residual_epilogue_ = on; }
  int64_t fp8_residual_fallbacks() const override { return fp8_residual_fallbacks_; }
  int64_t fp8_bf16_output_fallbacks() const override { return fp8_bf16_fallbacks_; }

  // ---- shared inputs (Backend::begin_shared_input) ----
  // The kept quantization lives in scratch reserved here, below the Linear calls' own scopes:
  // its codes (rows * cols bytes), its scales in the form the operand function returns (a
  // float decode scale, fp8-block's relaid float scales, swizzled E8M0 bytes), and the amax.
  // Declined (no sharing, logged once) where scratch has not got that beside the Linears' own
  // needs (a GEMM workspace, their gradients' block scales, 16 MiB for the rest).
  void begin_shared_input(const void* x, int64_t rows, int64_t cols,
                          int64_t widest_out) override {
    Backend::begin_shared_input(x, rows, cols, widest_out);
    if (!shared_x_) return;
    const size_t codes = size_t(round_up_256(rows * cols));
    const size_t scales = size_t(round_up_256(shared_scale_bound(rows, cols)));
    const size_t need = codes + scales + DeviceArena::kAlign;
    // A Linear's own scratch: the GEMM workspace, and under the block-scaled recipes its
    // output gradient's raw and relaid scales (about twice the bound: N * out / 16 bytes).
    const size_t reserve = opt_.gemm_workspace_bytes +
                           2 * size_t(shared_scale_bound(rows, std::max<int64_t>(widest_out, 1))) +
                           (size_t(16) << 20);
    if (scratch_.capacity() - scratch_.used() < need + reserve) {
      if (!shared_declined_++)
        info("cuda: FP8 Linears do not share their input's quantization: the scratch arena "
             "has not got ", need + reserve, " bytes free (MXTRAIN_CUDA_SCRATCH_MB)");
      Backend::end_shared_input();
      return;
    }
    shared_mark_ = scratch_.mark();
    shared_codes_ = scratch_.alloc_as<uint8_t>(int64_t(codes));
    shared_scales_ = scratch_.alloc(scales);
    shared_amax_ = scratch_.alloc_f32(1);
    shared_scale_room_ = scales;
    shared_open_ = true;
  }
  void end_shared_input() override {
    if (shared_open_) scratch_.release(shared_mark_);  // the stream orders reuse after the GEMMs
    shared_open_ = false;
    Backend::end_shared_input();
  }

  // ---- per-tensor FP8 Linears on tensor cores (recipes fp8-current / fp8-delayed) ----
  // Each operand: its amax (current scaling, or into q.amax for delayed scaling's history), the
  // scale on the device, then its codes (K-major for the GEMM: transposed where the reduction
  // runs down its columns) into the caller's `work`; one cuBLASLt FP8 GEMM per product.
  // fp8-block: the same, with block scales in cuBLASLt's layouts (Hopper: fp8_block_operand),
  // or on Blackwell as E8M0 scales for the MXFP8 GEMM (fp8_block_mx_operand).
  bool fp8_tensor_cores() const override { return fp8_native_; }
  bool fp8_block_tensor_cores() const override { return fp8_block_native_ || fp8_block_via_mx_; }
  bool mxfp8_tensor_cores() const override { return mxfp8_native_; }
  bool nvfp4_tensor_cores() const override { return nvfp4_native_; }

  // An input given as bf16 codes (Fp8Operand::bf16): the quantize kernels read the codes (their
  // const uint16_t* overloads; nvfp4's 1x16 and Hadamard-transformed operands too).
  // An output wanted as bf16 codes (y16): the GEMM's epilogue writes them (fp8_output).
  // A residual: the epilogue adds it (C = residual, beta 1, D = y), except under nvfp4 (its
  // GEMM takes beta from the device): there an add after.
  void fp8_linear_forward(float* y, const float* x, const Fp8Operand& xq, const float* w,
                          const Fp8Operand& wq, int64_t N, int64_t in, int64_t out, float* work,
                          uint16_t* y16, const float* residual) override {
    MX_REQUIRE(!residual || (y && !y16), "fp8_linear_forward: a residual takes an fp32 y alone");
    MX_REQUIRE(!xq.save_t || xq.xt_scale_bytes(N, in) > 0,
               "fp8_linear_forward: x^T's codes saved per tensor, fp8-block 1x128 or mxfp8 1x32 "
               "only");
    MX_REQUIRE(!xq.swiglu_g || (xq.swiglu_u && xq.save_t && !x && !xq.bf16),
               "fp8_linear_forward: SwiGLU's operands stand for x, with x^T's codes saved");
    with_input(x, xq, "fp8_linear_forward", [&](const auto* xs) {
      fp8_forward(y, y16, residual, xs, xq, w, wq, N, in, out, work);
    });
  }

  void fp8_linear_wgrad(float* dw, const float* dy, const Fp8Operand& dyq, const float* x,
                        const Fp8Operand& xq, int64_t N, int64_t in, int64_t out,
                        float* work) override {
    check_codes_t(x, xq, "fp8_linear_wgrad");
    with_input(x, xq, "fp8_linear_wgrad", [&](const auto* xs) {
      with_grad(dy, dyq, "fp8_linear_wgrad", [&](const auto* dys) {
        fp8_wgrad(dw, dys, dyq, xs, xq, N, in, out, work);
      });
    });
  }

  // Fp8Operand::codes_t: FP8 (not nvfp4), alone (no x, no bf16 codes)
  static void check_codes_t(const float* x, const Fp8Operand& xq, const char* op) {
    MX_REQUIRE(!xq.codes_t || (!xq.nvfp4 && !x && !xq.bf16), op,
               ": x^T's saved codes are FP8 codes, given without x");
  }

  // A Linear backward's four FP8 code buffers in `work`, each from a 256-byte boundary, then
  // the transposing quantizers' tmp (mxfp8's path). codes_end: the bytes the four take;
  // tmp_begin: where tmp starts. Not const: an operand call may point a buffer at the shared
  // input's kept codes instead (fp8_operand).
  struct BackwardCodes {
    uint8_t* dyc;   // dy [N, out]: dgrad's K = out
    uint8_t* dytc;  // dy^T [out, N]: wgrad's K = N
    uint8_t* wtc;   // W^T [in, out]
    uint8_t* xtc;   // x^T [in, N]
    uint8_t* tmp;
    BackwardCodes(float* work, int64_t N, int64_t in, int64_t out)
        : dyc(reinterpret_cast<uint8_t*>(work)),
          dytc(dyc + round_up_256(N * out)),
          wtc(dytc + round_up_256(N * out)),
          xtc(wtc + round_up_256(out * in)),
          tmp(xtc + round_up_256(N * in)) {}
    static int64_t codes_end(int64_t N, int64_t in, int64_t out) {
      return 2 * round_up_256(N * out) + round_up_256(out * in) + N * in;
    }
    static int64_t tmp_begin(int64_t N, int64_t in, int64_t out) {
      return codes_end(N, in, out) - N * in + round_up_256(N * in);
    }
  };

  // fp8_swiglu_backward's fused forms (in = C, out = I): dg's two code buffers (rows, then
  // transposed) at the start of `work`, then BackwardCodes for du's two, W^T's, x^T's and
  // tmp; fits(bytes): whether `bytes` from the start fit in fp8_linear_backward's `work`.
  struct SwigluBackwardCodes {
    uint8_t* dg;
    uint8_t* dg_t;
    BackwardCodes b;
    SwigluBackwardCodes(float* work, int64_t N, int64_t C, int64_t I)
        : dg(reinterpret_cast<uint8_t*>(work)),
          dg_t(dg + round_up_256(N * I)),
          b(reinterpret_cast<float*>(dg_t + round_up_256(N * I)), N, C, I) {}
    static int64_t dg_bytes(int64_t N, int64_t I) { return 2 * round_up_256(N * I); }
    static bool fits(int64_t bytes, int64_t N, int64_t C, int64_t I) {
      return bytes <= 4 * std::max(N * I + I * C, N * I + N * C);
    }
  };

  // Both GEMMs of a Linear's backward. Where dy's two quantizations are one per-tensor
  // quantization (same format and scaling; fp8-delayed's two scales equal), dy's amax is taken
  // once and its codes written in both layouts from one read (fp8_codes_both); the amax goes to
  // both operands' slots. The codes are the bytes the two separate calls write. fp8-block
  // (dy 1x128 and 128x1 on the block GEMMs, N and out multiples of 128) and mxfp8 (1x32 and
  // 32x1 on Blackwell, N, in and out multiples of 32): dy read once for both
  // (fp8_block_backward, mxfp8_backward). Otherwise, or where `work` (the larger of the two
  // calls' floats) cannot hold the four code buffers, the two calls. dy as codes (both
  // operands' bf16) and dx16: as fp8_linear_dgrad's.
  void fp8_linear_backward(float* dx, float* dw, const float* dy, const Fp8Operand& dyq_dgrad,
                           const float* w, const Fp8Operand& wq, const Fp8Operand& dyq_wgrad,
                           const float* x, const Fp8Operand& xq, int64_t N, int64_t in,
                           int64_t out, bool accumulate_dx, float* work,
                           uint16_t* dx16) override {
    check_codes_t(x, xq, "fp8_linear_backward");
    const bool same = dyq_dgrad.fmt == dyq_wgrad.fmt && dyq_dgrad.current == dyq_wgrad.current &&
                      (dyq_dgrad.current || dyq_dgrad.scale == dyq_wgrad.scale);
    const int64_t have = 4 * std::max(N * out + out * in, N * out + N * in);
    const int64_t need = BackwardCodes::codes_end(N, in, out);
    // fp8-block (the recipe's cut: dy 1x128 for the data gradient, 128x1 for the weight's)
    const bool block_path = fp8_block_backward_cut(dyq_dgrad, wq, dyq_wgrad, xq) &&
                            N % 128 == 0 && out % 128 == 0 &&
                            (fp8_block_native_ || fp8_block_via_mx_);
    // mxfp8 (Blackwell): dy 1x32 for the data gradient, 32x1 for the weight's; the two-step
    // forms of the transposed operands take `tmp` after the four code buffers
    const int64_t tmp_bytes = std::max({N * out, N * in, out * in});
    const bool mx_path = dyq_dgrad.mx && dyq_wgrad.mx && xq.mx && wq.mx && mxfp8_native_ &&
                         N % 32 == 0 && out % 32 == 0 && in % 32 == 0 &&
                         BackwardCodes::tmp_begin(N, in, out) + tmp_bytes <= have;
    const bool tensor_path = dyq_dgrad.per_tensor() && dyq_wgrad.per_tensor() && same;
    // nvfp4 (Blackwell): dy 1x16 for the data gradient, RHT(dy^T) for the weight gradient's
    // (its own scratch for the codes; W^T's 16x16 codes read from W, as fp8_dgrad's)
    const bool fp4_path = dyq_dgrad.nvfp4 && dyq_wgrad.nvfp4 && xq.nvfp4 && wq.nvfp4 &&
                          dyq_dgrad.block_rows == 1 && dyq_dgrad.block_cols == 16 &&
                          !dyq_dgrad.rht && dyq_wgrad.rht && xq.rht &&
                          dyq_wgrad.rht_seed == xq.rht_seed && nvfp4_native_ && N % 32 == 0 &&
                          in % 32 == 0 && out % 32 == 0;
    if (!dx || !dw || !(fp4_path || ((block_path || mx_path || tensor_path) && need <= have))) {
      return Backend::fp8_linear_backward(dx, dw, dy, dyq_dgrad, w, wq, dyq_wgrad, x, xq, N, in,
                                          out, accumulate_dx, work, dx16);
    }
    MX_REQUIRE(dyq_dgrad.bf16 == dyq_wgrad.bf16,
               "fp8_linear_backward: dy's two operands given as different codes");
    MX_REQUIRE(!dx16 || !accumulate_dx,
               "fp8_linear_backward: bf16 codes of dx are written, not added");
    with_input(x, xq, "fp8_linear_backward", [&](const auto* xs) {
      with_grad(dy, dyq_dgrad, "fp8_linear_backward", [&](const auto* dys) {
        if (fp4_path)
          return nvfp4_backward(dx, dx16, dw, dys, dyq_dgrad, w, wq, dyq_wgrad, xs, xq, N, in,
                                out, accumulate_dx, work);
        if (block_path)
          return fp8_block_backward(dx, dx16, dw, dys, dyq_dgrad, w, wq, dyq_wgrad, xs, xq, N,
                                    in, out, accumulate_dx, work);
        if (mx_path)
          return mxfp8_backward(dx, dx16, dw, dys, w, xs, xq, N, in, out, accumulate_dx, work);
        BackwardCodes b(work, N, in, out);
        Fp8Operand dyq = dyq_dgrad;  // dy's amax goes to the wgrad operand's slot too
        if (!dyq.amax) dyq.amax = dyq_wgrad.amax;
        const float* scale_inv = fp8_operand(b.dytc, dys, N, out, dyq, true, b.dyc);
        if (dyq_wgrad.amax && dyq_wgrad.amax != dyq.amax)
          MX_CUDA_CHECK("fp8_linear_backward", cudaMemcpyAsync(dyq_wgrad.amax, dyq.amax,
                                                               sizeof(float),
                                                               cudaMemcpyDeviceToDevice, stream_));
        const float* ws = fp8_operand(b.wtc, w, out, in, wq, true);
        fp8_output("fp8_linear_backward", dx, dx16, nullptr, N * in,
                   [&](float* C, uint16_t* C16, const float*) {
                     return tensor_fp8_gemm(N, in, out, b.dyc, dyq_dgrad.fmt, scale_inv, b.wtc,
                                            wq.fmt, ws, accumulate_dx ? 1.0f : 0.0f, C, C16);
                   });
        const float* xsc = fp8_operand(b.xtc, xs, N, in, xq, true);
        tensor_fp8_gemm(out, in, N, b.dytc, dyq_dgrad.fmt, scale_inv, b.xtc, xq.fmt, xsc, 1.0f, dw,
                        nullptr);
      });
    });
  }

  // Backend::fp8_swiglu_backward: dg's and du's FP8 operands in both layouts from one read of
  // ds, g and u (cuda::swiglu_backward_fp8; under current scaling an amax pass over the same
  // gradients first), their bf16 codes never written; then each Linear's two GEMMs as
  // fp8_linear_backward's tensor path (W^T's and x^T's operands by fp8_operand: x^T's kept
  // codes, or the shared input's). Per-tensor operands only, where `work` holds the four
  // gradient operands, W^T's and x^T's codes; otherwise the reference form (dgu16).
  void fp8_swiglu_backward(float* dx, float* const dw[2], const uint16_t* ds16,
                           const uint16_t* g16, const uint16_t* u16, const float* const w[2],
                           const Fp8Operand wq[2], const Fp8Operand dyq[2][2],
                           const Fp8Operand xq[2], int64_t N, int64_t C, int64_t I,
                           uint16_t* dgu16, float* work) override {
    if (mxfp8_swiglu_backward(dx, dw, ds16, g16, u16, w, wq, dyq, xq, N, C, I, work) ||
        fp8_block_swiglu_backward(dx, dw, ds16, g16, u16, w, wq, dyq, xq, N, C, I, work))
      return;
    bool fused = SwigluBackwardCodes::fits(SwigluBackwardCodes::dg_bytes(N, I) +
                                               BackwardCodes::codes_end(N, C, I),
                                           N, C, I) &&
                 fp8_native_;
    for (int k = 0; k < 2; ++k) {
      check_codes_t(nullptr, xq[k], "fp8_swiglu_backward");
      fused = fused && xq[k].per_tensor() && wq[k].per_tensor();
      for (int j = 0; j < 2; ++j)
        fused = fused && dyq[k][j].per_tensor() && !dyq[k][j].bf16 &&
                dyq[k][j].fmt == dyq[0][j].fmt && dyq[k][j].current == dyq[0][0].current;
    }
    if (!fused)
      return Backend::fp8_swiglu_backward(dx, dw, ds16, g16, u16, w, wq, dyq, xq, N, C, I, dgu16,
                                          work);
    DeviceArenaScope scope(scratch_);
    const SwigluBackwardCodes sc(work, N, C, I);
    uint8_t* const codes[4] = {sc.dg, sc.dg_t, sc.b.dyc, sc.b.dytc};  // dg, dg^T, du, du^T
    const bool current = dyq[0][0].current;
    float* amax = scratch_.alloc_f32(2);  // max |dg|, max |du|
    float* scales = scratch_.alloc_f32(4);  // dg rows, dg^T, du rows, du^T (encode)
    float* scale_inv = scratch_.alloc_f32(4);
    if (current) cuda::swiglu_grads_abs_max(amax, ds16, g16, u16, N * I, stream_);
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 2; ++j)
        cuda::fp8_scales(scales + 2 * k + j, scale_inv + 2 * k + j, current ? amax + k : nullptr,
                         dyq[k][j].scale, dyq[k][j].fmt, stream_);
    cuda::swiglu_backward_fp8(ds16, g16, u16, N, I, dyq[0][0].fmt, dyq[0][1].fmt, scales,
                              codes[0], codes[1], codes[2], codes[3], current ? nullptr : amax,
                              stream_);
    launched("fp8_swiglu_backward (dg, du operands)");
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 2; ++j)
        if (dyq[k][j].amax) copy_amax(dyq[k][j].amax, amax + k);
    for (int k = 0; k < 2; ++k) {
      uint8_t* wt = sc.b.wtc;  // (a reference parameter, as xt's below)
      const float* ws = fp8_operand(wt, w[k], I, C, wq[k], true);
      tensor_fp8_gemm(N, C, I, codes[2 * k], dyq[k][0].fmt, scale_inv + 2 * k, wt, wq[k].fmt, ws,
                      k == 1 ? 1.0f : 0.0f, dx, nullptr);
      uint8_t* xt = sc.b.xtc;  // (fp8_operand may point it at kept codes)
      with_input(nullptr, xq[k], "fp8_swiglu_backward", [&](const auto* xs) {
        const float* xsc = fp8_operand(xt, xs, N, C, xq[k], true);
        tensor_fp8_gemm(I, C, N, codes[2 * k + 1], dyq[k][1].fmt, scale_inv + 2 * k + 1, xt,
                        xq[k].fmt, xsc, 1.0f, dw[k], nullptr);
      });
    }
  }

  // fp8-block's backward operands as the recipe cuts them: dy 1x128 for the data gradient,
  // 128x1 for the weight gradient, x 128x1, W in blocks.
  static bool fp8_block_backward_cut(const Fp8Operand& dyq_dgrad, const Fp8Operand& wq,
                                     const Fp8Operand& dyq_wgrad, const Fp8Operand& xq) {
    auto blocks = [](const Fp8Operand& q, int br, int bc) {
      return !q.mx && !q.nvfp4 && q.block_rows == br && q.block_cols == bc;
    };
    return blocks(dyq_dgrad, 1, 128) && blocks(dyq_wgrad, 128, 1) && blocks(xq, 128, 1) &&
           wq.block_rows > 0;
  }

  // fp8_swiglu_backward under fp8-block: dg's and du's operands in both of its layouts from
  // one read of ds, g and u (cuda::swiglu_backward_fp8_block: the bytes and scales
  // quantize_fp8_block_both writes from their codes), then each Linear's two GEMMs as
  // fp8_block_backward runs them (Hopper's block-scaled GEMMs, or Blackwell's MXFP8 one).
  // Where N and I are multiples of 128, ds, g and u are 8-byte aligned, x comes as bf16 codes
  // and `work` holds the four gradient operands and W^T's and x^T's codes; false (nothing
  // done) otherwise.
  bool fp8_block_swiglu_backward(float* dx, float* const dw[2], const uint16_t* ds16,
                                 const uint16_t* g16, const uint16_t* u16,
                                 const float* const w[2], const Fp8Operand wq[2],
                                 const Fp8Operand dyq[2][2], const Fp8Operand xq[2], int64_t N,
                                 int64_t C, int64_t I, float* work) {
    if (!(fp8_block_native_ || fp8_block_via_mx_) || N % 128 != 0 || I % 128 != 0 ||
        !all_aligned(8, {ds16, g16, u16}))
      return false;
    for (int k = 0; k < 2; ++k)
      if (!fp8_block_backward_cut(dyq[k][0], wq[k], dyq[k][1], xq[k]) ||
          !(xq[k].bf16 || xq[k].codes_t) || dyq[k][0].bf16 || dyq[k][1].bf16)
        return false;
    if (!SwigluBackwardCodes::fits(
            SwigluBackwardCodes::dg_bytes(N, I) + BackwardCodes::codes_end(N, C, I), N, C, I))
      return false;
    DeviceArenaScope scope(scratch_);
    SwigluBackwardCodes sc(work, N, C, I);
    BackwardCodes& b = sc.b;
    cuda::BlockOperands ops[2] = {
        {sc.dg, scratch_.alloc_f32(N * (I / 128)), sc.dg_t, scratch_.alloc_f32(N / 128 * I)},
        {b.dyc, scratch_.alloc_f32(N * (I / 128)), b.dytc, scratch_.alloc_f32(N / 128 * I)}};
    cuda::swiglu_backward_fp8_block(ds16, g16, u16, N, I, true, ops[0], ops[1], stream_);
    for (int k = 0; k < 2; ++k) {
      b.dyc = ops[k].codes;
      b.dytc = ops[k].codes_t;
      fp8_block_backward_gemms(dx, nullptr, dw[k], b, ops[k].row_scales, ops[k].col_scales,
                               dyq[k][0], w[k], wq[k], dyq[k][1], xq[k].bf16, xq[k], N, C, I,
                               k == 1, k == 0 ? "fp8_swiglu_backward (dg, du operands)" : nullptr);
    }
    return true;
  }

  // fp8_swiglu_backward under mxfp8 (Blackwell): dg's and du's operands in both of its
  // layouts from one read of ds, g and u (cuda::swiglu_backward_mxfp8: the bytes
  // quantize_mxfp8_both writes from their codes), then each Linear's two MXFP8 GEMMs as
  // mxfp8_backward runs them. Where N, C and I are multiples of 32, ds, g and u are 4-byte
  // aligned, x comes as bf16 codes and `work` holds the four gradient operands, W^T's and
  // x^T's codes and the transposing quantizers' tmp; false (nothing done) otherwise.
  bool mxfp8_swiglu_backward(float* dx, float* const dw[2], const uint16_t* ds16,
                             const uint16_t* g16, const uint16_t* u16, const float* const w[2],
                             const Fp8Operand wq[2], const Fp8Operand dyq[2][2],
                             const Fp8Operand xq[2], int64_t N, int64_t C, int64_t I,
                             float* work) {
    if (!mxfp8_native_ || N % 32 != 0 || C % 32 != 0 || I % 32 != 0 ||
        !all_aligned(4, {ds16, g16, u16}))
      return false;
    for (int k = 0; k < 2; ++k)
      if (!wq[k].mx || !xq[k].mx || !(xq[k].bf16 || xq[k].codes_t) || !dyq[k][0].mx ||
          !dyq[k][1].mx || dyq[k][0].bf16 || dyq[k][1].bf16)
        return false;
    // (tmp: only W^T's and x^T's transposing quantizers take it)
    if (!SwigluBackwardCodes::fits(SwigluBackwardCodes::dg_bytes(N, I) +
                                       BackwardCodes::tmp_begin(N, C, I) + std::max(I * C, N * C),
                                   N, C, I))
      return false;
    DeviceArenaScope scope(scratch_);
    SwigluBackwardCodes sc(work, N, C, I);
    BackwardCodes& b = sc.b;
    cuda::MxOperands ops[2] = {
        {sc.dg, scratch_.alloc_as<uint8_t>(N * (I / 32)), sc.dg_t,
         scratch_.alloc_as<uint8_t>(N / 32 * I)},
        {b.dyc, scratch_.alloc_as<uint8_t>(N * (I / 32)), b.dytc,
         scratch_.alloc_as<uint8_t>(N / 32 * I)}};
    cuda::swiglu_backward_mxfp8(ds16, g16, u16, N, I, numerics::Format::kE4M3,
                                numerics::MxScaleRule::kCeil, ops[0], ops[1], stream_);
    for (int k = 0; k < 2; ++k) {
      b.dyc = ops[k].codes;
      b.dytc = ops[k].codes_t;
      mxfp8_backward_gemms(dx, nullptr, dw[k], b, ops[k].row_scales, ops[k].col_scales, w[k],
                           xq[k].bf16, xq[k], N, C, I, k == 1,
                           k == 0 ? "fp8_swiglu_backward (dg, du operands)" : "mxfp8_operand");
    }
    return true;
  }

  // fp8-block's backward with dy read once for both its operands (quantize_fp8_block_both:
  // the bytes and scales of the two separate quantizations), then the two GEMMs as
  // fp8_dgrad's and fp8_wgrad's (Hopper's block-scaled GEMM, or Blackwell's MXFP8 one with
  // the scales as E8M0). N and out multiples of 128 (the recipe's tensor-core rule). `work`:
  // BackwardCodes' four buffers.
  template <class DY, class X>
  void fp8_block_backward(float* dx, uint16_t* dx16, float* dw, const DY* dy,
                          const Fp8Operand& dyq_dgrad, const float* w, const Fp8Operand& wq,
                          const Fp8Operand& dyq_wgrad, const X* x, const Fp8Operand& xq,
                          int64_t N, int64_t in, int64_t out, bool accumulate_dx, float* work) {
    BackwardCodes b(work, N, in, out);
    float* raw_r = scratch_.alloc_f32(N * (out / 128));  // [N, out / 128]
    float* raw_c = scratch_.alloc_f32(N / 128 * out);    // [N / 128, out]
    cuda::quantize_fp8_block_both(dy, N, out, true, b.dyc, raw_r, b.dytc, raw_c, stream_);
    fp8_block_backward_gemms(dx, dx16, dw, b, raw_r, raw_c, dyq_dgrad, w, wq, dyq_wgrad, x, xq,
                             N, in, out, accumulate_dx, nullptr);
  }
  // fp8_block_backward after dy's quantization: b.dyc (1x128 blocks) and b.dytc (128x1,
  // transposed) hold dy's codes, raw_r [N, out / 128] and raw_c [N / 128, out] their float
  // scales (1 / scale) as quantize_fp8_block leaves them, relaid here for the GEMMs (op: the
  // profile's name for that, or null for the usual ones); W^T's and x^T's operands into b.wtc
  // and b.xtc, then the two GEMMs.
  template <class X>
  void fp8_block_backward_gemms(float* dx, uint16_t* dx16, float* dw, BackwardCodes& b,
                                const float* raw_r, const float* raw_c,
                                const Fp8Operand& dyq_dgrad, const float* w, const Fp8Operand& wq,
                                const Fp8Operand& dyq_wgrad, const X* x, const Fp8Operand& xq,
                                int64_t N, int64_t in, int64_t out, bool accumulate_dx,
                                const char* op) {
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    auto dgrad = [&](auto&& gemm) {
      fp8_output("fp8_linear_backward", dx, dx16, nullptr, N * in,
                 [&](float* C, uint16_t* C16, const float*) { return gemm(C, C16); });
    };
    if (fp8_block_via_mx_) {
      uint8_t* s_r = scratch_.alloc_as<uint8_t>(numerics::swizzled_scale_bytes(N, out / 32));
      uint8_t* s_c = scratch_.alloc_as<uint8_t>(numerics::swizzled_scale_bytes(out, N / 32));
      cuda::fp8_block_scales_to_mx(raw_r, N, out, 1, 128, false, s_r, stream_);
      cuda::fp8_block_scales_to_mx(raw_c, N, out, 128, 1, true, s_c, stream_);
      launched(op ? op : "fp8_block_mx_operand");
      const uint8_t* ws = fp8_block_mx_operand(b.wtc, nullptr, w, out, in, wq, true);
      dgrad([&](float* C, uint16_t* C16) {
        return mxfp8_gemm(N, in, out, b.dyc, s_r, b.wtc, ws, beta, C, C16);
      });
      const uint8_t* xs = fp8_block_mx_operand(b.xtc, nullptr, x, N, in, xq, true);
      mxfp8_gemm(out, in, N, b.dytc, s_c, b.xtc, xs, 1.0f, dw);
      return;
    }
    float* s_r = scratch_.alloc_f32(block_lt_scale_floats(N, out, dyq_dgrad, false));
    float* s_c = scratch_.alloc_f32(block_lt_scale_floats(N, out, dyq_wgrad, true));
    block_lt_scales(raw_r, N, out, dyq_dgrad, false, s_r);
    block_lt_scales(raw_c, N, out, dyq_wgrad, true, s_c);
    launched(op ? op : "fp8_block_operand");
    const float* ws = fp8_block_operand(b.wtc, nullptr, w, out, in, wq, true);
    dgrad([&](float* C, uint16_t* C16) {
      return fp8_block_gemm(N, in, out, b.dyc, s_r, dyq_dgrad, b.wtc, ws, wq, beta, C, C16);
    });
    const float* xs = fp8_block_operand(b.xtc, nullptr, x, N, in, xq, true);
    fp8_block_gemm(out, in, N, b.dytc, s_c, dyq_wgrad, b.xtc, xs, xq, 1.0f, dw);
  }

  // mxfp8's backward with dy read once for both its operands (quantize_mxfp8_both: the bytes
  // and scales of mxfp8_operand's two quantizations), then the two MXFP8 GEMMs as fp8_dgrad's
  // and fp8_wgrad's. N, in and out multiples of 32; `work` holds BackwardCodes' four buffers
  // and tmp.
  template <class DY, class X>
  void mxfp8_backward(float* dx, uint16_t* dx16, float* dw, const DY* dy, const float* w,
                      const X* x, const Fp8Operand& xq, int64_t N, int64_t in, int64_t out,
                      bool accumulate_dx, float* work) {
    BackwardCodes b(work, N, in, out);
    uint8_t* raw_r = scratch_.alloc_as<uint8_t>(N * (out / 32));  // [N, out / 32]
    uint8_t* raw_c = scratch_.alloc_as<uint8_t>(N / 32 * out);    // [N / 32, out]
    cuda::quantize_mxfp8_both(dy, N, out, numerics::Format::kE4M3, numerics::MxScaleRule::kCeil,
                              b.dyc, raw_r, b.tmp, b.dytc, raw_c, stream_);
    mxfp8_backward_gemms(dx, dx16, dw, b, raw_r, raw_c, w, x, xq, N, in, out, accumulate_dx,
                         "mxfp8_operand");
  }
  // mxfp8_backward after dy's quantization: b.dyc and b.dytc hold dy's codes in its two
  // layouts, raw_r [N, out / 32] and raw_c [N / 32, out] their E8M0 scales as quantize_mxfp8
  // leaves them (swizzled here, `op` naming that in the profile); W^T's and x^T's operands
  // into b.wtc and b.xtc (b.tmp for their two-step forms; x^T's kept codes, xq.codes_t, stand
  // for its operand), then the two GEMMs.
  template <class X>
  void mxfp8_backward_gemms(float* dx, uint16_t* dx16, float* dw, BackwardCodes& b,
                            const uint8_t* raw_r, const uint8_t* raw_c, const float* w,
                            const X* x, const Fp8Operand& xq, int64_t N, int64_t in, int64_t out,
                            bool accumulate_dx, const char* op) {
    uint8_t* s_r = scratch_.alloc_as<uint8_t>(numerics::swizzled_scale_bytes(N, out / 32));
    uint8_t* s_c = scratch_.alloc_as<uint8_t>(numerics::swizzled_scale_bytes(out, N / 32));
    cuda::swizzle_scales_u8(raw_r, false, N, out / 32, s_r, stream_);
    cuda::swizzle_scales_u8(raw_c, true, out, N / 32, s_c, stream_);
    launched(op);
    const uint8_t* ws = mxfp8_operand(b.wtc, b.tmp, w, out, in, true);
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    fp8_output("fp8_linear_backward", dx, dx16, nullptr, N * in,
               [&](float* C, uint16_t* C16, const float*) {
                 return mxfp8_gemm(N, in, out, b.dyc, s_r, b.wtc, ws, beta, C, C16);
               });
    const uint8_t* xs = mxfp8_operand(b.xtc, b.tmp, x, N, in, true, &xq);
    mxfp8_gemm(out, in, N, b.dytc, s_c, b.xtc, xs, 1.0f, dw);
  }

  // f(x) or, given as codes, f(xq.bf16), in a scratch scope.
  template <class F>
  void with_input(const float* x, const Fp8Operand& xq, const char* op, F&& f) {
    DeviceArenaScope scope(scratch_);
    if (!xq.bf16) return f(x);
    MX_REQUIRE(!x, op, ": bf16 codes of x given with x");
    f(xq.bf16);
  }

  // X: float (fp32 input) or uint16_t (bf16 codes). The caller holds a scope.
  template <class X>
  void fp8_forward(float* y, uint16_t* y16, const float* residual, const X* x,
                   const Fp8Operand& xq, const float* w, const Fp8Operand& wq, int64_t N,
                   int64_t in, int64_t out, float* work) {
    uint8_t* xc = reinterpret_cast<uint8_t*>(work);
    uint8_t* wc = xc + round_up_256(N * in);
    // gemm(C, C16, R): the product into C (fp32; plus R where R is given: beta 1, C = R) or
    // C16 (bf16 codes); false: no such algorithm
    auto output = [&](auto&& gemm) {
      fp8_output("fp8_linear_forward", y, y16, residual, N * out, gemm);
    };
    if (xq.nvfp4) {  // nvfp4 (Blackwell): codes and scales in scratch, `work` unused
      const Nvfp4Operand a = nvfp4_operand(x, N, in, xq, false, nullptr);
      const Nvfp4Operand b = nvfp4_operand(w, out, in, wq, false, nullptr);
      return output([&](float* C, uint16_t* C16, const float* R) {
        return nvfp4_gemm(N, out, in, a, b, R ? 1.0f : 0.0f, C, C16, R);
      });
    }
    if (xq.mx) {  // mxfp8 (Blackwell)
      uint8_t* tmp = wc + round_up_256(out * in);
      const uint8_t* xs = mxfp8_operand(xc, tmp, x, N, in, false, &xq);
      const uint8_t* ws = mxfp8_operand(wc, tmp, w, out, in, false);
      return output([&](float* C, uint16_t* C16, const float* R) {
        return mxfp8_gemm(N, out, in, xc, xs, wc, ws, R ? 1.0f : 0.0f, C, C16, R);
      });
    }
    if (xq.block_rows > 0 && fp8_block_via_mx_) {  // fp8-block (Blackwell): MXFP8 GEMM
      uint8_t* tmp = wc + round_up_256(out * in);
      const uint8_t* xs = fp8_block_mx_operand(xc, tmp, x, N, in, xq, false);
      const uint8_t* ws = fp8_block_mx_operand(wc, tmp, w, out, in, wq, false);
      return output([&](float* C, uint16_t* C16, const float* R) {
        return mxfp8_gemm(N, out, in, xc, xs, wc, ws, R ? 1.0f : 0.0f, C, C16, R);
      });
    }
    if (xq.block_rows > 0) {
      uint8_t* tmp = wc + round_up_256(out * in);
      const float* xs = fp8_block_operand(xc, tmp, x, N, in, xq, false);
      const float* ws = fp8_block_operand(wc, tmp, w, out, in, wq, false);
      return output([&](float* C, uint16_t* C16, const float* R) {
        return fp8_block_gemm(N, out, in, xc, xs, xq, wc, ws, wq, R ? 1.0f : 0.0f, C, C16, R);
      });
    }
    const float* xs = fp8_operand(xc, x, N, in, xq, false);
    const float* ws = fp8_operand(wc, w, out, in, wq, false);
    output([&](float* C, uint16_t* C16, const float* R) {
      return tensor_fp8_gemm(N, out, in, xc, xq.fmt, xs, wc, wq.fmt, ws, R ? 1.0f : 0.0f, C, C16,
                             R);
    });
  }

  // A forward FP8 Linear's output: y16 null: gemm(y, null), fp32. y16 given: gemm(null, y16)
  // writes the bf16 codes directly (cuBLASLt's epilogue rounds the fp32 value it would have
  // written to y: the same codes as rounding y) where cuBLASLt has an algorithm for it and
  // set_fp8_bf16_output is on; else gemm(y, null) and y rounded into y16 (y is then the
  // caller's scratch). Saves the fp32 copy's write and read: 8 of 10 bytes an element.
  // residual given (y16 null): gemm(y, null, residual), the epilogue reading residual as C with
  // beta 1 and writing the sum to y: no product written and read back by an add (8 bytes an
  // element), the bf16 path's o and down projections; where cuBLASLt has no such algorithm
  // (false) or set_fp8_residual_epilogue is off, gemm(y, null, null) and add, as the CPU twin
  // (residual does not overlap y). op: the Linear op, for the messages and the profile (the
  // forward's y16, the data gradient's dx16).
  template <class G>
  void fp8_output(const char* op, float* y, uint16_t* y16, const float* residual, int64_t n,
                  G&& gemm) {
    if (residual) {
      if (fp8_residual_epilogue_) {
        if (gemm(y, nullptr, residual)) return;
        if (fp8_residual_fallbacks_++ == 0)
          info("cuda: a low-precision Linear has no GEMM that adds the residual at its shape; "
               "its product is written in fp32 and added (slower, the CPU's operations)");
      }
      gemm(y, nullptr, nullptr);  // an fp32 output: no algorithm throws
      add(y, residual, y, n);
      return;
    }
    if (y16 && fp8_bf16_output_) {
      if (gemm(nullptr, y16, nullptr)) return;
      if (fp8_bf16_fallbacks_++ == 0)
        info("cuda: an FP8 Linear has no bf16-output GEMM at its shape; its output is written "
             "in fp32 and rounded (slower, same values)");
    }
    MX_REQUIRE(y, op, ": the fp32 buffer is null (it is the bf16 output's fallback)");
    gemm(y, nullptr, nullptr);
    if (y16) round_output(op, y16, y, n);
  }
  void round_output(const char* op, uint16_t* y16, const float* y, int64_t n) {
    cuda::round_to_bf16(y16, y, n, stream_);  // checks its launch
    done(str(op, " (round)").c_str());
  }

  // The per-tensor FP8 GEMM (LtGemm::fp8_gemm), fp32 C or bf16 C16, beta's term from C_in
  // (null: C); the caller holds a scope. op: its name in the profile.
  bool tensor_fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, numerics::Format a_fmt,
                       const float* a_scale, const uint8_t* B, numerics::Format b_fmt,
                       const float* b_scale, float beta, float* C, uint16_t* C16,
                       const float* C_in = nullptr, const char* op = "fp8_gemm") {
    DeviceArenaScope scope(scratch_);  // the workspace, released after queueing (one stream)
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    if (!lt_.fp8_gemm(M, N, K, A, a_fmt, a_scale, B, b_fmt, b_scale, beta, C, ws, ws_bytes,
                      stream_, C16, C_in))
      return false;
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done(op);
    return true;
  }

  // dy given as codes (dyq.bf16): the quantizers read them. dx16: the product as bf16 codes
  // out of the GEMM's epilogue (fp8_output's fallback where it has none; dx its scratch).
  void fp8_linear_dgrad(float* dx, const float* dy, const Fp8Operand& dyq, const float* w,
                        const Fp8Operand& wq, int64_t N, int64_t in, int64_t out,
                        bool accumulate_dx, float* work, uint16_t* dx16) override {
    MX_REQUIRE(!dx16 || (dx && !accumulate_dx),
               "fp8_linear_dgrad: bf16 codes of dx are written, not added, with dx as scratch");
    DeviceArenaScope scope(scratch_);
    with_grad(dy, dyq, "fp8_linear_dgrad", [&](const auto* dys) {
      fp8_dgrad(dx, dx16, dys, dyq, w, wq, N, in, out, accumulate_dx, work);
    });
  }

  // f(dy) or, given as codes, f(dyq.bf16). No scope of its own: the callers hold one.
  template <class F>
  void with_grad(const float* dy, const Fp8Operand& dyq, const char* op, F&& f) {
    if (!dyq.bf16) return f(dy);
    MX_REQUIRE(!dy, op, ": bf16 codes of dy given with dy");
    f(dyq.bf16);
  }

  // DY: float (fp32 gradient) or uint16_t (bf16 codes). The caller holds a scope.
  template <class DY>
  void fp8_dgrad(float* dx, uint16_t* dx16, const DY* dy, const Fp8Operand& dyq, const float* w,
                 const Fp8Operand& wq, int64_t N, int64_t in, int64_t out, bool accumulate_dx,
                 float* work) {
    uint8_t* dyc = reinterpret_cast<uint8_t*>(work);   // [N, out]: K = out innermost
    uint8_t* wtc = dyc + round_up_256(N * out);          // W^T [in, out]
    const float beta = accumulate_dx ? 1.0f : 0.0f;
    // gemm(C, C16, R): as fp8_forward's (R unused: null)
    auto output = [&](auto&& gemm) {
      fp8_output("fp8_linear_dgrad", dx, dx16, nullptr, N * in, gemm);
    };
    if (dyq.nvfp4) {  // W^T's 16x16 codes from W (`work`: a 16x1 weight's fp32 W^T)
      const Nvfp4Operand a = nvfp4_operand(dy, N, out, dyq, false, nullptr);
      const Nvfp4Operand b = nvfp4_operand(w, out, in, wq, true, work + N * out);
      return output([&](float* C, uint16_t* C16, const float*) {
        return nvfp4_gemm(N, in, out, a, b, beta, C, C16);
      });
    }
    if (dyq.mx) {
      uint8_t* tmp = wtc + round_up_256(out * in);
      const uint8_t* dys = mxfp8_operand(dyc, tmp, dy, N, out, false);
      const uint8_t* ws = mxfp8_operand(wtc, tmp, w, out, in, true);
      return output([&](float* C, uint16_t* C16, const float*) {
        return mxfp8_gemm(N, in, out, dyc, dys, wtc, ws, beta, C, C16);
      });
    }
    if (dyq.block_rows > 0 && fp8_block_via_mx_) {
      uint8_t* tmp = wtc + round_up_256(out * in);
      const uint8_t* dys = fp8_block_mx_operand(dyc, tmp, dy, N, out, dyq, false);
      const uint8_t* ws = fp8_block_mx_operand(wtc, tmp, w, out, in, wq, true);
      return output([&](float* C, uint16_t* C16, const float*) {
        return mxfp8_gemm(N, in, out, dyc, dys, wtc, ws, beta, C, C16);
      });
    }
    if (dyq.block_rows > 0) {
      uint8_t* tmp = wtc + round_up_256(out * in);
      const float* dys = fp8_block_operand(dyc, tmp, dy, N, out, dyq, false);
      const float* ws = fp8_block_operand(wtc, tmp, w, out, in, wq, true);
      return output([&](float* C, uint16_t* C16, const float*) {
        return fp8_block_gemm(N, in, out, dyc, dys, dyq, wtc, ws, wq, beta, C, C16);
      });
    }
    const float* dys = fp8_operand(dyc, dy, N, out, dyq, false);
    const float* ws = fp8_operand(wtc, w, out, in, wq, true);
    output([&](float* C, uint16_t* C16, const float*) {
      return tensor_fp8_gemm(N, in, out, dyc, dyq.fmt, dys, wtc, wq.fmt, ws, beta, C, C16);
    });
  }

  template <class DY, class X>
  void fp8_wgrad(float* dw, const DY* dy, const Fp8Operand& dyq, const X* x,
                 const Fp8Operand& xq, int64_t N, int64_t in, int64_t out, float* work) {
    uint8_t* dytc = reinterpret_cast<uint8_t*>(work);  // dy^T [out, N]: K = N innermost
    uint8_t* xtc = dytc + round_up_256(N * out);         // x^T [in, N]
    if (dyq.nvfp4) {  // RHT(dy^T) and RHT(x^T), then 1x16 along the tokens (`work` unused)
      MX_REQUIRE(dyq.rht && xq.rht, "fp8_linear_wgrad: nvfp4 on the device takes the RHT "
                 "operands (tokens a multiple of 16), got none");
      const Nvfp4Operand a = nvfp4_operand(dy, N, out, dyq, true, nullptr);
      const Nvfp4Operand b = nvfp4_operand(x, N, in, xq, true, nullptr);
      nvfp4_gemm(out, in, N, a, b, 1.0f, dw);
      return;
    }
    if (dyq.mx) {
      uint8_t* tmp = xtc + round_up_256(N * in);
      const uint8_t* dys = mxfp8_operand(dytc, tmp, dy, N, out, true);
      const uint8_t* xs = mxfp8_operand(xtc, tmp, x, N, in, true, &xq);
      mxfp8_gemm(out, in, N, dytc, dys, xtc, xs, 1.0f, dw);
      return;
    }
    if (dyq.block_rows > 0 && fp8_block_via_mx_) {
      uint8_t* tmp = xtc + round_up_256(N * in);
      const uint8_t* dys = fp8_block_mx_operand(dytc, tmp, dy, N, out, dyq, true);
      const uint8_t* xs = fp8_block_mx_operand(xtc, tmp, x, N, in, xq, true);
      mxfp8_gemm(out, in, N, dytc, dys, xtc, xs, 1.0f, dw);
      return;
    }
    if (dyq.block_rows > 0) {
      uint8_t* tmp = xtc + round_up_256(N * in);
      const float* dys = fp8_block_operand(dytc, tmp, dy, N, out, dyq, true);
      const float* xs = fp8_block_operand(xtc, tmp, x, N, in, xq, true);
      fp8_block_gemm(out, in, N, dytc, dys, dyq, xtc, xs, xq, 1.0f, dw);
      return;
    }
    const float* dys = fp8_operand(dytc, dy, N, out, dyq, true);
    const float* xs = fp8_operand(xtc, x, N, in, xq, true);
    fp8_gemm(out, in, N, dytc, dyq.fmt, dys, xtc, xq.fmt, xs, 1.0f, dw);
  }

  // mxfp8 / nvfp4 emulated (off their tensor cores): the quantize kernels write the
  // dequantized operand straight into `out`; codes and scales are scratch, dropped at the end.
  bool quantize_dequantize(float* out, const float* x, int64_t rows, int64_t cols,
                           const Fp8Operand& q, float* tmp) override {
    MX_REQUIRE(q.mx || q.nvfp4, "quantize_dequantize: mxfp8 or nvfp4 operands only");
    DeviceArenaScope scope(scratch_);
    if (q.mx) {
      const bool colwise = q.block_rows == 32;
      const int64_t sr = colwise ? (rows + 31) / 32 : rows, sc = colwise ? cols : (cols + 31) / 32;
      uint8_t* codes = scratch_.alloc_as<uint8_t>(rows * cols);
      uint8_t* scales = scratch_.alloc_as<uint8_t>(sr * sc);
      cuda::quantize_mxfp8(x, rows, cols, colwise, numerics::Format::kE4M3,
                           numerics::MxScaleRule::kCeil, numerics::RoundingOptions{}, codes,
                           scales, out, stream_);
      launched("quantize_dequantize (mxfp8)");
      return true;
    }
    const float* src = x;
    int64_t R = rows, K = cols;
    if (q.rht) {  // out[cols, rows] = q(RHT(x^T)), 1x16 along the rows of x^T
      MX_REQUIRE(tmp != nullptr, "quantize_dequantize: the RHT needs a temporary");
      cuda::transpose_f32(x, rows, cols, tmp, stream_);
      cuda::rht16_forward(tmp, cols, rows, q.rht_seed, stream_);
      src = tmp;
      R = cols;
      K = rows;
    } else if (q.block_rows == 16 && q.block_cols == 1) {
      return false;  // 16x1 columns: no device kernel (only token counts not a multiple of 16)
    }
    const bool blocks_2d = q.nvfp4_2d();
    const int64_t br = blocks_2d ? 16 : 1;
    uint8_t* codes = scratch_.alloc_as<uint8_t>(R * ((K + 1) / 2));
    uint8_t* scales = scratch_.alloc_as<uint8_t>(((R + br - 1) / br) * ((K + 15) / 16));
    float* global = scratch_.alloc_f32(1);
    cuda::quantize_nvfp4(src, R, K, blocks_2d, q.rounding, codes, scales, global, out, scratch_,
                         stream_);
    launched("quantize_dequantize (nvfp4)");
    return true;
  }

  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N,
                       int64_t C, float eps) override {
    if (N == 0) return;
    rmsnorm_forward_kernel<<<unsigned(N), kThreads, 0, stream_>>>(
        y, rstd, x, w, C, eps, C % 4 == 0 && all_16_aligned({y, x, w}), nullptr);
    launched("rmsnorm_forward");
  }
  void rmsnorm_forward_bf16(uint16_t* y16, float* rstd, const float* x, const float* w,
                            int64_t N, int64_t C, float eps, float* amax) override {
    if (amax) MX_CUDA_CHECK("rmsnorm_forward_bf16", cudaMemsetAsync(amax, 0, sizeof(float), stream_));
    if (N == 0) return;
    rmsnorm_forward_kernel<<<unsigned(N), kThreads, 0, stream_>>>(
        y16, rstd, x, w, C, eps, C % 4 == 0 && all_16_aligned({y16, x, w}), amax);
    launched(amax ? "rmsnorm_forward_bf16 (amax)" : "rmsnorm_forward_bf16");
  }

  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t N, int64_t C) override {
    rmsnorm_backward_codes(dx, nullptr, dw, dy, x, w, rstd, N, C, nullptr);
  }
  void rmsnorm_backward_bf16(float* dx, uint16_t* dx16, float* dw, const float* dy,
                             const float* x, const float* w, const float* rstd, int64_t N,
                             int64_t C, float* amax) override {
    rmsnorm_backward_codes(dx, dx16, dw, dy, x, w, rstd, N, C, amax);
  }
  // Both: the one-pass kernel stores the codes itself, and folds dx's amax; the other kernels
  // are followed by a rounding pass and an amax pass.
  void rmsnorm_backward_codes(float* dx, uint16_t* dx16, float* dw, const float* dy,
                              const float* x, const float* w, const float* rstd, int64_t N,
                              int64_t C, float* amax) {
    if (amax) MX_CUDA_CHECK("rmsnorm_backward", cudaMemsetAsync(amax, 0, sizeof(float), stream_));
    if (N == 0) return;
    const bool vec_dx = C % 4 == 0 && all_16_aligned({dx, dy, x, w});
    const bool vec = vec_dx && all_aligned(8, {dx16});  // (null is aligned)
    if (dw && vec && C <= 4 * 4 * 512) {  // one pass: rmsnorm_backward_fused_kernel
      DeviceArenaScope scope(scratch_);
      const int threads = C <= 4 * 4 * kThreads ? kThreads : 512;
      const int64_t per_thread = (C / 4 + threads - 1) / threads;  // float4s: K, rounded up
      auto pick = [&](auto codes) {
        constexpr bool kCodes = decltype(codes)::value;
        return per_thread == 1       ? rmsnorm_backward_fused_kernel<1, kThreads, 1, kCodes>
               : per_thread == 2     ? rmsnorm_backward_fused_kernel<2, kThreads, 3, kCodes>
               : threads == kThreads ? rmsnorm_backward_fused_kernel<4, kThreads, 2, kCodes>
                                     : rmsnorm_backward_fused_kernel<4, 512, 1, kCodes>;
      };
      auto* kernel = dx16 ? pick(std::true_type{}) : pick(std::false_type{});
      // At most the blocks the GPU holds at once: each walks its rows one after another, so a
      // second, partial wave of blocks (the H200 holds 3 of these a multiprocessor, 396 in
      // all, against the 512 the partials allow at C = 2048) ran at a fraction of the GPU
      // while doubling the op's time.
      int per_sm = 0;
      MX_CUDA_CHECK("rmsnorm_backward",
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
      const int64_t resident = int64_t(std::max(per_sm, 1)) * sm_count_;
      const int64_t blocks = std::min<int64_t>(
          {N, resident,
           std::clamp<int64_t>(kRmsnormPartialBytes / (8 * C), 64, kRmsnormBackwardBlocks)});
      double* part = scratch_.alloc_as<double>(blocks * C);
      kernel<<<unsigned(blocks), threads, 0, stream_>>>(dx, part, dy, x, w, rstd, N, C, dx16,
                                                         amax);
      launched(amax ? "rmsnorm_backward (amax)" : "rmsnorm_backward");
      rmsnorm_backward_dw_reduce_kernel<<<grid_1d(C), kThreads, 0, stream_>>>(dw, part, blocks, C);
      launched("rmsnorm_backward");
      done("rmsnorm_backward");
      return;
    }
    rmsnorm_backward_dx_kernel<<<unsigned(N), kThreads, 0, stream_>>>(dx, dy, x, w, rstd, C,
                                                                        vec_dx);
    launched("rmsnorm_backward");
    if (dx16) {
      cuda::round_to_bf16(dx16, dx, N * C, stream_);  // checks its launch
      done("rmsnorm_backward");
    }
    if (amax) {
      cuda::abs_max(amax, dx, N * C, scratch_, stream_);
      done("rmsnorm_backward (amax)");
    }
    if (!dw) return;
    DeviceArenaScope scope(scratch_);
    const int64_t splits = N < 64 ? N : 64;
    double* part = scratch_.alloc_as<double>(splits * C);
    const dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned(splits));
    rmsnorm_backward_dw_partial_kernel<<<grid, kThreads, 0, stream_>>>(part, dy, x, rstd, N, C);
    rmsnorm_backward_dw_reduce_kernel<<<grid_1d(C), kThreads, 0, stream_>>>(dw, part, splits, C);
    launched("rmsnorm_backward");
    done("rmsnorm_backward");  // the scratch partials are released when this returns
  }

  void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    rope(x, x, cos, sin, B, T, heads, D, 1.0f, "rope_forward");
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                     int64_t heads, int64_t D) override {
    rope(dx, dx, cos, sin, B, T, heads, D, -1.0f, "rope_backward");
  }
  void rope_forward_bf16(uint16_t* y16, const float* x, const float* cos, const float* sin,
                         int64_t B, int64_t T, int64_t heads, int64_t D) override {
    rope(y16, x, cos, sin, B, T, heads, D, 1.0f, "rope_forward_bf16");
  }
  void rope_backward_bf16(uint16_t* dx16, const float* cos, const float* sin, int64_t B,
                          int64_t T, int64_t heads, int64_t D) override {
    rope(dx16, dx16, cos, sin, B, T, heads, D, -1.0f, "rope_backward_bf16");
  }
  void rope_backward_bf16_into(uint16_t* out, int64_t ld, const uint16_t* dx16, const float* cos,
                               const float* sin, int64_t B, int64_t T, int64_t heads,
                               int64_t D) override {
    MX_ASSERT(ld >= heads * D, "rope_backward_bf16_into: ld ", ld, " < heads x D");
    rope(out, dx16, cos, sin, B, T, heads, D, -1.0f, "rope_backward_bf16", ld);
  }
  void copy_rows_bf16(uint16_t* out, int64_t ld, const uint16_t* in, int64_t rows,
                      int64_t cols) override {
    if (rows == 0 || cols == 0) return;
    const bool vec = cols % 4 == 0 && ld % 4 == 0 && all_aligned(8, {out, in});
    copy_rows_kernel<<<unsigned(std::min<int64_t>(rows, 1 << 16)), kThreads, 0, stream_>>>(
        out, ld, in, rows, cols, vec);
    launched("copy_rows_bf16");
  }
  bool fuse_linear_backward() const override { return true; }

  // cuDNN's SDPA (bf16) where built, selected and supported for the shape, else the fp32 kernel.
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (use_cudnn(B, T, H, KV, D)) {
      const int64_t sq = T * H * D, sk = T * KV * D;
      auto group = [&](int64_t b0, int64_t n) {
        cudnn_->forward(out + b0 * sq, lse + b0 * H * T, q + b0 * sq, k + b0 * sk,
                        v + b0 * sk, n, T, H, KV, D, scratch_);
      };
      cudnn_in_groups(B, T, H, KV, D, false, false, "attention_forward", group);
      return done("attention_forward");
    }
#endif
    cuda::attention_forward(out, lse, q, k, v, B, T, H, KV, D, stream_);
    done("attention_forward");
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (use_cudnn(B, T, H, KV, D)) {
      const int64_t sq = T * H * D, sk = T * KV * D;
      auto group = [&](int64_t b0, int64_t n) {
        cudnn_->backward(dq + b0 * sq, dk + b0 * sk, dv + b0 * sk, dout + b0 * sq, q + b0 * sq,
                         k + b0 * sk, v + b0 * sk, out + b0 * sq, lse + b0 * H * T, n, T, H, KV,
                         D, scratch_);
      };
      cudnn_in_groups(B, T, H, KV, D, true, false, "attention_backward", group);
      return done("attention_backward");
    }
#endif
    cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, D, scratch_,
                             stream_);
    done("attention_backward");
  }
  // FP8 attention (numerics/attention_fp8.h): the amaxes of q, k, v (and dout) reduced here,
  // every scale computed on the device from them (no host round trip), the operands cast to
  // codes (fp8_codes, the recipes' cast). On cuDNN's fused FP8 SDPA where it takes the shape
  // (and MXTRAIN_CUDA_ATTENTION is cudnn): cuDNN on the codes, its FP8 outputs decoded into
  // the destinations. Elsewhere the fp32 kernel on the values the codes stand for, with the
  // CPU twin's rounding of P and dS inside it (AttnFp8Kernel) and its outputs rounded after
  // it: the twin's steps on the device. The amaxes and scales are the whole batch's
  // (per-tensor scaling); the rest runs on all B sequences at once where it fits in the
  // scratch arena, else in groups of sequences, each group's amaxes folded into the batch's.
  std::string attention_fp8_problem(int64_t B, int64_t T, int64_t H, int64_t KV,
                                    int64_t D) override {
    if (B <= 0 || T <= 0) return "";
    if (fp8_on_cudnn(B, T, H, KV, D) || (D > 0 && D <= cuda::kMaxHeadDim)) return "";
    return str("head_dim ", D, " is above the fp32 attention kernel's ", cuda::kMaxHeadDim,
               " and cuDNN's fused FP8 SDPA does not take the shape (", fp8_cudnn_why(B, T, H,
               KV, D), ")");
  }
  std::string head_fp8_path(int64_t N, int64_t C, int64_t V, int64_t chunk_rows) override {
    if (head_fp8_native(N, C, V, chunk_rows)) return "on FP8 GEMMs";
    return str("on fp32 GEMMs over the FP8 values (",
               !fp8_native_ ? "no FP8 tensor cores here, or MXTRAIN_CUDA_FP8=emulate"
                            : "FP8 GEMMs take tokens, chunk rows, hidden size and vocabulary "
                              "in multiples of 16",
               ")");
  }
  std::string attention_fp8_path(int64_t B, int64_t T, int64_t H, int64_t KV,
                                 int64_t D) override {
    if (fp8_on_cudnn(B, T, H, KV, D)) return "on cuDNN's fused FP8 SDPA";
    return "on the fp32 attention kernel with the CPU twin's FP8 rounding (" +
           fp8_cudnn_why(B, T, H, KV, D) + ")";
  }
  bool fp8_on_cudnn(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    return fp8_cudnn_why(B, T, H, KV, D).empty();
  }
  // "" when FP8 attention runs on cuDNN for this shape, else why not.
  std::string fp8_cudnn_why(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    if (opt_.attention == CudaAttention::kFp32) return "MXTRAIN_CUDA_ATTENTION=fp32";
#ifdef MXTRAIN_HAVE_CUDNN
    if (B <= 0 || T <= 0) return "empty shape";
    return cudnn().fp8_problem(cudnn_batch(B), T, H, KV, D);
#else
    (void)B, (void)T, (void)H, (void)KV, (void)D;
    return "built without cuDNN";
#endif
  }
  void attention_forward_fp8(float* out, float* lse, const float* q, const float* k,
                             const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D) override {
    fp8_attention_forward(out, lse, q, k, v, B, T, H, KV, D, "attention_forward_fp8");
  }
  void attention_backward_fp8(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t D) override {
    fp8_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, D,
                           "attention_backward_fp8");
  }
  void attention_forward_fp8_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                                  const uint16_t* k16, const uint16_t* v16, int64_t B, int64_t T,
                                  int64_t H, int64_t KV, int64_t D) override {
    fp8_attention_forward(out16, lse, q16, k16, v16, B, T, H, KV, D,
                          "attention_forward_fp8_bf16");
  }
  void attention_backward_fp8_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                    const uint16_t* dout16, const uint16_t* q16,
                                    const uint16_t* k16, const uint16_t* v16,
                                    const uint16_t* out16, const float* lse, int64_t B, int64_t T,
                                    int64_t H, int64_t KV, int64_t D) override {
    fp8_attention_backward(dq16, dk16, dv16, dout16, q16, k16, v16, out16, lse, B, T, H, KV, D,
                           "attention_backward_fp8_codes");
  }
  // What both directions start with, in scratch (the caller's scope): the amaxes of the whole
  // q, k, v (and, backward, dout; 0 for a forward) and every scale computed from them on the
  // device (numerics::attn_fp8_scale_slots).
  struct Fp8AttentionScales {
    float* slots;
    float* cudnn_amax;  // cuDNN's amaxes of the whole batch (attention_fp8_amax reads them)
    float* group_amax;  // one group's, when the batch runs in groups (else cudnn_amax)
  };
  template <class In>
  Fp8AttentionScales fp8_attention_scales(const In* q, const In* k, const In* v, const In* dout,
                                          int64_t B, int64_t T, int64_t H, int64_t KV,
                                          int64_t D, const char* op) {
    namespace nm = numerics;
    const int64_t nq = B * T * H * D, nk = B * T * KV * D;
    Fp8AttentionScales r{};
    // The amaxes (ours, then cuDNN's, 16 bytes apart) in the persistent buffer that
    // attention_fp8_amax() reads: forward at [0, 32), backward at [32, 64).
    if (!attn_amax_dev_)
      MX_CUDA_CHECK(op, cudaMalloc(&attn_amax_dev_, kAttnAmaxFloats * sizeof(float)));
    float* amax = attn_amax_dev_ + (dout ? 32 : 0);
    r.slots = scratch_.alloc_f32(nm::kAttnFp8Slots * nm::kAttnFp8SlotFloats);
    r.cudnn_amax = r.group_amax = amax + 16;
    if (!dout) MX_CUDA_CHECK(op, cudaMemsetAsync(amax + 3, 0, sizeof(float), stream_));
    cuda::abs_max(amax + 0, q, nq, scratch_, stream_);
    cuda::abs_max(amax + 1, k, nk, scratch_, stream_);
    cuda::abs_max(amax + 2, v, nk, scratch_, stream_);
    if (dout) cuda::abs_max(amax + 3, dout, nq, scratch_, stream_);
    cuda::attn_fp8_scales(r.slots, amax, D, T * (H / KV), 1.0f / std::sqrt(float(D)), stream_);
    return r;
  }
  // Sequences [b0, b0 + n) of q, k, v as E4M3 codes at their scales, in scratch (the
  // caller's scope).
  template <class In>
  std::array<const uint8_t*, 3> fp8_qkv_codes(const In* q, const In* k, const In* v, int64_t b0,
                                              int64_t n, int64_t sq, int64_t sk, int64_t D,
                                              const float* slots) {
    namespace nm = numerics;
    const nm::Format e4 = nm::Format::kE4M3;
    return {fp8_attention_cast(q + b0 * sq, n * sq, D, e4, slots, nm::kAttnScaleQ),
            fp8_attention_cast(k + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleK),
            fp8_attention_cast(v + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleV)};
  }
  // A tensor's codes at its slot's scale, in scratch (the caller's scope).
  template <class In>
  uint8_t* fp8_attention_cast(const In* x, int64_t n, int64_t D, numerics::Format f,
                              const float* slots, numerics::AttnFp8Slot s) {
    uint8_t* codes = scratch_.alloc_as<uint8_t>(n);
    cuda::fp8_codes(x, n / D, D, f, slots + s * numerics::kAttnFp8SlotFloats, codes, false,
                    stream_);
    return codes;
  }
#ifdef MXTRAIN_HAVE_CUDNN
  // Runs call(b0, n, amax) over the batch's sequences, all at once or in groups (fp8 in
  // cudnn_in_groups); amax: where that call's cuDNN amaxes go. In groups, each group's are
  // folded (max) into the batch's, which start at 0 (amaxes are never negative).
  template <typename Call>
  void fp8_attention_groups(Fp8AttentionScales& sc, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t D, bool backward, const char* op, Call&& call) {
    const int n_amax = backward ? 4 : 2;
    sc.group_amax = scratch_.alloc_f32(16);  // before the groups: cudnn_in_groups counts it
    bool grouped = false;
    cudnn_in_groups(B, T, H, KV, D, backward, true, op, [&](int64_t b0, int64_t n) {
      if (n == B) return call(b0, n, sc.cudnn_amax);
      if (!grouped) {
        MX_CUDA_CHECK(op, cudaMemsetAsync(sc.cudnn_amax, 0, 16 * sizeof(float), stream_));
        grouped = true;
      }
      call(b0, n, sc.group_amax);
      cuda::max_into(sc.cudnn_amax, sc.group_amax, n_amax, 4, stream_);
    });
  }
#endif
  float head_fp8_grad_amax() override {
    float a = 0.0f;
    if (!head_amax_dev_) return a;
    MX_CUDA_CHECK("head_fp8_grad_amax",
                  cudaMemcpyAsync(&a, head_amax_dev_, sizeof a, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK("head_fp8_grad_amax", cudaStreamSynchronize(stream_));
    return a;
  }
  numerics::AttnFp8Amax attention_fp8_amax() override {
    numerics::AttnFp8Amax a;
    if (!attn_amax_dev_) return a;
    float h[kAttnAmaxFloats];
    MX_CUDA_CHECK("attention_fp8_amax",
                  cudaMemcpyAsync(h, attn_amax_dev_, sizeof h, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK("attention_fp8_amax", cudaStreamSynchronize(stream_));
    // forward: ours q, k, v at 0..2, cuDNN's P, O at 16, 20; backward: ours at 32..35 (q, k,
    // v, dO), cuDNN's dQ, dK, dV, dP at 48, 52, 56, 60 (the fp32 kernel's likewise). cuDNN's
    // dP is attn_scale dS (it scales before its amax; the kAttnCudnn*DP slots): reported as
    // dS's, as the kernel's and the CPU twin's are.
    a.q = h[0], a.k = h[1], a.v = h[2], a.p = h[16], a.o = h[20];
    a.dO = h[35], a.dQ = h[48], a.dK = h[52], a.dV = h[56], a.dS = h[60] * ds_amax_factor_;
    return a;
  }
  // Both forms of each direction: In is float (fp32 values) or uint16_t (bf16 codes), which
  // abs_max and fp8_codes read as they are; Out likewise for the decoded outputs.
  template <class Out, class In>
  void fp8_attention_forward(Out* out, float* lse, const In* q, const In* k, const In* v,
                             int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             const char* op) {
    const std::string why = attention_fp8_problem(B, T, H, KV, D);
    MX_REQUIRE(why.empty(), op, ": ", why);
    if (B == 0 || T == 0) return done(op);
    namespace nm = numerics;
    const int64_t sq = T * H * D, sk = T * KV * D;
    DeviceArenaScope scope(scratch_);
    Fp8AttentionScales sc = fp8_attention_scales<In>(q, k, v, nullptr, B, T, H, KV, D, op);
    const float* slots = sc.slots;
    const nm::Format e4 = nm::Format::kE4M3;
#ifdef MXTRAIN_HAVE_CUDNN
    if (fp8_on_cudnn(B, T, H, KV, D)) {
      fp8_attention_groups(sc, B, T, H, KV, D, false, op,
                           [&](int64_t b0, int64_t n, float* amax) {
        DeviceArenaScope group(scratch_);
        const auto [q8, k8, v8] = fp8_qkv_codes(q, k, v, b0, n, sq, sk, D, slots);
        uint8_t* o8 = scratch_.alloc_as<uint8_t>(n * sq);
        cudnn().forward_fp8(o8, lse + b0 * H * T, q8, k8, v8, slots, amax, n, T, H, KV, D,
                            scratch_);
        cuda::fp8_decode(o8, n * sq, e4, fp8_slot(slots, nm::kAttnDescaleO), out + b0 * sq,
                         stream_);
      });
      return done(op);
    }
#endif
    // The fp32 kernel: q, k, v as FP8 values, P rounded inside (its max into P's amax), the
    // output's amax and then its rounding at O's scale. Per sequence: three values and their
    // codes, the output and its codes.
    float* amax = sc.cudnn_amax;  // P at 0, O at 4
    sc.group_amax = scratch_.alloc_f32(4);  // fold_abs_max's
    MX_CUDA_CHECK(op, cudaMemsetAsync(amax, 0, 16 * sizeof(float), stream_));
    in_sequence_groups(B, 10 * (sq + sk) + 12 * int64_t(DeviceArena::kAlign) + kAbsMaxSlack, op,
                       [&](int64_t b0, int64_t n) {
      const float* qv = fp8_values(q + b0 * sq, n * sq, D, e4, slots, nm::kAttnScaleQ);
      const float* kv = fp8_values(k + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleK);
      const float* vv = fp8_values(v + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleV);
      float* o = scratch_.alloc_f32(n * sq);
      cuda::attention_forward(o, lse + b0 * H * T, qv, kv, vv, n, T, H, KV, D, stream_,
                              {slots, amax});
      fold_abs_max(amax + 4, o, n * sq, sc.group_amax);
      fp8_round_into(out + b0 * sq, o, n * sq, D, e4, slots, nm::kAttnScaleO);
    });
    done(op);
  }
  template <class Out, class In>
  void fp8_attention_backward(Out* dq, Out* dk, Out* dv, const In* dout, const In* q,
                              const In* k, const In* v, const In* out, const float* lse,
                              int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                              const char* op) {
    const std::string why = attention_fp8_problem(B, T, H, KV, D);
    MX_REQUIRE(why.empty(), op, ": ", why);
    if (B == 0 || T == 0) return done(op);
    namespace nm = numerics;
    const int64_t sq = T * H * D, sk = T * KV * D;
    DeviceArenaScope scope(scratch_);
    Fp8AttentionScales sc = fp8_attention_scales<In>(q, k, v, dout, B, T, H, KV, D, op);
    const float* slots = sc.slots;
    const nm::Format e4 = nm::Format::kE4M3, e5 = nm::Format::kE5M2;
#ifdef MXTRAIN_HAVE_CUDNN
    if (fp8_on_cudnn(B, T, H, KV, D)) {
      fp8_attention_groups(sc, B, T, H, KV, D, true, op,
                           [&](int64_t b0, int64_t n, float* amax) {
        DeviceArenaScope group(scratch_);
        const auto [q8, k8, v8] = fp8_qkv_codes(q, k, v, b0, n, sq, sk, D, slots);
        const uint8_t* o8 =
            fp8_attention_cast(out + b0 * sq, n * sq, D, e4, slots, nm::kAttnScaleO);
        const uint8_t* do8 =
            fp8_attention_cast(dout + b0 * sq, n * sq, D, e5, slots, nm::kAttnScaleDO);
        uint8_t* dq8 = scratch_.alloc_as<uint8_t>(n * sq);
        uint8_t* dk8 = scratch_.alloc_as<uint8_t>(n * sk);
        uint8_t* dv8 = scratch_.alloc_as<uint8_t>(n * sk);
        cudnn().backward_fp8(dq8, dk8, dv8, do8, q8, k8, v8, o8, lse + b0 * H * T, slots, amax,
                             n, T, H, KV, D, scratch_);
        cuda::fp8_decode(dq8, n * sq, e5, fp8_slot(slots, nm::kAttnDescaleDQ), dq + b0 * sq,
                         stream_);
        cuda::fp8_decode(dk8, n * sk, e5, fp8_slot(slots, nm::kAttnDescaleDK), dk + b0 * sk,
                         stream_);
        cuda::fp8_decode(dv8, n * sk, e5, fp8_slot(slots, nm::kAttnDescaleDV), dv + b0 * sk,
                         stream_);
      });
      ds_amax_factor_ = std::sqrt(float(D));  // (cuDNN's amax is of attn_scale dS)
      return done(op);
    }
#endif
    ds_amax_factor_ = 1.0f;
    // The fp32 kernel on q, k, v, out and dout as FP8 values, dS rounded inside (its max into
    // dS's amax), then the gradients' amaxes and their rounding. Per sequence: five values and
    // their codes, three gradients and their codes, the kernel's row dots.
    float* amax = sc.cudnn_amax;  // dQ, dK, dV at 0, 4, 8; dS at 12
    sc.group_amax = scratch_.alloc_f32(4);  // fold_abs_max's
    MX_CUDA_CHECK(op, cudaMemsetAsync(amax, 0, 16 * sizeof(float), stream_));
    in_sequence_groups(B, 20 * (sq + sk) + 4 * H * T + 20 * int64_t(DeviceArena::kAlign) +
                              kAbsMaxSlack, op, [&](int64_t b0, int64_t n) {
      const float* qv = fp8_values(q + b0 * sq, n * sq, D, e4, slots, nm::kAttnScaleQ);
      const float* kv = fp8_values(k + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleK);
      const float* vv = fp8_values(v + b0 * sk, n * sk, D, e4, slots, nm::kAttnScaleV);
      const float* ov = fp8_values(out + b0 * sq, n * sq, D, e4, slots, nm::kAttnScaleO);
      const float* dov = fp8_values(dout + b0 * sq, n * sq, D, e5, slots, nm::kAttnScaleDO);
      float* gq = scratch_.alloc_f32(n * sq);
      float* gk = scratch_.alloc_f32(n * sk);
      float* gv = scratch_.alloc_f32(n * sk);
      cuda::attention_backward(gq, gk, gv, dov, qv, kv, vv, ov, lse + b0 * H * T, n, T, H, KV, D,
                               scratch_, stream_, {slots, amax + 12});
      fold_abs_max(amax + 0, gq, n * sq, sc.group_amax);
      fold_abs_max(amax + 4, gk, n * sk, sc.group_amax);
      fold_abs_max(amax + 8, gv, n * sk, sc.group_amax);
      fp8_round_into(dq + b0 * sq, gq, n * sq, D, e5, slots, nm::kAttnScaleDQ);
      fp8_round_into(dk + b0 * sk, gk, n * sk, D, e5, slots, nm::kAttnScaleDK);
      fp8_round_into(dv + b0 * sk, gv, n * sk, D, e5, slots, nm::kAttnScaleDV);
    });
    done(op);
  }
  // The FP8 kernel path's helpers, in scratch (the caller's scope). A slot's device pointer;
  // x (n values, rows of D) as the FP8 values of format f at slot s's scale (codes, decoded);
  // dst = x rounded so (codes, decoded into dst's type); dst = max(dst, max |x|) (via tmp).
  static const float* fp8_slot(const float* slots, numerics::AttnFp8Slot s) {
    return slots + s * numerics::kAttnFp8SlotFloats;
  }
  static constexpr int64_t kAbsMaxSlack = 64 * 1024;  // abs_max's partials, a group's worth
  template <class In>
  float* fp8_values(const In* x, int64_t n, int64_t D, numerics::Format f, const float* slots,
                    numerics::AttnFp8Slot s) {
    const uint8_t* codes = fp8_attention_cast(x, n, D, f, slots, s);
    float* values = scratch_.alloc_f32(n);
    cuda::fp8_decode(codes, n, f, fp8_slot(slots, numerics::AttnFp8Slot(s + 5)), values, stream_);
    return values;
  }
  template <class Out>
  void fp8_round_into(Out* dst, const float* x, int64_t n, int64_t D, numerics::Format f,
                      const float* slots, numerics::AttnFp8Slot s) {
    DeviceArenaScope scope(scratch_);
    const uint8_t* codes = fp8_attention_cast(x, n, D, f, slots, s);
    cuda::fp8_decode(codes, n, f, fp8_slot(slots, numerics::AttnFp8Slot(s + 5)), dst, stream_);
  }
  void fold_abs_max(float* dst, const float* x, int64_t n, float* tmp) {
    cuda::abs_max(tmp, x, n, scratch_, stream_);
    cuda::max_into(dst, tmp, 1, 1, stream_);
  }
  // The bf16 path's attention: on cuDNN the codes go in and out as they are (dout rounded,
  // dq / dk / dv widened, as attention_backward does); on the fp32 kernel q, k, v (and out) are
  // widened into scratch and the output rounded into out16 (the CPU twin's steps).
  void attention_forward_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                              const uint16_t* k16, const uint16_t* v16, int64_t B, int64_t T,
                              int64_t H, int64_t KV, int64_t D) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (use_cudnn(B, T, H, KV, D)) {
      using A = cuda::CudnnAttention;
      const int64_t sq = T * H * D, sk = T * KV * D;
      cudnn_in_groups(B, T, H, KV, D, false, false, "attention_forward_bf16",
                      [&](int64_t b0, int64_t n) {
        cudnn_->forward(A::Out::bf16(out16 + b0 * sq), lse + b0 * H * T,
                        A::In::bf16(q16 + b0 * sq), A::In::bf16(k16 + b0 * sk),
                        A::In::bf16(v16 + b0 * sk), n, T, H, KV, D, scratch_,
                        "attention_forward_bf16");
      });
      return done("attention_forward_bf16");
    }
#endif
    // The fp32 kernel, a group of sequences at a time (attention is per sequence): their
    // widened q, k, v and output in the scratch arena, which the model's arenas do not size.
    const int64_t sq = T * H * D, sk = T * KV * D;  // elements per sequence
    in_sequence_groups(B, 4 * (2 * sq + 2 * sk), "attention_forward_bf16",
                       [&](int64_t b0, int64_t n) {
                         float* q = widened(q16 + b0 * sq, n * sq);
                         float* k = widened(k16 + b0 * sk, n * sk);
                         float* v = widened(v16 + b0 * sk, n * sk);
                         float* out = scratch_.alloc_f32(n * sq);
                         cuda::attention_forward(out, lse + b0 * H * T, q, k, v, n, T, H, KV, D,
                                                 stream_);
                         cuda::round_to_bf16(out16 + b0 * sq, out, n * sq, stream_);
                       });
    done("attention_forward_bf16");
  }
  void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                               const uint16_t* q16, const uint16_t* k16, const uint16_t* v16,
                               const uint16_t* out16, const float* lse, int64_t B, int64_t T,
                               int64_t H, int64_t KV, int64_t D) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (use_cudnn(B, T, H, KV, D)) {
      cudnn_backward_codes_in(dq, dk, dv, dout, q16, k16, v16, out16, lse, B, T, H, KV, D,
                              "attention_backward_bf16");
      return done("attention_backward_bf16");
    }
#endif
    // As in the forward, plus the kernel's row dots (H x T per sequence).
    const int64_t sq = T * H * D, sk = T * KV * D;
    in_sequence_groups(B, 4 * (2 * sq + 2 * sk + H * T), "attention_backward_bf16",
                       [&](int64_t b0, int64_t n) {
                         float* q = widened(q16 + b0 * sq, n * sq);
                         float* k = widened(k16 + b0 * sk, n * sk);
                         float* v = widened(v16 + b0 * sk, n * sk);
                         float* out = widened(out16 + b0 * sq, n * sq);
                         cuda::attention_backward(dq + b0 * sq, dk + b0 * sk, dv + b0 * sk,
                                                  dout + b0 * sq, q, k, v, out, lse + b0 * H * T,
                                                  n, T, H, KV, D, scratch_, stream_);
                       });
    done("attention_backward_bf16");
  }
  void attention_backward_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                const uint16_t* dout16, const uint16_t* q16, const uint16_t* k16,
                                const uint16_t* v16, const uint16_t* out16, const float* lse,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    const int64_t sq = T * H * D, sk = T * KV * D;
#ifdef MXTRAIN_HAVE_CUDNN
    if (use_cudnn(B, T, H, KV, D)) {  // cuDNN reads and writes the codes as they are
      cudnn_backward_codes_in(dq16, dk16, dv16, dout16, q16, k16, v16, out16, lse, B, T, H, KV,
                              D, "attention_backward_codes");
      return done("attention_backward_codes");
    }
#endif
    // The fp32 kernel a group of sequences at a time, as attention_backward_bf16, with dout
    // widened and the gradients rounded around it in the same scratch: nine allocations a
    // group (five widened operands, three gradients, the kernel's row dots), four more than
    // in_sequence_groups' slack allows for (their rounding counted per sequence, 5 for room).
    in_sequence_groups(B, 4 * (4 * sq + 4 * sk + H * T) + 5 * int64_t(DeviceArena::kAlign),
                       "attention_backward_codes",
                       [&](int64_t b0, int64_t n) {
                         float* q = widened(q16 + b0 * sq, n * sq);
                         float* k = widened(k16 + b0 * sk, n * sk);
                         float* v = widened(v16 + b0 * sk, n * sk);
                         float* out = widened(out16 + b0 * sq, n * sq);
                         float* dout = widened(dout16 + b0 * sq, n * sq);
                         float* dq = scratch_.alloc_f32(n * sq);
                         float* dk = scratch_.alloc_f32(n * sk);
                         float* dv = scratch_.alloc_f32(n * sk);
                         cuda::attention_backward(dq, dk, dv, dout, q, k, v, out,
                                                  lse + b0 * H * T, n, T, H, KV, D, scratch_,
                                                  stream_);
                         cuda::round_to_bf16(dq16 + b0 * sq, dq, n * sq, stream_);
                         cuda::round_to_bf16(dk16 + b0 * sk, dk, n * sk, stream_);
                         cuda::round_to_bf16(dv16 + b0 * sk, dv, n * sk, stream_);
                       });
    done("attention_backward_codes");
  }
  size_t cudnn_attention_fp8_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                           int64_t D, bool backward) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (B > 0 && T > 0 && cudnn().fp8_problem(cudnn_batch(B), T, H, KV, D).empty())
      return cudnn_need(cudnn_batch(B), T, H, KV, D, backward, true);
#else
    (void)B, (void)T, (void)H, (void)KV, (void)D, (void)backward;
#endif
    return 0;
  }
  void set_attention(CudaAttention a) override { opt_.attention = a; }
  size_t cudnn_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                                       bool backward) override {
#ifdef MXTRAIN_HAVE_CUDNN
    if (B > 0 && T > 0 && cudnn().problem(cudnn_batch(B), T, H, KV, D).empty())
      return cudnn_need(cudnn_batch(B), T, H, KV, D, backward);
#endif
    return 0;
  }
  std::string attention_path(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    if (opt_.attention == CudaAttention::kFp32) return "fp32 (MXTRAIN_CUDA_ATTENTION=fp32)";
#ifdef MXTRAIN_HAVE_CUDNN
    if (B == 0 || T == 0) return "fp32 (empty shape)";
    const std::string& why = cudnn().problem(cudnn_batch(B), T, H, KV, D);
    return why.empty() ? "cudnn" : "fp32 (" + why + ")";
#else
    return "fp32 (built without cuDNN attention: no cudnn-frontend headers at build time)";
#endif
  }
  void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                        int64_t T_ctx, int64_t H, int64_t KV, int64_t D) override {
    cuda::attention_decode(out, q, k_cache, v_cache, T_ctx, H, KV, D, stream_);
    done("attention_decode");
  }

  void swiglu_forward(float* s, const float* g, const float* u, int64_t n) override {
    if (n == 0) return;
    swiglu_forward_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(s, g, u, n);
    launched("swiglu_forward");
  }
  void swiglu_backward(float* dg, float* du, const float* ds, const float* g, const float* u,
                       int64_t n) override {
    if (n == 0) return;
    swiglu_backward_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(dg, du, ds, g, u, n);
    launched("swiglu_backward");
  }
  void swiglu_forward_bf16(uint16_t* s16, const uint16_t* g16, const uint16_t* u16,
                           int64_t n) override {
    if (n == 0) return;
    const bool vec = all_16_aligned({s16, g16, u16});
    swiglu_forward_bf16_kernel<<<grid_1d(vec ? (n + 3) / 4 : n), kThreads, 0, stream_>>>(
        s16, g16, u16, n, vec);
    launched("swiglu_forward_bf16");
  }
  void swiglu_backward_bf16(uint16_t* dg16, uint16_t* du16, const uint16_t* ds16,
                            const uint16_t* g16, const uint16_t* u16, int64_t n) override {
    swiglu_backward_from_codes(dg16, du16, ds16, g16, u16, n, "swiglu_backward_bf16");
  }
  void swiglu_backward_codes(float* dg, float* du, const float* ds, const uint16_t* g16,
                             const uint16_t* u16, int64_t n) override {
    swiglu_backward_from_codes(dg, du, ds, g16, u16, n, "swiglu_backward_codes");
  }
  void swiglu_backward_bf16_fused(uint16_t* dgu16, const uint16_t* ds16, const uint16_t* g16,
                                  const uint16_t* u16, int64_t rows, int64_t cols) override {
    if (rows == 0 || cols == 0) return;
    const bool vec = cols % 4 == 0 && all_aligned(8, {dgu16, ds16, g16, u16});
    swiglu_backward_fused_kernel<<<unsigned(std::min<int64_t>(rows, 1 << 16)), kThreads, 0,
                                   stream_>>>(dgu16, ds16, g16, u16, rows, cols, vec);
    launched("swiglu_backward_bf16");
  }
  // Both: swiglu_backward_codes_kernel, ds, dg and du as codes or fp32.
  template <typename Out, typename Dy>
  void swiglu_backward_from_codes(Out* dg, Out* du, const Dy* ds, const uint16_t* g16,
                                  const uint16_t* u16, int64_t n, const char* op) {
    if (n == 0) return;
    const bool vec = all_16_aligned({dg, du, ds, g16, u16});
    swiglu_backward_codes_kernel<<<grid_1d(vec ? (n + 3) / 4 : n), kThreads, 0, stream_>>>(
        dg, du, ds, g16, u16, n, vec);
    launched(op);
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t N,
                         int64_t C) override {
    if (N * C == 0) return;
    embedding_forward_kernel<<<grid_1d(N * C), kThreads, 0, stream_>>>(out, tokens, table, N, C);
    launched("embedding_forward");
  }
  void embedding_backward(float* dtable, const int32_t* tokens, const float* dout, int64_t N,
                          int64_t C) override {
    if (N * C == 0) return;
    MX_ASSERT(N <= int64_t(INT32_MAX) && (C + kThreads - 1) / kThreads <= 65535,
              "embedding_backward: N ", N, ", C ", C);
    DeviceArenaScope scope(scratch_);
    int32_t* positions = scratch_.alloc_as<int32_t>(N);
    int32_t* sorted_tokens = scratch_.alloc_as<int32_t>(N);
    int32_t* sorted_positions = scratch_.alloc_as<int32_t>(N);
    iota_kernel<<<grid_1d(N), kThreads, 0, stream_>>>(positions, N);
    launched("embedding_backward (positions)");
    size_t temp_bytes = 0;
    MX_CUDA_CHECK("embedding_backward sort size",
                  cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, sorted_tokens,
                                                  positions, sorted_positions, int(N), 0, 32,
                                                  stream_));
    void* temp = scratch_.alloc(std::max<size_t>(temp_bytes, 1));
    MX_CUDA_CHECK("embedding_backward sort",
                  cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens,
                                                  positions, sorted_positions, int(N), 0, 32,
                                                  stream_));
    const dim3 grid(unsigned(N), unsigned((C + kThreads - 1) / kThreads));
    embedding_backward_runs_kernel<<<grid, kThreads, 0, stream_>>>(
        dtable, sorted_tokens, sorted_positions, dout, N, C);
    launched("embedding_backward");
  }

  double head_cross_entropy(float* dh, float* dw, const float* h, const float* w,
                            const int32_t* targets, int64_t N, int64_t C, int64_t V,
                            float grad_scale, float* workspace, int64_t chunk_rows,
                            HeadOperands operands) override {
    if (N == 0) return 0.0;
    MX_ASSERT(chunk_rows > 0, "head_cross_entropy: chunk_rows ", chunk_rows);
    DeviceArenaScope scope(scratch_);
    double* row_loss = scratch_.alloc_as<double>(N);
    if (operands == HeadOperands::kBf16) {
      head_bf16(dh, dw, h, w, targets, N, C, V, grad_scale, workspace, chunk_rows, row_loss);
      return fold_doubles(row_loss, N, "head_cross_entropy");
    }
    if (head_is_fp8(operands)) {
      head_fp8(dh, dw, h, w, targets, N, C, V, grad_scale, workspace, chunk_rows, row_loss,
               operands == HeadOperands::kFp8Bf16Dgrad);
      return fold_doubles(row_loss, N, "head_cross_entropy");
    }
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t R = std::min(chunk_rows, N - r0);
      linear_forward(workspace, h + r0 * C, w, R, C, V);  // logits [R, V]
      cross_entropy_rows_kernel<<<unsigned(R), kCeThreads, 0, stream_>>>(
          workspace, row_loss + r0, targets + r0, V, grad_scale, dh != nullptr, nullptr,
          ce_vec(workspace, V, nullptr));
      launched("head_cross_entropy");
      if (dh) linear_backward(dh + r0 * C, dw, workspace, h + r0 * C, w, R, C, V, false);
    }
    return fold_doubles(row_loss, N, "head_cross_entropy");
  }

  void round_bf16(float* y, const float* x, int64_t n) override {
    if (n == 0) return;
    round_bf16_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(y, x, n);
    launched("round_bf16");
  }

  void pack_bf16(float* x, uint16_t* codes, int64_t n) override {
    if (n == 0) return;
    pack_bf16_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(x, codes, n);
    launched("pack_bf16");
  }

  void unpack_bf16(float* x, const uint16_t* codes, int64_t n) override {
    if (n == 0) return;
    unpack_bf16_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(x, codes, n);
    launched("unpack_bf16");
  }

  void to_bf16(uint16_t* codes, const float* x, int64_t n) override {
    if (n == 0) return;
    cuda::round_to_bf16(codes, x, n, stream_);  // checks its launch
    done("to_bf16");
  }

  void add(float* y, const float* a, const float* b, int64_t n) override {
    if (n == 0) return;
    add_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(y, a, b, n);
    launched("add");
  }
  double sum_squares(const float* x, int64_t n) override {
    if (n == 0) return 0.0;
    DeviceArenaScope scope(scratch_);
    const bool vec = all_16_aligned({x});
    const unsigned blocks = grid_1d(vec ? (n + 3) / 4 : n);
    double* part = scratch_.alloc_as<double>(blocks);
    sum_squares_partial_kernel<<<blocks, kThreads, 0, stream_>>>(part, x, n, vec);
    launched("sum_squares");
    return fold_doubles(part, blocks, "sum_squares");
  }
  void scale(float* x, float s, int64_t n) override {
    if (n == 0) return;
    scale_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(x, s, n);
    launched("scale");
  }
  void fill(float* x, float value, int64_t n) override {
    if (n == 0) return;
    // +0 (every byte zero): the driver's memset, which writes at the copy engines' rate (the
    // step's zero_grads is 5 GB at 1.2B parameters); -0 and other values: the kernel.
    if (value == 0.0f && !std::signbit(value)) {
      MX_CUDA_CHECK("fill", cudaMemsetAsync(x, 0, sizeof(float) * size_t(n), stream_));
      done("fill");
      return;
    }
    fill_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(x, value, n);
    launched("fill");
  }
  void copy(float* dst, const float* src, int64_t n) override {
    if (n == 0) return;
    MX_CUDA_CHECK("copy", cudaMemcpyAsync(dst, src, sizeof(float) * size_t(n),
                                          cudaMemcpyDeviceToDevice, stream_));
    done("copy");
  }

  void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t t,
             float grad_scale, uint16_t* codes = nullptr) override {
    if (n == 0) return;
    // The step's scalars on the host, with the CPU backend's expressions (same float results).
    const float bc1 = 1.0f - std::pow(beta1, float(t));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, float(t)));
    const float step_size = lr / bc1;
    const float decay = 1.0f - lr * weight_decay;
    const bool vec = all_16_aligned({param, grad, m, v}) && all_aligned(8, {codes});
    adamw_kernel<<<grid_1d(vec ? (n + 3) / 4 : n), kThreads, 0, stream_>>>(
        param, grad, m, v, codes, n, beta1, beta2, eps, step_size, bc2_sqrt, decay, grad_scale,
        vec);
    launched("adamw");
  }

 private:
  // Runs before the scratch arena's cudaMalloc (member order): the device comes first.
  static std::string select_device(int device) {
    MX_CUDA_CHECK("make_cuda_backend", cudaSetDevice(device));
    return "cuda-scratch";
  }

  // head_cross_entropy with bf16 operands, in the workspace layout of backend.h's
  // head_workspace_floats: W's bf16 copy made once, then per chunk the h chunk's copy, the
  // logits GEMM, the cross-entropy kernel (which also writes the gradient's bf16 copy) and the
  // two backward GEMMs on bf16 operands.
  void head_bf16(float* dh, float* dw, const float* h, const float* w, const int32_t* targets,
                 int64_t N, int64_t C, int64_t V, float grad_scale, float* workspace,
                 int64_t chunk_rows, double* row_loss) {
    float* logits = workspace;
    auto* w16 = reinterpret_cast<uint16_t*>(workspace + head_operands_offset(chunk_rows, V));
    uint16_t* g16 = w16 + 2 * head_bf16_floats(V * C);
    uint16_t* h16 = g16 + 2 * head_bf16_floats(chunk_rows * V);
    cuda::round_to_bf16(w16, w, V * C, stream_);
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t R = std::min(chunk_rows, N - r0);
      cuda::round_to_bf16(h16, h + r0 * C, R * C, stream_);
      lt_.gemm_bf16(false, true, R, V, C, 1.0f, nullptr, h16, nullptr, w16, 0.0f, logits,
                    nullptr, ws, ws_bytes, scratch_, stream_);
      // (run.profile: each GEMM's time and FLOPs apart from the cross-entropy kernel's; the
      // first H200 profiles counted the logits GEMM's time in the kernel's row and its FLOPs
      // in the backward GEMMs')
      stats_.flops += 2.0 * double(R) * double(V) * double(C);
      done("head_cross_entropy (logits GEMM)");
      uint16_t* g = dh ? g16 : nullptr;
      cross_entropy_rows_kernel<<<unsigned(R), kCeThreads, 0, stream_>>>(
          logits, row_loss + r0, targets + r0, V, grad_scale, dh != nullptr, g,
          ce_vec(logits, V, g));
      launched("head_cross_entropy");
      if (!dh) continue;
      lt_.gemm_bf16(false, false, R, C, V, 1.0f, nullptr, g16, nullptr, w16, 0.0f, dh + r0 * C,
                    nullptr, ws, ws_bytes, scratch_, stream_);
      if (dw)  // (as linear_backward: no weight gradient asked for, none computed)
        lt_.gemm_bf16(true, false, V, C, R, 1.0f, nullptr, g16, nullptr, h16, 1.0f, dw, nullptr,
                      ws, ws_bytes, scratch_, stream_);
      stats_.flops += (dw ? 4.0 : 2.0) * double(R) * double(V) * double(C);
      done("head_cross_entropy (backward GEMMs)");
    }
  }

  // head_cross_entropy with FP8 operands (HeadOperands::kFp8): h's and W's scales from their
  // whole tensors' amaxes and the gradient's from its bound, on the device. With FP8 tensor
  // cores and every dimension a multiple of 16 (cuBLASLt's FP8 GEMMs; each of C, V and a
  // chunk's rows is some GEMM's reduction): codes in the workspace (W's in both layouts once,
  // the chunk's h in both from one read, the gradient's written by the cross-entropy kernel
  // and transposed) and three per-tensor FP8 GEMMs a chunk, fp32 out, each in the profile
  // under the head's name. Otherwise the CPU twin's steps: fp32 copies of the FP8 values
  // (fp8_round) and fp32 GEMMs. bf16_dgrad (HeadOperands::kFp8Bf16Dgrad): dh = g W from bf16
  // copies instead (W's made once a call, the gradient's by the cross-entropy kernel beside
  // its E5M2 codes; a bf16 GEMM, or round_bf16 and an fp32 GEMM on the twin's path), so W's
  // codes are needed row-major only.
  bool head_fp8_native(int64_t N, int64_t C, int64_t V, int64_t chunk_rows) const {
    return fp8_native_ && C % 16 == 0 && V % 16 == 0 && chunk_rows % 16 == 0 && N % 16 == 0;
  }
  void head_fp8(float* dh, float* dw, const float* h, const float* w, const int32_t* targets,
                int64_t N, int64_t C, int64_t V, float grad_scale, float* workspace,
                int64_t chunk_rows, double* row_loss, bool bf16_dgrad) {
    constexpr numerics::Format kE4M3 = numerics::Format::kE4M3, kE5M2 = numerics::Format::kE5M2;
    float* sc = scratch_.alloc_f32(8);
    float *amax_w = sc, *amax_h = sc + 1, *scale_w = sc + 2, *inv_w = sc + 3, *scale_h = sc + 4,
          *inv_h = sc + 5, *scale_g = sc + 6, *inv_g = sc + 7;
    cuda::abs_max(amax_w, w, V * C, scratch_, stream_);
    cuda::fp8_scales(scale_w, inv_w, amax_w, 0.0f, kE4M3, stream_);
    cuda::abs_max(amax_h, h, N * C, scratch_, stream_);
    cuda::fp8_scales(scale_h, inv_h, amax_h, 0.0f, kE4M3, stream_);
    const float g_scale_host = head_fp8_scale(std::fabs(grad_scale), kE5M2);
    cuda::fp8_scales(scale_g, inv_g, nullptr, g_scale_host, kE5M2, stream_);
    float* logits = workspace;
    // the gradient's amax over every chunk, for telemetry (head_fp8_grad_amax); the kernel's
    // atomic max costs a compare an element and one atomic a row
    float* g_amax = nullptr;
    if (dh) {
      if (!head_amax_dev_)
        MX_CUDA_CHECK("head_cross_entropy", cudaMalloc(&head_amax_dev_, sizeof(float)));
      MX_CUDA_CHECK("head_cross_entropy",
                    cudaMemsetAsync(head_amax_dev_, 0, sizeof(float), stream_));
      g_amax = head_amax_dev_;
    }
    if (!head_fp8_native(N, C, V, chunk_rows)) {  // the twin's steps on the device
      float* wq = workspace + head_operands_offset(chunk_rows, V);
      float* hq = wq + V * C;
      float* w16 = bf16_dgrad ? hq + chunk_rows * C : nullptr;  // (backend.h's CPU layout)
      float* g16 = bf16_dgrad ? w16 + V * C : nullptr;
      cuda::fp8_round(w, V * C, kE4M3, scale_w, inv_w, wq, stream_);
      launched("head_cross_entropy (FP8 values)");
      if (bf16_dgrad && dh) round_bf16(w16, w, V * C);
      for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
        const int64_t R = std::min(chunk_rows, N - r0);
        cuda::fp8_round(h + r0 * C, R * C, kE4M3, scale_h, inv_h, hq, stream_);
        linear_forward(logits, hq, wq, R, C, V);
        cross_entropy_rows_kernel<<<unsigned(R), kCeThreads, 0, stream_>>>(
            logits, row_loss + r0, targets + r0, V, grad_scale, dh != nullptr, nullptr,
            ce_vec(logits, V, nullptr), nullptr, 1.0f, g_amax);
        launched("head_cross_entropy");
        if (!dh) continue;
        if (bf16_dgrad) {
          round_bf16(g16, logits, R * V);
          linear_backward(dh + r0 * C, nullptr, g16, nullptr, w16, R, C, V, false);
        }
        cuda::fp8_round(logits, R * V, kE5M2, scale_g, inv_g, logits, stream_);
        launched("head_cross_entropy (FP8 values)");
        linear_backward(bf16_dgrad ? nullptr : dh + r0 * C, dw, logits, hq, wq, R, C, V, false);
      }
      return;
    }
    // codes: W [V, C] (the logits' K = C) and W^T [C, V] (dh's K = V; not with bf16_dgrad);
    // per chunk h [R, C] and h^T [C, R] (dW's K = R), the gradient g [R, V] and g^T [V, R];
    // with bf16_dgrad then W's and the chunk gradient's bf16 copies
    uint8_t* wc = reinterpret_cast<uint8_t*>(workspace + head_operands_offset(chunk_rows, V));
    uint8_t* wtc = bf16_dgrad ? nullptr : wc + 4 * head_fp8_floats(V * C);
    uint8_t* hc = wc + 4 * head_fp8_floats(V * C) * (bf16_dgrad ? 1 : 2);
    uint8_t* htc = hc + 4 * head_fp8_floats(chunk_rows * C);
    uint8_t* gc = htc + 4 * head_fp8_floats(chunk_rows * C);
    uint8_t* gtc = gc + 4 * head_fp8_floats(chunk_rows * V);
    auto* w16 = reinterpret_cast<uint16_t*>(gtc + 4 * head_fp8_floats(chunk_rows * V));
    uint16_t* g16 = w16 + 2 * head_bf16_floats(V * C);
    if (dh && !bf16_dgrad)
      cuda::fp8_codes_both(w, V, C, kE4M3, scale_w, wc, wtc, stream_);
    else
      cuda::fp8_codes(w, V, C, kE4M3, scale_w, wc, false, stream_);
    launched("head_cross_entropy (FP8 codes)");
    const size_t ws_bytes = bf16_dgrad ? opt_.gemm_workspace_bytes : 0;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    if (dh && bf16_dgrad) cuda::round_to_bf16(w16, w, V * C, stream_);
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      const int64_t R = std::min(chunk_rows, N - r0);
      if (dh && dw)
        cuda::fp8_codes_both(h + r0 * C, R, C, kE4M3, scale_h, hc, htc, stream_);
      else
        cuda::fp8_codes(h + r0 * C, R, C, kE4M3, scale_h, hc, false, stream_);
      launched("head_cross_entropy (FP8 codes)");
      tensor_fp8_gemm(R, V, C, hc, kE4M3, inv_h, wc, kE4M3, inv_w, 0.0f, logits, nullptr, nullptr,
                      "head_cross_entropy (logits FP8 GEMM)");
      // the gradient's row-major codes straight from the kernel (its scale is known on the
      // host: no fp32 gradient written and read back), then their transpose; with bf16_dgrad
      // its bf16 copy from the same pass
      uint16_t* g = dh && bf16_dgrad ? g16 : nullptr;
      cross_entropy_rows_kernel<<<unsigned(R), kCeThreads, 0, stream_>>>(
          logits, row_loss + r0, targets + r0, V, grad_scale, dh != nullptr, g,
          ce_vec(logits, V, g, gc), gc, g_scale_host, g_amax);
      launched("head_cross_entropy");
      if (!dh) continue;
      if (dw) {
        cuda::transpose_bytes(gc, R, V, gtc, stream_);
        launched("head_cross_entropy (gradient codes transposed)");
      }
      if (bf16_dgrad) {
        lt_.gemm_bf16(false, false, R, C, V, 1.0f, nullptr, g16, nullptr, w16, 0.0f, dh + r0 * C,
                      nullptr, ws, ws_bytes, scratch_, stream_);
        stats_.flops += 2.0 * double(R) * double(V) * double(C);
        done("head_cross_entropy (backward bf16 dgrad GEMM)");
      } else {
        tensor_fp8_gemm(R, C, V, gc, kE5M2, inv_g, wtc, kE4M3, inv_w, 0.0f, dh + r0 * C, nullptr,
                        nullptr, "head_cross_entropy (backward FP8 GEMMs)");
      }
      if (dw)  // (as linear_backward: no weight gradient asked for, none computed)
        tensor_fp8_gemm(V, C, R, gtc, kE5M2, inv_g, htc, kE4M3, inv_h, 1.0f, dw, nullptr, nullptr,
                        "head_cross_entropy (backward FP8 GEMMs)");
    }
  }

  template <typename Out, typename In>
  void rope(Out* y, const In* x, const float* cos, const float* sin, int64_t B, int64_t T,
            int64_t heads, int64_t D, float sign, const char* op, int64_t ld = 0) {
    const int64_t n = B * T * heads * (D / 2);
    if (n == 0) return;
    rope_kernel<<<grid_1d(n), kThreads, 0, stream_>>>(y, x, cos, sin, B, T, heads, D, sign,
                                                      ld ? ld : heads * D);
    launched(op);
  }

  // body(b0, n) for the B sequences in groups [b0, b0 + n), each group as many sequences of
  // per_sequence bytes as the scratch arena has room for now, its allocations released after
  // it (the bf16 path's fp32-attention fallback widens its operands there, FP8 attention on
  // the fp32 kernel its FP8 values). An error naming
  // MXTRAIN_CUDA_SCRATCH_MB when not even one sequence fits.
  template <typename Body>
  void in_sequence_groups(int64_t B, int64_t per_sequence, const char* op, Body&& body) {
    const size_t slack = 5 * DeviceArena::kAlign;  // each allocation's rounding
    const size_t left = scratch_.capacity() - scratch_.used();
    const int64_t g = left > slack ? int64_t((left - slack) / size_t(per_sequence)) : 0;
    MX_REQUIRE(g >= 1, op, ": the fp32 attention kernel needs ", per_sequence,
               " bytes of CUDA scratch per sequence and ", left, " are free; raise "
               "MXTRAIN_CUDA_SCRATCH_MB (now ", scratch_.capacity() >> 20,
               ") or run cuDNN attention (MXTRAIN_CUDA_ATTENTION=cudnn)");
    for (int64_t b0 = 0; b0 < B; b0 += g) {
      DeviceArenaScope scope(scratch_);
      body(b0, std::min(g, B - b0));
    }
  }

  // n fp32 values widened from codes into scratch (the caller's scope).
  float* widened(const uint16_t* codes, int64_t n) {
    float* x = scratch_.alloc_f32(n);
    cuda::widen_bf16(x, codes, n, stream_);  // checks its launch
    return x;
  }

  // Sums n doubles on the device in a fixed order and returns the result (synchronizes).
  double fold_doubles(const double* x, int64_t n, const char* op) {
    double* out = scratch_.alloc_as<double>(1);
    sum_doubles_kernel<<<1, 1024, 0, stream_>>>(out, x, n);
    launched(op);
    double host = 0;
    MX_CUDA_CHECK(op, cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK(op, cudaStreamSynchronize(stream_));
    return host;
  }

#ifdef MXTRAIN_HAVE_CUDNN
  cuda::CudnnAttention& cudnn() {
    if (!cudnn_) {
      cudnn_ = std::make_unique<cuda::CudnnAttention>(stream_);
      if (deterministic_) cudnn_->set_deterministic(true);
    }
    return *cudnn_;
  }
  bool use_cudnn(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
    return opt_.attention == CudaAttention::kCudnn && B > 0 && T > 0 &&
           cudnn().problem(cudnn_batch(B), T, H, KV, D).empty();
  }
  // call(b0, n) for cuDNN's attention over sequences [b0, b0 + n): all B at once where the
  // shape's bf16 copies and workspace fit in the scratch arena's free bytes (the usual case),
  // else in groups of half as many, and half again (each group size's graphs are built and
  // cached like any shape's). The bytes are those of fp32 operands (CudnnAttention's
  // *_scratch_bytes), an upper bound for the bf16 path's, which copies less. An error naming
  // MXTRAIN_CUDA_SCRATCH_MB when one sequence does not fit: before, the arena's own "full"
  // error came out of the middle of cuDNN's setup.
  // FP8 attention (fp8): the group's codes (q, k, v, o; backward also do, dq, dk, dv: the
  // casts and outputs of fp8_attention_forward / _backward) and cuDNN's FP8 workspace.
  size_t cudnn_need(int64_t n, int64_t T, int64_t H, int64_t KV, int64_t D, bool backward,
                    bool fp8 = false) {
    const size_t slack = 8 * DeviceArena::kAlign;  // the copies' rounding
    if (fp8) {
      const size_t cq = DeviceArena::round_up(size_t(n * T * H * D)),
                   ck = DeviceArena::round_up(size_t(n * T * KV * D));
      return (backward ? 4 : 2) * (cq + ck) +
             cudnn().fp8_workspace_bytes(n, T, H, KV, D, backward) + slack;
    }
    return (backward ? cudnn().backward_scratch_bytes(n, T, H, KV, D)
                     : cudnn().forward_scratch_bytes(n, T, H, KV, D)) + slack;
  }
  template <typename Call>
  void cudnn_in_groups(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, bool backward,
                       bool fp8, const char* op, Call&& call) {
    const size_t left = scratch_.capacity() - scratch_.used();
    auto need = [&](int64_t n) { return cudnn_need(n, T, H, KV, D, backward, fp8); };
    // At most kCudnnMaxSequences a call, and groups of a multiple of cudnn_group_multiple
    // sequences (the statistics' alignment: the frontend's sdpa_support_surface.h, wrong
    // output on sm_90 / sm_100 otherwise).
    const int64_t g = cudnn_group_sequences(B, T, H, left, need);
    MX_REQUIRE(g > 0, op, ": cuDNN attention in groups needs ", cudnn_group_multiple(H, T),
               " sequences of ", T,
               " tokens at a time (their statistics' alignment) and the CUDA scratch has room "
               "for fewer (", left, " bytes free); raise MXTRAIN_CUDA_SCRATCH_MB (now ",
               scratch_.capacity() >> 20, ")");
    for (const int64_t n : {g, B % g}) {  // the groups' size, and the last one's if smaller
      if (n == 0) continue;
      const std::string& why =
          fp8 ? cudnn().fp8_problem(n, T, H, KV, D) : cudnn().problem(n, T, H, KV, D);
      MX_REQUIRE(why.empty(), op, ": cuDNN attention in groups of ", n, " sequences: ", why);
      MX_REQUIRE(need(n) <= left, op, ": cuDNN attention needs ", need(n), " bytes of CUDA "
                 "scratch for ", n, " sequence(s) of ", T, " tokens and ", left, " are free; "
                 "raise MXTRAIN_CUDA_SCRATCH_MB (now ", scratch_.capacity() >> 20, ")");
    }
    for (int64_t b0 = 0; b0 < B; b0 += g) call(b0, std::min(g, B - b0));
  }
  // cuDNN's backward on q, k, v and out as codes, in groups of sequences; dq, dk, dv (G) and
  // dout (O) in fp32 or as codes (float or uint16_t: CudnnAttention's Out / In forms).
  static cuda::CudnnAttention::Out cudnn_out(float* p) { return cuda::CudnnAttention::Out::fp32(p); }
  static cuda::CudnnAttention::Out cudnn_out(uint16_t* p) { return cuda::CudnnAttention::Out::bf16(p); }
  static cuda::CudnnAttention::In cudnn_in(const float* p) { return cuda::CudnnAttention::In::fp32(p); }
  static cuda::CudnnAttention::In cudnn_in(const uint16_t* p) { return cuda::CudnnAttention::In::bf16(p); }
  template <typename G, typename O>
  void cudnn_backward_codes_in(G* dq, G* dk, G* dv, const O* dout, const uint16_t* q16,
                               const uint16_t* k16, const uint16_t* v16, const uint16_t* out16,
                               const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t D, const char* op) {
    const int64_t sq = T * H * D, sk = T * KV * D;
    cudnn_in_groups(B, T, H, KV, D, true, false, op, [&](int64_t b0, int64_t n) {
      cudnn_->backward(cudnn_out(dq + b0 * sq), cudnn_out(dk + b0 * sk), cudnn_out(dv + b0 * sk),
                       cudnn_in(dout + b0 * sq), cudnn_in(q16 + b0 * sq), cudnn_in(k16 + b0 * sk),
                       cudnn_in(v16 + b0 * sk), cudnn_in(out16 + b0 * sq), lse + b0 * H * T, n,
                       T, H, KV, D, scratch_, op);
    });
  }
#endif

  void launched(const char* op) {
    MX_CUDA_LAUNCH_CHECK(op);
    done(op);
  }
  void done(const char* op) {
    if (opt_.sync_after_each_op) MX_CUDA_CHECK(op, cudaStreamSynchronize(stream_));
    if (profiling_) profile_mark(op);
  }

  // run.profile's bookkeeping: events recorded, not yet read (oldest first), and a pool.
  struct PendingEvent {
    std::string op;
    cudaEvent_t ev;
    double flops;  // stats_.flops when recorded
  };
  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    MX_CUDA_CHECK("profile", cudaEventCreate(&e));
    return e;
  }
  void profile_mark(const char* op) {
    cudaEvent_t ev = take_event();
    MX_CUDA_CHECK(op, cudaEventRecord(ev, stream_));
    pending_.push_back({op, ev, stats_.flops});
    if (pending_.size() >= 256) resolve_events(false);  // read what has run, without waiting
  }
  // Charges each pending op the time from the previous event to its own, oldest first; wait:
  // for all of them, else only those already reached (cudaEventQuery).
  void resolve_events(bool wait) {
    while (!pending_.empty()) {
      const PendingEvent& p = pending_.front();
      if (wait) {
        MX_CUDA_CHECK("profile", cudaEventSynchronize(p.ev));
      } else {
        const cudaError_t q = cudaEventQuery(p.ev);
        if (q == cudaErrorNotReady) {
          (void)cudaGetLastError();  // "not ready" is no error: do not leave it for a check
          break;
        }
        MX_CUDA_CHECK("profile", q);
      }
      float ms = 0;
      if (last_event_) MX_CUDA_CHECK("profile", cudaEventElapsedTime(&ms, last_event_, p.ev));
      profile_.add(p.op, double(ms) / 1e3, p.flops - last_flops_);
      if (last_event_) free_events_.push_back(last_event_);
      last_event_ = p.ev;
      last_flops_ = p.flops;
      pending_.pop_front();
    }
  }

  // Arena memory (core/arena.h) in device memory; zeroing is queued on the backend's stream, so
  // it is ordered before every op that later uses the buffer.
  struct DeviceMemory final : MemoryResource {
    CudaBackendImpl* be = nullptr;
    void* allocate(size_t bytes, const std::string& arena) override {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess)
        throw_out_of_gpu_memory(arena, bytes,
                                "try a smaller train.micro_batch or seq_len, or "
                                "memory.activation_checkpointing = full; `mxtrain plan` sizes it");
      count_allocate(p, bytes);
      return p;
    }
    void deallocate(void* p) override {
      if (be->stream_) cudaStreamSynchronize(be->stream_);  // no kernel may still use it
      count_deallocate(p);
      cudaFree(p);
    }
    void zero(void* p, size_t bytes) override {
      MX_CUDA_CHECK("arena zero", cudaMemsetAsync(p, 0, bytes, be->stream_));
    }
    bool device_memory(int64_t* free_bytes, int64_t* total_bytes) const override {
      size_t f = 0, t = 0;
      if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      *free_bytes = int64_t(f);
      *total_bytes = int64_t(t);
      return true;
    }
  };

  static int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

  // One FP8 operand of a tensor-core Linear: codes into `codes` ([rows, cols], or [cols, rows]
  // when transposed); returns its decode scale (device, in scratch: the caller holds a scope).
  // codes_rows (transposed only): the row-major codes as well, from the same read of x.
  // The shared input's kept quantization (begin_shared_input) stands in where its key matches:
  // `codes` is then pointed at the kept codes (so it is a reference), and where this operand
  // is the first of the shared input, its codes and scales are written there and kept.
  template <class X>
  const float* fp8_operand(uint8_t*& codes, const X* x, int64_t rows, int64_t cols,
                           const Fp8Operand& q, bool transposed, uint8_t* codes_rows = nullptr) {
    if (q.codes_t) {  // x^T's codes as the forward saved them (Fp8Operand::codes_t)
      MX_REQUIRE(!codes_rows, "fp8_operand: saved codes stand for the transposed operand alone");
      take_codes_t(codes, q, transposed, "fp8_operand");
      return q.codes_t_scale_inv;
    }
    if (q.swiglu_g) return swiglu_operand(codes, rows, cols, q, transposed);
    // The forward's input with its transposed copy saved too (Fp8Operand::save_t): from the
    // same read as the row codes (a kept quantization has no copy to give: made afresh)
    const bool save = q.save_t && !transposed;
    Share s = codes_rows ? Share::kNone
                         : share_operand(x, rows, cols, q, transposed, sizeof(float));
    if (s == Share::kHit && save) s = Share::kNone;
    if (s == Share::kHit) return shared_hit<float>(codes, q.amax);
    const bool fill = s == Share::kFill;
    if (fill) codes = shared_codes_;
    float* scale = scratch_.alloc_f32(1);
    float* scale_inv = fill ? static_cast<float*>(shared_scales_) : scratch_.alloc_f32(1);
    float* amax = fill ? shared_amax_ : q.amax;  // kept: a later operand's slot takes it too
    // Current scaling needs the amax before the codes: a pass of its own, unless x's producer
    // took it (Fp8Operand::x_amax: then only the slots that keep it get a copy). Delayed
    // scaling's scale is given, so its amax (for the history) comes from the codes' own read.
    const float* scale_amax = nullptr;  // current scaling's
    if (q.current && q.x_amax) {
      if (amax) copy_amax(amax, q.x_amax);
      scale_amax = q.x_amax;
    } else if (q.current) {
      if (!amax) amax = scratch_.alloc_f32(1);
      cuda::abs_max(amax, x, rows * cols, scratch_, stream_);
      scale_amax = amax;
    }
    float* fused_amax = q.current ? nullptr : amax;
    cuda::fp8_scales(scale, scale_inv, scale_amax, q.scale, q.fmt, stream_);
    [&] {
      if (codes_rows) {
        MX_ASSERT(transposed, "fp8_operand: the row-major copy goes with the transposed codes");
        cuda::fp8_codes_both(x, rows, cols, q.fmt, scale, codes_rows, codes, stream_, fused_amax);
        launched("fp8_operand (both layouts)");
        return;
      }
      if (save) {
        MX_REQUIRE(q.save_t_scale_inv, "fp8_operand: saved codes need their scale's slot");
        cuda::fp8_codes_both(x, rows, cols, q.fmt, scale, codes, q.save_t, stream_, fused_amax);
        launched("fp8_operand (saving x^T)");
        return;
      }
      cuda::fp8_codes(x, rows, cols, q.fmt, scale, codes, transposed, stream_, fused_amax);
      launched("fp8_operand");
    }();
    if (save) copy_amax(q.save_t_scale_inv, scale_inv);  // (a float from device to device)
    if (fill) {
      if (q.amax) copy_amax(q.amax, shared_amax_);
      shared_kept(shared_key(x, rows, cols, q, transposed));
    }
    return scale_inv;
  }

  // The block recipes' forward input given as SwiGLU's operands (Fp8Operand::swiglu_g) where
  // they cannot be read as the fused kernels want: s's bf16 codes into scratch (the caller's
  // scope), as swiglu_forward_bf16 writes them.
  const uint16_t* swiglu_codes(const Fp8Operand& q, int64_t n) {
    uint16_t* s16 = scratch_.alloc_as<uint16_t>(n);
    swiglu_forward_bf16(s16, q.swiglu_g, q.swiglu_u, n);
    return s16;
  }

  // x^T's codes as the forward saved them (Fp8Operand::codes_t) for a transposed operand:
  // `codes` pointed at them (read only: a GEMM operand); the caller turns their scales
  // (codes_t_scale_inv) into the GEMM's.
  static void take_codes_t(uint8_t*& codes, const Fp8Operand& q, bool transposed,
                           const char* op) {
    MX_REQUIRE(transposed && q.codes_t_scale_inv, op,
               ": saved codes stand for a transposed operand, with their scales");
    codes = const_cast<uint8_t*>(q.codes_t);
  }

  // fp8_operand's form for the bf16 path's down-projection input given as SwiGLU's operands
  // (Fp8Operand::swiglu_g / swiglu_u): both layouts from one read of g and u, as fp8_operand
  // saving x^T writes them from s's codes (the same bytes, amax and scales). Never shared: s
  // feeds one Linear.
  const float* swiglu_operand(uint8_t* codes, int64_t rows, int64_t cols, const Fp8Operand& q,
                              bool transposed) {
    MX_REQUIRE(!transposed && q.per_tensor() && q.save_t && q.save_t_scale_inv && q.swiglu_u,
               "fp8_operand: SwiGLU's operands stand for a forward input whose x^T is saved");
    float* scale = scratch_.alloc_f32(1);
    float* scale_inv = scratch_.alloc_f32(1);
    float* amax = q.amax;
    if (!amax && q.current) amax = scratch_.alloc_f32(1);
    if (q.current) cuda::swiglu_abs_max(amax, q.swiglu_g, q.swiglu_u, rows * cols, stream_);
    cuda::fp8_scales(scale, scale_inv, q.current ? amax : nullptr, q.scale, q.fmt, stream_);
    cuda::fp8_codes_both_swiglu(q.swiglu_g, q.swiglu_u, rows, cols, q.fmt, scale, codes, q.save_t,
                                stream_, q.current ? nullptr : amax);
    launched("fp8_operand (SwiGLU's product, saving x^T)");
    copy_amax(q.save_t_scale_inv, scale_inv);
    return scale_inv;
  }

  // What an operand of x does with the shared input (Backend::share), where its kept scales
  // would take scale_bytes: kFill only where they fit the store.
  Share share_operand(const void* x, int64_t rows, int64_t cols, const Fp8Operand& q,
                      bool transposed, int64_t scale_bytes) {
    if (!shared_open_) return Share::kNone;
    const Share s = share(shared_key(x, rows, cols, q, transposed));
    return s == Share::kFill && size_t(scale_bytes) > shared_scale_room_ ? Share::kNone : s;
  }
  // The kept quantization: its codes into `codes`, its amax into the operand's slot (if any);
  // returns its scales.
  template <class S>
  const S* shared_hit(uint8_t*& codes, float* amax) {
    codes = shared_codes_;
    if (amax) copy_amax(amax, shared_amax_);
    return static_cast<const S*>(shared_scales_);
  }
  void copy_amax(float* dst, const float* src) {
    MX_CUDA_CHECK("shared input amax", cudaMemcpyAsync(dst, src, sizeof(float),
                                                       cudaMemcpyDeviceToDevice, stream_));
  }
  // The most bytes an operand of a rows x cols tensor, either way round, keeps as scales: the
  // largest of fp8-block's 1x128 float scales ([K/128, round4(R)]) and the swizzled scale
  // bytes of 1x32 (mxfp8) and 1x16 (nvfp4) blocks; a per-tensor scale and 128x128 blocks'
  // scales are smaller.
  static int64_t shared_scale_bound(int64_t rows, int64_t cols) {
    int64_t most = sizeof(float);
    for (auto [R, K] : {std::pair{rows, cols}, std::pair{cols, rows}}) {
      most = std::max(most, int64_t(sizeof(float)) * ((K + 127) / 128) * ((R + 3) / 4 * 4));
      most = std::max(most, numerics::swizzled_scale_bytes(R, (K + 15) / 16));
    }
    return most;
  }

  // fp8-block codes of x (or, transposed, of x^T) and its raw [sr, sc] block scales, power-of-
  // two. x^T's codes come straight from the tiles (quantize_fp8_block_t), not through a
  // temporary and a byte transpose: the H200 spent 0.35 s a step in fp8-block's operands so.
  // save (the forward's 1x128 input with Fp8Operand::save_t): x^T's 128x1 codes and raw scales
  // too, into save->save_t and save->save_t_scale_inv, from the same read
  // (quantize_fp8_block_both: the bytes quantize_fp8_block_t writes).
  template <class X>
  void fp8_block_codes(const X* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                       bool transposed, uint8_t* codes, float* raw,
                       const Fp8Operand* save = nullptr) {
    if (save) {
      MX_REQUIRE(!transposed && br == 1 && bc == 128 && save->save_t_scale_inv,
                 "fp8_block_operand: x^T's codes are saved from a 1x128 forward input, with "
                 "room for their scales");
      if (!save->swiglu_g)
        return cuda::quantize_fp8_block_both(x, rows, cols, true, codes, raw, save->save_t,
                                             save->save_t_scale_inv, stream_);
      // x is SwiGLU's product of these codes (Fp8Operand::swiglu_g): made as they are read
      const cuda::BlockOperands out{codes, raw, save->save_t, save->save_t_scale_inv};
      if (cols % 4 == 0 && all_aligned(8, {save->swiglu_g, save->swiglu_u}) &&
          all_aligned(4, {codes}))
        return cuda::swiglu_forward_fp8_block(save->swiglu_g, save->swiglu_u, rows, cols, true,
                                              out, stream_);
      const uint16_t* s16 = swiglu_codes(*save, rows * cols);  // (unaligned: not the model's)
      cuda::quantize_fp8_block_both(s16, rows, cols, true, codes, raw, save->save_t,
                                    save->save_t_scale_inv, stream_);
      return;
    }
    if (transposed)
      cuda::quantize_fp8_block_t(x, rows, cols, int(br), int(bc), true,
                                 numerics::RoundingOptions{}, codes, raw, stream_);
    else
      cuda::quantize_fp8_block(x, rows, cols, int(br), int(bc), true, numerics::RoundingOptions{},
                               codes, raw, nullptr, stream_);
  }

  // One fp8-block operand as the GEMM operand [R, K] (K-major): x itself (R = rows, K = cols)
  // or, transposed, x^T (R = cols, K = rows; written transposed as they are made: `tmp` is
  // unused since, kept for the callers' shared form with mxfp8_operand).
  // Returns its scales in cuBLASLt's layout (LtGemm::fp8_block_gemm; scratch, caller's scope).
  // (`codes`: a reference, as fp8_operand's, for the shared input, and for x^T's codes kept by
  // the forward, q.codes_t, which stand for the transposed operand; q.save_t: the forward's
  // input keeps them, as fp8_block_codes writes them.)
  template <class X>
  const float* fp8_block_operand(uint8_t*& codes, uint8_t* tmp, const X* x, int64_t rows,
                                 int64_t cols, const Fp8Operand& q, bool transposed) {
    const int64_t br = q.block_rows, bc = q.block_cols;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    const int64_t dst_floats = block_lt_scale_floats(rows, cols, q, transposed);
    if (q.codes_t) {
      take_codes_t(codes, q, transposed, "fp8_block_operand");
      float* dst = scratch_.alloc_f32(dst_floats);
      block_lt_scales(q.codes_t_scale_inv, rows, cols, q, transposed, dst);
      launched("fp8_block_operand (kept x^T)");
      return dst;
    }
    const bool save = q.save_t && !transposed;
    Share s = share_operand(x, rows, cols, q, transposed, int64_t(sizeof(float)) * dst_floats);
    if (s == Share::kHit && save) s = Share::kNone;  // (a kept quantization has no x^T)
    if (s == Share::kHit) return shared_hit<float>(codes, nullptr);  // no amax: blocks
    const bool fill = s == Share::kFill;
    if (fill) codes = shared_codes_;
    float* raw = scratch_.alloc_f32(sr * sc);  // [sr, sc] row-major, as the CPU writes them
    fp8_block_codes(x, rows, cols, br, bc, transposed, codes, raw, save ? &q : nullptr);
    float* dst = fill ? static_cast<float*>(shared_scales_) : scratch_.alloc_f32(dst_floats);
    block_lt_scales(raw, rows, cols, q, transposed, dst);
    launched(save ? "fp8_block_operand (saving x^T)" : "fp8_block_operand");
    if (fill) shared_kept(shared_key(x, rows, cols, q, transposed));
    return dst;
  }
  // The floats of an fp8-block operand's scales in cuBLASLt's layout (block_lt_scales).
  static int64_t block_lt_scale_floats(int64_t rows, int64_t cols, const Fp8Operand& q,
                                       bool transposed) {
    const int64_t R = transposed ? cols : rows, K = transposed ? rows : cols;
    auto round4 = [](int64_t v) { return (v + 3) / 4 * 4; };
    // 128x128: [R/128, round4(K/128)], (rb, kb); 1x128 along K: [K/128, round4(R)], (kb, r)
    return q.block_rows > 1 && q.block_cols > 1 ? R / 128 * round4(K / 128)
                                                : K / 128 * round4(R);
  }
  // raw, x's [sr, sc] block scales as quantize_fp8_block writes them, into dst in the layout
  // LtGemm::fp8_block_gemm reads for the operand x (or, transposed, x^T).
  void block_lt_scales(const float* raw, int64_t rows, int64_t cols, const Fp8Operand& q,
                       bool transposed, float* dst) {
    const int64_t sc = (cols + q.block_cols - 1) / q.block_cols;
    const int64_t R = transposed ? cols : rows, K = transposed ? rows : cols;
    auto round4 = [](int64_t v) { return (v + 3) / 4 * 4; };
    if (q.block_rows > 1 && q.block_cols > 1)
      cuda::relayout_f32(raw, sc, transposed, R / 128, K / 128, round4(K / 128), dst, stream_);
    else  // raw is [R, K/128] or (x^T) [K/128, R]
      cuda::relayout_f32(raw, sc, !transposed, K / 128, R, round4(R), dst, stream_);
  }

  // (C16: LtGemm's bf16 output; false where it has no algorithm for one, nothing written.)
  bool fp8_block_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, const float* as,
                      const Fp8Operand& aq, const uint8_t* B, const float* bs,
                      const Fp8Operand& bq, float beta, float* C, uint16_t* C16 = nullptr,
                      const float* C_in = nullptr) {
    DeviceArenaScope scope(scratch_);  // as tensor_fp8_gemm
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    if (!lt_.fp8_block_gemm(M, N, K, A, as, aq.block_rows > 1 && aq.block_cols > 1, B, bs,
                            bq.block_rows > 1 && bq.block_cols > 1, beta, C, ws, ws_bytes,
                            stream_, C16, C_in))
      return false;
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done("fp8_block_gemm");
    return true;
  }

  // One fp8-block operand for the MXFP8 GEMM (Blackwell): the same E4M3 codes as
  // fp8_block_operand writes (x, or x^T, written transposed), and its power-of-two block scales
  // rewritten as E8M0 bytes in cuBLASLt's swizzled VEC32_UE8M0 layout (exact: every 1 x 32 piece
  // along K lies in one 1x128 / 128x1 / 128x128 block and takes its scale; numerics/
  // fp8_block_mx.h). The blocks must run along K (1x128 untransposed, 128x1 transposed) or be
  // 128x128, as the recipe cuts them. Returns the swizzled bytes (scratch, the caller's scope).
  // (`codes`, q.codes_t and q.save_t: as fp8_block_operand's.)
  template <class X>
  const uint8_t* fp8_block_mx_operand(uint8_t*& codes, uint8_t* tmp, const X* x, int64_t rows,
                                      int64_t cols, const Fp8Operand& q, bool transposed) {
    const int64_t br = q.block_rows, bc = q.block_cols;
    const int64_t R = transposed ? cols : rows, K = transposed ? rows : cols;
    MX_REQUIRE(K % 32 == 0 && (transposed ? br : bc) % 32 == 0, "fp8_block_mx_operand: K = ", K,
               " and the blocks along K (", br, "x", bc, (transposed ? ", transposed" : ""),
               ") must be multiples of 32");
    const int64_t dst_bytes = numerics::swizzled_scale_bytes(R, K / 32);
    if (q.codes_t) {
      take_codes_t(codes, q, transposed, "fp8_block_mx_operand");
      uint8_t* dst = scratch_.alloc_as<uint8_t>(dst_bytes);
      cuda::fp8_block_scales_to_mx(q.codes_t_scale_inv, rows, cols, int(br), int(bc), true, dst,
                                   stream_);
      launched("fp8_block_mx_operand (kept x^T)");
      return dst;
    }
    const bool save = q.save_t && !transposed;
    Share s = share_operand(x, rows, cols, q, transposed, dst_bytes);
    if (s == Share::kHit && save) s = Share::kNone;  // (a kept quantization has no x^T)
    if (s == Share::kHit) return shared_hit<uint8_t>(codes, nullptr);  // no amax: blocks
    const bool fill = s == Share::kFill;
    if (fill) codes = shared_codes_;
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    float* raw = scratch_.alloc_f32(sr * sc);  // [sr, sc] row-major, as the CPU writes them
    fp8_block_codes(x, rows, cols, br, bc, transposed, codes, raw, save ? &q : nullptr);
    uint8_t* dst = fill ? static_cast<uint8_t*>(shared_scales_)
                        : scratch_.alloc_as<uint8_t>(dst_bytes);
    cuda::fp8_block_scales_to_mx(raw, rows, cols, int(br), int(bc), transposed, dst, stream_);
    launched(save ? "fp8_block_mx_operand (saving x^T)" : "fp8_block_mx_operand");
    if (fill) shared_kept(shared_key(x, rows, cols, q, transposed));
    return dst;
  }

  // One mxfp8 operand as the GEMM operand [R, K] (K-major), E4M3 in 1 x 32 blocks along K with
  // E8M0 scales (numerics::quantize_mxfp8, TE's round-up rule, as the recipe quantizes it):
  // x itself (rowwise 1x32 blocks; R = rows, K = cols) or, transposed, x^T (x's columnwise 32x1
  // blocks; R = cols, K = rows; the codes go through `tmp`, rows * cols bytes). Each copy is
  // quantized from the fp32 tensor. Returns the scale bytes in cuBLASLt's swizzled layout
  // (scratch, the caller's scope).
  // (`codes`: a reference, as fp8_operand's, for the shared input, keyed as the recipe's
  // 1x32 / 32x1 operand. given: the caller's operand, for x^T's codes it keeps: given->codes_t
  // (their raw E8M0 bytes [rows / 32, cols] in codes_t_scale_inv's memory) stand for the
  // transposed operand; given->save_t (the forward's 1x32 input) has x^T's 32x1 codes and raw
  // scales written there too, from the same read: quantize_mxfp8_both.)
  template <class X>
  const uint8_t* mxfp8_operand(uint8_t*& codes, uint8_t* tmp, const X* x, int64_t rows,
                               int64_t cols, bool transposed, const Fp8Operand* given = nullptr) {
    const int64_t R = transposed ? cols : rows, K = transposed ? rows : cols;
    MX_REQUIRE(K % 32 == 0, "mxfp8_operand: K = ", K, " must be a multiple of 32");
    const int64_t kb = K / 32;
    const int64_t dst_bytes = numerics::swizzled_scale_bytes(R, kb);
    if (given && given->codes_t) {
      take_codes_t(codes, *given, transposed, "mxfp8_operand");
      uint8_t* dst = scratch_.alloc_as<uint8_t>(dst_bytes);
      cuda::swizzle_scales_u8(reinterpret_cast<const uint8_t*>(given->codes_t_scale_inv), true,
                              R, kb, dst, stream_);
      launched("mxfp8_operand (kept x^T)");
      return dst;
    }
    const bool save = given && given->save_t && !transposed;
    Fp8Operand q;  // the key: as LlamaModel cuts it (block_operand)
    q.mx = true;
    q.block_rows = transposed ? 32 : 1;
    q.block_cols = transposed ? 1 : 32;
    Share s = share_operand(x, rows, cols, q, transposed, dst_bytes);
    if (s == Share::kHit && save) s = Share::kNone;  // (a kept quantization has no x^T)
    if (s == Share::kHit) return shared_hit<uint8_t>(codes, nullptr);
    const bool fill = s == Share::kFill;
    if (fill) codes = shared_codes_;
    uint8_t* raw = scratch_.alloc_as<uint8_t>(R * kb);  // [rows, cols/32] or [rows/32, cols]
    if (save) {
      MX_REQUIRE(given->save_t_scale_inv, "mxfp8_operand: saved codes need room for their scales");
      auto* col_scales = reinterpret_cast<uint8_t*>(given->save_t_scale_inv);
      const uint16_t* g = given->swiglu_g;
      const uint16_t* u = given->swiglu_u;  // x is SwiGLU's product of these codes
      if (!g)
        cuda::quantize_mxfp8_both(x, rows, cols, numerics::Format::kE4M3,
                                  numerics::MxScaleRule::kCeil, codes, raw, tmp, given->save_t,
                                  col_scales, stream_);
      else if (cols % 2 == 0 && all_aligned(4, {g, u}) && all_aligned(2, {codes}))
        cuda::swiglu_forward_mxfp8(g, u, rows, cols, numerics::Format::kE4M3,
                                   numerics::MxScaleRule::kCeil,
                                   {codes, raw, given->save_t, col_scales}, stream_);
      else  // (unaligned: not the model's)
        cuda::quantize_mxfp8_both(swiglu_codes(*given, rows * cols), rows, cols,
                                  numerics::Format::kE4M3, numerics::MxScaleRule::kCeil, codes,
                                  raw, tmp, given->save_t, col_scales, stream_);
    } else if (transposed)
      cuda::quantize_mxfp8_t(x, rows, cols, numerics::Format::kE4M3,
                             numerics::MxScaleRule::kCeil, tmp, codes, raw, stream_);
    else
      cuda::quantize_mxfp8(x, rows, cols, false, numerics::Format::kE4M3,
                           numerics::MxScaleRule::kCeil, numerics::RoundingOptions{}, codes, raw,
                           nullptr, stream_);
    uint8_t* dst = fill ? static_cast<uint8_t*>(shared_scales_)
                        : scratch_.alloc_as<uint8_t>(dst_bytes);
    cuda::swizzle_scales_u8(raw, transposed, R, kb, dst, stream_);
    launched(save ? "mxfp8_operand (saving x^T)" : "mxfp8_operand");
    if (fill) shared_kept(shared_key(x, rows, cols, q, transposed));
    return dst;
  }

  bool mxfp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, const uint8_t* as,
                  const uint8_t* B, const uint8_t* bs, float beta, float* C,
                  uint16_t* C16 = nullptr, const float* C_in = nullptr) {
    DeviceArenaScope scope(scratch_);  // as tensor_fp8_gemm
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    if (!lt_.mxfp8_gemm(M, N, K, A, as, B, bs, beta, C, ws, ws_bytes, stream_, C16, C_in))
      return false;
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done("mxfp8_gemm");
    return true;
  }

  // One nvfp4 operand as the GEMM operand [R, K] (K-major), as the recipe quantizes it
  // (numerics::quantize_nvfp4_into): x itself (R = rows, K = cols; 1x16 blocks, or 16x16 for a
  // weight) or, transposed, x^T (R = cols, K = rows): with q.rht put through the Hadamard
  // transform along K before its 1x16 quantization (the weight gradient's operands), else a
  // transposed weight, the 16x16 quantization of W^T (the same codes and block scales as W's,
  // transposed), formed in fp32 in `tmp` (rows * cols floats). X: float, or uint16_t (bf16
  // codes: the 1x16 forms, which read the codes themselves; a weight is fp32). The 1x16 forms
  // take a thread a block (quantize_nvfp4_rows; quantize_nvfp4_rht_t transforms x^T's blocks
  // in registers, no fp32 copy), the 16x16 ones quantize_nvfp4. Codes (E2M1 two a byte), the
  // global encode scale and the swizzled scale bytes (the 16x16 blocks' scale repeated for
  // each of their 16 rows) come from scratch (the caller's scope).
  struct Nvfp4Operand {
    const uint8_t* codes;
    const uint8_t* scales;
    const float* global;
  };
  template <class X>
  Nvfp4Operand nvfp4_operand(const X* x, int64_t rows, int64_t cols, const Fp8Operand& q,
                             bool transposed, float* tmp) {
    const int64_t R = transposed ? cols : rows, K = transposed ? rows : cols;
    MX_REQUIRE(K % 32 == 0 && R % 16 == 0, "nvfp4_operand: K = ", K,
               " must be a multiple of 32 and R = ", R, " of 16");
    const bool blocks_2d = q.block_rows == 16 && q.block_cols == 16;
    MX_REQUIRE(blocks_2d || q.rht || q.block_rows == (transposed ? 16 : 1),
               "nvfp4_operand: blocks must run along the GEMM's reduction");
    const int64_t kb = K / 16, scale_rows = blocks_2d ? R / 16 : R;
    // a shared input's 1x16 rows (q, k, v of h1; gate, up of h2): quantized once, kept in the
    // bracket's codes, scales and amax slot (the global scale here)
    const Share s = !blocks_2d && !transposed && shareable(q)
                        ? share_operand(x, rows, cols, q, false,
                                        numerics::swizzled_scale_bytes(R, kb))
                        : Share::kNone;
    if (s == Share::kHit)
      return {shared_codes_, static_cast<const uint8_t*>(shared_scales_), shared_amax_};
    const bool fill = s == Share::kFill;
    uint8_t* codes = fill ? shared_codes_ : scratch_.alloc_as<uint8_t>(R * K / 2);
    uint8_t* raw = scratch_.alloc_as<uint8_t>(scale_rows * kb);
    float* global = fill ? shared_amax_ : scratch_.alloc_f32(1);
    if (!blocks_2d && !transposed) {  // (x's producer may have taken its amax: x_amax)
      cuda::quantize_nvfp4_rows(x, R, K, q.rounding, codes, raw, global, scratch_, stream_,
                                q.x_amax);
    } else if (transposed && q.rht) {
      cuda::quantize_nvfp4_rht_t(x, rows, cols, q.rht_seed, q.rounding, codes, raw, global,
                                 scratch_, stream_);
    } else if constexpr (std::is_same_v<X, float>) {
      // a weight's 16x16 blocks: its amax given (x_amax: kept from its first cast since the
      // optimizer step), or taken into the caller's slot (amax) for the later casts
      const float* amax = blocks_2d ? q.x_amax : nullptr;
      if (blocks_2d && !amax && q.amax) {
        cuda::abs_max(q.amax, x, rows * cols, scratch_, stream_);
        amax = q.amax;
      }
      if (transposed && blocks_2d) {  // W^T (dgrad): read from W, no fp32 transposed copy
        cuda::quantize_nvfp4_16x16_t(x, rows, cols, q.rounding, codes, raw, global, scratch_,
                                     stream_, amax);
      } else {
        const float* src = x;
        if (transposed) {
          cuda::transpose_f32(x, rows, cols, tmp, stream_);
          src = tmp;
        }
        cuda::quantize_nvfp4(src, R, K, blocks_2d, q.rounding, codes, raw, global, nullptr,
                             scratch_, stream_, amax);
      }
    } else {
      MX_REQUIRE(false, "nvfp4_operand: a 16x16 or transposed operand without the RHT is fp32");
    }
    launched("nvfp4_operand");
    const Nvfp4Operand o =
        nvfp4_swizzled(codes, raw, global, R, kb, blocks_2d,
                       fill ? static_cast<uint8_t*>(shared_scales_) : nullptr);
    if (fill) shared_kept(shared_key(x, rows, cols, q, false));
    return o;
  }

  // The operand [R, K / 16 scales a row] with its raw scale bytes (16x16 blocks: a row of
  // scales for each 16 rows) swizzled for VEC16_UE4M3 into dst (null: scratch).
  Nvfp4Operand nvfp4_swizzled(const uint8_t* codes, const uint8_t* raw, const float* global,
                              int64_t R, int64_t kb, bool blocks_2d, uint8_t* dst = nullptr) {
    uint8_t* swizzled =
        dst ? dst : scratch_.alloc_as<uint8_t>(numerics::swizzled_scale_bytes(R, kb));
    cuda::swizzle_scales_u8(raw, false, R, kb, swizzled, stream_, blocks_2d ? 16 : 1);
    return {codes, swizzled, global};
  }

  // nvfp4's Linear backward in one call (fp8_linear_backward): dy's two operands, the data
  // gradient's 1x16 rows and the weight gradient's RHT(dy^T), from one amax pass and one read
  // of dy (quantize_nvfp4_both) where dgrad's and wgrad's calls read it twice each; then the
  // two FP4 GEMMs as fp8_dgrad's and fp8_wgrad's nvfp4 branches.
  template <class DY, class X>
  void nvfp4_backward(float* dx, uint16_t* dx16, float* dw, const DY* dy,
                      const Fp8Operand& dyq_dgrad, const float* w, const Fp8Operand& wq,
                      const Fp8Operand& dyq_wgrad, const X* x, const Fp8Operand& xq, int64_t N,
                      int64_t in, int64_t out, bool accumulate_dx, float* work) {
    const int64_t kb = out / 16, kb_t = N / 16;
    uint8_t* codes = scratch_.alloc_as<uint8_t>(N * out / 2);
    uint8_t* raw = scratch_.alloc_as<uint8_t>(N * kb);
    uint8_t* codes_t = scratch_.alloc_as<uint8_t>(out * N / 2);
    uint8_t* raw_t = scratch_.alloc_as<uint8_t>(out * kb_t);
    float* global = scratch_.alloc_f32(2);
    cuda::quantize_nvfp4_both(dy, N, out, dyq_wgrad.rht_seed, dyq_dgrad.rounding,
                              dyq_wgrad.rounding, {codes, raw, global},
                              {codes_t, raw_t, global + 1}, scratch_, stream_);
    launched("nvfp4_operand (dy both)");
    const Nvfp4Operand a = nvfp4_swizzled(codes, raw, global, N, kb, false);
    const Nvfp4Operand at = nvfp4_swizzled(codes_t, raw_t, global + 1, out, kb_t, false);
    const Nvfp4Operand b = nvfp4_operand(w, out, in, wq, true, work);
    fp8_output("fp8_linear_backward", dx, dx16, nullptr, N * in,
               [&](float* C, uint16_t* C16, const float*) {
                 return nvfp4_gemm(N, in, out, a, b, accumulate_dx ? 1.0f : 0.0f, C, C16);
               });
    const Nvfp4Operand xt = nvfp4_operand(x, N, in, xq, true, nullptr);
    nvfp4_gemm(out, in, N, at, xt, 1.0f, dw);
  }

  // The FP4 GEMM (LtGemm::nvfp4_gemm): fp32 C, or bf16 C16 (false: no such algorithm), beta's
  // term from C_in (null: C).
  bool nvfp4_gemm(int64_t M, int64_t N, int64_t K, const Nvfp4Operand& a, const Nvfp4Operand& b,
                  float beta, float* C, uint16_t* C16 = nullptr, const float* C_in = nullptr) {
    DeviceArenaScope scope(scratch_);  // the workspace and scalars, released after queueing
    const size_t ws_bytes = opt_.gemm_workspace_bytes;
    void* ws = ws_bytes ? scratch_.alloc(ws_bytes) : nullptr;
    float* scalars = scratch_.alloc_f32(2);
    if (!lt_.nvfp4_gemm(M, N, K, a.codes, a.scales, a.global, b.codes, b.scales, b.global, beta,
                        C, scalars, ws, ws_bytes, stream_, C16, C_in))
      return false;
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
    done("nvfp4_gemm");
    return true;
  }

  CudaBackendOptions opt_;
  bool nvfp4_native_ = false;  // Blackwell (10.x) only: FP4 operands, VEC16_UE4M3 scales
  bool mxfp8_native_ = false;  // Blackwell (10.x) only: cuBLASLt's VEC32_UE8M0 scale mode
  bool fp8_block_native_ = false;  // Hopper only: cuBLASLt's VEC128 / BLK128x128 scale modes
  bool fp8_block_via_mx_ = false;  // Blackwell (10.x): fp8-block's scales as E8M0, MXFP8 GEMM
  bool fp8_native_ = false;  // set in the constructor (capability and opt_.fp8_tensor_cores)
  bool fp8_bf16_output_ = true;      // set_fp8_bf16_output
  bool fp8_residual_epilogue_ = true;  // set_fp8_residual_epilogue
  int64_t fp8_residual_fallbacks_ = 0;  // fp8_output's residual adds after the GEMM
  bool profiling_ = false;           // run.profile (set_profiling)
  OpProfile profile_;
  std::deque<PendingEvent> pending_;
  std::vector<cudaEvent_t> free_events_;
  cudaEvent_t last_event_ = nullptr;  // the last op's event: the next op's time starts there
  double last_flops_ = 0;
  int64_t fp8_bf16_fallbacks_ = 0;   // fp8_output's fallbacks to fp32 + rounding
  // begin_shared_input's store in scratch (shared_open_: reserved)
  bool shared_open_ = false;
  size_t shared_mark_ = 0;
  uint8_t* shared_codes_ = nullptr;
  void* shared_scales_ = nullptr;
  size_t shared_scale_room_ = 0;
  float* shared_amax_ = nullptr;
  int64_t shared_declined_ = 0;
  CudaGemmPrecision base_precision_ = opt_.gemm_precision;
  DeviceMemory device_memory_;
  DeviceArena scratch_;
  cudaStream_t stream_ = nullptr;
  cuda::LtGemm lt_;
  int64_t sm_count_ = 1;  // multiprocessors (launches sized to what the GPU holds at once)
#ifdef MXTRAIN_HAVE_CUDNN
  std::unique_ptr<cuda::CudnnAttention> cudnn_;  // created at the first attention call
#endif
  bool deterministic_ = false;  // set_deterministic
  static constexpr int kAttnAmaxFloats = 64;
  float* attn_amax_dev_ = nullptr;  // FP8 attention's amaxes (fp8_attention_scales)
  float ds_amax_factor_ = 1.0f;  // the last FP8 backward's dP amax to dS's (sqrt(D) on cuDNN)
  float* head_amax_dev_ = nullptr;  // the FP8 head gradient's amax (head_fp8)
  GemmStats stats_;
};

}  // namespace

std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackendImpl>(options);
}

namespace {
// make_backend("cuda"): the GPU of this process's local rank (one process per GPU under
// mpirun), fp32 GEMMs (the CPU backend's numbers; recipe bf16 switches Linears to bf16).
std::unique_ptr<Backend> make_cuda_backend_for_trainer(const std::string& given) {
  // The environment first: a bad value is an error on any machine, GPU or not.
  CudaBackendOptions o;
  // MXTRAIN_CUDA_ATTENTION: cudnn (default: cuDNN's bf16 SDPA where built and supported, else
  // the fp32 kernel) or fp32 (always the fp32 kernel).
  o.attention = parse_cuda_attention(std::getenv("MXTRAIN_CUDA_ATTENTION"));
  // MXTRAIN_CUDA_GEMM: how GEMMs outside a recipe's Linears (the head, fp32 runs) use the tensor
  // cores: fp32 (default, the CPU backend's numbers), tf32 or bf16.
  if (const char* g = std::getenv("MXTRAIN_CUDA_GEMM")) {
    const std::string v = g;
    if (v == "fp32") o.gemm_precision = CudaGemmPrecision::kFp32;
    else if (v == "tf32") o.gemm_precision = CudaGemmPrecision::kTf32;
    else if (v == "bf16") o.gemm_precision = CudaGemmPrecision::kBf16;
    else throw UserError(str("MXTRAIN_CUDA_GEMM must be fp32, tf32 or bf16 (got '", v, "')"));
  }
  // MXTRAIN_CUDA_FP8: `native` (default: FP8 tensor cores for fp8-current / fp8-delayed where
  // the GPU has them) or `emulate` (the recipes' exact emulation, fp32 GEMMs).
  if (const char* f = std::getenv("MXTRAIN_CUDA_FP8")) {
    const std::string v = f;
    if (v == "native") o.fp8_tensor_cores = true;
    else if (v == "emulate") o.fp8_tensor_cores = false;
    else throw UserError(str("MXTRAIN_CUDA_FP8 must be native or emulate (got '", v, "')"));
  }
  o.gemm_tune = parse_cuda_gemm_tune(std::getenv("MXTRAIN_CUDA_GEMM_TUNE"));
  o.fp8_fast_accum = parse_cuda_fp8_fast_accum(std::getenv("MXTRAIN_CUDA_FP8_FAST_ACCUM"));
  if (o.fp8_fast_accum != CudaFp8FastAccum::kOff)
    info(str("cuda fp8: fast accumulation on ",
             o.fp8_fast_accum == CudaFp8FastAccum::kAll ? "every per-tensor FP8 GEMM"
                                                        : "the per-tensor FP8 forward GEMMs",
             " (MXTRAIN_CUDA_FP8_FAST_ACCUM; partial sums not promoted to fp32: faster and "
             "less exact, on Ada and Hopper only)"));
  cuda::fp8_cast_unroll();  // MXTRAIN_FP8_CAST_UNROLL (the FP8 casts read it; checked here)
  cuda::set_cast_tune(cuda::parse_cast_tune(std::getenv("MXTRAIN_CUDA_CAST_TUNE")));
  // Tests only (test_cuda_emu.py): every tuned cast runs its form k, so the trainer's runs
  // take the forms tuning would pick only at larger shapes.
  if (const char* f = std::getenv("MXTRAIN_TEST_CAST_FORM"))
    cuda::force_cast_form(int(std::strtol(f, nullptr, 10)));
  o.scratch_bytes = cuda_scratch_bytes();  // default 1 GiB: bf16 copies of large GEMMs' operands
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw UserError(str(given, "cuda: no usable CUDA GPU on this machine (",
                        e != cudaSuccess ? cudaGetErrorString(e) : "no devices", ")"));
  }
  o.device = cuda_local_device(count);
  // Which attention runs is said once here when it is fixed; with cuDNN, once per shape by
  // CudnnAttention ("cuda attention: cudnn SDPA ..." or "cuda attention: fp32 kernel for ...").
#ifdef MXTRAIN_HAVE_CUDNN
  if (o.attention == CudaAttention::kFp32)
    info("cuda attention: fp32 kernel (MXTRAIN_CUDA_ATTENTION=fp32)");
#else
  info("cuda attention: fp32 kernel (this build has no cuDNN attention: no cudnn-frontend "
       "headers at build time, see scripts/setup.sh)");
#endif
  return make_cuda_backend(o);
}
}  // namespace

CudaGemmTune parse_cuda_gemm_tune(const char* value) {
  if (!value) return CudaGemmTune::kLarge;
  const std::string v = value;
  if (v == "0") return CudaGemmTune::kOff;
  if (v == "1") return CudaGemmTune::kLarge;
  if (v == "all") return CudaGemmTune::kAll;
  throw UserError(str("MXTRAIN_CUDA_GEMM_TUNE must be 0 (the heuristic's first algorithm), 1 "
                      "(time the candidates of products of 2^30 FLOPs and more: the default) "
                      "or all (got '", v, "')"));
}

CudaFp8FastAccum parse_cuda_fp8_fast_accum(const char* value) {
  if (!value) return CudaFp8FastAccum::kOff;
  const std::string v = value;
  if (v == "0") return CudaFp8FastAccum::kOff;
  if (v == "fprop") return CudaFp8FastAccum::kForward;
  if (v == "all") return CudaFp8FastAccum::kAll;
  throw UserError(str("MXTRAIN_CUDA_FP8_FAST_ACCUM must be 0 (the default: every FP8 GEMM "
                      "promotes its partial sums to fp32), fprop (fast accumulation on the "
                      "forward GEMMs, as Transformer Engine) or all (got '", v, "')"));
}

int cuda_local_device(int device_count) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                          "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return int(std::strtol(v, nullptr, 10)) % device_count;
  return 0;
}

void register_cuda_backend() {
  register_cuda_backend_factory(&make_cuda_backend_for_trainer);
  register_nccl_device_communicator();  // FSDP over NCCL under mpirun
}

}  // namespace mx
