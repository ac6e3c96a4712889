// Quantization kernels: one warp per scaling block (amax by warp shuffles, then each lane encodes
// a strided share of the block's elements). The rules are the numerics headers' inline functions;
// only the loop structure is new. amax is a fold of fmaxf, which is exact and order-independent,
// so the parallel reduction finds the same amax as the CPU's sequential loop.
#include "backend/cuda/quantize_kernels.h"

#include "numerics/attention_fp8.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>

#if !defined(MXTRAIN_CUDA_EMU)
#include <cuda_fp8.h>
#endif

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.cuh"
#include "backend/cuda/swiglu_math.cuh"
#include "core/log.h"
#include "numerics/block_scale_layout.h"
#include "numerics/fp8_block_mx.h"

namespace mx::cuda {

// The FP8 code of v, RNE, saturating to the largest finite value (numerics::encode_fp8_elem's
// byte, kSatFinite). Compiled for compute capability >= 8.9, the hardware conversion
// (cvt.rn.satfinite; the numerics encoder costs some 30-40 instructions an element, which left
// the per-tensor casts and the block quantizers short of the H200's bandwidth), with NaN given
// the CPU's 0x7F whatever its sign; elsewhere, and in the emulation, the numerics encoder
// itself. The op check's fp8_encoder case compares the two over all 2^32 floats on the GPU.
__device__ __forceinline__ uint8_t fp8_code(float v, numerics::Format fmt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(MXTRAIN_CUDA_EMU)
  if (v != v) return 0x7F;
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE,
                                       fmt == numerics::Format::kE5M2 ? __NV_E5M2 : __NV_E4M3));
#else
  return numerics::encode_fp8_elem(v, fmt, false, 0u);
#endif
}
// With stochastic rounding: the numerics encoder (no hardware form of the CPU's rule).
__device__ __forceinline__ uint8_t fp8_code(float v, numerics::Format fmt, bool stochastic, uint32_t rand) {
  return stochastic ? numerics::encode_fp8_elem(v, fmt, true, rand) : fp8_code(v, fmt);
}
namespace {
// MXTRAIN_FP8_CAST_UNROLL's value; 0 where it is unset (the cast tuner then picks).
int fp8_cast_unroll_env() {
  static const int u = [] {
    const char* e = std::getenv("MXTRAIN_FP8_CAST_UNROLL");
    if (!e) return 0;
    const std::string v = e;
    if (v == "1" || v == "2" || v == "4") {  // said once (bench/gpu/check.sh's run logs)
      info(str("cuda fp8 casts: ", v, " vector(s) of 4 elements a thread in flight ",
               "(MXTRAIN_FP8_CAST_UNROLL)"));
      return std::stoi(v);
    }
    throw UserError(str("MXTRAIN_FP8_CAST_UNROLL must be 1, 2 or 4 (got '", v, "')"));
  }();
  return u;
}
}  // namespace
int fp8_cast_unroll() {
  const int u = fp8_cast_unroll_env();
  return u ? u : 1;
}
namespace {

using numerics::Format;
using numerics::RandomStream;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kWarpsPerBlock = 8;

__device__ inline float warp_amax(float m) {
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  return m;
}

// An element of an input given as fp32 or as bf16 codes (widened exactly): the kernels below
// that take either are templates over the element type.
__device__ inline float load(const float* x, int64_t i) { return x[i]; }
__device__ inline float load(const uint16_t* x, int64_t i) { return numerics::decode_bf16(x[i]); }

// Four consecutive elements from 4-element-aligned i (one 16-byte fp32 or 8-byte bf16 load), in
// two steps: raw4 loads the four elements as stored (a float4, or the four bf16 codes in a
// uint2: half the registers while they wait), widen4 makes them floats.
__device__ inline float4 raw4(const float* x, int64_t i) {
  return *reinterpret_cast<const float4*>(x + i);
}
__device__ inline uint2 raw4(const uint16_t* x, int64_t i) {
  return *reinterpret_cast<const uint2*>(x + i);
}
__device__ inline float4 raw4_zero(const float*) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
__device__ inline uint2 raw4_zero(const uint16_t*) { return make_uint2(0u, 0u); }  // +0.0 x 4
__device__ inline float4 widen4(float4 v) { return v; }
__device__ inline float4 widen4(uint2 p) {
  return make_float4(numerics::decode_bf16(uint16_t(p.x & 0xFFFFu)),
                     numerics::decode_bf16(uint16_t(p.x >> 16)),
                     numerics::decode_bf16(uint16_t(p.y & 0xFFFFu)),
                     numerics::decode_bf16(uint16_t(p.y >> 16)));
}

// SwiGLU's gradients on the bf16 path as swiglu_backward_bf16 stores them: swiglu_grads of the
// widened codes (swiglu_math.cuh), rounded RNE to bf16 codes (or their values).
__device__ inline void swiglu_grad_bf16(uint16_t ds, uint16_t g, uint16_t u, uint16_t& dg16,
                                        uint16_t& du16) {
  float dg, du;
  swiglu_grads(numerics::decode_bf16(ds), numerics::decode_bf16(g), numerics::decode_bf16(u),
               dg, du);
  dg16 = numerics::encode_bf16(dg, numerics::Saturation::kNoSat);
  du16 = numerics::encode_bf16(du, numerics::Saturation::kNoSat);
}
__device__ inline void swiglu_grad_codes(uint16_t ds, uint16_t g, uint16_t u, float& dg,
                                         float& du) {
  uint16_t dg16, du16;
  swiglu_grad_bf16(ds, g, u, dg16, du16);
  dg = numerics::decode_bf16(dg16);
  du = numerics::decode_bf16(du16);
}
// dg and du as a source of four elements at a time for tile_pass (fp8-block's SwiGLU backward):
// raw4 loads ds's, g's and u's codes, widen4 makes both gradients.
struct SwigluGrads {
  const uint16_t* __restrict__ ds;
  const uint16_t* __restrict__ g;
  const uint16_t* __restrict__ u;
};
struct SwigluRaw4 {
  uint2 ds, g, u;
};
struct Grads4 {
  float4 v[2];  // dg, du
};
__device__ inline SwigluRaw4 raw4(const SwigluGrads& x, int64_t i) {
  return {raw4(x.ds, i), raw4(x.g, i), raw4(x.u, i)};
}
__device__ inline SwigluRaw4 raw4_zero(const SwigluGrads&) {  // +0 codes: +0 gradients
  return {make_uint2(0u, 0u), make_uint2(0u, 0u), make_uint2(0u, 0u)};
}
__device__ inline Grads4 widen4(const SwigluRaw4& r) {
  const uint32_t d[2] = {r.ds.x, r.ds.y}, g[2] = {r.g.x, r.g.y}, u[2] = {r.u.x, r.u.y};
  float dg[4], du[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int h = 16 * (e % 2);
    swiglu_grad_codes(uint16_t(d[e / 2] >> h), uint16_t(g[e / 2] >> h), uint16_t(u[e / 2] >> h),
                      dg[e], du[e]);
  }
  return {{make_float4(dg[0], dg[1], dg[2], dg[3]), make_float4(du[0], du[1], du[2], du[3])}};
}

// The bf16 path's down-projection input s = silu(g) u as its bf16 code (swiglu_code: the bytes
// swiglu_forward_bf16 stores), made as g and u are read: s itself is never stored. Also a
// source of four elements at a time for tile_pass (fp8-block's forward of the down
// projection): raw4 loads g's and u's codes, widen4 makes s's values.
struct SwigluCodes {
  const uint16_t* __restrict__ g;
  const uint16_t* __restrict__ u;
};
struct ProductRaw4 {
  uint2 g, u;
};
__device__ inline ProductRaw4 raw4(const SwigluCodes& x, int64_t i) {
  return {raw4(x.g, i), raw4(x.u, i)};
}
__device__ inline ProductRaw4 raw4_zero(const SwigluCodes&) {  // +0 codes: s = +0
  return {make_uint2(0u, 0u), make_uint2(0u, 0u)};
}
__device__ inline float4 widen4(const ProductRaw4& r) {
  const uint32_t g[2] = {r.g.x, r.g.y}, u[2] = {r.u.x, r.u.y};
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int h = 16 * (e % 2);
    v[e] = numerics::decode_bf16(swiglu_code(uint16_t(g[e / 2] >> h), uint16_t(u[e / 2] >> h)));
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

__device__ inline uint32_t rand_bits(bool stochastic, const RandomStream& rng, int64_t i) {
  return stochastic ? rng.bits(uint64_t(i)) : 0u;
}

// ---- whole-tensor amax ------------------------------------------------------------------------
// m folded with four elements (a widened raw4).
__device__ inline float amax_fold4(float m, float4 v) {
  m = numerics::amax_fold(numerics::amax_fold(m, v.x), v.y);
  return numerics::amax_fold(numerics::amax_fold(m, v.z), v.w);
}

// The max of every thread's m over the block, valid in its first thread (x fastest). Every
// thread of the block calls it (blocks of whole warps).
__device__ float block_amax(float m) {
  m = warp_amax(m);
  __shared__ float warp_m[32];
  const int tid = int(threadIdx.x + threadIdx.y * blockDim.x);
  const int warps = int(blockDim.x * blockDim.y) / 32;
  if (tid % 32 == 0) warp_m[tid / 32] = m;
  __syncthreads();
  float b = 0.0f;
  if (tid == 0)
    for (int w = 0; w < warps; ++w) b = fmaxf(b, warp_m[w]);
  return b;
}

// U, the vectors (four elements each) a thread of the per-tensor cast and amax kernels' vec4
// loops loads before it uses any, to put more bytes in flight (elem_grid caps the grid):
// fp8_cast_unroll(), MXTRAIN_FP8_CAST_UNROLL = 1 (the default), 2 or 4. 1 is what the H200 runs
// measured (4 came with the tiled rework's 2-3x slowdown of these casts, not yet told apart
// from the tiled kernel's share of it); with bf16 input a thread then has 8 bytes in flight,
// which by Little's law may be too few at full occupancy: bench/gpu/check.sh times 2 beside 1.

// Those U vectors of a thread's iteration at vector j0: j0, j0 + stride, ..., their loads
// issued together; a vector at or past nv reads as zeros.
template <int U, class T, class V>
__device__ __forceinline__ void load4_batch(V (&v)[U], const T* __restrict__ x, int64_t j0,
                                            int64_t stride, int64_t nv) {
#pragma unroll
  for (int u = 0; u < U; ++u)
    v[u] = j0 + u * stride < nv ? raw4(x, 4 * (j0 + u * stride)) : raw4_zero(x);
}

// vec4: as fp8_codes_kernel's (n a multiple of 4, x aligned for raw4).
template <int U, class T>
__global__ void amax_partial_kernel(float* part, const T* __restrict__ x, int64_t n,
                                    bool vec4) {
  float m = 0.0f;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (vec4) {  // U vectors a thread an iteration, their loads issued together
    const int64_t nv = n / 4;
    for (int64_t j0 = first; j0 < nv; j0 += U * stride) {
      decltype(raw4(x, 0)) v[U];
      load4_batch<U>(v, x, j0, stride, nv);
#pragma unroll
      for (int u = 0; u < U; ++u) m = amax_fold4(m, widen4(v[u]));  // +0: no change
    }
  } else {
    for (int64_t i = first; i < n; i += stride) m = numerics::amax_fold(m, load(x, i));
  }
  const float b = block_amax(m);
  if (threadIdx.x == 0) part[blockIdx.x] = b;
}

// The block's max of each thread's m into *amax, which the launch zeroed: one atomic max a
// block on the bits (non-negative floats, +inf included, order as unsigned ints; the folds
// skip NaN). Every thread of the block calls it.
__device__ void block_amax_to(float m, float* amax) {
  const float b = block_amax(m);
  if (threadIdx.x == 0 && threadIdx.y == 0)
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(b));
}

__global__ void amax_final_kernel(float* amax, const float* part, int n) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < n; i += 32) m = fmaxf(m, part[i]);
  m = warp_amax(m);
  if (threadIdx.x == 0) *amax = m;
}

// ---- per-tensor FP8 ---------------------------------------------------------------------------
// scale[0] <- fp8_scale_from_amax(amax[0], ...) (current scaling) or the given value.
__global__ void fp8_scale_kernel(float* scale, const float* amax, float given, float fmt_max,
                                 float margin) {
  *scale = amax ? numerics::fp8_scale_from_amax(*amax, fmt_max, margin, false) : given;
}

__global__ void fp8_tensor_kernel(const float* __restrict__ x, int64_t n, Format fmt,
                                  const float* __restrict__ scale_ptr, bool stochastic,
                                  RandomStream rng, uint8_t* __restrict__ codes,
                                  float* __restrict__ scale_inv, float* __restrict__ dequant) {
  const float scale = *scale_ptr, inv = 1.0f / scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = inv;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t c = fp8_code(x[i] * scale, fmt, stochastic, rand_bits(stochastic, rng, i));
    codes[i] = c;
    dequant[i] = numerics::decode_fp8_elem(c, fmt) * inv;
  }
}

// ---- block quantizers: one warp per block -----------------------------------------------------
struct BlockGeom {  // block b of a [rows, cols] matrix cut into br x bc blocks
  int64_t r0, c0, nr, nc;
};
__device__ inline BlockGeom block_geom(int64_t b, int64_t scale_cols, int64_t rows, int64_t cols,
                                       int64_t br, int64_t bc) {
  BlockGeom g;
  g.r0 = (b / scale_cols) * br;
  g.c0 = (b % scale_cols) * bc;
  g.nr = min(rows - g.r0, br);
  g.nc = min(cols - g.c0, bc);
  return g;
}
// Calls f(i) for the index i (into the [rows, cols] matrix) of every element of block g that
// this lane owns. Blocks at least a warp wide go row by row, the lanes along the row (coalesced,
// and no 64-bit division an element); narrower ones (128x1, 16-wide) spread their elements over
// the lanes in row-major order.
template <class F>
__device__ inline void for_lane_elements(const BlockGeom& g, int64_t cols, int lane, F f) {
  if (g.nc >= 32) {
    for (int64_t r = 0; r < g.nr; ++r) {
      const int64_t row = (g.r0 + r) * cols + g.c0;
      for (int64_t c = lane; c < g.nc; c += 32) f(row + c);
    }
  } else if (g.nc == 1) {
    for (int64_t r = lane; r < g.nr; r += 32) f((g.r0 + r) * cols + g.c0);
  } else {
    for (int64_t e = lane; e < g.nr * g.nc; e += 32) f((g.r0 + e / g.nc) * cols + g.c0 + e % g.nc);
  }
}
template <class T>
__device__ inline float block_amax(const T* x, int64_t cols, const BlockGeom& g, int lane) {
  float m = 0.0f;
  for_lane_elements(g, cols, lane, [&](int64_t i) { m = numerics::amax_fold(m, load(x, i)); });
  return warp_amax(m);
}

template <class T>
__global__ void fp8_block_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                 int64_t br, int64_t bc, int64_t scale_rows, int64_t scale_cols,
                                 bool pow2, bool stochastic, RandomStream rng,
                                 uint8_t* __restrict__ codes, float* __restrict__ scales,
                                 float* __restrict__ dequant, bool transposed) {
  const int64_t b = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= scale_rows * scale_cols) return;  // whole warps leave together
  const BlockGeom g = block_geom(b, scale_cols, rows, cols, br, bc);
  const float amax = block_amax(x, cols, g, lane);
  const float scale = numerics::fp8_scale_from_amax(amax, numerics::kE4M3Max, 0.0f, pow2);
  const float inv = 1.0f / scale;
  if (lane == 0) scales[b] = inv;
  for_lane_elements(g, cols, lane, [&](int64_t i) {
    const uint8_t c = fp8_code(load(x, i) * scale, Format::kE4M3, stochastic,
                                 rand_bits(stochastic, rng, i));
    codes[transposed ? (i % cols) * rows + i / cols : i] = c;  // codes^T [cols, rows]
    if (dequant) dequant[i] = numerics::decode_e4m3(c) * inv;
  });
}

