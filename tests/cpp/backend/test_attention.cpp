// mx::cpu attention against a naive double-precision reference (full T x T softmax, exact math),
// and that reference against a central finite difference of sum(out * dout).
#include "backend/cpu/attention.h"

#include <cstring>

#include "backend/backend.h"
#include "tests/cpp/backend/bf16_bits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace {

struct Shape {
  int64_t B, T, H, KV, D;
};

std::vector<double> random_tensor(size_t n, std::mt19937& rng, double magnitude) {
  std::normal_distribution<double> dist(0.0, magnitude);
  std::vector<double> x(n);
  for (auto& e : x) e = dist(rng);
  return x;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

// The float values the kernel sees, back in double, so the reference answers the same question.
std::vector<double> rounded(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = static_cast<float>(x[i]);
  return y;
}

// Row-wise softmax of query (b, h, t) over keys 0..t: probabilities p[0..t] and log-sum-exp.
double softmax_row(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                   int64_t b, int64_t h, int64_t t, std::vector<double>& p) {
  const int64_t g = h / (s.H / s.KV);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  p.assign(t + 1, 0.0);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j <= t; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < s.D; ++d)
      dot += q[((b * s.T + t) * s.H + h) * s.D + d] * k[((b * s.T + j) * s.KV + g) * s.D + d];
    p[j] = scale * dot;
    m = std::max(m, p[j]);
  }
  double l = 0.0;
  for (auto& e : p) l += (e = std::exp(e - m));
  for (auto& e : p) e /= l;
  return m + std::log(l);
}

void reference_forward(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, std::vector<double>& out,
                       std::vector<double>& lse) {
  out.assign(q.size(), 0.0);
  lse.assign(static_cast<size_t>(s.B * s.H * s.T), 0.0);
  std::vector<double> p;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t g = h / (s.H / s.KV);
        lse[(b * s.H + h) * s.T + t] = softmax_row(s, q, k, b, h, t, p);
        double* o = &out[((b * s.T + t) * s.H + h) * s.D];
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < s.D; ++d) o[d] += p[j] * v[((b * s.T + j) * s.KV + g) * s.D + d];
      }
}

void reference_backward(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                        const std::vector<double>& v, const std::vector<double>& dout,
                        std::vector<double>& dq, std::vector<double>& dk, std::vector<double>& dv) {
  dq.assign(q.size(), 0.0);
  dk.assign(k.size(), 0.0);
  dv.assign(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  std::vector<double> p, dp;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t g = h / (s.H / s.KV);
        softmax_row(s, q, k, b, h, t, p);
        const int64_t qi = ((b * s.T + t) * s.H + h) * s.D;
        dp.assign(t + 1, 0.0);
        double di = 0.0;  // sum_j P_j dP_j, equal to rowsum(dO * O) in exact math
        for (int64_t j = 0; j <= t; ++j) {
          const int64_t kj = ((b * s.T + j) * s.KV + g) * s.D;
          for (int64_t d = 0; d < s.D; ++d) dp[j] += dout[qi + d] * v[kj + d];
          di += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= t; ++j) {
          const int64_t kj = ((b * s.T + j) * s.KV + g) * s.D;
          const double ds = p[j] * (dp[j] - di);
          for (int64_t d = 0; d < s.D; ++d) {
            dq[qi + d] += scale * ds * k[kj + d];
            dk[kj + d] += scale * ds * q[qi + d];
            dv[kj + d] += p[j] * dout[qi + d];
          }
        }
      }
}

// Max abs error within 1e-4 of the reference's largest magnitude (+1e-6); NaN anywhere fails.
void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
    max_ref = std::max(max_ref, std::fabs(want[i]));
    max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  EXPECT_LE(max_err, 1e-4 * max_ref + 1e-6) << what << ": max |ref| = " << max_ref;
}

void check_against_reference(const Shape& s, double magnitude, unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                    << " KV=" << s.KV << " D=" << s.D << " mag=" << magnitude);
  std::mt19937 rng(seed);
  const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.D);
  const size_t nk = static_cast<size_t>(s.B * s.T * s.KV * s.D);
  const auto q = rounded(random_tensor(nq, rng, magnitude));
  const auto k = rounded(random_tensor(nk, rng, magnitude));
  const auto v = rounded(random_tensor(nk, rng, 1.0));
  const auto dout = rounded(random_tensor(nq, rng, 1.0));

  std::vector<double> out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  reference_forward(s, q, k, v, out_ref, lse_ref);
  reference_backward(s, q, k, v, dout, dq_ref, dk_ref, dv_ref);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), doutf = to_float(dout);
  std::vector<float> out(nq, nan), lse(lse_ref.size(), nan);
  mx::cpu::attention_forward(out.data(), lse.data(), qf.data(), kf.data(), vf.data(), s.B, s.T,
                             s.H, s.KV, s.D);
  expect_close(out, out_ref, "out");
  expect_close(lse, lse_ref, "lse");

  std::vector<float> dq(nq, nan), dk(nk, nan), dv(nk, nan);
  mx::cpu::attention_backward(dq.data(), dk.data(), dv.data(), doutf.data(), qf.data(), kf.data(),
                              vf.data(), out.data(), lse.data(), s.B, s.T, s.H, s.KV, s.D);
  expect_close(dq, dq_ref, "dq");
  expect_close(dk, dk_ref, "dk");
  expect_close(dv, dv_ref, "dv");
}

