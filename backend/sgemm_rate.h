// The machine's measured single-precision GEMM rate through a backend: the denominator of MFU
// on CPUs, where no datasheet number applies, and the yardstick for the benchmark's
// "GEMM time at N% of SGEMM" figure.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace mx {

// FLOP/s of C[n,n] = A[n,n] B[n,n]^T, best of `reps` runs after one warm-up.
double measure_sgemm_flops(Backend& backend, int64_t n = 1024, int reps = 3);

}  // namespace mx