// ---- FP8 quantizers, tiled: per tensor, 1x128, 128x1 and 128x128 blocks ------------------------
// A thread block (32 x 8 threads) per 128 x 128 tile of x [rows, cols]: thread (tx, ty) holds
// the four consecutive columns 4 tx .. 4 tx + 3 of rows ty, ty + 8, ..., ty + 120 of its tile in
// registers (16 vector loads in flight: 16-byte fp32 / 8-byte bf16), so x is read once, a warp
// taking whole 128-element row pieces (256 or 512 bytes). The scales come from those registers:
// - kTensor: one given scale (*scale_ptr, fmt), amax (may be null) folded as fp8_codes_kernel's;
// - kRow (1x128): a row piece is one warp: a shuffle reduction;
// - kCol (128x1): a column's 16 values a thread, then its 8 threads' through shared memory;
// - kSquare (128x128): all 64 values, the warps, then shared memory.
// Then each group of four codes is one 4-byte store into codes [rows, cols] (kRowMajor) and/or
// goes through a shared-memory tile into codes_t [cols, rows] (kTransposed), so that each row
// of codes^T gets whole 128-byte pieces, 4 bytes a thread (packed_t: rows % 4 == 0 and codes_t
// 4-byte aligned; else byte by byte). Blocks never straddle a tile, since tiles and blocks both
// start at multiples of 128; elements past the edges load as +0, which leaves every amax (a max
// of |x| from 0) unchanged, and are not stored. The per-element rules and the amaxes (exact
// and order-free, as above) are fp8_block_kernel's / fp8_codes_kernel's, so the bytes are the
// same. Requires cols % 4 == 0 and x, codes and dequant aligned to their vectors (codes_t
// needs no alignment).
enum class TileKind { kTensor, kRow, kCol, kSquare };
constexpr int kQTile = 128, kQRows = 8, kQPer = kQTile / kQRows;  // 16 rows a thread
// A 32 x 8 thread block's 128 x 128 tile of x [rows, cols] (tiles_c tiles across; tile
// blockIdx.x) and the thread's place in it: columns c .. c + 3 (cols % 4 == 0: the four are all
// in or all out), rows ty, ty + 8, ..., ty + 120.
struct TileAt {
  int tx, ty;
  int64_t r0, c0, c;
  __device__ explicit TileAt(int64_t tiles_c)
      : tx(int(threadIdx.x)),
        ty(int(threadIdx.y)),
        r0(int64_t(blockIdx.x / tiles_c) * kQTile),
        c0(int64_t(blockIdx.x % tiles_c) * kQTile),
        c(c0 + 4 * tx) {}
};
// m[j] folded with column j of f (a thread's four columns' amaxes over its rows).
__device__ __forceinline__ void amax_fold_cols(float (&m)[4], float4 f) {
  m[0] = numerics::amax_fold(m[0], f.x);
  m[1] = numerics::amax_fold(m[1], f.y);
  m[2] = numerics::amax_fold(m[2], f.z);
  m[3] = numerics::amax_fold(m[3], f.w);
}
// f(j, amax) for each of the thread's four columns j over the whole tile: m (the amaxes over
// the thread's rows) through part [ty][column] across the 8 rows of threads. A barrier: every
// thread calls.
template <class F>
__device__ __forceinline__ void tile_col_amax(float (*part)[kQTile], const TileAt& t,
                                              const float (&m)[4], F&& f) {
  for (int j = 0; j < 4; ++j) part[t.ty][4 * t.tx + j] = m[j];
  __syncthreads();
  for (int j = 0; j < 4; ++j) {
    float a = 0.0f;
    for (int y = 0; y < kQRows; ++y) a = fmaxf(a, part[y][4 * t.tx + j]);
    f(j, a);
  }
}
// A 128 x 128 tile's codes out of shared memory, tile [column][row] with an odd pitch
// (kQTile + 1), into codes_t [cols, rows] by a 32 x 8 thread block: codes^T row c0 + j (x's
// column), bytes r0 + 4 tx .. + 3 (x's rows) from thread (tx, ty), one 4-byte store where
// packed_t (rows % 4 == 0 and codes_t 4-byte aligned), else byte by byte.
__device__ inline void store_tile_t(const uint8_t* tile, uint8_t* __restrict__ codes_t,
                                    int64_t rows, int64_t cols, int64_t r0, int64_t c0,
                                    bool packed_t) {
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int64_t r = r0 + 4 * tx;
  for (int j = ty; j < kQTile; j += kQRows) {
    const int64_t col = c0 + j;
    if (col >= cols || r >= rows) continue;
    uint8_t* dst = codes_t + col * rows + r;
    const uint8_t* src = tile + j * (kQTile + 1) + 4 * tx;
    if (packed_t && r + 3 < rows) {
      *reinterpret_cast<uint32_t*>(dst) = uint32_t(src[0]) | uint32_t(src[1]) << 8 |
                                          uint32_t(src[2]) << 16 | uint32_t(src[3]) << 24;
    } else {
      for (int q = 0; q < 4 && r + q < rows; ++q) dst[q] = src[q];
    }
  }
}
template <class T, TileKind kKind, bool kRowMajor, bool kTransposed>
__global__ void __launch_bounds__(256)
    fp8_tile_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t tiles_c,
                    int64_t scale_cols, bool pow2, Format fmt, const float* __restrict__ scale_ptr,
                    bool stochastic, RandomStream rng, uint8_t* __restrict__ codes,
                    uint8_t* __restrict__ codes_t, float* __restrict__ scales,
                    float* __restrict__ dequant, float* amax_out, bool packed_t) {
  constexpr bool kBlocks = kKind == TileKind::kCol || kKind == TileKind::kSquare;
  __shared__ float part[kBlocks ? kQRows : 1][kQTile];  // 128x1: [ty][column]; 128x128: [0][ty]
  __shared__ uint8_t tile_t[kTransposed ? kQTile : 1][kQTile + 1];  // [column][row], odd pitch
  const TileAt t(tiles_c);
  const int tx = t.tx, ty = t.ty;
  const int64_t r0 = t.r0, c0 = t.c0, c = t.c;
  const bool col_in = c < cols;
  decltype(raw4(x, 0)) v[kQPer];
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int64_t r = r0 + ty + kQRows * k;
    v[k] = col_in && r < rows ? raw4(x, r * cols + c) : raw4_zero(x);
  }
  auto scale_of = [&](float amax) {
    return numerics::fp8_scale_from_amax(amax, numerics::kE4M3Max, 0.0f, pow2);
  };
  // The encode scales of this thread's elements: sc[j] for column c + j (kTensor, kCol,
  // kSquare), or sk[k] for row k (kRow).
  float sc[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  float sk[kKind == TileKind::kRow ? kQPer : 1];
  if (kKind == TileKind::kTensor) {
    sc[0] = sc[1] = sc[2] = sc[3] = *scale_ptr;
    if (amax_out) {
      float m = 0.0f;
#pragma unroll
      for (int k = 0; k < kQPer; ++k) m = amax_fold4(m, widen4(v[k]));
      block_amax_to(m, amax_out);
    }
  } else if (kKind == TileKind::kRow) {
#pragma unroll
    for (int k = 0; k < kQPer; ++k) {
      const float a = warp_amax(amax_fold4(0.0f, widen4(v[k])));
      sk[k] = scale_of(a);
      const int64_t r = r0 + ty + kQRows * k;
      if (tx == 0 && r < rows) scales[r * scale_cols + c0 / kQTile] = 1.0f / sk[k];
    }
  } else if (kKind == TileKind::kCol) {
    float m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kQPer; ++k) amax_fold_cols(m, widen4(v[k]));
    tile_col_amax(part, t, m, [&](int j, float a) {
      sc[j] = scale_of(a);
      if (ty == 0 && col_in) scales[(r0 / kQTile) * scale_cols + c + j] = 1.0f / sc[j];
    });
  } else {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < kQPer; ++k) m = amax_fold4(m, widen4(v[k]));
    m = warp_amax(m);
    if (tx == 0) part[0][ty] = m;
    __syncthreads();
    float a = 0.0f;
    for (int y = 0; y < kQRows; ++y) a = fmaxf(a, part[0][y]);
    sc[0] = sc[1] = sc[2] = sc[3] = scale_of(a);
    if (tx == 0 && ty == 0) scales[(r0 / kQTile) * scale_cols + c0 / kQTile] = 1.0f / sc[0];
  }
#pragma unroll
  for (int k = 0; k < kQPer; ++k) {
    const int64_t r = r0 + ty + kQRows * k;
    if (!col_in || r >= rows) continue;
    const float4 f = widen4(v[k]);
    const float e[4] = {f.x, f.y, f.z, f.w};
    uint32_t packed = 0;
    float d[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float s = kKind == TileKind::kRow ? sk[kKind == TileKind::kRow ? k : 0] : sc[j];
      const int64_t i = r * cols + c + j;
      const uint8_t code =
          fp8_code(e[j] * s, fmt, stochastic, rand_bits(stochastic, rng, i));
      packed |= uint32_t(code) << (8 * j);  // little-endian: column c + j at byte j
      if (kTransposed) tile_t[4 * tx + j][ty + kQRows * k] = code;
      if (dequant) d[j] = numerics::decode_fp8_elem(code, fmt) * (1.0f / s);
    }
    if (kRowMajor) *reinterpret_cast<uint32_t*>(codes + r * cols + c) = packed;
    if (dequant)
      *reinterpret_cast<float4*>(dequant + r * cols + c) = make_float4(d[0], d[1], d[2], d[3]);
  }
  if (kTransposed) {
    __syncthreads();
    store_tile_t(&tile_t[0][0], codes_t, rows, cols, r0, c0, packed_t);
  }
}

// ---- fp8-block quantizers with few registers a thread (the cast tuner's other candidates) ----
// fp8_tile_kernel holds a whole 128 x 128 tile in 256 threads (95-126 registers a thread on
// sm_90: two blocks a multiprocessor, a quarter of its warps), and fp8-block's quantization ran
// at about a tenth of the H200's bandwidth on it (165 ms a step at Llama-3.2-1B, 16K tokens).
// The kernels below give the same bytes with a thread holding 4-16 values at a time, so a
// multiprocessor keeps many more warps and loads in flight; the cast tuner (tuned_cast) times
// them against the tiled kernel at a shape's first call and keeps the fastest.

// 1x128 blocks, row-major codes: a warp per 128-wide piece of a row (a lane its four columns:
// one 16-byte fp32 / 8-byte bf16 load, one 4-byte store of codes), U pieces a warp with their
// loads issued together; piece p = r * pieces_c + c / 128 (pieces_c = ceil(cols / 128)). Or,
// with kMx, MXFP8's 1x32 blocks, four a piece (eight lanes a block: their amax by three
// shuffles, its E8M0 scale by numerics::mxfp8_block_scale, `elem` codes). Scales: float
// [rows, pieces_c] (1 / scale), or kMx bytes [rows, ceil(cols / 32)]. Requires cols % 4 == 0
// and x, codes aligned to their vectors (the tiled kernel's rule).
template <int U, class T, bool kMx>
__global__ void __launch_bounds__(256)
    fp8_block_row_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t pieces_c,
                         bool pow2, Format elem, numerics::MxScaleRule rule,
                         uint8_t* __restrict__ codes, void* __restrict__ scales) {
  const int lane = int(threadIdx.x % 32);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t pieces = rows * pieces_c;
  const Format fmt = kMx ? elem : Format::kE4M3;
  for (int64_t p0 = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; p0 < pieces;
       p0 += U * warps) {
    decltype(raw4(x, 0)) v[U];
    int64_t at[U], row[U], col[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t p = p0 + u * warps;
      // (32-bit division where the pieces allow: a 64-bit one is a long instruction sequence)
      row[u] = pieces <= 0xFFFFFFFFll ? int64_t(uint32_t(p) / uint32_t(pieces_c)) : p / pieces_c;
      col[u] = (p - row[u] * pieces_c) * kQTile + 4 * lane;
      at[u] = p < pieces && col[u] < cols ? row[u] * cols + col[u] : -1;
      v[u] = at[u] >= 0 ? raw4(x, at[u]) : raw4_zero(x);  // +0: no change to the amax
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (p0 + u * warps >= pieces) break;  // whole warps leave together
      const float4 f = widen4(v[u]);
      float a = amax_fold4(0.0f, f), s;
      if constexpr (kMx) {
        for (int o = 1; o < 8; o <<= 1) a = fmaxf(a, __shfl_xor_sync(kFull, a, o));
        const numerics::Mxfp8BlockScale bs = numerics::mxfp8_block_scale(a, elem, rule);
        s = bs.encode_multiplier;
        if (lane % 8 == 0 && col[u] < cols)  // the block's first column: its scale
          static_cast<uint8_t*>(scales)[row[u] * ((cols + 31) / 32) + col[u] / 32] = bs.code;
      } else {
        s = numerics::fp8_scale_from_amax(warp_amax(a), numerics::kE4M3Max, 0.0f, pow2);
        if (lane == 0) static_cast<float*>(scales)[p0 + u * warps] = 1.0f / s;
      }
      if (at[u] >= 0)
        *reinterpret_cast<uint32_t*>(codes + at[u]) =
            uint32_t(fp8_code(f.x * s, fmt)) | uint32_t(fp8_code(f.y * s, fmt)) << 8 |
            uint32_t(fp8_code(f.z * s, fmt)) << 16 | uint32_t(fp8_code(f.w * s, fmt)) << 24;
    }
  }
}

// Codes written transposed (codes_t [cols, rows]) from column blocks: fp8-block's 128x1 (x^T
// and dy^T for the weight gradient), MXFP8's 32x1 (E8M0 scales by numerics::mxfp8_block_scale),
// or one per-tensor scale (the per-tensor casts' transposed and both-layouts forms: the scale
// given on the device, the amax folded from the same read, row-major codes too where asked).
// A thread block of 8 warps per 128-row x (32 E)-column tile, E = the elements in 4 bytes of
// x (fp32 1, bf16 2). Warp w loads rows 16 w .. 16 w + 15, a lane E adjacent columns of each
// (a warp one 128-byte line a row, 16 loads a thread in flight); a column block's amax is its
// 16 rows a thread, then the warps' of its block (8, or 2 for 32x1) through shared memory. A
// thread packs its 16 rows' codes of a column, consecutive bytes of codes^T, into one 16-byte
// shared store (tile row e * 32 + lane for column E lane + e: a lane's rows 144 bytes apart, so
// a quarter warp's stores fall in distinct banks), and the tile goes out as 16-byte stores, 8
// threads to each 128-byte row piece of codes^T (`vec_t`: rows % 16 == 0 and codes_t 16-byte
// aligned; else byte by byte). Elements past the edges load as +0 and are not stored.
// Requires cols % E == 0 and x aligned to 4 bytes (and the row-major codes to E bytes).
// kMx32Rows: kMx32 plus the rowwise 1x32 codes (a kind of its own: the row path doubles the
// bf16 form's registers, which the plain transposed operand should not pay).
enum class ColKind { kBlock128, kMx32, kMx32Rows, kTensor };
struct ColArgs {
  bool pow2 = false;                                          // kBlock128: power-of-two scales
  Format elem = Format::kE4M3;                                // kMx32, kTensor: the codes' format
  numerics::MxScaleRule rule = numerics::MxScaleRule::kCeil;  // kMx32
  void* scales = nullptr;  // kBlock128: float [rows / 128, cols] (1 / scale); kMx32: bytes
                           // [rows / 32, cols]
  const float* scale = nullptr;  // kTensor: the encode scale (device)
  float* amax = nullptr;         // kTensor: max |x| into it (zeroed by the launch), or null
  uint8_t* codes = nullptr;      // kTensor: the row-major codes too, or null; kMx32Rows: the
                                 // rowwise 1x32 codes (as quantize_mxfp8's rowwise form)
  uint8_t* row_scales = nullptr;  // kMx32Rows: their E8M0 bytes [rows, ceil(cols / 32)]
};
constexpr int kColPitch = 144;  // bytes a shared tile row: 128 codes + 16
// A thread's place in fp8_col_t_kernel's tile: lane, warp, the tile's first row and the
// thread's first column.
struct ColTAt {
  int lane, w;
  int64_t r0, c;
  __device__ ColTAt(int64_t tiles_c, int E)
      : lane(int(threadIdx.x % 32)),
        w(int(threadIdx.x / 32)),
        r0(int64_t(blockIdx.x / tiles_c) * kQTile),
        c(int64_t(blockIdx.x % tiles_c) * 32 * E + E * lane) {}
};
template <class T>
using ColRaw = std::conditional_t<sizeof(T) == 4, float, uint32_t>;  // E elements of x
// The body of fp8_col_t_kernel after its loads: v[k] holds the thread's E elements of row
// r0 + 16 w + k (+0 past the edges). part and tile_v: the kernel's shared arrays. Every thread
// of the block calls it; it ends with the tile's stores, so a second call on the same shared
// arrays needs a barrier first.
template <class T, ColKind kKind>
__device__ __forceinline__ void col_t_codes(const ColRaw<T> (&v)[16], const ColTAt& at,
                                            int64_t rows, int64_t cols, const ColArgs& args,
                                            uint8_t* __restrict__ codes_t, bool vec_t,
                                            float (*part)[32 * (4 / int(sizeof(T)))],
                                            uint4 (*tile_v)[kColPitch / 16]) {
  constexpr int E = 4 / int(sizeof(T)), W = 32 * E;
  using Raw = ColRaw<T>;
  auto tile_t = [&](int t) { return reinterpret_cast<uint8_t*>(tile_v[t]); };
  const int lane = at.lane, w = at.w;
  const int64_t r0 = at.r0, c = at.c;
  const bool col_in = c < cols;
  auto elem_of = [](Raw raw, int e) -> float {
    if constexpr (sizeof(T) == 4) return raw;
    else return numerics::decode_bf16(uint16_t(e == 0 ? raw & 0xFFFFu : raw >> 16));
  };
  float m_all = 0.0f;  // kTensor: the thread's amax
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 16; ++k) m = numerics::amax_fold(m, elem_of(v[k], e));
    if constexpr (kKind == ColKind::kTensor) m_all = fmaxf(m_all, m);
    else part[w][e * 32 + lane] = m;
  }
  if constexpr (kKind != ColKind::kTensor) __syncthreads();
  constexpr bool kMx = kKind == ColKind::kMx32 || kKind == ColKind::kMx32Rows;
  constexpr int kWarpsABlock = kMx ? 2 : 8;  // 32 or 128 rows
  const int w0 = w / kWarpsABlock * kWarpsABlock;
  const Format fmt = kKind == ColKind::kBlock128 ? Format::kE4M3 : args.elem;
  uint32_t qs[E][4];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float s;
    if constexpr (kKind == ColKind::kTensor) {
      s = *args.scale;
    } else {
      float a = 0.0f;
      for (int y = w0; y < w0 + kWarpsABlock; ++y) a = fmaxf(a, part[y][e * 32 + lane]);
      if constexpr (kMx) {
        const numerics::Mxfp8BlockScale bs = numerics::mxfp8_block_scale(a, args.elem, args.rule);
        s = bs.encode_multiplier;
        if (w == w0 && col_in && r0 + 16 * w < rows)
          static_cast<uint8_t*>(args.scales)[(r0 / 32 + w / 2) * cols + c + e] = bs.code;
      } else {
        s = numerics::fp8_scale_from_amax(a, numerics::kE4M3Max, 0.0f, args.pow2);
        if (w == 0 && col_in)
          static_cast<float*>(args.scales)[(r0 / kQTile) * cols + c + e] = 1.0f / s;
      }
    }
    uint32_t* q = qs[e];  // 16 rows' codes, row k at byte k % 4 of q[k / 4]
    q[0] = q[1] = q[2] = q[3] = 0u;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      q[k / 4] |= uint32_t(fp8_code(elem_of(v[k], e) * s, fmt)) << (8 * (k % 4));
    tile_v[e * 32 + lane][w] = make_uint4(q[0], q[1], q[2], q[3]);
  }
  if constexpr (kKind == ColKind::kTensor) {
    if (args.codes && col_in)  // row-major too: each row's E codes of this lane in one store
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int64_t row = r0 + 16 * w + k;
        if (row >= rows) break;
        const uint32_t c0 = (qs[0][k / 4] >> (8 * (k % 4))) & 0xFFu;
        if constexpr (E == 2) {
          const uint32_t c1 = (qs[E - 1][k / 4] >> (8 * (k % 4))) & 0xFFu;
          *reinterpret_cast<uint16_t*>(args.codes + row * cols + c) = uint16_t(c0 | c1 << 8);
        } else {
          args.codes[row * cols + c] = uint8_t(c0);
        }
      }
  }
  if constexpr (kKind == ColKind::kMx32Rows) {  // MXFP8's 1x32 row blocks from the same
    // loads: a block is 32 / E lanes
    constexpr int kLanes = 32 / E;
    const int64_t scale_cols = (cols + 31) / 32;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      float a = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) a = numerics::amax_fold(a, elem_of(v[k], e));
      for (int o = 1; o < kLanes; o <<= 1) a = fmaxf(a, __shfl_xor_sync(kFull, a, o));
      const numerics::Mxfp8BlockScale bs = numerics::mxfp8_block_scale(a, args.elem, args.rule);
      const int64_t row = r0 + 16 * w + k;
      if (row >= rows || !col_in) continue;  // (after the shuffles: every lane takes part)
      if (lane % kLanes == 0) args.row_scales[row * scale_cols + c / 32] = bs.code;
      uint32_t q = 0;
