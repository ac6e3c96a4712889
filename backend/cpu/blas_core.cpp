#include "backend/cpu/blas_core.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// OpenBLAS's own queries (declared in its cblas.h, repeated here so that the header's other
// declarations stay out of this file).
extern "C" char* openblas_get_corename(void);
extern "C" char* openblas_get_config(void);

namespace mx {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// 3: AVX-512 (F, CD, BW, DQ, VL), 2: AVX2 + FMA, 1: AVX, 0: older or not x86-64. GCC's
// __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV).
int cpu_class() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

// The instruction class OpenBLAS's x86-64 kernel set `core` targets (names as
// openblas_get_corename spells them, compared in lower case). Unknown names count as modern, so
// that a core this table does not know is never replaced.
int core_class(const std::string& core) {
  static const char* const sse[] = {"prescott", "core2",   "penryn",   "dunnington", "nehalem",
                                    "atom",     "opteron", "opteron(sse3)", "barcelona", "nano",
                                    "katmai",   "coppermine", "northwood", "banias", "bobcat",
                                    "unknown"};
  static const char* const avx[] = {"sandybridge", "bulldozer", "piledriver"};
  const std::string c = lower(core);
  for (const char* s : sse)
    if (c == s) return 0;
  for (const char* s : avx)
    if (c == s) return 1;
  return 3;
}

}  // namespace

BlasCore blas_core() {
  BlasCore b;
  b.core = openblas_get_corename();
  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": the first two words.
  const std::string config = openblas_get_config();
  const size_t sp = config.find(' ');
  const size_t sp2 = sp == std::string::npos ? sp : config.find(' ', sp + 1);
  b.library = config.substr(0, sp2);
  if (const char* r = std::getenv("MXTRAIN_BLAS_REPLACED")) {
    const char* set = std::getenv("OPENBLAS_CORETYPE");
    if (set && lower(set) == lower(b.core)) b.replaced = r;
  }
  return b;
}

std::string better_blas_core(const std::string& current) {
  const int cpu = cpu_class();
  if (cpu < 2 || core_class(current) >= 2) return "";
  return cpu == 3 ? "SkylakeX" : "Haswell";
}

void select_blas_core(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's (or our first run's) choice
  std::string current = openblas_get_corename();
  // Tests: what OpenBLAS would pick on a CPU it does not know, on any machine.
  if (const char* t = std::getenv("MXTRAIN_TEST_BLAS_PICKED")) current = t;
  const std::string better = better_blas_core(current);
  if (better.empty()) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv("MXTRAIN_BLAS_REPLACED", current.c_str(), 1);
  std::fflush(nullptr);
  execv("/proc/self/exe", argv);
  // Still here: run on with OpenBLAS's pick, and say what it costs.
  std::fprintf(stderr,
               "warning: OpenBLAS runs its %s kernels on this CPU, which has %s; restarting with "
               "OPENBLAS_CORETYPE=%s failed (%s): GEMMs will be several times slower. Set "
               "OPENBLAS_CORETYPE=%s yourself to avoid this.\n",
               current.c_str(), better == "SkylakeX" ? "AVX-512" : "AVX2", better.c_str(),
               std::strerror(errno), better.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("MXTRAIN_BLAS_REPLACED");
}

}  // namespace mx
