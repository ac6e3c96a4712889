// Backend::begin_shared_input on the reference forms (the base class, which the CPU backend runs
// and CUDA's op check compares against): inside a bracket the FP8 Linears that quantize the
// same input the same way take one kept quantization (counted), and give what a fresh
// quantization gives: each result against the recipe's quantizers (numerics, checked against
// ml_dtypes in tests/python/test_numerics.py) and a naive double-precision GEMM. Operands of
// another quantization or layout, another tensor, and calls outside the bracket are not shared.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "numerics/formats.h"
#include "numerics/quantize.h"

namespace mx {
namespace {

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

constexpr int64_t N = 32, I = 64;

// The per-tensor operand's dequantized values, from the recipe's quantizer.
std::vector<float> dequant_tensor(const std::vector<float>& x, int64_t rows, int64_t cols,
                                  const Backend::Fp8Operand& q) {
  std::vector<float> out(x.size());
  numerics::QuantizeInto into;
  into.dequant = out.data();
  const float scale =
      q.current ? numerics::fp8_scale_from_amax(numerics::abs_max(x.data(), int64_t(x.size())),
                                                numerics::fp8_max(q.fmt))
                : q.scale;
  numerics::quantize_fp8_tensor_into(x.data(), rows, cols, q.fmt, scale, into);
  return out;
}

std::vector<float> dequant_mx(const std::vector<float>& x, int64_t rows, int64_t cols,
                              bool columnwise) {
  std::vector<float> out(x.size());
  numerics::QuantizeInto into;
  into.dequant = out.data();
  numerics::quantize_mxfp8_into(x.data(), rows, cols, columnwise, numerics::Format::kE4M3,
                                numerics::MxScaleRule::kCeil, into);
  return out;
}

// c[m, n] = sum_k a[m, k] b[n, k] in double, with a's and b's element strides given: a[m, k]
// at a[m * am + k * ak], b likewise.
std::vector<double> contract(const std::vector<float>& a, int64_t am, int64_t ak,
                             const std::vector<float>& b, int64_t bn, int64_t bk, int64_t M,
                             int64_t Nc, int64_t K) {
  std::vector<double> c(size_t(M * Nc));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < Nc; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(a[m * am + k * ak]) * b[n * bn + k * bk];
      c[size_t(m * Nc + n)] = s;
    }
  return c;
}
// y[n, o] = sum_i a[n, i] b[o, i] (forward).
std::vector<double> matmul_nt(const std::vector<float>& a, const std::vector<float>& b,
                              int64_t n_rows, int64_t inner, int64_t o_rows) {
  return contract(a, inner, 1, b, inner, 1, n_rows, o_rows, inner);
}
// dw[o, i] = sum_n dy[n, o] x[n, i] (weight gradient; dy [N, O], x [N, I]).
std::vector<double> matmul_tn(const std::vector<float>& dy, const std::vector<float>& x,
                              int64_t O) {
  return contract(dy, 1, O, x, 1, I, O, I, N);
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  double scale = 1e-12;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << " at " << i;
}

Backend::Fp8Operand per_tensor(bool current, float scale, float* amax) {
  Backend::Fp8Operand q;
  q.current = current;
  q.scale = scale;
  q.amax = amax;
  return q;
}

TEST(SharedInput, LinearsReadingOneInputShareItsQuantization) {
  auto be = make_host_backend();
  const auto x = randn(N * I, 1);
  const float amax_x = numerics::abs_max(x.data(), N * I);
  const int64_t outs[3] = {48, 16, 16};  // q, k, v
  std::vector<float> work(size_t(N * I + 48 * I));
  for (int delayed = 0; delayed < 2; ++delayed) {
    // fp8-delayed: the histories' scales agree (as q's, k's and v's do), one slot each
    const float scale = delayed ? 300.0f : 0.0f;
    float slots[3] = {-1, -1, -1};
    const int64_t hits0 = be->shared_input_hits();
    be->begin_shared_input(x.data(), N, I, 48);
    for (int l = 0; l < 3; ++l) {
      const auto w = randn(outs[l] * I, 10 + l, 0.05f);
      const auto xq = per_tensor(!delayed, scale, &slots[l]);
      const auto wq = per_tensor(true, 0.0f, nullptr);
      std::vector<float> y(size_t(N * outs[l]));
      be->fp8_linear_forward(y.data(), x.data(), xq, w.data(), wq, N, I, outs[l], work.data());
      expect_close(y, matmul_nt(dequant_tensor(x, N, I, xq), dequant_tensor(w, outs[l], I, wq), N,
                                I, outs[l]),
                   "y");
    }
    be->end_shared_input();
    EXPECT_EQ(be->shared_input_hits() - hits0, 2);  // k and v took q's
    for (float a : slots) EXPECT_EQ(a, amax_x);     // every slot gets the amax
  }
}

TEST(SharedInput, AnotherQuantizationIsMadeAfresh) {
  auto be = make_host_backend();
  const auto x = randn(N * I, 2);
  const auto w = randn(16 * I, 3, 0.05f);
  std::vector<float> work(size_t(N * I + 16 * I + N * 16));
  std::vector<float> y(size_t(N * 16));
  const auto wq = per_tensor(true, 0.0f, nullptr);
  auto forward = [&](const Backend::Fp8Operand& xq) {
    be->fp8_linear_forward(y.data(), x.data(), xq, w.data(), wq, N, I, 16, work.data());
    expect_close(y, matmul_nt(dequant_tensor(x, N, I, xq), dequant_tensor(w, 16, I, wq), N, I, 16),
                 "y");
  };
  be->begin_shared_input(x.data(), N, I, 48);
  forward(per_tensor(false, 200.0f, nullptr));  // kept
  forward(per_tensor(false, 50.0f, nullptr));   // another scale: its own
  forward(per_tensor(true, 0.0f, nullptr));     // current scaling: its own
  {
    Backend::Fp8Operand e5 = per_tensor(false, 200.0f, nullptr);
    e5.fmt = numerics::Format::kE5M2;  // another format: its own
    forward(e5);
  }
  EXPECT_EQ(be->shared_input_hits(), 0);
  forward(per_tensor(false, 200.0f, nullptr));  // the kept one
  EXPECT_EQ(be->shared_input_hits(), 1);
  // The weight gradient's copy of x (the transposed layout) is another operand.
  auto dy = randn(N * 16, 4, 1e-3f);
  std::vector<float> dw(size_t(16 * I), 0.0f);
  Backend::Fp8Operand dyq = per_tensor(true, 0.0f, nullptr);
  dyq.fmt = numerics::Format::kE5M2;
  const auto xq = per_tensor(false, 200.0f, nullptr);
  be->fp8_linear_wgrad(dw.data(), dy.data(), dyq, x.data(), xq, N, I, 16, work.data());
  EXPECT_EQ(be->shared_input_hits(), 1);
  be->end_shared_input();
  // dw = dy^T x over the dequantized operands
  expect_close(dw, matmul_tn(dequant_tensor(dy, N, 16, dyq), dequant_tensor(x, N, I, xq), 16),
               "dw");
  // Outside the bracket, and another tensor inside one: nothing shared.
  forward(per_tensor(false, 200.0f, nullptr));
  const auto x2 = randn(N * I, 5);
  be->begin_shared_input(x2.data(), N, I, 48);
  forward(per_tensor(false, 200.0f, nullptr));
  forward(per_tensor(false, 200.0f, nullptr));
  be->end_shared_input();
  EXPECT_EQ(be->shared_input_hits(), 1);
}

TEST(SharedInput, WeightGradientsShareTheTransposedCopy) {
  // mxfp8: the weight gradients' x in 32x1 blocks (down the tokens), shared between two
  // Linears (gate and up), not with the forward's 1x32 copy made first in another bracket.
  auto be = make_host_backend();
  const auto x = randn(N * I, 6);
  Backend::Fp8Operand col;
  col.mx = true;
  col.block_rows = 32;
  col.block_cols = 1;
  std::vector<float> work(size_t(N * I + N * 32));
  be->begin_shared_input(x.data(), N, I, 48);
  for (int l = 0; l < 2; ++l) {
    const auto dy = randn(N * 32, 20 + l, 1e-3f);
    std::vector<float> dw(size_t(32 * I), 0.0f);
    be->fp8_linear_wgrad(dw.data(), dy.data(), col, x.data(), col, N, I, 32, work.data());
    expect_close(dw, matmul_tn(dequant_mx(dy, N, 32, true), dequant_mx(x, N, I, true), 32),
                 "dw");
  }
  be->end_shared_input();
  EXPECT_EQ(be->shared_input_hits(), 1);
}

TEST(SharedInput, Bf16CodesAreKeyedByTheirPointer) {
  // The bf16 path hands the Linears x as codes (Fp8Operand::bf16, x null).
  auto be = make_host_backend();
  const auto x = randn(N * I, 7);
  std::vector<uint16_t> codes(x.size());
  std::vector<float> wide(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    codes[i] = numerics::encode_bf16(x[i]);
    wide[i] = numerics::decode_bf16(codes[i]);
  }
  const auto w = randn(16 * I, 8, 0.05f);
  std::vector<float> work(size_t(N * I + 16 * I)), y(size_t(N * 16));
  const auto wq = per_tensor(true, 0.0f, nullptr);
  be->begin_shared_input(codes.data(), N, I, 48);
  for (int l = 0; l < 3; ++l) {
    auto xq = per_tensor(true, 0.0f, nullptr);
    xq.bf16 = codes.data();
    be->fp8_linear_forward(y.data(), nullptr, xq, w.data(), wq, N, I, 16, work.data());
    expect_close(
        y, matmul_nt(dequant_tensor(wide, N, I, xq), dequant_tensor(w, 16, I, wq), N, I, 16), "y");
  }
  be->end_shared_input();
  EXPECT_EQ(be->shared_input_hits(), 2);
}

}  // namespace
}  // namespace mx
