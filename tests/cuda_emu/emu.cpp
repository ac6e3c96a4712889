// mxemu's scheduler and runtime (see emu.h).
#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mxemu {
namespace {

// ---- fibers ---------------------------------------------------------------------------------
constexpr size_t kStackBytes = size_t(256) << 10;
constexpr int kMaxThreads = 1024;

enum class Wait { kRun, kSync, kWarp, kDone };

struct Fiber {
  uint3 tid{};
  int index = 0, pos = 0, lane = 0;  // pos: place in the scheduler's pass order
  Wait wait = Wait::kRun;
  unsigned mask = 0;
  uint64_t offer = 0, result = 0;
  int src = 0;
  char* stack = nullptr;  // kStackBytes, lowest page a guard
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
};

std::vector<Fiber> fibers;
Fiber* current = nullptr;
uint3 cur_block{};
dim3 cur_block_dim, cur_grid_dim;
const std::function<void()>* cur_body = nullptr;
// Dynamic shared memory: the launch's bytes at the end of a mapping followed by a page without
// access, so a kernel indexing past what the launch gave it faults.
unsigned char* dyn_smem = nullptr;
size_t dyn_smem_bytes = 0;
char* dyn_map = nullptr;
size_t dyn_map_bytes = 0;
// Static __shared__ arrays met in this launch (translate.py registers each): their bytes, which
// CUDA limits to 48 KiB a block.
std::map<void*, uint64_t> shared_seen;  // array -> block_serial it was last poisoned in
size_t static_shared_bytes = 0;
std::string shared_overflow;
std::string pending_error;  // set by a failed launch, returned by cudaGetLastError
cudaError_t pending_code = cudaSuccess;
// A fault inside a kernel (a deadlock, a bad shuffle, a host pointer as an argument) is sticky,
// as on a GPU: every later call returns it.
cudaError_t sticky_code = cudaSuccess;

#if defined(__x86_64__)
void* sched_sp = nullptr;
#else
ucontext_t sched_ctx;
#endif

}  // namespace
}  // namespace mxemu

#if defined(__x86_64__)
// void mxemu_switch(void** save_sp, void* to_sp): saves the callee-saved registers on this
// stack, stores its pointer, switches to the other stack and restores that one's. The x87 and
// SSE control words are not switched (nothing here changes them).
extern "C" void mxemu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.p2align 4
.globl mxemu_switch
.type mxemu_switch, @function
mxemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size mxemu_switch, .-mxemu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#endif

