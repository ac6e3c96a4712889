// cuBLASLt for the backend's fp32 GEMMs.
//
// Row-major to column-major: a row-major [r, c] matrix with leading dimension c is the
// column-major [c, r] matrix with the same leading dimension, i.e. its transpose. So the
// row-major C[M,N] = op(A) op(B) is computed as the column-major C^T[N,M] = op(B)^T op(A)^T:
// cuBLASLt's first operand is our B (transposed iff trans_b), its second our A (iff trans_a).
#include "backend/cuda/gemm.h"

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "core/log.h"
#include "numerics/formats.h"

namespace mx::cuda {
namespace {

// Owns the cuBLASLt descriptors of one call (created per call: a few host microseconds; the
// expensive part, the algorithm heuristic, is cached by LtGemm::cached_algo).
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// vec (dst 8-byte and src 16-byte aligned): four elements a thread an iteration (a 16-byte
// load of fp32, an 8-byte store of codes, or the other way round), the rest one by one; the
// same RNE codes / exact widening either way. (Memory-bound; 2-byte accesses left much of an
// H200's bandwidth unused.)
__global__ void round_to_bf16_kernel(uint16_t* __restrict__ dst, const float* __restrict__ src,
                                     int64_t n, bool vec) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t n4 = vec ? n / 4 : 0;
  auto e = [](float v) { return uint32_t(numerics::encode_bf16(v, numerics::Saturation::kNoSat)); };
  for (int64_t j = first; j < n4; j += stride) {
    const float4 v = reinterpret_cast<const float4*>(src)[j];
    reinterpret_cast<uint2*>(dst)[j] = make_uint2(e(v.x) | e(v.y) << 16, e(v.z) | e(v.w) << 16);
  }
  for (int64_t i = 4 * n4 + first; i < n; i += stride)
    dst[i] = numerics::encode_bf16(src[i], numerics::Saturation::kNoSat);
}

__global__ void widen_bf16_kernel(float* __restrict__ dst, const uint16_t* __restrict__ src,
                                  int64_t n, bool vec) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t n4 = vec ? n / 4 : 0;
  for (int64_t j = first; j < n4; j += stride) {
    const uint2 p = reinterpret_cast<const uint2*>(src)[j];
    reinterpret_cast<float4*>(dst)[j] = make_float4(
        numerics::decode_bf16(uint16_t(p.x & 0xFFFFu)), numerics::decode_bf16(uint16_t(p.x >> 16)),
        numerics::decode_bf16(uint16_t(p.y & 0xFFFFu)), numerics::decode_bf16(uint16_t(p.y >> 16)));
  }
  for (int64_t i = 4 * n4 + first; i < n; i += stride) dst[i] = numerics::decode_bf16(src[i]);
}

bool vec_ok(const float* f32, const uint16_t* codes) {
  return reinterpret_cast<uintptr_t>(f32) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 8 == 0;
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = s == 0.0f ? 0.0f : x[i] * s;  // beta = 0 overwrites (NaN in C must not survive)
}

// The largest power of two (up to 256) dividing the address. cuBLASLt's heuristic assumes
// 256-byte-aligned operands unless told otherwise, and the backend's callers pass row offsets
// into buffers (head_cross_entropy's chunks), which may be aligned to as little as one element:
// 4 bytes for fp32, 2 for bf16 codes.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align) align /= 2;
  return align;
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

// The empty product (K = 0) of every GEMM here, as the CPU backend's: C = beta C_in (C_in null:
// C itself; beta 0 writes zeros, so a NaN in C does not survive), or, for a bf16 output C16,
// bf16 zeros (+0, code 0x0000). op: "gemm (K = 0)" and the like, for the error.
void empty_product(float* C, const float* C_in, uint16_t* C16, float beta, int64_t n,
                   cudaStream_t stream, const char* op) {
  if (C16) {
    MX_CUDA_CHECK(op, cudaMemsetAsync(C16, 0, sizeof(uint16_t) * size_t(n), stream));
    return;
  }
  if (C_in && C_in != C)
    MX_CUDA_CHECK(op, cudaMemcpyAsync(C, C_in, sizeof(float) * size_t(n),
                                      cudaMemcpyDeviceToDevice, stream));
  scale_kernel<<<grid_for(n), 256, 0, stream>>>(C, beta, n);
  MX_CUDA_LAUNCH_CHECK(op);
}

