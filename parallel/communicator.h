// Communicator: the collectives FSDP needs, behind one small interface.
//
// Implementations: MpiCommunicator (OpenMPI; a process launched by mpirun/srun) and
// SingleProcessCommunicator (size 1, no MPI at all; `mxtrain train` without mpirun). A NCCL
// communicator for GPUs will implement the same interface. FSDP code only sees Communicator&.
//
// Semantics follow NCCL (so the MPI and NCCL versions are interchangeable):
//   all_gather:     every rank sends `count` elements; recv holds `count * size` elements,
//                   rank-major (rank q's block at recv + q * count). In place when
//                   send == recv + rank * count (the shard already sits in its slot).
//   reduce_scatter: every rank sends `count * size` elements; rank r receives `count`
//                   elements: op over all ranks of send[r * count, (r + 1) * count).
//   all_reduce:     elementwise op over all ranks, result on every rank (send may == recv).
//   broadcast:      root's buffer copied to every rank's buffer.
// Every rank must call the same collectives on a communicator in the same order, with the same
// count and dtype (as in MPI and NCCL). A mismatch is a bug and may hang.
//
// Non-blocking forms (`*_async`) return a CommHandle; the buffers must stay untouched and alive
// until wait() returns. Several may be in flight at once on one communicator (FSDP: the next
// block's all-gather while this block's gradients reduce-scatter); they may be waited in any
// order. On CPU MPI a collective only advances while some MPI call runs on this rank: call
// handle.test() now and then during long computation (see docs/parallel.md, "Progress").
//
// Threads: MPI is initialised with MPI_THREAD_FUNNELED: call communicators only from the
// thread that created the world communicator (the main thread), never from inside an OpenMP
// parallel region.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace mx {

// Element types on the wire. bf16 travels as its 16 raw bits (uint16): gathered and broadcast
// bit for bit, never reduced (gradients reduce in fp32).
enum class CommDtype : uint8_t { kF32, kBF16, kI64, kF64 };
int64_t comm_dtype_bytes(CommDtype dtype);
const char* comm_dtype_name(CommDtype dtype);

// kAvg = sum / size, the division done in the element type after the sum (f32, f64 only) on
// MPI; the NCCL communicator's is NCCL's (each addend times 1/size, then summed: the same
// within rounding, docs/parallel.md).
enum class ReduceOp : uint8_t { kSum, kAvg, kMax };
const char* reduce_op_name(ReduceOp op);

// A collective failed inside the communication library (MPI_ERRORS_RETURN turned into an
// exception). The job cannot continue: callers let it reach abort_all.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A collective in flight. Move-only. wait() blocks until it completes (idempotent): on the
// host, or, for a device communicator given a compute stream (the NCCL one under FSDP), on
// that stream: the work queued there after wait() sees the result, and the host goes on
// queueing without blocking (a host read of the buffers needs the stream synchronized); test()
// advances it without blocking and says whether it has completed. A handle destroyed while
// pending waits for it (its buffers are about to be reused or freed), except during stack
// unwinding, when the job is about to be aborted anyway and waiting could hang.
class CommHandle {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual void wait() = 0;  // blocks (the host, or the consumer stream: see above)
    virtual bool test() = 0;  // non-blocking; true once complete (then wait() is instant)
  };

  CommHandle() = default;  // already complete (what a size-1 communicator returns)
  explicit CommHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&& other) noexcept;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle();

  void wait();
  bool test();
  bool pending() const { return impl_ != nullptr; }

 private:
  void finish_in_destructor() noexcept;
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string kind() const = 0;  // "mpi" or "single-process", for logs

  // Raw forms: `count` elements of `dtype` per rank as described at the top of this file.
  virtual void all_gather(const void* send, void* recv, int64_t count, CommDtype dtype) = 0;
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, CommDtype dtype,
                              ReduceOp op) = 0;
  virtual void all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype,
                          ReduceOp op) = 0;
  virtual void broadcast(void* buffer, int64_t count, CommDtype dtype, int root) = 0;
  virtual void barrier() = 0;

  virtual CommHandle all_gather_async(const void* send, void* recv, int64_t count,
                                      CommDtype dtype) = 0;
  virtual CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count,
                                          CommDtype dtype, ReduceOp op) = 0;
  virtual CommHandle all_reduce_async(const void* send, void* recv, int64_t count,
                                      CommDtype dtype, ReduceOp op) = 0;

  // Collective over this communicator: ranks with the same color form a new communicator,
  // ordered by key (ties by rank here). color >= 0. Hybrid sharding: see parallel/groups.h.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Typed forms: sizes checked (a mismatch is a bug: std::logic_error), count from send.
  void all_gather(std::span<const float> send, std::span<float> recv);
  void all_gather(std::span<const uint16_t> send, std::span<uint16_t> recv);  // bf16 bits
  CommHandle all_gather_async(std::span<const float> send, std::span<float> recv);
  CommHandle all_gather_async(std::span<const uint16_t> send, std::span<uint16_t> recv);
  void reduce_scatter(std::span<const float> send, std::span<float> recv, ReduceOp op);
  CommHandle reduce_scatter_async(std::span<const float> send, std::span<float> recv,
                                  ReduceOp op);
  void all_reduce(std::span<float> data, ReduceOp op);  // in place
  void all_reduce(std::span<double> data, ReduceOp op);
  void all_reduce(std::span<int64_t> data, ReduceOp op);
  CommHandle all_reduce_async(std::span<float> data, ReduceOp op);
  double all_reduce(double value, ReduceOp op);    // scalar: loss, grad-norm squares
  int64_t all_reduce(int64_t value, ReduceOp op);  // scalar: token counts
  void broadcast(std::span<float> data, int root);
  void broadcast(std::span<uint16_t> data, int root);
  void broadcast(std::span<int64_t> data, int root);
};

