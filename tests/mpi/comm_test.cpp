// Every collective of the MPI communicator against exact values computed locally: rank r's
// inputs are known functions of (r, i), so each rank can work out what every collective must
// return without communicating. Values are integers or dyadic fractions small enough that every
// sum is exact in the element type, whatever order MPI reduces in: results compare bit for bit.
//
// Run: mpirun -np 2 (or -np 4 --oversubscribe) build/mpi_comm_test
// Prints `FAIL rank R: ...` lines for mismatches, `comm_test: N checks passed on P ranks` from
// rank 0 when all pass; exit status 0 only if every check passed on every rank.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/groups.h"
#include "parallel/shard.h"

namespace {

mx::Communicator* g_world = nullptr;
int64_t g_checks = 0, g_failures = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  if (g_failures <= 40) std::fprintf(stderr, "FAIL rank %d: %s\n", g_world->rank(), what.c_str());
}

// Elementwise comparison by bits; reports the first mismatch.
template <typename T>
void check_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  if (got.size() != want.size()) {
    check(false, mx::str(what, ": size ", got.size(), " != ", want.size()));
    return;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      check(false, mx::str(what, ": element ", i, " is ", +got[i], ", expected ", +want[i]));
      return;
    }
  }
  check(true, what);
}

// Rank r's i-th all-gather input: unique per (r, i) and exact in fp32 (< 2^24) for i < 2^22.
float f(int r, int64_t i) { return static_cast<float>(r * 4194304LL + i); }

// Rank r's j-th reduce input: small integers and halves (every sum over <= 8 ranks is exact).
float g(int r, int64_t j) { return static_cast<float>((j % 1021) * (r + 1)) - 0.5f * r; }
// A max input whose winner changes with j.
float h(int r, int64_t j) { return static_cast<float>((j * 7 + r * 13) % 17) - 8.0f; }

std::vector<float> gather_input(int r, int64_t count) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = f(r, i);
  return v;
}

std::vector<float> gather_expected(int n, int64_t count) {
  std::vector<float> v(count * n);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < count; ++i) v[q * count + i] = f(q, i);
  return v;
}

void test_rank_and_size(mx::Communicator& c) {
  // Independent of the communicator: what the launcher told this process.
  const char* s = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  check(c.kind() == "mpi", "world kind is mpi, got " + c.kind());
  if (s && r) {
    check(c.size() == std::atoi(s), mx::str("size ", c.size(), " vs OMPI_COMM_WORLD_SIZE ", s));
    check(c.rank() == std::atoi(r), mx::str("rank ", c.rank(), " vs OMPI_COMM_WORLD_RANK ", r));
  }
  check(mx::in_multi_process_job() == (c.size() > 1), "in_multi_process_job");
}

void test_all_gather(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int64_t count : {0, 1, 7, 1000, 100003}) {
    const std::vector<float> send = gather_input(me, count);
    const std::vector<float> want = gather_expected(n, count);
    std::vector<float> recv(count * n, -1.0f);
    c.all_gather(send, recv);
    check_equal(recv, want, mx::str("all_gather f32 count ", count));

    std::fill(recv.begin(), recv.end(), -1.0f);
    mx::CommHandle hd = c.all_gather_async(send, recv);
    hd.wait();
    check(!hd.pending(), "handle not pending after wait");
    check_equal(recv, want, mx::str("all_gather_async f32 count ", count));

    // In place: this rank's shard already sits in its slot of the gather buffer.
    std::fill(recv.begin(), recv.end(), -1.0f);
    std::copy(send.begin(), send.end(), recv.begin() + me * count);
    c.all_gather(recv.data() + me * count, recv.data(), count, mx::CommDtype::kF32);
    check_equal(recv, want, mx::str("all_gather in place count ", count));

    std::fill(recv.begin(), recv.end(), -1.0f);
    std::copy(send.begin(), send.end(), recv.begin() + me * count);
    mx::CommHandle hi =
        c.all_gather_async(recv.data() + me * count, recv.data(), count, mx::CommDtype::kF32);
    while (!hi.test()) {
    }
    check_equal(recv, want, mx::str("all_gather_async in place (test loop) count ", count));
  }
}

