// CPU backend ops against naive double-precision references written from the definitions,
// and backward ops against central finite differences of those references.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "tests/cpp/backend/bf16_bits.h"

namespace {

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Every element within tol * max|ref| (+ a tiny floor).
void expect_close(const std::vector<float>& got, const std::vector<double>& ref, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = max_abs(ref) + 1e-12;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], tol * scale + 1e-7) << what << " at " << i;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// 0.5 op(A) op(B) + 2 C in double: the definition both GEMM tests compare against.
std::vector<double> gemm_definition(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                    const std::vector<float>& A, const std::vector<float>& B,
                                    const std::vector<float>& C) {
  std::vector<double> ref(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
      ref[i * N + j] = 0.5 * s + 2.0 * C[i * N + j];
    }
  return ref;
}

TEST(CpuOps, GemmAllTransposes) {
  auto be = mx::make_cpu_backend();
  const int64_t M = 7, N = 5, K = 9;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      auto A = randn(M * K, 1), B = randn(K * N, 2), C = randn(M * N, 3);
      std::vector<double> ref = gemm_definition(ta, tb, M, N, K, A, B, C);
      be->gemm(ta, tb, M, N, K, 0.5f, A.data(), B.data(), 2.0f, C.data());
      expect_close(C, ref, 1e-6, "gemm");
    }
}

// GEMMs large enough that the backend splits them between threads by hand (rows when C is
// taller than wide, columns otherwise), on 3 threads so the blocks are uneven and not multiples
// of 16: every element of C against the double-precision definition.
TEST(CpuOps, GemmSplitBetweenThreadsAllTransposes) {
  auto be = mx::make_cpu_backend();
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(3);
  struct Dims {
    int64_t M, N, K;
  };
  for (const Dims d : {Dims{301, 37, 410}, Dims{37, 299, 410}, Dims{40, 40, 3000}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t M = d.M, N = d.N, K = d.K;
        auto A = randn(M * K, 11), B = randn(K * N, 12), C = randn(M * N, 13);
        std::vector<double> ref = gemm_definition(ta, tb, M, N, K, A, B, C);
        be->gemm(ta, tb, M, N, K, 0.5f, A.data(), B.data(), 2.0f, C.data());
        SCOPED_TRACE(::testing::Message() << M << "x" << N << "x" << K << " ta=" << ta
                                          << " tb=" << tb);
        expect_close(C, ref, 1e-5, "split gemm");
      }
  omp_set_num_threads(saved_threads);
}

TEST(CpuOps, RmsNormForwardBackward) {
  auto be = mx::make_cpu_backend();
  const int64_t N = 6, C = 37;
  const float eps = 1e-5f;
  auto x = randn(N * C, 4), w = randn(C, 5), dy = randn(N * C, 6);
  auto ref_forward = [&](const std::vector<double>& xd, const std::vector<double>& wd) {
    std::vector<double> y(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += xd[n * C + c] * xd[n * C + c];
      double r = 1.0 / std::sqrt(ss / C + eps);
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = xd[n * C + c] * r * wd[c];
    }
    return y;
  };
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end());
  std::vector<float> y(N * C, kNaN), rstd(N, kNaN);
  be->rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  expect_close(y, ref_forward(xd, wd), 1e-6, "rmsnorm y");
  // Backward: dx accumulates onto what is there, dw accumulates too.
  std::vector<float> dx(N * C, 0.25f), dw(C, -1.0f);
  be->rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww) {
    auto yy = ref_forward(xx, ww);
    double s = 0;
    for (int64_t i = 0; i < N * C; ++i) s += yy[i] * dy[i];
    return s;
  };
  std::vector<double> dx_ref(N * C), dw_ref(C);
  const double h = 1e-6;
  for (int64_t i = 0; i < N * C; ++i) {
    auto a = xd, b = xd;
    a[i] += h;
    b[i] -= h;
    dx_ref[i] = 0.25 + (loss(a, wd) - loss(b, wd)) / (2 * h);
  }
  for (int64_t c = 0; c < C; ++c) {
    auto a = wd, b = wd;
    a[c] += h;
    b[c] -= h;
    dw_ref[c] = -1.0 + (loss(xd, a) - loss(xd, b)) / (2 * h);
  }
  expect_close(dx, dx_ref, 1e-5, "rmsnorm dx");
  expect_close(dw, dw_ref, 1e-5, "rmsnorm dw");
}

