#include "backend/cuda/nccl_communicator.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "parallel/device_communicator.h"

// ncclCommSplit (2.18), ncclAvg (2.10), ncclCommGetAsyncError and ncclCommAbort.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "mxtrain's NCCL communicator needs NCCL 2.18 or newer (ncclCommSplit)"
#endif

namespace mx {
namespace {

void nccl_check(ncclResult_t r, const char* op) {
  if (r != ncclSuccess) throw CommError(str("nccl: ", op, ": ", ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(CommDtype d) {
  switch (d) {
    case CommDtype::kF32: return ncclFloat32;
    case CommDtype::kBF16: return ncclBfloat16;  // gathered and broadcast only, never reduced
    case CommDtype::kI64: return ncclInt64;
    case CommDtype::kF64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    // NCCL's average on floats multiplies every rank's addend by 1/size (rounded in the element
    // type) and sums (ncclDevPreMulSum in its enqueue.cc), so for a size that is not a power of
    // two it differs in the last bits from the MPI communicator's sum-then-divide. The trainer
    // averages only on the host world (the loss, the validation mean), never over NCCL.
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Waits on the host for `event` (recorded on the communicator's stream after its collectives)
// while watching the communicator's asynchronous error, as NCCL advises: a collective whose
// peer died or whose network failed never completes, so cudaEventSynchronize would wait until
// the watchdog (train.hang_timeout_s) ended the job, and NCCL's own error was never said. An
// error throws (CommError); the communicator is then aborted as it is destroyed.
void wait_watching(ncclComm_t comm, cudaEvent_t event, const char* op) {
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) MX_CUDA_CHECK(op, e);
    (void)cudaGetLastError();  // "not ready" is no error: do not leave it for a launch check
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress)
      throw CommError(str("nccl: ", op, ": ", ncclGetErrorString(async),
                          " (a peer or the network failed while this rank waited)"));
    // (a collective of a few bytes is done in microseconds: yield first, then sleep briefly)
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// A queued collective: complete when the event recorded after it has been reached.
// With a consumer stream (the compute stream), wait() does not block the host: it makes the
// consumer wait for the event on the device, so the kernels that read the gathered weights or
// reuse a reduce-scatter buffer are ordered after the collective while the host goes on queueing
// work (the overlap: compute of unit i runs while unit i+1's gather is in flight, and the host
// is never parked on a collective). Without one, wait() blocks the host as before.
struct EventImpl final : CommHandle::Impl {
  cudaEvent_t event = nullptr;
  cudaStream_t consumer = nullptr;
  ncclComm_t comm = nullptr;  // whose asynchronous error a host wait watches
  ~EventImpl() override {
    if (event) cudaEventDestroy(event);  // released by the driver once reached
  }
  void wait() override {
    if (consumer)
      MX_CUDA_CHECK("nccl wait", cudaStreamWaitEvent(consumer, event, 0));
    else
      wait_watching(comm, event, "nccl wait");
  }
  bool test() override {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is no error: do not leave it for a launch check
      return false;
    }
    MX_CUDA_CHECK("nccl test", e);
    return true;
  }
};

// True for memory the GPU can address (device or managed); host memory must be staged.
bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // older drivers: an unknown host pointer is an error, not a type
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// A device copy of a host buffer for one blocking collective (freed in stream order).
class Staging {
 public:
  Staging(size_t bytes, cudaStream_t stream) : stream_(stream) {
    MX_CUDA_CHECK("nccl staging", cudaMallocAsync(&p_, bytes ? bytes : 1, stream_));
  }
  ~Staging() { cudaFreeAsync(p_, stream_); }
  void* get() const { return p_; }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// NCCL does not support two ranks of one communicator on the same GPU ("may lead to hangs",
// its docs say; recent versions fail at init with "Duplicate GPU detected"). That happens when a
// node gets more ranks than it has GPUs (cuda_local_device wraps the local rank around the
// device count) or when CUDA_VISIBLE_DEVICES gives ranks the same GPU: said here, as a
// configuration error every rank reaches alike, before NCCL is asked. A GPU is named by its
// host and PCI bus id, which (unlike the device index) does not depend on CUDA_VISIBLE_DEVICES.
void check_one_rank_per_gpu(Communicator& host, int device) {
  constexpr size_t kHostBytes = 64, kBusBytes = 32, kWords = (kHostBytes + kBusBytes) / 8;
  char mine[kHostBytes + kBusBytes] = {};
  if (gethostname(mine, kHostBytes - 1) != 0) std::snprintf(mine, kHostBytes, "(unknown host)");
  mine[kHostBytes - 1] = 0;
  MX_CUDA_CHECK("nccl init", cudaDeviceGetPCIBusId(mine + kHostBytes, int(kBusBytes) - 1, device));
  std::vector<int64_t> all(kWords * size_t(host.size()));
  int64_t words[kWords];
  std::memcpy(words, mine, sizeof mine);
  host.all_gather(words, all.data(), int64_t(kWords), CommDtype::kI64);
  const char* base = reinterpret_cast<const char*>(all.data());
  auto host_of = [&](int r) { return std::string(base + size_t(r) * sizeof mine); };
  auto bus_of = [&](int r) { return std::string(base + size_t(r) * sizeof mine + kHostBytes); };
  for (int a = 0; a < host.size(); ++a)
    for (int b = a + 1; b < host.size(); ++b) {
      if (host_of(a) != host_of(b) || bus_of(a) != bus_of(b)) continue;
      int on_host = 0;
      for (int r = 0; r < host.size(); ++r) on_host += host_of(r) == host_of(a);
      int gpus = 0;
      if (cudaGetDeviceCount(&gpus) != cudaSuccess) (void)cudaGetLastError();
      throw UserError(str("ranks ", a, " and ", b, " on host ", host_of(a), " both drive the GPU "
                          "at PCI ", bus_of(a), ": NCCL needs one rank per GPU, and this host has ",
                          on_host, " ranks for ", gpus, " visible GPUs (start at most one rank "
                          "per GPU, e.g. mpirun --map-by ppr:", gpus, ":node, and do not give ranks the "
                          "same CUDA_VISIBLE_DEVICES)"));
    }
}

// NCCL's version code as X.Y.Z (NCCL_VERSION's two encodings: X*1000+Y*100+Z up to 2.8, then
// X*10000+Y*100+Z).
std::string nccl_version_string(int code) {
  const bool old = code < 10000;
  return str(old ? code / 1000 : code / 10000, ".", old ? code % 1000 / 100 : code % 10000 / 100,
             ".", code % 100);
}

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& bootstrap, int device) {
  int version = 0;
  nccl_check(ncclGetVersion(&version), "ncclGetVersion");
  if (version < NCCL_VERSION(2, 18, 0))
    throw UserError(str("the NCCL library loaded (libnccl.so.2) is version ",
                        nccl_version_string(version), "; mxtrain needs 2.18 or newer (it was "
                        "built against ", nccl_version_string(NCCL_VERSION_CODE), ")"));
  MX_CUDA_CHECK("nccl init", cudaSetDevice(device));
  check_one_rank_per_gpu(bootstrap, device);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (bootstrap.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  // The id travels as int64 words over the host communicator (128 bytes = 16 words).
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0, "ncclUniqueId size");
  std::vector<int64_t> words(sizeof(ncclUniqueId) / sizeof(int64_t));
  std::memcpy(words.data(), &id, sizeof id);
  bootstrap.broadcast(std::span<int64_t>(words), 0);
  std::memcpy(&id, words.data(), sizeof id);
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, device));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device) : comm_(comm), device_(device) {
  nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
  nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
  MX_CUDA_CHECK("nccl init", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

NcclCommunicator::~NcclCommunicator() {
  // Unwinding from an error (this rank's own, or a peer's that a collective reported): the
  // stream may hold collectives that will never complete, and ncclCommDestroy is a collective
  // among the node's ranks, which a failing job's other ranks never reach (NCCL's docs), so
  // waiting for either kept the error from reaching abort_all and the job hung until the
  // watchdog. ncclCommAbort waits for no one; abort_all's MPI_Abort then ends every rank.
  if (std::uncaught_exceptions() > 0) {
    if (comm_) ncclCommAbort(comm_);
    if (stream_) cudaStreamDestroy(stream_);  // (returns at once; freed when the device is done)
    return;
  }
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::wait_for(cudaStream_t s) {
  cudaEvent_t e;
  MX_CUDA_CHECK("nccl wait_for", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(e, s);
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, e, 0);
  cudaEventDestroy(e);  // released once the wait is done (and on a failure: no leak)
  MX_CUDA_CHECK("nccl wait_for", err);
}

void NcclCommunicator::sync(const char* op) {
  cudaEvent_t e;
  MX_CUDA_CHECK(op, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaError_t err = cudaEventRecord(e, stream_);
  if (err != cudaSuccess) {
    cudaEventDestroy(e);
    MX_CUDA_CHECK(op, err);
  }
  try {
    wait_watching(comm_, e, op);
  } catch (...) {
    cudaEventDestroy(e);
    throw;
  }
  cudaEventDestroy(e);
}

CommHandle NcclCommunicator::handle_for_stream(const char* op) {
  auto impl = std::make_unique<EventImpl>();
  MX_CUDA_CHECK(op, cudaEventCreateWithFlags(&impl->event, cudaEventDisableTiming));
  MX_CUDA_CHECK(op, cudaEventRecord(impl->event, stream_));
  impl->consumer = compute_stream_;
  impl->comm = comm_;
  return CommHandle(std::move(impl));
}

void NcclCommunicator::order_after_compute() {
  if (compute_stream_) wait_for(compute_stream_);
}

// The blocking forms below stage through device buffers unless both pointers are device memory;
// one of them may still be, so the staging copies say cudaMemcpyDefault (unified addressing
// tells the direction from each pointer) rather than assume host memory on the far side.
void NcclCommunicator::all_gather(const void* send, void* recv, int64_t count, CommDtype dtype) {
  if (on_device(send) && on_device(recv)) {
    all_gather_async(send, recv, count, dtype);  // the handle's destructor waits
    sync("all_gather");
    return;
  }
  check_collective_args("all_gather", count, dtype);
  order_after_compute();  // the staging copy may read device memory the compute stream writes
  const size_t bytes = size_t(count * comm_dtype_bytes(dtype));
  Staging s_send(bytes, stream_), s_recv(bytes * size_t(size_), stream_);
  MX_CUDA_CHECK("all_gather", cudaMemcpyAsync(s_send.get(), send, bytes, cudaMemcpyDefault,
                                              stream_));
  all_gather_async(s_send.get(), s_recv.get(), count, dtype);
  MX_CUDA_CHECK("all_gather", cudaMemcpyAsync(recv, s_recv.get(), bytes * size_t(size_),
                                              cudaMemcpyDefault, stream_));
  sync("all_gather");
}
void NcclCommunicator::reduce_scatter(const void* send, void* recv, int64_t count,
                                      CommDtype dtype, ReduceOp op) {
  if (on_device(send) && on_device(recv)) {
    reduce_scatter_async(send, recv, count, dtype, op);
    sync("reduce_scatter");
    return;
  }
  check_collective_args("reduce_scatter", count, dtype);
  order_after_compute();  // the staging copy may read device memory the compute stream writes
  const size_t bytes = size_t(count * comm_dtype_bytes(dtype));
  Staging s_send(bytes * size_t(size_), stream_), s_recv(bytes, stream_);
  MX_CUDA_CHECK("reduce_scatter", cudaMemcpyAsync(s_send.get(), send, bytes * size_t(size_),
                                                  cudaMemcpyDefault, stream_));
  reduce_scatter_async(s_send.get(), s_recv.get(), count, dtype, op);
  MX_CUDA_CHECK("reduce_scatter", cudaMemcpyAsync(recv, s_recv.get(), bytes,
                                                  cudaMemcpyDefault, stream_));
  sync("reduce_scatter");
}
void NcclCommunicator::all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype,
                                  ReduceOp op) {
  if (on_device(send) && on_device(recv)) {
    all_reduce_async(send, recv, count, dtype, op);
    sync("all_reduce");
    return;
  }
  check_collective_args("all_reduce", count, dtype);
  order_after_compute();  // the staging copy may read device memory the compute stream writes
  const size_t bytes = size_t(count * comm_dtype_bytes(dtype));
  Staging buf(bytes, stream_);
  MX_CUDA_CHECK("all_reduce",
                cudaMemcpyAsync(buf.get(), send, bytes, cudaMemcpyDefault, stream_));
  all_reduce_async(buf.get(), buf.get(), count, dtype, op);
  MX_CUDA_CHECK("all_reduce",
                cudaMemcpyAsync(recv, buf.get(), bytes, cudaMemcpyDefault, stream_));
  sync("all_reduce");
}

void NcclCommunicator::broadcast(void* buffer, int64_t count, CommDtype dtype, int root) {
  check_collective_args("broadcast", count, dtype);
  order_after_compute();
  const size_t bytes = size_t(count * comm_dtype_bytes(dtype));
  if (on_device(buffer)) {
    nccl_check(ncclBroadcast(buffer, buffer, size_t(count), nccl_type(dtype), root, comm_,
                             stream_),
               "ncclBroadcast");
  } else {
    Staging buf(bytes, stream_);
    MX_CUDA_CHECK("broadcast",
                  cudaMemcpyAsync(buf.get(), buffer, bytes, cudaMemcpyDefault, stream_));
    nccl_check(ncclBroadcast(buf.get(), buf.get(), size_t(count), nccl_type(dtype), root, comm_,
                             stream_),
               "ncclBroadcast");
    MX_CUDA_CHECK("broadcast",
                  cudaMemcpyAsync(buffer, buf.get(), bytes, cudaMemcpyDefault, stream_));
  }
  sync("broadcast");
}

void NcclCommunicator::barrier() {
  // NCCL has no barrier: an all-reduce of one float on a scratch word.
  float* word = nullptr;
  MX_CUDA_CHECK("barrier", cudaMallocAsync(reinterpret_cast<void**>(&word), sizeof(float), stream_));
  MX_CUDA_CHECK("barrier", cudaMemsetAsync(word, 0, sizeof(float), stream_));
  nccl_check(ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, comm_, stream_), "barrier");
  MX_CUDA_CHECK("barrier", cudaFreeAsync(word, stream_));
  sync("barrier");
}

CommHandle NcclCommunicator::all_gather_async(const void* send, void* recv, int64_t count,
                                              CommDtype dtype) {
  check_collective_args("all_gather", count, dtype);
  order_after_compute();
  nccl_check(ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, stream_),
             "ncclAllGather");
  return handle_for_stream("all_gather");
}

CommHandle NcclCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                                  CommDtype dtype, ReduceOp op) {
  check_collective_args("reduce_scatter", count, dtype);
  check_reduce_args("reduce_scatter", dtype, op);
  order_after_compute();
  nccl_check(ncclReduceScatter(send, recv, size_t(count), nccl_type(dtype), nccl_op(op), comm_,
                               stream_),
             "ncclReduceScatter");
  return handle_for_stream("reduce_scatter");
}

CommHandle NcclCommunicator::all_reduce_async(const void* send, void* recv, int64_t count,
                                              CommDtype dtype, ReduceOp op) {
  check_collective_args("all_reduce", count, dtype);
  check_reduce_args("all_reduce", dtype, op);
  order_after_compute();
  nccl_check(ncclAllReduce(send, recv, size_t(count), nccl_type(dtype), nccl_op(op), comm_,
                           stream_),
             "ncclAllReduce");
  return handle_for_stream("all_reduce");
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  // NCCL: "there should not be any outstanding NCCL operations on the comm" when it is split,
  // or the split may deadlock. (The only caller, make_hybrid_groups, splits an idle
  // communicator; this keeps a later caller from splitting one with collectives queued.)
  sync("split");
  ncclComm_t sub = nullptr;
  nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
  auto c = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(sub, device_));
  c->set_compute_stream(compute_stream_);
  return c;
}

namespace {
std::unique_ptr<Communicator> nccl_for_backend(Communicator& host, Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (!cuda)
    throw UserError(str("no communicator for the ", backend.name(), " backend's memory"));
  cuda->synchronize();
  auto comm = NcclCommunicator::create(host, cuda->device());
  comm->set_compute_stream(cuda->stream());
  return comm;
}
}  // namespace

void register_nccl_device_communicator() {
  register_device_communicator_factory(&nccl_for_backend);
}

}  // namespace mx
