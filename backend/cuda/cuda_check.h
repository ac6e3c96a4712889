// Errors of the CUDA backend: every CUDA runtime, cuBLASLt and NCCL call goes through one of
// these macros, so a failure throws a CudaError that names the op and the library's own error
// string ("cuda: rmsnorm_forward: cudaErrorIllegalAddress: an illegal memory access ...").
// A CudaError is neither bad input nor a storage failure: the CLI reports it as a bug (exit 1).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "core/error.h"

namespace mx {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t err, const char* op, const char* expr) {
  if (err != cudaSuccess)
    throw CudaError(str("cuda: ", op, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                        " (", expr, ")"));
}

inline void cublas_check(cublasStatus_t st, const char* op, const char* expr) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CudaError(str("cublasLt: ", op, ": ", cublasLtGetStatusName(st), ": ",
                        cublasLtGetStatusString(st), " (status ", int(st), "; ", expr, ")"));
}

}  // namespace mx

// `op` is the backend op being run (a string literal), for the message.
#define MX_CUDA_CHECK(op, expr) ::mx::cuda_check((expr), (op), #expr)
#define MX_CUBLAS_CHECK(op, expr) ::mx::cublas_check((expr), (op), #expr)
// After a kernel launch: launch-configuration errors now; asynchronous faults surface at the
// next synchronizing call (or at once with MXTRAIN_CUDA_SYNC=1, see CudaBackend).
#define MX_CUDA_LAUNCH_CHECK(op) ::mx::cuda_check(cudaGetLastError(), (op), "kernel launch")
