// The CPU backend: OpenMP threads over rows, GEMMs through OpenBLAS. This is the reference
// implementation every other backend is tested against, so each op is written plainly.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/blas_core.h"
#include "backend/cpu/vec_math.h"
#include "core/error.h"

namespace mx {
namespace {

// MXTRAIN_TEST_DEVICE_MEMORY=1 (backend.h): host memory handed out as a MemoryResource would
// hand out a device's, counted.
// MXTRAIN_TEST_DEVICE_MEMORY_LIMIT=BYTES caps what it holds at once, as a device's capacity
// would (tests of what runs out of device memory).
class CountedHostMemory final : public MemoryResource {
 public:
  explicit CountedHostMemory(int64_t limit) : limit_(limit) {}
  void* allocate(size_t bytes, const std::string& arena) override {
    if (limit_ > 0 && held_bytes() + int64_t(bytes) > limit_)
      throw UserError(str("out of device memory (test limit ", limit_, " bytes): arena '", arena,
                          "' needs ", bytes, " bytes, ", limit_ - held_bytes(), " free"));
    void* p = std::aligned_alloc(Arena::kAlign, (bytes + Arena::kAlign - 1) / Arena::kAlign *
                                                    Arena::kAlign);
    if (!p) throw UserError(str("out of host memory: arena '", arena, "' needs ", bytes, " bytes"));
    count_allocate(p, bytes);
    return p;
  }
  void deallocate(void* p) override {
    count_deallocate(p);
    std::free(p);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }

 private:
  int64_t limit_;
};

class CpuBackend final : public Backend {
 public:
  // plain: host memory whatever the MXTRAIN_TEST_* settings say (make_host_backend).
  explicit CpuBackend(bool plain = false) : plain_(plain) {
    const char* e = std::getenv("MXTRAIN_TEST_DEVICE_MEMORY");
    if (!plain && e && std::strcmp(e, "1") == 0) {
      const char* lim = std::getenv("MXTRAIN_TEST_DEVICE_MEMORY_LIMIT");
      test_memory_ = std::make_unique<CountedHostMemory>(lim ? std::atoll(lim) : 0);
    }
  }
  std::string name() const override { return "cpu"; }
  // The GEMM library and its kernels: "(OpenBLAS 0.3.21, SkylakeX kernels)".
  std::string device_name() const override {
    const BlasCore b = blas_core();
    std::string s = "(" + b.library + ", " + b.core + " kernels";
    if (!b.replaced.empty())
      s += " set by mxtrain: OpenBLAS had picked " + b.replaced + " for this CPU";
    return s + ")";
  }
  MemoryResource* memory() override { return test_memory_.get(); }
  bool host_addressable() const override { return plain_ || Backend::host_addressable(); }

  GemmStats gemm_stats() const override { return stats_; }
  void reset_gemm_stats() override { stats_ = {}; }

  // run.profile: each op's host time, exclusive of the ops it calls (OpScope in each op).
  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<OpProfile::Row> op_profile() override { return profile_.rows(); }
  void reset_op_profile() override { profile_.clear(); }

  // MXTRAIN_TEST_BF16_GEMM=1: the GEMMs round their operands to bf16 themselves when asked,
  // as CUDA's do, so the model's native-bf16 paths (and gemm_bf16's codes) run here. The
  // products are those of the recipe's emulation (round_bf16 copies, then an fp32 GEMM).
  bool set_bf16_gemm_operands(bool on) override {
    const char* knob = std::getenv("MXTRAIN_TEST_BF16_GEMM");  // read per call: tests set it
    if (!knob || std::strcmp(knob, "1") != 0 || plain_) return false;
    bf16_gemm_ = on;
    return true;
  }

  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, const float* B, float beta, float* C) override {
    OpScope scope(*this, "gemm");
    if (bf16_gemm_) return gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, nullptr, B, nullptr,
                                     beta, C, nullptr);
    fp32_gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
  }