#pragma unroll
      for (int e = 0; e < E; ++e)
        q |= uint32_t(fp8_code(elem_of(v[k], e) * bs.encode_multiplier, args.elem)) << (8 * e);
      if constexpr (E == 2)
        *reinterpret_cast<uint16_t*>(args.codes + row * cols + c) = uint16_t(q);
      else
        args.codes[row * cols + c] = uint8_t(q);
    }
  }
  __syncthreads();
  // codes^T row (x column) c0 + E (t % 32) + t / 32 from tile row t, bytes r0 + 16 q .. + 15
  const int q = int(threadIdx.x % 8);
  const int64_t r = r0 + 16 * q;
  for (int t = int(threadIdx.x / 8); t < W; t += 32) {
    const int64_t col = c - E * lane + E * (t % 32) + t / 32;
    if (col >= cols || r >= rows) continue;
    uint8_t* dst = codes_t + col * rows + r;
    if (vec_t && r + 15 < rows) {
      *reinterpret_cast<uint4*>(dst) = tile_v[t][q];
    } else {
      for (int b = 0; b < 16 && r + b < rows; ++b) dst[b] = tile_t(t)[16 * q + b];
    }
  }
  if constexpr (kKind == ColKind::kTensor)
    if (args.amax) block_amax_to(m_all, args.amax);
}
template <class T, ColKind kKind>
__global__ void __launch_bounds__(256)
    fp8_col_t_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t tiles_c,
                     ColArgs args, uint8_t* __restrict__ codes_t, bool vec_t) {
  constexpr int E = 4 / int(sizeof(T)), W = 32 * E;
  using Raw = ColRaw<T>;
  __shared__ float part[kKind == ColKind::kTensor ? 1 : 8][W];
  __shared__ uint4 tile_v[W][kColPitch / 16];  // uint4: 16-byte aligned rows
  const ColTAt at(tiles_c, E);
  const bool col_in = at.c < cols;
  Raw v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int64_t r = at.r0 + 16 * at.w + k;
    v[k] = col_in && r < rows ? *reinterpret_cast<const Raw*>(x + r * cols + at.c) : Raw(0);
  }
  col_t_codes<T, kKind>(v, at, rows, cols, args, codes_t, vec_t, part, tile_v);
}

// One pass of a 32 x 8 thread block over its 128 x 128 tile of x [rows, cols] at rows r0..,
// the thread's four columns from c (cols % 4 == 0: all in or all out): rows ty, ty + 8, ...,
// ty + 120 of the tile in batches of four whose loads are issued together, then f(i, v) for
// each (i: the row in the tile; v: its four elements, widened). Past the edges the elements
// load as +0 (no change to an amax); kInside skips those rows and columns instead (f may then
// not be a warp's collective).
// x: a pointer to fp32 or bf16 codes, or a source such as SwigluGrads (its raw4, raw4_zero
// and widen4; f then takes what its widen4 gives).
template <bool kInside, class S, class F>
__device__ __forceinline__ void tile_pass(const S& x, int64_t rows, int64_t cols, int64_t r0,
                                          int64_t c, F&& f) {
  constexpr int kBatch = 4;
  const int ty = int(threadIdx.y);
  const bool col_in = c < cols;
  for (int k0 = 0; k0 < kQPer; k0 += kBatch) {
    decltype(raw4(x, 0)) v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t r = r0 + ty + kQRows * (k0 + b);
      v[b] = col_in && r < rows ? raw4(x, r * cols + c) : raw4_zero(x);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = ty + kQRows * (k0 + b);
      if (kInside && (!col_in || r0 + i >= rows)) continue;
      f(i, widen4(v[b]));
    }
  }
}

// 128x128 blocks (fp8-block's weights), codes row-major or written transposed (W^T for the
// data gradient): a thread block of 32 x 8 threads per block, as fp8_tile_kernel, but reading
// the block twice instead of holding it: the amax from a first pass, the codes from a second
// (the block's 64 KB of fp32 are still in L2 then), four vectors a thread in flight at a time,
// so a thread holds 16 values where the tiled kernel holds 64 (fp32: 110-122 registers).
template <class T, bool kTransposed>
__global__ void __launch_bounds__(256)
    fp8_block_square_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t tiles_c,
                            bool pow2, uint8_t* __restrict__ codes, float* __restrict__ scales,
                            bool packed_t) {
  __shared__ float part[kQRows];
  __shared__ uint8_t tile_t[kTransposed ? kQTile : 1][kQTile + 1];  // [column][row], odd pitch
  const TileAt t(tiles_c);
  const int tx = t.tx, ty = t.ty;
  const int64_t r0 = t.r0, c0 = t.c0, c = t.c;
  float m = 0.0f;
  tile_pass<false>(x, rows, cols, r0, c, [&](int, float4 f) { m = amax_fold4(m, f); });
  m = warp_amax(m);
  if (tx == 0) part[ty] = m;
  __syncthreads();
  float a = 0.0f;
  for (int y = 0; y < kQRows; ++y) a = fmaxf(a, part[y]);
  const float s = numerics::fp8_scale_from_amax(a, numerics::kE4M3Max, 0.0f, pow2);
  if (tx == 0 && ty == 0) scales[(r0 / kQTile) * tiles_c + c0 / kQTile] = 1.0f / s;
  tile_pass<true>(x, rows, cols, r0, c, [&](int i, float4 f) {  // the second read, the codes
    const uint8_t q[4] = {fp8_code(f.x * s, Format::kE4M3), fp8_code(f.y * s, Format::kE4M3),
                          fp8_code(f.z * s, Format::kE4M3), fp8_code(f.w * s, Format::kE4M3)};
    if (kTransposed) {
#pragma unroll
      for (int j = 0; j < 4; ++j) tile_t[4 * tx + j][i] = q[j];
    } else {
      *reinterpret_cast<uint32_t*>(codes + (r0 + i) * cols + c) =
          uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
    }
  });
  if (kTransposed) {
    __syncthreads();
    store_tile_t(&tile_t[0][0], codes, rows, cols, r0, c0, packed_t);
  }
}

// A gradient's two fp8-block operands from one read of it (quantize_fp8_block_both): 1x128
// blocks with codes [rows, cols] (the data gradient's dy) and 128x1 blocks with codes_t
// [cols, rows] (the weight gradient's dy^T). A 32 x 8 thread block per 128 x 128 tile, as
// fp8_block_square_kernel, in its two passes: the first folds both amaxes from the same
// loads, a row piece's across its warp (the warp's 32 x 4 columns are the 1x128 block; its
// encode scale into shared memory, row_s), a column's over the thread's 16 rows and then the
// 8 rows of threads through shared memory (sc: the thread's 4 columns); the second reads the
// tile again (from L2: 64 KB fp32) and writes each element twice, at its row's scale into codes
// and at its column's into the shared tile that goes out transposed (store_tile_t). The rules
// and the amaxes are fp8_block_kernel's, so the bytes are the two separate quantizations'.
// Requires cols % 4 == 0 and x and codes aligned to their vectors. K = 1: x fp32 or bf16
// codes, its operands into out0 (out1 unused). K = 2: fp8-block's SwiGLU backward (x a
// SwigluGrads): dg's and du's two operands each (out0, out1) from ds, g and u, dg and du as swiglu_backward_bf16 stores them, each pass
// making both gradients from the three loads (the second from L2), both gradients' amaxes,
// scales and transposed tiles side by side (38 KB of shared memory).
__device__ inline const float4& output4(const float4& f, int) { return f; }
__device__ inline const float4& output4(const Grads4& f, int o) { return f.v[o]; }
template <class S, int K>
__global__ void __launch_bounds__(256)
    fp8_block_both_kernel(S x, int64_t rows, int64_t cols, int64_t tiles_c, bool pow2,
                          BlockOperands out0, BlockOperands out1, bool packed_t) {
  __shared__ float part[kQRows][kQTile];  // [ty][column]: the column amaxes of 16 rows
  __shared__ float row_s[K][kQTile];                 // the tile rows' encode scales
  __shared__ uint8_t tile_t[K][kQTile][kQTile + 1];  // [column][row], odd pitch
  const TileAt t(tiles_c);
  const int tx = t.tx, ty = t.ty;
  const int64_t r0 = t.r0, c0 = t.c0, c = t.c;
  const bool col_in = c < cols;
  auto scale_of = [&](float amax) {
    return numerics::fp8_scale_from_amax(amax, numerics::kE4M3Max, 0.0f, pow2);
  };
  auto out = [&](int o) -> const BlockOperands& { return o ? out1 : out0; };
  const int64_t scale_cols = tiles_c;  // 1x128 scales [rows, ceil(cols / 128)]
  float m[K][4] = {};
  tile_pass<false>(x, rows, cols, r0, c, [&](int i, const auto& f) {  // every thread: warp_amax
#pragma unroll
    for (int o = 0; o < K; ++o) {
      amax_fold_cols(m[o], output4(f, o));
      const float sr = scale_of(warp_amax(amax_fold4(0.0f, output4(f, o))));
      if (tx == 0) {
        row_s[o][i] = sr;
        if (r0 + i < rows) out(o).row_scales[(r0 + i) * scale_cols + c0 / kQTile] = 1.0f / sr;
      }
    }
  });
  float sc[K][4];
  for (int o = 0; o < K; ++o) {
    if (o) __syncthreads();  // the first call's reads of part before the second's writes
    tile_col_amax(part, t, m[o], [&](int j, float a) {
      sc[o][j] = scale_of(a);
      if (ty == 0 && col_in) out(o).col_scales[(r0 / kQTile) * cols + c + j] = 1.0f / sc[o][j];
    });
  }
  tile_pass<true>(x, rows, cols, r0, c, [&](int i, const auto& f) {  // the second read, the codes
#pragma unroll
    for (int o = 0; o < K; ++o) {
      const float4 v = output4(f, o);
      const float e[4] = {v.x, v.y, v.z, v.w};
      const float sr = row_s[o][i];
      uint32_t packed = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        packed |= uint32_t(fp8_code(e[j] * sr, Format::kE4M3)) << (8 * j);
        tile_t[o][4 * tx + j][i] = fp8_code(e[j] * sc[o][j], Format::kE4M3);
      }
      *reinterpret_cast<uint32_t*>(out(o).codes + (r0 + i) * cols + c) = packed;
    }
  });
  __syncthreads();
  for (int o = 0; o < K; ++o)
    store_tile_t(&tile_t[o][0][0], out(o).codes_t, rows, cols, r0, c0, packed_t);
}

template <class T>
__global__ void mxfp8_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t br,
                             int64_t bc, int64_t scale_rows, int64_t scale_cols, Format elem,
                             numerics::MxScaleRule rule, bool stochastic, RandomStream rng,
                             uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                             float* __restrict__ dequant) {
  const int64_t b = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= scale_rows * scale_cols) return;
  const BlockGeom g = block_geom(b, scale_cols, rows, cols, br, bc);
  const float amax = block_amax(x, cols, g, lane);
  const numerics::Mxfp8BlockScale bs = numerics::mxfp8_block_scale(amax, elem, rule);
  if (lane == 0) scales[b] = bs.code;
  for_lane_elements(g, cols, lane, [&](int64_t i) {
    const uint8_t c = fp8_code(load(x, i) * bs.encode_multiplier, elem, stochastic,
                                 rand_bits(stochastic, rng, i));
    codes[i] = c;
    if (dequant) dequant[i] = numerics::decode_fp8_elem(c, elem) * bs.decode_scale;
  });
}

// NVFP4: a lane writes whole bytes (columns 2j, 2j + 1 share a byte and always a block, since
// blocks are 16 wide and start at even columns), so no two lanes touch one byte.
// T (16x16 blocks; rows and cols multiples of 16): the bytes of x^T's quantization instead,
// the same blocks read from x, each written at its transposed place: scale [cols / 16,
// rows / 16], codes [cols, rows / 2] (a byte holds rows 2j, 2j + 1 of one column of x), the
// stochastic bits and dequant by the element's index in x^T. A block's amax, scale and codes
// are its elements', so these are quantize_nvfp4(x^T, 16x16)'s bytes without x^T in memory.
template <bool T>
__global__ void nvfp4_kernel(const float* __restrict__ x, int64_t rows, int64_t cols, int64_t br,
                             int64_t scale_rows, int64_t scale_cols,
                             const float* __restrict__ global_amax, bool stochastic,
                             RandomStream rng, uint8_t* __restrict__ codes,
                             uint8_t* __restrict__ scales, float* __restrict__ global_scale,
                             float* __restrict__ dequant) {
  const int64_t b = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const float s_enc = numerics::nvfp4_global_encode_scale(*global_amax);
  if (b == 0 && lane == 0) *global_scale = s_enc;
  if (b >= scale_rows * scale_cols) return;
  const BlockGeom g = block_geom(b, scale_cols, rows, cols, br, 16);
  const float amax = block_amax(x, cols, g, lane);
  const numerics::Nvfp4BlockScale bs = numerics::nvfp4_block_scale(amax, s_enc);
  if (lane == 0) scales[T ? (g.c0 / 16) * scale_rows + g.r0 / 16 : b] = bs.code;
  // a byte's two elements: along x's row (x^T's column with T); `pairs` of them a line
  const int64_t lines = T ? g.nc : g.nr, pairs = ((T ? g.nr : g.nc) + 1) / 2;
  const int64_t code_cols = ((T ? rows : cols) + 1) / 2;
  for (int64_t e = lane; e < lines * pairs; e += 32) {
    const int64_t line = e / pairs, p = 2 * (e % pairs);
    const int64_t r = T ? g.r0 + p : g.r0 + line, c = T ? g.c0 + line : g.c0 + p;
    uint8_t byte = 0;
    for (int64_t k = 0; k < 2 && p + k < (T ? g.nr : g.nc); ++k) {
      const int64_t i = T ? (r + k) * cols + c : r * cols + c + k;
      const int64_t o = T ? c * rows + r + k : i;  // the index in the quantized operand
      const uint8_t code =
          numerics::encode_e2m1(x[i] * bs.encode_multiplier, numerics::Saturation::kSatFinite,
                                stochastic, rand_bits(stochastic, rng, o));
      byte = uint8_t(byte | (k ? code << 4 : code));
      if (dequant) dequant[o] = numerics::decode_e2m1(code) * bs.decode_scale;
    }
    codes[T ? c * code_cols + r / 2 : r * code_cols + c / 2] = byte;
  }
}

