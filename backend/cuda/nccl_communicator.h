// NcclCommunicator: the Communicator interface (parallel/communicator.h) over NCCL, for buffers
// in device memory (the blocking forms also take host buffers, staged through device memory:
// the trainer's scalars, e.g. the gradient norm's partial sums). One per process and GPU; bootstrapped over an existing host communicator
// (the MPI world under mpirun): rank 0 makes the ncclUniqueId and broadcasts its bytes.
//
// Collectives are queued on the communicator's own stream (so they can overlap the compute
// stream); the blocking forms wait for that stream; the *_async forms record an event that the
// handle's test() queries and its wait() orders the compute stream after (a device-side wait:
// the host does not block, so it keeps queueing kernels while collectives run; every later use
// of the buffers through the backend's stream sees the result). Without a compute stream,
// wait() blocks the host on the event. Compute that produced a send buffer on another stream
// must be ordered before the collective by the caller (wait_for(compute_stream)).
//
// Compiled only; never run (this machine has no GPU, and no multi-GPU machine has been lent).
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>

#include "parallel/communicator.h"

namespace mx {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: every rank of it calls this with its own device.
  static std::unique_ptr<NcclCommunicator> create(Communicator& bootstrap, int device);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "nccl"; }
  cudaStream_t stream() const { return stream_; }
  // Makes later collectives on this communicator wait for the work queued so far on `s`.
  void wait_for(cudaStream_t s);
  // The stream that computes the buffers (the CudaBackend's): every collective first waits
  // for the work queued on it so far (wait_for), so FSDP needs no stream code of its own.
  // Inherited by split(). Null: none (the caller orders).
  void set_compute_stream(cudaStream_t s) { compute_stream_ = s; }

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
  NcclCommunicator(ncclComm_t comm, int device);
  CommHandle handle_for_stream(const char* op);
  void sync(const char* op);
  void order_after_compute();

  ncclComm_t comm_ = nullptr;
  int device_ = 0, rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_stream_ = nullptr;
};

// Registers make_device_communicator's CUDA factory (parallel/device_communicator.h): an
// NcclCommunicator over the host world on the CudaBackend's device, ordered after its stream.
// register_cuda_backend() calls it.
void register_nccl_device_communicator();

}  // namespace mx
