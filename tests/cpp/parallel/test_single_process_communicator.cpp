// The size-1 communicator: each collective of one rank, against its definition (for one rank
// the gathered/reduced result is the input itself, bit for bit), and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/groups.h"
#include "parallel/single_process_communicator.h"

namespace {

std::vector<float> awkward_floats() {
  // Values that a reduction done in the wrong type, or a scale by 1/1.0 done as x * 0.999...,
  // would change: not representable in bf16, a denormal, -0, inf, large magnitudes.
  return {1.0f + 1.0f / 4096, -0.0f, 1e-40f, std::numeric_limits<float>::infinity(), 3.0e38f,
          -7.25f, 0.1f};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(SingleProcessCommunicator, RankAndSize) {
  mx::SingleProcessCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.kind(), "single-process");
}

TEST(SingleProcessCommunicator, CollectivesAreIdentity) {
  mx::SingleProcessCommunicator c;
  const std::vector<float> x = awkward_floats();
  std::vector<float> y(x.size(), 99.0f);
  c.all_gather(x, y);
  EXPECT_TRUE(same_bits(x, y));
  for (mx::ReduceOp op : {mx::ReduceOp::kSum, mx::ReduceOp::kAvg, mx::ReduceOp::kMax}) {
    std::fill(y.begin(), y.end(), 99.0f);
    c.reduce_scatter(x, y, op);
    EXPECT_TRUE(same_bits(x, y)) << mx::reduce_op_name(op);
    std::vector<float> z = x;
    c.all_reduce(std::span<float>(z), op);
    EXPECT_TRUE(same_bits(x, z)) << mx::reduce_op_name(op);
  }
  std::vector<uint16_t> bits = {0x0000, 0x8000, 0x7f80, 0xffc1, 0x0001, 0x3f80};
  std::vector<uint16_t> got(bits.size(), 0x1234);
  c.all_gather(bits, got);
  EXPECT_EQ(got, bits);
  EXPECT_EQ(c.all_reduce(int64_t{(1LL << 62) + 3}, mx::ReduceOp::kSum), (1LL << 62) + 3);
  EXPECT_EQ(c.all_reduce(0.1, mx::ReduceOp::kAvg), 0.1);
  std::vector<int64_t> v = {5, -7};
  c.broadcast(std::span<int64_t>(v), 0);
  EXPECT_EQ(v, (std::vector<int64_t>{5, -7}));
  c.barrier();
}

TEST(SingleProcessCommunicator, AsyncHandlesAreComplete) {
  mx::SingleProcessCommunicator c;
  const std::vector<float> x = awkward_floats();
  std::vector<float> y(x.size(), 0.0f);
  mx::CommHandle h = c.all_gather_async(x, y);
  EXPECT_FALSE(h.pending());
  EXPECT_TRUE(h.test());
  h.wait();
  EXPECT_TRUE(same_bits(x, y));
  std::vector<float> z(x.size(), 0.0f);
  mx::CommHandle h2 = c.reduce_scatter_async(x, z, mx::ReduceOp::kAvg);
  h2.wait();
  EXPECT_TRUE(same_bits(x, z));
}

TEST(SingleProcessCommunicator, SplitAndHybridGroups) {
  mx::SingleProcessCommunicator c;
  auto sub = c.split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  mx::HybridGroups g = mx::make_hybrid_groups(c, 1);
  EXPECT_EQ(g.shard->size(), 1);
  EXPECT_EQ(g.replica->size(), 1);
  EXPECT_THROW(mx::make_hybrid_groups(c, 2), mx::UserError);  // 2 does not divide 1
}

TEST(SingleProcessCommunicator, SizeMismatchesAndBadOpsAreBugs) {
  mx::SingleProcessCommunicator c;
  std::vector<float> x(4), y(3);
  EXPECT_THROW(c.all_gather(x, y), std::logic_error);
  EXPECT_THROW(c.reduce_scatter(x, y, mx::ReduceOp::kSum), std::logic_error);
  std::vector<uint16_t> b(4);
  EXPECT_THROW(c.all_reduce(b.data(), b.data(), 4, mx::CommDtype::kBF16, mx::ReduceOp::kSum),
               std::logic_error);
  std::vector<int64_t> i(2);
  EXPECT_THROW(c.all_reduce(std::span<int64_t>(i), mx::ReduceOp::kAvg), std::logic_error);
  EXPECT_THROW(c.broadcast(std::span<float>(x), 1), std::logic_error);
}

TEST(World, NotLaunchedByMpirunMeansSingleProcess) {
  // Under ctest no launcher variables are set: the world must not initialise MPI.
  if (mx::launched_by_mpi_launcher()) GTEST_SKIP() << "running under an MPI launcher";
  mx::Communicator& w = mx::world_communicator();
  EXPECT_EQ(w.kind(), "single-process");
  EXPECT_EQ(w.size(), 1);
  EXPECT_FALSE(mx::in_multi_process_job());
}

TEST(World, LauncherDetectionFromEnvironment) {
  const char* names[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK",
                         "MXTRAIN_MPI"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    unsetenv(n);
  }
  EXPECT_FALSE(mx::launched_by_mpi_launcher());
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_TRUE(mx::launched_by_mpi_launcher());
  setenv("MXTRAIN_MPI", "0", 1);
  EXPECT_FALSE(mx::launched_by_mpi_launcher());
  unsetenv("OMPI_COMM_WORLD_SIZE");
  unsetenv("MXTRAIN_MPI");
  setenv("PMI_RANK", "0", 1);
  EXPECT_TRUE(mx::launched_by_mpi_launcher());
  unsetenv("PMI_RANK");
  setenv("MXTRAIN_MPI", "1", 1);
  EXPECT_TRUE(mx::launched_by_mpi_launcher());
  unsetenv("MXTRAIN_MPI");
  for (auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
}

TEST(Failure, ExitCodes) {
  EXPECT_EQ(mx::exit_code_for(mx::UserError("x")), 2);
  EXPECT_EQ(mx::exit_code_for(mx::StorageError("x")), 3);
  EXPECT_EQ(mx::exit_code_for(mx::CommError("x")), 1);
  EXPECT_EQ(mx::exit_code_for(std::logic_error("x")), 1);
}

TEST(Failure, AbortAllInOneProcessPrintsErrorAndExits) {
  EXPECT_EXIT(mx::abort_all(2, "bad thing"), testing::ExitedWithCode(2), "^error: bad thing\n");
  EXPECT_EXIT(mx::abort_all(0, "zero"), testing::ExitedWithCode(1), "error: zero");
}

}  // namespace