void test_bf16_bits(mx::Communicator& c) {
  // Every 16-bit pattern from every rank (rotated by rank): NaNs with payloads, signalling
  // NaNs, infinities, -0, denormals. Any float conversion on the way would change some.
  const int n = c.size(), me = c.rank();
  const int64_t count = 65536;
  auto pattern = [](int r, int64_t i) { return static_cast<uint16_t>((i + r * 12345) & 0xFFFF); };
  std::vector<uint16_t> send(count), want(count * n), recv(count * n, 0x1234);
  for (int64_t i = 0; i < count; ++i) send[i] = pattern(me, i);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < count; ++i) want[q * count + i] = pattern(q, i);
  c.all_gather(send, recv);
  check_equal(recv, want, "all_gather bf16 bit patterns");
  std::fill(recv.begin(), recv.end(), 0x1234);
  c.all_gather_async(send, recv).wait();
  check_equal(recv, want, "all_gather_async bf16 bit patterns");
  for (int root = 0; root < n; ++root) {
    std::vector<uint16_t> b(count, 0xBEEF);
    if (me == root) b = std::vector<uint16_t>(want.begin() + root * count,
                                              want.begin() + (root + 1) * count);
    c.broadcast(b, root);
    check_equal(b, std::vector<uint16_t>(want.begin() + root * count,
                                         want.begin() + (root + 1) * count),
                mx::str("broadcast bf16 from root ", root));
  }
}

void test_reduce_scatter(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int64_t count : {0, 1, 13, 4099, 250001}) {
    std::vector<float> send(count * n), send_max(count * n);
    for (int64_t j = 0; j < count * n; ++j) {
      send[j] = g(me, j);
      send_max[j] = h(me, j);
    }
    std::vector<float> want_sum(count), want_avg(count), want_max(count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t j = me * count + i;
      double s = 0;
      float m = -1e30f;
      for (int q = 0; q < n; ++q) {
        s += g(q, j);
        m = std::max(m, h(q, j));
      }
      want_sum[i] = static_cast<float>(s);
      want_avg[i] = static_cast<float>(s) / static_cast<float>(n);
      want_max[i] = m;
    }
    std::vector<float> recv(count, -1.0f);
    c.reduce_scatter(send, recv, mx::ReduceOp::kSum);
    check_equal(recv, want_sum, mx::str("reduce_scatter sum count ", count));
    c.reduce_scatter(send, recv, mx::ReduceOp::kAvg);
    check_equal(recv, want_avg, mx::str("reduce_scatter avg count ", count));
    c.reduce_scatter(send_max, recv, mx::ReduceOp::kMax);
    check_equal(recv, want_max, mx::str("reduce_scatter max count ", count));
    std::fill(recv.begin(), recv.end(), -1.0f);
    c.reduce_scatter_async(send, recv, mx::ReduceOp::kSum).wait();
    check_equal(recv, want_sum, mx::str("reduce_scatter_async sum count ", count));
    std::fill(recv.begin(), recv.end(), -1.0f);
    mx::CommHandle ha = c.reduce_scatter_async(send, recv, mx::ReduceOp::kAvg);
    while (!ha.test()) {
    }
    check_equal(recv, want_avg, mx::str("reduce_scatter_async avg (test loop) count ", count));
  }
}

