// mx::cpu::tile_gemm (attention's tile products) against a double-precision triple loop.
#include "backend/cpu/tile_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

void check(int64_t m, int64_t n, int64_t k, float alpha, float beta, uint32_t seed) {
  // Leading dimensions wider than the operands, as in attention (strided key / value rows).
  const int64_t lda = k + 3, ldb = n + 5, ldc = n + 7;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>(k * ldb));
  std::vector<float> c(static_cast<size_t>(m * ldc)), panel(static_cast<size_t>(k * 16));
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : c) x = dist(rng);
  // beta = 0 must not read C (BLAS semantics): garbage there must not leak into the result.
  if (beta == 0.0f)
    for (auto& x : c) x = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> c0 = c;
  mx::cpu::tile_gemm(m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc,
                     panel.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= n) {  // outside the product: untouched
        EXPECT_TRUE(c[at] == c0[at] || (std::isnan(c[at]) && std::isnan(c0[at])));
        continue;
      }
      double ref = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = double(a[i * lda + kk]) * double(b[kk * ldb + j]);
        ref += p;
        mag += std::fabs(p);
      }
      ref *= alpha;
      if (beta != 0.0f) ref += double(beta) * double(c0[at]);
      // fp32 accumulation of k products: a few ulps of the sum of magnitudes.
      const double beta_term = beta != 0.0f ? std::fabs(double(beta) * c0[at]) : 0.0;
      const double tol = 4e-7 * (std::fabs(alpha) * mag + beta_term) + 1e-30;
      ASSERT_NEAR(c[at], ref, tol) << "m=" << m << " n=" << n << " k=" << k << " i=" << i
                                   << " j=" << j;
    }
}

TEST(CpuTileGemm, MatchesDoubleReference) {
  uint32_t seed = 1;
  // m: every remainder after 6-row blocks (4, 2, 1 and their sums) and attention's 256 (252 + 4);
  // k: 1, odd, head dims, tiles.
  for (int64_t m : {1, 2, 3, 5, 6, 7, 8, 9, 13, 256})
    for (int64_t n : {16, 48, 128})
      for (int64_t k : {1, 3, 64, 128}) check(m, n, k, 1.0f, 0.0f, seed++);
}

TEST(CpuTileGemm, AlphaAndBeta) {
  check(256, 64, 128, 1.0f, 1.0f, 101);    // P V accumulated into O
  check(19, 128, 64, 0.125f, 0.0f, 102);   // scaled Q K^T
  check(12, 32, 40, -0.5f, 0.75f, 103);
}

}  // namespace
