// Row-major fp32 GEMMs through cuBLASLt (column-major underneath): C = alpha op(A) op(B) + beta C
// exactly as Backend::gemm defines it, computed in fp32, tf32 or bf16 (see CudaGemmPrecision).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_arena.h"
#include "numerics/formats.h"

namespace mx::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Which algorithm each GEMM shape runs (CudaGemmTune; MXTRAIN_CUDA_GEMM_TUNE): the
  // heuristic's first, or the fastest of its first kTuneCandidates timed on the GPU at the
  // shape's first call. What tuning did so far: shapes timed, and how many of them changed
  // algorithm (each shape's times: MXTRAIN_CUDA_GEMM_TUNE_LOG's lines).
  static constexpr int kTuneCandidates = 8;
  void set_tune(CudaGemmTune t) { tune_ = t; }
  struct TuneStats {
    int64_t timed = 0, changed = 0;
  };
  TuneStats tune_stats() const { return tune_stats_; }
  // Fast accumulation on the per-tensor FP8 GEMMs (CudaFp8FastAccum), and how many GEMMs ran
  // with it so far.
  void set_fp8_fast_accum(CudaFp8FastAccum f) { fast_accum_ = f; }
  int64_t fast_accum_gemms() const { return fast_accum_gemms_; }

  // workspace: device memory for cuBLASLt (may be null with workspace_bytes 0). For kBf16 the
  // operands' bf16 copies are allocated from `scratch` for the duration of the call.
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, const float* B, float beta, float* C, CudaGemmPrecision precision,
            void* workspace, size_t workspace_bytes, DeviceArena& scratch, cudaStream_t stream);

  // gemm's kBf16 product (bf16 operands, fp32 accumulate) with each operand given either as
  // bf16 codes (row-major, as gemm's A and B; numerics::encode_bf16 bit patterns): A16 / B16
  // not null, used as they are (A / B unused), or in fp32: A16 / B16 null, A / B rounded to
  // bf16 (RNE) into `scratch` for the duration of the call. Output: C16 null: C = alpha op(A)
  // op(B) + beta C in fp32; C16 not null: the fp32 result alpha op(A) op(B) converted to bf16
  // by cuBLASLt's epilogue into C16 (beta must be 0; C unused). Backend::gemm_bf16, gemm in
  // kBf16 mode, and the head's bf16 path (which keeps W's copy for a whole call instead of
  // rounding it again for every chunk's GEMM) all end here. C_in (fp32 output only): the
  // epilogue reads beta's term from C_in instead of C (C = alpha op(A) op(B) + beta C_in; C is
  // then only written): Backend::gemm_bf16_residual.
  void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                 float beta, float* C, uint16_t* C16, void* workspace, size_t workspace_bytes,
                 DeviceArena& scratch, cudaStream_t stream, const float* C_in = nullptr);

  // Per-tensor FP8 GEMM on FP8 tensor cores: C[M, N] (fp32) =
  //   (a_scale * A[M, K]) (b_scale * B[N, K])^T + beta * C,
  // A and B FP8 codes (E4M3 or E5M2, not both E5M2), both K-major (row-major with K innermost:
  // the "TN" layout FP8 GEMMs require), a_scale / b_scale pointing to the decode multipliers on
  // the device (what numerics::quantize_fp8_* writes as scales_f32[0]). beta 0: C is not read.
  // M, N, K must be multiples of 16 (cuBLASLt's FP8 leading-dimension rule).
  //
  // C16 (fp8_gemm, fp8_block_gemm and mxfp8_gemm): not null, with beta 0: the result goes to
  // C16 as bf16 codes instead (cuBLASLt's epilogue converts the same fp32 value it would write
  // to C; C unused), the bf16 path's Linear outputs that are only wanted as codes. Returns
  // false, writing nothing, where cuBLASLt has no algorithm for the bf16 output at this shape
  // (remembered per shape, so asked once): the caller then writes C in fp32 and rounds it. An
  // fp32 output with no algorithm throws, as ever, unless C_in is given (below); the
  // functions return true otherwise.
  //
  // C_in (the same three and nvfp4_gemm, fp32 output only): beta's term is read from C_in
  // instead of C (C = product + beta C_in; C only written), as gemm_bf16's: the low-precision
  // Linears' residual add in the epilogue (Backend::fp8_linear_forward's `residual`). Returns
  // false, writing nothing, where cuBLASLt has no algorithm for that (a C apart from D): the
  // caller then writes the product and adds.
  bool fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, numerics::Format a_fmt,
                const float* a_scale, const uint8_t* B, numerics::Format b_fmt,
                const float* b_scale, float beta, float* C, void* workspace,
                size_t workspace_bytes, cudaStream_t stream, uint16_t* C16 = nullptr,
                const float* C_in = nullptr);

  // Block-scaled FP8 GEMM (recipe fp8-block; Hopper): C[M, N] (fp32) = A[M, K] B[N, K]^T +
  // beta C, E4M3 codes, both K-major, each element decoded with its block's scale: 1 x 128
  // blocks along K (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) or, for at most one operand
  // (`_2d`), 128 x 128 blocks (BLK128x128_32F). Scale layouts (device, fp32), for an operand of
  // R rows: 1x128: [K/128, round_up(R, 4)] row-major (the row index innermost); 128x128:
  // [R/128, round_up(K/128, 4)] row-major. These are Transformer Engine's "GEMM-ready" layouts,
  // and what PyTorch's _scaled_mm accepts and hands to these cuBLASLt modes (ScaledBlas.cpp:
  // 1x128 scales (R, K/128) with strides (1, R); 128x128 (R/128, K/128) with row stride
  // round_up(K/128, 4)); never checked on a GPU here (the op check's fp8_linear_* block cases
  // will tell). M, N, K multiples of 128 (so R needs no padding to 4).
  bool fp8_block_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, const float* a_scales,
                      bool a_2d, const uint8_t* B, const float* b_scales, bool b_2d, float beta,
                      float* C, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                      uint16_t* C16 = nullptr, const float* C_in = nullptr);

  // MXFP8 GEMM (recipe mxfp8; Blackwell, compute capability 10.x): C[M, N] (fp32) = A[M, K]
  // B[N, K]^T + beta C, E4M3 codes, both K-major, each 1 x 32 block along K decoded with its
  // E8M0 scale byte (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0). a_scales / b_scales: device
  // bytes in the swizzled 128 x 4 tile layout of numerics/block_scale_layout.h, for a scale
  // matrix of [M, K / 32] / [N, K / 32] (padding zero). K a multiple of 32, M and N of 16 (the
  // FP8 GEMMs' 16-byte leading-dimension rule); never run on a GPU (op_check's mxfp8 cases).
  bool mxfp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, const uint8_t* a_scales,
                  const uint8_t* B, const uint8_t* b_scales, float beta, float* C,
                  void* workspace, size_t workspace_bytes, cudaStream_t stream,
                  uint16_t* C16 = nullptr, const float* C_in = nullptr);

  // NVFP4 GEMM (recipe nvfp4; Blackwell, compute capability 10.x, cuBLAS >= 12.8): C[M, N]
  // (fp32) = alpha A[M, K] B[N, K]^T + beta C with alpha = (1 / a_global[0]) (1 / b_global[0]),
  // A and B E2M1 codes (CUDA_R_4F_E2M1, two a byte, low nibble first), both K-major (TN, as
  // the block-scaled FP4 kernels require), each 1 x 16 block along K decoded with its UE4M3
  // scale byte (CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3) in the swizzled 128 x 4 tile layout
  // of numerics/block_scale_layout.h for [M, K / 16] / [N, K / 16] scales. a_global / b_global:
  // the operands' global encode scales S_enc on the device (what quantize_nvfp4 writes); the two
  // are folded into alpha on the device (`scalars`: 2 device floats the call may overwrite,
  // alpha and beta, with CUBLASLT_POINTER_MODE_DEVICE). K a multiple of 32 (16-byte rows of
  // codes), M and N of 16; never run on a GPU (op_check's nvfp4 cases). C16 and C_in as
  // fp8_gemm's: the product as bf16 codes out of the epilogue (beta 0; false where cuBLASLt
  // has no such algorithm, for the caller's fp32 + round), or beta's term read from C_in.
  // With beta 0 the output (C or C16) is zeroed first: a device-side beta cannot let the
  // kernel skip reading it.
  bool nvfp4_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, const uint8_t* a_scales,
                  const float* a_global, const uint8_t* B, const uint8_t* b_scales,
                  const float* b_global, float beta, float* C, float* scalars, void* workspace,
                  size_t workspace_bytes, cudaStream_t stream, uint16_t* C16 = nullptr,
                  const float* C_in = nullptr);

 private:
  // One operand of scaled_tn_gemm: K-major codes of `type`, their decode scale(s) on the device
  // and the scale mode (a cublasLtMatmulMatrixScale_t value; 0: one fp32 scalar per tensor).
  struct ScaledOperand {
    const void* data;
    cudaDataType_t type;
    const void* scale;
    int32_t mode;
  };
  // The one scaled "TN" GEMM every low-precision product above ends in: C[M, N] (fp32) =
  // alpha a[M, K] b[N, K]^T + beta C, fp32 compute, the heuristic's first algorithm. alpha and
  // beta point to host floats, or with device_scalars to device floats
  // (CUBLASLT_POINTER_MODE_DEVICE); beta_value and `hint` are for the "no algorithm" message.
  // D16 not null (beta 0; with device scalars D16 zeroed by the caller, since C is then
  // D16 and read): the output is bf16 codes in D16 (C unused), and a missing algorithm
  // returns false instead of throwing. C_in (fp32 output): beta's term read from C_in (null:
  // C itself); a missing algorithm then returns false too (the caller adds after).
  bool scaled_tn_gemm(const char* op, int64_t M, int64_t N, int64_t K, const ScaledOperand& a,
                      const ScaledOperand& b, const float* alpha, const float* beta,
                      bool device_scalars, float beta_value, float* C, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, const char* hint,
                      uint16_t* D16 = nullptr, const float* C_in = nullptr);
  // gemm / gemm_bf16 after their operand handling: one cuBLASLt call on operands of in_type,
  // C (and D, the same buffer) of out_type (CUDA_R_32F, or CUDA_R_16BF with beta 0), fp32
  // scale type.
  // C_in: where beta's term is read (null: C itself).
  void matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const void* A, const void* B, cudaDataType_t in_type, cublasComputeType_t compute,
              float beta, void* C, cudaDataType_t out_type, void* workspace,
              size_t workspace_bytes, cudaStream_t stream, const void* C_in = nullptr);
  // FP8 front of scaled_tn_gemm: format and shape rules, K = 0; modes as ScaledOperand's.
  bool fp8_gemm_scaled(int64_t M, int64_t N, int64_t K, const uint8_t* A, numerics::Format a_fmt,
                       const void* a_scale, int32_t a_mode, const uint8_t* B,
                       numerics::Format b_fmt, const void* b_scale, int32_t b_mode, float beta,
                       float* C, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                       uint16_t* C16, const float* C_in);
  // The heuristic's first algorithm for a call whose descriptors are set: asked once per key
  // (every attribute the descriptors were built from: shapes, transposes, data and compute
  // types (the output's included), scale modes, pointer mode, operand alignments, workspace size), then reused.
  // cublasLtMatmulAlgoGetHeuristic costs tens of microseconds of host time per call, about
  // what a small GEMM takes on the GPU, and a training step repeats the same few dozen shapes.
  // A key with no algorithm is remembered too (no_algo_), for the bf16 outputs' fallback.
  //
  // Tuning (tune_, `trial` given): the heuristic is asked for kTuneCandidates algorithms and
  // each is timed on the call's own operands (a warm-up, then kTuneRuns runs between two
  // events); the fastest is kept for the key. trial->run(algo, D) queues the call's product
  // with `algo` into D: the call's own output where the call does not read it (beta 0: the
  // call writes it afterwards anyway), else a stand-in of d_bytes from cudaMalloc, freed at
  // once (no stand-in to be had: the heuristic's first, untimed). A candidate cuBLASLt refuses
  // at run time is left out.
  using AlgoKey = std::array<int64_t, 14>;
  struct Trial {
    std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&, void* D)> run;
    void* D;         // the call's output
    size_t d_bytes;  // its size
    bool reads_c;    // beta != 0 and C read from D itself: the trials must not write D
    double flops;    // 2 M N K
    cudaStream_t stream;
  };
  static constexpr int kTuneRuns = 3;
  const cublasLtMatmulAlgo_t* cached_algo(const AlgoKey& key, cublasLtMatmulDesc_t desc,
                                          cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                          cublasLtMatrixLayout_t c,
                                          cublasLtMatmulPreference_t pref, const char* op,
                                          const Trial* trial = nullptr,
                                          bool may_fall_back = false);
  // The index of the fastest of `n` candidates (0 when none could be timed).
  int fastest(const cublasLtMatmulHeuristicResult_t* cand, int n, const Trial& trial,
              const char* op);
  cublasLtHandle_t handle_ = nullptr;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos_;
  std::set<AlgoKey> no_algo_;
  CudaGemmTune tune_ = CudaGemmTune::kLarge;
  TuneStats tune_stats_;
  CudaFp8FastAccum fast_accum_ = CudaFp8FastAccum::kOff;
  int64_t fast_accum_gemms_ = 0;
  int64_t heuristic_refusals_ = 0;  // statuses taken as no algorithm (cached_algo)
};

// dst[i] = bf16 bits of src[i], round-to-nearest-even (numerics::encode_bf16, as the CPU
// recipe's bf16 emulation rounds).
void round_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream);
// dst[i] = the fp32 value of the bf16 bits src[i] (exact).
void widen_bf16(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream);

}  // namespace mx::cuda
