"""The MPI communicator under a real `mpirun`: every collective against exact values
(tests/mpi/comm_test.cpp) at 2 and 4 ranks, and a failing rank ending the whole job within
seconds (tests/mpi/comm_fail_test.cpp) instead of leaving the other ranks hanging.

The programs are built by CMake next to the mxtrain binary (build/mpi_comm_test,
build/mpi_comm_fail_test); MXTRAIN_MPI_TEST_DIR overrides where they are looked for, and
MXTRAIN_MPIRUN_FLAGS replaces the extra mpirun flags (default: --oversubscribe --bind-to none)."""
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN

TEST_DIR = Path(os.environ.get("MXTRAIN_MPI_TEST_DIR", str(Path(MXTRAIN_BIN).parent)))
# --oversubscribe: 4 ranks on a 2-core machine; --bind-to none: ranks not pinned to one core.
MPIRUN_FLAGS = shlex.split(os.environ.get("MXTRAIN_MPIRUN_FLAGS",
                                          "--oversubscribe --bind-to none"))
# A failing job must be gone within this many seconds of its launch (start-up included).
FAILURE_DEADLINE_S = 12.0


def program(name):
    path = TEST_DIR / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    msg = f"{path} not built (cmake --build build builds it; or set MXTRAIN_MPI_TEST_DIR)"
    if os.environ.get("MXTRAIN_SKIP_MISSING") == "1":
        pytest.skip(msg)
    pytest.fail(msg)


def mpirun(np_, args, timeout=60):
    """Runs `mpirun -np N args` -> (rc or None on timeout, stdout, stderr, seconds)."""
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun not found (apt-get install openmpi-bin)"
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = [launcher, "-np", str(np_)] + MPIRUN_FLAGS + [str(a) for a in args]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err + f"\n[mpirun timed out after {timeout}s]", time.monotonic() - t0


def process_alive(pid, grace_s=5.0):
    """True if pid exists and is not a zombie `grace_s` seconds on. mpirun's exit and the
    death of the ranks it kills are not one event: on a loaded machine (seen in CI with the
    other core busy) a killed rank can still be scheduled for a moment after mpirun returns.
    A rank that outlives the grace period has really been left behind."""
    deadline = time.time() + grace_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                return False
        except FileNotFoundError:
            return False
        if time.time() >= deadline:
            return True
        time.sleep(0.05)


@pytest.mark.parametrize("np_", [2, 4])
def test_collectives_exact(np_):
    rc, out, err, _ = mpirun(np_, [program("mpi_comm_test")], timeout=120)
    assert rc == 0, f"exit {rc}\nstdout:\n{out}\nstderr:\n{err}"
    m = re.search(r"comm_test: (\d+) checks passed on (\d+) ranks", out)
    assert m, f"no summary line:\n{out}\n{err}"
    assert int(m.group(2)) == np_
    assert int(m.group(1)) > 100 * np_, out  # the checks ran (each rank runs > 100)
    assert "FAIL" not in err


def run_failure(np_, mode):
    rc, out, err, seconds = mpirun(np_, [program("mpi_comm_fail_test"), mode])
    waiting = {int(r): int(p) for r, p in re.findall(r"rank (\d+) pid (\d+) waiting", out)}
    return rc, out, err, seconds, waiting


def test_no_failure_job_completes():
    """The control: with no failure every rank passes the collective and the job exits 0 (so
    the failure tests below see the failure handling, not some other way of ending)."""
    rc, out, err, seconds, waiting = run_failure(2, "ok")
    assert rc == 0, f"exit {rc}\n{out}\n{err}"
    assert sorted(waiting) == [0, 1]
    assert sorted(int(r) for r in re.findall(r"rank (\d+) done", out)) == [0, 1]


@pytest.mark.parametrize("np_,mode", [(4, "throw"), (2, "throw-async")])
def test_rank_that_throws_ends_job(np_, mode):
    rc, out, err, seconds, waiting = run_failure(np_, mode)
    assert rc is not None, f"job hung: {err}"
    assert seconds < FAILURE_DEADLINE_S, f"job took {seconds:.1f}s to end"
    assert rc == 2, f"exit {rc} (expected 2: the UserError's code)\n{out}\n{err}"
    assert re.search(r"^error: rank 1: injected failure in rank 1", err, re.M), err
    assert "done" not in out  # nobody got past the collective rank 1 never joined
    assert 1 not in waiting
    for rank, pid in waiting.items():
        assert not process_alive(pid), f"rank {rank} (pid {pid}) still running"


def test_rank_killed_by_sigkill_ends_job():
    rc, out, err, seconds, waiting = run_failure(4, "kill")
    assert rc is not None, f"job hung: {err}"
    assert seconds < FAILURE_DEADLINE_S, f"job took {seconds:.1f}s to end"
    assert rc != 0
    assert "done" not in out
    assert "rank 1" in err and "signal 9" in err, err  # mpirun names the rank that died
    for rank, pid in waiting.items():
        assert not process_alive(pid), f"rank {rank} (pid {pid}) still running"


def test_rank_exiting_with_error_code_ends_job():
    """A rank that returns an error code without abort_all (exit(3)) must not hang in
    MPI_Finalize: the exit handler aborts the job with that code."""
    rc, out, err, seconds, waiting = run_failure(2, "exit")
    assert rc is not None, f"job hung: {err}"
    assert seconds < FAILURE_DEADLINE_S, f"job took {seconds:.1f}s to end"
    assert rc == 3, f"exit {rc}\n{out}\n{err}"
    assert "done" not in out