namespace mxemu {
namespace {

int block_threads = 0;
std::vector<int> pass_order;  // thread indices in the order a pass runs them
uint64_t block_serial = 0;    // counts blocks run, for the shared arrays' poisoning
bool reverse_order() {
  static const bool r = [] {
    const char* v = std::getenv("MXEMU_ORDER");
    return v && std::string(v) == "reverse";
  }();
  return r;
}

// The running fiber stops (it waits or is done): control passes straight to the next fiber of
// the scheduler's pass that can run, or back to the scheduler when there is none (half the
// switches of always going through the scheduler).
void switch_away() {
  Fiber* self = current;
  Fiber* next = nullptr;
  for (int j = self->pos + 1; j < block_threads; ++j)
    if (fibers[size_t(pass_order[size_t(j)])].wait == Wait::kRun) {
      next = &fibers[size_t(pass_order[size_t(j)])];
      break;
    }
#if defined(__x86_64__)
  if (next) {
    current = next;
    mxemu_switch(&self->sp, next->sp);
  } else {
    mxemu_switch(&self->sp, sched_sp);
  }
#else
  if (next) {
    current = next;
    swapcontext(&self->ctx, &next->ctx);
  } else {
    swapcontext(&self->ctx, &sched_ctx);
  }
#endif
}

[[noreturn]] void fiber_main() {
  (*cur_body)();
  current->wait = Wait::kDone;
  switch_away();
  std::abort();  // a finished fiber is never resumed
}

void resume(Fiber& f) {
  current = &f;
#if defined(__x86_64__)
  mxemu_switch(&sched_sp, f.sp);
#else
  swapcontext(&sched_ctx, &f.ctx);
#endif
  current = nullptr;
}

void start(Fiber& f, int index) {
  if (!f.stack) {
    void* m = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mxemu: cannot map a fiber stack");
    mprotect(m, size_t(sysconf(_SC_PAGESIZE)), PROT_NONE);  // overflow faults
    f.stack = static_cast<char*>(m);
  }
  f.wait = Wait::kRun;
#if defined(__x86_64__)
  // The stack as mxemu_switch leaves it: six saved registers, then fiber_main as the return
  // address, above it a dummy return address so that fiber_main starts with rsp = 8 mod 16.
  // Each fiber's stack top a different number of cache lines below its mapping's end: the
  // mappings are kStackBytes apart, so equal offsets would put every fiber's hot frames in the
  // same cache sets.
  const size_t color = size_t(index % 64) * 576;
  auto top = reinterpret_cast<uintptr_t>(f.stack + kStackBytes - color) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;
  *--sp = reinterpret_cast<void*>(&fiber_main);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, reinterpret_cast<void (*)()>(&fiber_main), 0);
#endif
}

std::string where() {
  return "block (" + std::to_string(cur_block.x) + ", " + std::to_string(cur_block.y) + ", " +
         std::to_string(cur_block.z) + ")";
}

// ---- race check (MXEMU_RACECHECK=1) ---------------------------------------------------------
// The backend's translated sources are compiled with GCC's ThreadSanitizer instrumentation
// (-fsanitize=thread: a call before every load and store the compiler cannot prove private) but
// not linked with ThreadSanitizer's runtime: the calls (__tsan_read4 ...) land at the end of this
// file, which checks the accesses kernels make to device and shared memory against CUDA's
// ordering rules, as compute-sanitizer's racecheck does on a GPU:
// - the threads of one block are ordered only by __syncthreads: two accesses to one byte by
//   different threads of a block between the same two barriers, at least one a write, race
//   (shuffles exchange values, not memory; no kernel here uses __syncwarp or fences);
// - different blocks of one launch are not ordered at all: a byte of device memory that one
//   block writes and another reads or writes races;
// - atomics do not race with each other; launches are ordered (a kernel sees the previous one's
//   writes; streams are the scheduler's business, above);
// - shared memory is each block's own: another block's accesses to it never race.
// Every byte of a tracked region has a shadow cell: its last write and its last read (with
// whether other threads of the same interval, or other blocks of the launch, read it too), each
// as (block serial, barrier interval, thread, code address). The first race of a launch fails it
// (sticky, as a GPU's fault), naming both accesses' source lines.
struct Access {
  uint32_t serial = 0;  // the block's serial (blocks run since the shadow's last clearing); 0: none
  uint32_t epoch = 0;   // barriers the block had passed
  uint16_t tid = 0;     // thread index in the block
  uint16_t flags = 0;
  uint32_t site = 0;  // the code address's index in race_site_pcs
};
// kOthersRead: other threads of the block read the byte in the same interval too; kBlocksRead:
// other blocks of the launch did. kOthersAtomic / kBlocksAtomic: atomics of other threads of the
// block in the same interval, or of other blocks of the launch, wrote it too (an atomic write
// stands only for its own thread's earlier atomics: the others stay unordered with what follows).
enum : uint16_t {
  kAtomic = 1,
  kOthersRead = 2,
  kBlocksRead = 4,
  kOthersAtomic = 8,
  kBlocksAtomic = 16
};
// The shadow holds an Access in 64 bits, so a byte of memory costs 16 bytes of shadow (half the
// cache lines and page faults of two plain Accesses; docs/cuda_emu.md has the timings).
// - serial: 20 bits. Only whether an access is in the running launch matters (every earlier one
//   is ordered before it), so a launch that would pass 2^20 - 1 first clears every shadow and
//   starts the count again (race_begin_launch).
// - epoch: 15 bits; a block that passes more barriers stops the run (run_block).
// - tid: 10 bits (1024 threads a block); flags: 5 bits.
// - site: 14 bits, an index into the code addresses seen (race_site_of).
constexpr unsigned kSerialBits = 20, kEpochBits = 15, kTidBits = 10, kFlagBits = 5, kSiteBits = 14;
static_assert(kSerialBits + kEpochBits + kTidBits + kFlagBits + kSiteBits == 64, "64-bit cells");
constexpr uint32_t kMaxSerial = (1u << kSerialBits) - 1, kMaxEpoch = (1u << kEpochBits) - 1,
                   kMaxSites = 1u << kSiteBits;
constexpr unsigned kEpochShift = kSerialBits, kTidShift = kEpochShift + kEpochBits,
                   kFlagShift = kTidShift + kTidBits, kSiteShift = kFlagShift + kFlagBits;
inline uint64_t pack(const Access& a) {
  return uint64_t(a.serial) | uint64_t(a.epoch) << kEpochShift | uint64_t(a.tid) << kTidShift |
         uint64_t(a.flags) << kFlagShift | uint64_t(a.site) << kSiteShift;
}
inline Access unpack(uint64_t v) {
  Access a;
  a.serial = uint32_t(v & kMaxSerial);
  a.epoch = uint32_t(v >> kEpochShift & kMaxEpoch);
  a.tid = uint16_t(v >> kTidShift & ((1u << kTidBits) - 1));
  a.flags = uint16_t(v >> kFlagShift & ((1u << kFlagBits) - 1));
  a.site = uint32_t(v >> kSiteShift);
  return a;
}
struct Cell {
  uint64_t w, r;  // packed Accesses; 0: none
};
static_assert(sizeof(Cell) == 16, "16 bytes of shadow a byte");
struct Region {
  char* begin;
  size_t bytes;
  Cell* shadow;
  size_t shadow_bytes;
  bool shared;  // shared memory (static or dynamic): each block's own
  const char* what;
};
bool race_enabled = env_choice("MXEMU_RACECHECK", {"0", "1"}) == 1;
std::map<char*, Region> race_regions;  // by first byte
// The regions found last (a kernel reads and writes a few arrays in turn: one remembered region
// sent most accesses to the map), most recent first, and a page found in no region (1: none).
constexpr int kRaceHits = 4;
const Region* race_hit[kRaceHits] = {};
uintptr_t race_miss_page = 1;
uint32_t race_serial = 0, race_launch_first = 1, race_epoch = 0;
uint64_t races_seen = 0;
std::string race_report;
char* race_dyn_begin = nullptr;

void race_forget_lookups() {
  for (const Region*& h : race_hit) h = nullptr;
  race_miss_page = 1;
}
void race_add_region(char* begin, size_t bytes, bool shared, const char* what) {
  if (!race_enabled || bytes == 0) return;
  const size_t sb = bytes * sizeof(Cell);
  void* m = mmap(nullptr, sb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("mxemu: cannot map the race check's shadow");
  race_regions[begin] = {begin, bytes, static_cast<Cell*>(m), sb, shared, what};
  race_forget_lookups();
}
void race_remove_region(char* begin) {
  auto it = race_regions.find(begin);
  if (it == race_regions.end()) return;
  munmap(it->second.shadow, it->second.shadow_bytes);
  race_regions.erase(it);
  race_forget_lookups();
}

// A launch of `blocks` blocks begins: its first block's serial. Serials that would not fit the
// shadow's 20 bits clear every shadow first (every access so far is ordered before the launch,
// so the cleared cells lose nothing that can race) and count from 1 again.
// (run_grid refuses a launch of kMaxSerial blocks or more.)
void race_begin_launch(uint64_t blocks) {
  if (race_serial + blocks >= kMaxSerial) {
    for (auto& [begin, r] : race_regions)
      if (madvise(r.shadow, r.shadow_bytes, MADV_DONTNEED) != 0)
        throw std::runtime_error("mxemu: cannot clear the race check's shadow");
    race_serial = 0;
  }
  race_launch_first = race_serial + 1;
}

// Code addresses of accesses, by index (the shadow keeps the index), and the way back.
std::vector<uint32_t> race_site_pcs;
std::unordered_map<uint32_t, uint32_t> race_site_index;
bool race_sites_full = false;
uint32_t race_site_of(uint32_t pc) {
  // Most accesses come from a few hot sites: a direct-mapped cache before the hash map.
  static uint32_t cached_pc[1024], cached_site[1024];
  const uint32_t h = (pc * 2654435761u) >> 22;
  if (cached_pc[h] == pc && pc != 0) return cached_site[h];
  auto it = race_site_index.find(pc);
  if (it == race_site_index.end()) {
    if (race_site_pcs.size() == kMaxSites) {
      race_sites_full = true;  // fails the launch (called from a kernel's thread: no throw)
      return 0;
    }
    it = race_site_index.emplace(pc, uint32_t(race_site_pcs.size())).first;
    race_site_pcs.push_back(pc);
  }
  cached_pc[h] = pc;
  cached_site[h] = it->second;
  return it->second;
}

// `r` to the front of race_hit, whose entries before index k move one down (k: r's place, or
// the last for a region found in the map).
const Region* race_remember(int k, const Region* r) {
  for (; k > 0; --k) race_hit[k] = race_hit[k - 1];
  return race_hit[0] = r;
}

const Region* race_region_of(char* c) {
  for (int k = 0; k < kRaceHits; ++k) {
    const Region* h = race_hit[k];
    if (h && c >= h->begin && c < h->begin + h->bytes) return race_remember(k, h);
  }
  const uintptr_t pg = reinterpret_cast<uintptr_t>(c) >> 12;
  if (pg == race_miss_page) return nullptr;
  auto it = race_regions.upper_bound(c);
  if (it != race_regions.begin()) {
    --it;
    if (c < it->first + it->second.bytes) return race_remember(kRaceHits - 1, &it->second);
  }
  // No region: cache the page unless a region starts or ends inside it.
  bool clear = true;
  auto nx = race_regions.upper_bound(c);
  if (nx != race_regions.end() && (reinterpret_cast<uintptr_t>(nx->first) >> 12) == pg)
    clear = false;
  if (it != race_regions.end() && it->first <= c &&
      (reinterpret_cast<uintptr_t>(it->first + it->second.bytes) >> 12) == pg)
    clear = false;
  if (clear) race_miss_page = pg;
  return nullptr;
}

uintptr_t exe_base() {
  static const uintptr_t base = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&exe_base), &info);
    return reinterpret_cast<uintptr_t>(info.dli_fbase);
  }();
  return base;
}
// "file:line (function)" of a code address in this executable, by addr2line (only when a race
// is reported); the address itself where it cannot say.
std::string source_line(uint32_t pc) {
  char cmd[512], exe[256] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string off = "0x" + [&] {
    char b[32];
    std::snprintf(b, sizeof b, "%x", pc ? pc - 1 : 0);  // the call, not the return address
    return std::string(b);
  }();
  if (n > 0) {
    std::snprintf(cmd, sizeof cmd, "addr2line -C -f -e '%s' %s 2>/dev/null", exe, off.c_str());
    if (FILE* p = popen(cmd, "r")) {
      char fn[4096] = {}, line[4096] = {};
      const bool ok = std::fgets(fn, sizeof fn, p) && std::fgets(line, sizeof line, p);
      pclose(p);
      if (ok) {
        std::string f(fn), l(line);
        while (!f.empty() && f.back() == '\n') f.pop_back();
        while (!l.empty() && l.back() == '\n') l.pop_back();
        // The path from the source tree's top (the sources are under backend/ and tests/).
        size_t top = l.rfind("/backend/");
        if (top == std::string::npos) top = l.rfind("/tests/");
        if (top != std::string::npos) l = l.substr(top + 1);
        const size_t disc = l.find(" (discriminator");
        if (disc != std::string::npos) l.erase(disc);
        // The function's name without its parameter list and anonymous namespaces.
        if (!f.empty() && f.back() == ')') {
          int depth = 0;
          for (size_t k = f.size(); k-- > 0;) {
            depth += f[k] == ')' ? 1 : f[k] == '(' ? -1 : 0;
            if (depth == 0) {
              f.erase(k);
              break;
            }
          }
        }
        for (size_t a; (a = f.find("(anonymous namespace)::")) != std::string::npos;)
          f.erase(a, sizeof "(anonymous namespace)::" - 1);
        if (l.rfind("??", 0) != 0) return l + " (" + f + ")";
      }
    }
  }
  return "code offset " + off + " (addr2line found no line)";
}