using mxtest::bf16_code;
using mxtest::bf16_value;

// The bf16 path's attention (Backend::attention_forward_bf16 / _backward_bf16: q, k, v and out
// as bf16 codes) against the reference on the codes' values: out within its own rounding (half
// a bf16 step) of the reference plus the fp32 tolerance; lse at the fp32 tolerance; the
// gradients, which see out rounded (through rowsum(dout * out)), within 2^-8 of each tensor's
// largest value.
TEST(CpuAttention, Bf16EntryPointsMatchReference) {
  auto be = mx::make_cpu_backend();
  for (const Shape s : {Shape{2, 37, 6, 2, 16}, Shape{1, 130, 4, 4, 64}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " D=" << s.D);
    std::mt19937 rng(21);
    const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.D);
    const size_t nk = static_cast<size_t>(s.B * s.T * s.KV * s.D);
    auto codes = [](const std::vector<double>& x, std::vector<double>& values) {
      std::vector<uint16_t> c(x.size());
      values.resize(x.size());
      for (size_t i = 0; i < x.size(); ++i) values[i] = bf16_value(c[i] = bf16_code(x[i]));
      return c;
    };
    std::vector<double> q, k, v;
    const auto q16 = codes(random_tensor(nq, rng, 1.0), q);
    const auto k16 = codes(random_tensor(nk, rng, 1.0), k);
    const auto v16 = codes(random_tensor(nk, rng, 1.0), v);
    const auto dout = rounded(random_tensor(nq, rng, 1.0));
    std::vector<double> out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
    reference_forward(s, q, k, v, out_ref, lse_ref);
    reference_backward(s, q, k, v, dout, dq_ref, dk_ref, dv_ref);

    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint16_t> out16(nq, 0x7FC1);
    std::vector<float> lse(lse_ref.size(), nan);
    be->attention_forward_bf16(out16.data(), lse.data(), q16.data(), k16.data(), v16.data(),
                               s.B, s.T, s.H, s.KV, s.D);
    double max_ref = 0;
    for (double x : out_ref) max_ref = std::max(max_ref, std::fabs(x));
    for (size_t i = 0; i < nq; ++i)
      ASSERT_LE(std::fabs(bf16_value(out16[i]) - out_ref[i]),
                std::ldexp(std::fabs(out_ref[i]), -8) + 1e-4 * max_ref + 1e-6)
          << i;
    expect_close(lse, lse_ref, "lse");

    const auto doutf = to_float(dout);
    std::vector<float> dq(nq, nan), dk(nk, nan), dv(nk, nan);
    be->attention_backward_bf16(dq.data(), dk.data(), dv.data(), doutf.data(), q16.data(),
                                k16.data(), v16.data(), out16.data(), lse.data(), s.B, s.T, s.H,
                                s.KV, s.D);
    auto within = [](const std::vector<float>& got, const std::vector<double>& want,
                     const char* what) {
      double mr = 0, me = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << what << i;
        mr = std::max(mr, std::fabs(want[i]));
        me = std::max(me, std::fabs(double(got[i]) - want[i]));
      }
      EXPECT_LE(me, std::ldexp(mr, -8)) << what;
    };
    within(dq, dq_ref, "dq");
    within(dk, dk_ref, "dk");
    within(dv, dv_ref, "dv");
  }
}

TEST(CpuAttention, MatchesReferenceSmallGroups) {
  check_against_reference({2, 37, 6, 2, 16}, 1.0, 1);  // ratio 3, T below one tile
  check_against_reference({3, 5, 2, 1, 64}, 1.0, 2);   // ratio 2
}

TEST(CpuAttention, MatchesReferenceSingleToken) {
  check_against_reference({1, 1, 4, 2, 16}, 1.0, 3);
  check_against_reference({2, 1, 3, 3, 24}, 1.0, 4);
}