TEST(CpuOps, RopeRotateHalfAndInverse) {
  auto be = mx::make_cpu_backend();
  const int64_t B = 2, T = 5, H = 3, D = 8, half = D / 2;
  const double theta = 10000.0;
  std::vector<float> cos(T * half), sin(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double a = t * std::pow(theta, -2.0 * i / D);
      cos[t * half + i] = float(std::cos(a));
      sin[t * half + i] = float(std::sin(a));
    }
  auto x = randn(B * T * H * D, 7);
  std::vector<double> ref(x.size());
  // Hugging Face: out = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1].
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          int64_t base = ((b * T + t) * H + h) * D;
          int64_t i = d % half;
          double a = t * std::pow(theta, -2.0 * i / D);
          double rot = d < half ? -double(x[base + d + half]) : double(x[base + d - half]);
          ref[base + d] = x[base + d] * std::cos(a) + rot * std::sin(a);
        }
  auto y = x;
  be->rope_forward(y.data(), cos.data(), sin.data(), B, T, H, D);
  expect_close(y, ref, 1e-6, "rope");
  // backward of an orthogonal map is its transpose: applying it to the output gives x back.
  be->rope_backward(y.data(), cos.data(), sin.data(), B, T, H, D);
  std::vector<double> xd(x.begin(), x.end());
  expect_close(y, xd, 1e-6, "rope inverse");
}

TEST(CpuOps, SwigluForwardBackward) {
  auto be = mx::make_cpu_backend();
  const int64_t n = 101;
  auto g = randn(n, 8, 3.0f), u = randn(n, 9), ds = randn(n, 10);
  std::vector<float> s(n, kNaN), dg(n, kNaN), du(n, kNaN);
  be->swiglu_forward(s.data(), g.data(), u.data(), n);
  be->swiglu_backward(dg.data(), du.data(), ds.data(), g.data(), u.data(), n);
  std::vector<double> s_ref(n), dg_ref(n), du_ref(n);
  auto f = [](double gg, double uu) { return gg / (1 + std::exp(-gg)) * uu; };
  for (int64_t i = 0; i < n; ++i) {
    s_ref[i] = f(g[i], u[i]);
    const double h = 1e-6;
    dg_ref[i] = ds[i] * (f(g[i] + h, u[i]) - f(g[i] - h, u[i])) / (2 * h);
    du_ref[i] = ds[i] * (f(g[i], u[i] + h) - f(g[i], u[i] - h)) / (2 * h);
  }
  expect_close(s, s_ref, 1e-6, "swiglu");
  expect_close(dg, dg_ref, 1e-5, "swiglu dg");
  expect_close(du, du_ref, 1e-5, "swiglu du");
}

TEST(CpuOps, EmbeddingForwardBackwardWithRepeats) {
  auto be = mx::make_cpu_backend();
  const int64_t V = 11, C = 13, N = 9;
  auto table = randn(V * C, 11), dout = randn(N * C, 12);
  std::vector<int32_t> tokens = {3, 0, 3, 10, 7, 3, 0, 1, 10};
  std::vector<float> out(N * C, kNaN);
  be->embedding_forward(out.data(), tokens.data(), table.data(), N, C);
  std::vector<double> out_ref(N * C), dtab_ref(V * C, 0.5);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      out_ref[n * C + c] = table[tokens[n] * C + c];
      dtab_ref[tokens[n] * C + c] += dout[n * C + c];
    }
  expect_close(out, out_ref, 0, "embedding");
  std::vector<float> dtab(V * C, 0.5f);
  be->embedding_backward(dtab.data(), tokens.data(), dout.data(), N, C);
  expect_close(dtab, dtab_ref, 1e-6, "embedding backward");
}

TEST(CpuOps, HeadCrossEntropyChunkedMatchesDefinition) {
  auto be = mx::make_cpu_backend();
  const int64_t N = 10, C = 12, V = 17;
  auto h = randn(N * C, 13), w = randn(V * C, 14, 0.5f);
  std::vector<int32_t> tgt = {0, 16, 5, 5, 3, 9, 1, 12, 16, 2};
  const float scale = 0.3f;
  // Reference: loss_sum and gradients of scale * loss_sum in double.
  auto loss_of = [&](const std::vector<double>& hh, const std::vector<double>& ww) {
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> z(V);
      double mx = -1e300;
      for (int64_t v = 0; v < V; ++v) {
        double s = 0;
        for (int64_t c = 0; c < C; ++c) s += hh[n * C + c] * ww[v * C + c];
        z[v] = s;
        mx = std::max(mx, s);
      }
      double se = 0;
      for (double zz : z) se += std::exp(zz - mx);
      total += mx + std::log(se) - z[tgt[n]];
    }
    return total;
  };
  std::vector<double> hd(h.begin(), h.end()), wd(w.begin(), w.end());
  const double loss_ref = loss_of(hd, wd);
  for (int64_t chunk : {1, 3, 10}) {
    std::vector<float> dh(N * C, kNaN), dw(V * C, 1.0f), ws(chunk * V);
    double loss = be->head_cross_entropy(dh.data(), dw.data(), h.data(), w.data(), tgt.data(), N,
                                         C, V, scale, ws.data(), chunk, mx::HeadOperands::kFp32);
    EXPECT_NEAR(loss, loss_ref, 1e-5 * std::fabs(loss_ref));
    std::vector<double> dh_ref(N * C), dw_ref(V * C);
    const double eps = 1e-6;
    for (int64_t i = 0; i < N * C; ++i) {
      auto a = hd, b = hd;
      a[i] += eps;
      b[i] -= eps;
      dh_ref[i] = scale * (loss_of(a, wd) - loss_of(b, wd)) / (2 * eps);
    }
    for (int64_t i = 0; i < V * C; ++i) {
      auto a = wd, b = wd;
      a[i] += eps;
      b[i] -= eps;
      dw_ref[i] = 1.0 + scale * (loss_of(hd, a) - loss_of(hd, b)) / (2 * eps);
    }
    expect_close(dh, dh_ref, 1e-5, "head dh");
    expect_close(dw, dw_ref, 1e-5, "head dw");
  }
}