// NVFP4: alpha = the product of the two global decode scales (the emulation's s_dec = 1 / S_enc
// per operand), beta as given; both read by cuBLASLt from the device.
__global__ void nvfp4_scalars_kernel(float* scalars, const float* a_global,
                                     const float* b_global, float beta) {
  scalars[0] = (1.0f / *a_global) * (1.0f / *b_global);
  scalars[1] = beta;
}

}  // namespace

void round_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = vec_ok(src, dst);
  round_to_bf16_kernel<<<grid_for(vec ? (n + 3) / 4 : n), 256, 0, stream>>>(dst, src, n, vec);
  MX_CUDA_LAUNCH_CHECK("round_to_bf16");
}

void widen_bf16(float* dst, const uint16_t* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = vec_ok(dst, src);
  widen_bf16_kernel<<<grid_for(vec ? (n + 3) / 4 : n), 256, 0, stream>>>(dst, src, n, vec);
  MX_CUDA_LAUNCH_CHECK("widen_bf16");
}

LtGemm::LtGemm() { MX_CUBLAS_CHECK("gemm", cublasLtCreate(&handle_)); }
LtGemm::~LtGemm() {
  if (handle_) cublasLtDestroy(handle_);
}

void LtGemm::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, const float* B, float beta, float* C,
                  CudaGemmPrecision precision, void* workspace, size_t workspace_bytes,
                  DeviceArena& scratch, cudaStream_t stream) {
  if (M == 0 || N == 0) return;
  if (K == 0) return empty_product(C, nullptr, nullptr, beta, M * N, stream, "gemm (K = 0)");
  if (precision == CudaGemmPrecision::kBf16)
    return gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, nullptr, B, nullptr, beta, C, nullptr,
                     workspace, workspace_bytes, scratch, stream);
  matmul(trans_a, trans_b, M, N, K, alpha, A, B, CUDA_R_32F,
         precision == CudaGemmPrecision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                               : CUBLAS_COMPUTE_32F,
         beta, C, CUDA_R_32F, workspace, workspace_bytes, stream);
}

void LtGemm::gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float* A, const uint16_t* A16, const float* B, const uint16_t* B16,
                       float beta, float* C, uint16_t* C16, void* workspace,
                       size_t workspace_bytes, DeviceArena& scratch, cudaStream_t stream,
                       const float* C_in) {
  MX_ASSERT(!C16 || beta == 0.0f, "gemm_bf16: a bf16 result takes beta = 0");
  MX_ASSERT(!C16 || !C_in, "gemm_bf16: a bf16 result reads no C");
  if (M == 0 || N == 0) return;
  if (K == 0) return empty_product(C, C_in, C16, beta, M * N, stream, "gemm_bf16 (K = 0)");
  DeviceArenaScope scope(scratch);  // the fp32 operands' bf16 copies live until the call returns
  if (!A16) {
    uint16_t* a16 = scratch.alloc_as<uint16_t>(M * K);
    round_to_bf16(a16, A, M * K, stream);
    A16 = a16;
  }
  if (!B16) {
    uint16_t* b16 = scratch.alloc_as<uint16_t>(K * N);
    round_to_bf16(b16, B, K * N, stream);
    B16 = b16;
  }
  if (C16)
    return matmul(trans_a, trans_b, M, N, K, alpha, A16, B16, CUDA_R_16BF, CUBLAS_COMPUTE_32F,
                  0.0f, C16, CUDA_R_16BF, workspace, workspace_bytes, stream);
  matmul(trans_a, trans_b, M, N, K, alpha, A16, B16, CUDA_R_16BF, CUBLAS_COMPUTE_32F, beta, C,
         CUDA_R_32F, workspace, workspace_bytes, stream, C_in);
}

