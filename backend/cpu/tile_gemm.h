// A small single-threaded GEMM for attention's tile products, C = beta C + alpha op(A) B, where
// A is already hot in cache (the gathered query / dO rows or the score tile) and n is a multiple
// of 16. OpenBLAS packs both operands on every call; on attention's tiles (256 x 128 x 64 and
// 256 x 64 x 128) that packing and its beta pass were ~25% of the attention time. Here A is read
// in place and only a panel of B (k x 16 floats, or k x 32 with AVX-512) is copied, then blocks
// of C are accumulated in registers: 6 x 16 in 12 AVX registers (6 broadcasts of A and 2 loads of
// B per 12 FMAs), or with AVX-512 12 x 32 in 24 registers (12 broadcasts, 2 loads, 24 FMAs).
// Every element is the same k-long fp32 chain in the same order on both widths.
// Measured, one thread, 50-call loops, best of 30:
// - Zen 3 (AVX2), 2048-token tile sweeps: 56-64 GFLOP/s against OpenBLAS's 46-51 for Q K^T,
//   75-82 against 68-73 for P V.
// - Emerald Rapids Xeon (AVX-512), OpenBLAS 0.3.21's SkylakeX kernels: 256x128x64 (Q K^T) 160
//   against OpenBLAS's 128 and the AVX2-width kernel's 80; 256x64x128 (P V) 167 / 123 / 84;
//   transposed A, 128x64x256 (P^T dO): 155 against 128.
// A transposed A (P^T dO, dS^T Q), read down columns, is offered (tile_gemm_at), but attention
// takes it only where kTileGemmTransposedAFast says: with AVX2 it was slower than OpenBLAS.
// A transposed B is not offered: packing K^T panels element by element took ~10% of the
// forward; attention transposes K and V once per call instead.
#pragma once
#include <cstdint>

namespace mx::cpu {

#if defined(__AVX512F__)
inline constexpr bool kTileGemmTransposedAFast = true;
#else
inline constexpr bool kTileGemmTransposedAFast = false;
#endif

// Floats of panel scratch tile_gemm and tile_gemm_at need for a given k.
inline constexpr int64_t tile_gemm_panel_floats(int64_t k) { return k * 32; }

// C[m x n] = beta C + alpha A B with A [m x k] (lda) and B [k x n] (ldb) row-major, n % 16 == 0.
// beta = 0 never reads C. panel: tile_gemm_panel_floats(k) floats of scratch.
void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel);

// The same with A transposed: C[m x n] = beta C + alpha A^T B, A stored [k x m] (lda).
void tile_gemm_at(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel);

}  // namespace mx::cpu
