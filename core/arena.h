// Memory arenas with exact peak accounting.
//
// Every buffer the engine uses for a training step comes from an Arena: parameters, gradients and
// optimizer state from arenas allocated once, activations saved for backward from a stack-like
// arena (forward pushes block by block, backward pops), and per-op temporaries from a scratch
// arena. All arenas of a process report to one MemoryTracker, whose peak is the engine's real
// peak memory: the number in the metrics and the number `mxtrain plan` predicts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

namespace mx {

class MemoryTracker {
 public:
  void add(int64_t bytes);
  void sub(int64_t bytes);
  int64_t current() const { return current_; }
  int64_t peak() const { return peak_; }
  void reset_peak() { peak_ = current_; }

 private:
  int64_t current_ = 0;
  int64_t peak_ = 0;
};

// Where an arena's bytes come from when they are not host memory (a backend's device memory:
// backend/backend.h). Host code never dereferences such memory; it goes through the backend's
// copy calls.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // `bytes` of memory for arena `arena` (UserError when the device has not got them).
  virtual void* allocate(size_t bytes, const std::string& arena) = 0;
  virtual void deallocate(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  // Bytes allocated and not yet deallocated (what the resource holds now).
  int64_t held_bytes() const { return held_; }
  // A device's free and total memory now (a GPU's cudaMemGetInfo); false where not known.
  virtual bool device_memory(int64_t* free_bytes, int64_t* total_bytes) const { return false; }

 protected:
  // Implementations report each allocation and deallocation here.
  void count_allocate(void* p, size_t bytes) {
    if (!p) return;
    sizes_[p] = bytes;
    held_ += int64_t(bytes);
  }
  void count_deallocate(void* p) {
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    held_ -= int64_t(it->second);
    sizes_.erase(it);
  }

 private:
  std::unordered_map<void*, size_t> sizes_;
  int64_t held_ = 0;
};

class Arena {
 public:
  static constexpr size_t kAlign = 64;  // cache line; also enough for AVX-512 loads

  // capacity: bytes reserved up front (the OS commits pages only when touched). memory: null
  // for host memory, else where the bytes come from (a device).
  Arena(std::string name, size_t capacity, MemoryTracker* tracker,
        MemoryResource* memory = nullptr);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void* alloc(size_t bytes);  // aligned to kAlign; throws if the capacity is exceeded
  float* alloc_f32(int64_t count) { return static_cast<float*>(alloc(sizeof(float) * count)); }
  // Like alloc_f32, but the memory is zero-filled.
  float* alloc_f32_zero(int64_t count);

  // LIFO release: everything allocated after `mark()` returned `m` is freed.
  size_t mark() const { return used_; }
  void release(size_t m);
  void reset() { release(0); }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return capacity_; }
  const std::string& name() const { return name_; }

  static size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

 private:
  std::string name_;
  size_t capacity_;
  MemoryTracker* tracker_;
  MemoryResource* memory_;
  char* base_ = nullptr;
  size_t used_ = 0;
  size_t peak_ = 0;
};

}  // namespace mx
