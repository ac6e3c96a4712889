#!/usr/bin/env bash
# The whole test suite: installs and builds what it needs, then runs the C++ unit tests (ctest)
# and the reference tests against PyTorch (pytest in .venv: Debian's python3 with python3-torch, plus ml_dtypes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
(cd build && ctest --output-on-failure -j2)
# The Python tests keep about one core busy on their own (they wait on the processes they
# start), so two workers, a file to each (MXTRAIN_TEST_WORKERS: another count; 0 runs them in
# this process).
MXTRAIN_BIN="$PWD/build/mxtrain" .venv/bin/python -m pytest tests/python -q -p no:cacheprovider \
  -n "${MXTRAIN_TEST_WORKERS:-2}" --dist loadfile --durations=20