// The 16-point random Hadamard transform of numerics::rht16_forward on 16 values in registers,
// with the CPU's operations in the CPU's order: in_j = s_j v_j, then for each i the sum over
// j = 0..15 of (+-1) in_j from 0, times 0.25 (exact). The products by +-1 are exact, so a
// contracted fma rounds as the separate add does: same bits. sign_bits: bit j set where s_j < 0.
__device__ __forceinline__ void rht16_values(float (&v)[16], uint32_t sign_bits) {
  float in[16], acc[16];
#pragma unroll
  for (int j = 0; j < 16; ++j) in[j] = ((sign_bits >> j) & 1u) ? -v[j] : v[j];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] += (__popc(unsigned(i & j)) & 1) ? -in[j] : in[j];
#pragma unroll
  for (int i = 0; i < 16; ++i) v[i] = 0.25f * acc[i];
}

// One nvfp4 1x16 block of 16 values whose first element is element i0 of the operand (the
// index its stochastic bits take): the block's scale byte into *scale and its 16 E2M1 codes,
// two a byte (element 2j in byte j's low nibble), as 8 bytes: nvfp4_kernel's per-element steps.
__device__ __forceinline__ uint2 nvfp4_block16(const float (&v)[16], float s_enc,
                                               bool stochastic, const RandomStream& rng,
                                               int64_t i0, uint8_t* scale) {
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 16; ++k) m = numerics::amax_fold(m, v[k]);
  const numerics::Nvfp4BlockScale bs = numerics::nvfp4_block_scale(m, s_enc);
  *scale = bs.code;
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const uint32_t code =
        numerics::encode_e2m1(v[k] * bs.encode_multiplier, numerics::Saturation::kSatFinite,
                              stochastic, rand_bits(stochastic, rng, i0 + k));
    w[k / 8] |= code << (4 * (k % 8));
  }
  return make_uint2(w[0], w[1]);
}

// quantize_nvfp4_rows: block b is elements 16b .. 16b + 15 of x (cols a multiple of 16), its
// scale byte b and its codes bytes 8b .. 8b + 7. vec: x aligned for raw4.
template <class T>
__global__ void nvfp4_rows_kernel(const T* __restrict__ x, int64_t blocks,
                                  const float* __restrict__ global_amax, bool stochastic,
                                  RandomStream rng, uint8_t* __restrict__ codes,
                                  uint8_t* __restrict__ scales, float* __restrict__ global_scale,
                                  bool vec) {
  const float s_enc = numerics::nvfp4_global_encode_scale(*global_amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *global_scale = s_enc;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < blocks;
       b += int64_t(gridDim.x) * blockDim.x) {
    float v[16];
    if (vec) {
      decltype(raw4(x, 0)) raw[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) raw[q] = raw4(x, 16 * b + 4 * q);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 f = widen4(raw[q]);
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = load(x, 16 * b + k);
    }
    reinterpret_cast<uint2*>(codes)[b] = nvfp4_block16(v, s_enc, stochastic, rng, 16 * b,
                                                       scales + b);
  }
}

// The rows' 1x16 blocks of one thread's 16 elements v (column c, rows 16g .. 16g + 15), cols a
// multiple of 16: each half-warp holds 16 consecutive columns of the same rows, so row r's
// block is one element from each of its lanes: the block's amax by four shuffles, each lane
// encodes its element, the even lanes store a byte with their odd neighbour's code. The whole
// warp calls it; a lane not `valid` stores nothing.
__device__ __forceinline__ void nvfp4_rows_codes(const float (&v)[16], int64_t g, int64_t c,
                                                 int64_t cols, int lane, bool valid,
                                                 float s_enc, bool stochastic,
                                                 const RandomStream& rng,
                                                 uint8_t* __restrict__ codes,
                                                 uint8_t* __restrict__ scales) {
  for (int j = 0; j < 16; ++j) {
    float bm = numerics::amax_fold(0.0f, v[j]);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(kFull, bm, o));
    const numerics::Nvfp4BlockScale bs = numerics::nvfp4_block_scale(bm, s_enc);
    const int64_t r = 16 * g + j;
    const uint32_t code =
        numerics::encode_e2m1(v[j] * bs.encode_multiplier, numerics::Saturation::kSatFinite,
                              stochastic, rand_bits(stochastic, rng, r * cols + c));
    const uint32_t high = __shfl_down_sync(kFull, code, 1);
    if (valid && lane % 2 == 0) codes[r * (cols / 2) + c / 2] = uint8_t(code | high << 4);
    if (valid && lane % 16 == 0) scales[r * (cols / 16) + c / 16] = bs.code;
  }
}

// nvfp4's weight-gradient operand RHT(x^T) [cols, rows] (quantize_nvfp4_rht_t) and, with ROWS,
// x's 1x16 rows beside it from the same read (quantize_nvfp4_both: an output gradient's two
// operands). Thread t = g * cols + c loads column c's rows 16g .. 16g + 15 (a warp's loads run
// along x's rows), transforms them in registers and quantizes them as block (c, g) of x^T:
// scale byte c * rows / 16 + g, codes bytes c * rows / 2 + 8g .. + 7; with ROWS it first makes
// those rows' blocks across its half-warp (nvfp4_rows_codes; cols a multiple of 16). Whole
// warps run each iteration (the shuffles); a half-warp past the end stores nothing.
// AMAX: the amaxes into the slots the launch zeroed, max |x| into amax[0] (ROWS) and
// max |RHT(x^T)| into the next; else the codes and scales from those, each layout with its
// own rounding.
template <bool AMAX, bool ROWS, class T>
__global__ void nvfp4_cols_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                  uint32_t sign_bits, float* amax, bool sr_rows,
                                  RandomStream rng_rows, bool sr_t, RandomStream rng_t,
                                  uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                                  float* __restrict__ global, uint8_t* __restrict__ codes_t,
                                  uint8_t* __restrict__ scales_t,
                                  float* __restrict__ global_t) {
  const int lane = int(threadIdx.x % 32);
  const int64_t n = rows / 16 * cols;
  float* const amax_t = amax + (ROWS ? 1 : 0);
  float s_rows = 1.0f, s_t = 1.0f, m_rows = 0.0f, m_t = 0.0f;
  if constexpr (!AMAX) {
    if (ROWS) s_rows = numerics::nvfp4_global_encode_scale(amax[0]);
    s_t = numerics::nvfp4_global_encode_scale(*amax_t);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (ROWS) *global = s_rows;
      *global_t = s_t;
    }
  }
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) + threadIdx.x - lane; base < n;
       base += step) {
    const int64_t t = base + lane;
    const bool valid = t < n;
    const int64_t g = valid ? t / cols : 0, c = valid ? t - g * cols : 0;
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = valid ? load(x, (16 * g + j) * cols + c) : 0.0f;
    if constexpr (AMAX) {
      if constexpr (ROWS) {
#pragma unroll
        for (int j = 0; j < 16; ++j) m_rows = numerics::amax_fold(m_rows, v[j]);
      }
      rht16_values(v, sign_bits);
#pragma unroll
      for (int j = 0; j < 16; ++j) m_t = numerics::amax_fold(m_t, v[j]);
    } else {
      if constexpr (ROWS)
        nvfp4_rows_codes(v, g, c, cols, lane, valid, s_rows, sr_rows, rng_rows, codes, scales);
      rht16_values(v, sign_bits);
      if (valid)
        reinterpret_cast<uint2*>(codes_t + c * (rows / 2))[g] = nvfp4_block16(
            v, s_t, sr_t, rng_t, c * rows + 16 * g, scales_t + c * (rows / 16) + g);
    }
  }
  if constexpr (AMAX) {
    if constexpr (ROWS) {
      block_amax_to(m_rows, amax);
      __syncthreads();  // (block_amax's shared slots are taken again)
    }
    block_amax_to(m_t, amax_t);
  }
}

// ---- codes-only per-tensor FP8 (tensor-core Linears) ------------------------------------------
__global__ void fp8_scales_kernel(float* scale, float* scale_inv, const float* amax, float given,
                                  float fmt_max) {
  const float sc = amax ? numerics::fp8_scale_from_amax(*amax, fmt_max, 0.0f, false) : given;
  *scale = sc;
  *scale_inv = 1.0f / sc;  // the decode multiplier, as quantize_fp8_tensor stores it
}

// amax (may be null): max |x| as well, from the same read (block_amax_to).
// vec4 (n a multiple of 4, x 16-byte (fp32) / 8-byte (bf16) and codes 4-byte aligned): four
// elements a thread an iteration, one vector load and one 4-byte store of their codes (the
// same codes: each byte is its element's encode_fp8_elem), instead of a 1-byte store each.
template <int U, class T>
__global__ void fp8_codes_kernel(const T* __restrict__ x, int64_t n, Format fmt,
                                 const float* __restrict__ scale_ptr, uint8_t* __restrict__ codes,
                                 float* amax, bool vec4) {
  const float scale = *scale_ptr;
  float m = 0.0f;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (vec4) {  // U vectors a thread an iteration, their loads issued together
    const int64_t nv = n / 4;
    auto code = [&](float e) {
      return uint32_t(fp8_code(e * scale, fmt));
    };
    for (int64_t j0 = first; j0 < nv; j0 += U * stride) {
      decltype(raw4(x, 0)) raw[U];
      load4_batch<U>(raw, x, j0, stride, nv);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t j = j0 + u * stride;
        if (j >= nv) break;
        const float4 v = widen4(raw[u]);
        m = amax_fold4(m, v);
        const uint32_t packed = code(v.x) | code(v.y) << 8 | code(v.z) << 16 | code(v.w) << 24;
        reinterpret_cast<uint32_t*>(codes)[j] = packed;  // little-endian: element 4j at byte 0
      }
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      const float v = load(x, i);
      m = numerics::amax_fold(m, v);
      codes[i] = fp8_code(v * scale, fmt);
    }
  }
  if (amax) block_amax_to(m, amax);
}

// 32 x 32 tiles through shared memory (transpose_kernel below): reads and writes both run
// along rows.
constexpr int kTile = 32, kTileRows = 8;
// The transposing codes kernel's tiles: kCodesTileRows rows of x by kTile columns, so that each
// row of codes^T gets kCodesTileRows = 4 x 32 consecutive bytes: one 4-byte store a thread
// (`packed`: rows a multiple of 4 and codes_t 4-byte aligned; else byte by byte), 128 bytes a
// warp, where 32 x 32 tiles stored 32.
constexpr int kCodesTileRows = 128;
// The rows of a tile each thread reads (the block is kTile x kTileRows threads).
constexpr int kCodesRowsPerThread = kCodesTileRows / kTileRows;
// Bytes tile[i .. i + 3][j] (x's rows r .. r + 3 of a tile column) to dst, codes^T's row:
// one 4-byte store where `packed` and all four rows exist (`left` = rows - r), else byte by
// byte.
using CodesTile = uint8_t[kCodesTileRows][kTile + 1];
// The write phase of a row tile at (r0, c0): f(i, j, offset, left) for each of this thread's
// 4-row pieces of codes^T's row c0 + j that exist (x's rows r0 + i ..; offset = that row's
// element in codes^T, left = rows - (r0 + i)).
template <class F>
__device__ __forceinline__ void tile_columns(int64_t r0, int64_t c0, int64_t rows, int64_t cols,
                                             F&& f) {
  const int i = 4 * int(threadIdx.x);
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t ct = c0 + j, r = r0 + i;
    if (ct >= cols || r >= rows) continue;
    f(i, j, ct * rows + r, rows - r);
  }
}
__device__ __forceinline__ void store_tile_column(const CodesTile& tile, int i, int j,
                                                  uint8_t* dst, bool packed, int64_t left) {
  if (packed && left > 3) {
    *reinterpret_cast<uint32_t*>(dst) = uint32_t(tile[i][j]) | uint32_t(tile[i + 1][j]) << 8 |
                                        uint32_t(tile[i + 2][j]) << 16 |
                                        uint32_t(tile[i + 3][j]) << 24;
  } else {
    for (int k = 0; k < 4 && k < left; ++k) dst[k] = tile[i + k][j];
  }
}
// codes (may be null): the row-major codes too, written as x is read (fp8_codes_both).
// amax (may be null): max |x| too, as fp8_codes_kernel.
// x: what load(x, i) reads: fp32, bf16 codes, or SwiGLU's product of two codes (SwigluCodes).
template <class S>
__device__ __forceinline__ void codes_t_tiles(S x, int64_t rows, int64_t cols, Format fmt,
                                              const float* __restrict__ scale_ptr,
                                              uint8_t* __restrict__ codes_t,
                                              uint8_t* __restrict__ codes, float* amax,
                                              bool packed) {
  // [x row][x column]; the odd pitch keeps the write phase's column reads off one bank
  __shared__ uint8_t tile[kCodesTileRows][kTile + 1];
  const float scale = *scale_ptr;
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  float m = 0.0f;
  // Row tiles beyond grid y's limit (65535 x 128 rows) are taken by the same blocks in turn.
  const int64_t c = c0 + threadIdx.x;
  for (int64_t r0 = int64_t(blockIdx.y) * kCodesTileRows; r0 < rows;
       r0 += int64_t(gridDim.y) * kCodesTileRows) {
    // All of a thread's kCodesRowsPerThread loads first (predicated, so issued back to back),
    // then their codes. Written as one loop of load, encode, store, the SASS (sm_90, cuobjdump)
    // waited on each load before issuing the next: one 128-byte load in flight a warp, far too
    // few bytes in flight to cover the memory latency (Little's law).
    float v[kCodesRowsPerThread];
#pragma unroll
    for (int k = 0; k < kCodesRowsPerThread; ++k) {
      const int64_t r = r0 + threadIdx.y + k * kTileRows;
      v[k] = r < rows && c < cols ? load(x, r * cols + c) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kCodesRowsPerThread; ++k) {
      const int i = int(threadIdx.y) + k * kTileRows;
      const int64_t r = r0 + i;
      if (r < rows && c < cols) {
        m = numerics::amax_fold(m, v[k]);
        const uint8_t code = fp8_code(v[k] * scale, fmt);
        tile[i][threadIdx.x] = code;
        if (codes) codes[r * cols + c] = code;
      }
    }
    __syncthreads();
    // codes^T row c (x's column c), bytes r0 + 4 tx .. r0 + 4 tx + 3 (x's rows) from this thread
    tile_columns(r0, c0, rows, cols, [&](int i, int j, int64_t at, int64_t left) {
      store_tile_column(tile, i, j, codes_t + at, packed, left);
    });
    __syncthreads();  // the tile is read before the next row tile overwrites it
  }
  if (amax) block_amax_to(m, amax);
}
template <class T>
__global__ void fp8_codes_t_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                   Format fmt, const float* __restrict__ scale_ptr,
                                   uint8_t* __restrict__ codes_t, uint8_t* __restrict__ codes,
                                   float* amax, bool packed) {
  codes_t_tiles(x, rows, cols, fmt, scale_ptr, codes_t, codes, amax, packed);
}

