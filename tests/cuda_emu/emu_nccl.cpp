// mxemu's NCCL (see include/nccl.h), over MPI.
#include <mpi.h>
#include <nccl.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "numerics/formats.h"

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

namespace {

size_t type_bytes(ncclDataType_t t) { return t == ncclBfloat16 ? 2 : t == ncclFloat32 ? 4 : 8; }

double load(const void* p, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: return static_cast<const float*>(p)[i];
    case ncclFloat64: return static_cast<const double*>(p)[i];
    case ncclInt64: return double(static_cast<const int64_t*>(p)[i]);
    case ncclBfloat16: return ::mx::numerics::decode_bf16(static_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

// Reduces in the element type: fp32 sums in fp32, int64 in int64.
void reduce(void* out, const std::vector<const char*>& parts, size_t count, ncclDataType_t t,
            ncclRedOp_t op) {
  const int n = int(parts.size());
  for (size_t i = 0; i < count; ++i) {
    if (t == ncclInt64) {
      int64_t acc = static_cast<const int64_t*>(static_cast<const void*>(parts[0]))[i];
      for (int r = 1; r < n; ++r) {
        const int64_t v = static_cast<const int64_t*>(static_cast<const void*>(parts[size_t(r)]))[i];
        acc = op == ncclMax ? std::max(acc, v) : acc + v;
      }
      if (op == ncclAvg) acc /= n;
      static_cast<int64_t*>(out)[i] = acc;
    } else if (t == ncclFloat64) {
      // ncclAvg: NCCL's ncclDevPreMulSum, each addend times 1/n (rounded), then the sum.
      const double pre = op == ncclAvg ? 1.0 / n : 1.0;
      double acc = load(parts[0], i, t) * pre;
      for (int r = 1; r < n; ++r) {
        const double v = load(parts[size_t(r)], i, t);
        acc = op == ncclMax ? std::max(acc, v) : acc + v * pre;
      }
      static_cast<double*>(out)[i] = acc;
    } else {
      const float pre = op == ncclAvg ? float(1.0 / n) : 1.0f;
      float acc = float(load(parts[0], i, t)) * pre;
      for (int r = 1; r < n; ++r) {
        const float v = float(load(parts[size_t(r)], i, t));
        acc = op == ncclMax ? std::max(acc, v) : acc + v * pre;
      }
      if (t == ncclBfloat16)
        static_cast<uint16_t*>(out)[i] = ::mx::numerics::encode_bf16(acc, ::mx::numerics::Saturation::kNoSat);
      else
        static_cast<float*>(out)[i] = acc;
    }
  }
}

// Every rank's `bytes` from `send`, in rank order.
std::vector<char> gather_all(ncclComm* c, const void* send, size_t bytes) {
  std::vector<char> all(bytes * size_t(c->size));
  if (c->size == 1) {
    std::memcpy(all.data(), send, bytes);
  } else {
    std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
    MPI_Allgather(mine.data(), int(bytes), MPI_BYTE, all.data(), int(bytes), MPI_BYTE, c->mpi);
  }
  return all;
}

// recv = the reduction, in rank order, of the `count` elements at byte `offset` of every rank's
// `bytes` from send (all-reduce: offset 0; reduce-scatter: this rank's chunk).
void reduce_across(void* recv, ncclComm* c, const void* send, size_t bytes, size_t offset,
                   size_t count, ncclDataType_t type, ncclRedOp_t op) {
  mxemu::DeviceAccess access;
  const auto all = gather_all(c, send, bytes);
  std::vector<const char*> parts;
  for (int r = 0; r < c->size; ++r) parts.push_back(all.data() + size_t(r) * bytes + offset);
  reduce(recv, parts, count, type, op);
}

// A collective as an operation of its stream, which the emulator runs as MXEMU_STREAMS says
// (emu.h, "Streams"; all ranks queue their collectives in the same order, as NCCL requires).
// The buffers must be device memory, as NCCL's kernels read and write them.
ncclResult_t collective(const char* what, cudaStream_t s, size_t count,
                        std::initializer_list<const void*> buffers, std::function<void()> op) {
  for (const void* p : buffers)
    if (count > 0 && !mxemu::is_device_pointer(p)) return ncclInvalidArgument;
  mxemu::mark_collective_stream(s);
  mxemu::enqueue(s, what, std::move(op));
  return ncclSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : "mxemu nccl: invalid argument or MPI failure";
}
ncclResult_t ncclGetVersion(int* version) {
  const char* v = std::getenv("MXEMU_NCCL_VERSION");
  *version = v ? std::atoi(v) : NCCL_VERSION_CODE;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& ch : id->internal) ch = char(rd());
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  auto* c = new ncclComm;
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->size);
  }
  if (c->rank != rank || c->size != nranks) {
    delete c;
    return ncclInvalidArgument;
  }
  // Every rank must have been given rank 0's id (NCCL would hang or fail otherwise).
  if (c->size > 1) {
    std::vector<char> ids(sizeof id * size_t(c->size));
    MPI_Allgather(&id, int(sizeof id), MPI_BYTE, ids.data(), int(sizeof id), MPI_BYTE, c->mpi);
    for (int r = 1; r < c->size; ++r)
      if (std::memcmp(ids.data(), ids.data() + sizeof id * size_t(r), sizeof id) != 0) {
        MPI_Comm_free(&c->mpi);
        delete c;
        return ncclInvalidUsage;
      }
    // Two ranks on one host with the same device: NCCL's "Duplicate GPU detected".
    struct Where {
      char host[64];
      int device;
    } me{};
    gethostname(me.host, sizeof me.host - 1);
    cudaGetDevice(&me.device);
    std::vector<Where> all(size_t(c->size));
    MPI_Allgather(&me, int(sizeof me), MPI_BYTE, all.data(), int(sizeof me), MPI_BYTE, c->mpi);
    for (int a = 0; a < c->size; ++a)
      for (int b = a + 1; b < c->size; ++b)
        if (all[size_t(a)].device == all[size_t(b)].device &&
            std::strcmp(all[size_t(a)].host, all[size_t(b)].host) == 0) {
          MPI_Comm_free(&c->mpi);
          delete c;
          return ncclInvalidUsage;
        }
  }
  *comm = c;
  return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  auto* c = new ncclComm;
  if (comm->mpi == MPI_COMM_NULL) {
    *out = c;
    return ncclSuccess;
  }
  MPI_Comm_split(comm->mpi, color, key, &c->mpi);
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->size);
  *out = c;
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  mxemu::synchronize_collective_streams();  // collectives still queued run first (NCCL waits for them)
  if (comm->mpi != MPI_COMM_NULL) {
    MPI_Barrier(comm->mpi);  // (NCCL's destroy is collective: a rank alone here waits)
    MPI_Comm_free(&comm->mpi);
  }
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // (not MPI_Comm_free, which OpenMPI may make wait on the others: the handle is dropped; the
  // process is ending, MPI_Abort follows)
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* async_error) {
  *async_error = ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s) {
  return collective("ncclAllGather", s, count, {send, recv}, [=] {
    mxemu::DeviceAccess access;
    const auto all = gather_all(comm, send, count * type_bytes(type));
    std::memcpy(recv, all.data(), all.size());
  });
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
  return collective("ncclReduceScatter", s, count, {send, recv}, [=] {
    const size_t b = count * type_bytes(type);
    reduce_across(recv, comm, send, b * size_t(comm->size), size_t(comm->rank) * b, count, type, op);
  });
}
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
  return collective("ncclAllReduce", s, count, {send, recv}, [=] {
    reduce_across(recv, comm, send, count * type_bytes(type), 0, count, type, op);
  });
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t s) {
  return collective("ncclBroadcast", s, count, {comm->rank == root ? send : recv, recv}, [=] {
    mxemu::DeviceAccess access;
    const size_t b = count * type_bytes(type);
    std::vector<char> buf(b);
    if (comm->rank == root) std::memcpy(buf.data(), send, b);
    if (comm->size > 1) MPI_Bcast(buf.data(), int(b), MPI_BYTE, root, comm->mpi);
    std::memcpy(recv, buf.data(), b);
  });
}
