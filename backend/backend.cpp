// make_backend and the default (host memory) implementations of the Backend memory calls.
#include "backend/backend.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace mx {

namespace {
BackendFactory g_cuda_factory = nullptr;
}  // namespace

void register_cuda_backend_factory(BackendFactory factory) { g_cuda_factory = factory; }

bool Backend::host_addressable() const {
  static const bool staged = [] {
    const char* e = std::getenv("MXTRAIN_TEST_STAGING");
    return e && std::strcmp(e, "1") == 0;
  }();
  return !staged;
}

void Backend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void Backend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

std::unique_ptr<Backend> make_backend(const std::string& device) {
  if (device == "cpu") return make_cpu_backend();
  if (device == "cuda") {
    if (!g_cuda_factory)
      throw UserError(
          "run.device = cuda: this mxtrain was built without the CUDA backend (no nvcc/NCCL "
          "found, or -DMXTRAIN_CUDA=OFF; see docs/cuda.md)");
    return g_cuda_factory();
  }
  throw UserError(str("unknown run.device '", device, "' (known: cpu, cuda)"));
}

}  // namespace mx
