// FP8 attention's CPU twin (mx::cpu::attention_forward_fp8 / _backward_fp8) against a naive
// double-precision reference that quantizes at the points docs/numerics.md ("FP8 attention")
// names, with numerics' own E4M3 / E5M2 encoders (checked against ml_dtypes in
// tests/python/test_numerics.py): full T x T softmax per row, no tiles, no online softmax. Also
// checks that the bound-derived scales of numerics/attention_fp8.h hold: no exact intermediate
// ever exceeds its format's largest value at its scale, on random inputs and on inputs built to
// reach the dK / dV bounds (every query attending to key 0).
#include "backend/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "numerics/attention_fp8.h"
#include "numerics/formats.h"
#include "numerics/quantize.h"

namespace {

namespace nm = mx::numerics;

struct Shape {
  int64_t B, T, H, KV, D;
};

double q8(double x, float scale, bool e5m2) {
  return nm::attn_fp8_round(static_cast<float>(x), scale, e5m2);
}

// The reference's exact intermediates, for the bound checks: max |.| * scale of each tensor the
// kernel encodes at a bound-derived scale.
struct Peaks {
  double o = 0, ds = 0, dq = 0, dk = 0, dv = 0;
};

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  Peaks peak;
};

// The reference on fp32 inputs q, k, v, dout (already floats).
Reference reference(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  const float aq = nm::abs_max(q.data(), nq), ak = nm::abs_max(k.data(), nk),
              av = nm::abs_max(v.data(), nk), ado = nm::abs_max(dout.data(), nq);
  const auto sc = nm::attn_fp8_forward_scales(aq, ak, av);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  const auto bs = nm::attn_fp8_backward_scales(aq, ak, av, ado, s.D, s.T * (s.H / s.KV),
                                               static_cast<float>(scale));
  std::vector<double> qd(nq), kd(nk), vd(nk), dod(nq);
  for (int64_t i = 0; i < nq; ++i) qd[i] = q8(q[i], sc.q, false), dod[i] = q8(dout[i], bs.dO, true);
  for (int64_t i = 0; i < nk; ++i) kd[i] = q8(k[i], sc.k, false), vd[i] = q8(v[i], sc.v, false);

  Reference r;
  r.out.assign(nq, 0.0);
  r.lse.assign(s.B * s.H * s.T, 0.0);
  r.dq.assign(nq, 0.0);
  r.dk.assign(nk, 0.0);
  r.dv.assign(nk, 0.0);
  std::vector<double> p, dp;
  // Forward: O from P8, then O rounded (its exact peak kept).
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t g = h / (s.H / s.KV), qi = ((b * s.T + t) * s.H + h) * s.D;
        p.assign(t + 1, 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += qd[qi + d] * kd[((b * s.T + j) * s.KV + g) * s.D + d];
          m = std::max(m, p[j] = scale * dot);
        }
        double l = 0;
        for (auto& e : p) l += (e = std::exp(e - m));
        r.lse[(b * s.H + h) * s.T + t] = m + std::log(l);
        for (int64_t j = 0; j <= t; ++j) {
          const double p8 = q8(p[j] / l, sc.s, false);
          for (int64_t d = 0; d < s.D; ++d)
            r.out[qi + d] += p8 * vd[((b * s.T + j) * s.KV + g) * s.D + d];
        }
      }
  for (int64_t i = 0; i < nq; ++i) {
    r.peak.o = std::max(r.peak.o, std::fabs(r.out[i]) * sc.o);
    r.out[i] = q8(r.out[i], sc.o, false);
  }
  // Backward on the rounded output.
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t g = h / (s.H / s.KV), qi = ((b * s.T + t) * s.H + h) * s.D;
        const double lse = r.lse[(b * s.H + h) * s.T + t];
        double delta = 0;
        for (int64_t d = 0; d < s.D; ++d) delta += dod[qi + d] * r.out[qi + d];
        for (int64_t j = 0; j <= t; ++j) {
          const int64_t kj = ((b * s.T + j) * s.KV + g) * s.D;
          double dot = 0, dpj = 0;
          for (int64_t d = 0; d < s.D; ++d) dot += qd[qi + d] * kd[kj + d], dpj += dod[qi + d] * vd[kj + d];
          const double pj = std::exp(scale * dot - lse);
          const double p8 = q8(pj, sc.s, false);
          const double ds = pj * (dpj - delta);
          r.peak.ds = std::max(r.peak.ds, std::fabs(ds) * bs.dP);
          const double ds8 = q8(ds, bs.dP, true);
          for (int64_t d = 0; d < s.D; ++d) {
            r.dq[qi + d] += scale * ds8 * kd[kj + d];
            r.dk[kj + d] += scale * ds8 * qd[qi + d];
            r.dv[kj + d] += p8 * dod[qi + d];
          }
        }
      }
  auto round_out = [](std::vector<double>& x, float sc, double& peak) {
    for (auto& e : x) {
      peak = std::max(peak, std::fabs(e) * sc);
      e = q8(e, sc, true);
    }
  };
  round_out(r.dq, bs.dQ, r.peak.dq);
  round_out(r.dk, bs.dK, r.peak.dk);
  round_out(r.dv, bs.dV, r.peak.dv);
  return r;
}

