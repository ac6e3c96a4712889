// mxemu's cuBLASLt (see include/cublasLt.h): D = alpha op(A) op(B) + beta C on column-major
// matrices, each element decoded from its type and multiplied by its scale as the scale mode
// defines it, accumulated in double (OpenBLAS's dgemm), the result written in D's type (bf16: round to nearest
// even). The heuristic refuses what cuBLASLt's documentation rules out for the emulated
// device (MXEMU_SM): FP8 below 8.9, FP8 outside the "TN" form, E5M2 x E5M2, the 1D / 2D block
// scales of 128 off 9.x, the VEC32 / VEC16 block scales and FP4 off 10.x, leading dimensions
// of FP8 / FP4 operands that are not 16 bytes, operands less than 16-byte aligned.
#include <cblas.h>
#include <cublasLt.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "numerics/block_scale_layout.h"
#include "numerics/formats.h"

namespace mx = ::mx;

struct cublasLtContext {
  int dummy = 0;
};
struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute;
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  int32_t a_mode = 0, b_mode = 0;
  // CUBLASLT_MATMUL_DESC_FAST_ACCUM: accepted on per-tensor FP8 only (stricter than cuBLASLt,
  // which documents it for FP8); the product is the same fp32 sum either way (the emulation
  // has no narrower accumulator to skip promoting).
  int8_t fast_accum = 0;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceOpaque {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

namespace {

// The heuristic's candidates (algo.data[0] = 1 .. kAlgos), and the one the run refuses.
constexpr int kAlgos = 3;
constexpr uint64_t kRefusedAlgo = 3;

template <class T>
cublasStatus_t read_attr(T& dst, const void* buf, size_t bytes) {
  if (bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&dst, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

bool fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
// FP8 or FP4: the operand types that take scales and the TN form.
bool low_precision(cudaDataType_t t) { return fp8(t) || t == CUDA_R_4F_E2M1; }
double elem_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    case CUDA_R_4F_E2M1: return 0.5;
  }
  return 0;
}

// Element (i, j) of a column-major matrix.
float element(const void* p, cudaDataType_t t, int64_t ld, int64_t i, int64_t j) {
  const int64_t e = i + j * ld;
  switch (t) {
    case CUDA_R_32F: return static_cast<const float*>(p)[e];
    case CUDA_R_16BF: return mx::numerics::decode_bf16(static_cast<const uint16_t*>(p)[e]);
    case CUDA_R_8F_E4M3: return mx::numerics::decode_e4m3(static_cast<const uint8_t*>(p)[e]);
    case CUDA_R_8F_E5M2: return mx::numerics::decode_e5m2(static_cast<const uint8_t*>(p)[e]);
    case CUDA_R_4F_E2M1: {  // two a byte, the lower-indexed element in the low nibble
      const uint8_t b = static_cast<const uint8_t*>(p)[e / 2];
      return mx::numerics::decode_e2m1(uint8_t(e % 2 ? b >> 4 : b & 0xF));
    }
  }
  return NAN;
}

// TF32: fp32 rounded to 10 mantissa bits (nearest even), as FAST_TF32 may convert inputs.
float tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
  std::memcpy(&x, &u, 4);
  return x;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The decode scale of element k of row r (0 <= r < R) of an operand whose K runs along the
// stored columns' length (the TN form's K-major operands), for a scale mode.
float block_scale(int32_t mode, const void* scale, int64_t R, int64_t K, int64_t r, int64_t k) {
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F:
      return scale ? *static_cast<const float*>(scale) : 1.0f;
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0:
      return mx::numerics::decode_e8m0(static_cast<const uint8_t*>(
          scale)[mx::numerics::swizzled_scale_offset(r, k / 32, K / 32)]);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3:
      return mx::numerics::decode_ue4m3(static_cast<const uint8_t*>(
          scale)[mx::numerics::swizzled_scale_offset(r, k / 16, K / 16)]);
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F:  // [K / 128, round_up(R, 4)], r innermost
      return static_cast<const float*>(scale)[(k / 128) * round_up(R, 4) + r];
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F:  // [R / 128, round_up(K / 128, 4)]
      return static_cast<const float*>(scale)[(r / 128) * round_up((K + 127) / 128, 4) + k / 128];
  }
  return NAN;
}

// Why cuBLASLt has no algorithm for these descriptors on the emulated device, or null.
const char* unsupported(const cublasLtMatmulDescOpaque& d, const cublasLtMatrixLayoutOpaque& a,
                        const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
                        const cublasLtMatmulPreferenceOpaque* pref) {
  const int sm = mxemu::compute_capability();
  const bool low = low_precision(a.type) || low_precision(b.type);
  const auto block = [](int32_t m) { return m != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F; };
  if (d.fast_accum && (!fp8(a.type) || !fp8(b.type) || block(d.a_mode) || block(d.b_mode)))
    return "fast accumulation off per-tensor FP8 (mxemu takes it there only)";
  if (!low) {
    if (a.type != b.type) return "mixed operand types";
    if (block(d.a_mode) || block(d.b_mode)) return "block scales on fp32 / bf16 operands";
    if (c.type == CUDA_R_16BF && a.type != CUDA_R_16BF) return "bf16 output of fp32 operands";
    return nullptr;
  }
  if (sm < 89) return "FP8 needs compute capability 8.9";
  if (d.trans_a != CUBLAS_OP_T || d.trans_b != CUBLAS_OP_N) return "FP8 / FP4 need the TN form";
  if (a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2) return "E5M2 x E5M2";
  if (c.type != CUDA_R_32F && c.type != CUDA_R_16BF) return "output type";
  if (d.compute != CUBLAS_COMPUTE_32F) return "compute type";
  const bool fp4 = a.type == CUDA_R_4F_E2M1 || b.type == CUDA_R_4F_E2M1;
  if (fp4 && (a.type != b.type)) return "FP4 with another type";
  for (int32_t m : {d.a_mode, d.b_mode}) {
    if ((m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) &&
        sm / 10 != 9)
      return "128-element block scales need compute capability 9.x";
    if ((m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 || m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3) &&
        sm / 10 != 10)
      return "VEC32 / VEC16 block scales need compute capability 10.x";
    if (m == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) return "outer-vector scales (not emulated)";
  }
  if (d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
      d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
    return "128x128 blocks on both operands";
  if (fp4 != (d.a_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3) ||
      fp4 != (d.b_mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3))
    return "FP4 takes VEC16_UE4M3 scales on both operands, and only FP4 does";
  if (std::fmod(double(a.ld) * elem_bytes(a.type), 16.0) != 0 ||
      std::fmod(double(b.ld) * elem_bytes(b.type), 16.0) != 0)
    return "FP8 / FP4 leading dimensions must be multiples of 16 bytes";
  if (pref && (pref->align[0] < 16 || pref->align[1] < 16)) return "FP8 / FP4 operands 16-byte aligned";
  return nullptr;
}

// D = alpha op(A) op(B) + beta C, as queued by cublasLtMatmul (its checks done).
void product(const cublasLtMatmulDescOpaque& dc, const void* alpha_p, const void* A,
             const cublasLtMatrixLayoutOpaque* a, const void* B, const cublasLtMatrixLayoutOpaque* b,
             const void* beta_p, const void* C, const cublasLtMatrixLayoutOpaque* c, void* D,
             const cublasLtMatrixLayoutOpaque* d, void* workspace, size_t workspace_bytes,
             int64_t m, int64_t n, int64_t k) {
  const bool ta = dc.trans_a == CUBLAS_OP_T, tb = dc.trans_b == CUBLAS_OP_T;
  const bool dev_scalars = dc.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  mxemu::DeviceAccess access;
  float alpha, beta;
  std::memcpy(&alpha, alpha_p, 4);
  std::memcpy(&beta, beta_p, 4);
  // A kernel may use the workspace as it likes: whatever was there is gone.

  if (workspace && workspace_bytes) std::memset(workspace, 0xFF, workspace_bytes);
  const bool tf = dc.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  // op(A) as [m, k] and op(B)^T as [n, k], row-major, decoded and scaled.
  std::vector<double> oa(size_t(m * k)), ob(size_t(n * k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t kk = 0; kk < k; ++kk) {
      float v = ta ? element(A, a->type, a->ld, kk, r) : element(A, a->type, a->ld, r, kk);
      if (tf) v = tf32(v);
      oa[size_t(r * k + kk)] = double(v) * block_scale(dc.a_mode, dc.a_scale, m, k, r, kk);
    }
  for (int64_t col = 0; col < n; ++col)
    for (int64_t kk = 0; kk < k; ++kk) {
      float v = tb ? element(B, b->type, b->ld, col, kk) : element(B, b->type, b->ld, kk, col);
      if (tf) v = tf32(v);
      ob[size_t(col * k + kk)] = double(v) * block_scale(dc.b_mode, dc.b_scale, n, k, col, kk);
    }
  // The 1D block scales' layout pads K / block to a multiple of 4 with scales the GEMM reads
  // (block_scale_layout.h: they must be finite, the padding's data being zero): a row whose
  // padding scales are not finite gives NaN, as 0 x NaN does on the GPU.
  auto padding_nan = [&](int32_t mode, const void* scale, int64_t R, std::vector<char>& rows) {
    rows.assign(size_t(R), 0);
    const int64_t block = mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0   ? 32
                          : mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 ? 16
                                                                             : 0;
    if (!block) return;
    const int64_t kb = k / block, padded = (kb + 3) / 4 * 4;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = kb; j < padded; ++j) {
        const uint8_t byte = static_cast<const uint8_t*>(scale)[mx::numerics::swizzled_scale_offset(r, j, kb)];
        const float v = block == 32 ? mx::numerics::decode_e8m0(byte) : mx::numerics::decode_ue4m3(byte);
        if (!std::isfinite(v)) rows[size_t(r)] = 1;
      }
  };
  std::vector<char> nan_rows_a, nan_rows_b;
  padding_nan(dc.a_mode, dc.a_scale, m, nan_rows_a);
  padding_nan(dc.b_mode, dc.b_scale, n, nan_rows_b);
  // prod [m, n] = op(A) op(B), in double (OpenBLAS).
  std::vector<double> prod(size_t(m * n));
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0, oa.data(),
              int(k), ob.data(), int(k), 0.0, prod.data(), int(n));
  for (int64_t col = 0; col < n; ++col)
    for (int64_t r = 0; r < m; ++r) {
      float v = float(double(alpha) * prod[size_t(r * n + col)]);
      // A host beta of 0 lets the kernel skip C; a device-side beta cannot (the kernel reads
      // C before it knows beta), so there C's NaNs come through, as they would on a GPU.
      if (beta != 0.0f || dev_scalars) v += beta * element(C, c->type, c->ld, r, col);
      if (nan_rows_a[size_t(r)] || nan_rows_b[size_t(col)]) v = NAN;
      const int64_t e = r + col * d->ld;
      if (d->type == CUDA_R_16BF)
        static_cast<uint16_t*>(D)[e] = mx::numerics::encode_bf16(v, mx::numerics::Saturation::kNoSat);
      else
        static_cast<float*>(D)[e] = v;
    }
}

}  // namespace

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown status";
}

