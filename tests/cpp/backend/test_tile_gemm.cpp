// mx::cpu::tile_gemm and tile_gemm_at (attention's tile products) against a double-precision
// triple loop.
#include "backend/cpu/tile_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

void check(int64_t m, int64_t n, int64_t k, float alpha, float beta, uint32_t seed,
           bool trans_a = false) {
  // Leading dimensions wider than the operands, as in attention (strided key / value rows).
  // A transposed is stored [k x m].
  const int64_t lda = (trans_a ? m : k) + 3, ldb = n + 5, ldc = n + 7;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> a(static_cast<size_t>((trans_a ? k : m) * lda));
  std::vector<float> b(static_cast<size_t>(k * ldb)), c(static_cast<size_t>(m * ldc));
  // Exactly the documented scratch, so that an overrun shows under ASan / valgrind.
  std::vector<float> panel(static_cast<size_t>(mx::cpu::tile_gemm_panel_floats(k)));
  for (auto& x : a) x = dist(rng);
  for (auto& x : b) x = dist(rng);
  for (auto& x : c) x = dist(rng);
  // beta = 0 must not read C (BLAS semantics): garbage there must not leak into the result.
  if (beta == 0.0f)
    for (auto& x : c) x = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> c0 = c;
  (trans_a ? mx::cpu::tile_gemm_at : mx::cpu::tile_gemm)(m, n, k, alpha, a.data(), lda, b.data(),
                                                         ldb, beta, c.data(), ldc, panel.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i * ldc + j);
      if (j >= n) {  // outside the product: untouched
        EXPECT_TRUE(c[at] == c0[at] || (std::isnan(c[at]) && std::isnan(c0[at])));
        continue;
      }
      double ref = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float av = trans_a ? a[kk * lda + i] : a[i * lda + kk];
        const double p = double(av) * double(b[kk * ldb + j]);
        ref += p;
        mag += std::fabs(p);
      }
      ref *= alpha;
      if (beta != 0.0f) ref += double(beta) * double(c0[at]);
      // fp32 accumulation of k products: a few ulps of the sum of magnitudes.
      const double beta_term = beta != 0.0f ? std::fabs(double(beta) * c0[at]) : 0.0;
      const double tol = 4e-7 * (std::fabs(alpha) * mag + beta_term) + 1e-30;
      ASSERT_NEAR(c[at], ref, tol) << "m=" << m << " n=" << n << " k=" << k << " i=" << i
                                   << " j=" << j << " trans_a=" << trans_a;
    }
}

TEST(CpuTileGemm, MatchesDoubleReference) {
  uint32_t seed = 1;
  // m: every remainder after the row blocks (12 with AVX-512, else 6; then 8, 4, 2, 1) and
  // attention's 256; n: one 16-wide panel, 32-wide panels with and without a 16-wide rest;
  // k: 1, odd, head dims, tiles.
  for (bool trans_a : {false, true})
    for (int64_t m : {1, 2, 3, 5, 6, 7, 8, 9, 13, 15, 23, 25, 256})
      for (int64_t n : {16, 48, 64, 128})
        for (int64_t k : {1, 3, 64, 128}) check(m, n, k, 1.0f, 0.0f, seed++, trans_a);
}

TEST(CpuTileGemm, AlphaAndBeta) {
  check(256, 64, 128, 1.0f, 1.0f, 101);    // P V accumulated into O
  check(19, 128, 64, 0.125f, 0.0f, 102);   // scaled Q K^T
  check(12, 32, 40, -0.5f, 0.75f, 103);
  check(128, 64, 256, 1.0f, 1.0f, 104, true);    // dV += P^T dO
  check(128, 64, 256, 0.125f, 1.0f, 105, true);  // dK += scale dS^T Q
  check(37, 80, 19, -0.5f, 0.75f, 106, true);
}

}  // namespace