void LtGemm::matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const void* A, const void* B, cudaDataType_t in_type,
                    cublasComputeType_t compute, float beta, void* C, cudaDataType_t out_type,
                    void* workspace, size_t workspace_bytes, cudaStream_t stream,
                    const void* C_in) {
  if (!C_in) C_in = C;
  const void* first = B;   // cuBLASLt's A
  const void* second = A;  // cuBLASLt's B
  LtCall call;
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulDescCreate(&call.desc, compute, CUDA_R_32F));
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                         &op_first, sizeof(op_first)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                         &op_second, sizeof(op_second)));
  // Stored (column-major) shapes: first is our B seen column-major, [N, K] or (trans_b) [K, N].
  const uint64_t first_rows = trans_b ? K : N, first_cols = trans_b ? N : K;
  const uint64_t second_rows = trans_a ? M : K, second_cols = trans_a ? K : M;
  MX_CUBLAS_CHECK("gemm", cublasLtMatrixLayoutCreate(&call.a, in_type, first_rows, first_cols,
                                                     int64_t(first_rows)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatrixLayoutCreate(&call.b, in_type, second_rows, second_cols,
                                                     int64_t(second_rows)));
  // C and D: the row-major [M, N] output is the column-major [N, M], leading dimension N.
  MX_CUBLAS_CHECK("gemm", cublasLtMatrixLayoutCreate(&call.c, out_type, uint64_t(N),
                                                     uint64_t(M), N));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceCreate(&call.pref));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                              &workspace_bytes, sizeof(workspace_bytes)));
  // C and D share a layout, so one alignment for both: the smaller of the two pointers'.
  const uint32_t align_a = alignment_of(first), align_b = alignment_of(second),
                 align_c = std::min(alignment_of(C), alignment_of(C_in));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                              sizeof(align_a)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                              sizeof(align_b)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                              sizeof(align_c)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                              sizeof(align_c)));
  const AlgoKey key{0,       M,       N,       K,       trans_a,
                    trans_b, in_type, compute, out_type, 0,
                    align_a, align_b, align_c, int64_t(workspace_bytes)};
  const Trial trial{[&](const cublasLtMatmulAlgo_t& algo, void* D) {
                      return cublasLtMatmul(handle_, call.desc, &alpha, first, call.a, second,
                                            call.b, &beta, C_in, call.c, D, call.c, &algo,
                                            workspace, workspace_bytes, stream);
                    },
                    C, size_t(M * N) * (out_type == CUDA_R_16BF ? 2 : 4),
                    beta != 0.0f && C_in == C,
                    2.0 * double(M) * double(N) * double(K), stream};
  const cublasLtMatmulAlgo_t* algo =
      cached_algo(key, call.desc, call.a, call.b, call.c, call.pref, "gemm", &trial);
  if (!algo)
    throw CudaError(str("cublasLt: gemm: no algorithm for M=", M, " N=", N, " K=", K,
                        " trans_a=", trans_a, " trans_b=", trans_b, " in_type=", int(in_type),
                        " out_type=", int(out_type)));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmul(handle_, call.desc, &alpha, first, call.a, second,
                                         call.b, &beta, C_in, call.c, C, call.c, algo, workspace,
                                         workspace_bytes, stream));
}