// Checks shared by the implementations (a failure is a bug in the caller: std::logic_error).
void check_collective_args(const char* what, int64_t count, CommDtype dtype);
void check_reduce_args(const char* what, CommDtype dtype, ReduceOp op);

// ---- The process's world -------------------------------------------------------------------

// True when this process was started by an MPI launcher (mpirun/mpiexec/srun/hydra): one of
// OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE, PMI_RANK is set. Then the world communicator is
// MPI (even at -np 1); otherwise it is a SingleProcessCommunicator and MPI is never initialised
// (a plain `mxtrain train` starts fast and needs no launcher). MXTRAIN_MPI=1 forces MPI
// (an OpenMPI singleton), MXTRAIN_MPI=0 forbids it.
bool launched_by_mpi_launcher();

// The world communicator, created on first call (MPI_Init_thread for MPI; MPI_Finalize runs at
// normal process exit). Call first from the main thread.
Communicator& world_communicator();

// True once world_communicator() has created an MPI world of more than one process.
bool in_multi_process_job();

// The processes of this job on this host, as the launcher says (Open MPI's
// OMPI_COMM_WORLD_LOCAL_SIZE, MPICH's MPI_LOCALNRANKS); 1 without one. Readable before the
// world exists: the data loader divides its in-memory budget by it.
int64_t launcher_ranks_on_this_host();

// "rank R: " when the launcher's environment says this process is rank R of more than one
// (OMPI_COMM_WORLD_*, PMIX_RANK / PMI_*), else "": for errors before the world exists (a bad
// config), so that they read as abort_all's do.
std::string launcher_rank_prefix();

// Called by a failing rank before it prints its error: a rank other than 0 (as the launcher
// numbers it) waits a moment. An error every rank finds (a config past a limit, a bad resume)
// then reads once, as rank 0's, since rank 0's exit or MPI_Abort has the launcher kill the
// rest before they print it again. A rank's own error (rank 0 waits for it in a collective, so
// ends nothing) is printed after the wait. False: a SIGTERM came during the wait (mpirun's, as
// rank 0's failure ends the job): print nothing. abort_all does the same.
bool let_rank0_report_first();

// True when the launcher says this process is one of more than one rank but it never joined
// the MPI job (MPI_Init was not called): a rank that exits 0 so (`train --help`,
// `--list-keys`, a one-process command) leaves the ranks that did join waiting for it forever,
// since Open MPI takes a clean exit before MPI_Init as normal.
bool rank_left_job_unjoined();

// Ends the whole job now, from any one rank, without waiting for the others: prints
// `error: rank R: <message>` to stderr (`error: <message>` in a single-process run), then
// MPI_Abort(MPI_COMM_WORLD, exit_code), which makes mpirun kill every rank and exit with
// exit_code; in a single-process run, std::exit(exit_code). Every path that ends a rank with a
// failure must come here: returning from main with an error code would run MPI_Finalize, which
// waits for ranks that are themselves waiting in a collective for this one (a hang).
[[noreturn]] void abort_all(int exit_code, const std::string& message);

// The usual exit codes of a failure (see core/error.h): UserError 2, StorageError 3,
// anything else (CommError, bugs) 1.
int exit_code_for(const std::exception& e);

}  // namespace mx
