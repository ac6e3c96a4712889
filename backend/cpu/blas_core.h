// Which OpenBLAS kernel set ("core") the CPU backend's GEMMs run on, and a fix for the case
// where OpenBLAS picks a poor one.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: when the library loads, it reads the CPU's
// family and model and picks kernels for it. A CPU newer than the library (an Emerald Rapids
// Xeon, model 0xCF, under OpenBLAS 0.3.21, for one) is not in its table, and the library falls
// back to "Prescott", SSE3 kernels: SGEMM then runs at about a seventh of the AVX-512 kernels'
// rate (measured: 32 against 226 GFLOP/s on 2 cores). OpenBLAS reads the environment variable
// OPENBLAS_CORETYPE once, when it loads, before main(); so mxtrain sets it and runs itself again.
#pragma once
#include <string>

namespace mx {

struct BlasCore {
  std::string library;  // "OpenBLAS 0.3.21" (from openblas_get_config)
  std::string core;     // the kernels in use: "SkylakeX", "Haswell", "Prescott", ...
  // Set when mxtrain chose `core` because OpenBLAS had picked this poorer one for the CPU.
  std::string replaced;
};

// What the loaded OpenBLAS runs on now.
BlasCore blas_core();

// The OpenBLAS core this CPU's instruction set calls for ("SkylakeX" with AVX-512 F/CD/BW/DQ/VL,
// "Haswell" with AVX2 and FMA), or "" when OpenBLAS's own pick `current` is already of that
// class, or the CPU is not x86-64. Only a fallback to SSE or AVX kernels on a CPU with AVX2 is
// replaced: where OpenBLAS picked a modern core (Zen on an AMD CPU, say) its choice stands.
std::string better_blas_core(const std::string& current);

// First thing in main(): if OPENBLAS_CORETYPE is unset and better_blas_core() names a core,
// set OPENBLAS_CORETYPE (and MXTRAIN_BLAS_REPLACED, for blas_core().replaced) and execv the
// program again with the same arguments. Returns (without exec) when the user set
// OPENBLAS_CORETYPE, when nothing needs changing, or when the exec fails (with a warning).
void select_blas_core(char** argv);

}  // namespace mx