const cublasLtMatmulAlgo_t* LtGemm::cached_algo(const AlgoKey& key, cublasLtMatmulDesc_t desc,
                                                cublasLtMatrixLayout_t a,
                                                cublasLtMatrixLayout_t b,
                                                cublasLtMatrixLayout_t c,
                                                cublasLtMatmulPreference_t pref,
                                                const char* op, const Trial* trial,
                                                bool may_fall_back) {
  if (auto it = algos_.find(key); it != algos_.end()) return &it->second;
  if (no_algo_.count(key)) return nullptr;
  const bool tune = trial && (tune_ == CudaGemmTune::kAll ||
                              (tune_ == CudaGemmTune::kLarge && trial->flops >= 0x1p30));
  cublasLtMatmulHeuristicResult_t heuristic[kTuneCandidates] = {};
  int found = 0;
  // No algorithm shows as CUBLAS_STATUS_NOT_SUPPORTED (as Transformer Engine reads it) or as
  // success with none found: both are "none" here, any other status an error, except where
  // the caller has another way (a bf16 output or a residual read apart from D: fp32 then
  // round or add). There the documented NOT_SUPPORTED may come as CUBLAS_STATUS_INVALID_VALUE
  // (an output type or layout cuBLASLt reads as invalid; from the cuBLASLt review,
  // 2026-12-07: not seen on a GPU either way), which would end a run the fallback can finish:
  // said once, and taken as none. Failures (allocation, internal, execution) still stop.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, desc, a, b, c, c, pref, tune ? kTuneCandidates : 1, heuristic, &found);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
    if (!may_fall_back || st != CUBLAS_STATUS_INVALID_VALUE) MX_CUBLAS_CHECK(op, st);
    if (heuristic_refusals_++ == 0)
      info(str("cuda: cublasLt: ", op, ": the algorithm heuristic answered ",
               cublasLtGetStatusName(st), " at M=", key[1], " N=", key[2], " K=", key[3],
               "; taken as no algorithm there (the call's other way runs: slower)"));
  }
  int n = 0;  // the usable candidates, in the heuristic's order
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (heuristic[i].state == CUBLAS_STATUS_SUCCESS) heuristic[n++] = heuristic[i];
  if (n == 0) {  // the caller throws, or falls back
    no_algo_.insert(key);
    return nullptr;
  }
  const int pick = tune && n > 1 ? fastest(heuristic, n, *trial, op) : 0;
  return &algos_.emplace(key, heuristic[pick].algo).first->second;
}

int LtGemm::fastest(const cublasLtMatmulHeuristicResult_t* cand, int n, const Trial& trial,
                    const char* op) {
  // The trials' events and stand-in output, freed on every way out (a CUDA error throws).
  struct Resources {
    cudaEvent_t ev[2] = {nullptr, nullptr};
    void* stand_in = nullptr;
    ~Resources() {
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
      if (stand_in) cudaFree(stand_in);
    }
  } res;
  // Where the trials write: the call's output when the call does not read it, else a stand-in.
  void* D = trial.D;
  if (trial.reads_c) {
    if (cudaMalloc(&res.stand_in, trial.d_bytes) != cudaSuccess) {
      cudaGetLastError();  // no memory to spare: the heuristic's first, untimed
      res.stand_in = nullptr;
      return 0;
    }
    D = res.stand_in;
  }
  cudaEvent_t* ev = res.ev;
  int best = 0, timed = 0;
  double best_s = 0, first_s = 0;
  bool timed_first = false;
  for (cudaEvent_t& e : res.ev) MX_CUDA_CHECK(op, cudaEventCreate(&e));
  for (int i = 0; i < n; ++i) {
    // A candidate cuBLASLt refuses at run time (a workspace or alignment rule the heuristic
    // did not apply) is left out; the last error is cleared so the next op does not see it.
    if (trial.run(cand[i].algo, D) != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();
      continue;
    }
    MX_CUDA_CHECK(op, cudaEventRecord(ev[0], trial.stream));
    bool ok = true;
    for (int r = 0; r < kTuneRuns && ok; ++r)
      ok = trial.run(cand[i].algo, D) == CUBLAS_STATUS_SUCCESS;
    MX_CUDA_CHECK(op, cudaEventRecord(ev[1], trial.stream));
    MX_CUDA_CHECK(op, cudaEventSynchronize(ev[1]));
    if (!ok) {
      cudaGetLastError();
      continue;
    }
    float ms = 0;
    MX_CUDA_CHECK(op, cudaEventElapsedTime(&ms, ev[0], ev[1]));
    const double s = double(ms) * 1e-3 / kTuneRuns;
    ++timed;
    if (i == 0) {
      first_s = s;
      timed_first = true;
    }
    if (best_s == 0 || s < best_s) {
      best_s = s;
      best = i;
    }
  }
  ++tune_stats_.timed;
  if (best != 0) ++tune_stats_.changed;
  if (std::getenv("MXTRAIN_CUDA_GEMM_TUNE_LOG"))  // one line a shape (bench/gpu/check.sh)
    info(str("cuda gemm tune: ", op, " ", trial.flops / 1e9, " GFLOP: candidate ", best, " of ",
             n, " (", timed, " timed), ", best_s * 1e3, " ms (first ",
             timed_first ? first_s * 1e3 : -1.0, " ms), ",
             best_s > 0 ? trial.flops / best_s / 1e12 : 0.0, " TFLOP/s",
             trial.reads_c ? ", stand-in output" : ""));
  return best;
}

