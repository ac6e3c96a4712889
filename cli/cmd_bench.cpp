// mxtrain bench: micro-benchmarks of the machine (the SGEMM rate MFU is measured against, and
// the CPU's fp32 multiply-add peak above it).
#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "backend/cpu/blas_core.h"
#include "backend/cpu/fma_peak.h"
#include "backend/sgemm_rate.h"
#include "cli/commands.h"
#include "core/error.h"

namespace mx::cli {

void add_bench(CLI::App& app, Action& action) {
  auto* bench = app.add_subcommand("bench", "machine micro-benchmarks");
  bench->require_subcommand(1);
  auto* sgemm = bench->add_subcommand("sgemm", "measured fp32 GEMM rate (JSON)");
  auto n = std::make_shared<int64_t>(2048);
  auto device = std::make_shared<std::string>("cpu");
  auto seconds = std::make_shared<double>(2.0);
  sgemm->add_option("--size", *n, "matrix size");
  sgemm->add_option("--seconds", *seconds,
                    "keep timing for at least this long (and at least 3 runs, at most 200); the "
                    "best run counts");
  sgemm->add_option("--device", *device, "cpu | cuda");
  sgemm->callback([&action, n, device, seconds] {
    action = [n, device, seconds] {
      MX_REQUIRE(*n >= 16 && *n <= 16384, "--size must be in [16, 16384]");
      MX_REQUIRE(*seconds >= 0 && *seconds <= 600, "--seconds must be in [0, 600]");
      auto be = make_backend(*device, "--device");
      const auto t0 = std::chrono::steady_clock::now();
      double flops = measure_sgemm_flops(*be, *n, 3, *seconds);
      const double spent =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::ordered_json out;
      out["size"] = *n;
      out["gflops"] = std::round(flops / 1e6) / 1e3;
      out["seconds"] = std::round(spent * 1e3) / 1e3;  // what it took, warm-up included
      // On the CPU, which OpenBLAS kernels ran (and which ones OpenBLAS had picked, when
      // mxtrain replaced them: backend/cpu/blas_core.h).
      if (be->name() == "cpu") {
        const BlasCore b = blas_core();
        out["blas"] = b.library;
        out["blas_core"] = b.core;
        out["blas_core_replaced"] = b.replaced;
      }
      std::printf("%s\n", out.dump().c_str());
      return 0;
    };
  });

  auto* fma = bench->add_subcommand(
      "fma", "measured fp32 multiply-add peak of the CPU, on all OpenMP threads (JSON)");
  auto fma_seconds = std::make_shared<double>(1.0);
  fma->add_option("--seconds", *fma_seconds,
                  "keep timing for at least this long (and at least 3 runs); the best run counts");
  fma->callback([&action, fma_seconds] {
    action = [fma_seconds] {
      MX_REQUIRE(*fma_seconds >= 0 && *fma_seconds <= 600, "--seconds must be in [0, 600]");
      const auto t0 = std::chrono::steady_clock::now();
      const FmaPeak p = measure_fma_peak(*fma_seconds);
      const double spent =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::ordered_json out;
      out["gflops"] = std::round(p.flops / 1e6) / 1e3;
      out["threads"] = p.threads;
      out["vector_bits"] = p.vector_bits;
      out["seconds"] = std::round(spent * 1e3) / 1e3;  // what it took, as bench sgemm says
      std::printf("%s\n", out.dump().c_str());
      return 0;
    };
  });
}

}  // namespace mx::cli
