// mxemu's own tests (see emu.h): that it executes CUDA's semantics that the backend's kernels rely
// on, each against a value worked out by hand from CUDA's definitions, and that it refuses
// what a GPU refuses. Translated by translate.py like the backend's sources; ctest runs it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "backend/cuda/device_arena.h"
#include "backend/cuda/nccl_communicator.h"
#include "parallel/single_process_communicator.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

template <class T>
struct Buf {
  T* p = nullptr;
  size_t n;
  explicit Buf(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess); }
  ~Buf() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void put(const std::vector<T>& h) {
    EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
};

__global__ void coords_kernel(int* out) {
  const int t = threadIdx.x + threadIdx.y * blockDim.x;
  const int b = blockIdx.x + blockIdx.y * gridDim.x;
  const int i = b * blockDim.x * blockDim.y + t;
  out[4 * i] = threadIdx.x;
  out[4 * i + 1] = threadIdx.y;
  out[4 * i + 2] = blockIdx.x;
  out[4 * i + 3] = blockIdx.y;
}

TEST(Mxemu, EveryThreadOfEveryBlockRunsWithItsCoordinates) {
  Buf<int> out(4 * 2 * 3 * 5 * 7);
  coords_kernel<<<dim3(2, 3), dim3(5, 7)>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  int i = 0;
  for (int by = 0; by < 3; ++by)
    for (int bx = 0; bx < 2; ++bx)
      for (int ty = 0; ty < 7; ++ty)
        for (int tx = 0; tx < 5; ++tx, ++i) {
          EXPECT_EQ(h[4 * i], tx);
          EXPECT_EQ(h[4 * i + 1], ty);
          EXPECT_EQ(h[4 * i + 2], bx);
          EXPECT_EQ(h[4 * i + 3], by);
        }
}

// Each thread writes shared memory, then after the barrier reads another thread's value: only
// correct if every thread's write happened before any read.
__global__ void reverse_kernel(int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = int(threadIdx.x) * 3;
  __syncthreads();
  out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

TEST(Mxemu, SyncthreadsOrdersSharedMemory) {
  Buf<int> out(256);
  reverse_kernel<<<1, 256>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  for (int t = 0; t < 256; ++t) EXPECT_EQ(h[size_t(t)], (255 - t) * 3);
}

__global__ void shuffle_kernel(int* out) {
  const int lane = threadIdx.x % 32, v = 100 + int(threadIdx.x);
  const int base = 4 * int(threadIdx.x);
  out[base] = __shfl_xor_sync(0xFFFFFFFFu, v, 5);
  out[base + 1] = __shfl_down_sync(0xFFFFFFFFu, v, 3);
  out[base + 2] = __shfl_up_sync(0xFFFFFFFFu, v, 2, 16);
  out[base + 3] = __shfl_sync(0xFFFFFFFFu, v, (lane + 7) % 32);
}

// CUDA's definitions: xor reads lane ^ m; down reads lane + d, or its own value past the warp's
// end; up with width 16 reads lane - d within its 16-lane segment, or its own value before the
// segment's start; idx reads the named lane.
TEST(Mxemu, WarpShufflesReadTheLanesCudaDefines) {
  Buf<int> out(4 * 64);
  shuffle_kernel<<<1, 64>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  for (int t = 0; t < 64; ++t) {
    const int warp0 = t / 32 * 32, lane = t % 32, seg = lane / 16 * 16;
    EXPECT_EQ(h[size_t(4 * t)], 100 + warp0 + (lane ^ 5)) << t;
    EXPECT_EQ(h[size_t(4 * t + 1)], 100 + warp0 + (lane + 3 < 32 ? lane + 3 : lane)) << t;
    EXPECT_EQ(h[size_t(4 * t + 2)], 100 + warp0 + (lane - 2 >= seg ? lane - 2 : lane)) << t;
    EXPECT_EQ(h[size_t(4 * t + 3)], 100 + warp0 + (lane + 7) % 32) << t;
  }
}

// A block sum by warp shuffles and shared memory, the backend's reduction pattern, in blocks
// whose last warp is partial.
__global__ void block_sum_kernel(const float* x, int n, float* out) {
  float v = 0.0f;
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) v += x[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  __shared__ float part[32];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += part[w];
    *out = s;
  }
}

TEST(Mxemu, BlockReductionSumsExactly) {
  const int n = 1000;
  std::vector<float> x(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) x[size_t(i)] = float(i % 17);  // small integers: exact in any order
  double want = 0;
  for (float v : x) want += v;
  Buf<float> dx(static_cast<size_t>(n)), out(1);
  dx.put(x);
  block_sum_kernel<<<1, 128>>>(dx.p, n, out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out.get()[0], float(want));
}

