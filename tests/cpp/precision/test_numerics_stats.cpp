// Telemetry bookkeeping: the saturation thresholds against the codecs' own overflow, the SQNR
// formula on hand-made tensors, and the collapse rule of SqnrMonitor.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "numerics/formats.h"
#include "precision/numerics_stats.h"
#include "precision/recipe.h"

namespace mx {
namespace {

using numerics::Format;
using numerics::Saturation;

// Below the threshold an unclamped (kNoSat) RNE encode gives the largest finite code; at the
// threshold it overflows (NaN for E4M3, inf for E5M2 and BF16): exactly where SATFINITE acts.
TEST(SaturationThreshold, IsWhereRoundingOverflows) {
  const float t4 = saturation_threshold(Format::kE4M3);
  EXPECT_EQ(numerics::encode_e4m3(std::nextafter(t4, 0.0f), Saturation::kNoSat), 0x7E);
  EXPECT_EQ(numerics::encode_e4m3(t4, Saturation::kNoSat) & 0x7F, 0x7F);
  EXPECT_EQ(numerics::encode_e4m3(464.0f, Saturation::kNoSat), 0x7E);  // tie to even 448
  const float t5 = saturation_threshold(Format::kE5M2);
  EXPECT_EQ(t5, 61440.0f);
  EXPECT_EQ(numerics::encode_e5m2(std::nextafter(t5, 0.0f), Saturation::kNoSat), 0x7B);
  EXPECT_EQ(numerics::encode_e5m2(t5, Saturation::kNoSat), 0x7C);
  const float tb = saturation_threshold(Format::kBF16);
  EXPECT_EQ(numerics::encode_bf16(std::nextafter(tb, 0.0f), Saturation::kNoSat), 0x7F7F);
  EXPECT_EQ(numerics::encode_bf16(tb, Saturation::kNoSat), 0x7F80);
  // E2M1 has no overflow code; 7 is the tie between 6 (odd mantissa) and 8 (even).
  EXPECT_EQ(saturation_threshold(Format::kE2M1), 7.0f);
}

TEST(OperandStats, HandComputed) {
  // x, its "dequantized" copy, multiplier 100 (so |x| >= 4.64 saturates for E4M3)
  const std::vector<float> x = {1.0f, -2.0f, 0.001f, 0.0f, 5.0f, -4.0f};
  const std::vector<float> d = {1.0f, -2.5f, 0.0f, 0.0f, 4.48f, -4.0f};
  OperandStats s;
  accumulate_stats(s, x.data(), d.data(), 2, 3, Format::kE4M3,
                   [](int64_t, int64_t) { return 100.0f; });
  EXPECT_STREQ(s.format, "e4m3");
  EXPECT_EQ(s.numel, 6);
  EXPECT_EQ(s.saturated, 1);  // 5 * 100 = 500 >= 464.00003; 4 * 100 = 400 is not
  EXPECT_EQ(s.flushed, 1);    // 0.001 -> 0 (the true zero is not "flushed")
  EXPECT_EQ(s.amax, 5.0);
  const double signal = 1 + 4 + 1e-6 + 25 + 16;  // (0.001f)^2 ~ 1e-6
  const double noise = 0.25 + 1e-6 + double(5.0f - 4.48f) * double(5.0f - 4.48f);
  EXPECT_NEAR(s.signal, signal, 1e-9);
  EXPECT_NEAR(s.noise, noise, 1e-9);
  EXPECT_NEAR(s.sqnr_db(), 10 * std::log10(signal / noise), 1e-6);
  // merging a second quantization of the same operand sums everything
  OperandStats t = s;
  t.merge(s);
  EXPECT_EQ(t.numel, 12);
  EXPECT_EQ(t.saturated, 2);
  EXPECT_NEAR(t.sqnr_db(), s.sqnr_db(), 1e-9);
  OperandStats exact;
  accumulate_stats(exact, x.data(), x.data(), 1, 6, Format::kBF16,
                   [](int64_t, int64_t) { return 1.0f; });
  EXPECT_TRUE(std::isinf(exact.sqnr_db()));
  EXPECT_TRUE(exact.to_json()["sqnr_db"].is_null());
}

TEST(SqnrMonitor, FloorAndDropRules) {
  SqnrMonitor m;
  EXPECT_NE(m.check("a", "e4m3", 15.9), "");  // below the e4m3 floor (16 dB)
  EXPECT_EQ(m.check("b", "e4m3", 31.0), "");
  EXPECT_EQ(m.check("b", "e4m3", 30.0), "");
  // with two earlier values there is no median rule yet
  EXPECT_EQ(m.check("b", "e4m3", 19.0), "");
  // history {31, 30, 19}: median 30; 19.9 is 10.1 below it
  EXPECT_NE(m.check("b", "e4m3", 19.9), "");
  // history {31, 30, 19, 19.9}: median 24.95; 15.0 < floor anyway, 16.5 is 8.45 below: fine
  EXPECT_EQ(m.check("b", "e4m3", 16.5), "");
  EXPECT_EQ(m.check("c", "e2m1", 6.0), "");   // nvfp4's floor is 5 dB
  EXPECT_NE(m.check("c", "e2m1", 4.0), "");
  EXPECT_EQ(m.check("d", "e5m2", NAN), "");   // an all-zero operand is not a collapse
}

TEST(OperandName, Spelling) {
  EXPECT_EQ(operand_name(3, 6, int(LinearOperand::kWgradGrad)),
            "layers.3.mlp.down_proj.wgrad.grad_output");
  EXPECT_EQ(operand_name(0, 0, int(LinearOperand::kFwdInput)), "layers.0.self_attn.q_proj.fwd.input");
  EXPECT_EQ(operand_name(1, 3, int(LinearOperand::kDgradWeight)),
            "layers.1.self_attn.o_proj.dgrad.weight");
}

// Collection is off by default and costs nothing: no stats, and finish_stats returns null.
TEST(LinearRecipeStats, OffByDefaultOnWhenAsked) {
  LinearRecipe r(Recipe::kFp8Current, 2, 0, 0, 1, 0);
  std::vector<float> x(64), q(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.7f * float(i));
  r.quantize(q.data(), x.data(), 4, 16, true, LinearOperand::kFwdInput, 1, 2);
  EXPECT_TRUE(r.finish_stats(1).is_null());
  r.set_collect_stats(true);
  r.quantize(q.data(), x.data(), 4, 16, true, LinearOperand::kFwdInput, 1, 2);
  r.quantize(q.data(), x.data(), 4, 16, true, LinearOperand::kFwdInput, 1, 2);  // merged
  auto j = r.finish_stats(2);
  ASSERT_TRUE(j.contains("layers.1.self_attn.v_proj.fwd.input")) << j.dump();
  EXPECT_EQ(j["layers.1.self_attn.v_proj.fwd.input"]["numel"].get<int64_t>(), 128);
  EXPECT_FALSE(r.collecting_stats());
}

}  // namespace
}  // namespace mx
