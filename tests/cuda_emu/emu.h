// mxemu: runs the backend's own CUDA kernels on the CPU, so that CI (which has no GPU) executes
// them against the CPU twins instead of only compiling them.
//
// What it is: the CUDA C++ the kernels are written in, compiled by g++ after a source rewrite
// (translate.py: `k<<<grid, block, smem, stream>>>(args)` becomes a call of mxemu::launch, and
// `extern __shared__ T name[]` a pointer to the launch's dynamic shared memory), against this
// header instead of the CUDA toolkit's. Every thread of a block is a fiber with its own stack;
// the blocks of a grid run one after another. A thread runs until it reaches __syncthreads or a
// warp primitive (__shfl*_sync, __syncwarp) and waits there until every thread that must arrive
// has: the whole block for __syncthreads, the lanes of the mask for a warp primitive. So the
// kernels' index arithmetic, loop bounds, shared-memory tiles, reductions, shuffles and
// barriers all execute, and what they write can be compared with the CPU backend.
//
// What it checks beyond the results:
// - launch configurations against CUDA's limits (block size <= 1024, grid.y / grid.z <= 65535,
//   dynamic shared memory above 48 KiB only after cudaFuncSetAttribute, at most 227 KiB);
// - barriers: threads of one block waiting at different barriers (some at __syncthreads, some
//   at a warp primitive that cannot complete), or a shuffle whose mask names a lane that has
//   exited, is a hang or undefined on a GPU and a failed launch here (threads that have exited
//   count as arrived at __syncthreads, as on current GPUs);
// - device memory (cudaMalloc) is inaccessible outside kernels and the emulator's own calls
//   (a memory protection key where the CPU has them, else mprotect), so host code that
//   dereferences a device pointer faults here as it would with a real GPU; new
//   allocations and each block's dynamic shared memory are filled with 0xFF (NaN as fp32), as
//   a GPU leaves them uninitialised;
// - races (MXEMU_RACECHECK=1, emu.cpp's "race check"): kernel accesses to device and shared
//   memory that CUDA leaves unordered (two threads of a block between the same two barriers,
//   two blocks of a launch), at least one a write, fail the launch naming both source lines,
//   whatever order the fibers run in.
//
// What it cannot check: timing, occupancy; races between kernels of different streams; the
// GPU's own arithmetic (fast-math intrinsics and FMA contraction differ in the last bits: the
// op check's tolerances cover both).
//
// Streams: every operation queued on a stream (launch, copy, set, cuBLASLt, CUB, NCCL, event
// record, event wait) joins that stream's queue, and the queues run as late or as early as
// CUDA allows, by MXEMU_STREAMS:
// - compute-late (the default): streams NCCL has never queued on run only when something needs
//   them: a host synchronization (stream, event, device, cudaFree), an event query that says
//   done, a copy into pageable host memory, another stream's wait for one of their events.
//   Streams that carry collectives run at the call, after what they wait for. So a collective
//   reads its input and overwrites its output as early as the program's waits allow, the
//   compute stream reads as late as they allow: a missing wait before a collective, a buffer a
//   collective overwrites while compute still needs it, or a host read of a result without a
//   synchronization, gives wrong values here.
// - comm-late: the other way round: compute runs at the call, collective streams when
//   something needs them. A kernel reading a collective's output without waiting for it, or
//   overwriting its input too early, gives wrong values.
// - eager: everything at the call, in the program's order.
// The legacy (null) stream runs at the call, after the blocking streams (cudaStreamCreate's).
// Pageable host memory is read when an asynchronous copy is called (the runtime stages it)
// and written before it returns; pinned memory (cudaMallocHost) when the stream gets there.
// Faults in queued work become sticky when it runs, as a GPU reports them at a later call, and
// name the queued call; a fault nothing checks before the program ends still fails it (exit 1).
#pragma once