std::string block_coords(uint32_t serial) {
  // Blocks of the running launch by serial: the run order maps back to the linear block index.
  const uint64_t blocks = uint64_t(cur_grid_dim.x) * cur_grid_dim.y * cur_grid_dim.z;
  const uint64_t i = serial - race_launch_first;
  const uint64_t k = reverse_order() ? blocks - 1 - i : i;
  const dim3 g = cur_grid_dim;
  return "(" + std::to_string(k % g.x) + ", " + std::to_string(k / g.x % g.y) + ", " +
         std::to_string(k / (uint64_t(g.x) * g.y)) + ")";
}
std::string thread_coords(uint16_t tid) {
  const unsigned t = tid;
  const dim3 b = cur_block_dim;
  return "(" + std::to_string(t % b.x) + ", " + std::to_string(t / b.x % b.y) + ", " +
         std::to_string(t / (b.x * b.y)) + ")";
}

// Why an earlier access races with this one: it is itself concurrent, or it stands for other
// threads of the block (same interval) or other blocks of the launch that read the byte too.
enum class RaceWith { kIt, kOtherThreads, kOtherBlocks, kOtherAtomics };
void race_found(const Region& r, size_t offset, const Access& now, bool now_write,
                const Access& before, bool before_write, RaceWith with) {
  if (races_seen++ > 0) return;
  auto kind = [](const Access& a, bool write) {
    return std::string(a.flags & kAtomic ? "atomic " : "") + (write ? "write" : "read");
  };
  auto who = [&](const Access& a) {
    return "thread " + thread_coords(a.tid) +
           (a.serial == now.serial ? " of the same block" : " of block " + block_coords(a.serial));
  };
  std::string msg = "data race on " + std::string(r.what) + " (byte " + std::to_string(offset) +
                    " of " + std::to_string(r.bytes) + "): thread " + thread_coords(now.tid) +
                    " of block " + block_coords(now.serial) + ": " + kind(now, now_write) + " at " +
                    source_line(race_site_pcs[now.site]) + "; ";
  const std::string done = std::string(before_write ? "wrote" : "read") +
                           (before.flags & kAtomic ? " atomically" : "") + " at " +
                           source_line(race_site_pcs[before.site]);
  switch (with) {
    case RaceWith::kIt:
      msg += who(before) + (before.serial == now.serial ? " between the same two barriers" : "") +
             " " + done;
      break;
    case RaceWith::kOtherThreads:
      msg += "other threads of the same block read it between the same two barriers (the last: " +
             who(before) + ", " + done + ")";
      break;
    case RaceWith::kOtherAtomics:
      msg += "other threads wrote it atomically, unordered with this access (the last atomic: " +
             who(before) + ", " + done + ")";
      break;
    case RaceWith::kOtherBlocks:
      msg += "other blocks of the launch read it (the last read: " + who(before) + ", " + done +
             ")";
      break;
  }
  race_report = msg;
}

// One access of `bytes` bytes at p by the running thread.
void race_access(void* p, size_t bytes, bool write, bool atomic, void* ret) {
  char* c = static_cast<char*>(p);
  const Region* r = race_region_of(c);
  if (!r) return;
  Access now;
  now.serial = race_serial;
  now.epoch = race_epoch;
  now.tid = uint16_t(current->index);
  now.flags = atomic ? kAtomic : 0;
  now.site = race_site_of(uint32_t(reinterpret_cast<uintptr_t>(ret) - exe_base()));
  const size_t off = size_t(c - r->begin);
  const size_t end = std::min(r->bytes, off + bytes);
  // Whether an earlier access is not ordered before this one.
  auto concurrent = [&](const Access& a) {
    if (a.serial == 0) return false;
    if (a.serial == now.serial) return a.epoch == now.epoch && a.tid != now.tid;
    return !r->shared && a.serial >= race_launch_first;
  };
  // The checks for byte i, whose shadow cell is `cell`, and its new cell.
  auto visit = [&](Cell cell, size_t i) {
    // Other threads' atomics before this thread's own last one, still unordered with this
    // access: for device memory, any in this launch; for shared memory, any in this interval.
    const Access wr = unpack(cell.w);
    const bool same_interval_w = wr.serial == now.serial && wr.epoch == now.epoch;
    const bool launch_w = !r->shared && wr.serial >= race_launch_first;
    const uint16_t live_atomics = uint16_t((same_interval_w ? wr.flags & kOthersAtomic : 0) |
                                           (launch_w ? wr.flags & kBlocksAtomic : 0));
    const bool atomics_live = live_atomics != 0;
    if (concurrent(wr) && !(atomic && (wr.flags & kAtomic))) {
      race_found(*r, i, now, write, wr, true, RaceWith::kIt);
    } else if (atomics_live && !atomic) {
      race_found(*r, i, now, write, wr, true, RaceWith::kOtherAtomics);
    } else if (write && cell.r != 0) {
      const Access rd = unpack(cell.r);
      const bool same_interval = rd.serial == now.serial && rd.epoch == now.epoch;
      if (concurrent(rd))
        race_found(*r, i, now, write, rd, false, RaceWith::kIt);
      else if (same_interval && (rd.flags & kOthersRead))
        race_found(*r, i, now, write, rd, false, RaceWith::kOtherThreads);
      else if (!r->shared && (rd.flags & kBlocksRead) && rd.serial >= race_launch_first)
        race_found(*r, i, now, write, rd, false, RaceWith::kOtherBlocks);
    }
    if (write) {
      Access nw = now;
      if (atomic && (wr.flags & kAtomic)) {
        nw.flags |= live_atomics;
        if (concurrent(wr)) nw.flags |= wr.serial == now.serial ? kOthersAtomic : kBlocksAtomic;
      }
      cell.w = pack(nw);
      cell.r = 0;
    } else {
      Access rd = now;
      const Access old = unpack(cell.r);
      if (old.serial != 0) {
        if (old.serial == now.serial && old.epoch == now.epoch) {
          rd.flags |= old.flags & (kOthersRead | kBlocksRead);
          if (old.tid != now.tid) rd.flags |= kOthersRead;
        } else if (!r->shared && old.serial >= race_launch_first) {
          rd.flags |= old.serial != now.serial ? kBlocksRead : (old.flags & kBlocksRead);
        }
      }
      cell.r = pack(rd);
    }
    return cell;
  };
  // Most accesses find the same cell in each of their bytes (a value that one thread wrote and
  // others read): then each byte gets the same verdict and the same new cell as the first.
  const size_t n = end - off;
  Cell* const cells = r->shadow + off;
  bool alike = n > 1;
  for (size_t i = 1; alike && i < n; ++i)
    alike = cells[i].w == cells[0].w && cells[i].r == cells[0].r;
  if (alike) {
    const uint64_t seen = races_seen;
    const Cell c = visit(cells[0], off);
    races_seen += (races_seen - seen) * (n - 1);  // a race in each byte, as the loop counts them
    for (size_t i = 0; i < n; ++i) cells[i] = c;
    return;
  }
  for (size_t i = 0; i < n; ++i) cells[i] = visit(cells[i], off + i);
}