void test_all_reduce(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int64_t count = 10007;
  std::vector<float> x(count), want_sum(count), want_avg(count), want_max(count);
  for (int64_t i = 0; i < count; ++i) {
    x[i] = g(me, i);
    double s = 0;
    float m = -1e30f;
    for (int q = 0; q < n; ++q) {
      s += g(q, i);
      m = std::max(m, g(q, i));
    }
    want_sum[i] = static_cast<float>(s);
    want_avg[i] = static_cast<float>(s) / static_cast<float>(n);
    want_max[i] = m;
  }
  std::vector<float> y = x;
  c.all_reduce(std::span<float>(y), mx::ReduceOp::kSum);
  check_equal(y, want_sum, "all_reduce f32 sum (in place)");
  y = x;
  c.all_reduce(std::span<float>(y), mx::ReduceOp::kMax);
  check_equal(y, want_max, "all_reduce f32 max");
  std::vector<float> out(count, -1.0f);
  c.all_reduce(x.data(), out.data(), count, mx::CommDtype::kF32, mx::ReduceOp::kAvg);
  check_equal(out, want_avg, "all_reduce f32 avg (out of place)");
  y = x;
  c.all_reduce_async(std::span<float>(y), mx::ReduceOp::kSum).wait();
  check_equal(y, want_sum, "all_reduce_async f32 sum");
  y = x;
  c.all_reduce_async(std::span<float>(y), mx::ReduceOp::kAvg).wait();
  check_equal(y, want_avg, "all_reduce_async f32 avg");

  // int64 near 2^62: any trip through double would lose the low bits.
  auto iv = [](int r, int64_t i) -> int64_t { return (int64_t{1} << 60) + r * int64_t{1000003} + i * 3; };
  std::vector<int64_t> xi(5), want_isum(5), want_imax(5);
  for (int64_t i = 0; i < 5; ++i) {
    xi[i] = iv(me, i);
    want_isum[i] = 0;
    want_imax[i] = INT64_MIN;
    for (int q = 0; q < n; ++q) {
      want_isum[i] += iv(q, i);
      want_imax[i] = std::max(want_imax[i], iv(q, i));
    }
  }
  std::vector<int64_t> yi = xi;
  c.all_reduce(std::span<int64_t>(yi), mx::ReduceOp::kSum);
  check_equal(yi, want_isum, "all_reduce i64 sum");
  yi = xi;
  c.all_reduce(std::span<int64_t>(yi), mx::ReduceOp::kMax);
  check_equal(yi, want_imax, "all_reduce i64 max");
  check(c.all_reduce(int64_t{me + 1}, mx::ReduceOp::kSum) == int64_t{n} * (n + 1) / 2,
        "all_reduce scalar i64 sum");

  // f64 scalars with bits below fp32 precision: a trip through float would lose them.
  auto dv = [](int r) { return 1048576.0 + (r + 1) * std::ldexp(1.0, -20); };
  double want_dsum = 0, want_dmax = -1e300;
  for (int q = 0; q < n; ++q) {
    want_dsum += dv(q);
    want_dmax = std::max(want_dmax, dv(q));
  }
  check(c.all_reduce(dv(me), mx::ReduceOp::kSum) == want_dsum, "all_reduce f64 sum");
  check(c.all_reduce(dv(me), mx::ReduceOp::kMax) == want_dmax, "all_reduce f64 max");
  check(c.all_reduce(dv(me), mx::ReduceOp::kAvg) == want_dsum / n, "all_reduce f64 avg");
}

void test_broadcast(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int root = 0; root < n; ++root) {
    std::vector<float> b = me == root ? gather_input(root, 3001) : std::vector<float>(3001, -1.0f);
    c.broadcast(std::span<float>(b), root);
    check_equal(b, gather_input(root, 3001), mx::str("broadcast f32 from root ", root));
    std::vector<int64_t> bi = {me == root ? (int64_t{1} << 62) + root : -1};
    c.broadcast(std::span<int64_t>(bi), root);
    check(bi[0] == (int64_t{1} << 62) + root, mx::str("broadcast i64 from root ", root));
  }
}

void test_barrier(mx::Communicator& c) {
  // The last rank arrives 300 ms late: no rank may leave the barrier before it arrives.
  using clock = std::chrono::steady_clock;
  c.barrier();
  if (c.rank() == c.size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = clock::now();
  c.barrier();
  const double waited = std::chrono::duration<double>(clock::now() - t0).count();
  if (c.rank() != c.size() - 1)
    check(waited > 0.2, mx::str("barrier returned after ", waited, " s, before the late rank"));
}

void test_split(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  // Parity groups ordered by descending world rank (key = -rank).
  auto sub = c.split(me % 2, -me);
  std::vector<float> members;  // world ranks of my group, in key order
  for (int w = n - 1; w >= 0; --w)
    if (w % 2 == me % 2) members.push_back(static_cast<float>(w));
  int my_index = 0;
  while (members[my_index] != static_cast<float>(me)) ++my_index;
  check(sub->size() == static_cast<int>(members.size()),
        mx::str("split size ", sub->size(), " expected ", members.size()));
  check(sub->rank() == my_index, mx::str("split rank ", sub->rank(), " expected ", my_index));
  std::vector<float> got(sub->size(), -1.0f);
  const float mine = static_cast<float>(me);
  sub->all_gather(std::span<const float>(&mine, 1), got);
  check_equal(got, members, "all_gather inside a split communicator");
  // A collective on the sub-communicator interleaved with one on the world.
  const int64_t group_sum = sub->all_reduce(int64_t{me}, mx::ReduceOp::kSum);
  int64_t want = 0;
  for (float m : members) want += static_cast<int64_t>(m);
  check(group_sum == want, mx::str("all_reduce inside split: ", group_sum, " expected ", want));
  check(c.all_reduce(int64_t{1}, mx::ReduceOp::kSum) == n, "world all_reduce after split");
}

void test_hybrid(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  for (int s = 1; s <= n; ++s) {
    if (n % s) continue;
    mx::HybridGroups hg = mx::make_hybrid_groups(c, s);
    check(hg.shard->size() == s && hg.shard->rank() == me % s,
          mx::str("hybrid S=", s, ": shard rank ", hg.shard->rank(), "/", hg.shard->size()));
    check(hg.replica->size() == n / s && hg.replica->rank() == me / s,
          mx::str("hybrid S=", s, ": replica rank ", hg.replica->rank(), "/", hg.replica->size()));
    // HSDP gradient: reduce-scatter in the shard group, all-reduce the shard across replicas:
    // shard rank k must end with the sum over *all* world ranks of its slice.
    const int64_t count = 1001;
    std::vector<float> grad(count * s), shard(count);
    for (int64_t j = 0; j < count * s; ++j) grad[j] = g(me, j);
    hg.shard->reduce_scatter(grad, shard, mx::ReduceOp::kSum);
    hg.replica->all_reduce(std::span<float>(shard), mx::ReduceOp::kSum);
    std::vector<float> want(count);
    for (int64_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int q = 0; q < n; ++q) sum += g(q, (me % s) * count + i);
      want[i] = static_cast<float>(sum);
    }
    check_equal(shard, want, mx::str("hybrid S=", s, ": reduce-scatter + replica all-reduce"));
  }
  if (n > 1) {
    bool threw = false;
    try {
      mx::make_hybrid_groups(c, n + 1);
    } catch (const mx::UserError&) {
      threw = true;
    }
    check(threw, "shard_group not dividing the world is a UserError");
  }
}

