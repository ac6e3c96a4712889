// The machine's measured single-precision GEMM rate through a backend: the denominator of MFU
// on CPUs, where no datasheet number applies, and the yardstick for the benchmark's
// "GEMM time at N% of SGEMM" figure.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace mx {

// FLOP/s of C[n,n] = A[n,n] B[n,n]^T: the BEST of at least `min_reps` timed runs, repeated until
// `min_seconds` have passed as well (at most 200 runs), after one untimed warm-up. A single run
// on a shared machine reads low whenever another process takes a core for part of it (that made
// MFU read over 100%); the fastest of many runs over a stretch of time is the rate the machine
// reaches when it is ours.
double measure_sgemm_flops(Backend& backend, int64_t n = 1024, int min_reps = 3,
                           double min_seconds = 0.25);

}  // namespace mx