__global__ void early_exit_shuffle_kernel(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, int(threadIdx.x), 1);
}

TEST(Mxemu, ShuffleWithAnExitedLaneInItsMaskFailsTheLaunch) {
  Buf<int> out(32);
  early_exit_shuffle_kernel<<<1, 32>>>(out.p);
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(e)).find("exited"), std::string::npos)
      << cudaGetErrorString(e);
  // Sticky, as a fault in a kernel is on a GPU: every later call fails too.
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  mxemu::clear_sticky_error_for_tests();
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    out[0] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1);
    __syncthreads();
  }
}

TEST(Mxemu, WarpsMayReachTheBlockBarrierAtDifferentTimes) {
  Buf<int> out(1);
  // Warp 0 waits at the barrier while warp 1 still shuffles; warp 1 then arrives: no
  // deadlock. A real one needs a warp primitive that some of its lanes never reach (below).
  divergent_barrier_kernel<<<1, 64>>>(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

__global__ void half_warp_shuffle_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  else out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1);
}

TEST(Mxemu, AShuffleSomeOfItsLanesNeverReachIsADeadlock) {
  Buf<int> out(32);
  half_warp_shuffle_kernel<<<1, 32>>>(out.p);
  const cudaError_t e = cudaGetLastError();
  EXPECT_EQ(e, cudaErrorLaunchFailure);
  EXPECT_NE(std::string(cudaGetErrorString(e)).find("deadlock"), std::string::npos)
      << cudaGetErrorString(e);
  mxemu::clear_sticky_error_for_tests();
}

__global__ void masked_shuffle_kernel(uint32_t* out) {
  // Lanes 0-15 shuffle among themselves; lane 0 reads lane 20, outside the mask: undefined.
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_sync(0x0000FFFFu, 7u, threadIdx.x == 0 ? 20 : int(threadIdx.x) ^ 1);
}

TEST(Mxemu, AShuffleFromALaneOutsideTheMaskReadsNoPlausibleValue) {
  Buf<uint32_t> out(16);
  masked_shuffle_kernel<<<1, 32>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const auto h = out.get();
  EXPECT_EQ(h[0], 0xFFFFFFFFu);
  for (int t = 1; t < 16; ++t) EXPECT_EQ(h[size_t(t)], 7u);
}

TEST(Mxemu, AHostPointerAsAKernelArgumentIsAnIllegalAddress) {
  std::vector<int> host(4 * 32);
  coords_kernel<<<1, 32>>>(host.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_NE(std::string(cudaGetErrorString(cudaErrorIllegalAddress)).find("argument 0"),
            std::string::npos);
  mxemu::clear_sticky_error_for_tests();
  // On a stream that runs late, the fault comes when the kernel runs, after the work queued
  // before it (which completes, as on a GPU).
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  Buf<int> out(4 * 32);
  coords_kernel<<<1, 32, 0, s>>>(out.p);
  coords_kernel<<<1, 32, 0, s>>>(host.data());
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorIllegalAddress);
  mxemu::clear_sticky_error_for_tests();
  EXPECT_EQ(out.get()[4 * 31], 31);  // the first kernel ran: thread 31's x
  cudaStreamDestroy(s);
}

__global__ void shared_first_read_kernel(uint32_t* out) {
  __shared__ uint32_t s[64];
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];  // read before any write: garbage
  __syncthreads();
  s[threadIdx.x] = 0;  // the next block must not see this either
}

TEST(Mxemu, StaticSharedMemoryIsUninitialisedInEveryBlock) {
  Buf<uint32_t> out(3 * 64);
  shared_first_read_kernel<<<3, 64>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (uint32_t v : out.get()) EXPECT_EQ(v, 0xFFFFFFFFu);
}

TEST(Mxemu, MemoryCallsCheckWhereTheirPointersAre) {
  Buf<float> d(4);
  std::vector<float> h(4, 1.0f);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(h.data(), 0, 16), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.p, h.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, 16, cudaMemcpyDefault), cudaSuccess);
  cudaGetLastError();
}

TEST(Mxemu, AnEventIsNotReadyAtItsFirstQuery) {
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaErrorNotReady);  // left as the last error, as the runtime does
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(e), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  cudaEventDestroy(e);
}

__global__ void smem_kernel(float* out) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