__device__ inline float load(const SwigluCodes& x, int64_t i) {
  return numerics::decode_bf16(swiglu_code(x.g[i], x.u[i]));
}
__global__ void fp8_codes_t_swiglu_kernel(const uint16_t* __restrict__ g,
                                          const uint16_t* __restrict__ u, int64_t rows,
                                          int64_t cols, Format fmt,
                                          const float* __restrict__ scale_ptr,
                                          uint8_t* __restrict__ codes_t,
                                          uint8_t* __restrict__ codes, float* amax, bool packed) {
  codes_t_tiles(SwigluCodes{g, u}, rows, cols, fmt, scale_ptr, codes_t, codes, amax, packed);
}
// SwiGLU's backward on the bf16 path straight into the FP8 operands of gate's and up's
// backward: dg and du as swiglu_backward_bf16 rounds them (swiglu_grads of the widened codes,
// then RNE to bf16), each encoded twice, row-major at its data gradient's scale and format
// (scale[0] dg, scale[2] du: fmt_rows) and transposed at its weight gradient's (scale[1],
// scale[3]: fmt_cols), from one read of ds, g and u; amax[0] = max |dg|, amax[1] = max |du|
// (zeroed by the launch; may be null). The tiles and stores of codes_t_tiles, twice.
__global__ void swiglu_backward_fp8_kernel(
    const uint16_t* __restrict__ ds, const uint16_t* __restrict__ g,
    const uint16_t* __restrict__ u, int64_t rows, int64_t cols, Format fmt_rows,
    Format fmt_cols, const float* __restrict__ scales, uint8_t* __restrict__ dg_rows,
    uint8_t* __restrict__ dg_cols, uint8_t* __restrict__ du_rows, uint8_t* __restrict__ du_cols,
    float* amax, bool packed) {
  __shared__ uint8_t tile_g[kCodesTileRows][kTile + 1];
  __shared__ uint8_t tile_u[kCodesTileRows][kTile + 1];
  const float sg_r = scales[0], sg_c = scales[1], su_r = scales[2], su_c = scales[3];
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  const int64_t c = c0 + threadIdx.x;
  float mg = 0.0f, mu = 0.0f;
  for (int64_t r0 = int64_t(blockIdx.y) * kCodesTileRows; r0 < rows;
       r0 += int64_t(gridDim.y) * kCodesTileRows) {
    uint16_t vd[kCodesRowsPerThread], vg[kCodesRowsPerThread], vu[kCodesRowsPerThread];
#pragma unroll
    for (int k = 0; k < kCodesRowsPerThread; ++k) {  // every load first (codes_t_tiles)
      const int64_t r = r0 + threadIdx.y + k * kTileRows;
      const bool in = r < rows && c < cols;
      vd[k] = in ? ds[r * cols + c] : uint16_t(0);
      vg[k] = in ? g[r * cols + c] : uint16_t(0);
      vu[k] = in ? u[r * cols + c] : uint16_t(0);
    }
#pragma unroll
    for (int k = 0; k < kCodesRowsPerThread; ++k) {
      const int i = int(threadIdx.y) + k * kTileRows;
      const int64_t r = r0 + i;
      if (r < rows && c < cols) {
        float dg, du;
        swiglu_grad_codes(vd[k], vg[k], vu[k], dg, du);
        mg = numerics::amax_fold(mg, dg);
        mu = numerics::amax_fold(mu, du);
        dg_rows[r * cols + c] = fp8_code(dg * sg_r, fmt_rows);
        du_rows[r * cols + c] = fp8_code(du * su_r, fmt_rows);
        tile_g[i][threadIdx.x] = fp8_code(dg * sg_c, fmt_cols);
        tile_u[i][threadIdx.x] = fp8_code(du * su_c, fmt_cols);
      }
    }
    __syncthreads();
    tile_columns(r0, c0, rows, cols, [&](int i, int j, int64_t at, int64_t left) {
      store_tile_column(tile_g, i, j, dg_cols + at, packed, left);
      store_tile_column(tile_u, i, j, du_cols + at, packed, left);
    });
    __syncthreads();  // the tiles are read before the next row tile overwrites them
  }
  if (amax) {
    block_amax_to(mg, amax);
    __syncthreads();  // block_amax's shared array is read by the first before the second writes
    block_amax_to(mu, amax + 1);
  }
}
// The same for MXFP8 (Blackwell), K = 2: dg and du as swiglu_backward_bf16 writes them, each
// quantized in both of mxfp8's backward layouts (quantize_mxfp8_both's bytes: rowwise 1x32
// codes and E8M0 scales for the data gradient, 32x1 codes written transposed for the weight
// gradient's) from one read of ds, g and u: fp8_col_t_kernel's kMx32Rows body on the
// thread's rounded dg, then, after a barrier (the shared tiles again), on its du. Past the
// edges ds, g and u load as +0 codes, and give +0 gradients, as the plain kernel's +0 loads.
// K = 1: the forward's SwiGLU product s = silu(g) u as swiglu_forward_bf16 writes it, in the
// down projection's two layouts (its forward's 1x32 rows, the weight gradient's 32x1 columns
// kept by the forward), from one read of g and u (ds unused, args1 and out1_t too).
template <int K>
__global__ void __launch_bounds__(256)
    swiglu_mx_kernel(const uint16_t* __restrict__ ds, const uint16_t* __restrict__ g,
                     const uint16_t* __restrict__ u, int64_t rows, int64_t cols,
                     int64_t tiles_c, ColArgs args0, ColArgs args1,
                     uint8_t* __restrict__ out0_t, uint8_t* __restrict__ out1_t, bool vec_t) {
  __shared__ float part[8][64];
  __shared__ uint4 tile_v[64][kColPitch / 16];
  const ColTAt at(tiles_c, 2);
  const bool col_in = at.c < cols;
  uint32_t v0[16], v1[16];  // two bf16 codes each, as a bf16 x's loads (v1: K = 2 only)
  {
    uint32_t vd[16], vg[16], vu[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {  // every load first
      const int64_t r = at.r0 + 16 * at.w + k;
      const bool in = col_in && r < rows;
      const int64_t i = r * cols + at.c;
      vd[k] = K == 2 && in ? *reinterpret_cast<const uint32_t*>(ds + i) : 0u;
      vg[k] = in ? *reinterpret_cast<const uint32_t*>(g + i) : 0u;
      vu[k] = in ? *reinterpret_cast<const uint32_t*>(u + i) : 0u;
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      v0[k] = v1[k] = 0u;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint16_t ge = uint16_t(vg[k] >> (16 * e)), ue = uint16_t(vu[k] >> (16 * e));
        if constexpr (K == 2) {
          uint16_t dg, du;
          swiglu_grad_bf16(uint16_t(vd[k] >> (16 * e)), ge, ue, dg, du);
          v0[k] |= uint32_t(dg) << (16 * e);
          v1[k] |= uint32_t(du) << (16 * e);
        } else {
          v0[k] |= uint32_t(swiglu_code(ge, ue)) << (16 * e);
        }
      }
    }
  }
  col_t_codes<uint16_t, ColKind::kMx32Rows>(v0, at, rows, cols, args0, out0_t, vec_t, part,
                                            tile_v);
  if constexpr (K == 2) {
    __syncthreads();  // the first call's tile is stored before the second writes it
    col_t_codes<uint16_t, ColKind::kMx32Rows>(v1, at, rows, cols, args1, out1_t, vec_t, part,
                                              tile_v);
  }
}
// max |dg| and max |du| of those rounded gradients into amax[0], amax[1] (zeroed by the
// launch): current scaling's pass.
__global__ void swiglu_grads_amax_kernel(float* amax, const uint16_t* __restrict__ ds,
                                         const uint16_t* __restrict__ g,
                                         const uint16_t* __restrict__ u, int64_t n) {
  float mg = 0.0f, mu = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float dg, du;
    swiglu_grad_codes(ds[i], g[i], u[i], dg, du);
    mg = numerics::amax_fold(mg, dg);
    mu = numerics::amax_fold(mu, du);
  }
  block_amax_to(mg, amax);
  __syncthreads();  // (as above)
  block_amax_to(mu, amax + 1);
}
// max |s| of that product into *amax (zeroed by the launch): current scaling's pass.
__global__ void swiglu_amax_kernel(float* amax, const uint16_t* __restrict__ g,
                                   const uint16_t* __restrict__ u, int64_t n) {
  float m = 0.0f;
  const SwigluCodes x{g, u};
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    m = numerics::amax_fold(m, load(x, i));
  block_amax_to(m, amax);
}

template <class T>
__global__ void transpose_kernel(const T* __restrict__ src, int64_t rows, int64_t cols,
                                 T* __restrict__ dst) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  // Row tiles beyond grid y's limit (65535 x 32 rows) are taken by the same blocks in turn.
  for (int64_t r0 = int64_t(blockIdx.y) * kTile; r0 < rows; r0 += int64_t(gridDim.y) * kTile) {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is read before the next row tile overwrites it
  }
}

// dst[i, j] (row-major, leading dimension ld, dst_rows x ld) = src[i, j] or src[j, i] (src
// row-major with src_cols columns) for j < valid_cols; 0 in the padding columns.
__global__ void relayout_f32_kernel(const float* __restrict__ src, int64_t src_cols,
                                    bool transposed, int64_t dst_rows, int64_t valid_cols,
                                    int64_t ld, float* __restrict__ dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < dst_rows * ld;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / ld, j = e % ld;
    dst[e] = j >= valid_cols ? 0.0f : transposed ? src[j * src_cols + i] : src[i * src_cols + j];
  }
}

// MXFP8 scale bytes into cuBLASLt's swizzled layout (numerics/block_scale_layout.h) for a GEMM
// operand of R rows and kb = K / 32 scales per row: src is [R, kb] row-major, or [kb, R] when
// transposed (the columnwise quantization of the untransposed matrix). Padding: dst is zeroed
// first by the caller.
// row_div > 1 (NVFP4 16x16 weight blocks): row r takes the scales of src row r / row_div.
__global__ void swizzle_scales_u8_kernel(const uint8_t* __restrict__ src, bool transposed,
                                         int64_t R, int64_t kb, int64_t row_div,
                                         uint8_t* __restrict__ dst) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < R * kb;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / kb, k = e % kb;
    dst[numerics::swizzled_scale_offset(r, k, kb)] =
        transposed ? src[k * (R / row_div) + r / row_div] : src[(r / row_div) * kb + k];
  }
}

// fp8-block scales -> E8M0 bytes in the swizzled layout (numerics/fp8_block_mx.h): one thread
// per byte of dst, walking the buffer in order (coalesced writes, padding included, so no
// memset), each reading the one fp32 block scale its MX block lies in.
__global__ void fp8_block_scales_to_mx_kernel(const float* __restrict__ block_scales,
                                              int64_t scale_cols, int64_t block_rows,
                                              int64_t block_cols, bool transposed, int64_t R,
                                              int64_t kb, int64_t bytes,
                                              uint8_t* __restrict__ dst) {
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < bytes;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t r, k;
    numerics::swizzled_scale_position(o, kb, &r, &k);
    dst[o] = r < R && k < kb ? numerics::fp8_block_mx_code(block_scales, scale_cols, block_rows,
                                                           block_cols, transposed, r, k)
                             : uint8_t(0);
  }
}

// numerics::rht16_forward in place, one thread per group of 16 consecutive elements
// (rht16_values).
__global__ void rht16_kernel(float* __restrict__ x, int64_t groups, uint32_t sign_bits) {
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    float* p = x + g * 16;
    float v[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) v[j] = p[j];
    rht16_values(v, sign_bits);
#pragma unroll
    for (int j = 0; j < 16; ++j) p[j] = v[j];
  }
}

unsigned warp_grid(int64_t nblocks) {
  return unsigned((nblocks + kWarpsPerBlock - 1) / kWarpsPerBlock);
}
// f(std::integral_constant<int, U>{}) for U = fp8_cast_unroll().
template <class F>
void with_cast_unroll(F&& f) {
  switch (fp8_cast_unroll()) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}
unsigned elem_grid(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }
// Grid y of a transposing kernel: its row tiles, at most max_grid_yz() (the kernels loop).
unsigned row_tiles(int64_t rows, int64_t tile) {
  return unsigned(std::min(ceil_div(rows, tile), max_grid_yz()));
}
// The plain transposing kernels (codes_t_tiles' and swiglu_backward_fp8_kernel's, blocks of
// kTile x kTileRows threads): their grid over x [rows, cols], and whether codes^T may take
// 4-byte stores (store_tile_column's `packed`).
dim3 codes_t_grid(int64_t rows, int64_t cols) {
  return dim3(unsigned(ceil_div(cols, kTile)), row_tiles(rows, kCodesTileRows));
}
bool codes_t_packed(int64_t rows, const uint8_t* codes_t) {
  return rows % 4 == 0 && aligned(codes_t, 4);
}

// ---- cast tuning ------------------------------------------------------------------------------
// Several casts have byte-identical kernel forms whose speed differs by GPU and shape in ways
// that could not be predicted here (the tiled kernel ran the per-tensor casts 2-3x slower on the
// H200, fp8-block's blocks far below bandwidth). At a shape's first call each form is timed on
// the call's own operands (a warm-up, then kCastTuneRuns runs between two CUDA events) and the
// fastest kept for the rest of the run. Every form writes the same bytes (the op check runs each
// against the CPU twin), and each run is the whole call (its amax slot zeroed first), so the
// last trial leaves the call's output: tuning never changes a result, only the time.
CastTune g_cast_tune = CastTune::kLarge;
int g_cast_forced = -1;
CastTuneStats g_cast_stats;
std::mutex g_cast_mutex;
std::map<std::string, int> g_cast_picks;  // family and shape -> the form kept
constexpr int64_t kCastTuneMinElems = int64_t(1) << 22;  // kLarge: 4M elements and more
constexpr int kCastTuneRuns = 3;

// Runs one of the forms names[0..n) of `family` on x [rows, cols] (elem_bytes an element of x;
// `bytes`: what one call reads and writes, for the log's GB/s): launch(k) enqueues form k on
// s. Form 0 is the one used untuned (MXTRAIN_CUDA_CAST_TUNE=0, or kLarge below
// kCastTuneMinElems elements); `flags` tells apart calls whose alignment picks other paths.
template <size_t N, class F>
void tuned_cast(const char* family, const char* const (&names)[N], int64_t rows, int64_t cols,
                int elem_bytes, int flags, double bytes, cudaStream_t s, F&& launch) {
  constexpr int n = int(N);
  if (g_cast_forced >= 0) return launch(g_cast_forced % n);
  if (g_cast_tune == CastTune::kOff ||
      (g_cast_tune == CastTune::kLarge && rows * cols < kCastTuneMinElems))
    return launch(0);
  const std::string key =
      str(family, " ", elem_bytes == 2 ? "bf16" : "fp32", " ", rows, "x", cols, " #", flags);
  int kept = -1;
  {
    std::lock_guard<std::mutex> lock(g_cast_mutex);
    const auto it = g_cast_picks.find(key);
    if (it != g_cast_picks.end()) kept = it->second;
  }
  // (outside the lock: a form may be casts of other families, tuned_cast again)
  if (kept >= 0) return launch(kept);
  cudaEvent_t ev[2];
  for (cudaEvent_t& e : ev) MX_CUDA_CHECK(family, cudaEventCreate(&e));
  double t[n];
  int best = 0;
  for (int k = 0; k < n; ++k) {
    launch(k);  // warm-up
    MX_CUDA_CHECK(family, cudaEventRecord(ev[0], s));
    for (int r = 0; r < kCastTuneRuns; ++r) launch(k);
    MX_CUDA_CHECK(family, cudaEventRecord(ev[1], s));
    MX_CUDA_CHECK(family, cudaEventSynchronize(ev[1]));
    float ms = 0;
    MX_CUDA_CHECK(family, cudaEventElapsedTime(&ms, ev[0], ev[1]));
    t[k] = double(ms) * 1e-3 / kCastTuneRuns;
    if (t[k] < t[best]) best = k;
  }
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  std::lock_guard<std::mutex> lock(g_cast_mutex);
  g_cast_picks[key] = best;
  ++g_cast_stats.timed;
  if (best != 0) ++g_cast_stats.changed;
  if (std::getenv("MXTRAIN_CUDA_CAST_TUNE_LOG")) {  // one line a shape (bench/gpu/check.sh)
    std::string times;
    for (int k = 0; k < n; ++k)
      times += str(k ? ", " : "", names[k], " ", t[k] * 1e3, " ms ",
                   t[k] > 0 ? bytes / t[k] / 1e9 : 0.0, " GB/s");
    info(str("cuda cast tune: ", key, ": kept ", names[best], " (", times, ")"));
  }
}

// fp8_block_row_kernel over x [rows, cols] with u = 1 or 4 pieces a warp (kMx: MXFP8's 1x32
// blocks, scales bytes; else fp8-block's 1x128, scales float).
template <bool kMx, class T>
void launch_row_pieces(int u, const T* x, int64_t rows, int64_t cols, bool pow2, Format elem,
                       numerics::MxScaleRule rule, uint8_t* codes, void* scales,
                       cudaStream_t s) {
  const int64_t pieces_c = ceil_div(cols, kQTile), warps = ceil_div(rows * pieces_c, u);
  const unsigned grid = unsigned(std::min<int64_t>(ceil_div(warps, 8), 1 << 20));
  if (u == 1)
    fp8_block_row_kernel<1, T, kMx><<<grid, 256, 0, s>>>(x, rows, cols, pieces_c, pow2, elem,
                                                         rule, codes, scales);
  else
    fp8_block_row_kernel<4, T, kMx><<<grid, 256, 0, s>>>(x, rows, cols, pieces_c, pow2, elem,
                                                         rule, codes, scales);
}

// fp8_col_t_kernel over x [rows, cols] into codes_t [cols, rows] (16-byte stores where rows
// % 16 == 0 and codes_t is aligned to them).
template <ColKind kKind, class T>
void launch_col_t(const T* x, int64_t rows, int64_t cols, const ColArgs& a, uint8_t* codes_t,
                  cudaStream_t s) {
  const int64_t tiles_c = ceil_div(cols, 32 * (4 / int64_t(sizeof(T))));
  const int64_t tiles = ceil_div(rows, kQTile) * tiles_c;
  MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), "fp8 quantizer: ", tiles, " tiles");
  fp8_col_t_kernel<T, kKind><<<unsigned(tiles), 256, 0, s>>>(
      x, rows, cols, tiles_c, a, codes_t, rows % 16 == 0 && aligned(codes_t, 16));
}

void check_fp8(Format fmt, const char* op) {
  MX_REQUIRE(fmt == Format::kE4M3 || fmt == Format::kE5M2, op, ": E4M3 or E5M2 elements only");
}

}  // namespace

CastTune parse_cast_tune(const char* value) {
  if (!value) return CastTune::kLarge;
  const std::string v = value;
  if (v == "0") return CastTune::kOff;
  if (v == "1") return CastTune::kLarge;
  if (v == "all") return CastTune::kAll;
  throw UserError(str("MXTRAIN_CUDA_CAST_TUNE must be 0 (each cast's first form), 1 (time the "
                      "forms of casts of 2^22 elements and more: the default) or all (got '",
                      v, "')"));
}
void set_cast_tune(CastTune t) { g_cast_tune = t; }
void force_cast_form(int k) { g_cast_forced = k; }
CastTuneStats cast_tune_stats() {
  std::lock_guard<std::mutex> lock(g_cast_mutex);
  return g_cast_stats;
}

void fp8_scales(float* scale, float* scale_inv, const float* amax, float given, Format fmt,
                cudaStream_t s) {
  check_fp8(fmt, "fp8_scales");
  const float fmt_max = fmt == Format::kE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max;
  fp8_scales_kernel<<<1, 1, 0, s>>>(scale, scale_inv, amax, given, fmt_max);
  MX_CUDA_LAUNCH_CHECK("fp8_scales");
}

