// The communicator of a process that runs alone (size 1, rank 0): every collective is a copy
// (or nothing, in place), with the arithmetic of one rank (kAvg divides by 1, exactly). Used
// when the process was not started by an MPI launcher, so a plain `mxtrain train` needs no MPI
// initialisation, and in single-process unit tests.
#pragma once
#include "parallel/communicator.h"

namespace mx {

class SingleProcessCommunicator final : public Communicator {
 public:
  using Communicator::all_gather;
  using Communicator::all_gather_async;
  using Communicator::all_reduce;
  using Communicator::all_reduce_async;
  using Communicator::broadcast;
  using Communicator::reduce_scatter;
  using Communicator::reduce_scatter_async;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string kind() const override { return "single-process"; }

  void all_gather(const void* send, void* recv, int64_t count, CommDtype dtype) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, CommDtype dtype,
                      ReduceOp op) override;
  void all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype,
                  ReduceOp op) override;
  void broadcast(void* buffer, int64_t count, CommDtype dtype, int root) override;
  void barrier() override {}

  // Complete on return: the handle is empty.
  CommHandle all_gather_async(const void* send, void* recv, int64_t count,
                              CommDtype dtype) override;
  CommHandle reduce_scatter_async(const void* send, void* recv, int64_t count, CommDtype dtype,
                                  ReduceOp op) override;
  CommHandle all_reduce_async(const void* send, void* recv, int64_t count, CommDtype dtype,
                              ReduceOp op) override;

  std::unique_ptr<Communicator> split(int color, int key) override;
};

}  // namespace mx