TEST(Mxemu, LaunchConfigurationsAreCheckedAgainstCudasLimits) {
  Buf<float> out(1024);
  coords_kernel<<<1, 1025>>>(reinterpret_cast<int*>(out.p));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  coords_kernel<<<dim3(1, 65536), 32>>>(reinterpret_cast<int*>(out.p));
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // Dynamic shared memory above 48 KiB needs the kernel's attribute first.
  smem_kernel<<<1, 32, 64 << 10>>>(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
            cudaSuccess);
  smem_kernel<<<1, 32, 64 << 10>>>(out.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out.get()[0], 1.0f);
  EXPECT_NE(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10),
            cudaSuccess);
  cudaGetLastError();
}

__global__ void read_dynamic_shared_kernel(uint32_t* out) {
  extern __shared__ uint32_t raw[];
  out[threadIdx.x] = raw[threadIdx.x];
}

TEST(Mxemu, NewDeviceMemoryAndSharedMemoryAreNotZeroed) {
  Buf<uint32_t> fresh(16);
  for (uint32_t v : fresh.get()) EXPECT_EQ(v, 0xFFFFFFFFu);
  Buf<uint32_t> out(32);
  read_dynamic_shared_kernel<<<1, 32, 32 * sizeof(uint32_t)>>>(out.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (uint32_t v : out.get()) EXPECT_EQ(v, 0xFFFFFFFFu);
}

TEST(Mxemu, HostDereferenceOfDeviceMemoryFaults) {
  Buf<float> d(4);
  EXPECT_DEATH({ volatile float v = d.p[0]; (void)v; }, "outside any kernel");
  float* host = nullptr;
  EXPECT_EQ(cudaMallocHost(reinterpret_cast<void**>(&host), 16), cudaSuccess);
  host[0] = 1.0f;  // pinned host memory stays host memory
  cudaFreeHost(host);
}

__global__ void write_at_kernel(float* x, int64_t i) { x[i] = 1.0f; }

TEST(Mxemu, KernelAccessPastAnAllocationFaultsNamingTheKernel) {
  Buf<float> d(1000);  // 4000 bytes, placed to end at a 256-byte boundary before the guard page
  write_at_kernel<<<1, 1>>>(d.p, 1023);  // inside the alignment's slack: not detectable
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_DEATH(write_at_kernel<<<1, 1>>>(d.p, 1024),
               "invalid memory access at .* in kernel write_at_kernel, block \\(0, 0, 0\\)");
}

TEST(Mxemu, PointerAttributesTellDeviceFromHost) {
  Buf<float> d(8);
  float h[2];
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, d.p + 7), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  ASSERT_EQ(cudaPointerGetAttributes(&a, h), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
}

}  // namespace

// ---- streams (emu.h, "Streams"; ctest runs the default policy, compute-late) -----------------
__global__ void set_kernel(int* out, int value, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = value;
}
__global__ void add_one_kernel(int* out, const int* in, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + 1;
}
constexpr int kPoison = -1;  // 0xFFFFFFFF, what new device memory holds

// These cases describe compute-late's schedule (under the other policies they are skipped).
bool compute_late() {
  const char* v = std::getenv("MXEMU_STREAMS");
  return !v || !*v || std::string(v) == "compute-late";
}
#define REQUIRE_COMPUTE_LATE() \
  if (!compute_late()) GTEST_SKIP() << "MXEMU_STREAMS is not compute-late"

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

TEST(Mxemu, ANonBlockingStreamRunsWhenTheHostSynchronizesIt) {
  REQUIRE_COMPUTE_LATE();
  Buf<int> x(64);
  Stream a;
  set_kernel<<<1, 64, 0, a.s>>>(x.p, 7, 64);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // cudaMemcpy is ordered after the legacy stream's work only, not a non-blocking stream's:
  // reading without synchronizing finds what was there before.
  EXPECT_EQ(x.get()[0], kPoison);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  for (int v : x.get()) EXPECT_EQ(v, 7);
}

TEST(Mxemu, AStreamWaitingForAnEventSeesTheOtherStreamsWork) {
  REQUIRE_COMPUTE_LATE();
  Buf<int> x(64), y(64), z(64);
  Stream a, b, c;
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  set_kernel<<<1, 64, 0, a.s>>>(x.p, 5, 64);
  ASSERT_EQ(cudaEventRecord(e, a.s), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(b.s, e, 0), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);  // the wait stands (the runtime keeps it too)
  add_one_kernel<<<1, 64, 0, b.s>>>(y.p, x.p, 64);
  set_kernel<<<1, 64, 0, a.s>>>(x.p, 9, 64);  // after the event: b must not see it
  add_one_kernel<<<1, 64, 0, c.s>>>(z.p, x.p, 64);  // no wait at all
  // c reads x before any of a's work has run (a runs only when something needs it): the
  // missing wait shows as the poison plus one.
  ASSERT_EQ(cudaStreamSynchronize(c.s), cudaSuccess);
  for (int v : z.get()) EXPECT_EQ(v, kPoison + 1);
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  for (int v : y.get()) EXPECT_EQ(v, 6);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  for (int v : x.get()) EXPECT_EQ(v, 9);
}

