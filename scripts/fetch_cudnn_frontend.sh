#!/usr/bin/env bash
# Fetches the header-only cudnn-frontend C++ API (pinned: 1.32.0) that the CUDA backend's
# cuDNN attention is compiled against (backend/cuda/cudnn_attention.cpp, docs/cuda.md) into
# .deps/cudnn_frontend/include (git-ignored), from its PyPI wheel with the package registry's
# ordinary client (pip download), sha256-checked. The headers are the same in every wheel of a
# release; this one is named by platform so any local Python can fetch it. Never needed at
# mxtrain's run time. Does nothing when the headers of that version are already there, or when
# there is no nvcc (no CUDA backend to build). Exit 1 with a message if the fetch fails: the
# build then still succeeds, with the fp32 attention kernel only.
#   scripts/fetch_cudnn_frontend.sh        (called by scripts/setup.sh and bench/gpu/prepare.sh)
set -uo pipefail
cd "$(dirname "$0")/.."

fetch_cudnn_frontend() {
  local version=1.32.0 dir=.deps/cudnn_frontend
  local wheel=nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
  local sha256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
  [ -f "$dir/include/cudnn_frontend.h" ] && [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$version" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  fail() {
    echo "fetch_cudnn_frontend: could not fetch the cudnn-frontend $version headers ($1): the" \
         "CUDA backend builds with its fp32 attention kernel instead of cuDNN's" >&2
    rm -rf "$dir" "$tmp"
    return 1
  }
  echo "fetch_cudnn_frontend: fetching cudnn-frontend $version headers (PyPI" \
       "nvidia-cudnn-frontend) into $dir" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
      --python-version 3.11 --implementation cp --abi cp311 -d "$tmp" \
      "nvidia-cudnn-frontend==$version" >"$tmp/pip.log" 2>&1 ||
    { fail "pip download failed: $(tail -1 "$tmp/pip.log")"; return 1; }
  [ -f "$tmp/$wheel" ] || { fail "pip did not write $wheel"; return 1; }
  echo "$sha256  $tmp/$wheel" | sha256sum -c --quiet - >/dev/null 2>&1 ||
    { fail "sha256 of $wheel is not $sha256"; return 1; }
  rm -rf "$dir" && mkdir -p "$dir" &&
    python3 -c "import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith('include/')])" \
      "$tmp/$wheel" "$dir" && [ -f "$dir/include/cudnn_frontend.h" ] ||
    { fail "unpacking include/ from the wheel failed"; return 1; }
  echo "$version" > "$dir/VERSION"
  rm -rf "$tmp"
}

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  fetch_cudnn_frontend
fi
