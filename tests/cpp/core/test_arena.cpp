// Arena over a MemoryResource (the way device memory backs the engine's arenas) and the
// make_backend errors of a program without the CUDA backend.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/error.h"

namespace {

// Host memory standing in for a device: records what the arena asks of it.
struct RecordingResource final : mx::MemoryResource {
  std::vector<size_t> allocated;
  std::vector<std::pair<void*, size_t>> zeroed;
  int freed = 0;
  void* allocate(size_t bytes, const std::string&) override {
    allocated.push_back(bytes);
    void* p = std::aligned_alloc(64, bytes);
    std::memset(p, 0xAB, bytes);  // garbage, as fresh device memory may hold
    return p;
  }
  void deallocate(void* p) override {
    ++freed;
    std::free(p);
  }
  void zero(void* p, size_t bytes) override {
    zeroed.push_back({p, bytes});
    std::memset(p, 0, bytes);
  }
};

TEST(Arena, MemoryResourceProvidesZeroesAndFreesTheBytes) {
  RecordingResource res;
  mx::MemoryTracker tracker;
  {
    mx::Arena a("dev", 1000, &tracker, &res);
    ASSERT_EQ(res.allocated.size(), 1u);
    EXPECT_EQ(res.allocated[0], mx::Arena::round_up(1000));
    float* p = a.alloc_f32_zero(10);
    ASSERT_EQ(res.zeroed.size(), 1u);
    EXPECT_EQ(res.zeroed[0].first, static_cast<void*>(p));
    EXPECT_EQ(res.zeroed[0].second, 10 * sizeof(float));
    for (int i = 0; i < 10; ++i) EXPECT_EQ(p[i], 0.0f);
    float* q = a.alloc_f32(3);  // not zeroed: nothing asked of the resource
    EXPECT_EQ(res.zeroed.size(), 1u);
    EXPECT_EQ(reinterpret_cast<char*>(q) - reinterpret_cast<char*>(p), 64);
    EXPECT_EQ(tracker.current(), 128);
    EXPECT_THROW(a.alloc(2000), std::logic_error);
  }
  EXPECT_EQ(res.freed, 1);
  EXPECT_EQ(tracker.current(), 0);
}

TEST(Arena, EmptyArenaAsksNothingOfTheResource) {
  RecordingResource res;
  { mx::Arena a("dev", 0, nullptr, &res); }
  EXPECT_TRUE(res.allocated.empty());
  EXPECT_EQ(res.freed, 0);
}

TEST(Backend, CudaWithoutTheCudaLibraryIsAUserError) {
  // The test program links the engine alone: nothing registered a CUDA factory. A CPU-only
  // build says it has no CUDA backend; a CUDA build looks for its plugin, here in a directory
  // without one, and names the missing file.
  ::setenv("MXTRAIN_CUDA_PLUGIN_DIR", "/nonexistent-mxtrain-plugin-dir", 1);
  try {
    mx::make_backend("cuda");
    ADD_FAILURE() << "make_backend(\"cuda\") returned";
  } catch (const mx::UserError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("built without the CUDA backend") != std::string::npos ||
                what.find("/nonexistent-mxtrain-plugin-dir/libmxcuda.so, is missing") !=
                    std::string::npos)
        << what;
  }
  ::unsetenv("MXTRAIN_CUDA_PLUGIN_DIR");
  EXPECT_THROW(mx::make_backend("tpu"), mx::UserError);
}

TEST(Backend, CpuCopiesAreByteCopies) {
  auto be = mx::make_cpu_backend();
  EXPECT_EQ(be->memory(), nullptr);  // host memory
  const std::vector<float> src = {1.5f, -2.0f, 3.25f};
  std::vector<float> dev(3, 0.0f), back(3, 0.0f);
  be->copy_from_host(dev.data(), src.data(), sizeof(float) * 3);
  be->copy_to_host(back.data(), dev.data(), sizeof(float) * 3);
  EXPECT_EQ(back, src);
}

}  // namespace