// MXEMU_LT_HEURISTIC_BF16_OUT: the heuristic's answer for FP8 / FP4 operands with a bf16
// output. `invalid`: refused as an invalid value rather than the documented NOT_SUPPORTED,
// what the backend must survive were a GPU's cuBLASLt to answer that way; `failed`: a failure
// (CUBLAS_STATUS_EXECUTION_FAILED), which must still stop the call (docs/cuda_emu.md). Read
// once, when the first handle is made, so that a bad value stops every run that uses cuBLASLt,
// not only one that reaches such a GEMM.
static cublasStatus_t heuristic_bf16_out_answer() {
  static const cublasStatus_t answer = [] {
    switch (mxemu::env_choice("MXEMU_LT_HEURISTIC_BF16_OUT", {"invalid", "failed"})) {
      case 0: return CUBLAS_STATUS_INVALID_VALUE;
      case 1: return CUBLAS_STATUS_EXECUTION_FAILED;
      default: return CUBLAS_STATUS_SUCCESS;
    }
  }();
  return answer;
}
// MXEMU_LT_REFUSE_OUT_OF_PLACE (0 or 1, read with the other knob): below, in cublasLtMatmul.
static bool refuse_out_of_place() {
  static const bool refuse = mxemu::env_choice("MXEMU_LT_REFUSE_OUT_OF_PLACE", {"0", "1"}) == 1;
  return refuse;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  heuristic_bf16_out_answer();
  refuse_out_of_place();
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque;
  (*desc)->compute = compute;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return read_attr(d->pointer_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_attr(d->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_attr(d->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return read_attr(d->a_scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return read_attr(d->b_scale, buf, bytes);
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return read_attr(d->a_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return read_attr(d->b_mode, buf, bytes);
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return read_attr(d->fast_accum, buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (ld < int64_t(rows) || elem_bytes(type) == 0) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque{type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t bytes) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_attr(p->workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return read_attr(p->align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return read_attr(p->align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return read_attr(p->align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return read_attr(p->align[3], buf, bytes);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results,
                                              int* returned) {
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  if (unsupported(*desc, *a, *b, *c, pref)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (c->type == CUDA_R_16BF && low_precision(a->type)) {
    const cublasStatus_t answer = heuristic_bf16_out_answer();
    if (answer != CUBLAS_STATUS_SUCCESS) return answer;
  }
  // Up to three candidates, all computing the same product; the third is one the run refuses
  // (cublasLtMatmul: CUBLAS_STATUS_NOT_SUPPORTED), as cuBLASLt may refuse a heuristic's
  // candidate at run time: the backend's GEMM tuning must leave it out.
  *returned = requested < kAlgos ? requested : kAlgos;
  for (int i = 0; i < *returned; ++i) {
    results[i] = {};
    results[i].algo.data[0] = uint64_t(i + 1);
    results[i].state = CUBLAS_STATUS_SUCCESS;
    results[i].wavesCount = 1.0f;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha_p,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta_p, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  // The descriptors and host scalars are read at the call, as cuBLASLt does; the operands,
  // scales and device scalars when the stream gets to the product.
  const cublasLtMatmulDescOpaque dc = *desc;
  if (!algo || algo->data[0] == kRefusedAlgo || unsupported(dc, *a, *b, *d, nullptr))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo->data[0] < 1 || algo->data[0] > uint64_t(kAlgos)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = dc.trans_a == CUBLAS_OP_T, tb = dc.trans_b == CUBLAS_OP_T;
  const int64_t m = int64_t(ta ? a->cols : a->rows), k = int64_t(ta ? a->rows : a->cols);
  const int64_t kb = int64_t(tb ? b->cols : b->rows), n = int64_t(tb ? b->rows : b->cols);
  if (k != kb || int64_t(d->rows) != m || int64_t(d->cols) != n || c->rows != d->rows ||
      c->cols != d->cols || c->type != d->type)
    return CUBLAS_STATUS_INVALID_VALUE;
  // Out of place (D != C, the backend's tuning trials of a call that reads C): C is read, D
  // written; they must not overlap. MXEMU_LT_REFUSE_OUT_OF_PLACE=1 refuses it for FP8 / FP4
  // operands at the call (NOT_SUPPORTED, the heuristic having offered an algorithm): what the
  // backend must survive were a GPU's cuBLASLt to do that (docs/cuda_emu.md).
  if (C != D && C && low_precision(a->type) && refuse_out_of_place())
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (C != D && C) {
    const size_t bytes = size_t(d->ld) * d->cols * (d->type == CUDA_R_16BF ? 2 : 4);
    const char* c0 = static_cast<const char*>(C);
    const char* d0 = static_cast<const char*>(D);
    if (d0 < c0 + bytes && c0 < d0 + bytes) return CUBLAS_STATUS_INVALID_VALUE;
  }
  // Where each pointer must be, as cuBLASLt reads it: the operands, C, D, the scales and the
  // workspace on the device; alpha and beta on the host, or with POINTER_MODE_DEVICE on the
  // device.
  const bool dev_scalars = dc.pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  for (const void* p : {A, B, C, static_cast<const void*>(D), dc.a_scale, dc.b_scale,
                        static_cast<const void*>(workspace)})
    if (p && !mxemu::is_device_pointer(p)) return CUBLAS_STATUS_INVALID_VALUE;
  if (mxemu::is_device_pointer(alpha_p) != dev_scalars ||
      mxemu::is_device_pointer(beta_p) != dev_scalars)
    return CUBLAS_STATUS_INVALID_VALUE;
  float host_alpha = 0.0f, host_beta = 0.0f;
  if (!dev_scalars) {
    std::memcpy(&host_alpha, alpha_p, 4);
    std::memcpy(&host_beta, beta_p, 4);
  }
  mxemu::enqueue(stream, "cublasLtMatmul", [=, la = *a, lb = *b, lc = *c, ld = *d] {
    if (mxemu::device_failed()) return;
    product(dc, dev_scalars ? alpha_p : &host_alpha, A, &la, B, &lb,
            dev_scalars ? beta_p : &host_beta, C, &lc, D, &ld, workspace, workspace_bytes, m, n, k);
  });
  return CUBLAS_STATUS_SUCCESS;
}
