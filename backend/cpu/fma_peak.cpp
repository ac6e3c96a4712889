#include "backend/cpu/fma_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "backend/cpu/vec_math.h"

namespace mx {

namespace {

constexpr int kChains = 12;
constexpr long kIters = 1L << 20;  // per run and thread: 12 Mi vector FMAs, ~4 ms at 3 GHz

// Runs kIters rounds of kChains dependent-per-chain FMAs and returns a value that depends on all
// of them (so the compiler cannot drop the work).
__attribute__((noinline)) float fma_chains(float seed) {
  using cpu::vfw;
  vfw acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = cpu::vfw{} + (seed + float(i) * 1e-7f);
  // |b| < 1 and a small c keep the chains bounded (no overflow, no denormals): a -> c / (1 - b).
  const vfw b = vfw{} + 0.9999999f, c = vfw{} + 1e-7f;
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * b + c;  // contracted into one FMA
  }
  vfw s = acc[0];
  for (int i = 1; i < kChains; ++i) s += acc[i];
  float r = 0;
  for (int i = 0; i < cpu::kVecWidth; ++i) r += s[i];
  return r;
}

}  // namespace

FmaPeak measure_fma_peak(double min_seconds) {
  FmaPeak p;
  p.vector_bits = cpu::kVecWidth * 32;
  volatile float sink = 0;
  const auto start = std::chrono::steady_clock::now();
  // (no cap on the runs: `mxtrain bench fma --seconds 30` stopped at 1000 runs, ~11 s)
  for (int run = 0;; ++run) {
    int threads = 1;
    float total = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : total)
    {
#pragma omp single
      threads = omp_get_num_threads();
      total += fma_chains(1.0f + float(omp_get_thread_num()));
    }
    const auto t1 = std::chrono::steady_clock::now();
    sink = sink + total;
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    const double flops = 2.0 * kChains * cpu::kVecWidth * double(kIters) * threads / secs;
    if (run > 0 && flops > p.flops) {  // run 0 warms the cores up
      p.flops = flops;
      p.threads = threads;
    }
    if (run >= 3 && std::chrono::duration<double>(t1 - start).count() >= min_seconds) break;
  }
  return p;
}

}  // namespace mx
