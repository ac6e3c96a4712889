// A small single-threaded GEMM for attention's tile products, C = beta C + alpha A B, where A
// is row-major and already hot in cache (the gathered query / dO rows or the score tile) and n is
// a multiple of 16. OpenBLAS packs both operands on every call; on attention's tiles (256 x 128 x
// 64 and 256 x 64 x 128) that packing and its beta pass were ~25% of the attention time. Here A is
// read in place and only a 16-column panel of B (k x 16 floats, at most 8 KiB at k = 128) is
// copied, then 6 x 16 blocks of C are accumulated in 12 AVX registers (6 broadcasts of A and 2
// loads of B per 12 FMAs). Measured on the bench machine (Zen 3, one thread, CPU time, 2048-token
// tile sweeps): 56-64 GFLOP/s against OpenBLAS's 46-51 for Q K^T, 75-82 against 68-73 for P V.
// A transposed A (P^T dO, dS^T Q) is not offered: read down columns it was slower than OpenBLAS.
// A transposed B is not either: packing K^T panels element by element took ~10% of the forward;
// attention transposes K and V once per call instead.
#pragma once
#include <cstdint>

namespace mx::cpu {

// C[m x n] = beta C + alpha A B with A [m x k] (lda) and B [k x n] (ldb) row-major, n % 16 == 0.
// panel: k * 16 floats of scratch.
void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel);

}  // namespace mx::cpu