// bf16 by the usual bit formula (round to nearest, ties to even; finite inputs), written here
// rather than taken from numerics/ so the test does not check the code against itself.
using mxtest::bf16_code;
using mxtest::bf16_ref;
using mxtest::bf16_value;

// A head with rounded operands by its definition, in double: the loss of softmax(hq wq^T)
// against the targets; the logits gradient g = round_grad(scale (softmax - onehot)); dh =
// g wq and dw = 1 + g^T hq (dw starts at 1: the call accumulates). With round_dgrad and
// w_dgrad (the FP8 head's bf16 data gradient): dh = round_dgrad(scale (softmax - onehot))
// w_dgrad instead.
struct HeadReference {
  double loss = 0;
  std::vector<double> dh, dw;
  double grad_amax = 0;  // max |g| before round_grad
};
HeadReference head_reference(const std::vector<double>& hq, const std::vector<double>& wq,
                             const std::vector<int32_t>& tgt, int64_t N, int64_t C, int64_t V,
                             float scale, const std::function<double(double)>& round_grad,
                             const std::function<double(double)>& round_dgrad = nullptr,
                             const std::vector<double>* w_dgrad = nullptr) {
  HeadReference ref;
  std::vector<double> g(N * V), gd(N * V);
  const std::vector<double>& wd = w_dgrad ? *w_dgrad : wq;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> z(V);
    double mx = -1e300, se = 0;
    for (int64_t v = 0; v < V; ++v) {
      for (int64_t c = 0; c < C; ++c) z[v] += hq[n * C + c] * wq[v * C + c];
      mx = std::max(mx, z[v]);
    }
    for (double zz : z) se += std::exp(zz - mx);
    ref.loss += mx + std::log(se) - z[tgt[n]];
    for (int64_t v = 0; v < V; ++v) {
      const double gv = scale * (std::exp(z[v] - mx) / se - (v == tgt[n] ? 1.0 : 0.0));
      ref.grad_amax = std::max(ref.grad_amax, std::fabs(gv));
      g[n * V + v] = round_grad(gv);
      gd[n * V + v] = round_dgrad ? round_dgrad(gv) : g[n * V + v];
    }
  }
  ref.dh.assign(N * C, 0.0);
  ref.dw.assign(V * C, 1.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c) {
        ref.dh[n * C + c] += gd[n * V + v] * wd[v * C + c];
        ref.dw[v * C + c] += g[n * V + v] * hq[n * C + c];
      }
  return ref;
}

// The backend's head in `ops` against ref in chunks of 1, 3 and 10 rows, forward only too,
// its inputs untouched (the operand copies live in the workspace); returns how far the head
// in `other` lies from ref (max |dh - ref.dh|), for the caller to show the rounding is seen.
double expect_head_matches(mx::Backend& be, const std::vector<float>& h,
                           const std::vector<float>& w, const std::vector<int32_t>& tgt,
                           int64_t N, int64_t C, int64_t V, float scale, mx::HeadOperands ops,
                           const HeadReference& ref, mx::HeadOperands other, const char* what) {
  for (int64_t chunk : {1, 3, 10}) {
    std::vector<float> dh(N * C, kNaN), dw(V * C, 1.0f),
        ws(mx::head_workspace_floats(chunk, C, V, ops), kNaN);
    const std::vector<float> h0 = h, w0 = w;
    double loss = be.head_cross_entropy(dh.data(), dw.data(), h.data(), w.data(), tgt.data(), N,
                                        C, V, scale, ws.data(), chunk, ops);
    EXPECT_NEAR(loss, ref.loss, 1e-5 * std::fabs(ref.loss)) << what;
    expect_close(dh, ref.dh, 1e-5, what);
    expect_close(dw, ref.dw, 1e-5, what);
    EXPECT_EQ(h, h0) << what;
    EXPECT_EQ(w, w0) << what;
    double eval = be.head_cross_entropy(nullptr, nullptr, h.data(), w.data(), tgt.data(), N, C,
                                        V, scale, ws.data(), chunk, ops);
    EXPECT_NEAR(eval, ref.loss, 1e-5 * std::fabs(ref.loss)) << what;
  }
  std::vector<float> dh(N * C), dw(V * C, 1.0f), ws(mx::head_workspace_floats(N, C, V, other));
  be.head_cross_entropy(dh.data(), dw.data(), h.data(), w.data(), tgt.data(), N, C, V, scale,
                        ws.data(), N, other);
  double far = 0;
  for (int64_t i = 0; i < N * C; ++i) far = std::max(far, std::fabs(dh[i] - ref.dh[i]));
  return far;
}