bool LtGemm::fp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A, numerics::Format a_fmt,
                      const float* a_scale, const uint8_t* B, numerics::Format b_fmt,
                      const float* b_scale, float beta, float* C, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream, uint16_t* C16,
                      const float* C_in) {
  return fp8_gemm_scaled(M, N, K, A, a_fmt, a_scale, 0, B, b_fmt, b_scale, 0, beta, C,
                         workspace, workspace_bytes, stream, C16, C_in);
}

bool LtGemm::fp8_block_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A,
                            const float* a_scales, bool a_2d, const uint8_t* B,
                            const float* b_scales, bool b_2d, float beta, float* C,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            uint16_t* C16, const float* C_in) {
  MX_REQUIRE(!(a_2d && b_2d), "fp8_block_gemm: 128x128 blocks on one operand only");
  MX_REQUIRE(M % 128 == 0 && N % 128 == 0 && K % 128 == 0, "fp8_block_gemm: M = ", M,
             ", N = ", N, ", K = ", K, " must be multiples of 128");
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  return fp8_gemm_scaled(M, N, K, A, numerics::Format::kE4M3, a_scales, a_2d ? blk : vec, B,
                         numerics::Format::kE4M3, b_scales, b_2d ? blk : vec, beta, C, workspace,
                         workspace_bytes, stream, C16, C_in);
}

bool LtGemm::mxfp8_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A,
                        const uint8_t* a_scales, const uint8_t* B, const uint8_t* b_scales,
                        float beta, float* C, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream, uint16_t* C16, const float* C_in) {
  MX_REQUIRE(M % 16 == 0 && N % 16 == 0 && K % 32 == 0, "mxfp8_gemm: M = ", M, ", N = ", N,
             " must be multiples of 16 and K = ", K, " of 32");
  const int32_t vec32 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  return fp8_gemm_scaled(M, N, K, A, numerics::Format::kE4M3, a_scales, vec32, B,
                         numerics::Format::kE4M3, b_scales, vec32, beta, C, workspace,
                         workspace_bytes, stream, C16, C_in);
}

bool LtGemm::nvfp4_gemm(int64_t M, int64_t N, int64_t K, const uint8_t* A,
                        const uint8_t* a_scales, const float* a_global, const uint8_t* B,
                        const uint8_t* b_scales, const float* b_global, float beta, float* C,
                        float* scalars, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream, uint16_t* C16, const float* C_in) {
  MX_REQUIRE(M % 16 == 0 && N % 16 == 0 && K % 32 == 0, "nvfp4_gemm: M = ", M, ", N = ", N,
             " must be multiples of 16 and K = ", K, " of 32");
  MX_REQUIRE(!C16 || (beta == 0.0f && !C_in), "nvfp4_gemm: a bf16 output takes beta 0, no C");
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    empty_product(C, C_in, C16, beta, M * N, stream, "nvfp4_gemm (K = 0)");
    return true;
  }
  // beta is read from the device, so the kernel cannot skip C when it is 0: zero the output
  // (C, which is then D) first, so that a NaN-poisoned one cannot leak (0 * NaN) into the
  // result. 2 bytes an element for bf16 codes, where fp32 and a rounding pass moved 14.
  if (beta == 0.0f && !C_in) {
    void* out = C16 ? static_cast<void*>(C16) : static_cast<void*>(C);
    const size_t bytes = (C16 ? sizeof(uint16_t) : sizeof(float)) * size_t(M * N);
    MX_CUDA_CHECK("nvfp4_gemm", cudaMemsetAsync(out, 0, bytes, stream));
  }
  nvfp4_scalars_kernel<<<1, 1, 0, stream>>>(scalars, a_global, b_global, beta);
  MX_CUDA_LAUNCH_CHECK("nvfp4_gemm (alpha)");
  // Packed FP4 layouts are described in elements (K rows, leading dimension K).
  const int32_t vec16 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  return scaled_tn_gemm("nvfp4_gemm", M, N, K, {A, CUDA_R_4F_E2M1, a_scales, vec16},
                        {B, CUDA_R_4F_E2M1, b_scales, vec16}, scalars, scalars + 1, true, beta,
                        C, workspace, workspace_bytes, stream,
                        "FP4 needs compute capability 10.x, cuBLAS >= 12.8", C16, C_in);
}

