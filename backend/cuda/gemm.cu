// cuBLASLt for the backend's fp32 GEMMs.
//
// Row-major to column-major: a row-major [r, c] matrix with leading dimension c is the
// column-major [c, r] matrix with the same leading dimension, i.e. its transpose. So the
// row-major C[M,N] = op(A) op(B) is computed as the column-major C^T[N,M] = op(B)^T op(A)^T:
// cuBLASLt's first operand is our B (transposed iff trans_b), its second our A (iff trans_a).
#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "numerics/formats.h"

namespace mx::cuda {
namespace {

// Owns the cuBLASLt descriptors of one call (created per call: cheap next to any GEMM worth
// running on a GPU; caching them by shape is a later optimization).
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

__global__ void round_to_bf16_kernel(uint16_t* __restrict__ dst, const float* __restrict__ src,
                                     int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = numerics::encode_bf16(src[i], numerics::Saturation::kNoSat);
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = s == 0.0f ? 0.0f : x[i] * s;  // beta = 0 overwrites (NaN in C must not survive)
}

// The largest power of two (up to 256) dividing the address. cuBLASLt's heuristic assumes
// 256-byte-aligned operands unless told otherwise, and the backend's callers pass row offsets
// into buffers (head_cross_entropy's chunks), which may be aligned to as little as 4 bytes.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 4 && a % align) align /= 2;
  return align;
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return unsigned(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

void round_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  round_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(dst, src, n);
  MX_CUDA_LAUNCH_CHECK("round_to_bf16");
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
  if (K == 0) {  // C = beta C, as the CPU backend does
    scale_kernel<<<grid_for(M * N), 256, 0, stream>>>(C, beta, M * N);
    MX_CUDA_LAUNCH_CHECK("gemm (K = 0)");
    return;
  }
  DeviceArenaScope scope(scratch);
  const void* first = B;   // cuBLASLt's A
  const void* second = A;  // cuBLASLt's B
  cudaDataType_t in_type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (precision == CudaGemmPrecision::kTf32) compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  if (precision == CudaGemmPrecision::kBf16) {
    uint16_t* a16 = scratch.alloc_as<uint16_t>(M * K);
    uint16_t* b16 = scratch.alloc_as<uint16_t>(K * N);
    round_to_bf16(a16, A, M * K, stream);
    round_to_bf16(b16, B, K * N, stream);
    first = b16;
    second = a16;
    in_type = CUDA_R_16BF;
  }
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
  MX_CUBLAS_CHECK("gemm", cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, uint64_t(N),
                                                     uint64_t(M), N));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceCreate(&call.pref));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulPreferenceSetAttribute(
                              call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                              &workspace_bytes, sizeof(workspace_bytes)));
  const uint32_t align_a = alignment_of(first), align_b = alignment_of(second),
                 align_c = alignment_of(C);
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
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  MX_CUBLAS_CHECK("gemm", cublasLtMatmulAlgoGetHeuristic(handle_, call.desc, call.a, call.b,
                                                         call.c, call.c, call.pref, 1,
                                                         &heuristic, &found));
  if (found == 0)
    throw CudaError(str("cublasLt: gemm: no algorithm for M=", M, " N=", N, " K=", K,
                        " trans_a=", trans_a, " trans_b=", trans_b));
  MX_CUBLAS_CHECK("gemm", cublasLtMatmul(handle_, call.desc, &alpha, first, call.a, second,
                                         call.b, &beta, C, call.c, C, call.c, &heuristic.algo,
                                         workspace, workspace_bytes, stream));
}

void LtGemm::fp8_linear_forward(float* y, const uint8_t* x, numerics::Format x_fmt,
                                const float* x_scale, const uint8_t* w, numerics::Format w_fmt,
                                const float* w_scale, int64_t N, int64_t in, int64_t out,
                                void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using numerics::Format;
  MX_REQUIRE((x_fmt == Format::kE4M3 || x_fmt == Format::kE5M2) &&
                 (w_fmt == Format::kE4M3 || w_fmt == Format::kE5M2) &&
                 !(x_fmt == Format::kE5M2 && w_fmt == Format::kE5M2),
             "fp8_linear_forward: E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3 only");
  MX_REQUIRE(in % 16 == 0, "fp8_linear_forward: in = ", in, " must be a multiple of 16");
  if (N == 0 || out == 0) return;
  auto type = [](Format f) { return f == Format::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; };
  // Column-major: y^T[out, N] = W[in, out]^T x^T[in, N]: cuBLASLt's A = w (transposed), B = x.
  LtCall call;
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  MX_CUBLAS_CHECK("fp8_linear_forward", cublasLtMatmulDescSetAttribute(
                                            call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
  MX_CUBLAS_CHECK("fp8_linear_forward", cublasLtMatmulDescSetAttribute(
                                            call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                 &w_scale, sizeof w_scale));
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &x_scale, sizeof x_scale));
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatrixLayoutCreate(&call.a, type(w_fmt), uint64_t(in), uint64_t(out), in));
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatrixLayoutCreate(&call.b, type(x_fmt), uint64_t(in), uint64_t(N), in));
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, uint64_t(out), uint64_t(N), out));
  MX_CUBLAS_CHECK("fp8_linear_forward", cublasLtMatmulPreferenceCreate(&call.pref));
  MX_CUBLAS_CHECK("fp8_linear_forward", cublasLtMatmulPreferenceSetAttribute(
                                            call.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &workspace_bytes, sizeof(workspace_bytes)));
  const uint32_t aligns[4] = {alignment_of(w), alignment_of(x), alignment_of(y), alignment_of(y)};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    MX_CUBLAS_CHECK("fp8_linear_forward", cublasLtMatmulPreferenceSetAttribute(
                                              call.pref, attrs[i], &aligns[i], sizeof aligns[i]));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatmulAlgoGetHeuristic(handle_, call.desc, call.a, call.b, call.c,
                                                 call.c, call.pref, 1, &heuristic, &found));
  if (found == 0)
    throw CudaError(str("cublasLt: fp8_linear_forward: no algorithm for N=", N, " in=", in,
                        " out=", out, " (FP8 needs sm_89+)"));
  const float alpha = 1.0f, beta = 0.0f;
  MX_CUBLAS_CHECK("fp8_linear_forward",
                  cublasLtMatmul(handle_, call.desc, &alpha, w, call.a, x, call.b, &beta, y,
                                 call.c, y, call.c, &heuristic.algo, workspace, workspace_bytes,
                                 stream));
}

}  // namespace mx::cuda
