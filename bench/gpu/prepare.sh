#!/usr/bin/env bash
# Run HERE (the build machine, no GPU) before a GPU session: builds cuda_op_check and mxtrain
# (with its CUDA backend, libmxcuda.so) for sm_90 and copies them with the shared libraries they need that a bare CUDA image may lack (OpenBLAS,
# OpenMPI, libgomp, ...) into .gpu-prebuilt/, which bench/gpu/check.sh uses when the GPU
# machine cannot configure the project itself (it lacks the Debian -dev packages). cuBLASLt and
# NCCL are NOT bundled (hundreds of MB): check.sh finds them on the GPU machine (the CUDA
# toolkit or the nvidia-cublas / nvidia-nccl Python wheels). Nor is libcudnn (hundreds of MB; not
# a link dependency: the attention dlopens it, from the GPU machine's nvidia-cudnn-cu13 wheel);
# the cudnn-frontend headers it is compiled against are fetched here first.
#
#   bench/gpu/prepare.sh            then call the device tool with carry: [".gpu-prebuilt"]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
scripts/fetch_cudnn_frontend.sh ||
  { echo "prepare.sh: no cudnn-frontend headers: the bundle would have the fp32 attention only" >&2; exit 1; }
# A baseline CPU target, not this machine's (-march=native): the GPU machine's CPU is unknown.
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DMXTRAIN_TESTS=OFF \
  -DMXTRAIN_CPU_ARCH=x86-64-v3 >/dev/null
cmake --build build-gpu --target cuda_op_check mxtrain mxcuda_plugin -j2
grep -qa "cuda attention: cudnn SDPA" build-gpu/libmxcuda.so ||
  { echo "prepare.sh: build-gpu/libmxcuda.so was built without the cuDNN attention (see cmake's" \
         "'mxtrain: CUDA attention' line)" >&2; exit 1; }
# Staged in build-gpu/prebuilt, carried as one xz archive: the OpenBLAS and OpenSSL libraries
# alone are ~40 MB uncompressed, and the device tool carries at most 64 MiB.
stage=build-gpu/prebuilt
rm -rf "$stage" .gpu-prebuilt && mkdir -p "$stage/lib" .gpu-prebuilt
# (mxtrain loads its CUDA backend, libmxcuda.so, from its own directory)
cp build-gpu/cuda_op_check build-gpu/mxtrain build-gpu/libmxcuda.so "$stage/"
strip "$stage/cuda_op_check" "$stage/mxtrain" 2>/dev/null || true
strip --strip-unneeded "$stage/libmxcuda.so" 2>/dev/null || true
# Every resolved library except glibc's, the driver, and the CUDA libraries named above.
ldd build-gpu/cuda_op_check build-gpu/mxtrain build-gpu/libmxcuda.so | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
    # (glibc's own too: this machine's libresolv imports GLIBC_PRIVATE symbols of its glibc)
    libresolv.so*|libnss_*|libanl.so*|libutil.so*) ;;
    libcublas*|libnccl*|libcudart*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
# The commit the binaries were built from (+dirty: uncommitted changes were in the build).
echo "$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- . ':!.gpu-prebuilt' || echo +dirty)" \
  > "$stage/COMMIT"
cp "$stage/COMMIT" .gpu-prebuilt/COMMIT
# What they were built from, file by file (what CMake compiles into them), so that check.sh can
# say at once when the tree it runs in has other sources than the bundle's binaries (a bundle
# not rebuilt after a change: its rows would test old code, or fail on new settings).
git -C "$root" ls-files -z -- CMakeLists.txt cmake cli core data numerics backend precision \
  model parallel checkpoint plan train tests/cuda | xargs -0 sha256sum > "$stage/SOURCES.sha256"
tar -C build-gpu -cJf .gpu-prebuilt/bundle.tar.xz prebuilt
du -sh .gpu-prebuilt
