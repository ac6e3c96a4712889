// The process's world communicator and the job-wide failure path.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/stop.h"
#include "parallel/communicator.h"
#include "parallel/mpi_communicator.h"
#include "parallel/single_process_communicator.h"

namespace mx {

namespace {

Communicator* g_world = nullptr;  // never destroyed: MPI_Finalize runs from atexit instead

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0';
}

bool mpi_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Runs when the process exits through exit() or a return from main. A clean exit (status 0)
// finalizes MPI; MPI_Finalize waits for the other ranks, which are finishing too. A non-zero
// status means this rank failed without calling abort_all (e.g. main printed an error and
// returned 2): finalizing then would hang, since the other ranks may be waiting for this one
// inside a collective, so the job is aborted with that status instead. glibc's on_exit gives
// the status; elsewhere atexit can't see it and every exit finalizes (use abort_all there).
void end_mpi_at_exit(int status, void*) {
  if (!mpi_active()) return;
  // 130 / 143: stopped by SIGINT / SIGTERM. The trainer agrees on the stop step on every rank
  // (an all-reduce) and checkpoints it, so every rank exits this way and none is left waiting.
  if (status == 0 || status == 130 || status == 143) {
    MPI_Finalize();
    return;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status);
}

#if !defined(__GLIBC__)
void end_mpi_at_exit_no_status() { end_mpi_at_exit(0, nullptr); }
#endif

Communicator* make_world() {
  if (!launched_by_mpi_launcher()) return new SingleProcessCommunicator();
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
#if defined(__GLIBC__)
  on_exit(end_mpi_at_exit, nullptr);
#else
  std::atexit(end_mpi_at_exit_no_status);
#endif
  if (provided < MPI_THREAD_FUNNELED)
    warn(str("MPI provides thread level ", provided, " < MPI_THREAD_FUNNELED"));
  // Errors on the world (and the communicators split from it) return codes instead of
  // aborting inside MPI, so they become CommError with a message, then abort_all.
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return new MpiCommunicator(MPI_COMM_WORLD, /*owns=*/false);
}

}  // namespace

bool launched_by_mpi_launcher() {
  if (const char* force = std::getenv("MXTRAIN_MPI")) {
    if (std::strcmp(force, "1") == 0) return true;
    if (std::strcmp(force, "0") == 0) return false;
  }
  return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_SIZE") ||
         env_set("PMI_RANK");
}

namespace {
// This process's rank as the launcher's environment says it; -1 outside a job of 2 or more.
long launcher_rank() {
  auto first = [](std::initializer_list<const char*> names) -> long {
    for (const char* n : names)
      if (const char* v = std::getenv(n); v && *v) return std::strtol(v, nullptr, 10);
    return -1;
  };
  const long size = first({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  const long rank = first({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
  return size <= 1 ? -1 : rank;
}

bool wait_if_not_rank0(long rank) {
  if (rank <= 0) return true;
  // (mpirun ends the others with SIGTERM, then SIGKILL; `train` catches SIGTERM as a stop
  // request and counts it. One taken before, a spot notice, is not this, and a Ctrl-C passed
  // on is not the job ending: the rank's error is printed then.)
  const int before = g_sigterm_count.load();
  for (int i = 0; i < 40 && g_sigterm_count.load() == before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return g_sigterm_count.load() == before;
}
}  // namespace

std::string launcher_rank_prefix() {
  const long rank = launcher_rank();
  return rank < 0 ? "" : "rank " + std::to_string(rank) + ": ";
}

bool let_rank0_report_first() { return wait_if_not_rank0(launcher_rank()); }

int64_t launcher_ranks_on_this_host() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* n = std::getenv(v); n && std::atoll(n) > 0) return std::atoll(n);
  return 1;
}

bool rank_left_job_unjoined() {
  if (!launched_by_mpi_launcher()) return false;
  const char* size = nullptr;  // (srun with PMIx names no size of its own: Slurm's)
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (const char* v = std::getenv(name); !size && v && *v) size = v;
  if (!size || std::strtol(size, nullptr, 10) <= 1) return false;
  int initialized = 0;
  MPI_Initialized(&initialized);  // (true after MPI_Finalize too)
  return !initialized;
}

Communicator& world_communicator() {
  if (!g_world) g_world = make_world();
  return *g_world;
}

bool in_multi_process_job() { return mpi_active() && g_world && g_world->size() > 1; }

void abort_all(int exit_code, const std::string& text) {
  if (exit_code == 0) exit_code = 1;  // a failure never reads as success
  const std::string message = one_line(text);
  std::fflush(stdout);
  if (mpi_active()) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size == 1) std::fprintf(stderr, "error: %s\n", message.c_str());
    else if (wait_if_not_rank0(rank))  // (see let_rank0_report_first)
      std::fprintf(stderr, "error: rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);  // mpirun kills every rank, exits with exit_code
  }
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(exit_code);  // one process: flush files, run destructors, as returning from main
}

}  // namespace mx
