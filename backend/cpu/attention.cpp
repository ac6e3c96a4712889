// Causal GQA attention, FlashAttention-2 on the CPU: a query tile (kBr positions of all the query
// heads that share one kv head, stacked into group * kBr rows) meets the key tiles (kBc rows) at
// or before it; each tile product runs single-threaded on the calling OpenMP thread (tile_gemm
// for the products with a row-major left operand: Q K^T, P V, dO V^T, dS K; for the two with a
// transposed one, P^T dO and dS^T Q, tile_gemm_at with AVX-512, else OpenBLAS sgemm), and
// softmax runs as an online (running max, running sum) pass in forward and as a recomputation
// P = exp(S - lse) in backward. Workspace is per thread and O(group * tile * D), plus one
// transposed copy of K (and of V in backward), the size of K.
#include "backend/cpu/attention.h"
#include "backend/cpu/tile_gemm.h"
#include "backend/cpu/vec_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "numerics/attention_fp8.h"
#include "numerics/quantize.h"

namespace mx::cpu {
namespace {

// 128 x 128 tiles: large enough that OpenBLAS's per-call packing is amortized (its rate on these
// shapes levels off near 128), small enough that a score tile (64 KiB) and the operand panels stay
// in a 512 KiB L2. Measured on Zen 3 with OpenBLAS 0.3.21: 256-wide tiles were no faster at
// T = 2048, and they waste more on the masked half of diagonal tiles at short T.
constexpr int64_t kBr = 128;  // query rows per tile
constexpr int64_t kBc = 128;  // key rows per tile

// Number of keys of a key tile starting at j0 (bc keys) that query t may attend: keys j <= t.
inline int64_t allowed_keys(int64_t t, int64_t j0, int64_t bc) {
  return std::clamp<int64_t>(t - j0 + 1, 0, bc);
}

// Row-major sgemm, C = alpha * op(A) op(B) + beta * C, with int64 sizes narrowed for CBLAS.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb),
              beta, c, static_cast<int>(ldc));
}

