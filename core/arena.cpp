#include "core/arena.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/error.h"

namespace mx {

void MemoryTracker::add(int64_t bytes) {
  current_ += bytes;
  if (current_ > peak_) peak_ = current_;
}

void MemoryTracker::sub(int64_t bytes) { current_ -= bytes; }

Arena::Arena(std::string name, size_t capacity, MemoryTracker* tracker, MemoryResource* memory)
    : name_(std::move(name)), capacity_(round_up(capacity)), tracker_(tracker), memory_(memory) {
  if (capacity_ > 0 && memory_) {
    base_ = static_cast<char*>(memory_->allocate(capacity_, name_));
  } else if (capacity_ > 0) {
    base_ = static_cast<char*>(std::aligned_alloc(kAlign, capacity_));
    if (!base_)
      throw UserError(str("out of host memory: arena '", name_, "' needs ", capacity_, " bytes"));
  }
}

Arena::~Arena() {
  if (tracker_) tracker_->sub(static_cast<int64_t>(used_));
  if (memory_ && base_) memory_->deallocate(base_);
  else std::free(base_);
}

void* Arena::alloc(size_t bytes) {
  size_t size = round_up(bytes);
  if (used_ + size > capacity_)
    throw std::logic_error(str("internal error: arena '", name_, "' overflow: ", used_, " + ",
                               size, " > capacity ", capacity_,
                               " (the memory plan undercounted this arena)"));
  void* p = base_ + used_;
  used_ += size;
  if (used_ > peak_) peak_ = used_;
  if (tracker_) tracker_->add(static_cast<int64_t>(size));
  return p;
}

float* Arena::alloc_f32_zero(int64_t count) {
  float* p = alloc_f32(count);
  if (memory_) memory_->zero(p, sizeof(float) * count);
  else std::memset(p, 0, sizeof(float) * count);
  return p;
}

void Arena::release(size_t m) {
  MX_ASSERT(m <= used_, "arena ", name_, " release past top");
  if (tracker_) tracker_->sub(static_cast<int64_t>(used_ - m));
  used_ = m;
}

}  // namespace mx
