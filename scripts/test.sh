#!/usr/bin/env bash
# The whole test suite: installs and builds what it needs, then runs the C++ unit tests (ctest)
# and the reference tests against PyTorch (pytest in .venv: Debian's python3 with python3-torch, plus ml_dtypes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
(cd build && ctest --output-on-failure -j2)
MXTRAIN_BIN="$PWD/build/mxtrain" .venv/bin/python -m pytest tests/python -q -p no:cacheprovider --durations=20
