#!/usr/bin/env bash
# Run HERE (the build machine, no GPU) before a GPU session: builds cuda_op_check for sm_90 and
# copies it with the shared libraries it needs that a bare CUDA image may lack (OpenBLAS,
# OpenMPI, libgomp, ...) into .gpu-prebuilt/, which bench/gpu/check.sh uses when the GPU
# machine cannot configure the project itself (it lacks the Debian -dev packages). cuBLASLt and
# NCCL are NOT bundled (hundreds of MB): check.sh finds them on the GPU machine (the CUDA
# toolkit or the nvidia-cublas / nvidia-nccl Python wheels).
#
#   bench/gpu/prepare.sh            then call the device tool with carry: [".gpu-prebuilt"]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMXTRAIN_TESTS=OFF >/dev/null
cmake --build build-gpu --target cuda_op_check -j2
rm -rf .gpu-prebuilt && mkdir -p .gpu-prebuilt/lib
cp build-gpu/cuda_op_check .gpu-prebuilt/
# Every resolved library except the C runtime, the driver, and the CUDA libraries named above.
ldd build-gpu/cuda_op_check | awk '/=> \//{print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
    libcublas*|libnccl*|libcudart*) ;;
    *) cp -L "$lib" .gpu-prebuilt/lib/ ;;
  esac
done
du -sh .gpu-prebuilt
git -C "$root" rev-parse HEAD > .gpu-prebuilt/COMMIT