#include <math.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __noinline__
#define __launch_bounds__(...)
// Blocks run one after another, so a function-local static is exactly one block's shared
// array (left as the previous block wrote it: uninitialised, as on a GPU).
#define __shared__ static
#define __constant__ static

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 {
  unsigned x, y, z;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

namespace mxemu {

// The running thread's coordinates (valid inside a kernel only).
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

void syncthreads();
// A warp exchange: this lane offers `bits`, reads lane `src`'s offer (its own where src is
// outside [0, 32) or not in the mask); waits for every lane of `mask`.
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src);
int lane_id();
void* dynamic_shared_memory();

template <class T>
T* dynamic_shared() {
  return static_cast<T*>(dynamic_shared_memory());
}

// Device memory is readable and writable from the host while one of these lives (the memory
// calls, the kernels, the cuBLASLt and NCCL stand-ins); otherwise it faults. Nests.
struct DeviceAccess {
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};
// The emulated device's compute capability, major * 10 + minor (MXEMU_SM, default 90).
int compute_capability();
// A knob with a fixed set of values (MXEMU_RACECHECK, MXEMU_STREAMS, MXEMU_LT_*): the index of
// environment variable `name`'s value in `values`, -1 when it is unset or empty; any other
// value prints `error: NAME=value: expected a, b or c` and exits with code 2.
int env_choice(const char* name, std::initializer_list<const char*> values);
// Whether p points into (or one past) a cudaMalloc allocation.
bool is_device_pointer(const void* p);
// Fails the launch (sticky, as an illegal address is on a GPU).
void fail_launch(const char* name, std::string why);
// The emulator's own tests provoke sticky errors one after another.
void clear_sticky_error_for_tests();
// The race check (MXEMU_RACECHECK=1, emu.cpp): an atomic access of `bytes` at p from the code
// address `ret`; and the switch, for the emulator's own tests (regions are tracked from the
// allocations made while it is on).
void race_atomic(void* p, size_t bytes, void* ret);
void set_racecheck_for_tests(bool on);
// Moves the race check's block count on so that the next launch finds only `n` serials left
// before it must clear the shadow (the emulator's own tests of that clearing).
void race_serials_left_for_tests(uint32_t n);
// A static __shared__ array's first use in a block (translate.py adds the call after each
// declaration): filled with 0xFF once a block, its bytes counted against the 48 KiB limit.
void block_shared(void* array, size_t bytes);

// A kernel launch: the configuration as written between <<< and >>>.
struct Config {
  dim3 grid, block;
  size_t smem;
  void* stream;
  Config(dim3 g, dim3 b, size_t s = 0, void* st = nullptr) : grid(g), block(b), smem(s), stream(st) {}
  template <class S>
  Config(dim3 g, dim3 b, size_t s, S* st) : Config(g, b, s, static_cast<void*>(st)) {}
};

// Checks a launch's configuration at the call, as the runtime does (false: the error is kept
// for cudaGetLastError, and nothing is queued).
bool check_launch(const void* kernel, const char* name, const Config& c);
// Runs body once per thread of every block.
void run_grid(const void* kernel, const char* name, const Config& c,
              const std::function<void()>& body);
// Queues an operation on a stream (null: the legacy stream); see "Streams" above. `what` names
// it in fault messages (a string literal: the kernel or the call).
void enqueue(const void* stream, const char* what, std::function<void()> op);
// The NCCL stand-in marks the streams it queues collectives on (MXEMU_STREAMS tells them apart),
// and runs them (only them, and what they wait for) when a communicator is destroyed.
void mark_collective_stream(const void* stream);
void synchronize_collective_streams();
// Whether a fault has ended the context (queued operations then do nothing, as on a GPU).
bool device_failed();

// A launch as translate.py writes it: `kernel` calls the kernel with the arguments (a generic
// lambda, so that a kernel template's arguments are deduced as nvcc deduces them); `id` is the
// kernel's address where the source names one (for cudaFuncSetAttribute), else null; `name`
// its name as written.
template <class F>
struct Launch {
  Config config;
  const void* id;
  const char* name;  // as the source names it, for messages
  F kernel;
  template <class... A>
  void operator()(A&&... args) const {
    // CUDA copies the arguments once; every thread's call converts that copy to the
    // parameters' types.
    const std::tuple<std::decay_t<A>...> params(std::forward<A>(args)...);
    // A pointer argument must be device memory: a host pointer is an illegal address on a GPU,
    // met when the kernel runs (the work queued before it still runs first).
    int bad = -1, index = 0;
    auto check = [&](const auto& a) {
      using T = std::decay_t<decltype(a)>;
      if constexpr (std::is_pointer_v<T>) {
        if (a != nullptr && bad < 0 && !is_device_pointer(a)) bad = index;
      }
      ++index;
    };
    std::apply([&](const auto&... a) { (check(a), ...); }, params);
    if (!check_launch(id, name, config)) return;
    if (bad >= 0) {
      enqueue(config.stream, name, [name = name, bad] {
        fail_launch(name, "argument " + std::to_string(bad) + " is not device memory");
      });
      return;
    }
    enqueue(config.stream, name, [id = id, name = name, config = config, kernel = kernel, params] {
      run_grid(id, name, config, [&] { std::apply(kernel, params); });
    });
  }
};
template <class F>
Launch<F> launch(Config c, const void* id, const char* name, F kernel) {
  return {c, id, name, kernel};
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace mxemu

#define threadIdx (::mxemu::thread_idx())
#define blockIdx (::mxemu::block_idx())
#define blockDim (::mxemu::block_dim())
#define gridDim (::mxemu::grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads() { ::mxemu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  ::mxemu::warp_exchange(mask, 0, ::mxemu::lane_id());
}
// Shuffles within segments of `width` lanes, as CUDA defines them.
template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::mxemu::lane_id(), base = lane & ~(width - 1);
  return ::mxemu::from_bits<T>(
      ::mxemu::warp_exchange(mask, ::mxemu::to_bits(v), base + (src & (width - 1))));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::mxemu::lane_id(), base = lane & ~(width - 1);
  int src = lane ^ lane_mask;
  if (src < base || src >= base + width) src = lane;
  return ::mxemu::from_bits<T>(::mxemu::warp_exchange(mask, ::mxemu::to_bits(v), src));
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::mxemu::lane_id(), base = lane & ~(width - 1);
  int src = lane + int(delta);
  if (src >= base + width) src = lane;
  return ::mxemu::from_bits<T>(::mxemu::warp_exchange(mask, ::mxemu::to_bits(v), src));
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::mxemu::lane_id(), base = lane & ~(width - 1);
  int src = lane - int(delta);
  if (src < base) src = lane;
  return ::mxemu::from_bits<T>(::mxemu::warp_exchange(mask, ::mxemu::to_bits(v), src));
}

