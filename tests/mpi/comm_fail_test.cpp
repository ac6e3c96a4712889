// Failure behaviour of a multi-process job: one rank fails while the others wait for it inside a
// collective. The job must end on every rank within seconds, not hang.
//
//   mpirun -np N build/mpi_comm_fail_test MODE
//   MODE throw        rank 1 throws mx::UserError; main catches it -> abort_all(2, what):
//                     `error: rank 1: injected failure ...`, mpirun exits 2.
//   MODE throw-async  the same, with an all-gather of rank 1 still in flight (its handle is
//                     destroyed during unwinding).
//   MODE kill         rank 1 sends itself SIGKILL: mpirun notices the abnormal exit, kills the
//                     other ranks and exits non-zero.
//   MODE exit         rank 1 returns exit code 3 from main through std::exit WITHOUT abort_all
//                     (what a careless error path would do); shows why abort_all is needed.
//   MODE ok           no failure: every rank prints `rank R done` and the job exits 0.
// The other ranks print `rank R pid P waiting` and block in an all_reduce that rank 1 never joins.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "parallel/communicator.h"

namespace {

int run(mx::Communicator& world, const std::string& mode) {
  // One successful collective first: the failure happens in a running job, not at start-up.
  const int64_t n = world.all_reduce(int64_t{1}, mx::ReduceOp::kSum);
  MX_ASSERT(n == world.size(), "warm-up all_reduce");
  if (world.rank() == 1 && mode != "ok") {
    if (mode == "throw") throw mx::UserError("injected failure in rank 1");
    if (mode == "throw-async") {
      std::vector<float> shard(1 << 16, 1.0f), full((1 << 16) * world.size());
      mx::CommHandle pending = world.all_gather_async(shard, full);
      throw mx::UserError("injected failure in rank 1 with an all-gather in flight");
    }
    if (mode == "kill") {
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (mode == "exit") std::exit(3);
    throw mx::UserError("unknown mode '" + mode + "'");
  }
  std::printf("rank %d pid %d waiting\n", world.rank(), static_cast<int>(getpid()));
  std::fflush(stdout);
  // Rank 1 never gets here in a failure mode: without failure handling this waits forever.
  world.all_reduce(int64_t{1}, mx::ReduceOp::kSum);
  std::printf("rank %d done\n", world.rank());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  mx::Communicator& world = mx::world_communicator();
  try {
    return run(world, mode);
  } catch (const std::exception& e) {
    mx::abort_all(mx::exit_code_for(e), e.what());
  }
}
