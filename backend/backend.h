// The op interface. Model, trainer and (later) FSDP code call only these; the CPU backend is the
// reference every other backend is tested against. Pointers are to the backend's memory; sizes
// are spelled out (llm.c style). Layouts are row-major:
//   activations [N, C] with N = B*T tokens; q [B, T, H, D]; k, v [B, T, KV, D];
//   Linear weights [out, in] as in Hugging Face (y = x W^T).
// Backward ops ACCUMULATE into parameter gradients (dw += ...) so that gradient accumulation
// and tied weights need no extra buffers; activation gradients are written unless noted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numerics/attention_fp8.h"
#include "backend/op_profile.h"
#include "core/arena.h"
#include "numerics/formats.h"
#include "numerics/quantize.h"

namespace mx {

// The output head's GEMM operands (Backend::head_cross_entropy; docs/numerics.md, "FP8 head"):
//   kFp32: as they are.
//   kBf16: the head of a low-precision run (precision.high_precision = bf16): every operand of
//     the three GEMMs (h, W and the logits' gradient) rounded to bf16 (RNE), products summed in
//     fp32, as torch autocast runs an lm_head. CUDA: bf16 copies and bf16 GEMMs (the
//     cross-entropy kernel writes the gradient's copy); the CPU: fp32 copies of the rounded
//     values, fp32 GEMMs (exact products, fp32 sums).
//   kFp8: precision.fp8_head: h and W in E4M3 at current per-tensor scales over the whole
//     tensor (numerics::fp8_scale_from_amax of max|h| over all N rows, of max|W|), the logits'
//     gradient in E5M2 at the scale current scaling gives its bound, |grad_scale| (every
//     element is grad_scale (softmax - onehot), at most |grad_scale| in magnitude; SATFINITE
//     catches an fp32 rounding above it), so the result does not depend on the chunking. CUDA
//     with FP8 tensor cores: FP8 codes and per-tensor FP8 GEMMs (both operands K-major, so W,
//     h and the gradient also in transposed copies); elsewhere, and on the CPU, fp32 copies of
//     the rounded values and fp32 GEMMs, as the emulated recipes run.
//   kFp8Bf16Dgrad: precision.fp8_head with precision.fp8_head_dgrad = bf16 (the default): the
//     logits and the weight gradient as kFp8, the data gradient dh = g W as kBf16 from bf16
//     roundings of the fp32 logits gradient and of W (the gradient that reaches every block).
//     CUDA: W's FP8 codes row-major only, its bf16 copy, the gradient's E5M2 codes and bf16
//     copy from the cross-entropy kernel, two FP8 GEMMs and a bf16 one.
enum class HeadOperands : uint8_t { kFp32, kBf16, kFp8, kFp8Bf16Dgrad };
// Whether the head's logits and weight gradient run on FP8 operands (kFp8, kFp8Bf16Dgrad).
inline bool head_is_fp8(HeadOperands o) {
  return o == HeadOperands::kFp8 || o == HeadOperands::kFp8Bf16Dgrad;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- Memory ---------------------------------------------------------------------------------
  // The buffers the ops take (parameters, gradients, optimizer state, activations) live in the
  // backend's memory: host memory on the CPU, device memory on CUDA. Host code (the trainer,
  // FSDP's scatter/gather, checkpoint staging, the recipes' host quantizers) never dereferences
  // them directly when host_addressable() is false: it goes through the copy calls below, which
  // on the CPU are memcpy / memset, so the CPU tests run the same staging code.
  // MXTRAIN_TEST_STAGING=1 makes the CPU backend report false (tests of the staging paths).
  virtual bool host_addressable() const;
  // Where arenas for this backend's buffers get their bytes (null: host memory).
  // MXTRAIN_TEST_DEVICE_MEMORY=1 makes the CPU backend hand out host memory through a
  // MemoryResource, so the CPU runs the device-memory code paths (arenas allocated through it,
  // the head's device-sized chunks) and reports what a GPU run would allocate (tests of the
  // plan's accounting of the CUDA engine).
  virtual MemoryResource* memory() { return nullptr; }
  // Byte copies between host memory and the backend's memory; both complete before returning
  // (the host buffer may be reused at once).
  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes);
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes);
  // The device's product name ("NVIDIA H200"; "" on the CPU): the trainer takes its MFU
  // denominator from the datasheet table (plan/gpus.h) when it knows the GPU.
  virtual std::string device_name() const { return ""; }
  // run.deterministic: from here on, every op gives the same bits for the same inputs run to
  // run. Called before the first op. Returns what it changed, for the start-up log. The CPU
  // backend's ops already do (fixed partitions and reduction orders, no atomics): it changes
  // nothing. UserError where the process's settings ask for the opposite (CUDA: GEMM tuning).
  virtual std::string set_deterministic() {
    return "the CPU backend's ops give the same bits run to run as they are";
  }
  // Waits for every op queued so far (a no-op on the CPU, whose ops are synchronous).
  virtual void synchronize() {}
  // Recipe bf16 on hardware that rounds GEMM operands to bf16 itself (RNE, fp32 accumulate:
  // the same products as the recipe's emulation): on = true asks the following GEMMs to do so,
  // false restores fp32. Returns false when the backend cannot (then nothing changes).
  // The CPU can under the test knob MXTRAIN_TEST_BF16_GEMM=1 (its GEMMs then round operand
  // copies themselves), which runs the model's native-bf16 paths on the CPU.
  virtual bool set_bf16_gemm_operands(bool on) { return false; }
  // Whether set_bf16_gemm_operands(true) succeeds here (asked, then restored to fp32).
  bool has_bf16_gemms() {
    if (!set_bf16_gemm_operands(true)) return false;
    set_bf16_gemm_operands(false);
    return true;
  }

  // The GEMM of that mode with operands the caller already holds as bf16 codes, and
  // optionally a bf16 result, so that no tensor is rounded twice (the model's bf16 path:
  // precision.activations = bf16 with native bf16 GEMMs). Called only while
  // set_bf16_gemm_operands(true) holds; the base class throws.
  //   A16 / B16 not null: that operand as bf16 codes (numerics::encode_bf16 bit patterns; A / B
  //   are then unused and may be null); null: A / B in fp32, rounded to bf16 (RNE) by the call
  //   as gemm does in this mode.
  //   C16 not null: the product alpha op(A) op(B) rounded to bf16 (RNE) into C16 (beta must be
  //   0; C unused); else C = alpha op(A) op(B) + beta C in fp32.
  // Products are exact and summed in fp32 either way, so the result equals gemm's on the
  // widened codes (up to the order of the fp32 sums, which is the backend's own).
  virtual void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         float alpha, const float* A, const uint16_t* A16, const float* B,
                         const uint16_t* B16, float beta, float* C, uint16_t* C16 = nullptr);
  // The same GEMM with a residual added: C = alpha op(A) op(B) + R in fp32 (R [M, N], not C).
  // The base class: gemm_bf16 into C, then add(C, R, C) (R + the product, the separate add's
  // order). CUDA reads R in cuBLASLt's epilogue (C from R, D into C): the product never
  // exists as a tensor of its own, one pass over [M, N] less.
  virtual void gemm_bf16_residual(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                  float alpha, const float* A, const uint16_t* A16,
                                  const float* B, const uint16_t* B16, const float* R, float* C);

  // Counters for the benchmark's "GEMM at N% of the machine's SGEMM rate" figure.
  struct GemmStats {
    double flops = 0;
    double seconds = 0;
  };
  virtual GemmStats gemm_stats() const { return {}; }
  virtual void reset_gemm_stats() {}

  // Per-op time (run.profile; backend/op_profile.h says how it is attributed): on from
  // set_profiling(true) until set_profiling(false) (toggled between ops only). op_profile():
  // every op's time since the last reset_op_profile() (CUDA: once the ops queued so far have
  // run). Off, an op costs one branch more. A backend without it returns no rows.
  virtual void set_profiling(bool on) {}
  virtual std::vector<OpProfile::Row> op_profile() { return {}; }
  virtual void reset_op_profile() {}

  // C[M,N] = alpha * op(A) op(B) + beta * C, op(X) = X or X^T; A is [M,K] (or [K,M] if trans_a),
  // B is [K,N] (or [N,K] if trans_b). Row-major, contiguous.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, const float* B, float beta, float* C) = 0;

  // Linear: y[N,O] = x[N,I] W[O,I]^T; backward: dx[N,I] (= or +=) dy W; dW[O,I] += dy^T x.
  void linear_forward(float* y, const float* x, const float* w, int64_t N, int64_t in,
                      int64_t out) {
    gemm(false, true, N, out, in, 1.0f, x, w, 0.0f, y);
  }
  void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                       int64_t N, int64_t in, int64_t out, bool accumulate_dx) {
    if (dx) gemm(false, false, N, in, out, 1.0f, dy, w, accumulate_dx ? 1.0f : 0.0f, dx);
    if (dw) gemm(true, false, out, in, N, 1.0f, dy, x, 1.0f, dw);
  }

  // ---- Per-tensor FP8 Linears (recipes fp8-current / fp8-delayed) ---------------------------
  // The Linear GEMMs with each operand quantized to FP8 with one per-tensor scale, as
  // LinearRecipe::quantize does it (codes = fmt(x * scale), RNE, SATFINITE; decode multiplier
  // 1 / scale). Callers (LlamaModel) use them only when fp8_tensor_cores() is true.
  //   CUDA: the quantize kernels write FP8 codes (and the transposed copies that FP8 GEMMs need:
  //     both operands K-major) into `work`, then one cuBLASLt FP8 GEMM per product with the
  //     decode scales passed by device pointer (fp32 accumulate, fp32 output).
  //   Here (the reference, host memory): the recipe's exact emulation, i.e. the fp32 GEMM over
  //     the dequantized operands, with the same GEMM calls as linear_forward / linear_backward.
  struct Fp8Operand {
    numerics::Format fmt = numerics::Format::kE4M3;  // kE4M3 or kE5M2
    // true: current scaling, scale = numerics::fp8_scale_from_amax(max|x|, fp8_max(fmt));
    // false: the given encode scale (delayed scaling's scale from its history).
    bool current = true;
    float scale = 1.0f;
    // backend memory: receives max|x| (NaN skipped) unless null (per-tensor scaling, and
    // nvfp4's 16x16 blocks, a weight's: its later casts take it as x_amax)
    float* amax = nullptr;
    // Recipe fp8-block instead: E4M3 in block_rows x block_cols blocks (1x128, 128x1 or
    // 128x128), power-of-two scales (numerics::quantize_fp8_block); current/scale/amax unused.
    // 0: per-tensor scaling as above. Both operands of one call are of the same kind.
    int block_rows = 0, block_cols = 0;
    // Recipe mxfp8 instead (with block_rows x block_cols = 1x32, or 32x1 when the GEMM reduces
    // down the matrix's columns): E4M3 with one E8M0 scale per block (numerics::quantize_mxfp8,
    // MxScaleRule::kCeil), each copy quantized from the high-precision tensor.
    bool mx = false;
    // Recipe nvfp4 instead (`nvfp4` true, `mx` false): E2M1 codes in 16-element blocks with UE4M3
    // scales and the tensor's fp32 global scale (numerics::quantize_nvfp4_into, as the recipe
    // calls it): block_rows x block_cols = 1x16 (along the GEMM's reduction), 16x1 (down the
    // columns) or 16x16 (weights). `rounding`: the recipe's stochastic rounding (gradients) or
    // RNE. `rht` (the weight-gradient operands, tokens a multiple of 16): the operand is
    // transposed to [cols, rows], put through numerics::rht16_forward(rht_seed) along the
    // tokens and quantized in 1x16 blocks along them (the block shape is then unused), exactly
    // as LlamaModel's emulated weight gradient does.
    bool nvfp4 = false;
    numerics::RoundingOptions rounding;
    bool rht = false;
    uint32_t rht_seed = 0;
    // The operand as bf16 codes (LlamaModel's bf16 path: forward's input and the weight
    // gradient's x): the fp32 pointer passed for it is null and the quantizers read these
    // codes, whose values are the fp32 tensor's (bf16 widens exactly), so the same bytes come
    // out without an fp32 copy in memory.
    const uint16_t* bf16 = nullptr;
    // Not nvfp4. The weight gradient's operand x^T made by the forward, from the same read of
    // x as its own codes (Transformer Engine's columnwise copy), so that the backward need not
    // read x again:
    //   save_t (fp8_linear_forward's input): x^T's codes too, [in, N] (the bytes the weight
    //     gradient's quantization of x writes), and their decode scales in save_t_scale_inv
    //     (xt_scale_bytes of room): per-tensor, one float 1 / scale at this operand's scale;
    //     fp8-block (this operand 1x128), the weight gradient's 128x1 blocks' floats
    //     [N / 128, in] (1 / scale, powers of two, quantize_fp8_block's layout); mxfp8 (1x32),
    //     its 32x1 blocks' E8M0 bytes [N / 32, in] (quantize_mxfp8's columnwise layout) in that
    //     memory. Both backend memory, kept by the caller.
    //   codes_t (fp8_linear_wgrad's and fp8_linear_backward's input): such saved codes and
    //     scales stand for x^T's quantization; x and bf16 are null, and `amax` is not written
    //     (the forward's operand took x's). The caller vouches that they are this operand's
    //     quantization: the same format and scale (fp8-current's always are; fp8-delayed's
    //     where its forward-input and weight-gradient-input scales agree; the block recipes'
    //     blocks are scaled from their own elements, so theirs always are).
    uint8_t* save_t = nullptr;
    float* save_t_scale_inv = nullptr;
    const uint8_t* codes_t = nullptr;
    const float* codes_t_scale_inv = nullptr;
    // Per-tensor scaling, fp8_linear_forward's input with save_t only: the operand is the bf16
    // path's SwiGLU product s = silu(g) u of these bf16 codes ([rows, cols] each), as the bf16
    // code swiglu_forward_bf16 writes, made by the cast as it reads g and u and never stored
    // (the down projection's input: s's codes not written and read back, 4 bytes an element).
    // x and bf16 are null. The same codes, amax and scales as s's codes given as `bf16`.
    const uint16_t* swiglu_g = nullptr;
    const uint16_t* swiglu_u = nullptr;
    // Backend memory holding max |x| (NaN skipped), as x's producer took it
    // (rmsnorm_forward_bf16's amax) or an earlier cast of x wrote it (`amax`: a weight's,
    // until the optimizer changes it): per-tensor current scaling, nvfp4's 1x16 forward rows
    // and its 16x16 blocks take it in place of their own amax pass over x. The caller vouches
    // that it is x's; the reference forms (host memory) check that it is.
    const float* x_amax = nullptr;
    bool per_tensor() const { return !mx && !nvfp4 && block_rows == 0 && block_cols == 0; }
    // nvfp4's 16x16 blocks (a weight's operand), no Hadamard transform
    bool nvfp4_2d() const { return nvfp4 && !rht && block_rows == 16 && block_cols == 16; }
    // The bytes of save_t_scale_inv's scales for a forward input x [rows, cols] cut as this
    // operand (per-tensor, fp8-block 1x128 or mxfp8 1x32); 0 for any other cut (nvfp4, ...),
    // which saves no x^T.
    int64_t xt_scale_bytes(int64_t rows, int64_t cols) const {
      if (per_tensor()) return int64_t(sizeof(float));
      if (nvfp4 || block_rows != 1) return 0;
      if (mx) return block_cols == 32 ? (rows + 31) / 32 * cols : 0;
      return block_cols == 128 ? (rows + 127) / 128 * cols * int64_t(sizeof(float)) : 0;
    }
  };
  // True where the FP8 Linears run on FP8 tensor cores (CUDA, compute capability >= 8.9, unless
  // MXTRAIN_CUDA_FP8=emulate). The CPU says true only under the test knob
  // MXTRAIN_TEST_FP8_OPS=1, which routes the model through these calls (their reference form).
  virtual bool fp8_tensor_cores() const;
  // True where block-scaled operands (Fp8Operand::block_rows > 0) run on tensor cores too
  // (CUDA: Hopper, compute capability 9.x, through cuBLASLt's VEC128_32F / BLK128x128_32F scale
  // modes; Blackwell, 10.x, through the MXFP8 GEMM with the power-of-two block scales rewritten
  // as E8M0, exact: numerics/fp8_block_mx.h; every dimension a multiple of 128). The CPU: the
  // same test knob.
  virtual bool fp8_block_tensor_cores() const { return fp8_tensor_cores(); }
  // True where mxfp8 operands (Fp8Operand::mx) run on tensor cores (CUDA: Blackwell, compute
  // capability 10.x, through cuBLASLt's VEC32_UE8M0 scale mode with the scales in its swizzled
  // layout, numerics/block_scale_layout.h; every dimension a multiple of 32). The CPU: the knob.
  virtual bool mxfp8_tensor_cores() const { return fp8_tensor_cores(); }
  // True where nvfp4 operands (Fp8Operand::nvfp4) run on tensor cores (CUDA: Blackwell, compute
  // capability 10.x with cuBLAS >= 12.8, through CUDA_R_4F_E2M1 operands and the VEC16_UE4M3
  // scale mode, scales in the swizzled layout; every dimension a multiple of 32). The CPU: the
  // knob, with the recipe's exact emulation as the reference form.
  virtual bool nvfp4_tensor_cores() const { return fp8_tensor_cores(); }
  // `work`: backend memory with room for as many floats as the two operands have elements
  // (the model's scratch, as for the emulation's dequantized copies).
  // y[N,out] = q(x[N,in]) q(w[out,in])^T
  // y16 not null: the result is wanted as bf16 codes (RNE of each fp32 element, as to_bf16)
  // in y16 instead; y is still backend memory for N * out floats, which the call may use as
  // scratch (its contents after are unspecified). CUDA writes y16 from the GEMM's epilogue
  // (the bf16 path's v, gate and up: no fp32 copy written and read back); here y, then to_bf16.
  // residual not null (y16 null, y given): y = residual + q(x) q(w)^T, the sum add(y, residual,
  // y) would make of the product (residual may not overlap y). CUDA adds it in the GEMM's
  // epilogue (C = residual, beta 1: the bf16 path's o and down projections, as
  // gemm_bf16_residual), here the product then add.
  virtual void fp8_linear_forward(float* y, const float* x, const Fp8Operand& xq, const float* w,
                                  const Fp8Operand& wq, int64_t N, int64_t in, int64_t out,
                                  float* work, uint16_t* y16 = nullptr,
                                  const float* residual = nullptr);
  // dx[N,in] (= or +=) q(dy[N,out]) q(w[out,in])
  // dy may come as bf16 codes (dyq.bf16, dy null), as x does in the forward.
  // dx16 not null (accumulate_dx false): the result is wanted as bf16 codes (RNE of each fp32
  // element, as to_bf16) in dx16 instead; dx is still backend memory for N * in floats, which
  // the call may use as scratch. CUDA writes dx16 from the GEMM's epilogue (where cuBLASLt has
  // an algorithm for it, else fp32 then rounded: the same codes); here dx, then to_bf16.
  virtual void fp8_linear_dgrad(float* dx, const float* dy, const Fp8Operand& dyq,
                                const float* w, const Fp8Operand& wq, int64_t N, int64_t in,
                                int64_t out, bool accumulate_dx, float* work,
                                uint16_t* dx16 = nullptr);
  // dw[out,in] += q(dy[N,out])^T q(x[N,in]); dy and x each fp32 or bf16 codes.
  virtual void fp8_linear_wgrad(float* dw, const float* dy, const Fp8Operand& dyq,
                                const float* x, const Fp8Operand& xq, int64_t N, int64_t in,
                                int64_t out, float* work);
  // A Linear's whole backward: fp8_linear_dgrad (dx null: skipped) then fp8_linear_wgrad (dw
  // null: skipped), dy's operand given for each (the recipe's data-gradient and
  // weight-gradient quantizations of it); `work` as large as the larger of the two calls'.
  // CUDA, where dy's two quantizations are the same per-tensor one (fp8-current; fp8-delayed
  // when its two scales agree), takes dy's amax once and writes its codes in both layouts in
  // one pass (cuda::fp8_codes_both: the same bytes), and records the amax for both operands;
  // fp8-block and mxfp8 write both block-scaled layouts from one read; nvfp4 makes the 1x16
  // rows and RHT(dy^T) from one amax pass and one read (cuda::quantize_nvfp4_both).
  // dy as codes: both operands' bf16 (the same codes), dy null. dx16: as fp8_linear_dgrad's.
  virtual void fp8_linear_backward(float* dx, float* dw, const float* dy,
                                   const Fp8Operand& dyq_dgrad, const float* w,
                                   const Fp8Operand& wq, const Fp8Operand& dyq_wgrad,
                                   const float* x, const Fp8Operand& xq, int64_t N, int64_t in,
                                   int64_t out, bool accumulate_dx, float* work,
                                   uint16_t* dx16 = nullptr);
  // The bf16 path's gate and up backward from SwiGLU's (per-tensor FP8 Linears, x as codes):
  // dg and du as swiglu_backward_bf16 writes them from ds, g and u (bf16 codes [N, I]) into
  // dgu16 (room for both: dg, then du), then for k = 0 (gate), 1 (up), w[k] [I, C]:
  // fp8_linear_backward(dx, dw[k], dy_k as codes with operands dyq[k][0] (data gradient) and
  // dyq[k][1] (weight gradient), w[k], wq[k], x given by xq[k] (its bf16 codes or x^T's kept
  // codes, codes_t), N, C, I, accumulate_dx = (k == 1), work): dx = dg W_gate + du W_up.
  // `work` as fp8_linear_backward's (in = C, out = I). That is the reference form. CUDA makes
  // dg's and du's FP8 operands in both layouts from one read of ds, g and u
  // (cuda::swiglu_backward_fp8) without writing their bf16 codes: the same bytes, amaxes and
  // results.
  virtual void fp8_swiglu_backward(float* dx, float* const dw[2], const uint16_t* ds16,
                                   const uint16_t* g16, const uint16_t* u16,
                                   const float* const w[2], const Fp8Operand wq[2],
                                   const Fp8Operand dyq[2][2], const Fp8Operand xq[2],
                                   int64_t N, int64_t C, int64_t I, uint16_t* dgu16,
                                   float* work);

  // ---- Shared inputs: one quantization for the Linears that read the same tensor -----------
  // q, k and v read one normalized input (h1), gate and up another (h2). Between
  // begin_shared_input(x, rows, cols) and end_shared_input(), the FP8 Linear calls above that
  // quantize exactly that tensor (x: the fp32 pointer they are given, or Fp8Operand::bf16)
  // quantize it once and reuse its codes and scales for each later operand of the same
  // quantization in the same layout (same format and block shape; fp8-delayed: the same
  // scale), where they would quantize it again. An operand's amax slot still receives the
  // tensor's amax. The bytes are those a fresh quantization writes, so results do not change.
  // One quantization is kept per bracket (the first made); one of another kind (e.g. the
  // weight gradient's transposed copy) is made as usual. Of nvfp4's operands only the 1x16
  // forward inputs are shared (shareable()). The
  // caller must not change x in between, and brackets do not nest. A backend may decline
  // (CUDA: its scratch arena has no room for the kept codes), and MXTRAIN_FP8_SHARED_INPUT=0
  // turns sharing off (for comparisons).
  // widest_out: the largest output width of the Linears in the bracket (their own scratch
  // needs, for the backend's room check).
  virtual void begin_shared_input(const void* x, int64_t rows, int64_t cols, int64_t widest_out);
  virtual void end_shared_input();
  // Operands taken from a kept quantization since the backend was made (tests, the op check).
  int64_t shared_input_hits() const { return shared_hits_; }
  // FP8 GEMMs run with fast accumulation so far (the CUDA backend's MXTRAIN_CUDA_FP8_FAST_ACCUM;
  // 0 elsewhere).
  virtual int64_t fp8_fast_accum_gemms() const { return 0; }

  // The emulated recipes' quantize-dequantize of one Linear operand on the backend, for the
  // path whose GEMMs run in fp32 over dequantized operands (a GPU without the recipe's tensor
  // cores, e.g. nvfp4 / mxfp8 on Hopper): out[rows, cols] = dequantize(quantize(x)) with the
  // bytes LinearRecipe::quantize writes, for q.mx (1x32 / 32x1) and q.nvfp4 (1x16, 16x16,
  // 16x1; with q.rht instead out[cols, rows] = q(RHT(x^T)) in 1x16 blocks, the emulated weight
  // gradient's operands, with `tmp` backend memory for rows * cols floats, else unused). out, x
  // and tmp are backend memory and do not overlap. Returns false where
  // the backend leaves it to the caller's host code (CUDA: nvfp4 16x1 without the RHT, which
  // only Linears with a token count not a multiple of 16 take).
  //   CUDA: the quantize kernels (quantize_kernels.cu) write the dequantized tensor directly.
  //   Here (host memory): the recipe's quantizers; LlamaModel calls it only when the memory is
  //   not host-addressable, i.e. on the CPU under MXTRAIN_TEST_STAGING (the twin of the GPU).
  virtual bool quantize_dequantize(float* out, const float* x, int64_t rows, int64_t cols,
                                   const Fp8Operand& q, float* tmp = nullptr);

  // RMSNorm (Hugging Face LlamaRMSNorm): y = x / sqrt(mean(x^2) + eps) * w; rstd[N] saved.
  virtual void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N,
                               int64_t C, float eps) = 0;
  // dx += d/dx, dw += d/dw (dx accumulates: the residual stream's gradient is already there).
  virtual void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                                const float* w, const float* rstd, int64_t N, int64_t C) = 0;
  // The same, and dx16 = the updated dx's bf16 codes (RNE): the bf16 path's residual gradient,
  // which the next output projection's backward reads as codes. The base class:
  // rmsnorm_backward, then to_bf16; CUDA's kernel stores the codes beside dx. amax (backend
  // memory, unless null) receives max |dx| of the updated fp32 dx, NaN skipped: the amax an
  // FP8 operand of it takes (Fp8Operand::x_amax; the output projections' dy under current
  // scaling). dx16 null: no codes (rmsnorm_backward with the amax).
  virtual void rmsnorm_backward_bf16(float* dx, uint16_t* dx16, float* dw, const float* dy,
                                     const float* x, const float* w, const float* rstd,
                                     int64_t N, int64_t C, float* amax);

  // Rotary embedding in place on x[B, T, heads, D], Hugging Face rotate-half convention:
  // pairs (i, i + D/2) rotated by angle pos * theta^(-2i/D). cos/sin tables are [T, D/2].
  // backward rotates by the negative angle (the map is orthogonal).
  virtual void rope_forward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                            int64_t heads, int64_t D) = 0;
  virtual void rope_backward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                             int64_t heads, int64_t D) = 0;

  // Causal grouped-query attention, memory-efficient (never T x T per sequence).
  // q, out: [B, T, H, D]; k, v: [B, T, KV, D]; lse: [B, H, T] (log-sum-exp of scaled scores).
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, int64_t B, int64_t T, int64_t H, int64_t KV,
                                 int64_t D) = 0;
  // dq, dk, dv are written (not accumulated). Recomputes probabilities from q, k and lse.
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v,
                                  const float* out, const float* lse, int64_t B, int64_t T,
                                  int64_t H, int64_t KV, int64_t D) = 0;

  // FP8 attention (numerics/attention_fp8.h; docs/numerics.md, "FP8 attention"): the same
  // causal GQA attention with q, k, v, the probabilities and the output in E4M3 and the
  // gradients in E5M2 at per-tensor power-of-two scales, the graph cuDNN's fused FP8 SDPA runs.
  // fp32 interface, shapes as attention_forward / _backward; out, dq, dk, dv receive FP8 values
  // (a code times its decode scale). The CPU backend's is the twin (backend/cpu/attention.h);
  // CUDA runs cuDNN's sdpa_fp8 / sdpa_fp8_backward where the library and GPU take the shape,
  // else its fp32 kernel with the twin's rounding (attention_fp8_path), and throws where
  // neither can (attention_fp8_problem). The trainer runs them under precision.fp8_attention
  // (model/llama.cpp).
  virtual void attention_forward_fp8(float* out, float* lse, const float* q, const float* k,
                                     const float* v, int64_t B, int64_t T, int64_t H,
                                     int64_t KV, int64_t D) = 0;
  virtual void attention_backward_fp8(float* dq, float* dk, float* dv, const float* dout,
                                      const float* q, const float* k, const float* v,
                                      const float* out, const float* lse, int64_t B, int64_t T,
                                      int64_t H, int64_t KV, int64_t D) = 0;
  // The bf16 path's forms: q, k, v (and out, dout) as bf16 codes; out16, dq16, dk16, dv16
  // receive the FP8 values as bf16 codes (exact: every E4M3 and E5M2 value at a power-of-two
  // scale is a bf16 value). Exactly widening, the fp32 op and to_bf16.
  virtual void attention_forward_fp8_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                                          const uint16_t* k16, const uint16_t* v16, int64_t B,
                                          int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  virtual void attention_backward_fp8_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                            const uint16_t* dout16, const uint16_t* q16,
                                            const uint16_t* k16, const uint16_t* v16,
                                            const uint16_t* out16, const float* lse, int64_t B,
                                            int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  // Numerics telemetry: the amaxes of the last FP8 attention forward (q, k, v, p, o) and the
  // last backward (dO, dS, dQ, dK, dV) this backend ran, each taken before its encoding (CUDA:
  // cuDNN's own amax outputs for P, O, dS, dQ, dK, dV). Synchronizes; meant for telemetry
  // steps.
  virtual numerics::AttnFp8Amax attention_fp8_amax() = 0;
  // Numerics telemetry of the FP8 head: the largest |logits gradient| element of the last
  // head_cross_entropy call with HeadOperands::kFp8 and a gradient (every chunk's), taken before
  // its E5M2 encoding; 0 before any such call. Synchronizes; meant for telemetry steps.
  virtual float head_fp8_grad_amax() = 0;
  // "" when attention_*_fp8 run for this shape here, else why not.
  virtual std::string attention_fp8_problem(int64_t B, int64_t T, int64_t H, int64_t KV,
                                            int64_t D) {
    (void)B, (void)T, (void)H, (void)KV, (void)D;
    return "";
  }
  // What runs them for this shape, for the start-up line (CUDA: cuDNN's fused FP8 SDPA, or the
  // fp32 kernel with the twin's rounding and why).
  virtual std::string attention_fp8_path(int64_t B, int64_t T, int64_t H, int64_t KV,
                                         int64_t D) {
    (void)B, (void)T, (void)H, (void)KV, (void)D;
    return "emulated (the CPU twin)";
  }
  // What runs head_cross_entropy's HeadOperands::kFp8 for this shape, for the start-up line
  // (CUDA: FP8 GEMMs, or fp32 GEMMs over the FP8 values and why).
  virtual std::string head_fp8_path(int64_t N, int64_t C, int64_t V, int64_t chunk_rows) {
    (void)N, (void)C, (void)V, (void)chunk_rows;
    return "emulated (fp32 GEMMs over the FP8 values)";
  }

  // SwiGLU: s = silu(g) * u over n elements; backward writes dg, du.
  virtual void swiglu_forward(float* s, const float* g, const float* u, int64_t n) = 0;
  virtual void swiglu_backward(float* dg, float* du, const float* ds, const float* g,
                               const float* u, int64_t n) = 0;

  // Token embedding: out[N, C] = table[tokens[n]]; backward: dtable[tokens[n]] += dout[n].
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* table,
                                 int64_t N, int64_t C) = 0;
  virtual void embedding_backward(float* dtable, const int32_t* tokens, const float* dout,
                                  int64_t N, int64_t C) = 0;

  // Output head + softmax cross-entropy over rows of h[N, C] against W[V, C], in chunks of
  // rows so the logits never exist for all N at once (workspace: head_workspace_floats(...)).
  // Returns the SUM of the per-token losses (in double). If dh is non-null, also computes the
  // gradient of (loss_sum * grad_scale): dh (written) and dw (accumulated).
  // operands: the precision of the three GEMMs' operands (HeadOperands). The softmax, the loss
  // and the logits stay fp32 in every mode. kBf16 and kFp8 keep operand copies in the
  // workspace: W's made once per call (not per chunk), the chunk's h and logits gradient.
  virtual double head_cross_entropy(float* dh, float* dw, const float* h, const float* w,
                                    const int32_t* targets, int64_t N, int64_t C, int64_t V,
                                    float grad_scale, float* workspace, int64_t chunk_rows,
                                    HeadOperands operands) = 0;
  // Logits of one row block, for generation: logits[N, V] = h W^T.
  void head_logits(float* logits, const float* h, const float* w, int64_t N, int64_t C,
                   int64_t V) {
    linear_forward(logits, h, w, N, C, V);
  }

  // One query row per head at position T_ctx - 1 against a KV cache of T_ctx positions, for
  // generation: q, out [H, D]; k_cache, v_cache [T_ctx, KV, D] (positions 0..T_ctx-1).
  virtual void attention_decode(float* out, const float* q, const float* k_cache,
                                const float* v_cache, int64_t T_ctx, int64_t H, int64_t KV,
                                int64_t D) = 0;

  // y = x rounded to bf16 and back (RNE, numerics::encode_bf16 / decode_bf16) over n
  // elements; y may alias x. The emulation of a bf16 GEMM operand where the backend's GEMMs do
  // not round themselves (set_bf16_gemm_operands false).
  virtual void round_bf16(float* y, const float* x, int64_t n) = 0;

  // Activations kept in bf16 (precision.activations = bf16): x is rounded to bf16 in place
  // (RNE, as round_bf16) and, when codes is not null, codes[i] receives x[i]'s bf16 bit
  // pattern (numerics::encode_bf16), the copy a block keeps for its backward at half the bytes.
  virtual void pack_bf16(float* x, uint16_t* codes, int64_t n) = 0;
  // x[i] = the bf16 value codes[i] holds (exact: every bf16 value is a float).
  virtual void unpack_bf16(float* x, const uint16_t* codes, int64_t n) = 0;

  // codes[i] = x[i]'s bf16 bit pattern (RNE, numerics::encode_bf16); x is not changed.
  virtual void to_bf16(uint16_t* codes, const float* x, int64_t n) = 0;
  // SwiGLU on bf16 codes (the bf16 path's MLP, whose gate, up and product exist only as
  // codes): s16 = bf16(silu(g) * u) with g, u the values g16, u16 hold, i.e. exactly
  // unpack_bf16, swiglu_forward and pack_bf16 in a row.
  virtual void swiglu_forward_bf16(uint16_t* s16, const uint16_t* g16, const uint16_t* u16,
                                   int64_t n) = 0;
  // swiglu_backward on codes: ds (down's data gradient, out of its GEMM's epilogue), g and u
  // as codes, its dg and du written as bf16 codes (RNE): the values the bf16 GEMMs that take
  // them next would round them to anyway. Exactly unpack_bf16 of the three, swiglu_backward,
  // to_bf16 of both results.
  virtual void swiglu_backward_bf16(uint16_t* dg16, uint16_t* du16, const uint16_t* ds16,
                                    const uint16_t* g16, const uint16_t* u16, int64_t n) = 0;
  // swiglu_backward_bf16 for one GEMM over gate and up: inputs [rows, cols] as there, dg and
  // du side by side, row r's dg codes at dgu16[2 r cols, 2 r cols + cols) and its du's right
  // after: the data-gradient operand [rows, 2 cols] of gate's and up's weights taken as one
  // [2 cols, C] matrix (w_gate then w_up, adjacent in the parameter layout). The base class
  // (the CPU twin, host memory): swiglu_backward_bf16, then the rows interleaved.
  virtual void swiglu_backward_bf16_fused(uint16_t* dgu16, const uint16_t* ds16,
                                          const uint16_t* g16, const uint16_t* u16, int64_t rows,
                                          int64_t cols);
  // Whether the bf16 path runs the backward GEMMs of Linears that share an input as one pair
  // (gate and up: swiglu_backward_bf16_fused; q, k and v: rope_backward_bf16_into and
  // copy_rows_bf16 lay dq, dk, dv side by side): CUDA, where each further data-gradient GEMM
  // read and wrote dh1 or dh2 in fp32 again and read x again for its weight gradient. Not the
  // CPU: there the bf16 path must equal the rounding path bit for bit, and one sum over the
  // joined K runs in another order than separate sums added.
  virtual bool fuse_linear_backward() const { return false; }
  // swiglu_backward with g, u as codes and dg, du fp32: exactly unpack_bf16 of both then
  // swiglu_backward, without the widened copies (the FP8 recipes' MLP backward, whose Linears
  // quantize fp32 gradients). dg may alias ds.
  virtual void swiglu_backward_codes(float* dg, float* du, const float* ds, const uint16_t* g16,
                                     const uint16_t* u16, int64_t n) = 0;

  // The bf16 path's producers, each the fp32 op followed by to_bf16 (the fp32 result is never
  // written): RMSNorm into codes (rstd fp32 as rmsnorm_forward), RoPE from fp32 x (a GEMM's
  // output, not changed) into codes.
  // amax (backend memory, unless null) receives max |y| over the codes' values, NaN skipped
  // (numerics::abs_max of the widened codes): the amax an FP8 operand of y takes
  // (Fp8Operand::x_amax), so its quantizer need not read y for it.
  virtual void rmsnorm_forward_bf16(uint16_t* y16, float* rstd, const float* x, const float* w,
                                    int64_t N, int64_t C, float eps, float* amax) = 0;
  virtual void rope_forward_bf16(uint16_t* y16, const float* x, const float* cos,
                                 const float* sin, int64_t B, int64_t T, int64_t heads,
                                 int64_t D) = 0;
  // Attention on codes (the bf16 path): q16, k16, v16 hold q, k, v; out16 receives the output's
  // codes (RNE), lse fp32: the same as widening, attention_forward and to_bf16. The backward
  // takes dout in fp32 and q, k, v and out as codes, and writes dq, dk, dv in fp32, as
  // attention_backward on the widened values. (CUDA's cuDNN SDPA reads and writes bf16 itself,
  // so there the conversions around it disappear.)
  virtual void attention_forward_bf16(uint16_t* out16, float* lse, const uint16_t* q16,
                                      const uint16_t* k16, const uint16_t* v16, int64_t B,
                                      int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  virtual void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout,
                                       const uint16_t* q16, const uint16_t* k16,
                                       const uint16_t* v16, const uint16_t* out16,
                                       const float* lse, int64_t B, int64_t T, int64_t H,
                                       int64_t KV, int64_t D) = 0;
  // The same backward on codes throughout (the bf16 path's attention backward, where dout
  // comes out of its GEMM as codes and dq, dk, dv go on as codes): exactly widening dout16,
  // attention_backward_bf16 and to_bf16 of each gradient. cuDNN's SDPA reads and writes these
  // codes itself, so on CUDA nothing is widened or rounded around it.
  virtual void attention_backward_codes(uint16_t* dq16, uint16_t* dk16, uint16_t* dv16,
                                        const uint16_t* dout16, const uint16_t* q16,
                                        const uint16_t* k16, const uint16_t* v16,
                                        const uint16_t* out16, const float* lse, int64_t B,
                                        int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  // RoPE's backward in place on codes: exactly widening, rope_backward and to_bf16.
  virtual void rope_backward_bf16(uint16_t* dx16, const float* cos, const float* sin, int64_t B,
                                  int64_t T, int64_t heads, int64_t D) = 0;
  // The same out of place into rows of a wider buffer: dx16 (not changed) rotated back into
  // out, token n's heads at out + n ld (ld >= heads D): dq and dk into the [N, q + 2 kv]
  // operand of one data-gradient GEMM over q, k and v (fuse_linear_backward). The base class
  // (the CPU twin, host memory): rope_backward_bf16 on a copy, then its rows copied.
  virtual void rope_backward_bf16_into(uint16_t* out, int64_t ld, const uint16_t* dx16,
                                       const float* cos, const float* sin, int64_t B, int64_t T,
                                       int64_t heads, int64_t D);
  // out[r ld + c] = in[r cols + c]: codes into rows of a wider buffer (dv beside dq and dk).
  virtual void copy_rows_bf16(uint16_t* out, int64_t ld, const uint16_t* in, int64_t rows,
                              int64_t cols);

  // y = a + b over n elements (residual adds); y may alias a.
  virtual void add(float* y, const float* a, const float* b, int64_t n) = 0;
  // Sum of squares over n elements, in double (for the global gradient norm).
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual void scale(float* x, float s, int64_t n) = 0;
  virtual void fill(float* x, float value, int64_t n) = 0;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;

  // AdamW (decoupled weight decay, PyTorch's torch.optim.AdamW): step t starts at 1. The
  // gradient it steps on is grad * grad_scale (gradient clipping's factor, 1 for none), rounded
  // to float as a separate scale(grad, grad_scale) would leave it, without that pass over grad
  // (which is left unchanged). codes (optional): also written with each updated parameter's
  // bf16 code (RNE, numerics::encode_bf16), the copy the bf16 GEMMs read (Fsdp's resident
  // block codes) made in the same pass instead of a second read of param.
  virtual void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int64_t t,
                     float grad_scale, uint16_t* codes = nullptr) = 0;

 protected:
  // The shared input (begin_shared_input) and the key of the quantization kept from it.
  struct SharedKey {
    const void* x = nullptr;
    int64_t rows = 0, cols = 0;  // x's shape as the call gives it
    bool transposed = false;  // the operand's layout (CUDA: x^T, the weight gradient's copy)
    numerics::Format fmt = numerics::Format::kE4M3;
    bool current = true;
    float scale = 0.0f;  // fp8-delayed's given scale (0 under current scaling)
    int block_rows = 0, block_cols = 0;
    bool mx = false;
    bool nvfp4 = false;
    bool operator==(const SharedKey&) const = default;
  };
  static SharedKey shared_key(const void* x, int64_t rows, int64_t cols, const Fp8Operand& q,
                              bool transposed);
  // Whether an operand may take or keep a shared quantization: every FP8 one; of nvfp4's, the
  // 1x16 forward inputs (round-to-nearest, no Hadamard transform: the same bytes for each
  // Linear), not the stochastically rounded or transformed ones (each Linear's own stream and
  // transform).
  static bool shareable(const Fp8Operand& q) {
    return !q.nvfp4 || (!q.rht && !q.rounding.stochastic && q.block_rows == 1 &&
                        q.block_cols == 16);
  }
  // What an operand of key k does: kNone, quantize as usual (not the shared input, larger
  // than the bracket's rows x cols, or another quantization is kept); kHit, take the kept one
  // (counted); kFill, quantize and keep it (then shared_kept(k)).
  enum class Share { kNone, kHit, kFill };
  Share share(const SharedKey& k);
  void shared_kept(const SharedKey& k) {
    shared_key_ = k;
    shared_full_ = true;
  }
  const void* shared_x_ = nullptr;  // null: no bracket open (or declined)
  int64_t shared_rows_ = 0, shared_cols_ = 0;

  // run.profile's host-clock hooks: an OpScope at the top of each op (the CPU backend's and the
  // base class's), timed by a backend that implements them (CpuBackend); CUDA times its ops on
  // the device instead and leaves these empty.
  virtual void op_begin(const char* op) {}
  virtual void op_end() {}
  struct OpScope {
    Backend& be;
    OpScope(Backend& b, const char* op) : be(b) { be.op_begin(op); }
    ~OpScope() { be.op_end(); }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
  };

 private:
  // One operand of the reference forms (host memory, dequantized into out), through the kept
  // quantization where the shared input's key matches. `id`: the tensor's pointer as the caller
  // gave it (x, or the bf16 codes x was widened from).
  void fp8_input(float* out, const void* id, const float* x, int64_t rows, int64_t cols,
                 const Fp8Operand& q, bool transposed);
  SharedKey shared_key_;
  bool shared_full_ = false;
  int64_t shared_hits_ = 0;
  std::vector<float> shared_values_;  // the reference form's kept operand (dequantized)
  float shared_amax_ = 0.0f;
};