// An FSDP unit whose size does not divide by the rank count: gather the padded shards, then
// reduce-scatter a padded gradient.
void test_uneven_units(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  auto value = [](int64_t gidx) { return static_cast<float>(gidx % 1000003) + 0.5f; };
  for (int64_t numel : {1, 5, 7, 1000003}) {
    const mx::ShardLayout l = mx::make_shard_layout(numel, n);
    std::vector<float> shard(l.shard_numel, 0.0f);  // padding stays zero
    for (int64_t k = 0; k < l.valid_numel(me); ++k) shard[k] = value(l.shard_begin(me) + k);
    std::vector<float> full(l.padded_numel, -1.0f);
    c.all_gather(shard, full);
    std::vector<float> want(l.padded_numel, 0.0f);
    for (int64_t gi = 0; gi < numel; ++gi) want[gi] = value(gi);
    check_equal(full, want, mx::str("unit of ", numel, " over ", n, ": gathered"));

    // Gradient of the whole unit on every rank (padding zero), reduce-scattered to shards.
    std::vector<float> grad(l.padded_numel, 0.0f);
    for (int64_t gi = 0; gi < numel; ++gi) grad[gi] = static_cast<float>((gi % 13 + 1) * (me + 1));
    std::vector<float> gshard(l.shard_numel, -1.0f), want_shard(l.shard_numel, 0.0f);
    c.reduce_scatter_async(grad, gshard, mx::ReduceOp::kSum).wait();
    for (int64_t k = 0; k < l.valid_numel(me); ++k)
      want_shard[k] = static_cast<float>(((l.shard_begin(me) + k) % 13 + 1) * n * (n + 1) / 2);
    check_equal(gshard, want_shard, mx::str("unit of ", numel, " over ", n, ": grad shard"));
  }
}

