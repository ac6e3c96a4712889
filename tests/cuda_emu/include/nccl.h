// mxemu's stand-in for nccl.h (see ../emu.h): the communicator calls
// backend/cuda/nccl_communicator.cu makes, over MPI (each rank's emulated device memory is its
// own process's memory). Collectives run at the call, in the communicator's rank order;
// reductions gather every rank's contribution and reduce it locally, in rank order, in the
// element type (bf16 through fp32 and back, rounded to nearest even). ncclAvg on floats is
// NCCL's: each addend multiplied by 1/n rounded in the element type, then summed.
#pragma once

#include <cstddef>

#include "tests/cuda_emu/include/cuda_runtime.h"

// The NCCL this emulates: 2.28.9, the CUDA 13 toolkit's (the version macro as nccl.h defines it).
#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION(X, Y, Z) \
  (((X) == 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
               ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5,
               ncclRemoteError = 6, ncclInProgress = 7 } ncclResult_t;
typedef enum { ncclInt64 = 4, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfig_v {
  int dummy;
} ncclConfig_t;

const char* ncclGetErrorString(ncclResult_t r);
// NCCL_VERSION_CODE, unless MXEMU_NCCL_VERSION says another (a test of the version check).
ncclResult_t ncclGetVersion(int* version);
// As NCCL since 2.x: ncclInvalidUsage when two ranks on one host have set the same device
// ("Duplicate GPU detected"), besides the id checks.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t* config);
// A collective among the communicator's ranks, as NCCL's is among a node's: it returns once
// every rank has called it (a rank that never does keeps the others waiting).
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Frees the communicator without waiting for the other ranks or for queued collectives.
ncclResult_t ncclCommAbort(ncclComm_t comm);
// ncclSuccess: mxemu's collectives fail at the call, never asynchronously.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream);