  // The bf16 GEMM's twin: each operand widened from its codes or rounded from fp32 into a
  // copy, an fp32 GEMM (exact products, fp32 sums), the result rounded when C16 is given.
  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                 float beta, float* C, uint16_t* C16) override {
    OpScope scope(*this, "gemm_bf16");
    MX_ASSERT(bf16_gemm_);
    MX_ASSERT(!C16 || beta == 0.0f);
    std::vector<float> a(size_t(M * K)), b(size_t(K * N)), c(C16 ? size_t(M * N) : 0);
    auto operand = [&](std::vector<float>& dst, const float* x, const uint16_t* x16) {
      if (x16) unpack_bf16(dst.data(), x16, int64_t(dst.size()));
      else round_bf16(dst.data(), x, int64_t(dst.size()));
    };
    operand(a, A, A16);
    operand(b, B, B16);
    float* out = C16 ? c.data() : C;
    fp32_gemm(trans_a, trans_b, M, N, K, alpha, a.data(), b.data(), C16 ? 0.0f : beta, out);
    if (C16) to_bf16(C16, out, M * N);
  }

  void fp32_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, const float* B, float beta, float* C) {
    if (M == 0 || N == 0) return;
    auto t0 = std::chrono::steady_clock::now();
    if (K == 0) {  // the empty product: C = beta C; beta 0 does not read C (no 0 * NaN)
      if (beta == 0.0f) fill(C, 0.0f, M * N);
      else scale(C, beta, M * N);
    } else {
      split_gemm(trans_a, trans_b, M, N, K, alpha, A, B, beta, C);
    }
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.flops += 2.0 * double(M) * double(N) * double(K);
  }

  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N,
                       int64_t C, float eps) override {
    OpScope scope(*this, "rmsnorm_forward");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * C;
      float* yr = y + n * C;
      double ss = 0;
      // simd reduction: the double sum may be reordered into vector lanes (it stayed scalar,
      // one dependent add per element, without the pragma).
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
      float r = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
      rstd[n] = r;
      for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
    }
  }

  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t N, int64_t C) override {
    OpScope scope(*this, "rmsnorm_backward");
    // y_c = x_c r w_c, r = (mean(x^2) + eps)^-1/2
    // dx_c = r w_c dy_c - x_c r^3 / C * sum_i dy_i w_i x_i ;  dw_c = sum_n dy_c x_c r
    int threads = omp_get_max_threads();
    std::vector<double> dw_part(dw ? size_t(threads) * C : 0, 0.0);
#pragma omp parallel
    {
      double* my_dw = dw ? dw_part.data() + size_t(omp_get_thread_num()) * C : nullptr;
#pragma omp for schedule(static)
      for (int64_t n = 0; n < N; ++n) {
        const float* xr = x + n * C;
        const float* dyr = dy + n * C;
        float r = rstd[n];
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; ++c) dot += double(dyr[c]) * w[c] * xr[c];
        float k = float(dot * double(r) * r * r / double(C));
        float* dxr = dx + n * C;
        for (int64_t c = 0; c < C; ++c) dxr[c] += r * w[c] * dyr[c] - xr[c] * k;
        if (my_dw)
          for (int64_t c = 0; c < C; ++c) my_dw[c] += double(dyr[c]) * xr[c] * r;
      }
    }
    if (dw)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int t = 0; t < threads; ++t) s += dw_part[size_t(t) * C + c];
        dw[c] += float(s);
      }
  }

  void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                    int64_t heads, int64_t D) override {
    OpScope scope(*this, "rope_forward");
    rope(x, cos, sin, B, T, heads, D, 1.0f);
  }
  void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                     int64_t heads, int64_t D) override {
    OpScope scope(*this, "rope_backward");
    rope(dx, cos, sin, B, T, heads, D, -1.0f);
  }

  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_forward");
    cpu::attention_forward(out, lse, q, k, v, B, T, H, KV, D);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_backward");
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, D);
  }

  void attention_forward_fp8(float* out, float* lse, const float* q, const float* k,
                             const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                             int64_t D) override {
    OpScope scope(*this, "attention_forward_fp8");
    numerics::AttnFp8Amax a;
    cpu::attention_forward_fp8(out, lse, q, k, v, B, T, H, KV, D, &a);
    attn_amax_.q = a.q, attn_amax_.k = a.k, attn_amax_.v = a.v, attn_amax_.p = a.p;
    attn_amax_.o = a.o;
  }
  void attention_backward_fp8(float* dq, float* dk, float* dv, const float* dout, const float* q,
                              const float* k, const float* v, const float* out, const float* lse,
                              int64_t B, int64_t T, int64_t H, int64_t KV,
                              int64_t D) override {
    OpScope scope(*this, "attention_backward_fp8");
    numerics::AttnFp8Amax a;
    cpu::attention_backward_fp8(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, D, &a);
    attn_amax_.dO = a.dO, attn_amax_.dS = a.dS, attn_amax_.dQ = a.dQ, attn_amax_.dK = a.dK;
    attn_amax_.dV = a.dV;
  }
  numerics::AttnFp8Amax attention_fp8_amax() override { return attn_amax_; }
  float head_fp8_grad_amax() override { return head_grad_amax_; }
  void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                        int64_t T_ctx, int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_decode");
    const int64_t group = H / KV;
    const float scale = 1.0f / std::sqrt(float(D));
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      const float* qh = q + h * D;
      std::vector<float> p(T_ctx);
      float mx = -INFINITY;
      for (int64_t t = 0; t < T_ctx; ++t) {
        const float* kt = k_cache + (t * KV + kvh) * D;
        float s = 0;
        for (int64_t d = 0; d < D; ++d) s += qh[d] * kt[d];
        p[t] = s * scale;
        mx = std::max(mx, p[t]);
      }
      double sum = 0;
      for (int64_t t = 0; t < T_ctx; ++t) sum += (p[t] = std::exp(p[t] - mx));
      float* oh = out + h * D;
      std::fill(oh, oh + D, 0.0f);
      for (int64_t t = 0; t < T_ctx; ++t) {
        const float* vt = v_cache + (t * KV + kvh) * D;
        float a = float(p[t] / sum);
        for (int64_t d = 0; d < D; ++d) oh[d] += a * vt[d];
      }
    }
  }

  void swiglu_forward(float* s, const float* g, const float* u, int64_t n) override {
    OpScope scope(*this, "swiglu_forward");
    parallel_chunks(n, [&](int64_t i0, int64_t i1) {
      cpu::silu_mul(s + i0, g + i0, u + i0, i1 - i0);
    });
  }

  void swiglu_backward(float* dg, float* du, const float* ds, const float* g, const float* u,
                       int64_t n) override {
    OpScope scope(*this, "swiglu_backward");
    parallel_chunks(n, [&](int64_t i0, int64_t i1) {
      cpu::silu_mul_backward(dg + i0, du + i0, ds + i0, g + i0, u + i0, i1 - i0);
    });
  }

  void embedding_forward(float* out, const int32_t* tokens, const float* table, int64_t N,
                         int64_t C) override {
    OpScope scope(*this, "embedding_forward");
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(out + n * C, table + int64_t(tokens[n]) * C, sizeof(float) * C);
  }

  void embedding_backward(float* dtable, const int32_t* tokens, const float* dout, int64_t N,
                          int64_t C) override {
    OpScope scope(*this, "embedding_backward");
    // Rows repeat, so split the columns between threads: no two threads touch the same float,
    // and the sum over tokens happens in token order (deterministic).
#pragma omp parallel
    {
      int nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;
      for (int64_t n = 0; n < N; ++n) {
        float* dst = dtable + int64_t(tokens[n]) * C;
        const float* src = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }

  double head_cross_entropy(float* dh, float* dw, const float* h, const float* w,
                            const int32_t* targets, int64_t N, int64_t C, int64_t V,
                            float grad_scale, float* workspace, int64_t chunk_rows,
                            HeadOperands operands) override {
    OpScope scope(*this, "head_cross_entropy");
    double loss_sum = 0;
    // Operand copies (bf16 or FP8 values in fp32): W rounded once into the workspace behind
    // the logits, each h chunk behind that, the logits gradient in place (backend.h's
    // head_workspace_floats layout). FP8: h's scale from the whole tensor, not the chunk, and
    // the gradient's from its bound (HeadOperands::kFp8), so chunking does not change a bit.
    constexpr numerics::Format kE4M3 = numerics::Format::kE4M3, kE5M2 = numerics::Format::kE5M2;
    const bool copies = operands != HeadOperands::kFp32;
    const bool fp8 = head_is_fp8(operands);
    const bool bf16_dgrad = operands == HeadOperands::kFp8Bf16Dgrad;
    float* wq = copies ? workspace + head_operands_offset(chunk_rows, V) : nullptr;
    float* hq = copies ? wq + V * C : nullptr;
    // kFp8Bf16Dgrad: W's and the chunk's gradient's bf16 roundings for dh = g W
    float* w16 = bf16_dgrad ? hq + chunk_rows * C : nullptr;
    float* g16 = bf16_dgrad ? w16 + V * C : nullptr;
    const float h_scale = fp8 ? head_fp8_scale(numerics::abs_max(h, N * C), kE4M3) : 0.0f;
    const float g_scale = fp8 ? head_fp8_scale(std::fabs(grad_scale), kE5M2) : 0.0f;
    // y = x's operand copy: bf16 (RNE) or FP8 at `scale` (may alias)
    auto round_operand = [&](float* y, const float* x, int64_t rows, int64_t cols,
                             numerics::Format fmt, float scale) {
      if (!fp8) return round_bf16(y, x, rows * cols);
      numerics::quantize_fp8_tensor_into(x, rows, cols, fmt, scale, numerics::QuantizeInto{y});
    };
    if (fp8 && dh) head_grad_amax_ = 0;
    if (bf16_dgrad && dh) round_bf16(w16, w, V * C);
    if (copies) {
      round_operand(wq, w, V, C, kE4M3,
                    fp8 ? head_fp8_scale(numerics::abs_max(w, V * C), kE4M3) : 0.0f);
      w = wq;
    }
    for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
      int64_t R = std::min(chunk_rows, N - r0);
      float* logits = workspace;  // [R, V]
      const float* hc = h + r0 * C;
      if (copies) {
        round_operand(hq, hc, R, C, kE4M3, h_scale);
        hc = hq;
      }
      linear_forward(logits, hc, w, R, C, V);
      double chunk_loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : chunk_loss)
      for (int64_t r = 0; r < R; ++r) {
        float* row = logits + r * V;
        const int32_t tgt = targets[r0 + r];
        const float target_logit = row[tgt];
        float mx = row[0];
        // max is exact in any order, so the reduction may vectorize (it stayed scalar without).
#pragma omp simd reduction(max : mx)
        for (int64_t j = 1; j < V; ++j) mx = row[j] > mx ? row[j] : mx;
        const float sum = cpu::exp_row(row, V, mx);  // row <- exp(row - max)
        chunk_loss += double(mx) + std::log(double(sum)) - double(target_logit);
        if (dh) {  // dlogits = grad_scale * (softmax - onehot), in place
          const float k = grad_scale / sum;
          for (int64_t j = 0; j < V; ++j) row[j] *= k;
          row[tgt] -= grad_scale;
        }
      }
      loss_sum += chunk_loss;
      if (!dh) continue;
      if (fp8) head_grad_amax_ = std::max(head_grad_amax_, numerics::abs_max(logits, R * V));
      if (bf16_dgrad) {  // dh from the bf16 roundings, dW from the FP8 values below
        round_bf16(g16, logits, R * V);
        linear_backward(dh + r0 * C, nullptr, g16, nullptr, w16, R, C, V, false);
      }
      if (copies) round_operand(logits, logits, R, V, kE5M2, g_scale);
      linear_backward(bf16_dgrad ? nullptr : dh + r0 * C, dw, logits, hc, w, R, C, V, false);
    }
    return loss_sum;
  }

  void round_bf16(float* y, const float* x, int64_t n) override {
    OpScope scope(*this, "round_bf16");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      y[i] = numerics::bf16_rounded(x[i]);
  }

  void pack_bf16(float* x, uint16_t* codes, int64_t n) override {
    OpScope scope(*this, "pack_bf16");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t c = numerics::encode_bf16(x[i], numerics::Saturation::kNoSat);
      x[i] = numerics::decode_bf16(c);
      if (codes) codes[i] = c;
    }
  }

  void to_bf16(uint16_t* codes, const float* x, int64_t n) override {
    OpScope scope(*this, "to_bf16");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i)
      codes[i] = numerics::encode_bf16(x[i], numerics::Saturation::kNoSat);
  }

  // The SwiGLU twins through the fp32 ops on widened copies, so that their bits are those of
  // unpack + swiglu_forward / swiglu_backward + rounding, chunking included.
  void swiglu_forward_bf16(uint16_t* s16, const uint16_t* g16, const uint16_t* u16,
                           int64_t n) override {
    OpScope scope(*this, "swiglu_forward_bf16");
    const size_t len = static_cast<size_t>(n);
    std::vector<float> g(len), u(len), s(len);
    unpack_bf16(g.data(), g16, n);
    unpack_bf16(u.data(), u16, n);
    swiglu_forward(s.data(), g.data(), u.data(), n);
    to_bf16(s16, s.data(), n);
  }

  void swiglu_backward_bf16(uint16_t* dg16, uint16_t* du16, const uint16_t* ds16,
                            const uint16_t* g16, const uint16_t* u16, int64_t n) override {
    OpScope scope(*this, "swiglu_backward_bf16");
    const size_t len = static_cast<size_t>(n);
    std::vector<float> ds(len), g(len), u(len), dg(len), du(len);
    unpack_bf16(ds.data(), ds16, n);
    unpack_bf16(g.data(), g16, n);
    unpack_bf16(u.data(), u16, n);
    swiglu_backward(dg.data(), du.data(), ds.data(), g.data(), u.data(), n);
    to_bf16(dg16, dg.data(), n);
    to_bf16(du16, du.data(), n);
  }

  void swiglu_backward_codes(float* dg, float* du, const float* ds, const uint16_t* g16,
                             const uint16_t* u16, int64_t n) override {
    OpScope scope(*this, "swiglu_backward_codes");
    const size_t len = static_cast<size_t>(n);
    std::vector<float> g(len), u(len);
    unpack_bf16(g.data(), g16, n);
    unpack_bf16(u.data(), u16, n);
    swiglu_backward(dg, du, ds, g.data(), u.data(), n);
  }

  // The bf16 path's producers and attention: the fp32 ops on widened copies, then the codes
  // (bit for bit what the fp32 op followed by pack_bf16 gives).
  void rmsnorm_forward_bf16(uint16_t* y16, float* rstd, const float* x, const float* w,
                            int64_t N, int64_t C, float eps, float* amax) override {
    OpScope scope(*this, "rmsnorm_forward_bf16");
    std::vector<float> y(static_cast<size_t>(N * C));
    rmsnorm_forward(y.data(), rstd, x, w, N, C, eps);
    to_bf16(y16, y.data(), N * C);
    if (amax) {  // of the codes' values
      unpack_bf16(y.data(), y16, N * C);
      *amax = numerics::abs_max(y.data(), N * C);
    }
  }

  void rope_forward_bf16(uint16_t* y16, const float* x, const float* cos, const float* sin,
                         int64_t B, int64_t T, int64_t heads, int64_t D) override {
    OpScope scope(*this, "rope_forward_bf16");
    std::vector<float> y(x, x + B * T * heads * D);
    rope_forward(y.data(), cos, sin, B, T, heads, D);
    to_bf16(y16, y.data(), int64_t(y.size()));
  }

  void attention_forward_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                              const uint16_t* k16, const uint16_t* v16, int64_t B, int64_t T,
                              int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_forward_bf16");
    forward_on_codes(out16, q16, k16, v16, B, T, H, KV, D,
                     [&](float* out, const float* q, const float* k, const float* v) {
                       attention_forward(out, lse, q, k, v, B, T, H, KV, D);
                     });
  }

  void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                               const uint16_t* q16, const uint16_t* k16, const uint16_t* v16,
                               const uint16_t* out16, const float* lse, int64_t B, int64_t T,
                               int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_backward_bf16");
    const std::vector<float> q = widened(q16, B * T * H * D), k = widened(k16, B * T * KV * D),
                             v = widened(v16, B * T * KV * D), o = widened(out16, B * T * H * D);
    attention_backward(dq, dk, dv, dout, q.data(), k.data(), v.data(), o.data(), lse, B, T, H,
                       KV, D);
  }

  void attention_backward_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                const uint16_t* dout16, const uint16_t* q16, const uint16_t* k16,
                                const uint16_t* v16, const uint16_t* out16, const float* lse,
                                int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_backward_codes");
    const std::vector<float> dout = widened(dout16, B * T * H * D);
    std::vector<float> dq(size_t(B * T * H * D)), dk(size_t(B * T * KV * D)),
        dv(size_t(B * T * KV * D));
    attention_backward_bf16(dq.data(), dk.data(), dv.data(), dout.data(), q16, k16, v16, out16,
                            lse, B, T, H, KV, D);
    to_bf16(dq16, dq.data(), int64_t(dq.size()));
    to_bf16(dk16, dk.data(), int64_t(dk.size()));
    to_bf16(dv16, dv.data(), int64_t(dv.size()));
  }

  void attention_forward_fp8_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                                  const uint16_t* k16, const uint16_t* v16, int64_t B, int64_t T,
                                  int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_forward_fp8_bf16");
    forward_on_codes(out16, q16, k16, v16, B, T, H, KV, D,
                     [&](float* out, const float* q, const float* k, const float* v) {
                       attention_forward_fp8(out, lse, q, k, v, B, T, H, KV, D);
                     });
  }

  void attention_backward_fp8_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                    const uint16_t* dout16, const uint16_t* q16,
                                    const uint16_t* k16, const uint16_t* v16,
                                    const uint16_t* out16, const float* lse, int64_t B, int64_t T,
                                    int64_t H, int64_t KV, int64_t D) override {
    OpScope scope(*this, "attention_backward_fp8_codes");
    const int64_t nq = B * T * H * D, nk = B * T * KV * D;
    const std::vector<float> q = widened(q16, nq), k = widened(k16, nk), v = widened(v16, nk),
                             o = widened(out16, nq), dout = widened(dout16, nq);
    std::vector<float> dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nk)),
        dv(static_cast<size_t>(nk));
    attention_backward_fp8(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                           v.data(), o.data(), lse, B, T, H, KV, D);
    to_bf16(dq16, dq.data(), nq);
    to_bf16(dk16, dk.data(), nk);
    to_bf16(dv16, dv.data(), nk);
  }

  void rope_backward_bf16(uint16_t* dx16, const float* cos, const float* sin, int64_t B,
                          int64_t T, int64_t heads, int64_t D) override {
    OpScope scope(*this, "rope_backward_bf16");
    std::vector<float> dx = widened(dx16, B * T * heads * D);
    rope_backward(dx.data(), cos, sin, B, T, heads, D);
    to_bf16(dx16, dx.data(), int64_t(dx.size()));
  }

  // The bf16 forms' attention forward: q, k, v widened (exact), the fp32 op `fwd` (out, q, k,
  // v; it writes lse itself), out rounded.
  template <typename Fwd>
  void forward_on_codes(uint16_t* out16, const uint16_t* q16, const uint16_t* k16,
                        const uint16_t* v16, int64_t B, int64_t T, int64_t H, int64_t KV,
                        int64_t D, Fwd&& fwd) {
    const std::vector<float> q = widened(q16, B * T * H * D), k = widened(k16, B * T * KV * D),
                             v = widened(v16, B * T * KV * D);
    std::vector<float> out(q.size());
    fwd(out.data(), q.data(), k.data(), v.data());
    to_bf16(out16, out.data(), int64_t(out.size()));
  }

  std::vector<float> widened(const uint16_t* codes, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    unpack_bf16(x.data(), codes, n);
    return x;
  }

  void unpack_bf16(float* x, const uint16_t* codes, int64_t n) override {
    OpScope scope(*this, "unpack_bf16");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = numerics::decode_bf16(codes[i]);
  }

  void add(float* y, const float* a, const float* b, int64_t n) override {
    OpScope scope(*this, "add");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }

  double sum_squares(const float* x, int64_t n) override {
    OpScope scope(*this, "sum_squares");
    double s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
    return s;
  }

  void scale(float* x, float s, int64_t n) override {
    OpScope scope(*this, "scale");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] *= s;
  }

  void fill(float* x, float value, int64_t n) override {
    OpScope scope(*this, "fill");
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] = value;
  }

  void copy(float* dst, const float* src, int64_t n) override {
    OpScope scope(*this, "copy");
    std::memcpy(dst, src, sizeof(float) * n);
  }

  void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay, int64_t t,
             float grad_scale, uint16_t* codes = nullptr) override {
    OpScope scope(*this, "adamw");
    // torch.optim.AdamW (single-tensor path): p *= 1 - lr wd; m, v updated;
    // p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps).
    const float bc1 = 1.0f - std::pow(beta1, float(t));
    const float bc2_sqrt = std::sqrt(1.0f - std::pow(beta2, float(t)));
    const float step_size = lr / bc1;
    const float decay = 1.0f - lr * weight_decay;
    parallel_chunks(n, [&](int64_t i0, int64_t i1) {
      cpu::adamw_span(param + i0, grad + i0, m + i0, v + i0, i1 - i0, beta1, beta2, eps, decay,
                      step_size, bc2_sqrt, grad_scale);
      if (codes)
        for (int64_t i = i0; i < i1; ++i) codes[i] = numerics::encode_bf16(param[i]);
    });
  }

 private:
  numerics::AttnFp8Amax attn_amax_;  // the last FP8 attention calls' (attention_fp8_amax)
  float head_grad_amax_ = 0;  // the last FP8 head gradient's (head_fp8_grad_amax)
  std::unique_ptr<CountedHostMemory> test_memory_;
  bool plain_ = false;
  bool bf16_gemm_ = false;  // set_bf16_gemm_operands under MXTRAIN_TEST_BF16_GEMM
  bool profiling_ = false;
  OpProfile profile_;
  void op_begin(const char* op) override {
    if (profiling_) profile_.begin(op, stats_.flops);
  }
  void op_end() override {
    if (profiling_) profile_.end(stats_.flops);
  }
  // One GEMM on all threads, split by hand: each OpenMP thread computes a contiguous block of
  // C's rows (or columns, when C is wider than tall) with a single-threaded OpenBLAS call
  // (OpenBLAS's OpenMP build runs single-threaded inside a parallel region). OpenBLAS's own
  // threading shares packed panels between threads and synchronizes on them several times per
  // call; the split here joins once, and each thread packs its own copy of the shared operand,
  // which costs 1/M of the arithmetic. Measured on the 2-core bench machine while other processes
  // shared it (wall time, best of 12, /tmp microbenchmark of the MLP's 2048x1536x512 GEMMs): the
  // split was faster in 12 of 14 paired trials (forward and backward pairs), by up to 1.6x; not
  // yet measured on an idle machine.
  static void split_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const float* A, const float* B, float beta, float* C) {
    const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N, ldc = N;
    auto call = [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
      // Row block [m0, m1) of op(A) and column block [n0, n1) of op(B).
      const float* a = trans_a ? A + m0 : A + m0 * lda;
      const float* b = trans_b ? B + n0 * ldb : B + n0;
      cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                  trans_b ? CblasTrans : CblasNoTrans, int(m1 - m0), int(n1 - n0), int(K), alpha,
                  a, int(lda), b, int(ldb), beta, C + m0 * ldc + n0, int(ldc));
    };
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    // Below ~8 MFLOP a parallel region costs more than it saves.
    if (threads <= 1 || 2.0 * double(M) * double(N) * double(K) < 8e6) return call(0, M, 0, N);
    const bool by_rows = M >= N;
    const int64_t extent = by_rows ? M : N;
