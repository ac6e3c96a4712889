// The cuDNN attention's host side where no GPU is needed (a ctest test in builds with
// MXTRAIN_HAVE_CUDNN; bench/gpu/check.sh's op check covers the device side): libcudnn is opened
// at run time or its absence is a reason, never a crash; the shape rules come before any cuDNN
// call; a shape's decision is made once. On a machine with a GPU the Llama shape must build.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "backend/cuda/cudnn_attention.h"

namespace {
int failures = 0;
void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  failures += !ok;
}
bool starts(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }
}  // namespace

int main() {
  const std::string lib = mx::cuda::cudnn_library_problem();
  const bool loaded = lib.empty();
  expect(loaded || starts(lib, "libcudnn could not be loaded ("), "library: [" + lib + "]");
  const size_t version = mx::cuda::cudnn_library_version();
  expect(loaded ? version >= 90000 : version == 0, "cudnnGetVersion " + std::to_string(version));

  int gpus = 0;
  const bool have_gpu = cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0;
  cudaGetLastError();
  cudaStream_t stream = nullptr;
  if (have_gpu) cudaStreamCreate(&stream);
  {
    mx::cuda::CudnnAttention attention(stream);
    const std::string odd = attention.problem(1, 64, 4, 4, 100);
    expect(loaded ? odd == "head_dim 100 is not a multiple of 8" : odd == lib,
           "D = 100: [" + odd + "]");
    const std::string& llama = attention.problem(2, 256, 32, 8, 64);
    if (!loaded)
      expect(llama == lib, "without libcudnn the reason is the library's");
    else if (have_gpu)
      expect(llama.empty(), "with a GPU the Llama shape builds: [" + llama + "]");
    else
      expect(starts(llama, "cuDNN failed while building the graphs: "),
             "no GPU: a reason, not a crash: [" + llama + "]");
    expect(&attention.problem(2, 256, 32, 8, 64) == &llama, "one decision per shape (cached)");
  }
  if (stream) cudaStreamDestroy(stream);
  std::printf("%s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