TEST(CpuOps, HeadCrossEntropyBf16OperandsMatchRoundedDefinition) {
  // bf16_operands: the loss is the exact loss of the rounded h and W; the gradients are the
  // GEMMs of the rounded logits gradient (softmax - onehot, scaled) with the rounded h / W.
  auto be = mx::make_cpu_backend();
  const int64_t N = 10, C = 12, V = 17;
  auto h = randn(N * C, 23), w = randn(V * C, 24, 0.5f);
  std::vector<int32_t> tgt = {3, 16, 0, 5, 3, 9, 1, 12, 16, 2};
  const float scale = 0.3f;
  std::vector<double> hq(N * C), wq(V * C);
  for (int64_t i = 0; i < N * C; ++i) hq[i] = bf16_ref(h[i]);
  for (int64_t i = 0; i < V * C; ++i) wq[i] = bf16_ref(w[i]);
  const HeadReference ref =
      head_reference(hq, wq, tgt, N, C, V, scale, [](double x) { return double(bf16_ref(x)); });
  // The fp32 head's gradient lies outside the tolerance: the rounding is what is seen.
  EXPECT_GT(expect_head_matches(*be, h, w, tgt, N, C, V, scale, mx::HeadOperands::kBf16, ref,
                                mx::HeadOperands::kFp32, "bf16 head"),
            1e-4);
}

// E4M3 (3 mantissa bits, smallest normal exponent -6, largest 448) and E5M2 (2, -14, 57344)
// rounding by the usual formula (to nearest, ties to even, saturating at the largest finite),
// written here rather than taken from numerics/.
double fp8_rounded(double v, int mbits, int emin, double max_finite) {
  if (v == 0) return v;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| = f 2^e, f in [0.5, 1)
  const double quantum = std::ldexp(1.0, std::max(e - 1, emin) - mbits);
  return std::copysign(std::min(std::nearbyint(std::fabs(v) / quantum) * quantum, max_finite), v);
}

// x rounded to FP8 (mbits, emin, max_finite) at the fp32 scale max_finite / amax of the whole
// tensor and decoded times 1 / scale in fp32: the FP8 head's h and W.
std::vector<double> fp8_current_values(const std::vector<float>& x, int mbits, int emin,
                                       double max_finite) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = float(max_finite) / amax, inv = 1.0f / s;
  std::vector<double> q(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    q[i] = double(float(fp8_rounded(double(x[i] * s), mbits, emin, max_finite)) * inv);
  return q;
}

// The FP8 head tests' inputs, h's and W's FP8 values (E4M3 at current scales) and the logits
// gradient's E5M2 rounding at the scale of its bound |scale| (the fp32 element, decoded times
// 1 / scale in fp32).
struct Fp8HeadCase {
  static constexpr int64_t N = 10, C = 12, V = 17;
  std::vector<float> h = randn(N * C, 23), w = randn(V * C, 24, 0.5f);
  std::vector<int32_t> tgt = {3, 16, 0, 5, 3, 9, 1, 12, 16, 2};
  float scale = 0.3f;
  std::vector<double> hq = fp8_current_values(h, 3, -6, 448),
                      wq = fp8_current_values(w, 3, -6, 448);
  std::function<double(double)> round_grad() const {
    const float gs = 57344.0f / scale, ginv = 1.0f / gs;
    return [gs, ginv](double x) {
      return double(float(fp8_rounded(double(float(x) * gs), 2, -14, 57344)) * ginv);
    };
  }
};

TEST(CpuOps, HeadCrossEntropyFp8OperandsMatchTheirDefinition) {
  // HeadOperands::kFp8 (precision.fp8_head): h and W rounded to E4M3 at fp32 scales 448 /
  // amax of the whole tensor, the logits gradient to E5M2 at 57344 / |grad_scale| (its bound);
  // each FP8 value decoded times 1 / scale in fp32. The loss is the exact loss of the rounded
  // h and W, the gradients the GEMMs of the rounded gradient with them, whatever the chunks.
  auto be = mx::make_cpu_backend();
  const Fp8HeadCase k;
  const int64_t N = k.N, C = k.C, V = k.V;
  const HeadReference ref = head_reference(k.hq, k.wq, k.tgt, N, C, V, k.scale, k.round_grad());
  // The bf16 head's gradient lies far outside the tolerance: the FP8 rounding is what is seen.
  EXPECT_GT(expect_head_matches(*be, k.h, k.w, k.tgt, N, C, V, k.scale, mx::HeadOperands::kFp8,
                                ref, mx::HeadOperands::kBf16, "fp8 head"),
            1e-3);
  // Telemetry: the last FP8 call's (chunks of 10) largest |gradient| before its rounding, over
  // every row; neither the forward-only calls nor the bf16 head's changed it.
  EXPECT_NEAR(be->head_fp8_grad_amax(), ref.grad_amax, 1e-6 * ref.grad_amax);
  EXPECT_LE(ref.grad_amax, double(k.scale));  // the bound the gradient's scale is taken from
  std::vector<float> dh(N * C), dw(V * C, 1.0f),
      ws(mx::head_workspace_floats(4, C, V, mx::HeadOperands::kFp8));
  be->head_cross_entropy(dh.data(), dw.data(), k.h.data(), k.w.data(), k.tgt.data(), 4, C, V,
                         k.scale, ws.data(), 4, mx::HeadOperands::kFp8);  // the first 4 rows
  // (h's scale from those rows' amax)
  const HeadReference four = head_reference(
      fp8_current_values(std::vector<float>(k.h.begin(), k.h.begin() + 4 * C), 3, -6, 448), k.wq,
      std::vector<int32_t>(k.tgt.begin(), k.tgt.begin() + 4), 4, C, V, k.scale,
      [](double x) { return x; });
  EXPECT_NEAR(be->head_fp8_grad_amax(), four.grad_amax, 1e-6 * four.grad_amax);
}