#pragma omp parallel num_threads(threads)
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      // Block edges on multiples of 16 (the micro-kernel's height/width), the last block ends at
      // the extent.
      const int64_t e0 = extent * t / nt / 16 * 16;
      const int64_t e1 = t + 1 == nt ? extent : extent * (t + 1) / nt / 16 * 16;
      if (e1 > e0) {
        if (by_rows)
          call(e0, e1, 0, N);
        else
          call(0, M, e0, e1);
      }
    }
  }

  static void rope(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t heads, int64_t D, float sign) {
    const int64_t half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const float* c = cos + t * half;
        const float* s = sin + t * half;
        for (int64_t h = 0; h < heads; ++h) {
          float* xr = x + ((b * T + t) * heads + h) * D;
          for (int64_t i = 0; i < half; ++i) {
            float x1 = xr[i], x2 = xr[i + half], si = sign * s[i];
            xr[i] = x1 * c[i] - x2 * si;
            xr[i + half] = x2 * c[i] + x1 * si;
          }
        }
      }
  }

  // Splits [0, n) into one contiguous chunk per thread (vector loops inside stay aligned).
  template <typename F>
  static void parallel_chunks(int64_t n, F&& body) {
#pragma omp parallel
    {
      const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      int64_t i0 = n * t / nt / 8 * 8, i1 = t + 1 == nt ? n : n * (t + 1) / nt / 8 * 8;
      if (i1 > i0) body(i0, i1);
    }
  }

  GemmStats stats_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }
std::unique_ptr<Backend> make_host_backend() { return std::make_unique<CpuBackend>(true); }

}  // namespace mx
