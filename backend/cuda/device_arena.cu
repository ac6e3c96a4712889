#include "backend/cuda/device_arena.h"

#include <stdexcept>

#include "backend/cuda/cuda_check.h"

namespace mx {

void throw_out_of_gpu_memory(const std::string& arena, size_t bytes, const std::string& advice) {
  cudaGetLastError();  // clear the error state of the failed allocation
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  throw UserError(str("out of GPU memory: arena '", arena, "' needs ", bytes, " bytes, the GPU has ",
                      free_b, " of ", total_b, " free (", advice, ")"));
}

DeviceArena::DeviceArena(std::string name, size_t capacity, MemoryTracker* tracker,
                         std::string advice)
    : name_(std::move(name)), advice_(std::move(advice)), capacity_(round_up(capacity)),
      tracker_(tracker) {
  if (capacity_ > 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, capacity_) != cudaSuccess)
      throw_out_of_gpu_memory(name_, capacity_, advice_.empty() ? "another process holds it?"
                                                                : advice_);
    base_ = static_cast<char*>(p);
  }
}

DeviceArena::~DeviceArena() {
  if (tracker_ && used_) tracker_->sub(int64_t(used_));
  if (base_) cudaFree(base_);  // no throw from a destructor; a failure here is reported nowhere
}

void* DeviceArena::alloc(size_t bytes) {
  const size_t n = round_up(bytes);
  if (used_ + n > capacity_)
    throw UserError(str("device arena '", name_, "' is full: ", used_, " + ", n,
                        " bytes > capacity ", capacity_, advice_.empty() ? "" : " (",
                        advice_, advice_.empty() ? "" : ")"));
  void* p = base_ + used_;
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  if (tracker_) tracker_->add(int64_t(n));
#ifdef MXTRAIN_CUDA_EMU
  // Under mxemu (tests/cuda_emu) each allocation starts as 0xFF bytes, NaN as fp32: code that
  // reads what it did not write (stale bytes on a GPU) fails the CPU comparisons instead. In
  // the stream's order: the work queued before may still write the bytes (a released region).
  MX_CUDA_CHECK("DeviceArena", cudaMemsetAsync(p, 0xFF, n, stream_));
#endif
  return p;
}

void DeviceArena::release(size_t m) {
  MX_ASSERT(m <= used_, "device arena '", name_, "': release(", m, ") above used ", used_);
  if (tracker_) tracker_->sub(int64_t(used_ - m));
  used_ = m;
}

}  // namespace mx
