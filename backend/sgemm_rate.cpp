#include "backend/sgemm_rate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/arena.h"

namespace mx {

double measure_sgemm_flops(Backend& be, int64_t n, int reps) {
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[i] = float((i * 7) % 13) * 0.01f;
    b[i] = float((i * 5) % 11) * 0.01f;
  }
  // The operands in the backend's memory (device memory on a GPU).
  const size_t bytes = sizeof(float) * size_t(n * n);
  Arena arena("sgemm_rate", 3 * Arena::round_up(bytes), nullptr, be.memory());
  float* da = arena.alloc_f32(n * n);
  float* db = arena.alloc_f32(n * n);
  float* dc = arena.alloc_f32(n * n);
  be.copy_from_host(da, a.data(), bytes);
  be.copy_from_host(db, b.data(), bytes);
  be.gemm(false, true, n, n, n, 1.0f, da, db, 0.0f, dc);  // warm-up
  be.synchronize();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    be.gemm(false, true, n, n, n, 1.0f, da, db, 0.0f, dc);
    be.synchronize();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace mx
