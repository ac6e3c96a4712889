// CPU micro-benchmark of the FSDP collectives on the MPI communicator (not run in CI).
//
//   mpirun -np 2 --bind-to none build/mpi_comm_bench
//   mpirun -np 4 --oversubscribe --bind-to none build/mpi_comm_bench [--sizes-mb 1,4,16,64]
//
// For each size S (the full, gathered unit: S MB of fp32; every rank holds S / N), times
// all_gather and reduce_scatter (fp32 sum), blocking and async + wait, and prints NCCL-style
// bandwidths: algbw = S / time, busbw = algbw * (N - 1) / N (the bytes each rank's link
// actually carries, comparable across rank counts). Time per op is the slowest rank's mean.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int> parse_sizes(int argc, char** argv) {
  std::vector<int> sizes = {1, 4, 16, 64};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--sizes-mb") == 0) {
      sizes.clear();
      std::string s = argv[i + 1];
      size_t pos = 0;
      while (pos < s.size()) {
        size_t comma = s.find(',', pos);
        if (comma == std::string::npos) comma = s.size();
        sizes.push_back(std::atoi(s.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    }
  }
  return sizes;
}

}  // namespace

int main(int argc, char** argv) {
  mx::Communicator& c = mx::world_communicator();
  const int n = c.size();
  const std::vector<int> sizes = parse_sizes(argc, argv);
  if (c.rank() == 0) {
    std::printf("comm_bench: %d ranks (%s), fp32\n", n, c.kind().c_str());
    std::printf("%-22s %8s %6s %10s %10s %10s\n", "op", "size_MB", "iters", "time_ms",
                "algbw_GB/s", "busbw_GB/s");
  }
  for (int mb : sizes) {
    const int64_t full = (static_cast<int64_t>(mb) << 20) / 4 / n * n;  // floats, divisible by n
    const int64_t shard = full / n;
    std::vector<float> shard_buf(shard, 1.0f), full_buf(full, 0.0f), grad(full, 0.5f),
        gshard(shard, 0.0f);
    const int iters = std::clamp(256 / std::max(mb, 1), 3, 50);
    struct Op {
      const char* name;
      int kind;
    } ops[] = {{"all_gather", 0}, {"all_gather_async", 1}, {"reduce_scatter", 2},
               {"reduce_scatter_async", 3}};
    for (const Op& op : ops) {
      auto once = [&] {
        switch (op.kind) {
          case 0: c.all_gather(shard_buf, full_buf); break;
          case 1: c.all_gather_async(shard_buf, full_buf).wait(); break;
          case 2: c.reduce_scatter(grad, gshard, mx::ReduceOp::kSum); break;
          case 3: c.reduce_scatter_async(grad, gshard, mx::ReduceOp::kSum).wait(); break;
        }
      };
      once();  // warm-up: page faults, connection set-up
      once();
      c.barrier();
      const double t0 = now();
      for (int i = 0; i < iters; ++i) once();
      const double mine = (now() - t0) / iters;
      const double t = c.all_reduce(mine, mx::ReduceOp::kMax);
      const double bytes = static_cast<double>(full) * 4;
      const double algbw = bytes / t / 1e9;
      if (c.rank() == 0)
        std::printf("%-22s %8d %6d %10.2f %10.2f %10.2f\n", op.name, mb, iters, t * 1e3, algbw,
                    algbw * (n - 1) / n);
    }
  }
  return 0;
}
