// OpProfile (run.profile): exclusive attribution of time and FLOPs, and the report's rows.
#include "backend/op_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace mx {
namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

const OpProfile::Row* find(const std::vector<OpProfile::Row>& rows, const std::string& op) {
  for (const auto& r : rows)
    if (r.op == op) return &r;
  return nullptr;
}

TEST(OpProfile, NestedOpsAreChargedTheirOwnTimeAndFlops) {
  OpProfile p;
  double flops = 0;
  const auto t0 = std::chrono::steady_clock::now();
  p.begin("linear", flops);
  sleep_ms(20);           // the caller's own time
  p.begin("gemm", flops);
  sleep_ms(30);
  flops += 1e9;           // the GEMM counts its FLOPs
  p.end(flops);
  sleep_ms(10);           // the caller again
  p.end(flops);
  p.begin("gemm", flops);
  flops += 5e8;
  p.end(flops);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto rows = p.rows();
  ASSERT_EQ(rows.size(), 2u);
  const OpProfile::Row* linear = find(rows, "linear");
  const OpProfile::Row* gemm = find(rows, "gemm");
  ASSERT_TRUE(linear && gemm);
  EXPECT_EQ(linear->calls, 1);
  EXPECT_EQ(gemm->calls, 2);
  EXPECT_GE(linear->seconds, 0.030);  // 20 + 10 ms slept outside the GEMM
  EXPECT_GE(gemm->seconds, 0.030);
  EXPECT_LE(linear->seconds + gemm->seconds, wall);  // nothing counted twice
  EXPECT_EQ(gemm->flops, 1.5e9);
  EXPECT_EQ(linear->flops, 0.0);
}

TEST(OpProfile, DeviceRowsSortAndClear) {
  OpProfile p;
  p.add("b", 0.5, 0);
  p.add("a", 2.0, 4e12);
  p.add("b", 0.25, 0);
  auto rows = p.rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].op, "a");
  EXPECT_EQ(rows[1].op, "b");
  EXPECT_EQ(rows[1].calls, 2);
  EXPECT_EQ(rows[1].seconds, 0.75);
  p.clear();
  EXPECT_TRUE(p.rows().empty());
  p.end(0);  // an end with nothing begun (profiling switched on mid-op) is ignored
  EXPECT_TRUE(p.rows().empty());
}

TEST(OpProfile, ReportRowsSumTheRestAndTheTimeOutsideOps) {
  std::vector<OpProfile::Row> rows = {
      {"gemm", 10, 6.0, 12e12}, {"attention", 4, 2.0, 0}, {"add", 8, 0.5, 0}, {"fill", 2, 0.25, 0}};
  const std::string t = format_op_profile(rows, 10.0, 2);
  EXPECT_NE(t.find("gemm"), std::string::npos);
  EXPECT_NE(t.find("2000.0"), std::string::npos);        // 12e12 FLOP / 6 s = 2000 GFLOP/s
  EXPECT_NE(t.find("60.0%"), std::string::npos);         // 6 of 10 s
  EXPECT_EQ(t.find("fill"), std::string::npos);          // beyond the top 2 ...
  EXPECT_NE(t.find("(2 other ops)"), std::string::npos);  // ... summed: 10 calls, 0.75 s
  EXPECT_NE(t.find("0.7500"), std::string::npos);
  EXPECT_NE(t.find("(outside backend ops)"), std::string::npos);
  EXPECT_NE(t.find("1.2500"), std::string::npos);  // 10 - 8.75 s
  const nlohmann::json j = op_profile_json(rows, 10.0);
  ASSERT_EQ(j.size(), 4u);
  EXPECT_EQ(j[0]["op"], "gemm");
  EXPECT_DOUBLE_EQ(j[0]["share"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(j[0]["gflops"].get<double>(), 2000.0);
  EXPECT_EQ(j[3]["calls"], 2);
}

}  // namespace
}  // namespace mx