TEST(Mxemu, AsynchronousCopiesReadAndWriteHostMemoryWhenCudaSays) {
  REQUIRE_COMPUTE_LATE();
  Buf<int> d(4);
  Stream a;
  // Pageable memory is staged at the call: changing it afterwards changes nothing.
  std::vector<int> h = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpyAsync(d.p, h.data(), 16, cudaMemcpyHostToDevice, a.s), cudaSuccess);
  h[0] = 100;
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_EQ(d.get()[0], 1);
  // Into pageable memory the call returns with the copy done (and the work before it).
  set_kernel<<<1, 4, 0, a.s>>>(d.p, 8, 4);
  std::vector<int> back(4, 0);
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d.p, 16, cudaMemcpyDeviceToHost, a.s), cudaSuccess);
  EXPECT_EQ(back, std::vector<int>(4, 8));
  // Pinned memory is read when the stream gets to the copy.
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16), cudaSuccess);
  for (int i = 0; i < 4; ++i) pinned[i] = 1;
  ASSERT_EQ(cudaMemcpyAsync(d.p, pinned, 16, cudaMemcpyHostToDevice, a.s), cudaSuccess);
  pinned[0] = 100;
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_EQ(d.get()[0], 100);
  cudaFreeHost(pinned);
}

TEST(Mxemu, EventTimesNeedBothEventsReached) {
  REQUIRE_COMPUTE_LATE();
  Stream a;
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  Buf<int> x(64);
  ASSERT_EQ(cudaEventRecord(e0, a.s), cudaSuccess);
  set_kernel<<<1, 64, 0, a.s>>>(x.p, 1, 64);
  ASSERT_EQ(cudaEventRecord(e1, a.s), cudaSuccess);
  float ms = -1.0f;
  EXPECT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaErrorNotReady);
  cudaGetLastError();
  ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

TEST(Mxemu, MemoryFreedOnAStreamGoesWhenTheStreamGetsThere) {
  REQUIRE_COMPUTE_LATE();
  Stream a;
  int* p = nullptr;
  ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&p), 256, a.s), cudaSuccess);
  set_kernel<<<1, 64, 0, a.s>>>(p, 3, 64);
  ASSERT_EQ(cudaFreeAsync(p, a.s), cudaSuccess);
  EXPECT_TRUE(mxemu::is_device_pointer(p));  // the kernel before the free has not run yet
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  EXPECT_FALSE(mxemu::is_device_pointer(p));
}

TEST(Mxemu, ADeviceArenaPoisonsEachAllocationInItsStreamsOrder) {
  REQUIRE_COMPUTE_LATE();
  Stream a;
  Buf<int> y(64);
  mx::DeviceArena arena("selftest", 4096, nullptr);
  arena.set_stream(a.s);
  const size_t mark = arena.mark();
  int* p = arena.alloc_as<int>(64);
  set_kernel<<<1, 64, 0, a.s>>>(p, 5, 64);  // queued, not run yet
  arena.release(mark);
  int* q = arena.alloc_as<int>(64);  // the same bytes again: poisoned after the write above
  ASSERT_EQ(q, p);
  add_one_kernel<<<1, 64, 0, a.s>>>(y.p, q, 64);
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);
  for (int v : y.get()) EXPECT_EQ(v, kPoison + 1);  // not 6: the old write shows through
}

// A collective's handle polled before it completes: the first query says "not ready", which
// the runtime also leaves as the last error; test() must clear it, or the next launch check
// (cudaGetLastError) reports it as the launch's failure.
TEST(Mxemu, PollingACollectiveLeavesNoErrorForTheNextLaunch) {
  mx::SingleProcessCommunicator bootstrap;
  auto nccl = mx::NcclCommunicator::create(bootstrap, 0);
  Buf<float> x(16);
  x.put(std::vector<float>(16, 2.0f));
  mx::CommHandle h = nccl->all_reduce_async(x.p, x.p, 16, mx::CommDtype::kF32, mx::ReduceOp::kSum);
  EXPECT_FALSE(h.test());
  Buf<int> y(16);
  set_kernel<<<1, 16>>>(y.p, 1, 16);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(h.test());
  h.wait();
  for (float v : x.get()) EXPECT_EQ(v, 2.0f);  // one rank: the sum is the value
}

