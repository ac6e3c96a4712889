"""`mxtrain bench fma`: the CPU's measured fp32 multiply-add peak (backend/cpu/fma_peak.h), the
roof the benchmark holds both sides' speeds against.

References independent of mxtrain's own arithmetic: the build's vector width follows the CPU's
flags in /proc/cpuinfo (the Release build is -march=native), and a physical bound, checked both
ways: no SGEMM can run above the multiply-add peak, and a tuned one (numpy's matmul on OpenBLAS,
timed here by the test) runs well above a third of it. A FLOP count off by the vector width or
by the two FLOPs of a multiply-add lands outside [0.4, 1.15]."""
import json
import os
import platform
import subprocess
import sys
import time

import pytest

from conftest import cpu_flags, require_binary, run_mxtrain


def fma(seconds=0.5, threads=1):
    t0 = time.monotonic()
    r = run_mxtrain(["bench", "fma", "--seconds", seconds], env={"OMP_NUM_THREADS": str(threads)},
                    timeout=120)
    wall = time.monotonic() - t0
    assert r.rc == 0, r
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # `seconds` is the time it timed, at least the requested (it stopped at 1000 runs, ~11 s
    # into `--seconds 30`, and said 30), and within the process's own
    assert float(seconds) <= out["seconds"] <= wall + 0.01, (out, wall)
    return out


@pytest.fixture(autouse=True)
def _binary():
    require_binary()


def test_fma_json_names_threads_and_vector_width():
    if platform.machine() != "x86_64":
        pytest.skip("vector widths below are x86-64's")
    flags = cpu_flags()
    out = fma(0.2, threads=1)
    assert out["threads"] == 1
    assert out["vector_bits"] == (512 if "avx512f" in flags else 256 if "avx" in flags else 128)
    assert out["gflops"] > 0


NUMPY_SGEMM = """
import sys, time
import numpy as np
n, seconds = 1024, 1.0
a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
a @ b  # warm-up
best, t_end = 0.0, time.perf_counter() + seconds
while time.perf_counter() < t_end:
    t0 = time.perf_counter()
    a @ b
    best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0))
print(best / 1e9)
"""


def numpy_sgemm_gflops():
    """Best rate of repeated 1024^3 fp32 matmuls, numpy on OpenBLAS in a child process on ONE
    thread (OpenBLAS reads OPENBLAS_NUM_THREADS when it loads; conftest's OPENBLAS_CORETYPE
    gives it mxtrain's kernels)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", NUMPY_SGEMM], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return float(p.stdout.strip())


def test_sgemm_runs_under_the_fma_peak_and_near_it():
    """Each rate is the best seen over up to three rounds: other work on the machine only lowers
    a measurement, and lowering the peak's and not the SGEMMs' (or the other way round) put one
    side outside the bounds on a busy CI machine. A FLOP count off by 2x stays outside."""
    peak = sgemm = mx_sgemm = 0.0
    for _ in range(3):
        peak = max(peak, fma(1.0, threads=1)["gflops"])
        sgemm = max(sgemm, numpy_sgemm_gflops())
        mx = run_mxtrain(["bench", "sgemm", "--size", "1024", "--seconds", "1"],
                         env={"OMP_NUM_THREADS": "1"}, timeout=120)
        assert mx.rc == 0, mx
        mx_sgemm = max(mx_sgemm, json.loads(mx.stdout.strip().splitlines()[-1])["gflops"])
        if all(0.4 * peak < rate < 1.15 * peak for rate in (sgemm, mx_sgemm)):
            break
    for rate in (sgemm, mx_sgemm):
        assert 0.4 * peak < rate < 1.15 * peak, (rate, peak)


@pytest.mark.parametrize("seconds", ["-1", "601", "x"])
def test_fma_bad_seconds(seconds):
    r = run_mxtrain(["bench", "fma", "--seconds", seconds], timeout=60)
    assert r.rc == 2, r
    assert r.stderr.strip().startswith("error:") and "--seconds" in r.stderr, r
    assert len(r.stderr.strip().splitlines()) == 1, r