TEST(CpuOps, HeadCrossEntropyFp8WithBf16DgradMatchesItsDefinition) {
  // HeadOperands::kFp8Bf16Dgrad (precision.fp8_head_dgrad = bf16): the logits and dW as
  // kFp8's; dh = g16 W16, the bf16 roundings (RNE) of the fp32 gradient and of W itself.
  auto be = mx::make_cpu_backend();
  const Fp8HeadCase k;
  const int64_t N = k.N, C = k.C, V = k.V;
  std::vector<double> w16(V * C);
  for (int64_t i = 0; i < V * C; ++i) w16[i] = bf16_ref(k.w[i]);
  const HeadReference ref =
      head_reference(k.hq, k.wq, k.tgt, N, C, V, k.scale, k.round_grad(),
                     [](double x) { return double(bf16_ref(float(x))); }, &w16);
  // The all-FP8 head's data gradient lies far outside the tolerance: the bf16 one is seen.
  EXPECT_GT(expect_head_matches(*be, k.h, k.w, k.tgt, N, C, V, k.scale,
                                mx::HeadOperands::kFp8Bf16Dgrad, ref, mx::HeadOperands::kFp8,
                                "fp8 head, bf16 dgrad"),
            1e-3);
  EXPECT_NEAR(be->head_fp8_grad_amax(), ref.grad_amax, 1e-6 * ref.grad_amax);
}

TEST(CpuOps, RoundBf16MatchesBitFormula) {
  auto be = mx::make_cpu_backend();
  auto x = randn(1001, 25, 3.0f);
  x[0] = 1.0f + 1.0f / 256;          // a tie: to even (1.0)
  x[1] = 1.0f + 3.0f / 256;          // a tie: to even (1 + 4/256)
  x[2] = -0.0f;
  std::vector<float> y(x.size(), kNaN);
  be->round_bf16(y.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], bf16_ref(x[i])) << i;
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 1.0f + 4.0f / 256);
  be->round_bf16(x.data(), x.data(), int64_t(x.size()));  // in place
  EXPECT_EQ(x, y);
}

// Inputs for the bf16 roundings: random values with both kinds of tie, -0 and a subnormal first.
std::vector<float> bf16_cases(int64_t n, uint64_t seed) {
  auto x = randn(n, seed, 3.0f);
  x[0] = 1.0f + 1.0f / 256;  // a tie: to even (1.0)
  x[1] = 1.0f + 3.0f / 256;  // a tie: to even (1 + 4/256)
  x[2] = -0.0f;
  x[3] = 1e-40f;  // subnormal
  return x;
}