TEST(Mxemu, EventTimesNeedTimingEventsThatWereRecorded) {
  cudaEvent_t timed, untimed, never;
  ASSERT_EQ(cudaEventCreate(&timed), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&never), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(never), cudaSuccess);  // nothing recorded: nothing to wait for
  ASSERT_EQ(cudaEventRecord(timed), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(untimed), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  float ms = 0;
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, never, timed), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventElapsedTime(&ms, timed, timed), cudaSuccess);
  cudaGetLastError();
  for (cudaEvent_t e : {timed, untimed, never}) cudaEventDestroy(e);
}

// A fault in queued work that no later call checks (a destructor ignoring its synchronization)
// still fails the program: exit code 1 and the fault's message.
TEST(Mxemu, AFaultNothingChecksStillFailsTheProgram) {
  EXPECT_EXIT(
      {
        Stream a;
        Buf<int> out(32);
        half_warp_shuffle_kernel<<<1, 32, 0, a.s>>>(out.p);
        cudaDeviceSynchronize();  // the fault happens; its result is ignored
        std::exit(0);
      },
      ::testing::ExitedWithCode(1), "faulted during the run: .*deadlock");
}

// ---- the race check (MXEMU_RACECHECK=1) -------------------------------------------------------
// Each case runs a kernel whose accesses CUDA's rules order, or do not, and checks the verdict
// and what the message names: the two accesses' threads, blocks and source lines (the lines
// below, taken with __LINE__), and the number of racing byte accesses worked out by hand for
// the forward order the self-test runs in.

struct RaceCheck {
  RaceCheck() { mxemu::set_racecheck_for_tests(true); }
  ~RaceCheck() {
    mxemu::set_racecheck_for_tests(false);
    mxemu::clear_sticky_error_for_tests();
  }
};
// The launch's verdict: empty when it succeeded, else the error message.
std::string verdict() {
  const cudaError_t e = cudaDeviceSynchronize();
  return e == cudaSuccess ? std::string() : std::string(cudaGetErrorString(e));
}
// "file:line (function)", as the message names an access.
std::string at_line(int line, const char* fn) {
  return "tests/cuda_emu/emu_selftest.cu:" + std::to_string(line) + " (" + fn + ")";
}

constexpr int kUnorderedWriteLine = __LINE__ + 3;
__global__ void unordered_shared_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = int(threadIdx.x);
  out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];  // no barrier: reads another's write
}
constexpr int kUnorderedReadLine = kUnorderedWriteLine + 1;

TEST(MxemuRaceCheck, AReadOfAnotherThreadsSharedWriteWithoutABarrierRaces) {
  RaceCheck on;
  Buf<int> out(64);
  unordered_shared_kernel<<<1, 64>>>(out.p);
  const std::string v = verdict();
  // Threads 0 to 31 read bytes nobody wrote yet; thread 32 is the first to write a byte another
  // thread read (thread 31 read s[32]). Threads 32 to 63 each overwrite four bytes read before
  // and read four bytes written before by another thread: 256 racing byte accesses.
  EXPECT_NE(v.find("kernel unordered_shared_kernel: data race on static shared memory (byte 128 "
                   "of 256): thread (32, 0, 0) of block (0, 0, 0): write at " +
                   at_line(kUnorderedWriteLine, "unordered_shared_kernel") +
                   "; thread (31, 0, 0) of the same block between the same two barriers read at " +
                   at_line(kUnorderedReadLine, "unordered_shared_kernel")),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("(256 racing byte accesses in this launch)"), std::string::npos) << v;
}

TEST(MxemuRaceCheck, BarrierOrderedSharedMemoryAndPerBlockSharedArraysDoNotRace) {
  RaceCheck on;
  Buf<int> out(256);
  reverse_kernel<<<1, 256>>>(out.p);
  EXPECT_EQ(verdict(), "");
  // Three blocks use the same static array: each its own shared memory.
  Buf<uint32_t> out2(3 * 64);
  shared_first_read_kernel<<<3, 64>>>(out2.p);
  EXPECT_EQ(verdict(), "");
  const int n = 1000;
  Buf<float> dx{size_t(n)}, sum{1};
  dx.put(std::vector<float>(size_t(n), 1.0f));
  block_sum_kernel<<<1, 128>>>(dx.p, n, sum.p);
  EXPECT_EQ(verdict(), "");
  EXPECT_EQ(sum.get()[0], 1000.0f);
}

constexpr int kNeighbourReadLine = __LINE__ + 5;
__global__ void write_after_read_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = 1;
  __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
  s[threadIdx.x] = 2;  // thread t - 1 may not have read s[t] yet
}
constexpr int kOverwriteLine = kNeighbourReadLine + 1;