// Atomics: one thread runs at a time, so plain read-modify-writes are atomic. Each tells the
// race check (emu.cpp) it is atomic; the functions are kept out of line and uninstrumented so
// that the check sees one atomic access at the caller's address, not a plain read and write.
#define MXEMU_ATOMIC __attribute__((noinline, no_sanitize("thread")))
MXEMU_ATOMIC inline unsigned atomicMax(unsigned* p, unsigned v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const unsigned o = *p;
  if (v > o) *p = v;
  return o;
}
MXEMU_ATOMIC inline int atomicMax(int* p, int v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const int o = *p;
  if (v > o) *p = v;
  return o;
}
MXEMU_ATOMIC inline unsigned atomicMin(unsigned* p, unsigned v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const unsigned o = *p;
  if (v < o) *p = v;
  return o;
}
template <class T>
MXEMU_ATOMIC T atomicAdd(T* p, T v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const T o = *p;
  *p = o + v;
  return o;
}
template <class T>
MXEMU_ATOMIC T atomicExch(T* p, T v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const T o = *p;
  *p = v;
  return o;
}
template <class T>
MXEMU_ATOMIC T atomicCAS(T* p, T cmp, T v) {
  ::mxemu::race_atomic(p, sizeof *p, __builtin_return_address(0));
  const T o = *p;
  if (o == cmp) *p = v;
  return o;
}

// Device math that the host library lacks under these names. The fast intrinsics are computed
// exactly here (the GPU's are approximate: within the op check's tolerances).
inline unsigned __float_as_uint(float x) { return ::mxemu::from_bits<unsigned>(::mxemu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::mxemu::from_bits<float>(::mxemu::to_bits(x)); }
inline int __float_as_int(float x) { return ::mxemu::from_bits<int>(::mxemu::to_bits(x)); }
inline float __int_as_float(int x) { return ::mxemu::from_bits<float>(::mxemu::to_bits(x)); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
// CUDA's correctly rounded single operations, which nvcc never fuses into an FMA: each result
// goes through a register the compiler cannot see into, so the host compiler (contracting by
// default under -march=native) cannot fuse it with the next operation either.
inline float mxemu_rounded(float r) {
  asm volatile("" : "+x"(r));
  return r;
}
inline float __fmul_rn(float a, float b) { return mxemu_rounded(a * b); }
inline float __fadd_rn(float a, float b) { return mxemu_rounded(a + b); }
inline float __fsub_rn(float a, float b) { return mxemu_rounded(a - b); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T>
T __ldg(const T* p) {
  return *p;
}
// CUDA's min / max overloads for mixed integer and floating types.
template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(b) : C(a);
}
using std::isfinite;
using std::isinf;
using std::isnan;