bool LtGemm::fp8_gemm_scaled(int64_t M, int64_t N, int64_t K, const uint8_t* A,
                             numerics::Format a_fmt, const void* a_scale, int32_t a_mode,
                             const uint8_t* B, numerics::Format b_fmt, const void* b_scale,
                             int32_t b_mode, float beta, float* C, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream, uint16_t* C16,
                             const float* C_in) {
  using numerics::Format;
  MX_REQUIRE((a_fmt == Format::kE4M3 || a_fmt == Format::kE5M2) &&
                 (b_fmt == Format::kE4M3 || b_fmt == Format::kE5M2) &&
                 !(a_fmt == Format::kE5M2 && b_fmt == Format::kE5M2),
             "fp8_gemm: E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 only");
  MX_REQUIRE(M % 16 == 0 && N % 16 == 0 && K % 16 == 0, "fp8_gemm: M = ", M, ", N = ", N,
             ", K = ", K, " must be multiples of 16");
  MX_REQUIRE(!C16 || beta == 0.0f, "fp8_gemm: a bf16 output takes beta 0, got ", beta);
  MX_REQUIRE(!C16 || !C_in, "fp8_gemm: a bf16 output reads no C");
  if (M == 0 || N == 0) return true;
  if (K == 0) {
    empty_product(C, C_in, C16, beta, M * N, stream, "fp8_gemm (K = 0)");
    return true;
  }
  auto type = [](Format f) { return f == Format::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; };
  const float alpha = 1.0f;
  return scaled_tn_gemm("fp8_gemm", M, N, K, {A, type(a_fmt), a_scale, a_mode},
                        {B, type(b_fmt), b_scale, b_mode}, &alpha, &beta, false, beta, C,
                        workspace, workspace_bytes, stream, "FP8 needs sm_89+", C16, C_in);
}