// Runs one block to completion: every live fiber runs until it waits; then the warps whose
// mask lanes all wait at a warp primitive exchange, or, with nothing else waiting, the block
// passes its barrier. Anything else is a deadlock on a GPU.
void run_block(int n) {
  block_threads = n;
  ++block_serial;
  ++race_serial;
  race_epoch = 0;
  pass_order.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    pass_order[size_t(i)] = reverse_order() ? n - 1 - i : i;
    fibers[size_t(pass_order[size_t(i)])].pos = i;
  }
  for (int i = 0; i < n; ++i) start(fibers[size_t(i)], i);
  const int warps = (n + 31) / 32;
  for (;;) {
    for (int i = 0; i < n; ++i) {
      Fiber& f = fibers[size_t(pass_order[size_t(i)])];
      if (f.wait == Wait::kRun) resume(f);
    }
    bool released = false;
    for (int w = 0; w < warps; ++w) {
      const int first = w * 32, lanes = std::min(32, n - first);
      Fiber* f = &fibers[size_t(first)];
      unsigned mask = 0;
      bool any = false;
      for (int l = 0; l < lanes; ++l)
        if (f[l].wait == Wait::kWarp) {
          if (any && f[l].mask != mask)
            throw std::runtime_error("warp primitive with different masks in one warp, " + where());
          mask = f[l].mask;
          any = true;
        }
      if (!any) continue;
      bool ready = true;
      for (int l = 0; l < 32; ++l) {
        if (!(mask >> l & 1u)) continue;
        if (l >= lanes || f[l].wait == Wait::kDone)
          throw std::runtime_error("warp primitive's mask names lane " + std::to_string(l) +
                                   " of warp " + std::to_string(w) +
                                   ", which has exited or does not exist, " + where());
        if (f[l].wait != Wait::kWarp) ready = false;
      }
      if (!ready) continue;
      for (int l = 0; l < lanes; ++l) {
        if (f[l].wait != Wait::kWarp) continue;
        const int s = f[l].src;
        // A source lane outside the mask is undefined in CUDA: all ones here (NaN as a float),
        // never a plausible value. Outside the warp (shuffles past its ends) CUDA returns the
        // lane's own value; the callers map those to `l` already.
        f[l].result = (s >= 0 && s < 32) ? ((mask >> s & 1u) ? f[s].offer : ~uint64_t(0)) : f[l].offer;
      }
      for (int l = 0; l < lanes; ++l)
        if (f[l].wait == Wait::kWarp) f[l].wait = Wait::kRun;
      released = true;
    }
    if (released) continue;
    int done = 0, sync = 0;
    for (int i = 0; i < n; ++i) {
      done += fibers[size_t(i)].wait == Wait::kDone;
      sync += fibers[size_t(i)].wait == Wait::kSync;
    }
    if (done == n) return;
    if (done + sync == n) {
      // The block passes a barrier.
      if (race_enabled && ++race_epoch > kMaxEpoch)
        throw std::runtime_error("the race check counts at most " + std::to_string(kMaxEpoch) +
                                 " barriers a block; " + where() + " passed more");
      for (int i = 0; i < n; ++i)
        if (fibers[size_t(i)].wait == Wait::kSync) fibers[size_t(i)].wait = Wait::kRun;
      continue;
    }
    throw std::runtime_error("deadlock: " + std::to_string(sync) + " threads at __syncthreads, " +
                             std::to_string(n - done - sync) +
                             " at a warp primitive whose lanes do not all arrive, " + where());
  }
}

// ---- device memory --------------------------------------------------------------------------
// Every allocation is its own mapping, without access except while a kernel or a memory call
// runs (so a host dereference of a device pointer faults, as on a GPU).
// The allocation sits at the end of its pages (its start 256-byte aligned, as cudaMalloc's),
// and a page without access follows it: a kernel reading or writing more than the alignment's
// slack past an allocation's end faults (an allocation's own bytes are keyed by its start).
struct Mapping {
  size_t bytes;
  char* base;         // the mapping: data pages, then the guard page
  size_t data_bytes;  // the data pages
};
std::map<char*, Mapping> mappings;
size_t mapped_bytes = 0;

size_t page() { return size_t(sysconf(_SC_PAGESIZE)); }
size_t rounded(size_t b) { return (std::max<size_t>(b, 1) + page() - 1) / page() * page(); }

int access_depth = 0;
// Where the CPU and kernel have memory protection keys, every device mapping carries one key
// and access is switched for all of them by one unprivileged register write (pkey_set): what
// the emulator does around every launch and copy. Elsewhere each mapping is mprotect'ed.
int device_key() {
  static const int key = pkey_alloc(0, 0);  // -1: no protection keys here
  return key;
}
void protect_all(int prot) {
  if (device_key() >= 0) {
    pkey_set(device_key(), prot == PROT_NONE ? PKEY_DISABLE_ACCESS : 0);
    return;
  }
  for (auto& [p, m] : mappings) mprotect(m.base, m.data_bytes, prot);
}

const char* env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

size_t device_bytes() { return size_t(std::atoll(env("MXEMU_DEVICE_MB", "8192"))) << 20; }
int sm() { return std::atoi(env("MXEMU_SM", "90")); }

std::map<const void*, int> max_dynamic_shared;
constexpr int kDefaultSmem = 48 << 10, kOptinSmem = 232448;  // H100 / H200: 227 KiB

const char* cur_kernel = "";
const char* cur_queued = nullptr;  // the queued operation running outside a kernel, if any

// A fault says where it happened: in which kernel, block and thread, or in host code reading
// device memory; then the process dies of it as before.
void on_fault(int sig, siginfo_t* info, void*) {
  char msg[512];
  int len;
  if (current) {
    len = std::snprintf(msg, sizeof msg,
                        "mxemu: invalid memory access at %p in kernel %s, block (%u, %u, %u), "
                        "thread (%u, %u, %u)\n",
                        info->si_addr, cur_kernel, cur_block.x, cur_block.y, cur_block.z,
                        current->tid.x, current->tid.y, current->tid.z);
  } else if (cur_queued) {
    len = std::snprintf(msg, sizeof msg,
                        "mxemu: invalid memory access at %p in %s, queued on a stream (memory "
                        "freed or not yet ordered?)\n",
                        info->si_addr, cur_queued);
  } else {
    len = std::snprintf(msg, sizeof msg,
                        "mxemu: invalid memory access at %p outside any kernel (host code "
                        "dereferencing a device pointer?)\n",
                        info->si_addr);
  }
  if (len > 0) (void)!write(2, msg, size_t(std::min(len, int(sizeof msg) - 1)));
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_fault_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  static std::vector<char> alt(size_t(1) << 16);  // a fiber's stack overflow still reports
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

cudaError_t fail(cudaError_t code, std::string msg) {
  pending_code = code;
  pending_error = std::move(msg);
  return code;
}
std::string sticky_error;
cudaError_t fail_sticky(cudaError_t code, std::string msg) {
  // A fault in queued work surfaces at a later call, as on a GPU; one that nothing checks
  // before the program ends (a destructor's ignored synchronization) still fails the run.
  if (sticky_code == cudaSuccess) {
    sticky_error = msg;
    static const bool at_exit = std::atexit([] {
      if (sticky_code == cudaSuccess) return;  // (the emulator's own tests clear theirs)
      std::fprintf(stderr, "mxemu: the emulated device faulted during the run: %s\n",
                   sticky_error.c_str());
      std::fflush(nullptr);
      std::_Exit(1);
    }) == 0;
    (void)at_exit;
  }
  sticky_code = code;
  return fail(code, std::move(msg));
}

}  // namespace

