#include "backend/cpu/tile_gemm.h"

#include <cstring>

#include "backend/cpu/vec_math.h"

namespace mx::cpu {
namespace {

// Rows i < MR of one block: c[i * ldc + 0..15] = beta c + alpha sum_kk a[i * lda + kk] panel[kk].
template <int MR>
void tile_gemm_block(int64_t k, float alpha, const float* a, int64_t lda, const float* panel,
                     float beta, float* c, int64_t ldc) {
  vf8 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) c0[i] = c1[i] = splat(0.0f);
  for (int64_t kk = 0; kk < k; ++kk) {
    vf8 b0, b1;
    std::memcpy(&b0, panel + kk * 16, sizeof b0);
    std::memcpy(&b1, panel + kk * 16 + 8, sizeof b1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const float av = a[i * lda + kk];
      c0[i] += av * b0;
      c1[i] += av * b1;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    float* cr = c + i * ldc;
    vf8 o0 = alpha * c0[i], o1 = alpha * c1[i];
    if (beta != 0.0f) {  // beta = 0 never reads C (it may hold garbage, as in BLAS)
      vf8 p0, p1;
      std::memcpy(&p0, cr, sizeof p0);
      std::memcpy(&p1, cr + 8, sizeof p1);
      o0 += beta * p0;
      o1 += beta * p1;
    }
    std::memcpy(cr, &o0, sizeof o0);
    std::memcpy(cr + 8, &o1, sizeof o1);
  }
}

}  // namespace

void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel) {
  for (int64_t c0 = 0; c0 < n; c0 += 16) {
    for (int64_t kk = 0; kk < k; ++kk)
      std::memcpy(panel + kk * 16, b + kk * ldb + c0, 16 * sizeof(float));
    int64_t r = 0;
    for (; r + 6 <= m; r += 6)
      tile_gemm_block<6>(k, alpha, a + r * lda, lda, panel, beta, c + r * ldc + c0, ldc);
    // The rest (attention's 256 rows leave 4) in blocks of 4, 2 and 1: a single row does 2 FMAs
    // per 3 loads and ran at about a third of the 6-row block's rate.
    if (r + 4 <= m) {
      tile_gemm_block<4>(k, alpha, a + r * lda, lda, panel, beta, c + r * ldc + c0, ldc);
      r += 4;
    }
    if (r + 2 <= m) {
      tile_gemm_block<2>(k, alpha, a + r * lda, lda, panel, beta, c + r * ldc + c0, ldc);
      r += 2;
    }
    if (r < m) tile_gemm_block<1>(k, alpha, a + r * lda, lda, panel, beta, c + r * ldc + c0, ldc);
  }
}

}  // namespace mx::cpu