// A begin_shared_input / end_shared_input bracket for a scope (LlamaModel: around the Linears
// that read h1, and those that read h2). x null: no bracket.
class SharedInputScope {
 public:
  SharedInputScope(Backend& be, const void* x, int64_t rows, int64_t cols, int64_t widest_out)
      : be_(be), open_(x) {
    if (open_) be_.begin_shared_input(x, rows, cols, widest_out);
  }
  ~SharedInputScope() {
    if (open_) be_.end_shared_input();
  }
  SharedInputScope(const SharedInputScope&) = delete;
  SharedInputScope& operator=(const SharedInputScope&) = delete;

 private:
  Backend& be_;
  bool open_;
};

// Floats of head_cross_entropy's workspace for chunks of chunk_rows rows: the logits chunk,
// and with operand copies (HeadOperands kBf16 or kFp8) room for the larger of their layouts
// for that mode: the CPU's fp32 copies of W and an h chunk (also CUDA's emulated FP8 head's);
// kBf16: CUDA's bf16 copies of W, the logits gradient and an h chunk (each region 16-byte
// aligned); kFp8: CUDA's FP8 codes of W, of the h chunk and of the gradient, each in both
// layouts (each region 256-byte aligned).
inline int64_t head_bf16_floats(int64_t n) { return (n + 7) / 8 * 4; }  // n bf16, padded
inline int64_t head_fp8_floats(int64_t n) { return (n + 255) / 256 * 64; }  // n bytes, padded
// HeadOperands::kFp8's per-tensor encode scale from an amax (h's, W's, or the logits
// gradient's bound |grad_scale|): current scaling's, fp8_max(fmt) / amax (no margin).
inline float head_fp8_scale(float amax, numerics::Format fmt) {
  return numerics::fp8_scale_from_amax(amax, numerics::fp8_max(fmt));
}
// Where the operand copies start: after the logits chunk, 16-byte aligned.
inline int64_t head_operands_offset(int64_t chunk_rows, int64_t V) {
  return (chunk_rows * V + 3) / 4 * 4;
}
inline int64_t head_workspace_floats(int64_t chunk_rows, int64_t C, int64_t V,
                                     HeadOperands operands) {
  if (operands == HeadOperands::kFp32) return chunk_rows * V;
  const int64_t logits = head_operands_offset(chunk_rows, V);
  // kFp8Bf16Dgrad: the fp32 copies of W's and the gradient's bf16 roundings too (CPU); W's codes
  // row-major only, its bf16 copy and the gradient's (CUDA)
  const bool bf16_dgrad = operands == HeadOperands::kFp8Bf16Dgrad;
  const int64_t cpu = V * C + chunk_rows * C + (bf16_dgrad ? V * C + chunk_rows * V : 0);
  const int64_t gpu =
      operands == HeadOperands::kBf16
          ? head_bf16_floats(V * C) + head_bf16_floats(chunk_rows * V) +
                head_bf16_floats(chunk_rows * C)
      : bf16_dgrad
          ? head_fp8_floats(V * C) + 2 * (head_fp8_floats(chunk_rows * V) +
                                          head_fp8_floats(chunk_rows * C)) +
                head_bf16_floats(V * C) + head_bf16_floats(chunk_rows * V)
          : 2 * (head_fp8_floats(V * C) + head_fp8_floats(chunk_rows * V) +
                 head_fp8_floats(chunk_rows * C));
  return logits + (cpu > gpu ? cpu : gpu);
}

