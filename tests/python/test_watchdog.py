"""The hang watchdog (train.hang_timeout_s) under a real `mpirun`: a rank stopped with SIGSTOP
(a peer that hangs without dying: rank 0 then waits for it inside a collective) ends the job
with rank 0's one `error:` line and exit code 4 within seconds of the limit, every process
gone and the metrics intact; with the watchdog off the same pause is waited out and the run
finishes; the same on the CUDA backend under mxemu, where the limit has grown with its slower
micro-batches. Bad values are refused before training (exit 2)."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN, assert_one_error, require_binary, run_mxtrain

MPIRUN_FLAGS = shlex.split(os.environ.get("MXTRAIN_MPIRUN_FLAGS",
                                          "--oversubscribe --bind-to none"))


def start_job(out_dir, steps, timeout_s, checkpoint_every=0, binary=MXTRAIN_BIN, sets=None,
              env=None):
    require_binary()
    launcher = shutil.which("mpirun")
    assert launcher, "mpirun not found (apt-get install openmpi-bin)"
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
    sets = dict({"model.preset": "tiny", "train.steps": steps, "train.seq_len": 32,
            "train.micro_batch": 2, "train.eval_every": 0, "run.sample_tokens": 0,
            "checkpoint.every": checkpoint_every, "data.format": "random",
            "train.hang_timeout_s": timeout_s, "run.out_dir": out_dir}, **(sets or {}))
    args = [launcher, "-np", "2"] + MPIRUN_FLAGS + [str(binary), "train"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env, start_new_session=True)


def rank_pids(job):
    """{rank: pid} of the job's mxtrain processes (mpirun's children, by their environment)."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid != job.pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(kv.split(b"=", 1)[1])] = int(entry.name)
    return pids


def logged_steps(out_dir):
    path = Path(out_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def wait_for_step(job, out_dir, step, within_s=120):
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        assert job.poll() is None, f"the job ended early: {job.communicate()}"
        recs = [r for r in logged_steps(out_dir) if "step" in r]
        if recs and recs[-1]["step"] >= step:
            return
        time.sleep(0.05)
    pytest.fail(f"no step {step} within {within_s} s")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def stop_rank1(job, out_dir, then=None, within_s=60):
    """Once the job has logged step 3, stops rank 1 (SIGSTOP), runs `then(pid)` and waits for
    the job's end -> (rank pids, stderr, seconds from the stop to the end). The job is killed if
    the test fails first."""
    try:
        wait_for_step(job, out_dir, 3)
        pids = rank_pids(job)
        assert sorted(pids) == [0, 1], pids
        os.kill(pids[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        if then:
            then(pids[1])
        _, stderr = job.communicate(timeout=within_s)
        return pids, stderr, time.monotonic() - stopped_at
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def assert_fired_at_the_limit(line, took, slack_s):
    """The watchdog fires the limit after rank 0's last progress, not at once and not long
    after. That last progress may precede the stop by up to one interval, which is at most a
    tenth of the limit (the limit is at least 10 x the longest one); the message rounds the
    limit to whole seconds from 10 s up. -> the limit."""
    limit = float(re.search(r"\(the limit: ([\d.]+) s", line).group(1))
    assert 0.9 * limit - 0.5 <= took < limit + slack_s, (took, line)
    return limit


# every=1: rank 0 often waits for the stopped rank inside a checkpoint's collectives (the
# commit's agreement), which the watchdog bounds too
@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_a_stopped_rank_ends_the_job_with_exit_4(tmp_path, checkpoint_every):
    out = tmp_path / "run"
    job = start_job(out, steps=1000000, timeout_s=4, checkpoint_every=checkpoint_every)
    pids, stderr, took = stop_rank1(job, out)
    errs = [l for l in stderr.splitlines() if l.startswith("error:")]
    assert job.returncode == 4, (job.returncode, stderr[-3000:])
    assert len(errs) == 1, stderr[-3000:]
    assert errs[0].startswith("error: rank 0: no progress for "), errs[0]
    assert "train.hang_timeout_s" in errs[0], errs[0]
    # 4 s, or 10 x a micro-batch that a loaded machine stalled
    limit = assert_fired_at_the_limit(errs[0], took, slack_s=30.0)
    assert limit >= 4, errs[0]
    for pid in pids.values():
        t = time.monotonic()
        while alive(pid) and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert not alive(pid), f"rank pid {pid} outlived the job"
    # the metrics written so far are whole lines, their steps in order
    steps = [r["step"] for r in logged_steps(out) if "step" in r]
    assert steps[:3] == [1, 2, 3] and steps == sorted(steps), steps


def test_a_stopped_rank_ends_an_emulated_gpu_job(tmp_path):
    """The same on the CUDA backend under mxemu (docs/cuda_emu.md): FSDP over the emulated NCCL
    communicator, rank 0 waiting for the stopped rank in its collectives and stream waits. An
    emulated micro-batch takes about a second, so the limit is 10 x the longest one, past the
    4 s given: the adapted limit is the one that ends the job."""
    emu = Path(MXTRAIN_BIN).parent / "mxtrain_emu"
    if not (emu.is_file() and os.access(emu, os.X_OK)):
        pytest.fail(f"{emu} not built (CMake builds it with the tests)")
    out = tmp_path / "run"
    job = start_job(out, steps=1000000, timeout_s=4, binary=emu,
                    sets={"run.device": "cuda", "train.seq_len": 64},
                    env={"MXEMU_SM": "90"})
    pids, stderr, took = stop_rank1(job, out, within_s=180)
    errs = [l for l in stderr.splitlines() if l.startswith("error:")]
    assert job.returncode == 4, (job.returncode, stderr[-3000:])
    assert len(errs) == 1 and errs[0].startswith("error: rank 0: no progress for "), stderr[-3000:]
    m = re.search(r"\(the limit: ([\d.]+) s, 10 x the longest interval so far;", errs[0])
    assert m and float(m.group(1)) > 4, errs[0]
    assert_fired_at_the_limit(errs[0], took, slack_s=60.0)
    for pid in pids.values():
        t = time.monotonic()
        while alive(pid) and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert not alive(pid), f"rank pid {pid} outlived the job"


def test_with_the_watchdog_off_a_pause_is_waited_out(tmp_path):
    out = tmp_path / "run"
    job = start_job(out, steps=40, timeout_s=0)

    def pause(pid):
        time.sleep(5)  # longer than the other test's limit
        assert job.poll() is None
        os.kill(pid, signal.SIGCONT)

    _, stderr, _ = stop_rank1(job, out, then=pause, within_s=180)
    assert job.returncode == 0, stderr[-3000:]
    assert [r["step"] for r in logged_steps(out) if "step" in r][-1] == 40


@pytest.mark.parametrize("value,needle", [
    ("-1", "train.hang_timeout_s must be in [0, "),
    ("1e8", "train.hang_timeout_s must be in [0, "),
    ("nan", "expected a finite number"),
    ("soon", "expected a number"),
])
def test_bad_values_are_refused(tmp_path, value, needle):
    require_binary()
    r = run_mxtrain(["train", "--set", "model.preset=tiny", "--set", "train.steps=1",
                     "--set", f"train.hang_timeout_s={value}", "--set",
                     f"run.out_dir={tmp_path / 'run'}"], timeout=60)
    assert_one_error(r, needle, rc=2)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