// The twin's values are the reference's FP8 values: equal, or (an fp32 sum landing on the
// other side of a rounding boundary than the double one) one FP8 step apart, for at most 2% of
// the elements. step_bits: 3 (E4M3) or 2 (E5M2) mantissa bits.
void expect_fp8_equal(const std::vector<float>& got, const std::vector<double>& want,
                      int step_bits, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0;
  double max_ref = 0;
  for (double w : want) max_ref = std::max(max_ref, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "]";
    const double diff = std::fabs(double(got[i]) - want[i]);
    if (diff == 0) continue;
    ++differ;
    const double mag = std::max(std::fabs(double(got[i])), std::fabs(want[i]));
    // one step of the larger value's binade (or a subnormal step near 0)
    EXPECT_LE(diff, std::ldexp(mag, -step_bits) + 1e-6 * max_ref)
        << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
  EXPECT_LE(double(differ), 0.02 * double(got.size()) + 1) << what << ": " << differ << " of "
                                                          << got.size() << " differ";
}

std::vector<float> randn(size_t n, std::mt19937& rng, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(dist(rng));
  return x;
}

struct TwinRun {
  std::vector<float> out, lse, dq, dk, dv;
};

TwinRun run_twin(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
             const std::vector<float>& v, const std::vector<float>& dout) {
  const size_t nq = q.size(), nk = k.size();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  TwinRun r{std::vector<float>(nq, nan), std::vector<float>(s.B * s.H * s.T, nan),
        std::vector<float>(nq, nan), std::vector<float>(nk, nan), std::vector<float>(nk, nan)};
  mx::cpu::attention_forward_fp8(r.out.data(), r.lse.data(), q.data(), k.data(), v.data(), s.B,
                                 s.T, s.H, s.KV, s.D);
  mx::cpu::attention_backward_fp8(r.dq.data(), r.dk.data(), r.dv.data(), dout.data(), q.data(),
                                  k.data(), v.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H,
                                  s.KV, s.D);
  return r;
}

void expect_bounds_hold(const Peaks& p) {
  // Each exact intermediate times its encode scale stays within the format's range: the
  // bound-derived scales never saturate.
  EXPECT_LE(p.o, nm::kAttnE4M3Max);
  EXPECT_LE(p.ds, nm::kAttnE5M2Max);
  EXPECT_LE(p.dq, nm::kAttnE5M2Max);
  EXPECT_LE(p.dk, nm::kAttnE5M2Max);
  EXPECT_LE(p.dv, nm::kAttnE5M2Max);
}

TEST(CpuAttentionFp8, MatchesQuantizedReference) {
  // Shapes across tiles (T > 128: several key tiles, a partial last one), GQA groups 1, 2, 4.
  for (const Shape s : {Shape{2, 37, 4, 2, 16}, Shape{1, 150, 4, 1, 32}, Shape{1, 260, 2, 2, 64}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " H=" << s.H
                                      << " KV=" << s.KV << " D=" << s.D);
    std::mt19937 rng(7 + unsigned(s.T));
    const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
    const auto q = randn(nq, rng, 1.5), k = randn(nk, rng, 1.5), v = randn(nk, rng, 1.0),
               dout = randn(nq, rng, 0.01);
    const Reference ref = reference(s, q, k, v, dout);
    const TwinRun got = run_twin(s, q, k, v, dout);
    expect_fp8_equal(got.out, ref.out, 3, "out");
    double max_lse_err = 0;
    for (size_t i = 0; i < got.lse.size(); ++i)
      max_lse_err = std::max(max_lse_err, std::fabs(got.lse[i] - ref.lse[i]));
    EXPECT_LE(max_lse_err, 1e-4);
    expect_fp8_equal(got.dq, ref.dq, 2, "dq");
    expect_fp8_equal(got.dk, ref.dk, 2, "dk");
    expect_fp8_equal(got.dv, ref.dv, 2, "dv");
    expect_bounds_hold(ref.peak);

    // It is FP8: the output differs from fp32 attention by about E4M3's precision, not fp32's.
    std::vector<float> out32(nq), lse32(got.lse.size());
    mx::cpu::attention_forward(out32.data(), lse32.data(), q.data(), k.data(), v.data(), s.B, s.T,
                               s.H, s.KV, s.D);
    double err = 0, mag = 0;
    for (size_t i = 0; i < nq; ++i)
      err = std::max(err, double(std::fabs(out32[i] - got.out[i]))),
      mag = std::max(mag, double(std::fabs(out32[i])));
    EXPECT_GT(err, 1e-3 * mag);
    EXPECT_LT(err, 0.25 * mag);
  }
}

// Every query attends (almost) only to key 0: a column of P sums to nearly T x group, the case
// the dK and dV bounds are for. The twin still matches, and no scale saturates.
TEST(CpuAttentionFp8, AttentionSinkStaysWithinTheBounds) {
  const Shape s{1, 200, 4, 2, 32};
  std::mt19937 rng(3);
  const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D;
  auto q = randn(nq, rng, 0.05), k = randn(nk, rng, 0.05), v = randn(nk, rng, 1.0);
  for (int64_t t = 0; t < s.T; ++t)
    for (int64_t h = 0; h < s.H; ++h) q[(t * s.H + h) * s.D] = 6.0f;  // q . k_0 large
  for (int64_t g = 0; g < s.KV; ++g) k[g * s.D] = 6.0f;
  std::vector<float> dout(nq, 0.0f);
  for (size_t i = 0; i < nq; ++i) dout[i] = (i % 3 == 0) ? 1.0f : 0.5f;  // all one sign: sums add
  const Reference ref = reference(s, q, k, v, dout);
  const TwinRun got = run_twin(s, q, k, v, dout);
  expect_fp8_equal(got.out, ref.out, 3, "out");
  expect_fp8_equal(got.dq, ref.dq, 2, "dq");
  expect_fp8_equal(got.dk, ref.dk, 2, "dk");
  expect_fp8_equal(got.dv, ref.dv, 2, "dv");
  expect_bounds_hold(ref.peak);
  // dV's column 0 comes near its bound (T x group x amax(dout)) here: within a factor 4, so the
  // bound is not far looser than it needs to be for such inputs.
  EXPECT_GT(ref.peak.dv, nm::kAttnE5M2Max / 8);
}

TEST(CpuAttentionFp8, ScalesArePowersOfTwo) {
  const auto f = nm::attn_fp8_forward_scales(3.7f, 0.02f, 1234.5f);
  const auto b = nm::attn_fp8_backward_scales(3.7f, 0.02f, 1234.5f, 1e-5f, 64, 8192 * 4, 0.125f);
  for (float x : {f.q, f.k, f.v, f.s, f.o, b.dO, b.dP, b.dQ, b.dK, b.dV}) {
    int e = 0;
    EXPECT_EQ(std::frexp(x, &e), 0.5f) << x;
  }
  // q: 448 / 3.7 = 121.08 -> 64; v: 448 / 1234.5 = 0.363 -> 0.25; o = v / 2
  EXPECT_EQ(f.q, 64.0f);
  EXPECT_EQ(f.v, 0.25f);
  EXPECT_EQ(f.o, 0.125f);
  EXPECT_EQ(f.s, 256.0f);
  // dV: 57344 / (2 x 32768 x 1e-5) = 87500 -> 65536
  EXPECT_EQ(b.dV, 65536.0f);
  // all-zero dout: unit scales (fp8_scale_from_amax's rule for amax 0)
  const auto z = nm::attn_fp8_backward_scales(1, 1, 1, 0.0f, 64, 100, 0.125f);
  EXPECT_EQ(z.dO, 1.0f);
  EXPECT_EQ(z.dP, 1.0f);
  EXPECT_EQ(z.dV, 1.0f);
}

}  // namespace
