#include "backend/cpu/tile_gemm.h"

#include <cstring>

namespace mx::cpu {
namespace {

// One register's worth of floats: 16 with AVX-512 (zmm), else 8 (one AVX register, or two
// SSE / NEON halves).
#if defined(__AVX512F__)
constexpr int kW = 16;
constexpr int kMR = 12;  // rows per block: 24 accumulators of the 32 zmm registers
#else
constexpr int kW = 8;
constexpr int kMR = 6;  // 12 accumulators of the 16 ymm registers
#endif
typedef float vfw __attribute__((vector_size(kW * sizeof(float))));

// Rows i < MR of one block: c[i * ldc + 0 .. NV*kW) = beta c + alpha sum_kk A(i, kk) panel[kk],
// where A(i, kk) = a[i * lda + kk], or a[kk * lda + i] when TA.
template <int MR, int NV, bool TA>
void block(int64_t k, float alpha, const float* a, int64_t lda, const float* panel, float beta,
           float* c, int64_t ldc) {
  vfw acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = vfw{};
  for (int64_t kk = 0; kk < k; ++kk) {
    vfw b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) std::memcpy(&b[v], panel + (kk * NV + v) * kW, sizeof(vfw));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float av = TA ? a[kk * lda + i] : a[i * lda + kk];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += av * b[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* cr = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      vfw o = alpha * acc[i][v];
      if (beta != 0.0f) {  // beta = 0 never reads C (it may hold garbage, as in BLAS)
        vfw p;
        std::memcpy(&p, cr + v * kW, sizeof p);
        o += beta * p;
      }
      std::memcpy(cr + v * kW, &o, sizeof o);
    }
  }
}

// All m rows against one panel of NV * kW columns: blocks of kMR rows, then 8 (AVX-512), 4, 2
// and 1 (a single row does 2 FMAs per 3 loads and ran at about a third of the full block's
// rate, so the remainder is cut as coarsely as it allows).
template <int NV, bool TA>
void rows(int64_t m, int64_t k, float alpha, const float* a, int64_t lda, const float* panel,
          float beta, float* c, int64_t ldc) {
  auto at = [&](int64_t r) { return TA ? a + r : a + r * lda; };
  int64_t r = 0;
  for (; r + kMR <= m; r += kMR) block<kMR, NV, TA>(k, alpha, at(r), lda, panel, beta, c + r * ldc, ldc);
  if (kMR > 8 && r + 8 <= m) {
    block<8, NV, TA>(k, alpha, at(r), lda, panel, beta, c + r * ldc, ldc);
    r += 8;
  }
  if (r + 4 <= m) {
    block<4, NV, TA>(k, alpha, at(r), lda, panel, beta, c + r * ldc, ldc);
    r += 4;
  }
  if (r + 2 <= m) {
    block<2, NV, TA>(k, alpha, at(r), lda, panel, beta, c + r * ldc, ldc);
    r += 2;
  }
  if (r < m) block<1, NV, TA>(k, alpha, at(r), lda, panel, beta, c + r * ldc, ldc);
}

// Column panels of 2 * kW (32 floats with AVX-512, 16 without), and with AVX-512 one of 16 for
// a remainder (n is a multiple of 16).
template <bool TA>
void product(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
             const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel) {
  int64_t c0 = 0;
  for (; c0 + 2 * kW <= n; c0 += 2 * kW) {
    for (int64_t kk = 0; kk < k; ++kk)
      std::memcpy(panel + kk * 2 * kW, b + kk * ldb + c0, 2 * kW * sizeof(float));
    rows<2, TA>(m, k, alpha, a, lda, panel, beta, c + c0, ldc);
  }
  if (c0 < n) {  // AVX-512 only: 16 = one register
    for (int64_t kk = 0; kk < k; ++kk)
      std::memcpy(panel + kk * kW, b + kk * ldb + c0, kW * sizeof(float));
    rows<1, TA>(m, k, alpha, a, lda, panel, beta, c + c0, ldc);
  }
}

}  // namespace

void tile_gemm(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel) {
  product<false>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, panel);
}

void tile_gemm_at(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc, float* panel) {
  product<true>(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, panel);
}

}  // namespace mx::cpu