DeviceAccess::DeviceAccess() {
  if (access_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}
DeviceAccess::~DeviceAccess() {
  if (--access_depth == 0) protect_all(PROT_NONE);
}
int compute_capability() { return sm(); }

bool is_device_pointer(const void* p) {
  auto* c = static_cast<char*>(const_cast<void*>(p));
  auto it = mappings.upper_bound(c);
  if (it == mappings.begin()) return false;
  --it;
  return c <= it->first + it->second.bytes;  // one past the end too (an empty tail's pointer)
}

void fail_launch(const char* name, std::string why) {
  fail_sticky(cudaErrorIllegalAddress, std::string("kernel ") + name + ": " + why);
}

void clear_sticky_error_for_tests() {
  sticky_code = cudaSuccess;
  pending_code = cudaSuccess;
  pending_error.clear();
}

void race_atomic(void* p, size_t bytes, void* ret) {
  if (race_enabled && current) race_access(p, bytes, true, true, ret);
}
void set_racecheck_for_tests(bool on) { race_enabled = on; }
void race_serials_left_for_tests(uint32_t n) { race_serial = kMaxSerial - 1 - n; }
const uint3& thread_idx() { return current->tid; }
const uint3& block_idx() { return cur_block; }
const dim3& block_dim() { return cur_block_dim; }
const dim3& grid_dim() { return cur_grid_dim; }
int lane_id() { return current->lane; }
void* dynamic_shared_memory() { return dyn_smem; }

void block_shared(void* array, size_t bytes) {
  auto [it, first] = shared_seen.emplace(array, 0);
  if (first) {
    if (race_enabled && !race_regions.count(static_cast<char*>(array)))
      race_add_region(static_cast<char*>(array), bytes, true, "static shared memory");
    static_shared_bytes += bytes;
    if (static_shared_bytes > size_t(kDefaultSmem) && shared_overflow.empty())
      shared_overflow = std::to_string(static_shared_bytes) +
                        " bytes of static shared memory (the most is 49152)";
  }
  if (it->second != block_serial) {  // the first thread of this block to get here
    std::memset(array, 0xFF, bytes);
    it->second = block_serial;
  }
}

void syncthreads() {
  current->wait = Wait::kSync;
  switch_away();
}

uint64_t warp_exchange(unsigned mask, uint64_t bits, int src) {
  current->mask = mask;
  current->offer = bits;
  current->src = src;
  current->wait = Wait::kWarp;
  switch_away();
  return current->result;
}

cudaError_t occupancy(int* blocks, int block_size, size_t dynamic_smem) {
  if (!blocks || block_size <= 0 || block_size > 1024 || dynamic_smem > size_t(kOptinSmem))
    return fail(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: block of " +
                                           std::to_string(block_size) + " threads, " +
                                           std::to_string(dynamic_smem) + " bytes of shared memory");
  *blocks = std::max(1, std::min(32, 65536 / (128 * block_size)));
  return cudaSuccess;
}

cudaError_t set_max_dynamic_shared(const void* kernel, int bytes) {
  if (bytes < 0 || bytes > kOptinSmem)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(bytes) +
                                           " bytes of dynamic shared memory (the most is " +
                                           std::to_string(kOptinSmem) + ")");
  max_dynamic_shared[kernel] = bytes;
  return cudaSuccess;
}

bool check_launch(const void* kernel, const char* name, const Config& c) {
  const dim3 g = c.grid, b = c.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  std::string bad;
  if (threads == 0 || g.x == 0 || g.y == 0 || g.z == 0) bad = "an empty grid or block";
  else if (threads > kMaxThreads || b.x > 1024 || b.y > 1024 || b.z > 64)
    bad = "block of " + std::to_string(threads) + " threads (the most is 1024)";
  else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    bad = "grid (" + std::to_string(g.x) + ", " + std::to_string(g.y) + ", " +
          std::to_string(g.z) + ") (y and z at most 65535)";
  if (!bad.empty()) {
    fail(cudaErrorInvalidConfiguration, std::string(name) + ": invalid launch configuration: " + bad);
    return false;
  }
  auto it = max_dynamic_shared.find(kernel);
  const size_t smem_limit = it != max_dynamic_shared.end() ? size_t(it->second) : kDefaultSmem;
  if (c.smem > smem_limit) {
    fail(cudaErrorInvalidValue, std::string(name) + ": launch with " + std::to_string(c.smem) +
                                    " bytes of dynamic shared memory; the kernel allows " +
                                    std::to_string(smem_limit) + " (cudaFuncSetAttribute)");
    return false;
  }
  return true;
}