TEST(MxemuRaceCheck, OverwritingWhatAnotherThreadStillReadsRaces) {
  RaceCheck on;
  Buf<int> out(64);
  write_after_read_kernel<<<1, 64>>>(out.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("(byte 4 of 256): thread (1, 0, 0) of block (0, 0, 0): write at " +
                   at_line(kOverwriteLine, "write_after_read_kernel") +
                   "; thread (0, 0, 0) of the same block between the same two barriers read at " +
                   at_line(kNeighbourReadLine, "write_after_read_kernel")),
            std::string::npos)
      << v;
  // Threads 1 to 63 overwrite what their neighbour read (4 bytes each); thread 63's s[0] read
  // comes after thread 0's write of it (4 more).
  EXPECT_NE(v.find("(256 racing byte accesses in this launch)"), std::string::npos) << v;
}

__global__ void dynamic_shared_race_kernel(float* out) {
  extern __shared__ float d[];
  d[threadIdx.x] = 1.0f;
  out[threadIdx.x] = d[(threadIdx.x + 1) % blockDim.x];
}

TEST(MxemuRaceCheck, DynamicSharedMemoryIsCheckedToo) {
  RaceCheck on;
  Buf<float> out(32);
  dynamic_shared_race_kernel<<<1, 32, 32 * sizeof(float)>>>(out.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("data race on dynamic shared memory (byte 4 of 128): thread (1, 0, 0)"),
            std::string::npos)
      << v;
}

constexpr int kBlockWriteLine = __LINE__ + 2;
__global__ void one_element_per_block_kernel(int* out, int same) {
  if (threadIdx.x == 0) out[same ? 0 : blockIdx.x] = int(blockIdx.x);
}

TEST(MxemuRaceCheck, TwoBlocksWritingOneElementRaceAndSeparateElementsDoNot) {
  RaceCheck on;
  Buf<int> out(4);
  one_element_per_block_kernel<<<4, 32>>>(out.p, 0);
  EXPECT_EQ(verdict(), "");
  one_element_per_block_kernel<<<4, 32>>>(out.p, 1);
  const std::string v = verdict();
  EXPECT_NE(v.find("data race on device memory (byte 0 of 16): thread (0, 0, 0) of block (1, 0, "
                   "0): write at " +
                   at_line(kBlockWriteLine, "one_element_per_block_kernel") +
                   "; thread (0, 0, 0) of block (0, 0, 0) wrote at " +
                   at_line(kBlockWriteLine, "one_element_per_block_kernel")),
            std::string::npos)
      << v;
  // Blocks 1 to 3 each overwrite the 4 bytes.
  EXPECT_NE(v.find("(12 racing byte accesses in this launch)"), std::string::npos) << v;
}

// Six arrays in turn: more than the regions the check's lookup remembers (four), so each access
// finds its region again, some from the map; only f is written by two blocks.
constexpr int kSixArraysRaceLine = __LINE__ + 5;
__global__ void six_arrays_kernel(int* a, int* b, int* c, int* d, int* e, int* f) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  for (int k = 0; k < 3; ++k) {
    a[i] += 1, b[i] += 2, c[i] += 3, d[i] += 4, e[i] += 5;
    if (k == 1 && threadIdx.x == 0) f[2] = int(blockIdx.x);
    else if (k == 2) f[1] = e[i] + a[i] - b[i] - d[i] + c[i];  // one thread (below)
  }
}

TEST(MxemuRaceCheck, EachAccessIsCheckedInItsOwnArrayWhenKernelsUseMany) {
  RaceCheck on;
  // Twice, each time with new arrays (freed and mapped again between: nothing found before may
  // be taken for them) of sizes all different, so the message's "byte B of N" names the array.
  for (int round = 0; round < 2; ++round) {
    Buf<int> a(64), b(65), c(66), d(67), e(68), f(3);
    for (Buf<int>* x : {&a, &b, &c, &d, &e, &f}) cudaMemset(x->p, 0, x->n * sizeof(int));
    six_arrays_kernel<<<2, 1>>>(a.p, b.p, c.p, d.p, e.p, f.p);
    const std::string v = verdict();
    // Block 1's thread writes f[2] after block 0's did, and f[1] after it: 8 racing bytes.
    EXPECT_NE(v.find("data race on device memory (byte 8 of 12): thread (0, 0, 0) of block (1, 0, "
                     "0): write at " + at_line(kSixArraysRaceLine, "six_arrays_kernel")),
              std::string::npos)
        << round << ": " << v;
    EXPECT_NE(v.find("(8 racing byte accesses in this launch)"), std::string::npos) << v;
    mxemu::clear_sticky_error_for_tests();
    // Without the two blocks' writes into f (one block): no race, and every sum right.
    for (Buf<int>* x : {&a, &b, &c, &d, &e, &f}) cudaMemset(x->p, 0, x->n * sizeof(int));
    six_arrays_kernel<<<1, 1>>>(a.p, b.p, c.p, d.p, e.p, f.p);
    EXPECT_EQ(verdict(), "") << round;
    EXPECT_EQ(a.get()[0] + b.get()[0] + c.get()[0] + d.get()[0] + e.get()[0], 3 * 15);
    EXPECT_EQ(f.get()[1], 15 + 3 - 6 - 12 + 9);
  }
}

