// Row-major fp32 GEMMs through cuBLASLt (column-major underneath): C = alpha op(A) op(B) + beta C
// exactly as Backend::gemm defines it, computed in fp32, tf32 or bf16 (see CudaGemmPrecision).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

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

  // workspace: device memory for cuBLASLt (may be null with workspace_bytes 0). For kBf16 the
  // operands' bf16 copies are allocated from `scratch` for the duration of the call.
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, const float* B, float beta, float* C, CudaGemmPrecision precision,
            void* workspace, size_t workspace_bytes, DeviceArena& scratch, cudaStream_t stream);

  // Per-tensor FP8 Linear forward on FP8 tensor cores: y[N, out] (fp32) =
  // (x_scale * x[N, in]) (w_scale * w[out, in])^T, where x and w are FP8 codes (E4M3 or E5M2,
  // not both E5M2) and x_scale, w_scale point to the decode multipliers on the device (what
  // numerics::quantize_fp8_* writes as scales_f32[0]). Both operands are K-major (the "TN"
  // layout FP8 GEMMs require); `in` must be a multiple of 16.
  void fp8_linear_forward(float* y, const uint8_t* x, numerics::Format x_fmt,
                          const float* x_scale, const uint8_t* w, numerics::Format w_fmt,
                          const float* w_scale, int64_t N, int64_t in, int64_t out,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// dst[i] = bf16 bits of src[i], round-to-nearest-even (numerics::encode_bf16, as the CPU
// recipe's bf16 emulation rounds).
void round_to_bf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t stream);

}  // namespace mx::cuda
