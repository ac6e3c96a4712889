#include "backend/sgemm_rate.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/arena.h"

namespace mx {

double measure_sgemm_flops(Backend& be, int64_t n, int min_reps, double min_seconds) {
  std::vector<float> a(n * n), b(n * n);
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
  using clock = std::chrono::steady_clock;
  be.gemm(false, true, n, n, n, 1.0f, da, db, 0.0f, dc);  // warm-up
  be.synchronize();
  const auto start = clock::now();
  double best = 1e30;
  for (int r = 0; r < 200; ++r) {
    auto t0 = clock::now();
    be.gemm(false, true, n, n, n, 1.0f, da, db, 0.0f, dc);
    be.synchronize();
    auto t1 = clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (r + 1 >= min_reps && std::chrono::duration<double>(t1 - start).count() >= min_seconds)
      break;
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace mx