void run_grid(const void* kernel, const char* name, const Config& c,
              const std::function<void()>& body) {
  if (current) throw std::runtime_error("mxemu: a kernel launched from a kernel");
  if (sticky_code != cudaSuccess) return;  // the context is dead, as on a GPU
  install_fault_handler();
  cur_kernel = name;
  const dim3 g = c.grid, b = c.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  if (fibers.size() < threads) fibers.resize(threads);
  for (uint64_t i = 0; i < threads; ++i) {
    Fiber& f = fibers[i];
    f.tid = {unsigned(i % b.x), unsigned(i / b.x % b.y), unsigned(i / (uint64_t(b.x) * b.y))};
    f.index = int(i);
    f.lane = int(i % 32);
  }
  {
    const size_t data = rounded(c.smem + 16);
    if (dyn_map_bytes < data + page()) {
      if (dyn_map) munmap(dyn_map, dyn_map_bytes);
      dyn_map_bytes = data + page();
      dyn_map = static_cast<char*>(mmap(nullptr, dyn_map_bytes, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (dyn_map == MAP_FAILED) throw std::runtime_error("mxemu: cannot map shared memory");
      mprotect(dyn_map + dyn_map_bytes - page(), page(), PROT_NONE);
    }
    dyn_smem_bytes = (c.smem + 15) / 16 * 16;
    dyn_smem = reinterpret_cast<unsigned char*>(dyn_map + dyn_map_bytes - page() - dyn_smem_bytes);
  }
  if (race_enabled) {
    const uint64_t blocks = uint64_t(g.x) * g.y * g.z;
    if (blocks >= kMaxSerial) {
      fail_sticky(cudaErrorLaunchFailure, std::string("kernel ") + name +
                                              ": the race check counts at most " +
                                              std::to_string(kMaxSerial - 1) +
                                              " blocks a launch; this one has " +
                                              std::to_string(blocks));
      return;
    }
    race_begin_launch(blocks);
    races_seen = 0;
    race_report.clear();
    auto* begin = reinterpret_cast<char*>(dyn_smem);
    auto it = race_regions.find(race_dyn_begin);
    if (begin != race_dyn_begin || it == race_regions.end() || it->second.bytes != dyn_smem_bytes) {
      race_remove_region(race_dyn_begin);
      race_add_region(begin, dyn_smem_bytes, true, "dynamic shared memory");
      race_dyn_begin = begin;
    }
  }
  shared_seen.clear();
  static_shared_bytes = 0;
  shared_overflow.clear();
  cur_block_dim = b;
  cur_grid_dim = g;
  cur_body = &body;
  DeviceAccess access;
  try {
    const uint64_t blocks = uint64_t(g.x) * g.y * g.z;
    for (uint64_t i = 0; i < blocks; ++i) {
      const uint64_t k = reverse_order() ? blocks - 1 - i : i;
      cur_block = {unsigned(k % g.x), unsigned(k / g.x % g.y), unsigned(k / (uint64_t(g.x) * g.y))};
      std::memset(dyn_smem, 0xFF, dyn_smem_bytes);
      run_block(int(threads));
    }
  } catch (const std::exception& e) {
    // The fibers of the failed block are abandoned (their stacks are reused by the next launch).
    fail_sticky(cudaErrorLaunchFailure, std::string("kernel ") + name + " failed: " + e.what());
  }
  if (!shared_overflow.empty())
    fail_sticky(cudaErrorLaunchFailure, std::string("kernel ") + name + ": " + shared_overflow);
  if (race_sites_full)
    fail_sticky(cudaErrorLaunchFailure,
                std::string("kernel ") + name + ": the race check tells at most " +
                    std::to_string(kMaxSites) + " code addresses apart; the kernels have more");
  else if (races_seen > 0) {
    std::string count;
    if (races_seen > 1)
      count = " (" + std::to_string(races_seen) + " racing byte accesses in this launch)";
    fail_sticky(cudaErrorLaunchFailure, std::string("kernel ") + name + ": " + race_report + count);
  }
  cur_body = nullptr;
}

// ---- streams ----------------------------------------------------------------------------------
// Every operation queued on a stream (a launch, a copy or set, a cuBLASLt / CUB / NCCL call, an
// event record, a wait for an event) is a closure in that stream's queue. When the queue runs is
// the policy's choice (MXEMU_STREAMS, see emu.h), always within what CUDA allows: in stream
// order, after what the operation waits for, and no later than the host call that needs it
// done (a synchronization, an event query that says done, a copy to pageable host memory).
namespace {

enum class StreamPolicy { kEager, kComputeLate, kCommLate };
StreamPolicy stream_policy() {
  static const StreamPolicy p = [] {
    switch (env_choice("MXEMU_STREAMS", {"eager", "compute-late", "comm-late"})) {
      case 0: return StreamPolicy::kEager;
      case 2: return StreamPolicy::kCommLate;
      default: return StreamPolicy::kComputeLate;  // (unset: the default)
    }
  }();
  return p;
}

struct Queued {
  const char* what;  // for fault messages: the kernel or the call
  std::function<void()> op;
};
struct Stream {
  std::deque<Queued> queue;
  uint64_t queued = 0, done = 0;  // operations queued and run, since creation
  bool blocking = false;          // created without cudaStreamNonBlocking
  bool collective = false;        // NCCL has queued on it
  bool running = false;
};
Stream legacy_stream;  // the null stream: runs at the call, after the blocking streams
// Never freed: a wait queued elsewhere may still name a destroyed stream (it has run by then).
std::vector<std::unique_ptr<Stream>> all_streams;

Stream& stream_of(const void* s) {
  return s ? *static_cast<Stream*>(const_cast<void*>(s)) : legacy_stream;
}

bool runs_late(const Stream& s) {
  if (&s == &legacy_stream) return false;
  switch (stream_policy()) {
    case StreamPolicy::kEager: return false;
    case StreamPolicy::kComputeLate: return !s.collective;
    case StreamPolicy::kCommLate: return s.collective;
  }
  return false;
}

// Runs s's queue through its operation number `upto` (counted from 1 since creation).
void run_until(Stream& s, uint64_t upto) {
  if (s.done >= upto) return;
  // An operation can wait only for operations queued before it, so the waits never form a
  // cycle, and a stream is never needed further while it runs.
  if (s.running) throw std::runtime_error("mxemu: a stream was needed further while it ran");
  struct Running {
    Stream& s;
    explicit Running(Stream& r) : s(r) { s.running = true; }
    ~Running() { s.running = false; }
  } running(s);
  while (s.done < upto && !s.queue.empty()) {
    Queued q = std::move(s.queue.front());
    s.queue.pop_front();
    ++s.done;
    const char* outer = cur_queued;
    cur_queued = q.what;
    q.op();
    cur_queued = outer;
  }
}
void run_stream(Stream& s) { run_until(s, s.queued); }
void run_blocking_streams() {
  for (auto& t : all_streams)
    if (t->blocking) run_stream(*t);
}
void run_all_streams() {
  run_stream(legacy_stream);
  for (auto& t : all_streams) run_stream(*t);
}

void enqueue_on(Stream& s, const char* what, std::function<void()> op) {
  if (&s == &legacy_stream) run_blocking_streams();  // the legacy stream waits for them
  s.queue.push_back({what, std::move(op)});
  ++s.queued;
  if (!runs_late(s)) run_stream(s);
}

}  // namespace

void enqueue(const void* stream, const char* what, std::function<void()> op) {
  enqueue_on(stream_of(stream), what, std::move(op));
}
void mark_collective_stream(const void* stream) { stream_of(stream).collective = true; }
void synchronize_collective_streams() {
  for (auto& t : all_streams)
    if (t->collective) run_stream(*t);
}
bool device_failed() { return sticky_code != cudaSuccess; }

}  // namespace mxemu

using namespace mxemu;

cudaError_t cudaGetLastError() {
  const cudaError_t e = pending_code;
  pending_code = sticky_code;
  return e;
}
cudaError_t cudaPeekAtLastError() { return pending_code; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotReady: return "cudaErrorNotReady";
  }
  return "cudaErrorUnknown";
}
// The detail of the last failure (mxemu's own words) where there is one.
const char* cudaGetErrorString(cudaError_t e) {
  static std::string s;
  s = std::string("mxemu: ") + (pending_error.empty() ? cudaGetErrorName(e) : pending_error);
  return s.c_str();
}

