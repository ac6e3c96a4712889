#include "backend/sgemm_rate.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace mx {

double measure_sgemm_flops(Backend& be, int64_t n, int reps) {
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = float((i * 7) % 13) * 0.01f;
    b[i] = float((i * 5) % 11) * 0.01f;
  }
  be.gemm(false, true, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    be.gemm(false, true, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace mx
