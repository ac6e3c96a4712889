#include "parallel/communicator.h"

#include <climits>
#include <exception>

#include "core/error.h"

namespace mx {

int64_t comm_dtype_bytes(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32: return 4;
    case CommDtype::kBF16: return 2;
    case CommDtype::kI64: return 8;
    case CommDtype::kF64: return 8;
  }
  MX_ASSERT(false, "unknown CommDtype");
  return 0;
}

const char* comm_dtype_name(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32: return "f32";
    case CommDtype::kBF16: return "bf16";
    case CommDtype::kI64: return "i64";
    case CommDtype::kF64: return "f64";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

// ---- CommHandle ----------------------------------------------------------------------------

CommHandle& CommHandle::operator=(CommHandle&& other) noexcept {
  if (this != &other) {
    finish_in_destructor();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

CommHandle::~CommHandle() { finish_in_destructor(); }

void CommHandle::finish_in_destructor() noexcept {
  if (!impl_) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding towards abort_all: leave the request to MPI_Abort rather than risk a hang.
    (void)impl_.release();
    return;
  }
  try {
    impl_->wait();
  } catch (const std::exception& e) {
    abort_all(1, str("collective failed while its handle was destroyed: ", e.what()));
  }
  impl_.reset();
}

void CommHandle::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

bool CommHandle::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_->wait();  // complete: runs any finishing step (e.g. the division of kAvg)
  impl_.reset();
  return true;
}

// ---- argument checks -----------------------------------------------------------------------

void check_collective_args(const char* what, int64_t count, CommDtype dtype) {
  MX_ASSERT(count >= 0, what, ": negative count ", count);
  // MPI counts are int; the largest FSDP unit of a 64B model (~1e9 elements) fits.
  MX_ASSERT(count <= INT_MAX, what, ": count ", count, " exceeds INT_MAX");
  (void)dtype;
}

void check_reduce_args(const char* what, CommDtype dtype, ReduceOp op) {
  MX_ASSERT(dtype != CommDtype::kBF16, what, ": bf16 is gathered, never reduced (reduce in f32)");
  MX_ASSERT(!(dtype == CommDtype::kI64 && op == ReduceOp::kAvg), what,
            ": kAvg needs a floating type");
}

// ---- typed forms ---------------------------------------------------------------------------

namespace {
template <typename T>
void check_gather_sizes(const char* what, const Communicator& c, std::span<const T> send,
                        std::span<T> recv) {
  MX_ASSERT(recv.size() == send.size() * static_cast<size_t>(c.size()), what, ": recv has ",
            recv.size(), " elements, expected send (", send.size(), ") x size (", c.size(), ")");
}
template <typename T>
void check_scatter_sizes(const char* what, const Communicator& c, std::span<const T> send,
                         std::span<T> recv) {
  MX_ASSERT(send.size() == recv.size() * static_cast<size_t>(c.size()), what, ": send has ",
            send.size(), " elements, expected recv (", recv.size(), ") x size (", c.size(), ")");
}
}  // namespace

void Communicator::all_gather(std::span<const float> send, std::span<float> recv) {
  check_gather_sizes("all_gather", *this, send, recv);
  all_gather(send.data(), recv.data(), static_cast<int64_t>(send.size()), CommDtype::kF32);
}

void Communicator::all_gather(std::span<const uint16_t> send, std::span<uint16_t> recv) {
  check_gather_sizes("all_gather", *this, send, recv);
  all_gather(send.data(), recv.data(), static_cast<int64_t>(send.size()), CommDtype::kBF16);
}

CommHandle Communicator::all_gather_async(std::span<const float> send, std::span<float> recv) {
  check_gather_sizes("all_gather_async", *this, send, recv);
  return all_gather_async(send.data(), recv.data(), static_cast<int64_t>(send.size()),
                          CommDtype::kF32);
}

CommHandle Communicator::all_gather_async(std::span<const uint16_t> send,
                                          std::span<uint16_t> recv) {
  check_gather_sizes("all_gather_async", *this, send, recv);
  return all_gather_async(send.data(), recv.data(), static_cast<int64_t>(send.size()),
                          CommDtype::kBF16);
}

void Communicator::reduce_scatter(std::span<const float> send, std::span<float> recv,
                                  ReduceOp op) {
  check_scatter_sizes("reduce_scatter", *this, send, recv);
  reduce_scatter(send.data(), recv.data(), static_cast<int64_t>(recv.size()), CommDtype::kF32,
                 op);
}

CommHandle Communicator::reduce_scatter_async(std::span<const float> send, std::span<float> recv,
                                              ReduceOp op) {
  check_scatter_sizes("reduce_scatter_async", *this, send, recv);
  return reduce_scatter_async(send.data(), recv.data(), static_cast<int64_t>(recv.size()),
                              CommDtype::kF32, op);
}

void Communicator::all_reduce(std::span<float> data, ReduceOp op) {
  all_reduce(data.data(), data.data(), static_cast<int64_t>(data.size()), CommDtype::kF32, op);
}

void Communicator::all_reduce(std::span<double> data, ReduceOp op) {
  all_reduce(data.data(), data.data(), static_cast<int64_t>(data.size()), CommDtype::kF64, op);
}

void Communicator::all_reduce(std::span<int64_t> data, ReduceOp op) {
  all_reduce(data.data(), data.data(), static_cast<int64_t>(data.size()), CommDtype::kI64, op);
}

CommHandle Communicator::all_reduce_async(std::span<float> data, ReduceOp op) {
  return all_reduce_async(data.data(), data.data(), static_cast<int64_t>(data.size()),
                          CommDtype::kF32, op);
}

double Communicator::all_reduce(double value, ReduceOp op) {
  all_reduce(&value, &value, 1, CommDtype::kF64, op);
  return value;
}

int64_t Communicator::all_reduce(int64_t value, ReduceOp op) {
  all_reduce(&value, &value, 1, CommDtype::kI64, op);
  return value;
}

void Communicator::broadcast(std::span<float> data, int root) {
  broadcast(data.data(), static_cast<int64_t>(data.size()), CommDtype::kF32, root);
}

void Communicator::broadcast(std::span<uint16_t> data, int root) {
  broadcast(data.data(), static_cast<int64_t>(data.size()), CommDtype::kBF16, root);
}

void Communicator::broadcast(std::span<int64_t> data, int root) {
  broadcast(data.data(), static_cast<int64_t>(data.size()), CommDtype::kI64, root);
}

int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const UserError*>(&e)) return 2;
  if (dynamic_cast<const StorageError*>(&e)) return 3;
  return 1;
}

}  // namespace mx