// The emulated node's GPUs (MXEMU_DEVICE_COUNT, default 8, as on the nodes mxtrain is for):
// each process emulates all of them with one memory, but remembers which one it set, so that
// a device index and its PCI bus id say which GPU of the node a rank drives (the NCCL
// communicator refuses two ranks on one GPU, as NCCL does).
namespace {
int emu_device_count() {
  const int n = std::atoi(mxemu::env("MXEMU_DEVICE_COUNT", "8"));
  return n >= 1 ? n : 1;
}
int current_device = 0;
}  // namespace
cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu_device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emu_device_count())
    return fail(cudaErrorInvalidDevice, "device " + std::to_string(device));
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || device >= emu_device_count())
    return fail(cudaErrorInvalidDevice, "device " + std::to_string(device));
  if (len < 13) return fail(cudaErrorInvalidValue, "cudaDeviceGetPCIBusId: buffer too short");
  std::snprintf(bus_id, size_t(len), "0000:%02x:00.0", 0x18 + device);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= emu_device_count())
    return fail(cudaErrorInvalidDevice, "device " + std::to_string(device));
  *prop = {};
  const int s = sm();
  std::snprintf(prop->name, sizeof prop->name, "mxemu sm_%d (CPU emulation)", s);
  prop->major = s / 10;
  prop->minor = s % 10;
  prop->totalGlobalMem = device_bytes();
  prop->sharedMemPerBlock = kDefaultSmem;
  prop->sharedMemPerBlockOptin = kOptinSmem;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = device_bytes();
  *free_bytes = *total_bytes > mapped_bytes ? *total_bytes - mapped_bytes : 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  run_all_streams();
  return sticky_code;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (sticky_code != cudaSuccess) return sticky_code;
  if (mapped_bytes + bytes > device_bytes())
    return fail(cudaErrorMemoryAllocation, "out of memory: " + std::to_string(bytes) +
                                               " bytes asked, " +
                                               std::to_string(device_bytes() - mapped_bytes) + " free");
  install_fault_handler();
  const size_t aligned = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  const size_t n = rounded(aligned);
  void* m = mmap(nullptr, n + page(), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "mmap failed");
  char* base = static_cast<char*>(m);
  char* start = base + n - aligned;
  mprotect(base + n, page(), PROT_NONE);  // the guard page, never accessible
  // Uninitialised, as a GPU's: 0xFF bytes (NaN as fp32). Very large arenas are left as the
  // kernel maps them (zero pages) rather than touching every page.
  if (bytes <= (size_t(256) << 20)) std::memset(start, 0xFF, bytes);
  if (device_key() >= 0) {
    pkey_mprotect(base, n, PROT_READ | PROT_WRITE, device_key());
    if (access_depth == 0) pkey_set(device_key(), PKEY_DISABLE_ACCESS);
  } else if (access_depth == 0) {
    mprotect(base, n, PROT_NONE);
  }
  mappings[start] = {bytes, base, n};
  race_add_region(start, bytes, false, "device memory");
  mapped_bytes += bytes;
  *p = start;
  return cudaSuccess;
}
namespace {
void unmap(std::map<char*, Mapping>::iterator it) {
  race_remove_region(it->first);
  munmap(it->second.base, it->second.data_bytes + page());
  mapped_bytes -= it->second.bytes;
  mappings.erase(it);
}
// cudaMallocHost's allocations: copies from and to them run when their stream gets to them.
std::map<char*, size_t> pinned;
bool is_pinned(const void* p) {
  auto* c = static_cast<char*>(const_cast<void*>(p));
  auto it = pinned.upper_bound(c);
  if (it == pinned.begin()) return false;
  --it;
  return c < it->first + it->second;
}
}  // namespace

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  auto it = mappings.find(static_cast<char*>(p));
  if (it == mappings.end()) return fail(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return");
  run_all_streams();  // cudaFree synchronizes the device
  unmap(it);
  return sticky_code;
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
// The memory goes when the stream gets to the free: work on another stream that still uses it
// without waiting faults.
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  if (mappings.find(static_cast<char*>(p)) == mappings.end())
    return fail(cudaErrorInvalidValue, "cudaFreeAsync of a pointer cudaMalloc did not return");
  enqueue_on(stream_of(s), "cudaFreeAsync", [p] {
    auto it = mappings.find(static_cast<char*>(p));
    if (it != mappings.end()) unmap(it);
  });
  return sticky_code;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = {};
  auto* c = static_cast<char*>(const_cast<void*>(p));
  auto it = mappings.upper_bound(c);
  if (it != mappings.begin()) {
    --it;
    if (c < it->first + std::max<size_t>(it->second.bytes, 1)) {
      a->type = cudaMemoryTypeDevice;
      a->devicePointer = const_cast<void*>(p);
      return cudaSuccess;
    }
  }
  a->type = is_pinned(p) ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->hostPointer = const_cast<void*>(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(std::max<size_t>(bytes, 1));
  if (!*p) return fail(cudaErrorMemoryAllocation, "cudaMallocHost");
  pinned[static_cast<char*>(*p)] = std::max<size_t>(bytes, 1);
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  run_all_streams();  // as cudaFree: no queued copy may still use it
  pinned.erase(static_cast<char*>(p));
  std::free(p);
  return sticky_code;
}

namespace {
// The kind must name where the pointers are (cudaMemcpyDefault: any), as the driver checks.
cudaError_t check_copy(void* dst, const void* src, cudaMemcpyKind kind) {
  const bool dd = is_device_pointer(dst), sd = is_device_pointer(src);
  const bool ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                  (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
                  (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
                  (kind == cudaMemcpyHostToHost && !dd && !sd);
  if (!ok)
    return fail(cudaErrorInvalidValue, "cudaMemcpy kind " + std::to_string(int(kind)) +
                                           " with dst on the " + (dd ? "device" : "host") +
                                           " and src on the " + (sd ? "device" : "host"));
  return cudaSuccess;
}
// A copy as a stream operation. Pageable host memory is read at the call (the runtime stages
// it before returning); device and pinned memory when the stream gets to the copy.
std::function<void()> copy_op(void* dst, const void* src, size_t bytes) {
  if (!is_device_pointer(src) && !is_pinned(src)) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    return [dst, staged] {
      if (sticky_code != cudaSuccess) return;
      DeviceAccess access;
      std::memcpy(dst, staged->data(), staged->size());
    };
  }
  return [dst, src, bytes] {
    if (sticky_code != cudaSuccess) return;
    DeviceAccess access;
    std::memmove(dst, src, bytes);
  };
}
cudaError_t check_set(void* p, size_t bytes) {
  if (!is_device_pointer(p) || !is_device_pointer(static_cast<char*>(p) + bytes))
    return fail(cudaErrorInvalidValue, "cudaMemset of memory that is not the device's");
  return cudaSuccess;
}
std::function<void()> set_op(void* p, int value, size_t bytes) {
  return [p, value, bytes] {
    if (sticky_code != cudaSuccess) return;
    DeviceAccess access;
    std::memset(p, value, bytes);
  };
}

// A copy or set queued on a stream once its pointers are checked. Into pageable host memory
// the call returns once the copy is done.
cudaError_t queue_copy(Stream& stream, const char* what, void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind) {
  if (sticky_code != cudaSuccess) return sticky_code;
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = check_copy(dst, src, kind)) return e;
  enqueue_on(stream, what, copy_op(dst, src, bytes));
  if (!is_device_pointer(dst) && !is_pinned(dst)) run_stream(stream);
  return sticky_code;
}
cudaError_t queue_set(Stream& stream, const char* what, void* p, int value, size_t bytes) {
  if (sticky_code != cudaSuccess) return sticky_code;
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = check_set(p, bytes)) return e;
  enqueue_on(stream, what, set_op(p, value, bytes));
  return sticky_code;
}
}  // namespace