namespace {
// fp8_tile_kernel for one kind and layout: codes [rows, cols] and/or codes_t [cols, rows]
// (whichever is not null).
template <TileKind kKind, class T>
void launch_tiles(const T* x, int64_t rows, int64_t cols, int64_t scale_cols, bool pow2,
                  Format fmt, const float* scale, const numerics::RoundingOptions& ro,
                  uint8_t* codes, uint8_t* codes_t, float* scales, float* dequant, float* amax,
                  cudaStream_t s) {
  const int64_t tiles_c = ceil_div(cols, kQTile), tiles = ceil_div(rows, kQTile) * tiles_c;
  MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), "fp8 quantizer: ", tiles, " tiles");
  const bool packed_t = rows % 4 == 0 && aligned(codes_t, 4);
  auto go = [&](auto row_major, auto transposed) {
    fp8_tile_kernel<T, kKind, decltype(row_major)::value, decltype(transposed)::value>
        <<<unsigned(tiles), dim3(32, kQRows), 0, s>>>(
            x, rows, cols, tiles_c, scale_cols, pow2, fmt, scale, ro.stochastic, ro.rng, codes,
            codes_t, scales, dequant, amax, packed_t);
  };
  using Y = std::true_type;
  using N = std::false_type;
  if (codes && codes_t) go(Y{}, Y{});
  else if (codes_t) go(N{}, Y{});
  else go(Y{}, N{});
}

// amax given: zeroed here, then each block's max folded in by the kernel.
void zero_amax(float* amax, cudaStream_t s) {
  if (amax) MX_CUDA_CHECK("fp8_codes amax", cudaMemsetAsync(amax, 0, sizeof(float), s));
}

// fp8_codes_t_kernel over x [rows, cols]: codes_t [cols, rows] (and codes, if given), the amax
// slot (if any) zeroed first.
template <class T>
void launch_codes_t(const T* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
                    uint8_t* codes_t, uint8_t* codes, float* amax, cudaStream_t s,
                    const char* op) {
  // The tiled kernel (8- / 16-byte loads, 4-byte stores both ways) is byte-identical but ran
  // these per-tensor casts 2-3x SLOWER on the H200 (2026-12-04, with the numerics encoder:
  // fp8-delayed's both-layouts casts 25 -> 79 ms a step; at 70-128 registers a thread too few
  // threads hide the encoder's arithmetic), so the plain kernel is the untuned form, and the
  // cast tuner times the two (with the hardware encoder since). MXTRAIN_FP8_TILED_CASTS=1
  // takes the tiled kernel, any other value the plain one, untimed.
  static const char* tiled_env = std::getenv("MXTRAIN_FP8_TILED_CASTS");
  const bool can_tile = cols % 4 == 0 && aligned(x, 4 * sizeof(T)) &&
                        (!codes || aligned(codes, 4));  // (so fp8_col_t_kernel's rules hold)
  auto go = [&](int form) {
    zero_amax(amax, s);
    if (form == 2) {
      ColArgs a;
      a.elem = fmt;
      a.scale = scale;
      a.amax = amax;
      a.codes = codes;
      return launch_col_t<ColKind::kTensor>(x, rows, cols, a, codes_t, s);
    }
    if (form == 1) {
      launch_tiles<TileKind::kTensor>(x, rows, cols, 0, false, fmt, scale,
                                      numerics::RoundingOptions{}, codes, codes_t, nullptr,
                                      nullptr, amax, s);
      return;
    }
    fp8_codes_t_kernel<<<codes_t_grid(rows, cols), dim3(kTile, kTileRows), 0, s>>>(
        x, rows, cols, fmt, scale, codes_t, codes, amax, codes_t_packed(rows, codes_t));
  };
  if (!can_tile) return go(0);
  if (tiled_env) return go(tiled_env[0] == '1' ? 1 : 0);
  static constexpr const char* kForms[] = {"plain", "tiled", "col"};
  const double bytes = double(rows * cols) * (sizeof(T) + (codes ? 2 : 1));
  const int flags = int(rows % 4 == 0 && aligned(codes_t, 4)) |
                    int(rows % 16 == 0 && aligned(codes_t, 16)) << 1;
  tuned_cast(codes ? "fp8_codes_both" : "fp8_codes_t", kForms, rows, cols, int(sizeof(T)),
             flags, bytes, s, go);
}


template <class T>
void fp8_codes_of(const T* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
                  uint8_t* codes, bool transposed, cudaStream_t s, float* amax) {
  check_fp8(fmt, "fp8_codes");
  if (rows * cols == 0) return zero_amax(amax, s);  // (each form below zeroes it itself)
  if (!transposed) {
    const int64_t n = rows * cols;
    const bool vec4 = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T)) == 0 &&
                      reinterpret_cast<uintptr_t>(codes) % 4 == 0;
    auto go = [&](auto u) {
      constexpr int U = decltype(u)::value;
      zero_amax(amax, s);
      fp8_codes_kernel<U, T><<<elem_grid(vec4 ? ceil_div(n / 4, U) : n), 256, 0, s>>>(
          x, n, fmt, scale, codes, amax, vec4);
    };
    if (!vec4 || fp8_cast_unroll_env()) {  // MXTRAIN_FP8_CAST_UNROLL set: that one
      with_cast_unroll(go);
    } else {  // 1, 2 or 4 vectors a thread in flight, timed (1 untuned)
      static constexpr const char* kForms[] = {"unroll1", "unroll2", "unroll4"};
      tuned_cast("fp8_codes", kForms, rows, cols, int(sizeof(T)), 0,
                 double(n) * (sizeof(T) + 1), s, [&](int k) {
                   if (k == 0) go(std::integral_constant<int, 1>{});
                   else if (k == 1) go(std::integral_constant<int, 2>{});
                   else go(std::integral_constant<int, 4>{});
                 });
    }
  } else {
    launch_codes_t(x, rows, cols, fmt, scale, codes, nullptr, amax, s, "fp8_codes");
  }
  MX_CUDA_LAUNCH_CHECK("fp8_codes");
}
}  // namespace

void fp8_codes(const float* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
               uint8_t* codes, bool transposed, cudaStream_t s, float* amax) {
  fp8_codes_of(x, rows, cols, fmt, scale, codes, transposed, s, amax);
}

void fp8_codes(const uint16_t* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
               uint8_t* codes, bool transposed, cudaStream_t s, float* amax) {
  fp8_codes_of(x, rows, cols, fmt, scale, codes, transposed, s, amax);
}

namespace {
template <class T>
void fp8_codes_both_of(const T* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
                       uint8_t* codes, uint8_t* codes_t, cudaStream_t s, float* amax) {
  check_fp8(fmt, "fp8_codes_both");
  if (rows * cols == 0) return zero_amax(amax, s);  // (launch_codes_t zeroes it itself)
  launch_codes_t(x, rows, cols, fmt, scale, codes_t, codes, amax, s, "fp8_codes_both");
  MX_CUDA_LAUNCH_CHECK("fp8_codes_both");
}
}  // namespace

void fp8_codes_both(const float* x, int64_t rows, int64_t cols, Format fmt, const float* scale,
                    uint8_t* codes, uint8_t* codes_t, cudaStream_t s, float* amax) {
  fp8_codes_both_of(x, rows, cols, fmt, scale, codes, codes_t, s, amax);
}

void fp8_codes_both(const uint16_t* x, int64_t rows, int64_t cols, Format fmt,
                    const float* scale, uint8_t* codes, uint8_t* codes_t, cudaStream_t s,
                    float* amax) {
  fp8_codes_both_of(x, rows, cols, fmt, scale, codes, codes_t, s, amax);
}

void fp8_codes_both_swiglu(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                           Format fmt, const float* scale, uint8_t* codes, uint8_t* codes_t,
                           cudaStream_t s, float* amax) {
  check_fp8(fmt, "fp8_codes_both_swiglu");
  zero_amax(amax, s);
  if (rows * cols == 0) return;
  // fp8_codes_t_kernel's plain form, its tiles and stores (not tuned: the product's arithmetic
  // is a few instructions more an element than the cast's)
  fp8_codes_t_swiglu_kernel<<<codes_t_grid(rows, cols), dim3(kTile, kTileRows), 0, s>>>(
      g, u, rows, cols, fmt, scale, codes_t, codes, amax, codes_t_packed(rows, codes_t));
  MX_CUDA_LAUNCH_CHECK("fp8_codes_both_swiglu");
}

void swiglu_backward_fp8(const uint16_t* ds, const uint16_t* g, const uint16_t* u, int64_t rows,
                         int64_t cols, Format fmt_rows, Format fmt_cols, const float* scales,
                         uint8_t* dg_rows, uint8_t* dg_cols, uint8_t* du_rows, uint8_t* du_cols,
                         float* amax, cudaStream_t s) {
  check_fp8(fmt_rows, "swiglu_backward_fp8");
  check_fp8(fmt_cols, "swiglu_backward_fp8");
  if (amax) MX_CUDA_CHECK("swiglu_backward_fp8 amax",
                          cudaMemsetAsync(amax, 0, 2 * sizeof(float), s));
  if (rows * cols == 0) return;
  const bool packed = codes_t_packed(rows, dg_cols) && codes_t_packed(rows, du_cols);
  swiglu_backward_fp8_kernel<<<codes_t_grid(rows, cols), dim3(kTile, kTileRows), 0, s>>>(
      ds, g, u, rows, cols, fmt_rows, fmt_cols, scales, dg_rows, dg_cols, du_rows, du_cols, amax,
      packed);
  MX_CUDA_LAUNCH_CHECK("swiglu_backward_fp8");
}

namespace {
// swiglu_mx_kernel<K>'s launch: K = 2 the backward (ds, g, u into dg's operands o0 and du's
// o1), K = 1 the forward (g, u into s's operands o0; ds and o1 unused).
template <int K>
void launch_swiglu_mx(const char* op, const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                      int64_t rows, int64_t cols, Format elem, numerics::MxScaleRule rule,
                      const MxOperands& o0, const MxOperands& o1, cudaStream_t s) {
  check_fp8(elem, op);
  MX_REQUIRE(cols % 2 == 0 && (K == 1 || aligned(ds, 4)) && aligned(g, 4) && aligned(u, 4) &&
                 aligned(o0.codes, 2) && aligned(o1.codes, 2),
             op, ": an even width and 4-byte aligned codes");
  if (rows * cols == 0) return;
  auto args = [&](const MxOperands& o) {
    ColArgs a;
    a.elem = elem;
    a.rule = rule;
    a.scales = o.col_scales;
    a.codes = o.codes;
    a.row_scales = o.row_scales;
    return a;
  };
  const int64_t tiles_c = ceil_div(cols, 64);
  const int64_t tiles = ceil_div(rows, kQTile) * tiles_c;
  MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), op, ": ", tiles, " tiles");
  const bool vec_t = rows % 16 == 0 && aligned(o0.codes_t, 16) && aligned(o1.codes_t, 16);
  swiglu_mx_kernel<K><<<unsigned(tiles), 256, 0, s>>>(ds, g, u, rows, cols, tiles_c, args(o0),
                                                      args(o1), o0.codes_t,
                                                      K == 2 ? o1.codes_t : nullptr, vec_t);
  MX_CUDA_LAUNCH_CHECK(op);
}
}  // namespace

void swiglu_backward_mxfp8(const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                           int64_t rows, int64_t cols, Format elem, numerics::MxScaleRule rule,
                           const MxOperands& dg, const MxOperands& du, cudaStream_t s) {
  launch_swiglu_mx<2>("swiglu_backward_mxfp8", ds, g, u, rows, cols, elem, rule, dg, du, s);
}

void swiglu_forward_mxfp8(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                          Format elem, numerics::MxScaleRule rule, const MxOperands& out,
                          cudaStream_t s) {
  launch_swiglu_mx<1>("swiglu_forward_mxfp8", nullptr, g, u, rows, cols, elem, rule, out, out,
                      s);
}

namespace {
// fp8_block_both_kernel<S, K>'s launch from SwiGLU's operands: K = 2 the backward (ds, g, u
// into dg's operands o0 and du's o1), K = 1 the forward (g, u into s's operands o0; ds and o1
// unused).
template <int K, typename S>
void launch_swiglu_block(const char* op, S src, const uint16_t* ds, const uint16_t* g,
                         const uint16_t* u, int64_t rows, int64_t cols, bool pow2_scales,
                         const BlockOperands& o0, const BlockOperands& o1, cudaStream_t s) {
  MX_REQUIRE(cols % 4 == 0 && (K == 1 || aligned(ds, 8)) && aligned(g, 8) && aligned(u, 8) &&
                 aligned(o0.codes, 4) && aligned(o1.codes, 4),
             op, ": a width that is a multiple of 4 and aligned codes");
  if (rows * cols == 0) return;
  const int64_t tiles_c = ceil_div(cols, kQTile), tiles = ceil_div(rows, kQTile) * tiles_c;
  MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), op, ": ", tiles, " tiles");
  const bool packed_t = rows % 4 == 0 && aligned(o0.codes_t, 4) && aligned(o1.codes_t, 4);
  fp8_block_both_kernel<S, K><<<unsigned(tiles), dim3(32, kQRows), 0, s>>>(
      src, rows, cols, tiles_c, pow2_scales, o0, o1, packed_t);
  MX_CUDA_LAUNCH_CHECK(op);
}
}  // namespace

void swiglu_forward_fp8_block(const uint16_t* g, const uint16_t* u, int64_t rows, int64_t cols,
                              bool pow2_scales, const BlockOperands& out, cudaStream_t s) {
  launch_swiglu_block<1>("swiglu_forward_fp8_block", SwigluCodes{g, u}, nullptr, g, u, rows,
                         cols, pow2_scales, out, out, s);
}

void swiglu_backward_fp8_block(const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                               int64_t rows, int64_t cols, bool pow2_scales,
                               const BlockOperands& dg, const BlockOperands& du,
                               cudaStream_t s) {
  launch_swiglu_block<2>("swiglu_backward_fp8_block", SwigluGrads{ds, g, u}, ds, g, u, rows,
                         cols, pow2_scales, dg, du, s);
}

void swiglu_grads_abs_max(float* amax, const uint16_t* ds, const uint16_t* g, const uint16_t* u,
                          int64_t n, cudaStream_t s) {
  MX_CUDA_CHECK("swiglu_grads_abs_max", cudaMemsetAsync(amax, 0, 2 * sizeof(float), s));
  if (n == 0) return;
  swiglu_grads_amax_kernel<<<elem_grid(n), 256, 0, s>>>(amax, ds, g, u, n);
  MX_CUDA_LAUNCH_CHECK("swiglu_grads_abs_max");
}

void swiglu_abs_max(float* amax, const uint16_t* g, const uint16_t* u, int64_t n,
                    cudaStream_t s) {
  zero_amax(amax, s);
  if (n == 0) return;
  swiglu_amax_kernel<<<elem_grid(n), 256, 0, s>>>(amax, g, u, n);
  MX_CUDA_LAUNCH_CHECK("swiglu_abs_max");
}

void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst,
                     cudaStream_t s) {
  if (rows * cols == 0) return;
  const dim3 grid(unsigned(ceil_div(cols, kTile)), row_tiles(rows, kTile));
  transpose_kernel<uint8_t><<<grid, dim3(kTile, kTileRows), 0, s>>>(src, rows, cols, dst);
  MX_CUDA_LAUNCH_CHECK("transpose_bytes");
}

void transpose_f32(const float* src, int64_t rows, int64_t cols, float* dst, cudaStream_t s) {
  if (rows * cols == 0) return;
  const dim3 grid(unsigned(ceil_div(cols, kTile)), row_tiles(rows, kTile));
  transpose_kernel<float><<<grid, dim3(kTile, kTileRows), 0, s>>>(src, rows, cols, dst);
  MX_CUDA_LAUNCH_CHECK("transpose_f32");
}

namespace {
// numerics::rht16_signs(seed) as the kernels' sign bits (bit j set where s_j < 0): host code.
uint32_t rht16_sign_bits(uint32_t seed) {
  float signs[16];
  numerics::rht16_signs(seed, signs);
  uint32_t bits = 0;
  for (int j = 0; j < 16; ++j) bits |= signs[j] < 0.0f ? 1u << j : 0u;
  return bits;
}
}  // namespace

void rht16_forward(float* x, int64_t rows, int64_t cols, uint32_t seed, cudaStream_t s) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0,
             "the 16-point Hadamard transform needs cols a multiple of 16, got ", cols);
  const int64_t groups = rows * (cols / 16);
  if (groups == 0) return;
  rht16_kernel<<<elem_grid(groups), 256, 0, s>>>(x, groups, rht16_sign_bits(seed));
  MX_CUDA_LAUNCH_CHECK("rht16_forward");
}

