// Vectorized exp for the CPU backend's softmax-like loops (attention, cross-entropy, SwiGLU).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mx::cpu {

// exp in plain arithmetic on GCC vector extensions (8 floats: one AVX register, or two SSE/NEON
// halves). libm's expf is scalar, and a loop calling a hand-written exp with range clamps does not
// vectorize either (the clamps are float compares, which -ftrapping-math keeps as branches); the
// scalar exp took ~30% of the time at D = 64. Cephes expf: range reduction by a split ln 2,
// degree-6 polynomial, exponent placed by integer arithmetic; about 1 ulp on [-87, 88]. Inputs
// below -87 give ~1e-38 instead of 0, invisible next to the row's maximum term exp(0) = 1.
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));

inline vf8 splat(float x) { return vf8{} + x; }

// The widest vector this build's CPU holds in one register: 16 floats with AVX-512, else 8.
#if defined(__AVX512F__)
typedef float vfw __attribute__((vector_size(64)));
typedef int32_t viw __attribute__((vector_size(64)));
#else
typedef vf8 vfw;
typedef vi8 viw;
#endif
constexpr int kVecWidth = sizeof(vfw) / sizeof(float);

// exp_fast on 8 floats (vf8) or on kVecWidth (vfw): per element the same operations, the same bits.
template <class V, class VI = std::conditional_t<sizeof(V) == sizeof(vf8), vi8, viw>>
inline V exp_fast(V x) {
  const V lo = V{} - 87.0f, hi = V{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  // Round to nearest by the 1.5 * 2^23 shift (exact in float, no floor call needed).
  const V n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  V r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * (r * r) + r + 1.0f;
  const VI bits = (__builtin_convertvector(n, VI) + 127) << 23;  // 2^n, n in [-126, 127]
  V two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return y * two_n;
}

// Correctly rounded square root of 8 floats (vsqrtps: the same bits as std::sqrt per element).
// std::sqrt in a loop stays scalar (a call to sqrtf for the errno of negative inputs).
inline vf8 sqrt8(vf8 x) {
#if defined(__AVX__)
  return __builtin_ia32_sqrtps256(x);
#else
  for (int i = 0; i < 8; ++i) x[i] = __builtin_sqrtf(x[i]);
  return x;
#endif
}

// torch.optim.AdamW on n elements (see Backend::adamw), 8 at a time; decay = 1 - lr * wd,
// step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t), the gradient grad * grad_scale.
// Same operations in the same order as the scalar formula, so the same bits.
inline void adamw_span(float* param, const float* grad, float* m, float* v, int64_t n,
                       float beta1, float beta2, float eps, float decay, float step_size,
                       float bc2_sqrt, float grad_scale) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    vf8 g, mi, vi, p;
    std::memcpy(&g, grad + i, sizeof g);
    g = g * grad_scale;
    std::memcpy(&mi, m + i, sizeof mi);
    std::memcpy(&vi, v + i, sizeof vi);
    std::memcpy(&p, param + i, sizeof p);
    mi = beta1 * mi + (1.0f - beta1) * g;
    vi = beta2 * vi + (1.0f - beta2) * g * g;
    p = p * decay;
    p = p - step_size * mi / (sqrt8(vi) / bc2_sqrt + eps);
    std::memcpy(m + i, &mi, sizeof mi);
    std::memcpy(v + i, &vi, sizeof vi);
    std::memcpy(param + i, &p, sizeof p);
  }
  for (; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    const float p = param[i] * decay;
    param[i] = p - step_size * mi / (__builtin_sqrtf(vi) / bc2_sqrt + eps);
  }
}

// x[c] = exp(x[c] - shift) for c < n; returns the sum of the new x[0..n). kVecWidth at a time
// (attention's softmax rows and the head's cross-entropy rows: twice as fast with AVX-512).
inline float exp_row(float* x, int64_t n, float shift) {
  constexpr int W = kVecWidth;
  vfw acc{};
  int64_t c = 0;
  for (; c + W <= n; c += W) {
    vfw v;
    std::memcpy(&v, x + c, sizeof v);
    v = exp_fast(v - shift);
    std::memcpy(x + c, &v, sizeof v);
    acc += v;
  }
  float sum = 0.0f;
  for (int i = 0; i < W; ++i) sum += acc[i];
  if (c < n) {  // tail of 1..W-1 through one padded vector
    const int64_t rem = n - c;
    vfw v{};
    std::memcpy(&v, x + c, static_cast<size_t>(rem) * sizeof(float));
    v = exp_fast(v - shift);
    std::memcpy(x + c, &v, static_cast<size_t>(rem) * sizeof(float));
    for (int64_t i = 0; i < rem; ++i) sum += v[i];
  }
  return sum;
}

// y[i] = silu(g[i]) * u[i] (u == nullptr: silu(g[i])), 8 at a time through exp_fast.
inline void silu_mul(float* y, const float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    vf8 gv, uv = splat(1.0f);
    std::memcpy(&gv, g + i, sizeof gv);
    if (u) std::memcpy(&uv, u + i, sizeof uv);
    const vf8 y8 = gv / (1.0f + exp_fast(-gv)) * uv;
    std::memcpy(y + i, &y8, sizeof y8);
  }
  for (; i < n; ++i) {
    vf8 gv = splat(g[i]);
    const float s = (gv / (1.0f + exp_fast(-gv)))[0];
    y[i] = s * (u ? u[i] : 1.0f);
  }
}

// SwiGLU backward, vectorized: du = ds * silu(g); dg = ds * u * sig * (1 + g * (1 - sig)).
// dg may alias ds.
inline void silu_mul_backward(float* dg, float* du, const float* ds, const float* g,
                              const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    vf8 gv, uv, dsv;
    std::memcpy(&gv, g + i, sizeof gv);
    std::memcpy(&uv, u + i, sizeof uv);
    std::memcpy(&dsv, ds + i, sizeof dsv);
    const vf8 sig = 1.0f / (1.0f + exp_fast(-gv));
    const vf8 du8 = dsv * gv * sig;
    const vf8 dg8 = dsv * uv * sig * (1.0f + gv * (1.0f - sig));
    std::memcpy(du + i, &du8, sizeof du8);
    std::memcpy(dg + i, &dg8, sizeof dg8);
  }
  for (; i < n; ++i) {
    vf8 gv = splat(g[i]);
    const float sig = (1.0f / (1.0f + exp_fast(-gv)))[0];
    const float dsi = ds[i];
    du[i] = dsi * g[i] * sig;
    dg[i] = dsi * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

}  // namespace mx::cpu
