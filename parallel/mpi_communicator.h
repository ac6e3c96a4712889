// The MPI communicator (OpenMPI): blocking collectives map to MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Allreduce, MPI_Bcast, MPI_Barrier; non-blocking ones to
// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce. Errors come back as return codes
// (MPI_ERRORS_RETURN) and are thrown as CommError.
//
// The world instance comes from world_communicator() (parallel/communicator.h), which
// initialises MPI once per process; split() makes sub-communicators that free their MPI_Comm
// when destroyed (a no-op after MPI_Finalize).
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the deprecated C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include "parallel/communicator.h"

namespace mx {

class MpiCommunicator final : public Communicator {
 public:
  using Communicator::all_gather;
  using Communicator::all_gather_async;
  using Communicator::all_reduce;
  using Communicator::all_reduce_async;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;
  using Communicator::reduce_scatter_async;

  // owns: MPI_Comm_free at destruction (sub-communicators); never for MPI_COMM_WORLD.
  MpiCommunicator(MPI_Comm comm, bool owns);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }

  void all_gather(const void* send, void* recv, int64_t count, CommDtype dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, CommDtype dtype,
                      ReduceOp op) override;
  void all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype,
                  ReduceOp op) override;
  void broadcast(void* buffer, int64_t count, CommDtype dtype, int root) override;
  void barrier() override;

  CommHandle all_gather_async(const void* send, void* recv, int64_t count,
                              CommDtype dtype) override;
  CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, CommDtype dtype,
                                  ReduceOp op) override;
  CommHandle all_reduce_async(const void* send, void* recv, int64_t count, CommDtype dtype,
                              ReduceOp op) override;

  std::unique_ptr<Communicator> split(int color, int key) override;

 private:
  MPI_Comm comm_;
  bool owns_;
  int rank_ = 0;
  int size_ = 1;
};

// Throws CommError("<what> failed: <MPI error string>") unless rc == MPI_SUCCESS.
void check_mpi(int rc, const char* what);

}  // namespace mx
