// The CUDA backend: every Backend op on device pointers (cudaMalloc'd or from a DeviceArena).
// All work is queued on one stream (the backend's); ops that return a value (sum_squares,
// head_cross_entropy) synchronize it. Scratch memory for per-op temporaries (the attention
// backward's row dots, reduction partials, the cuBLASLt workspace, bf16 copies of GEMM
// operands) comes from a DeviceArena sized at construction, released at the end of each op.
// Releasing while the op's kernels are still queued is safe: every user of that memory runs on
// the same stream, so stream order keeps a later op's writes after this op's reads.
//
// Never run on a GPU yet: see docs/cuda.md for what has and has not been checked.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "backend/attention_choice.h"
#include "backend/backend.h"
#include "core/arena.h"
#include "numerics/formats.h"

namespace mx {

// How the fp32 GEMMs of the interface run on tensor cores.
enum class CudaGemmPrecision : uint8_t {
  kFp32,  // CUBLAS_COMPUTE_32F: IEEE fp32 products (matches the CPU backend to fp32 rounding)
  kTf32,  // CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to tf32 inside the GEMM
  kBf16,  // operands rounded to bf16 (RNE, numerics/formats.h) into scratch, fp32 accumulate
};

// Which cuBLASLt algorithm a GEMM shape runs (MXTRAIN_CUDA_GEMM_TUNE; docs/cuda.md, "GEMM
// tuning"): the heuristic's first (kOff: 0), or the fastest of the heuristic's first eight,
// timed on the GPU at the shape's first call, for products of at least 2^30 FLOPs (kLarge: 1,
// the default: smaller ones cost more to time than they could save) or for every shape (kAll:
// all; the tests' setting).
enum class CudaGemmTune : uint8_t { kOff, kLarge, kAll };
// MXTRAIN_CUDA_GEMM_TUNE's value (null: unset, the default); UserError for anything else.
CudaGemmTune parse_cuda_gemm_tune(const char* value);

// cuBLASLt's fast accumulation on the per-tensor FP8 GEMMs (CUBLASLT_MATMUL_DESC_FAST_ACCUM,
// which "has an effect on Ada and Hopper": the tensor cores' partial sums are no longer
// promoted to fp32 every so often, faster and less exact). MXTRAIN_CUDA_FP8_FAST_ACCUM: 0 (kOff,
// the default: every FP8 GEMM promotes), fprop (kForward: the GEMMs whose operands are both
// E4M3, which in the per-tensor recipes are the forward ones, the Linears' and the FP8 head's:
// Transformer Engine's default, split accumulation for dgrad and wgrad) or all (kAll). The
// block-scaled GEMMs (fp8-block, mxfp8, nvfp4) never take it. docs/cuda.md, "FP8 fast
// accumulation".
enum class CudaFp8FastAccum : uint8_t { kOff, kForward, kAll };
// MXTRAIN_CUDA_FP8_FAST_ACCUM's value (null: unset, kOff); UserError for anything else.
CudaFp8FastAccum parse_cuda_fp8_fast_accum(const char* value);

struct CudaBackendOptions {
  int device = 0;
  CudaGemmPrecision gemm_precision = CudaGemmPrecision::kFp32;
  size_t scratch_bytes = size_t(512) << 20;       // per-op temporaries
  size_t gemm_workspace_bytes = size_t(32) << 20;  // cuBLASLt workspace (inside scratch)
  CudaGemmTune gemm_tune = CudaGemmTune::kLarge;
  CudaFp8FastAccum fp8_fast_accum = CudaFp8FastAccum::kOff;
  bool sync_after_each_op = false;  // debugging: surface async faults at the op that caused them
  // The per-tensor FP8 Linears (Backend::fp8_linear_*) on FP8 tensor cores when the GPU has
  // them (compute capability >= 8.9); false: fp8_tensor_cores() says no, and the recipes run
  // their exact emulation (the trainer reads MXTRAIN_CUDA_FP8=emulate for this).
  bool fp8_tensor_cores = true;
  // Causal attention: cuDNN's SDPA in bf16 where this build has it (MXTRAIN_HAVE_CUDNN) and cuDNN
  // takes the shape, else the fp32 kernel; kFp32 always the fp32 kernel (the trainer reads
  // MXTRAIN_CUDA_ATTENTION for this). Decode always runs the fp32 kernel.
  CudaAttention attention = CudaAttention::kCudnn;
  MemoryTracker* tracker = nullptr;
};

class CudaBackend;
std::unique_ptr<CudaBackend> make_cuda_backend(const CudaBackendOptions& options = {});
// register_cuda_backend() (declared in backend/backend.h) makes make_backend("cuda") build a
// CudaBackend on the local rank's GPU (UserError when the machine has no usable GPU).
// This process's GPU under an MPI launcher: the node-local rank modulo the GPU count (0 alone).
int cuda_local_device(int device_count);

class CudaBackend : public Backend {
 public:
  virtual cudaStream_t stream() const = 0;
  virtual int device() const = 0;
  virtual void set_gemm_precision(CudaGemmPrecision p) = 0;
  virtual size_t scratch_peak_bytes() const = 0;
  // GEMM tuning so far (CudaGemmTune): the shapes whose candidates were timed, and how many of
  // them took another algorithm than the heuristic's first.
  virtual int64_t gemm_shapes_timed() const = 0;
  virtual int64_t gemm_shapes_retuned() const = 0;
  virtual void set_attention(CudaAttention a) = 0;
  // Which implementation attention_forward / _backward run for this shape: "cudnn", or "fp32"
  // followed by the reason when cuDNN was asked for but cannot take it ("fp32 (...)"). Asking
  // builds (and caches) the shape's cuDNN graphs.
  virtual std::string attention_path(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) = 0;
  // Scratch bytes cuDNN's attention takes for the largest call of B sequences of this shape
  // (at most kCudnnMaxSequences a call: backend/attention_choice.h), forward or backward
  // (CudnnAttention::*_scratch_bytes: fp32 operands, a bound for the bf16 path's), the arena
  // slack the backend adds included; 0 where cuDNN does not run the shape. The attention entry
  // points run cuDNN in groups of sequences when all B do not fit; the op check sizes a small
  // scratch arena with this to exercise that.
  virtual size_t cudnn_attention_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                               int64_t D, bool backward) = 0;
  // The same for FP8 attention (attention_*_fp8: the codes of q, k, v, o and, backward, do,
  // dq, dk, dv, and cuDNN's FP8 workspace), which likewise runs in groups when all B do not fit.
  virtual size_t cudnn_attention_fp8_scratch_bytes(int64_t B, int64_t T, int64_t H, int64_t KV,
                                                   int64_t D, bool backward) = 0;
  // Beyond the Backend interface: the per-tensor FP8 GEMM on FP8 tensor cores over codes
  // already quantized (cuda::LtGemm::fp8_gemm: C[M,N] = (sa A[M,K]) (sb B[N,K])^T + beta C,
  // codes and decode scales in device memory). The op check calls it directly.
  virtual void fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A,
                        numerics::Format a_fmt, const float* a_scale, const uint8_t* B,
                        numerics::Format b_fmt, const float* b_scale, float beta,
                        float* C) = 0;
  // The FP8 Linears' bf16 outputs (fp8_linear_forward's y16): true (the default): cuBLASLt
  // writes them straight as bf16 codes where it has an algorithm for that; false: always fp32
  // into y, then rounded (the fallback's path; the op check runs both).
  virtual void set_fp8_bf16_output(bool on) = 0;
  // How many FP8 Linear forwards asked for a bf16 output and fell back to fp32 + rounding
  // because cuBLASLt had no bf16-output algorithm (not counting set_fp8_bf16_output(false)).
  virtual int64_t fp8_bf16_output_fallbacks() const = 0;
  // The low-precision Linears' residual adds (fp8_linear_forward's `residual`): true (the
  // default): cuBLASLt reads the residual as C (beta 1) and writes the sum where it has an
  // algorithm for that; false: always the product into y, then add (the fallback's path; the
  // op check runs both). fp8_residual_fallbacks counts the forwards that fell back for want of
  // an algorithm (not counting set_fp8_residual_epilogue(false)).
  virtual void set_fp8_residual_epilogue(bool on) = 0;
  virtual int64_t fp8_residual_fallbacks() const = 0;
};

}  // namespace mx