// C = beta C + alpha A B (A, B row-major) through tile_gemm when n is a multiple of 16,
// otherwise through OpenBLAS.
inline void tile_product(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                         int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                         int64_t ldc, float* panel) {
  if (n % 16 == 0) return tile_gemm(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, panel);
  gemm(false, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// C = beta C + alpha A^T B (A stored [k x m]): tile_gemm_at where it beats OpenBLAS (AVX-512)
// and n is a multiple of 16, otherwise OpenBLAS.
inline void tile_product_at(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                            int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc, float* panel) {
  if (kTileGemmTransposedAFast && n % 16 == 0)
    return tile_gemm_at(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, panel);
  gemm(true, false, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// xt[((b * KV + g) * D + d) * T + t] = x[((b * T + t) * KV + g) * D + d]: each kv head's keys (or
// values) as a [D, T] matrix, so that Q K^T and dO V^T are plain row-major products over it.
std::vector<float> transpose_kv(const float* x, int64_t B, int64_t T, int64_t KV, int64_t D) {
  std::vector<float> xt(static_cast<size_t>(B * KV * D * T));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bg = 0; bg < B * KV; ++bg)
    for (int64_t t0 = 0; t0 < T; t0 += 64) {
      const int64_t b = bg / KV, g = bg % KV, t1 = std::min(T, t0 + 64);
      for (int64_t d = 0; d < D; ++d) {
        float* dst = xt.data() + (bg * D + d) * T;
        for (int64_t t = t0; t < t1; ++t) dst[t] = x[((b * T + t) * KV + g) * D + d];
      }
    }
  return xt;
}

void check_shape(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  MX_ASSERT(B >= 0 && T >= 0 && H > 0 && KV > 0 && D > 0, "B=", B, " T=", T, " H=", H,
            " KV=", KV, " D=", D);
  MX_ASSERT(H % KV == 0, "H=", H, " KV=", KV);
  // CBLAS takes int leading dimensions and sizes.
  MX_ASSERT(H * D <= std::numeric_limits<int>::max(), "H*D=", H * D);
}

}  // namespace

// The query heads of one group share their keys and values, so a task takes the tile's rows of
// all `group` heads at once: they are copied into one [group * br, D] block (row = head-major,
// then position), which doubles (at group 2) the height of every tile GEMM and packs each key
// and value tile once per group instead of once per head.
namespace {

// dst[(hh * br + r) * D + d] = src[(i0 + r) * ld + hh * D + d] for hh < group, r < br, where src
// points at the group's first head of position 0 of the sequence.
void gather_rows(float* dst, const float* src, int64_t ld, int64_t i0, int64_t br, int64_t group,
                 int64_t D) {
  for (int64_t hh = 0; hh < group; ++hh)
    for (int64_t r = 0; r < br; ++r)
      std::memcpy(dst + (hh * br + r) * D, src + (i0 + r) * ld + hh * D,
                  static_cast<size_t>(D) * sizeof(float));
}

}  // namespace

namespace {

// prob_scale > 0 (FP8 attention's twin): out = sum_j P8_ij v_j with the normalized
// probabilities P_ij = exp(S_ij - lse_i) rounded to E4M3 at that scale (numerics::
// attn_fp8_round), which needs lse first: each task then runs its key tiles twice, the first
// time for the row maximum and sum only, the second for P8 and the product. Otherwise the
// online softmax above (one pass).
void forward_impl(float* out, float* lse, const float* q, const float* k, const float* v,
                  int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, float prob_scale,
                  float* prob_amax = nullptr) {
  check_shape(B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_ld = H * D;    // stride between consecutive positions of one query head
  const int64_t kv_ld = KV * D;  // same for one kv head
  const int64_t n_tiles = (T + kBr - 1) / kBr;
  const int64_t n_tasks = B * KV * n_tiles;
  const int64_t rows_max = group * kBr;
  const std::vector<float> kt = transpose_kv(k, B, T, KV, D);

#pragma omp parallel
  {
    std::vector<float> qs(static_cast<size_t>(rows_max * D));   // the group's query rows
    std::vector<float> s(static_cast<size_t>(rows_max * kBc));  // scores, then probabilities
    std::vector<float> o(static_cast<size_t>(rows_max * D));    // unnormalized output
    std::vector<float> m(rows_max), l(rows_max);                // running row max and row sum
    std::vector<float> panel(static_cast<size_t>(tile_gemm_panel_floats(std::max(D, kBc))));
    float pmax = 0.0f;  // (FP8: this thread's largest probability)

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; ++task) {
      // The last query tiles see the most keys: hand them out first so the schedule's tail is
      // made of cheap tiles.
      const int64_t it = n_tiles - 1 - task % n_tiles;
      const int64_t bg = task / n_tiles;
      const int64_t b = bg / KV, g = bg % KV;
      const int64_t i0 = it * kBr, br = std::min(kBr, T - i0), rows = group * br;
      const float* ktb = kt.data() + (b * KV + g) * D * T;  // this kv head's keys as [D, T]
      const float* vb = v + (b * T * KV + g) * D;  // value j of this kv head at vb + j * kv_ld
      gather_rows(qs.data(), q + (b * T * H + g * group) * D, q_ld, i0, br, group, D);

      std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      std::fill(o.begin(), o.begin() + rows * D, 0.0f);

      for (int64_t j0 = 0; j0 < i0 + br; j0 += kBc) {  // key tiles with at least one allowed key
        const int64_t bc = std::min(kBc, T - j0);
        float* st = s.data();
        tile_product(rows, bc, D, scale, qs.data(), D, ktb + j0, T, 0.0f, st, bc, panel.data());
        const bool diagonal = j0 + bc - 1 > i0;  // some key of the tile is after some query
        for (int64_t row = 0; row < rows; ++row) {
          float* sr = st + row * bc;
          const int64_t n = diagonal ? allowed_keys(i0 + row % br, j0, bc) : bc;
          if (n > 0) {
            float tile_max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : tile_max)
            for (int64_t c = 0; c < n; ++c) tile_max = sr[c] > tile_max ? sr[c] : tile_max;
            const float m_new = std::max(m[row], tile_max);
            const float sum = exp_row(sr, n, m_new);
            // First tile: m = -inf gives alpha = 0 against l = 0 and o = 0.
            const float alpha = std::exp(m[row] - m_new);
            l[row] = l[row] * alpha + sum;
            m[row] = m_new;
            if (alpha != 1.0f) {
              float* orow = o.data() + row * D;
#pragma omp simd
              for (int64_t d = 0; d < D; ++d) orow[d] *= alpha;
            }
          }
          std::fill(sr + n, sr + bc, 0.0f);  // masked keys contribute nothing to P V
        }
        if (prob_scale > 0.0f) continue;  // (the product comes in the second pass)
        tile_product(rows, D, bc, 1.0f, st, bc, vb + j0 * kv_ld, kv_ld, 1.0f, o.data(), D,
                     panel.data());
      }

      if (prob_scale > 0.0f) {  // second pass: P8 from the final lse, then P8 V
        for (int64_t row = 0; row < rows; ++row) m[row] += std::log(l[row]), l[row] = 1.0f;
        for (int64_t j0 = 0; j0 < i0 + br; j0 += kBc) {
          const int64_t bc = std::min(kBc, T - j0);
          float* st = s.data();
          tile_product(rows, bc, D, scale, qs.data(), D, ktb + j0, T, 0.0f, st, bc,
                       panel.data());
          const bool diagonal = j0 + bc - 1 > i0;
          for (int64_t row = 0; row < rows; ++row) {
            float* sr = st + row * bc;
            const int64_t n = diagonal ? allowed_keys(i0 + row % br, j0, bc) : bc;
            exp_row(sr, n, m[row]);
            for (int64_t c = 0; c < n; ++c) {
              pmax = std::max(pmax, sr[c]);
              sr[c] = numerics::attn_fp8_round(sr[c], prob_scale, false);
            }
            std::fill(sr + n, sr + bc, 0.0f);
          }
          tile_product(rows, D, bc, 1.0f, st, bc, vb + j0 * kv_ld, kv_ld, 1.0f, o.data(), D,
                       panel.data());
        }
        // m now holds lse and l 1: the loop below writes o as it is and lse = m + log 1 = m
      }

      for (int64_t row = 0; row < rows; ++row) {
        const int64_t h = g * group + row / br, t = i0 + row % br;
        // Every row attends key 0, so l >= 1 (its maximum term is exp(0)).
        const float inv = 1.0f / l[row];
        const float* orow = o.data() + row * D;
        float* dst = out + ((b * T + t) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = orow[d] * inv;
        lse[(b * H + h) * T + t] = m[row] + std::log(l[row]);
      }
    }
    if (prob_amax) {
#pragma omp critical(mx_attention_prob_amax)
      *prob_amax = std::max(*prob_amax, pmax);
    }
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  forward_impl(out, lse, q, k, v, B, T, H, KV, D, 0.0f);
}

namespace {

// fp8 (FP8 attention's twin, q, k, v, out and dout already rounded by the caller): P rounded to
// E4M3 at fp8->prob for dV's product, and dS to E5M2 at fp8->ds before dQ's and dK's.
struct Fp8Backward {
  float prob, ds;
  float* ds_amax;  // receives max |dS| before its rounding
};

void backward_impl(float* dq, float* dk, float* dv, const float* dout, const float* q,
                   const float* k, const float* v, const float* out, const float* lse, int64_t B,
                   int64_t T, int64_t H, int64_t KV, int64_t D, const Fp8Backward* fp8) {
  check_shape(B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  const int64_t group = H / KV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t q_ld = H * D;
  const int64_t kv_ld = KV * D;
  const int64_t n_tiles = (T + kBr - 1) / kBr;
  const int64_t n_tasks = B * KV;
  const int64_t rows_max = group * kBr;
  const std::vector<float> kt = transpose_kv(k, B, T, KV, D);
  const std::vector<float> vt = transpose_kv(v, B, T, KV, D);

#pragma omp parallel
  {
    std::vector<float> qs(static_cast<size_t>(rows_max * D));    // the group's query rows
    std::vector<float> dos(static_cast<size_t>(rows_max * D));   // their output gradients
    std::vector<float> dqs(static_cast<size_t>(rows_max * D));   // their dq, accumulated
    std::vector<float> p(static_cast<size_t>(rows_max * kBc));   // scores, then probabilities P
    std::vector<float> dp(static_cast<size_t>(rows_max * kBc));  // dP = dO V^T, then dS
    std::vector<float> p8(fp8 ? static_cast<size_t>(rows_max * kBc) : 0);  // P rounded (fp8)
    float ds_max = 0.0f;  // (FP8: this thread's largest |dS|)
    std::vector<float> di(rows_max);                              // rowsum(dO * O)
    std::vector<float> lse_rows(rows_max);
    // tile_gemm's B panel; k is up to rows_max for the transposed products
    std::vector<float> panel(
        static_cast<size_t>(tile_gemm_panel_floats(std::max({D, kBc, rows_max}))));

    // One task owns a (batch, kv head): its dk and dv rows, and the dq rows of the group's
    // query heads, so every accumulation below is race-free without atomics or reductions.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < n_tasks; ++task) {
      const int64_t b = task / KV, g = task % KV;
      const float* kb = k + (b * T * KV + g) * D;
      const float* ktb = kt.data() + (b * KV + g) * D * T;  // [D, T]
      const float* vtb = vt.data() + (b * KV + g) * D * T;
      float* dkb = dk + (b * T * KV + g) * D;
      float* dvb = dv + (b * T * KV + g) * D;
      const int64_t head0 = (b * T * H + g * group) * D;  // the group's first head, position 0
      for (int64_t t = 0; t < T; ++t) {
        std::memset(dkb + t * kv_ld, 0, static_cast<size_t>(D) * sizeof(float));
        std::memset(dvb + t * kv_ld, 0, static_cast<size_t>(D) * sizeof(float));
      }

      for (int64_t it = 0; it < n_tiles; ++it) {
        const int64_t i0 = it * kBr, br = std::min(kBr, T - i0), rows = group * br;
        gather_rows(qs.data(), q + head0, q_ld, i0, br, group, D);
        gather_rows(dos.data(), dout + head0, q_ld, i0, br, group, D);
        std::fill(dqs.begin(), dqs.begin() + rows * D, 0.0f);
        for (int64_t row = 0; row < rows; ++row) {
          const int64_t h = g * group + row / br, t = i0 + row % br;
          const float* a = dos.data() + row * D;
          const float* o = out + ((b * T + t) * H + h) * D;
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += a[d] * o[d];
          di[row] = acc;
          lse_rows[row] = lse[(b * H + h) * T + t];
        }

        for (int64_t j0 = 0; j0 < i0 + br; j0 += kBc) {
          const int64_t bc = std::min(kBc, T - j0);
          const float* kj = kb + j0 * kv_ld;  // the key tile, [bc, D] with stride kv_ld
          float* pt = p.data();
          float* dpt = dp.data();
          tile_product(rows, bc, D, scale, qs.data(), D, ktb + j0, T, 0.0f, pt, bc, panel.data());
          const bool diagonal = j0 + bc - 1 > i0;
          for (int64_t row = 0; row < rows; ++row) {
            float* pr = pt + row * bc;
            const int64_t n = diagonal ? allowed_keys(i0 + row % br, j0, bc) : bc;
            exp_row(pr, n, lse_rows[row]);
            std::fill(pr + n, pr + bc, 0.0f);
          }
          // dV_j += P^T dO_i (FP8: P rounded to E4M3, as the forward's P V reads it)
          const float* pv = pt;
          if (fp8) {
            for (int64_t i = 0; i < rows * bc; ++i)
              p8[i] = numerics::attn_fp8_round(pt[i], fp8->prob, false);
            pv = p8.data();
          }
          tile_product_at(bc, D, rows, 1.0f, pv, bc, dos.data(), D, 1.0f, dvb + j0 * kv_ld,
                          kv_ld, panel.data());
          // dP = dO_i V_j^T, then dS = P * (dP - Di) in place (masked P = 0 gives dS = 0).
          tile_product(rows, bc, D, 1.0f, dos.data(), D, vtb + j0, T, 0.0f, dpt, bc, panel.data());
          for (int64_t row = 0; row < rows; ++row) {
            const float* pr = pt + row * bc;
            float* dsr = dpt + row * bc;
            const float dr = di[row];
#pragma omp simd
            for (int64_t c = 0; c < bc; ++c) dsr[c] = pr[c] * (dsr[c] - dr);
            if (fp8)
              for (int64_t c = 0; c < bc; ++c) {
                ds_max = std::max(ds_max, std::fabs(dsr[c]));
                dsr[c] = numerics::attn_fp8_round(dsr[c], fp8->ds, true);
              }
          }
          // dQ_i += scale * dS K_j;  dK_j += scale * dS^T Q_i
          tile_product(rows, D, bc, scale, dpt, bc, kj, kv_ld, 1.0f, dqs.data(), D, panel.data());
          tile_product_at(bc, D, rows, scale, dpt, bc, qs.data(), D, 1.0f, dkb + j0 * kv_ld,
                          kv_ld, panel.data());
        }
        for (int64_t row = 0; row < rows; ++row)  // the tile's dq rows, written once
          std::memcpy(dq + head0 + (i0 + row % br) * q_ld + (row / br) * D,
                      dqs.data() + row * D, static_cast<size_t>(D) * sizeof(float));
      }
    }
    if (fp8 && fp8->ds_amax) {
#pragma omp critical(mx_attention_ds_amax)
      *fp8->ds_amax = std::max(*fp8->ds_amax, ds_max);
    }
  }
}

}  // namespace

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  backward_impl(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, KV, D, nullptr);
}

namespace {

// x[i] = numerics::attn_fp8_round(x[i], scale, e5m2) over n values; fp8_rounded: on a copy.
void fp8_round_in_place(float* x, int64_t n, float scale, bool e5m2) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = numerics::attn_fp8_round(x[i], scale, e5m2);
}
std::vector<float> fp8_rounded(const float* src, int64_t n, float scale, bool e5m2) {
  std::vector<float> dst(src, src + n);
  fp8_round_in_place(dst.data(), n, scale, e5m2);
  return dst;
}

}  // namespace

void attention_forward_fp8(float* out, float* lse, const float* q, const float* k,
                           const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                           int64_t D, numerics::AttnFp8Amax* amax) {
  check_shape(B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  const int64_t nq = B * T * H * D, nk = B * T * KV * D;
  const float aq = numerics::abs_max(q, nq), ak = numerics::abs_max(k, nk),
              av = numerics::abs_max(v, nk);
  const auto sc = numerics::attn_fp8_forward_scales(aq, ak, av);
  const auto qd = fp8_rounded(q, nq, sc.q, false), kd = fp8_rounded(k, nk, sc.k, false),
             vd = fp8_rounded(v, nk, sc.v, false);
  float pmax = 0.0f;
  forward_impl(out, lse, qd.data(), kd.data(), vd.data(), B, T, H, KV, D, sc.s, &pmax);
  if (amax) *amax = {aq, ak, av, pmax, numerics::abs_max(out, nq)};
  fp8_round_in_place(out, nq, sc.o, false);
}

void attention_backward_fp8(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, const float* out, const float* lse,
                            int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                            numerics::AttnFp8Amax* amax) {
  check_shape(B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  const int64_t nq = B * T * H * D, nk = B * T * KV * D;
  const float aq = numerics::abs_max(q, nq), ak = numerics::abs_max(k, nk),
              av = numerics::abs_max(v, nk), ado = numerics::abs_max(dout, nq);
  const auto sc = numerics::attn_fp8_forward_scales(aq, ak, av);
  const auto bs = numerics::attn_fp8_backward_scales(aq, ak, av, ado, D, T * (H / KV),
                                                     1.0f / std::sqrt(static_cast<float>(D)));
  const auto qd = fp8_rounded(q, nq, sc.q, false), kd = fp8_rounded(k, nk, sc.k, false),
             vd = fp8_rounded(v, nk, sc.v, false), od = fp8_rounded(out, nq, sc.o, false),
             dod = fp8_rounded(dout, nq, bs.dO, true);
  float ds_max = 0.0f;
  const Fp8Backward fp8{sc.s, bs.dP, &ds_max};
  backward_impl(dq, dk, dv, dod.data(), qd.data(), kd.data(), vd.data(), od.data(), lse, B, T, H,
                KV, D, &fp8);
  if (amax) {
    amax->q = aq, amax->k = ak, amax->v = av, amax->dO = ado, amax->dS = ds_max;
    amax->dQ = numerics::abs_max(dq, nq);
    amax->dK = numerics::abs_max(dk, nk);
    amax->dV = numerics::abs_max(dv, nk);
  }
  fp8_round_in_place(dq, nq, bs.dQ, true);
  fp8_round_in_place(dk, nk, bs.dK, true);
  fp8_round_in_place(dv, nk, bs.dV, true);
}

}  // namespace mx::cpu