// The synchronous forms run on the legacy stream: after the blocking streams' work, not the
// non-blocking streams' (the backend's streams are non-blocking).
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return queue_copy(legacy_stream, "cudaMemcpy", dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  return queue_copy(stream_of(s), "cudaMemcpyAsync", dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return queue_set(legacy_stream, "cudaMemset", p, value, bytes);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  return queue_set(stream_of(s), "cudaMemsetAsync", p, value, bytes);
}

namespace {
// An event's last record: the stream and its operation number. Shared with the queued record
// operation, which stamps the time when it runs (the event may be destroyed before).
struct EventState {
  bool timing = true;  // created without cudaEventDisableTiming
  Stream* stream = nullptr;  // null: never recorded
  uint64_t upto = 0;
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  bool seen = false;  // queried or synchronized since the last record
};
struct EventObj {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};
EventState& event_of(cudaEvent_t e) { return *reinterpret_cast<EventObj*>(e)->state; }
bool event_done(const EventState& st) { return st.stream->done >= st.upto; }
}  // namespace

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  all_streams.push_back(std::make_unique<Stream>());
  all_streams.back()->blocking = !(flags & cudaStreamNonBlocking);
  *s = reinterpret_cast<cudaStream_t>(all_streams.back().get());
  return cudaSuccess;
}
// Work queued before the destroy still completes, later (the queue stays: the stream objects
// are never freed), as the runtime returns at once.
cudaError_t cudaStreamDestroy(cudaStream_t) { return sticky_code; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!s) run_blocking_streams();
  run_stream(stream_of(s));
  return sticky_code;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  const EventState& st = event_of(e);
  if (!st.stream) return sticky_code;  // never recorded: nothing to wait for
  Stream* other = st.stream;
  const uint64_t upto = st.upto;
  enqueue_on(stream_of(s), "cudaStreamWaitEvent", [other, upto] { run_until(*other, upto); });
  return sticky_code;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* ev = new EventObj;
  ev->state->timing = !(flags & cudaEventDisableTiming);
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<EventObj*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::shared_ptr<EventState> st = reinterpret_cast<EventObj*>(e)->state;
  Stream& stream = stream_of(s);
  st->stream = &stream;
  st->upto = stream.queued + 1;
  st->seen = false;
  enqueue_on(stream, "cudaEventRecord", [st] { st->t = std::chrono::steady_clock::now(); });
  return sticky_code;
}
// The first query after a record says "not ready" (and, as the runtime does, leaves that as
// the last error), so the callers' not-ready paths run; the next runs the event's stream up to
// it and says done.
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (sticky_code != cudaSuccess) return sticky_code;
  EventState& st = event_of(e);
  if (!st.stream) return cudaSuccess;  // never recorded: nothing to wait for
  if (!st.seen) {
    st.seen = true;
    pending_code = cudaErrorNotReady;
    pending_error.clear();
    return cudaErrorNotReady;
  }
  run_until(*st.stream, st.upto);
  return sticky_code;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  EventState& st = event_of(e);
  st.seen = true;
  if (st.stream) run_until(*st.stream, st.upto);
  return sticky_code;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  const EventState &a = event_of(start), &b = event_of(end);
  if (!a.timing || !b.timing || !a.stream || !b.stream)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime of an event never recorded or without timing");
  if (!event_done(a) || !event_done(b))
    return fail(cudaErrorNotReady, "cudaEventElapsedTime of an event not yet reached");
  *ms = std::chrono::duration<float, std::milli>(b.t - a.t).count();
  return cudaSuccess;
}

// The calls GCC's -fsanitize=thread puts before loads and stores (see "race check" above).
#define MXEMU_TSAN_SIZED(n)                                                                    \
  extern "C" void __tsan_read##n(void* p) {                                                    \
    if (mxemu::race_enabled && mxemu::current)                                                 \
      mxemu::race_access(p, n, false, false, __builtin_return_address(0));                     \
  }                                                                                            \
  extern "C" void __tsan_write##n(void* p) {                                                   \
    if (mxemu::race_enabled && mxemu::current)                                                 \
      mxemu::race_access(p, n, true, false, __builtin_return_address(0));                      \
  }                                                                                            \
  extern "C" void __tsan_unaligned_read##n(void* p) {                                          \
    if (mxemu::race_enabled && mxemu::current)                                                 \
      mxemu::race_access(p, n, false, false, __builtin_return_address(0));                     \
  }                                                                                            \
  extern "C" void __tsan_unaligned_write##n(void* p) {                                         \
    if (mxemu::race_enabled && mxemu::current)                                                 \
      mxemu::race_access(p, n, true, false, __builtin_return_address(0));                      \
  }
MXEMU_TSAN_SIZED(1)
MXEMU_TSAN_SIZED(2)
MXEMU_TSAN_SIZED(4)
MXEMU_TSAN_SIZED(8)
MXEMU_TSAN_SIZED(16)
#undef MXEMU_TSAN_SIZED
extern "C" void __tsan_read_range(void* p, long n) {
  if (mxemu::race_enabled && mxemu::current)
    mxemu::race_access(p, size_t(n), false, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void* p, long n) {
  if (mxemu::race_enabled && mxemu::current)
    mxemu::race_access(p, size_t(n), true, false, __builtin_return_address(0));
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit(void*) {}
extern "C" void __tsan_vptr_update(void*, void*) {}
extern "C" void __tsan_vptr_read(void*) {}
// Host code in those sources uses atomics (reference counts, flags): ThreadSanitizer's forms of
// them, as the plain atomic operations. Kernels use CUDA's atomics (emu.h), not these.
#define MXEMU_TSAN_ATOMIC(bits, T)                                                             \
  extern "C" T __tsan_atomic##bits##_load(const volatile void* a, int) {                       \
    return __atomic_load_n(static_cast<const volatile T*>(a), __ATOMIC_SEQ_CST);               \
  }                                                                                            \
  extern "C" void __tsan_atomic##bits##_store(volatile void* a, T v, int) {                    \
    __atomic_store_n(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);                        \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_exchange(volatile void* a, T v, int) {                    \
    return __atomic_exchange_n(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);              \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_fetch_add(volatile void* a, T v, int) {                   \
    return __atomic_fetch_add(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);               \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_fetch_sub(volatile void* a, T v, int) {                   \
    return __atomic_fetch_sub(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);               \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_fetch_and(volatile void* a, T v, int) {                   \
    return __atomic_fetch_and(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);               \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_fetch_or(volatile void* a, T v, int) {                    \
    return __atomic_fetch_or(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);                \
  }                                                                                            \
  extern "C" T __tsan_atomic##bits##_fetch_xor(volatile void* a, T v, int) {                   \
    return __atomic_fetch_xor(static_cast<volatile T*>(a), v, __ATOMIC_SEQ_CST);               \
  }                                                                                            \
  extern "C" bool __tsan_atomic##bits##_compare_exchange_strong(volatile void* a, void* e, T v, \
                                                                int, int) {                    \
    return __atomic_compare_exchange_n(static_cast<volatile T*>(a), static_cast<T*>(e), v,     \
                                       false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
  }                                                                                            \
  extern "C" bool __tsan_atomic##bits##_compare_exchange_weak(volatile void* a, void* e, T v,   \
                                                              int, int) {                      \
    return __atomic_compare_exchange_n(static_cast<volatile T*>(a), static_cast<T*>(e), v,     \
                                       false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
  }
MXEMU_TSAN_ATOMIC(8, uint8_t)
MXEMU_TSAN_ATOMIC(16, uint16_t)
MXEMU_TSAN_ATOMIC(32, uint32_t)
MXEMU_TSAN_ATOMIC(64, uint64_t)
#undef MXEMU_TSAN_ATOMIC
extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

namespace mxemu {
int env_choice(const char* name, std::initializer_list<const char*> values) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  int k = 0;
  for (const char* value : values) {
    if (std::strcmp(v, value) == 0) return k;
    ++k;
  }
  std::string expected;  // "a, b or c"
  const int n = int(values.size());
  k = 0;
  for (const char* value : values) {
    if (k > 0) expected += k == n - 1 ? " or " : ", ";
    expected += value;
    ++k;
  }
  std::fprintf(stderr, "error: %s=%s: expected %s\n", name, v, expected.c_str());
  std::exit(2);
}
}  // namespace mxemu