__global__ void write_kernel(int* p, int v) { p[threadIdx.x] = v; }
__global__ void read_kernel(const int* p, int* out) {
  out[threadIdx.x] = p[(threadIdx.x + 1) % 32];
}

TEST(MxemuRaceCheck, LaunchesOnAStreamAreOrdered) {
  RaceCheck on;
  Buf<int> a(32), b(32);
  write_kernel<<<2, 32>>>(b.p, 0);  // (two blocks writing the same bytes: a race, reported)
  EXPECT_NE(verdict().find("data race"), std::string::npos);
  mxemu::clear_sticky_error_for_tests();
  write_kernel<<<1, 32>>>(a.p, 7);
  read_kernel<<<1, 32>>>(a.p, b.p);
  write_kernel<<<1, 32>>>(a.p, 8);
  EXPECT_EQ(verdict(), "");
  for (int v : b.get()) EXPECT_EQ(v, 7);
}

__global__ void count_kernel(const unsigned* in, unsigned* count, unsigned* seen) {
  atomicAdd(count, in[0]);  // every block reads in[0]: reads do not race
  if (seen && blockIdx.x == 1 && threadIdx.x == 0) *seen = *count;  // a plain read: races
}

TEST(MxemuRaceCheck, AtomicsDoNotRaceWithEachOtherButAPlainReadOfTheirTargetDoes) {
  RaceCheck on;
  Buf<unsigned> in(1), count(1), seen(1);
  in.put({3});
  count.put({0});
  count_kernel<<<3, 64>>>(in.p, count.p, nullptr);
  EXPECT_EQ(verdict(), "");
  EXPECT_EQ(count.get()[0], 3u * 3 * 64);
  // Block 1's thread 0 reads after its own atomic: the other threads' atomics (block 0's and
  // its own block's) are not ordered before the read.
  count_kernel<<<3, 64>>>(in.p, count.p, seen.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("thread (0, 0, 0) of block (1, 0, 0): read at"), std::string::npos) << v;
  EXPECT_NE(v.find("other threads wrote it atomically, unordered with this access (the last "
                   "atomic: thread (0, 0, 0) of the same block, wrote atomically at"),
            std::string::npos)
      << v;
}

__global__ void all_read_one_writes_kernel(int* g, int* out) {
  const int v = g[0];
  if (threadIdx.x == blockDim.x - 1) g[0] = v + 1;  // the others read g[0] in this interval
  out[threadIdx.x] = v;
}

TEST(MxemuRaceCheck, AWriteAfterOtherThreadsReadsRacesEvenIfItsThreadReadLast) {
  RaceCheck on;
  Buf<int> g(1), out(32);
  g.put({5});
  all_read_one_writes_kernel<<<1, 32>>>(g.p, out.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("thread (31, 0, 0) of block (0, 0, 0): write at"), std::string::npos) << v;
  EXPECT_NE(v.find("other threads of the same block read it between the same two barriers (the "
                   "last: thread (31, 0, 0) of the same block, read at"),
            std::string::npos)
      << v;
}

__global__ void blocks_read_then_one_writes_kernel(int* g, int* out) {
  const int v = g[0];
  __syncthreads();  // orders this block's reads, not the other blocks'
  if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) g[0] = v + 1;
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

TEST(MxemuRaceCheck, AWriteAfterOtherBlocksReadsRacesAcrossABarrier) {
  RaceCheck on;
  Buf<int> g(1), out(64);
  g.put({5});
  blocks_read_then_one_writes_kernel<<<1, 64>>>(g.p, out.p);
  EXPECT_EQ(verdict(), "");  // one block: the barrier orders every read before the write
  blocks_read_then_one_writes_kernel<<<2, 32>>>(g.p, out.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("thread (0, 0, 0) of block (1, 0, 0): write at"), std::string::npos) << v;
  EXPECT_NE(v.find("other blocks of the launch read it (the last read: thread (31, 0, 0) of the "
                   "same block"),
            std::string::npos)
      << v;
}