// The CUDA backend's own scratch arena (bf16 operand copies, cuBLASLt and cuDNN workspaces,
// FP8 scales): MXTRAIN_CUDA_SCRATCH_MB mebibytes, default 1024. UserError for a value that is
// not a positive whole number. Read by the CUDA factory and by `mxtrain plan` (its GPU
// accounting of this engine), so both use the same number.
size_t cuda_scratch_bytes();
// The fp32 logits chunk of the head's cross-entropy on a GPU (head_chunk_rows):
// MXTRAIN_CUDA_HEAD_CHUNK_MB mebibytes, default 256. Each chunk's weight-gradient GEMM reads
// and writes all of dW (V x C fp32), so fewer, larger chunks move less (at Llama 3's 128K
// vocabulary and 16K tokens, 256 MiB makes 32 chunks: ~67 GB of dW traffic a step); the
// planner counts the chunk (and its bf16 copies) in the activations. UserError for a value
// that is not a whole number from 16 to 65536.
size_t cuda_head_chunk_bytes();

std::unique_ptr<Backend> make_cpu_backend();
// The CPU backend on plain host memory whatever MXTRAIN_TEST_STAGING / _DEVICE_MEMORY say:
// where a run on device memory falls back to the host (generation without room on the GPU).
std::unique_ptr<Backend> make_host_backend();
// "cpu" or "cuda". UserError for an unknown device, and for "cuda" in a build without the CUDA
// backend or on a machine without a usable GPU.
// `key` names where the device came from in errors: the config key, or a command's flag.
std::unique_ptr<Backend> make_backend(const std::string& device,
                                      const std::string& key = "run.device");
// UserError unless `device` names a device mxtrain knows ("cpu" or "cuda"), whether or not this
// build or machine can run it: what a config can be checked for away from the machine.
void check_device_name(const std::string& device, const std::string& key = "run.device");

// The CUDA backend lives in its own library (mxcuda), which the engine library does not link:
// a program built with it registers its factory once at startup (cli/main.cpp). Null: this
// program has no CUDA backend. `given` is the setting as the user typed it, up to its value
// ("run.device = " or "--device "): the factory's errors start with it and "cuda: ".
using BackendFactory = std::unique_ptr<Backend> (*)(const std::string& given);
void register_cuda_backend_factory(BackendFactory factory);
// Defined in mxcuda (backend/cuda/cuda_backend.cu): registers the CUDA factory.
void register_cuda_backend();

}  // namespace mx