// The FSDP pattern: several units, the next unit's gather in flight while this one "computes",
// gradients reduce-scattered while the next backward computes; handles waited out of order.
void test_pipelined_units(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int units = 4;
  const int64_t shard = 50021;
  auto pv = [](int u, int r, int64_t i) { return static_cast<float>(u * 1000000 + r * 100000 + i % 100000); };
  std::vector<std::vector<float>> shards(units, std::vector<float>(shard));
  std::vector<std::vector<float>> full(units, std::vector<float>(shard * n, -1.0f));
  for (int u = 0; u < units; ++u)
    for (int64_t i = 0; i < shard; ++i) shards[u][i] = pv(u, me, i);
  double busy = 0;  // "compute": something the optimiser can't drop
  mx::CommHandle next = c.all_gather_async(shards[0], full[0]);
  for (int u = 0; u < units; ++u) {
    mx::CommHandle current = std::move(next);
    current.wait();
    if (u + 1 < units) next = c.all_gather_async(shards[u + 1], full[u + 1]);
    for (int64_t k = 0; k < 200000; ++k) {
      busy += std::sqrt(static_cast<double>(k + u));
      if (k % 20000 == 0) next.test();  // let MPI progress the prefetch
    }
    bool ok = true;
    for (int q = 0; q < n && ok; ++q)
      for (int64_t i = 0; i < shard; ++i)
        if (full[u][q * shard + i] != pv(u, q, i)) {
          ok = false;
          break;
        }
    check(ok, mx::str("pipelined gather of unit ", u));
  }
  // Backward: reduce-scatter of unit u in flight while unit u-1 "computes"; all kept pending,
  // then waited newest first.
  std::vector<std::vector<float>> grads(units, std::vector<float>(shard * n));
  std::vector<std::vector<float>> gshards(units, std::vector<float>(shard, -1.0f));
  std::vector<mx::CommHandle> pending;
  for (int u = units - 1; u >= 0; --u) {
    for (int64_t j = 0; j < shard * n; ++j) grads[u][j] = g(me, j + u);
    pending.push_back(c.reduce_scatter_async(grads[u], gshards[u], mx::ReduceOp::kSum));
    for (auto& p : pending) p.test();
  }
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) it->wait();
  for (int u = 0; u < units; ++u) {
    std::vector<float> want(shard);
    for (int64_t i = 0; i < shard; ++i) {
      double s = 0;
      for (int q = 0; q < n; ++q) s += g(q, me * shard + i + u);
      want[i] = static_cast<float>(s);
    }
    check_equal(gshards[u], want, mx::str("pipelined reduce-scatter of unit ", u));
  }
  // A handle that goes out of scope unwaited completes in its destructor; move assignment over
  // a pending handle completes the old one first.
  std::vector<float> a(shard * n, -1.0f), b(shard * n, -1.0f);
  {
    mx::CommHandle dropped = c.all_gather_async(shards[1], a);
  }
  check_equal(a, full[1], "handle destroyed unwaited: result delivered");
  mx::CommHandle first = c.all_gather_async(shards[2], a);
  first = c.all_gather_async(shards[3], b);
  check_equal(a, full[2], "handle overwritten by move: old result delivered");
  first.wait();
  check_equal(b, full[3], "handle overwritten by move: new result");
  check(busy > 0, "busy");
}

// A large gather overlapped with computation: correctness, and the times for the record.
void test_overlap(mx::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const int64_t total = 4 << 20;  // 16 MB of fp32 gathered
  const int64_t count = total / n;
  const std::vector<float> send = gather_input(me, count);
  std::vector<float> recv(total, -1.0f);
  using clock = std::chrono::steady_clock;
  auto compute = [](mx::CommHandle* poll) {
    double acc = 0;
    for (int64_t k = 0; k < 3000000; ++k) {
      acc += std::sqrt(static_cast<double>(k));
      if (poll && k % 10000 == 0) poll->test();
    }
    return acc;
  };
  c.barrier();
  auto t0 = clock::now();
  c.all_gather(send, recv);
  const double t_comm = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  double acc = compute(nullptr);
  const double t_compute = std::chrono::duration<double>(clock::now() - t0).count();
  std::fill(recv.begin(), recv.end(), -1.0f);
  c.barrier();
  t0 = clock::now();
  mx::CommHandle hnd = c.all_gather_async(send, recv);
  acc += compute(&hnd);
  hnd.wait();
  const double t_both = std::chrono::duration<double>(clock::now() - t0).count();
  check_equal(recv, gather_expected(n, count), "16 MB all_gather overlapped with compute");
  check(acc > 0, "acc");
  if (me == 0)
    std::printf("overlap: all_gather 16 MB %.1f ms, compute %.1f ms, overlapped %.1f ms\n",
                t_comm * 1e3, t_compute * 1e3, t_both * 1e3);
}

}  // namespace

int main() {
  mx::Communicator& world = mx::world_communicator();
  g_world = &world;
  try {
    test_rank_and_size(world);
    test_all_gather(world);
    test_bf16_bits(world);
    test_reduce_scatter(world);
    test_all_reduce(world);
    test_broadcast(world);
    test_barrier(world);
    test_split(world);
    test_hybrid(world);
    test_uneven_units(world);
    test_pipelined_units(world);
    test_overlap(world);
  } catch (const std::exception& e) {
    mx::abort_all(mx::exit_code_for(e), e.what());
  }
  const int64_t failures = world.all_reduce(g_failures, mx::ReduceOp::kSum);
  const int64_t checks = world.all_reduce(g_checks, mx::ReduceOp::kSum);
  if (world.rank() == 0) {
    if (failures == 0)
      std::printf("comm_test: %lld checks passed on %d ranks\n", static_cast<long long>(checks),
                  world.size());
    else
      std::printf("comm_test: %lld of %lld checks FAILED on %d ranks\n",
                  static_cast<long long>(failures), static_cast<long long>(checks), world.size());
  }
  return failures == 0 ? 0 : 1;
}
