// The CUDA backend as a plugin: mxtrain loads libmxcuda.so (this file and the mxcuda library,
// with cudart, cuBLASLt and NCCL) from its own directory the first time a command asks for
// run.device = cuda (backend/backend.cpp, load_cuda_plugin), so a CPU run links none of them:
// it starts on a machine without the CUDA libraries, without their ~200 MB of relocated pages.
#include "backend/backend.h"

extern "C" __attribute__((visibility("default"))) int mxtrain_cuda_plugin_register() {
  mx::register_cuda_backend();
  return 1;
}
