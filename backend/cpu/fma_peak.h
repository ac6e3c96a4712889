// The CPU's measured fp32 multiply-add peak: the roof no fp32 GEMM, ours or PyTorch's, can pass.
//
// The benchmark (bench/cpu_vs_torch.py) compares mxtrain with a PyTorch reference that runs the
// same GEMMs through the same OpenBLAS; how far apart the two can be depends on how close
// mxtrain's whole step gets to this roof, and on how far below it the reference stays. Measuring
// the roof on the machine at hand says which speed-ups are still there to be had.
#pragma once

namespace mx {

struct FmaPeak {
  double flops = 0;     // FLOP/s on all threads (a multiply-add counts 2), the best run
  int threads = 0;      // OpenMP threads that ran
  int vector_bits = 0;  // width of the vectors this build's kernel uses (512 with AVX-512)
};

// Best of repeated runs over at least `min_seconds` (and at least 3 runs): every OpenMP thread
// runs 12 independent chains of vector multiply-adds on registers, enough to keep two FMA units
// busy through a 5-cycle latency. A run on a shared machine reads low when another process takes
// a core; the fastest run is the machine's rate when it is ours.
FmaPeak measure_fma_peak(double min_seconds = 0.5);

}  // namespace mx