// precision.activations = bf16: the tensor rounded in place, its codes the top 16 bits of the
// rounded float (bit formula above), and the widened codes the rounded values exactly.
TEST(CpuOps, PackBf16KeepsTheRoundedBitsAndUnpacksExactly) {
  auto be = mx::make_cpu_backend();
  auto x = bf16_cases(1003, 26);
  const std::vector<float> orig = x;
  std::vector<uint16_t> codes(x.size(), 0xABCD);
  be->pack_bf16(x.data(), codes.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float r = bf16_ref(orig[i]);
    ASSERT_EQ(x[i], r) << i;
    uint32_t u;
    std::memcpy(&u, &r, 4);
    ASSERT_EQ(codes[i], uint16_t(u >> 16)) << i;
  }
  std::vector<float> back(x.size(), kNaN);
  be->unpack_bf16(back.data(), codes.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(std::memcmp(&back[i], &x[i], 4), 0) << i;
  std::vector<float> y = orig;  // no codes: rounding only
  be->pack_bf16(y.data(), nullptr, int64_t(y.size()));
  EXPECT_EQ(std::memcmp(y.data(), x.data(), 4 * x.size()), 0);
}

// The bf16 path's GEMM twin (MXTRAIN_TEST_BF16_GEMM): operands as codes or as fp32 rounded to
// bf16, fp32 or bf16 results. Integer data keeps every fp32 sum exact, so the reference is
// exact math: A holds codes of integers, B integers plus 0.003 (below half a bf16 step for
// |k| >= 1, so bf16 rounds it back to the integer, and only bf16 does).
TEST(CpuOps, Bf16GemmTakesCodesAndRoundsTheRest) {
  setenv("MXTRAIN_TEST_BF16_GEMM", "1", 1);
  auto be = mx::make_cpu_backend();
  ASSERT_TRUE(be->set_bf16_gemm_operands(true));
  const int64_t M = 5, N = 7, K = 29;
  std::mt19937 rng(7);
  auto integer = [&] {
    const int k = int(rng() % 8) + 1;
    return float(rng() % 2 ? k : -k);
  };
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      std::vector<float> a(M * K), b(K * N), b_off(K * N), c0(M * N);
      for (auto& x : a) x = integer();
      for (size_t i = 0; i < b.size(); ++i) {
        b[i] = integer();
        b_off[i] = b[i] + (b[i] > 0 ? 0.003f : -0.003f);
      }
      for (auto& x : c0) x = integer();
      std::vector<uint16_t> a16(a.size());
      for (size_t i = 0; i < a.size(); ++i) a16[i] = bf16_code(a[i]);
      auto at = [&](const std::vector<float>& m, bool t, int64_t r, int64_t col, int64_t cols,
                    int64_t rows) { return t ? m[col * rows + r] : m[r * cols + col]; };
      std::vector<double> ref(M * N, 0.0);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          for (int64_t k = 0; k < K; ++k)
            ref[i * N + j] += double(at(a, ta, i, k, K, M)) * at(b, tb, k, j, N, K);
      // fp32 result, beta 0 and beta 1 (accumulate into C)
      std::vector<float> c(M * N, kNaN);
      be->gemm_bf16(ta, tb, M, N, K, 1.0f, nullptr, a16.data(), b_off.data(), nullptr, 0.0f,
                    c.data(), nullptr);
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(c[i], float(ref[i])) << i;
      c = c0;
      be->gemm_bf16(ta, tb, M, N, K, 1.0f, nullptr, a16.data(), b_off.data(), nullptr, 1.0f,
                    c.data(), nullptr);
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(c[i], float(ref[i] + c0[i])) << i;
      // bf16 result: the exact product's RNE code
      std::vector<uint16_t> c16(M * N, 0xABCD);
      be->gemm_bf16(ta, tb, M, N, K, 1.0f, nullptr, a16.data(), b_off.data(), nullptr, 0.0f,
                    nullptr, c16.data());
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(c16[i], bf16_code(float(ref[i]))) << i;
      // plain gemm in this mode rounds both operands too; back in fp32 it does not
      std::vector<float> a_off(a.size());
      for (size_t i = 0; i < a.size(); ++i) a_off[i] = a[i] + (a[i] > 0 ? 0.003f : -0.003f);
      be->gemm(ta, tb, M, N, K, 1.0f, a_off.data(), b_off.data(), 0.0f, c.data());
      for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(c[i], float(ref[i])) << i;
      ASSERT_TRUE(be->set_bf16_gemm_operands(false));
      be->gemm(ta, tb, M, N, K, 1.0f, a_off.data(), b_off.data(), 0.0f, c.data());
      int differ = 0;
      for (int64_t i = 0; i < M * N; ++i) differ += c[i] != float(ref[i]);
      EXPECT_GT(differ, M * N / 2);
      ASSERT_TRUE(be->set_bf16_gemm_operands(true));
    }
  be->set_bf16_gemm_operands(false);
  unsetenv("MXTRAIN_TEST_BF16_GEMM");
  EXPECT_FALSE(be->set_bf16_gemm_operands(true));  // without the knob the CPU declines
}