namespace {
// A tensor's amax into scratch (the caller's scope): max |x|, NaN skipped.
template <class T>
const float* own_amax(const T* x, int64_t n, DeviceArena& scratch, cudaStream_t s) {
  float* amax = scratch.alloc_f32(1);
  abs_max(amax, x, n, scratch, s);
  return amax;
}

template <class T>
void quantize_nvfp4_rows_of(const T* x, int64_t rows, int64_t cols,
                            const numerics::RoundingOptions& ro, uint8_t* codes,
                            uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                            cudaStream_t s, const float* x_amax) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && cols % 16 == 0 && aligned(codes, 8),
             "quantize_nvfp4_rows: cols a multiple of 16 (got ", cols, ") and 8-byte aligned codes");
  DeviceArenaScope scope(scratch);
  const float* amax = x_amax ? x_amax : own_amax(x, rows * cols, scratch, s);
  const int64_t blocks = rows * (cols / 16);
  nvfp4_rows_kernel<<<elem_grid(blocks), 256, 0, s>>>(
      x, blocks, amax, ro.stochastic, ro.rng, codes, scales_u8, global_scale,
      aligned(x, 4 * sizeof(T)));
  MX_CUDA_LAUNCH_CHECK("quantize_nvfp4_rows");
}

// nvfp4_cols_kernel's two passes (the amaxes, then the codes from them): RHT(x^T) into out_t
// (ro_t's rounding) and, with ROWS, x's 1x16 rows into out (ro_rows'); rows (and with ROWS
// cols) multiples of 16.
template <bool ROWS, class T>
void launch_nvfp4_cols(const char* op, const T* x, int64_t rows, int64_t cols, uint32_t seed,
                       const numerics::RoundingOptions& ro_rows,
                       const numerics::RoundingOptions& ro_t, const Nvfp4Codes& out,
                       const Nvfp4Codes& out_t, DeviceArena& scratch, cudaStream_t s) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && rows % 16 == 0 && (!ROWS || cols % 16 == 0) &&
                 aligned(out_t.codes, 8),
             op, ": rows", ROWS ? " and cols" : "", " multiples of 16 (got ", rows, " x ", cols,
             ") and 8-byte aligned transposed codes");
  DeviceArenaScope scope(scratch);
  float* amax = scratch.alloc_f32(2);  // [x's (ROWS)], RHT(x^T)'s
  MX_CUDA_CHECK(op, cudaMemsetAsync(amax, 0, 2 * sizeof(float), s));
  const uint32_t bits = rht16_sign_bits(seed);
  const unsigned grid = elem_grid(rows / 16 * cols);
  nvfp4_cols_kernel<true, ROWS, T><<<grid, 256, 0, s>>>(x, rows, cols, bits, amax, false,
                                                         ro_rows.rng, false, ro_t.rng, nullptr,
                                                         nullptr, nullptr, nullptr, nullptr,
                                                         nullptr);
  nvfp4_cols_kernel<false, ROWS, T><<<grid, 256, 0, s>>>(
      x, rows, cols, bits, amax, ro_rows.stochastic, ro_rows.rng, ro_t.stochastic, ro_t.rng,
      out.codes, out.scales, out.global, out_t.codes, out_t.scales, out_t.global);
  MX_CUDA_LAUNCH_CHECK(op);
}
}  // namespace

void quantize_nvfp4_both(const float* x, int64_t rows, int64_t cols, uint32_t seed,
                         const numerics::RoundingOptions& ro_rows,
                         const numerics::RoundingOptions& ro_t, const Nvfp4Codes& out,
                         const Nvfp4Codes& out_t, DeviceArena& scratch, cudaStream_t s) {
  launch_nvfp4_cols<true>("quantize_nvfp4_both", x, rows, cols, seed, ro_rows, ro_t, out, out_t,
                          scratch, s);
}
void quantize_nvfp4_both(const uint16_t* x, int64_t rows, int64_t cols, uint32_t seed,
                         const numerics::RoundingOptions& ro_rows,
                         const numerics::RoundingOptions& ro_t, const Nvfp4Codes& out,
                         const Nvfp4Codes& out_t, DeviceArena& scratch, cudaStream_t s) {
  launch_nvfp4_cols<true>("quantize_nvfp4_both", x, rows, cols, seed, ro_rows, ro_t, out, out_t,
                          scratch, s);
}

void quantize_nvfp4_rows(const float* x, int64_t rows, int64_t cols,
                         const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                         float* global_scale, DeviceArena& scratch, cudaStream_t s,
                         const float* x_amax) {
  quantize_nvfp4_rows_of(x, rows, cols, ro, codes, scales_u8, global_scale, scratch, s, x_amax);
}
void quantize_nvfp4_rows(const uint16_t* x, int64_t rows, int64_t cols,
                         const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                         float* global_scale, DeviceArena& scratch, cudaStream_t s,
                         const float* x_amax) {
  quantize_nvfp4_rows_of(x, rows, cols, ro, codes, scales_u8, global_scale, scratch, s, x_amax);
}
void quantize_nvfp4_rht_t(const float* x, int64_t rows, int64_t cols, uint32_t seed,
                          const numerics::RoundingOptions& ro, uint8_t* codes_t,
                          uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                          cudaStream_t s) {
  launch_nvfp4_cols<false>("quantize_nvfp4_rht_t", x, rows, cols, seed, ro, ro, {},
                           {codes_t, scales_u8, global_scale}, scratch, s);
}
void quantize_nvfp4_rht_t(const uint16_t* x, int64_t rows, int64_t cols, uint32_t seed,
                          const numerics::RoundingOptions& ro, uint8_t* codes_t,
                          uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                          cudaStream_t s) {
  launch_nvfp4_cols<false>("quantize_nvfp4_rht_t", x, rows, cols, seed, ro, ro, {},
                           {codes_t, scales_u8, global_scale}, scratch, s);
}

void relayout_f32(const float* src, int64_t src_cols, bool transposed, int64_t dst_rows,
                  int64_t valid_cols, int64_t ld, float* dst, cudaStream_t s) {
  if (dst_rows * ld == 0) return;
  relayout_f32_kernel<<<elem_grid(dst_rows * ld), 256, 0, s>>>(src, src_cols, transposed,
                                                               dst_rows, valid_cols, ld, dst);
  MX_CUDA_LAUNCH_CHECK("relayout_f32");
}

void swizzle_scales_u8(const uint8_t* src, bool transposed, int64_t R, int64_t kb,
                       uint8_t* dst, cudaStream_t s, int64_t row_div) {
  MX_REQUIRE(row_div >= 1 && R % row_div == 0, "swizzle_scales_u8: R = ", R,
             " must be a multiple of row_div = ", row_div);
  const int64_t bytes = numerics::swizzled_scale_bytes(R, kb);
  if (bytes == 0) return;
  MX_CUDA_CHECK("swizzle_scales_u8", cudaMemsetAsync(dst, 0, size_t(bytes), s));
  if (R * kb == 0) return;
  swizzle_scales_u8_kernel<<<elem_grid(R * kb), 256, 0, s>>>(src, transposed, R, kb, row_div,
                                                              dst);
  MX_CUDA_LAUNCH_CHECK("swizzle_scales_u8");
}

void fp8_block_scales_to_mx(const float* block_scales, int64_t rows, int64_t cols,
                            int block_rows, int block_cols, bool transposed, uint8_t* dst,
                            cudaStream_t s) {
  const numerics::Fp8BlockMxShape z =
      numerics::fp8_block_mx_shape(rows, cols, block_rows, block_cols, transposed);
  if (z.bytes == 0) return;
  fp8_block_scales_to_mx_kernel<<<elem_grid(z.bytes), 256, 0, s>>>(
      block_scales, z.scale_cols, block_rows, block_cols, transposed, z.R, z.kb, z.bytes, dst);
  MX_CUDA_LAUNCH_CHECK("fp8_block_scales_to_mx");
}

namespace {
template <class T>
void abs_max_of(float* amax, const T* x, int64_t n, DeviceArena& scratch, cudaStream_t s) {
  DeviceArenaScope scope(scratch);
  const bool vec4 = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % (4 * sizeof(T)) == 0;
  with_cast_unroll([&](auto u) {
    constexpr int U = decltype(u)::value;
    const unsigned blocks = n > 0 ? elem_grid(vec4 ? ceil_div(n / 4, U) : n) : 1;
    float* part = scratch.alloc_f32(blocks);
    amax_partial_kernel<U, T><<<blocks, 256, 0, s>>>(part, x, n, vec4);
    amax_final_kernel<<<1, 32, 0, s>>>(amax, part, int(blocks));
  });
  MX_CUDA_LAUNCH_CHECK("abs_max");
}
}  // namespace

void abs_max(float* amax, const float* x, int64_t n, DeviceArena& scratch, cudaStream_t s) {
  abs_max_of(amax, x, n, scratch, s);
}

void abs_max(float* amax, const uint16_t* x, int64_t n, DeviceArena& scratch, cudaStream_t s) {
  abs_max_of(amax, x, n, scratch, s);
}

namespace {
__global__ void attn_fp8_scales_kernel(float* slots, const float* amax, int64_t D,
                                       int64_t rows_per_key, float attn_scale) {
  numerics::attn_fp8_scale_slots(slots, amax[0], amax[1], amax[2], amax[3], D, rows_per_key,
                                 attn_scale);
}
__global__ void __launch_bounds__(1024) max_into_kernel(float* dst, const float* src, int n,
                                                        int stride) {
  const int i = int(threadIdx.x);
  if (i < n) dst[i * stride] = fmaxf(dst[i * stride], src[i * stride]);
}
__device__ inline void store_decoded(float* out, int64_t i, float v) { out[i] = v; }
__device__ inline void store_decoded(uint16_t* out, int64_t i, float v) {
  out[i] = numerics::encode_bf16(v);
}
template <class Out>
__global__ void fp8_decode_kernel(const uint8_t* __restrict__ codes, int64_t n, Format fmt,
                                  const float* __restrict__ scale_inv, Out* __restrict__ out) {
  const float inv = scale_inv[0];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    store_decoded(out, i, numerics::decode_fp8_elem(codes[i], fmt) * inv);
}
template <class Out>
void fp8_decode_to(const uint8_t* codes, int64_t n, Format fmt, const float* scale_inv, Out* out,
                   cudaStream_t s) {
  check_fp8(fmt, "fp8_decode");
  if (n <= 0) return;
  fp8_decode_kernel<Out><<<elem_grid(n), 256, 0, s>>>(codes, n, fmt, scale_inv, out);
  MX_CUDA_LAUNCH_CHECK("fp8_decode");
}
}  // namespace

namespace {
// x not __restrict__: out may alias it (fp8_round's contract; the FP8 head rounds its logits
// gradient in place), and __restrict__ would let the compiler load x through the read-only
// cache (ld.global.nc), which the PTX ISA allows only for data no thread writes meanwhile.
__global__ void fp8_round_kernel(const float* x, int64_t n, Format fmt,
                                 const float* __restrict__ scale_ptr,
                                 const float* __restrict__ scale_inv_ptr, float* out) {
  const float scale = *scale_ptr, inv = *scale_inv_ptr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = numerics::decode_fp8_elem(fp8_code(x[i] * scale, fmt), fmt) * inv;
}
}  // namespace

void fp8_round(const float* x, int64_t n, Format fmt, const float* scale, const float* scale_inv,
               float* out, cudaStream_t s) {
  check_fp8(fmt, "fp8_round");
  if (n <= 0) return;
  fp8_round_kernel<<<elem_grid(n), 256, 0, s>>>(x, n, fmt, scale, scale_inv, out);
  MX_CUDA_LAUNCH_CHECK("fp8_round");
}

void attn_fp8_scales(float* slots, const float* amax, int64_t D, int64_t rows_per_key,
                     float attn_scale, cudaStream_t s) {
  attn_fp8_scales_kernel<<<1, 1, 0, s>>>(slots, amax, D, rows_per_key, attn_scale);
  MX_CUDA_LAUNCH_CHECK("attn_fp8_scales");
}

void max_into(float* dst, const float* src, int n, int stride, cudaStream_t s) {
  MX_REQUIRE(n >= 0 && n <= 1024 && stride > 0, "max_into: n = ", n, ", stride = ", stride);
  if (n == 0) return;
  max_into_kernel<<<1, unsigned(n), 0, s>>>(dst, src, n, stride);
  MX_CUDA_LAUNCH_CHECK("max_into");
}

void fp8_decode(const uint8_t* codes, int64_t n, Format fmt, const float* scale_inv, float* out,
                cudaStream_t s) {
  fp8_decode_to(codes, n, fmt, scale_inv, out, s);
}
void fp8_decode(const uint8_t* codes, int64_t n, Format fmt, const float* scale_inv,
                uint16_t* out, cudaStream_t s) {
  fp8_decode_to(codes, n, fmt, scale_inv, out, s);
}

void quantize_fp8_tensor(const float* x, int64_t rows, int64_t cols, Format fmt, float scale,
                         const numerics::RoundingOptions& ro, uint8_t* codes, float* scale_inv,
                         float* dequant, DeviceArena& scratch, cudaStream_t s) {
  check_fp8(fmt, "quantize_fp8_tensor");
  DeviceArenaScope scope(scratch);
  float* scale_dev = scratch.alloc_f32(1);
  fp8_scale_kernel<<<1, 1, 0, s>>>(scale_dev, nullptr, scale, 0.0f, 0.0f);
  fp8_tensor_kernel<<<elem_grid(rows * cols), 256, 0, s>>>(x, rows * cols, fmt, scale_dev,
                                                           ro.stochastic, ro.rng, codes,
                                                           scale_inv, dequant);
  MX_CUDA_LAUNCH_CHECK("quantize_fp8_tensor");
}

void quantize_fp8_current(const float* x, int64_t rows, int64_t cols, Format fmt, float margin,
                          const numerics::RoundingOptions& ro, uint8_t* codes, float* scale_inv,
                          float* dequant, DeviceArena& scratch, cudaStream_t s) {
  check_fp8(fmt, "quantize_fp8_current");
  DeviceArenaScope scope(scratch);
  float* amax = scratch.alloc_f32(1);
  float* scale_dev = scratch.alloc_f32(1);
  abs_max(amax, x, rows * cols, scratch, s);
  const float fmt_max = fmt == Format::kE5M2 ? numerics::kE5M2Max : numerics::kE4M3Max;
  fp8_scale_kernel<<<1, 1, 0, s>>>(scale_dev, amax, 0.0f, fmt_max, margin);
  fp8_tensor_kernel<<<elem_grid(rows * cols), 256, 0, s>>>(x, rows * cols, fmt, scale_dev,
                                                           ro.stochastic, ro.rng, codes,
                                                           scale_inv, dequant);
  MX_CUDA_LAUNCH_CHECK("quantize_fp8_current");
}

namespace {
// codes: [rows, cols], or with `transposed` codes^T [cols, rows] (then no dequant).
template <class T>
void quantize_fp8_block_of(const T* x, int64_t rows, int64_t cols, int block_rows,
                           int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                           uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s,
                           bool transposed = false) {
  MX_REQUIRE(block_rows >= 1 && block_cols >= 1, "block shape must be positive");
  const int64_t sr = ceil_div(rows, block_rows), sc = ceil_div(cols, block_cols);
  if (sr * sc == 0) return;
  // The tiled kernel: the recipe's shapes, whole vectors (cols % 4 == 0, aligned pointers).
  const bool row = block_rows == 1 && block_cols == kQTile;
  const bool col = block_rows == kQTile && block_cols == 1;
  const bool square = block_rows == kQTile && block_cols == kQTile;
  const bool vec = cols % 4 == 0 && aligned(x, 4 * sizeof(T)) &&
                   (transposed || aligned(codes, 4)) && (!dequant || aligned(dequant, 16));
  if (vec && (row || col || square)) {
    auto launch = [&](auto kind) {
      launch_tiles<decltype(kind)::value>(x, rows, cols, sc, pow2_scales, Format::kE4M3, nullptr,
                                          ro, transposed ? nullptr : codes,
                                          transposed ? codes : nullptr, scales_f32,
                                          transposed ? nullptr : dequant, nullptr, s);
    };
    // The tensor-core operands (no stochastic rounding, no dequantized copy): the tiled kernel
    // or the narrow ones, timed (the tiled kernel untuned).
    const bool codes_only = !ro.stochastic && !dequant;
    const double bytes = double(rows * cols) * (sizeof(T) + 1);
    if (codes_only && row && !transposed) {
      static constexpr const char* kForms[] = {"tiled", "row1", "row4"};
      tuned_cast("fp8_block_1x128", kForms, rows, cols, int(sizeof(T)), 0, bytes, s,
                        [&](int k) {
        if (k == 0) return launch(std::integral_constant<TileKind, TileKind::kRow>{});
        launch_row_pieces<false>(k == 1 ? 1 : 4, x, rows, cols, pow2_scales, Format::kE4M3,
                                 numerics::MxScaleRule::kCeil, codes, scales_f32, s);
      });
      MX_CUDA_LAUNCH_CHECK("quantize_fp8_block");
      return;
    }
    if (codes_only && col && transposed) {
      static constexpr const char* kForms[] = {"tiled", "col"};
      const bool vec_t = rows % 16 == 0 && aligned(codes, 16);  // (the key: the store path)
      tuned_cast("fp8_block_128x1_t", kForms, rows, cols, int(sizeof(T)), vec_t, bytes,
                        s, [&](int k) {
        if (k == 0) return launch(std::integral_constant<TileKind, TileKind::kCol>{});
        ColArgs a;
        a.pow2 = pow2_scales;
        a.scales = scales_f32;
        launch_col_t<ColKind::kBlock128>(x, rows, cols, a, codes, s);
      });
      MX_CUDA_LAUNCH_CHECK("quantize_fp8_block");
      return;
    }
    if (codes_only && square) {
      static constexpr const char* kForms[] = {"tiled", "twopass"};
      const int64_t tiles_c = ceil_div(cols, kQTile), tiles = ceil_div(rows, kQTile) * tiles_c;
      MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), "fp8 quantizer: ", tiles, " tiles");
      const bool packed_t = transposed && rows % 4 == 0 && aligned(codes, 4);
      tuned_cast(transposed ? "fp8_block_128x128_t" : "fp8_block_128x128", kForms, rows, cols,
                 int(sizeof(T)), packed_t, bytes, s, [&](int k) {
        if (k == 0) return launch(std::integral_constant<TileKind, TileKind::kSquare>{});
        const dim3 block(32, kQRows);
        if (transposed)
          fp8_block_square_kernel<T, true><<<unsigned(tiles), block, 0, s>>>(
              x, rows, cols, tiles_c, pow2_scales, codes, scales_f32, packed_t);
        else
          fp8_block_square_kernel<T, false><<<unsigned(tiles), block, 0, s>>>(
              x, rows, cols, tiles_c, pow2_scales, codes, scales_f32, packed_t);
      });
      MX_CUDA_LAUNCH_CHECK("quantize_fp8_block");
      return;
    }
    if (row) launch(std::integral_constant<TileKind, TileKind::kRow>{});
    else if (col) launch(std::integral_constant<TileKind, TileKind::kCol>{});
    else launch(std::integral_constant<TileKind, TileKind::kSquare>{});
  } else {
    fp8_block_kernel<<<warp_grid(sr * sc), kWarpsPerBlock * 32, 0, s>>>(
        x, rows, cols, block_rows, block_cols, sr, sc, pow2_scales, ro.stochastic, ro.rng, codes,
        scales_f32, transposed ? nullptr : dequant, transposed);
  }
  MX_CUDA_LAUNCH_CHECK("quantize_fp8_block");
}
}  // namespace

void quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                        uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s) {
  quantize_fp8_block_of(x, rows, cols, block_rows, block_cols, pow2_scales, ro, codes,
                        scales_f32, dequant, s);
}

void quantize_fp8_block(const uint16_t* x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                        uint8_t* codes, float* scales_f32, float* dequant, cudaStream_t s) {
  quantize_fp8_block_of(x, rows, cols, block_rows, block_cols, pow2_scales, ro, codes,
                        scales_f32, dequant, s);
}

void quantize_fp8_block_t(const float* x, int64_t rows, int64_t cols, int block_rows,
                          int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                          uint8_t* codes_t, float* scales_f32, cudaStream_t s) {
  quantize_fp8_block_of(x, rows, cols, block_rows, block_cols, pow2_scales, ro, codes_t,
                        scales_f32, nullptr, s, true);
}

void quantize_fp8_block_t(const uint16_t* x, int64_t rows, int64_t cols, int block_rows,
                          int block_cols, bool pow2_scales, const numerics::RoundingOptions& ro,
                          uint8_t* codes_t, float* scales_f32, cudaStream_t s) {
  quantize_fp8_block_of(x, rows, cols, block_rows, block_cols, pow2_scales, ro, codes_t,
                        scales_f32, nullptr, s, true);
}

namespace {
template <class T>
void quantize_fp8_block_both_of(const T* x, int64_t rows, int64_t cols, bool pow2_scales,
                                uint8_t* codes, float* row_scales, uint8_t* codes_t,
                                float* col_scales, cudaStream_t s) {
  if (rows * cols == 0) return;
  const numerics::RoundingOptions ro;
  auto separate = [&] {
    quantize_fp8_block_of(x, rows, cols, 1, kQTile, pow2_scales, ro, codes, row_scales, nullptr,
                          s);
    quantize_fp8_block_of(x, rows, cols, kQTile, 1, pow2_scales, ro, codes_t, col_scales,
                          nullptr, s, true);
  };
  // The fused kernel takes whole vectors (the tiled kernels' rule); else the two calls.
  if (cols % 4 != 0 || !aligned(x, 4 * sizeof(T)) || !aligned(codes, 4)) return separate();
  const int64_t tiles_c = ceil_div(cols, kQTile), tiles = ceil_div(rows, kQTile) * tiles_c;
  MX_REQUIRE(tiles <= int64_t(0x7FFFFFFF), "fp8 quantizer: ", tiles, " tiles");
  const bool packed_t = rows % 4 == 0 && aligned(codes_t, 4);
  // One read of x (and one from L2) against two (each call's own forms tuned in its trial).
  static constexpr const char* kForms[] = {"fused", "separate"};
  tuned_cast("fp8_block_both", kForms, rows, cols, int(sizeof(T)), packed_t,
             double(rows * cols) * (sizeof(T) + 2), s, [&](int k) {
    if (k == 1) return separate();
    const BlockOperands o{codes, row_scales, codes_t, col_scales};
    fp8_block_both_kernel<const T*, 1><<<unsigned(tiles), dim3(32, kQRows), 0, s>>>(
        x, rows, cols, tiles_c, pow2_scales, o, o, packed_t);
  });
  MX_CUDA_LAUNCH_CHECK("quantize_fp8_block_both");
}
}  // namespace

void quantize_fp8_block_both(const float* x, int64_t rows, int64_t cols, bool pow2_scales,
                             uint8_t* codes, float* row_scales, uint8_t* codes_t,
                             float* col_scales, cudaStream_t s) {
  quantize_fp8_block_both_of(x, rows, cols, pow2_scales, codes, row_scales, codes_t, col_scales,
                             s);
}

void quantize_fp8_block_both(const uint16_t* x, int64_t rows, int64_t cols, bool pow2_scales,
                             uint8_t* codes, float* row_scales, uint8_t* codes_t,
                             float* col_scales, cudaStream_t s) {
  quantize_fp8_block_both_of(x, rows, cols, pow2_scales, codes, row_scales, codes_t, col_scales,
                             s);
}

namespace {
template <class T>
void quantize_mxfp8_of(const T* x, int64_t rows, int64_t cols, bool columnwise, Format elem,
                       numerics::MxScaleRule rule, const numerics::RoundingOptions& ro,
                       uint8_t* codes, uint8_t* scales_u8, float* dequant, cudaStream_t s) {
  check_fp8(elem, "quantize_mxfp8");
  const int64_t br = columnwise ? 32 : 1, bc = columnwise ? 1 : 32;
  const int64_t sr = ceil_div(rows, br), sc = ceil_div(cols, bc);
  if (sr * sc == 0) return;
  auto warp_a_block = [&] {
    mxfp8_kernel<<<warp_grid(sr * sc), kWarpsPerBlock * 32, 0, s>>>(
        x, rows, cols, br, bc, sr, sc, elem, rule, ro.stochastic, ro.rng, codes, scales_u8,
        dequant);
  };
  // Rowwise codes for the tensor cores (no stochastic rounding, no dequantized copy, whole
  // vectors): a warp a block, or a warp per four blocks (fp8_block_row_kernel's MX form), timed.
  if (columnwise || ro.stochastic || dequant || cols % 4 != 0 || !aligned(x, 4 * sizeof(T)) ||
      !aligned(codes, 4)) {
    warp_a_block();
  } else {
    static constexpr const char* kForms[] = {"warp-a-block", "row1", "row4"};
    tuned_cast("mxfp8_1x32", kForms, rows, cols, int(sizeof(T)), 0,
               double(rows * cols) * (sizeof(T) + 1), s, [&](int k) {
      if (k == 0) return warp_a_block();
      launch_row_pieces<true>(k == 1 ? 1 : 4, x, rows, cols, false, elem, rule, codes,
                              scales_u8, s);
    });
  }
  MX_CUDA_LAUNCH_CHECK("quantize_mxfp8");
}
}  // namespace

void quantize_mxfp8(const float* x, int64_t rows, int64_t cols, bool columnwise, Format elem,
                    numerics::MxScaleRule rule, const numerics::RoundingOptions& ro,
                    uint8_t* codes, uint8_t* scales_u8, float* dequant, cudaStream_t s) {
  quantize_mxfp8_of(x, rows, cols, columnwise, elem, rule, ro, codes, scales_u8, dequant, s);
}

void quantize_mxfp8(const uint16_t* x, int64_t rows, int64_t cols, bool columnwise, Format elem,
                    numerics::MxScaleRule rule, const numerics::RoundingOptions& ro,
                    uint8_t* codes, uint8_t* scales_u8, float* dequant, cudaStream_t s) {
  quantize_mxfp8_of(x, rows, cols, columnwise, elem, rule, ro, codes, scales_u8, dequant, s);
}

namespace {
template <class T>
void quantize_mxfp8_t_of(const T* x, int64_t rows, int64_t cols, Format elem,
                         numerics::MxScaleRule rule, uint8_t* tmp, uint8_t* codes_t,
                         uint8_t* scales_u8, cudaStream_t s) {
  check_fp8(elem, "quantize_mxfp8_t");
  if (rows * cols == 0) return;
  auto two_step = [&] {  // columnwise codes into tmp, then transposed
    quantize_mxfp8_of(x, rows, cols, true, elem, rule, numerics::RoundingOptions{}, tmp,
                      scales_u8, nullptr, s);
    transpose_bytes(tmp, rows, cols, codes_t, s);
  };
  if (cols % (4 / int64_t(sizeof(T))) != 0 || !aligned(x, 4)) return two_step();
  const bool vec_t = rows % 16 == 0 && aligned(codes_t, 16);  // (the key: the store path)
  static constexpr const char* kForms[] = {"two-step", "col"};
  tuned_cast("mxfp8_32x1_t", kForms, rows, cols, int(sizeof(T)), vec_t,
             double(rows * cols) * (sizeof(T) + 1), s, [&](int k) {
    if (k == 0) return two_step();
    ColArgs a;
    a.elem = elem;
    a.rule = rule;
    a.scales = scales_u8;
    launch_col_t<ColKind::kMx32>(x, rows, cols, a, codes_t, s);
  });
  MX_CUDA_LAUNCH_CHECK("quantize_mxfp8_t");
}
}  // namespace

void quantize_mxfp8_t(const float* x, int64_t rows, int64_t cols, Format elem,
                      numerics::MxScaleRule rule, uint8_t* tmp, uint8_t* codes_t,
                      uint8_t* scales_u8, cudaStream_t s) {
  quantize_mxfp8_t_of(x, rows, cols, elem, rule, tmp, codes_t, scales_u8, s);
}

void quantize_mxfp8_t(const uint16_t* x, int64_t rows, int64_t cols, Format elem,
                      numerics::MxScaleRule rule, uint8_t* tmp, uint8_t* codes_t,
                      uint8_t* scales_u8, cudaStream_t s) {
  quantize_mxfp8_t_of(x, rows, cols, elem, rule, tmp, codes_t, scales_u8, s);
}

namespace {
template <class T>
void quantize_mxfp8_both_of(const T* x, int64_t rows, int64_t cols, Format elem,
                            numerics::MxScaleRule rule, uint8_t* codes, uint8_t* row_scales,
                            uint8_t* tmp, uint8_t* codes_t, uint8_t* col_scales, cudaStream_t s) {
  check_fp8(elem, "quantize_mxfp8_both");
  if (rows * cols == 0) return;
  auto separate = [&] {
    quantize_mxfp8_of(x, rows, cols, false, elem, rule, numerics::RoundingOptions{}, codes,
                      row_scales, nullptr, s);
    quantize_mxfp8_t_of(x, rows, cols, elem, rule, tmp, codes_t, col_scales, s);
  };
  constexpr int64_t E = 4 / int64_t(sizeof(T));
  if (cols % E != 0 || !aligned(x, 4) || !aligned(codes, E)) return separate();
  const bool vec_t = rows % 16 == 0 && aligned(codes_t, 16);  // (the key: the store path)
  static constexpr const char* kForms[] = {"fused", "separate"};
  tuned_cast("mxfp8_both", kForms, rows, cols, int(sizeof(T)), vec_t,
             double(rows * cols) * (sizeof(T) + 2), s, [&](int k) {
    if (k == 1) return separate();
    ColArgs a;
    a.elem = elem;
    a.rule = rule;
    a.scales = col_scales;
    a.codes = codes;
    a.row_scales = row_scales;
    launch_col_t<ColKind::kMx32Rows>(x, rows, cols, a, codes_t, s);
  });
  MX_CUDA_LAUNCH_CHECK("quantize_mxfp8_both");
}
}  // namespace

void quantize_mxfp8_both(const float* x, int64_t rows, int64_t cols, Format elem,
                         numerics::MxScaleRule rule, uint8_t* codes, uint8_t* row_scales,
                         uint8_t* tmp, uint8_t* codes_t, uint8_t* col_scales, cudaStream_t s) {
  quantize_mxfp8_both_of(x, rows, cols, elem, rule, codes, row_scales, tmp, codes_t, col_scales,
                         s);
}

void quantize_mxfp8_both(const uint16_t* x, int64_t rows, int64_t cols, Format elem,
                         numerics::MxScaleRule rule, uint8_t* codes, uint8_t* row_scales,
                         uint8_t* tmp, uint8_t* codes_t, uint8_t* col_scales, cudaStream_t s) {
  quantize_mxfp8_both_of(x, rows, cols, elem, rule, codes, row_scales, tmp, codes_t, col_scales,
                         s);
}

void quantize_nvfp4(const float* x, int64_t rows, int64_t cols, bool blocks_2d,
                    const numerics::RoundingOptions& ro, uint8_t* codes, uint8_t* scales_u8,
                    float* global_scale, float* dequant, DeviceArena& scratch, cudaStream_t s,
                    const float* x_amax) {
  DeviceArenaScope scope(scratch);
  const int64_t br = blocks_2d ? 16 : 1;
  const int64_t sr = ceil_div(rows, br), sc = ceil_div(cols, 16);
  const float* amax = x_amax ? x_amax : own_amax(x, rows * cols, scratch, s);
  nvfp4_kernel<false><<<warp_grid(sr * sc > 0 ? sr * sc : 1), kWarpsPerBlock * 32, 0, s>>>(
      x, rows, cols, br, sr, sc, amax, ro.stochastic, ro.rng, codes, scales_u8, global_scale,
      dequant);
  MX_CUDA_LAUNCH_CHECK("quantize_nvfp4");
}

void quantize_nvfp4_16x16_t(const float* x, int64_t rows, int64_t cols,
                            const numerics::RoundingOptions& ro, uint8_t* codes_t,
                            uint8_t* scales_u8, float* global_scale, DeviceArena& scratch,
                            cudaStream_t s, const float* x_amax) {
  MX_REQUIRE(rows >= 0 && cols >= 0 && rows % 16 == 0 && cols % 16 == 0,
             "quantize_nvfp4_16x16_t: rows and cols multiples of 16 (got ", rows, " x ", cols,
             ")");
  DeviceArenaScope scope(scratch);
  const int64_t sr = rows / 16, sc = cols / 16;
  const float* amax = x_amax ? x_amax : own_amax(x, rows * cols, scratch, s);
  nvfp4_kernel<true><<<warp_grid(sr * sc > 0 ? sr * sc : 1), kWarpsPerBlock * 32, 0, s>>>(
      x, rows, cols, 16, sr, sc, amax, ro.stochastic, ro.rng, codes_t, scales_u8, global_scale,
      nullptr);
  MX_CUDA_LAUNCH_CHECK("quantize_nvfp4_16x16_t");
}

namespace {
__global__ void fp8_encoder_check_kernel(uint64_t first, uint64_t count, Format fmt,
                                         unsigned long long* bad, unsigned* first_bad) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint32_t bits = uint32_t(first + i);
    const float v = numerics::bits_float(bits);
    if (fp8_code(v, fmt) != numerics::encode_fp8_elem(v, fmt, false, 0u)) {
      atomicAdd(bad, 1ull);
      atomicMin(first_bad, bits);
    }
  }
}
}  // namespace

uint64_t fp8_encoder_mismatches(Format fmt, uint64_t first, uint64_t count,
                                uint32_t* first_bad_bits, cudaStream_t s) {
  check_fp8(fmt, "fp8_encoder_mismatches");
  struct Counters {
    unsigned long long bad;
    unsigned first_bad;
  };
  Counters* d = nullptr;
  MX_CUDA_CHECK("fp8_encoder_mismatches", cudaMalloc(&d, sizeof(Counters)));
  const Counters init{0ull, 0xFFFFFFFFu};
  MX_CUDA_CHECK("fp8_encoder_mismatches",
                cudaMemcpyAsync(d, &init, sizeof init, cudaMemcpyHostToDevice, s));
  const uint64_t blocks = std::min<uint64_t>((count + 255) / 256, 132 * 64);
  fp8_encoder_check_kernel<<<unsigned(blocks > 0 ? blocks : 1), 256, 0, s>>>(
      first, count, fmt, &d->bad, &d->first_bad);
  MX_CUDA_LAUNCH_CHECK("fp8_encoder_mismatches");
  Counters host{};
  MX_CUDA_CHECK("fp8_encoder_mismatches",
                cudaMemcpyAsync(&host, d, sizeof host, cudaMemcpyDeviceToHost, s));
  MX_CUDA_CHECK("fp8_encoder_mismatches", cudaStreamSynchronize(s));
  MX_CUDA_CHECK("fp8_encoder_mismatches", cudaFree(d));
  if (first_bad_bits) *first_bad_bits = host.first_bad;
  return host.bad;
}

}  // namespace mx::cuda
