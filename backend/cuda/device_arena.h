// Device memory arena: one cudaMalloc up front, LIFO sub-allocation, exact peak accounting.
// The device twin of core/arena.h (same mark/release discipline, same MemoryTracker), so the
// plan's memory model can size GPU buffers the way it sizes CPU ones.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/arena.h"

namespace mx {

class DeviceArena {
 public:
  // 256 bytes: cudaMalloc's own alignment, enough for vectorized and TMA-friendly access.
  static constexpr size_t kAlign = 256;

  // Reserves `capacity` bytes of device memory now (UserError "out of GPU memory" if the device
  // has not got them). tracker may be null. `advice` ends both that message and the one of an
  // allocation past the capacity (what sets the size: "MXTRAIN_CUDA_SCRATCH_MB ...").
  DeviceArena(std::string name, size_t capacity, MemoryTracker* tracker, std::string advice = "");
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  void* alloc(size_t bytes);  // UserError naming the arena and the advice when it is full
  // The stream whose work uses the allocations (the backend's): under mxemu each allocation's
  // 0xFF fill is queued on it, so it lands after the work queued before on that stream.
  void set_stream(cudaStream_t s) { stream_ = s; }
  float* alloc_f32(int64_t count) { return static_cast<float*>(alloc(sizeof(float) * count)); }
  template <typename T>
  T* alloc_as(int64_t count) {
    return static_cast<T*>(alloc(sizeof(T) * size_t(count)));
  }

  size_t mark() const { return used_; }
  void release(size_t m);  // frees everything allocated after mark() returned m
  void reset() { release(0); }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

  static size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  std::string name_;
  std::string advice_;
  size_t capacity_;
  MemoryTracker* tracker_;
  cudaStream_t stream_ = nullptr;
  char* base_ = nullptr;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// A failed cudaMalloc of `bytes` for `arena` as the one-line error every device allocation
// gives: the sticky error state cleared, the GPU's free and total memory, then `advice`.
[[noreturn]] void throw_out_of_gpu_memory(const std::string& arena, size_t bytes,
                                          const std::string& advice);

// Scope guard: releases everything the scope allocated from the arena.
class DeviceArenaScope {
 public:
  explicit DeviceArenaScope(DeviceArena& a) : arena_(a), mark_(a.mark()) {}
  ~DeviceArenaScope() { arena_.release(mark_); }
  DeviceArenaScope(const DeviceArenaScope&) = delete;
  DeviceArenaScope& operator=(const DeviceArenaScope&) = delete;

 private:
  DeviceArena& arena_;
  size_t mark_;
};

}  // namespace mx
