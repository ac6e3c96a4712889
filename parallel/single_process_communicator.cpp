#include "parallel/single_process_communicator.h"

#include <cstring>

#include "core/error.h"

namespace mx {

namespace {
// One rank: sum, avg (x / 1) and max of a single value are the value itself, bit for bit.
void copy_elements(const void* send, void* recv, int64_t count, CommDtype dtype) {
  if (send != recv && count > 0)
    std::memmove(recv, send, static_cast<size_t>(count * comm_dtype_bytes(dtype)));
}
}  // namespace

void SingleProcessCommunicator::all_gather(const void* send, void* recv, int64_t count,
                                           CommDtype dtype) {
  check_collective_args("all_gather", count, dtype);
  copy_elements(send, recv, count, dtype);
}

void SingleProcessCommunicator::reduce_scatter(const void* send, void* recv, int64_t count,
                                               CommDtype dtype, ReduceOp op) {
  check_collective_args("reduce_scatter", count, dtype);
  check_reduce_args("reduce_scatter", dtype, op);
  copy_elements(send, recv, count, dtype);
}

void SingleProcessCommunicator::all_reduce(const void* send, void* recv, int64_t count,
                                           CommDtype dtype, ReduceOp op) {
  check_collective_args("all_reduce", count, dtype);
  check_reduce_args("all_reduce", dtype, op);
  copy_elements(send, recv, count, dtype);
}

void SingleProcessCommunicator::broadcast(void* buffer, int64_t count, CommDtype dtype,
                                          int root) {
  check_collective_args("broadcast", count, dtype);
  MX_ASSERT(root == 0, "broadcast: root ", root, " out of range for size 1");
}

CommHandle SingleProcessCommunicator::all_gather_async(const void* send, void* recv,
                                                       int64_t count, CommDtype dtype) {
  all_gather(send, recv, count, dtype);
  return CommHandle();
}

CommHandle SingleProcessCommunicator::reduce_scatter_async(const void* send, void* recv,
                                                           int64_t count, CommDtype dtype,
                                                           ReduceOp op) {
  reduce_scatter(send, recv, count, dtype, op);
  return CommHandle();
}

CommHandle SingleProcessCommunicator::all_reduce_async(const void* send, void* recv,
                                                       int64_t count, CommDtype dtype,
                                                       ReduceOp op) {
  all_reduce(send, recv, count, dtype, op);
  return CommHandle();
}

std::unique_ptr<Communicator> SingleProcessCommunicator::split(int color, int key) {
  MX_ASSERT(color >= 0, "split: color must be >= 0 (got ", color, ")");
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace mx
