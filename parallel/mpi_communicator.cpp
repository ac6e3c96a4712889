#include "parallel/mpi_communicator.h"

#include <cstdint>

#include "core/error.h"

namespace mx {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw CommError(str(what, " failed: ", len > 0 ? std::string(text, len) : str("code ", rc)));
}

namespace {

MPI_Datatype mpi_type(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32: return MPI_FLOAT;
    case CommDtype::kBF16: return MPI_UINT16_T;  // raw bits: moved, never converted
    case CommDtype::kI64: return MPI_INT64_T;
    case CommDtype::kF64: return MPI_DOUBLE;
  }
  MX_ASSERT(false, "unknown CommDtype");
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;  // kAvg: a sum, divided afterwards
}

// The second half of kAvg: MPI has no average, so the sum is divided by the rank count in the
// element type (x / n, not x * (1/n): exact whenever the sum is a multiple of n).
void divide_by(void* data, int64_t count, CommDtype dtype, int n) {
  if (dtype == CommDtype::kF32) {
    float* p = static_cast<float*>(data);
    const float d = static_cast<float>(n);
    for (int64_t i = 0; i < count; ++i) p[i] /= d;
  } else if (dtype == CommDtype::kF64) {
    double* p = static_cast<double*>(data);
    const double d = static_cast<double>(n);
    for (int64_t i = 0; i < count; ++i) p[i] /= d;
  } else {
    MX_ASSERT(false, "kAvg on ", comm_dtype_name(dtype));
  }
}

bool ranges_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + static_cast<uintptr_t>(b_bytes) &&
         pb < pa + static_cast<uintptr_t>(a_bytes);
}

// A request from MPI_I*; `avg_*` set when the result must be divided on completion.
struct MpiRequest final : CommHandle::Impl {
  MPI_Request request = MPI_REQUEST_NULL;
  const char* what = "";
  void* avg_data = nullptr;
  int64_t avg_count = 0;
  CommDtype avg_dtype = CommDtype::kF32;
  int avg_n = 1;
  bool finished = false;

  void wait() override {
    if (finished) return;
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), what);
    finish();
  }
  bool test() override {
    if (finished) return true;
    int flag = 0;
    check_mpi(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
    if (flag) finish();
    return flag != 0;
  }
  void finish() {
    finished = true;
    if (avg_data) divide_by(avg_data, avg_count, avg_dtype, avg_n);
  }
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owns) : comm_(comm), owns_(owns) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::all_gather(const void* send, void* recv, int64_t count, CommDtype dtype) {
  check_collective_args("all_gather", count, dtype);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  const void* own_slot = static_cast<const char*>(recv) + rank_ * bytes;
  if (send != own_slot)
    MX_ASSERT(!ranges_overlap(send, bytes, recv, bytes * size_),
              "all_gather: send overlaps recv other than at this rank's slot");
  check_mpi(MPI_Allgather(send == own_slot ? MPI_IN_PLACE : send, static_cast<int>(count),
                          mpi_type(dtype), recv, static_cast<int>(count), mpi_type(dtype), comm_),
            "MPI_Allgather");
}

CommHandle MpiCommunicator::all_gather_async(const void* send, void* recv, int64_t count,
                                             CommDtype dtype) {
  check_collective_args("all_gather_async", count, dtype);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  const void* own_slot = static_cast<const char*>(recv) + rank_ * bytes;
  if (send != own_slot)
    MX_ASSERT(!ranges_overlap(send, bytes, recv, bytes * size_),
              "all_gather_async: send overlaps recv other than at this rank's slot");
  auto r = std::make_unique<MpiRequest>();
  r->what = "MPI_Iallgather";
  check_mpi(MPI_Iallgather(send == own_slot ? MPI_IN_PLACE : send, static_cast<int>(count),
                           mpi_type(dtype), recv, static_cast<int>(count), mpi_type(dtype), comm_,
                           &r->request),
            r->what);
  return CommHandle(std::move(r));
}

void MpiCommunicator::reduce_scatter(const void* send, void* recv, int64_t count,
                                     CommDtype dtype, ReduceOp op) {
  check_collective_args("reduce_scatter", count, dtype);
  check_reduce_args("reduce_scatter", dtype, op);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  MX_ASSERT(!ranges_overlap(send, bytes * size_, recv, bytes), "reduce_scatter: send overlaps recv");
  check_mpi(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(dtype),
                                     mpi_op(op), comm_),
            "MPI_Reduce_scatter_block");
  if (op == ReduceOp::kAvg) divide_by(recv, count, dtype, size_);
}

CommHandle MpiCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t count,
                                                 CommDtype dtype, ReduceOp op) {
  check_collective_args("reduce_scatter_async", count, dtype);
  check_reduce_args("reduce_scatter_async", dtype, op);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  MX_ASSERT(!ranges_overlap(send, bytes * size_, recv, bytes),
            "reduce_scatter_async: send overlaps recv");
  auto r = std::make_unique<MpiRequest>();
  r->what = "MPI_Ireduce_scatter_block";
  if (op == ReduceOp::kAvg) {
    r->avg_data = recv;
    r->avg_count = count;
    r->avg_dtype = dtype;
    r->avg_n = size_;
  }
  check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(dtype),
                                      mpi_op(op), comm_, &r->request),
            r->what);
  return CommHandle(std::move(r));
}

void MpiCommunicator::all_reduce(const void* send, void* recv, int64_t count, CommDtype dtype,
                                 ReduceOp op) {
  check_collective_args("all_reduce", count, dtype);
  check_reduce_args("all_reduce", dtype, op);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  if (send != recv)
    MX_ASSERT(!ranges_overlap(send, bytes, recv, bytes), "all_reduce: send overlaps recv");
  check_mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                          mpi_type(dtype), mpi_op(op), comm_),
            "MPI_Allreduce");
  if (op == ReduceOp::kAvg) divide_by(recv, count, dtype, size_);
}

CommHandle MpiCommunicator::all_reduce_async(const void* send, void* recv, int64_t count,
                                             CommDtype dtype, ReduceOp op) {
  check_collective_args("all_reduce_async", count, dtype);
  check_reduce_args("all_reduce_async", dtype, op);
  const int64_t bytes = count * comm_dtype_bytes(dtype);
  if (send != recv)
    MX_ASSERT(!ranges_overlap(send, bytes, recv, bytes), "all_reduce_async: send overlaps recv");
  auto r = std::make_unique<MpiRequest>();
  r->what = "MPI_Iallreduce";
  if (op == ReduceOp::kAvg) {
    r->avg_data = recv;
    r->avg_count = count;
    r->avg_dtype = dtype;
    r->avg_n = size_;
  }
  check_mpi(MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count),
                           mpi_type(dtype), mpi_op(op), comm_, &r->request),
            r->what);
  return CommHandle(std::move(r));
}

void MpiCommunicator::broadcast(void* buffer, int64_t count, CommDtype dtype, int root) {
  check_collective_args("broadcast", count, dtype);
  MX_ASSERT(root >= 0 && root < size_, "broadcast: root ", root, " out of range for size ",
            size_);
  check_mpi(MPI_Bcast(buffer, static_cast<int>(count), mpi_type(dtype), root, comm_),
            "MPI_Bcast");
}

void MpiCommunicator::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  MX_ASSERT(color >= 0, "split: color must be >= 0 (got ", color, ")");
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::make_unique<MpiCommunicator>(sub, /*owns=*/true);
}

}  // namespace mx