// The shadow's cells are checked byte by byte when an access's bytes have different histories:
// a word read whole after other threads wrote its bytes separately.
constexpr int kByteWriteLine = __LINE__ + 4;
__global__ void bytes_then_word_kernel(unsigned* out, int barrier) {
  __shared__ unsigned w[1];
  auto* b = reinterpret_cast<unsigned char*>(w);
  if (threadIdx.x < 4) b[threadIdx.x] = static_cast<unsigned char>(threadIdx.x + 1);
  if (barrier) __syncthreads();
  if (threadIdx.x == 4) out[0] = w[0];  // reads the four bytes threads 0 to 3 wrote
}
constexpr int kWordReadLine = kByteWriteLine + 2;

TEST(MxemuRaceCheck, AWordReadOfBytesOtherThreadsWroteRacesInEachByte) {
  RaceCheck on;
  Buf<unsigned> out(1);
  bytes_then_word_kernel<<<1, 32>>>(out.p, 1);
  EXPECT_EQ(verdict(), "");
  EXPECT_EQ(out.get()[0], 0x04030201u);
  bytes_then_word_kernel<<<1, 32>>>(out.p, 0);
  const std::string v = verdict();
  EXPECT_NE(v.find("data race on static shared memory (byte 0 of 4): thread (4, 0, 0) of block "
                   "(0, 0, 0): read at " +
                   at_line(kWordReadLine, "bytes_then_word_kernel") +
                   "; thread (0, 0, 0) of the same block between the same two barriers wrote at " +
                   at_line(kByteWriteLine, "bytes_then_word_kernel")),
            std::string::npos)
      << v;
  EXPECT_NE(v.find("(4 racing byte accesses in this launch)"), std::string::npos) << v;
}

// One thread's byte among bytes nobody touched in the launch: only that byte races.
__global__ void one_byte_then_word_kernel(unsigned* g) {
  if (threadIdx.x == 0) reinterpret_cast<unsigned char*>(g)[2] = 7;
  if (threadIdx.x == 1) g[1] = g[0];
}

TEST(MxemuRaceCheck, OnlyTheBytesAnotherThreadWroteRace) {
  RaceCheck on;
  Buf<unsigned> g(2);
  g.put({0, 0});
  one_byte_then_word_kernel<<<1, 32>>>(g.p);
  const std::string v = verdict();
  EXPECT_NE(v.find("data race on device memory (byte 2 of 8): thread (1, 0, 0)"),
            std::string::npos)
      << v;
  EXPECT_EQ(v.find("racing byte accesses"), std::string::npos) << v;  // one byte: no count
}

__global__ void read_per_block_kernel(const int* p, int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = p[threadIdx.x];
}

// The shadow counts blocks in 20 bits: a launch that would pass the count clears it first. What
// the launches before wrote is ordered before it (no race), and races within it are still found.
TEST(MxemuRaceCheck, ClearingTheBlockCountKeepsLaunchesOrderedAndFindsRaces) {
  RaceCheck on;
  Buf<int> a(32), b(4 * 32);
  write_kernel<<<1, 32>>>(a.p, 7);
  mxemu::race_serials_left_for_tests(2);
  read_per_block_kernel<<<4, 32>>>(a.p, b.p);  // four blocks: the shadow is cleared before them
  EXPECT_EQ(verdict(), "");
  for (int v : b.get()) EXPECT_EQ(v, 7);
  mxemu::race_serials_left_for_tests(2);
  Buf<int> six(6);
  one_element_per_block_kernel<<<6, 32>>>(six.p, 1);
  const std::string v = verdict();
  EXPECT_NE(v.find("data race on device memory (byte 0 of 24): thread (0, 0, 0) of block (1, 0, "
                   "0): write at"),
            std::string::npos)
      << v;
  // Blocks 1 to 5 each overwrite the 4 bytes (serials past 2^20 - 1, were they kept, would
  // wrap to 0, which the shadow reads as no access).
  EXPECT_NE(v.find("(20 racing byte accesses in this launch)"), std::string::npos) << v;
}

__global__ void barriers_kernel(int n) {
  for (int i = 0; i < n; ++i) __syncthreads();
}

TEST(MxemuRaceCheck, ABlockPassingMoreBarriersThanTheShadowCountsFails) {
  RaceCheck on;
  barriers_kernel<<<1, 2>>>(32767);
  EXPECT_EQ(verdict(), "");
  barriers_kernel<<<1, 2>>>(32768);
  const std::string v = verdict();
  EXPECT_NE(v.find("kernel barriers_kernel failed: the race check counts at most 32767 barriers "
                   "a block; block (0, 0, 0) passed more"),
            std::string::npos)
      << v;
}