bool LtGemm::scaled_tn_gemm(const char* op, int64_t M, int64_t N, int64_t K,
                            const ScaledOperand& a, const ScaledOperand& b, const float* alpha,
                            const float* beta, bool device_scalars, float beta_value, float* C,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            const char* hint, uint16_t* D16, const float* C_in) {
  // Column-major: C^T[N, M] = B[K, N]^T A[K, M], where our row-major B[N, K] is the
  // column-major [K, N] (ld K) and A[M, K] the column-major [K, M]: cuBLASLt's A is our B
  // (transposed), its B our A: the TN form. The scale pointers and modes follow the operands.
  // A bf16 output (D16): C and D both described as bf16 (the FP8 kernels' "C type BF16, D type
  // BF16" form; beta 0, so C is not read, or with device scalars read as D16, zeroed).
  MX_REQUIRE(!D16 || (beta_value == 0.0f && !C_in), op,
             ": a bf16 output takes beta 0 and no C");
  void* D = D16 ? static_cast<void*>(D16) : static_cast<void*>(C);
  // Where beta's term is read: C_in, or D itself. C and D share a layout, so one alignment.
  const void* Cr = C_in ? static_cast<const void*>(C_in) : D;
  const cudaDataType_t out_type = D16 ? CUDA_R_16BF : CUDA_R_32F;
  LtCall call;
  MX_CUBLAS_CHECK(op, cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes) {
    MX_CUBLAS_CHECK(op, cublasLtMatmulDescSetAttribute(call.desc, attr, v, bytes));
  };
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t);
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n);
  if (device_scalars) {  // alpha and beta are read from the device
    const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
    set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof mode);
  }
  // Fast accumulation (CudaFp8FastAccum): per-tensor FP8 only; "fprop" where both operands are
  // E4M3 (the per-tensor recipes' gradients are E5M2, so that is the forward GEMMs).
  auto fp8 = [](cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; };
  const bool fast =
      a.mode == 0 && b.mode == 0 && fp8(a.type) && fp8(b.type) &&
      (fast_accum_ == CudaFp8FastAccum::kAll ||
       (fast_accum_ == CudaFp8FastAccum::kForward && a.type == CUDA_R_8F_E4M3 &&
        b.type == CUDA_R_8F_E4M3));
  if (fast) {
    const int8_t on = 1;
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on);
  }
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b.scale, sizeof b.scale);
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.scale, sizeof a.scale);
  if (a.mode != 0 || b.mode != 0) {  // block scales
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &b.mode, sizeof b.mode);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &a.mode, sizeof a.mode);
  }
  MX_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&call.a, b.type, uint64_t(K), uint64_t(N), K));
  MX_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&call.b, a.type, uint64_t(K), uint64_t(M), K));
  MX_CUBLAS_CHECK(op, cublasLtMatrixLayoutCreate(&call.c, out_type, uint64_t(N), uint64_t(M), N));
  MX_CUBLAS_CHECK(op, cublasLtMatmulPreferenceCreate(&call.pref));
  MX_CUBLAS_CHECK(op, cublasLtMatmulPreferenceSetAttribute(
                          call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                          sizeof(workspace_bytes)));
  const uint32_t align_cd = std::min(alignment_of(D), alignment_of(Cr));
  const uint32_t aligns[4] = {alignment_of(b.data), alignment_of(a.data), align_cd, align_cd};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    MX_CUBLAS_CHECK(op, cublasLtMatmulPreferenceSetAttribute(call.pref, attrs[i], &aligns[i],
                                                             sizeof aligns[i]));
  // (fast accumulation changes which kernels qualify: a key of its own; so does C read apart
  // from D, which the heuristic cannot see but the call might refuse: below)
  const AlgoKey key{(D16 ? 2 : 1) + (fast ? 4 : 0) + (Cr != D ? 8 : 0),
                    M, N, K, a.type, b.type, a.mode, b.mode, device_scalars,
                    a.scale != nullptr, aligns[0], aligns[1], aligns[2],
                    int64_t(workspace_bytes)};
  // (device scalars, nvfp4's: beta is not known here, and C was zeroed for it: untuned)
  const Trial trial{[&](const cublasLtMatmulAlgo_t& algo, void* out) {
                      return cublasLtMatmul(handle_, call.desc, alpha, b.data, call.a, a.data,
                                            call.b, beta, Cr, call.c, out, call.c, &algo,
                                            workspace, workspace_bytes, stream);
                    },
                    D, size_t(M * N) * (D16 ? 2 : 4), beta_value != 0.0f && Cr == D,
                    2.0 * double(M) * double(N) * double(K), stream};
  const cublasLtMatmulAlgo_t* algo =
      cached_algo(key, call.desc, call.a, call.b, call.c, call.pref, op,
                  device_scalars ? nullptr : &trial, D16 || C_in);
  if (!algo) {
    if (D16 || C_in) return false;  // the caller writes fp32 and rounds, or adds C_in after
    throw CudaError(str("cublasLt: ", op, ": no algorithm for M=", M, " N=", N, " K=", K,
                        " beta=", beta_value, " (", hint, ")"));
  }
  const cublasStatus_t st =
      cublasLtMatmul(handle_, call.desc, alpha, b.data, call.a, a.data, call.b, beta, Cr, call.c,
                     D, call.c, algo, workspace, workspace_bytes, stream);
  // The heuristic sees C and D as one descriptor and no pointers, so it cannot know that C_in
  // lies apart from D; were the call itself to refuse that (or a bf16 output) as unsupported,
  // which it does before launching anything, the caller's fallback takes it, as for a missing
  // algorithm, and the key is remembered as having none (from the cuBLASLt review,
  // 2026-12-07: documented as supported, not seen on a GPU either way).
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && (D16 || C_in)) {
    algos_.erase(key);
    no_algo_.insert(key);
    return false;
  }
  MX_CUBLAS_CHECK(op, st);
  if (fast) ++fast_accum_gemms_;
  return true;
}

}  // namespace mx::cuda