TEST(CpuOps, ToBf16WritesTheRoundedCodesAndLeavesTheInput) {
  auto be = mx::make_cpu_backend();
  auto x = bf16_cases(1005, 27);
  const std::vector<float> orig = x;
  std::vector<uint16_t> codes(x.size(), 0xABCD);
  be->to_bf16(codes.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(codes[i], bf16_code(orig[i])) << i;
  EXPECT_EQ(std::memcmp(x.data(), orig.data(), 4 * x.size()), 0);
}

// SwiGLU on codes against the definition in double: the results are the RNE codes of values
// within fp32 error of it, so within half a bf16 step (at most 2^-8 relative) plus that error.
TEST(CpuOps, SwigluOnBf16CodesMatchesDefinition) {
  auto be = mx::make_cpu_backend();
  const int64_t n = 1007;
  auto g = randn(n, 28, 3.0f), u = randn(n, 29), ds = randn(n, 30);
  std::vector<uint16_t> g16(n), u16(n), ds16(n), s16(n, 0xABCD), dg16(n, 0xABCD),
      du16(n, 0xABCD);
  for (int64_t i = 0; i < n; ++i) {
    g16[i] = bf16_code(g[i]);
    u16[i] = bf16_code(u[i]);
    ds16[i] = bf16_code(ds[i]);
  }
  be->swiglu_forward_bf16(s16.data(), g16.data(), u16.data(), n);
  be->swiglu_backward_bf16(dg16.data(), du16.data(), ds16.data(), g16.data(), u16.data(), n);
  auto close = [](uint16_t got, double want) {
    return std::fabs(double(bf16_value(got)) - want) <= std::ldexp(std::fabs(want), -8) + 1e-30;
  };
  for (int64_t i = 0; i < n; ++i) {
    const double gv = bf16_value(g16[i]), uv = bf16_value(u16[i]), dsv = bf16_value(ds16[i]);
    const double sig = 1.0 / (1.0 + std::exp(-gv));
    ASSERT_TRUE(close(s16[i], gv * sig * uv)) << i;
    ASSERT_TRUE(close(du16[i], dsv * gv * sig)) << i;
    ASSERT_TRUE(close(dg16[i], dsv * uv * sig * (1 + gv * (1 - sig)))) << i;
  }
  // The fused form (one GEMM over gate and up): row r of the [19, 53] inputs gives dg at
  // [106 r, 106 r + 53) and du after it, the same codes.
  const int64_t rows = 19, cols = 53;
  std::vector<uint16_t> dgu16(2 * n, 0xABCD);
  be->swiglu_backward_bf16_fused(dgu16.data(), ds16.data(), g16.data(), u16.data(), rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(dgu16[2 * r * cols + c], dg16[r * cols + c]) << r << " " << c;
      ASSERT_EQ(dgu16[2 * r * cols + cols + c], du16[r * cols + c]) << r << " " << c;
    }
}

// fp32 SwiGLU gradients from codes (the FP8 recipes' MLP backward), dg over ds as the model
// calls it: against the definition in double on the values the codes hold (fp32 error only).
TEST(CpuOps, SwigluBackwardFromCodesMatchesDefinition) {
  auto be = mx::make_cpu_backend();
  const int64_t n = 1007;
  auto g = randn(n, 31, 3.0f), u = randn(n, 32), ds = randn(n, 33);
  std::vector<uint16_t> g16(n), u16(n);
  for (int64_t i = 0; i < n; ++i) {
    g16[i] = bf16_code(g[i]);
    u16[i] = bf16_code(u[i]);
  }
  std::vector<float> dg = ds, du(n, -7.0f);
  be->swiglu_backward_codes(dg.data(), du.data(), dg.data(), g16.data(), u16.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double gv = bf16_value(g16[i]), uv = bf16_value(u16[i]);
    const double sig = 1.0 / (1.0 + std::exp(-gv));
    const double want_du = ds[i] * gv * sig, want_dg = ds[i] * uv * sig * (1 + gv * (1 - sig));
    ASSERT_NEAR(du[i], want_du, 1e-5 * (1 + std::fabs(want_du))) << i;
    ASSERT_NEAR(dg[i], want_dg, 1e-5 * (1 + std::fabs(want_dg))) << i;
  }
}

// The bf16 path's producers: RMSNorm and RoPE into codes, against their definitions in
// double: each code the RNE of a value within fp32 error of the definition, so within half a
// bf16 step (at most 2^-8 relative: 8 significant bits) plus that error. RoPE leaves its fp32
// input as it was.
TEST(CpuOps, NormAndRopeIntoBf16CodesMatchDefinition) {
  auto be = mx::make_cpu_backend();
  auto close = [](uint16_t got, double want, double scale) {
    return std::fabs(double(bf16_value(got)) - want) <=
           std::ldexp(std::fabs(want), -8) + 1e-6 * scale;
  };
  const int64_t N = 37, C = 96;
  auto x = randn(N * C, 31, 2.0f), w = randn(C, 32);
  std::vector<uint16_t> y16(N * C, 0xABCD);
  std::vector<float> rstd(N, kNaN);
  be->rmsnorm_forward_bf16(y16.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, nullptr);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + 1e-5);
    ASSERT_NEAR(rstd[n], r, 1e-6 * r) << n;
    for (int64_t c = 0; c < C; ++c)
      ASSERT_TRUE(close(y16[n * C + c], x[n * C + c] * r * w[c], 10.0)) << n << "," << c;
  }
  // With the amax (an FP8 operand's, Fp8Operand::x_amax): the largest |code value|, NaN skipped
  // (a row of NaN), the same codes
  x[5 * C + 7] = kNaN;  // row 5 all NaN
  std::vector<uint16_t> y16a(N * C, 0xABCD);
  float amax = -1.0f;
  be->rmsnorm_forward_bf16(y16a.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, &amax);
  be->rmsnorm_forward_bf16(y16.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, nullptr);
  EXPECT_EQ(y16a, y16);
  float want = 0.0f;
  for (uint16_t code : y16)
    if (!std::isnan(bf16_value(code))) want = std::max(want, std::fabs(float(bf16_value(code))));
  EXPECT_TRUE(std::isnan(bf16_value(y16[5 * C])));
  EXPECT_GT(want, 0.0f);
  EXPECT_EQ(amax, want);
  const int64_t B = 2, T = 5, Hh = 3, D = 8, half = D / 2;
  auto q = randn(B * T * Hh * D, 33);
  const auto q0 = q;
  std::vector<float> cos(T * half), sin(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = t * std::pow(10000.0, -2.0 * i / D);
      cos[t * half + i] = float(std::cos(a));
      sin[t * half + i] = float(std::sin(a));
    }
  std::vector<uint16_t> q16(q.size(), 0xABCD);
  be->rope_forward_bf16(q16.data(), q.data(), cos.data(), sin.data(), B, T, Hh, D);
  EXPECT_EQ(std::memcmp(q.data(), q0.data(), 4 * q.size()), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hh; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const int64_t base = ((b * T + t) * Hh + h) * D;
          const double c = cos[t * half + i], sn = sin[t * half + i];
          const double x1 = q[base + i], x2 = q[base + i + half];
          ASSERT_TRUE(close(q16[base + i], x1 * c - x2 * sn, 5.0));
          ASSERT_TRUE(close(q16[base + i + half], x2 * c + x1 * sn, 5.0));
        }
}