TEST(CpuAttention, MatchesReferenceAcrossTiles) {
  check_against_reference({1, 130, 4, 4, 64}, 1.0, 5);   // ratio 1, T just past one tile
  check_against_reference({1, 200, 8, 2, 24}, 1.0, 6);   // ratio 4
  check_against_reference({1, 257, 3, 1, 16}, 1.0, 7);   // ratio 3, 2 tiles + 1 row
  check_against_reference({2, 300, 4, 2, 128}, 1.0, 8);  // ratio 2, D = 128
  check_against_reference({1, 256, 2, 1, 64}, 1.0, 9);   // T an exact multiple of the tile
}

// Large logits: the running max changes between key tiles and rows are near one-hot, which
// exercises the online rescaling and the exp range.
TEST(CpuAttention, MatchesReferencePeakedSoftmax) {
  check_against_reference({1, 300, 4, 2, 16}, 4.0, 10);
  check_against_reference({1, 150, 2, 1, 64}, 3.0, 11);
}

// The reference backward is the analytic gradient of sum(out * dout) of the reference forward.
TEST(CpuAttention, ReferenceBackwardMatchesFiniteDifference) {
  const Shape s{1, 9, 4, 2, 8};
  std::mt19937 rng(12);
  const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.D);
  const size_t nk = static_cast<size_t>(s.B * s.T * s.KV * s.D);
  auto q = random_tensor(nq, rng, 1.0);
  auto k = random_tensor(nk, rng, 1.0);
  auto v = random_tensor(nk, rng, 1.0);
  const auto dout = random_tensor(nq, rng, 1.0);
  std::vector<double> dq, dk, dv;
  reference_backward(s, q, k, v, dout, dq, dk, dv);

  auto loss = [&] {
    std::vector<double> out, lse;
    reference_forward(s, q, k, v, out, lse);
    double sum = 0.0;
    for (size_t i = 0; i < out.size(); ++i) sum += out[i] * dout[i];
    return sum;
  };
  auto numeric = [&](std::vector<double>& x, size_t i) {
    const double h = 1e-5, x0 = x[i];
    x[i] = x0 + h;
    const double up = loss();
    x[i] = x0 - h;
    const double down = loss();
    x[i] = x0;
    return (up - down) / (2 * h);
  };
  for (size_t i : {size_t{0}, size_t{37}, nq / 2, nq - 1}) EXPECT_NEAR(dq[i], numeric(q, i), 1e-7);
  // k and v entries of the last positions are seen by few queries; the first by all.
  for (size_t i : {size_t{3}, size_t{20}, nk / 2, nk - 1}) {
    EXPECT_NEAR(dk[i], numeric(k, i), 1e-7);
    EXPECT_NEAR(dv[i], numeric(v, i), 1e-7);
  }
}

// Timing printout, not a check: run with --gtest_also_run_disabled_tests.
TEST(CpuAttention, DISABLED_Timing) {
  for (const Shape s : {Shape{1, 2048, 8, 4, 64}, Shape{4, 512, 8, 4, 64}}) {
    std::mt19937 rng(13);
    const size_t nq = static_cast<size_t>(s.B * s.T * s.H * s.D);
    const size_t nk = static_cast<size_t>(s.B * s.T * s.KV * s.D);
    const auto q = to_float(random_tensor(nq, rng, 1.0));
    const auto k = to_float(random_tensor(nk, rng, 1.0));
    const auto v = to_float(random_tensor(nk, rng, 1.0));
    const auto dout = to_float(random_tensor(nq, rng, 1.0));
    std::vector<float> out(nq), lse(static_cast<size_t>(s.B * s.H * s.T));
    std::vector<float> dq(nq), dk(nk), dv(nk);
    using clock = std::chrono::steady_clock;
    double best_f = 1e30, best_b = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = clock::now();
      mx::cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s.B, s.T,
                                 s.H, s.KV, s.D);
      const auto t1 = clock::now();
      mx::cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                  k.data(), v.data(), out.data(), lse.data(), s.B, s.T, s.H, s.KV,
                                  s.D);
      const auto t2 = clock::now();
      best_f = std::min(best_f, std::chrono::duration<double>(t1 - t0).count());
      best_b = std::min(best_b, std::chrono::duration<double>(t2 - t1).count());
    }
    // Causal half of 4 * B * H * T^2 * D forward; backward 2.5x that.
    const double flops_f = 4.0 * s.B * s.H * s.T * s.T * s.D / 2.0, flops_b = 2.5 * flops_f;
    std::printf("B=%lld T=%lld H=%lld KV=%lld D=%lld: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms "
                "(%.1f GFLOP/s), total %.2f ms (%.1f GFLOP/s)\n",
                (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D,
                best_f * 1e3, flops_f / best_f * 1e-9, best_b * 1e3, flops_b / best_b * 1e-9,
                (best_f + best_b) * 1e3, (flops_f + flops_b) / (best_f + best_b) * 1e-9);
  }
}

}  // namespace