TEST(CpuOps, AdamWMatchesTorchFormula) {
  auto be = mx::make_cpu_backend();
  // 33: one vector block per thread and a scalar tail; 1003: many blocks per thread. A
  // gradient scale (clipping's factor) other than 1: the step on the float product g * s.
  for (const float s : {1.0f, 0.37f})
    for (const int64_t n : {int64_t{33}, int64_t{1003}}) {
      auto p = randn(n, 15), g = randn(n, 16), m = randn(n, 17, 0.1f), v = randn(n, 18, 0.1f);
      for (auto& x : v) x = std::fabs(x);
      const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
      const int64_t t = 3;
      std::vector<double> p_ref(n), m_ref(n), v_ref(n);
      for (int64_t i = 0; i < n; ++i) {
        // torch.optim.AdamW, written from its documentation's algorithm, on the clipped
        // gradient as torch.nn.utils.clip_grad_norm_ leaves it (a float multiplication)
        const double gi = double(g[i] * s);
        double theta = p[i] * (1 - lr * wd);
        double mi = m_ref[i] = b1 * m[i] + (1 - b1) * gi;
        double vi = v_ref[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mhat = mi / (1 - std::pow(b1, t)), vhat = vi / (1 - std::pow(b2, t));
        p_ref[i] = theta - lr * mhat / (std::sqrt(vhat) + eps);
      }
      const auto g_before = g;
      be->adamw(p.data(), g.data(), m.data(), v.data(), n, float(lr), float(b1), float(b2),
                float(eps), float(wd), t, s);
      expect_close(p, p_ref, 1e-6, "adamw param");
      expect_close(m, m_ref, 1e-6, "adamw m");
      expect_close(v, v_ref, 1e-6, "adamw v");
      EXPECT_EQ(g, g_before);  // the gradient itself is left as it was
    }
}

TEST(CpuOps, AdamWWritesTheUpdatedParametersBf16Codes) {
  // The optional codes output (Fsdp's resident block codes): each updated parameter's RNE
  // code, against the format's definition (bf16_bits.h); the update itself as without codes.
  auto be = mx::make_cpu_backend();
  for (const int64_t n : {int64_t{33}, int64_t{1003}}) {
    auto p = randn(n, 25), g = randn(n, 26), m = randn(n, 27, 0.1f), v = randn(n, 28, 0.1f);
    for (auto& x : v) x = std::fabs(x);
    auto p2 = p, m2 = m, v2 = v;
    std::vector<uint16_t> codes(size_t(n), 0xFFFF);
    be->adamw(p.data(), g.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 2,
              0.5f, codes.data());
    be->adamw(p2.data(), g.data(), m2.data(), v2.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 2,
              0.5f);
    EXPECT_EQ(p, p2);
    EXPECT_EQ(m, m2);
    EXPECT_EQ(v, v2);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(codes[size_t(i)], mxtest::bf16_code(p[size_t(i)])) << i;
  }
}

TEST(CpuOps, AttentionDecodeMatchesLastRowOfCausalAttention) {
  auto be = mx::make_cpu_backend();
  const int64_t T = 9, H = 4, KV = 2, D = 8;
  auto q = randn(T * H * D, 19), k = randn(T * KV * D, 20), v = randn(T * KV * D, 21);
  std::vector<float> out(H * D, kNaN);
  be->attention_decode(out.data(), q.data() + (T - 1) * H * D, k.data(), v.data(), T, H, KV, D);
  std::vector<double> ref(H * D);
  for (int64_t h = 0; h < H; ++h) {
    int64_t kv = h / (H / KV);
    std::vector<double> s(T);
    double mx = -1e300, sum = 0;
    for (int64_t t = 0; t < T; ++t) {
      double d = 0;
      for (int64_t i = 0; i < D; ++i) d += double(q[((T - 1) * H + h) * D + i]) * k[(t * KV + kv) * D + i];
      s[t] = d / std::sqrt(double(D));
      mx = std::max(mx, s[t]);
    }
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int64_t i = 0; i < D; ++i) {
      double o = 0;
      for (int64_t t = 0; t < T; ++t) o += s[t] / sum * v[(t * KV + kv) * D + i];
      ref[h * D + i] = o;
    }
  }
  expect_close(out, ref, 1e-5, "attention decode");
}

}  // namespace
