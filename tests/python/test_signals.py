"""SIGTERM / SIGINT (spot reclaim, StopTrainingJob, Ctrl-C): the run stops at the next step
boundary, writes a checkpoint of the last completed step, and exits 143 / 130."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import MXTRAIN_BIN


def start_training(tmp_path, steps, sample_tokens):
    """`mxtrain train` on the tiny preset in the background; returns (process, out dir)."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a stitch in time saves nine. " * 400)
    out = tmp_path / "run"
    p = subprocess.Popen([MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                          "--set", f"data.path={corpus}", "--set", f"train.steps={steps}",
                          "--set", "train.seq_len=32", "--set", "train.eval_every=0",
                          "--set", f"run.sample_tokens={sample_tokens}",
                          "--set", f"run.out_dir={out}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=dict(os.environ, OMP_NUM_THREADS="1"))
    return p, out


def wait_for(predicate, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)


def test_a_stop_during_start_up_adds_no_empty_summary(tmp_path):
    """A resumed run stopped before its first step appended a summary of zero steps (final
    loss null, 0 tokens) after the real one, which readers take as the result. The stop is
    taken from the process's start (its handler is in place before anything else), so the
    signal is sent as soon as the handler shows in /proc; a 40 MB corpus keeps the start-up
    long enough for it to land there."""
    corpus = tmp_path / "big.txt"
    corpus.write_bytes(b"a stitch in time saves nine. " * 1400000)
    out = tmp_path / "run"
    args = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus}",
            "--set", "train.seq_len=32", "--set", "train.eval_every=0",
            "--set", "run.sample_tokens=0", "--set", f"run.out_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(args + ["--set", "train.steps=2"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    metrics = out / "metrics.jsonl"
    before = metrics.read_bytes()
    p = subprocess.Popen(args + ["--set", "train.steps=4"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    status = f"/proc/{p.pid}/status"

    def handler_in_place():
        try:
            caught = next(l for l in open(status) if l.startswith("SigCgt:"))
            return int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1))
        except (OSError, StopIteration):
            return False
    wait_for(handler_in_place, 30)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143, err[-2000:]
    if "step 3/4" in err:
        pytest.skip("the signal landed after the first step (a fast machine)")
    assert metrics.read_bytes() == before, metrics.read_text()[len(before):]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_during_the_data_scan_ends_the_run_there(tmp_path, sig, code):
    """Every id of the data is read once at start-up (the vocabulary check): minutes for
    terabytes of shards. A stop then waited for the end of the scan and the first step (and
    wrote a step-0 checkpoint of untrained weights). Now the scan ends at once and the run with
    it: no step, no checkpoint, no metrics. MXTRAIN_TEST_SLOW_SCAN_MS makes each shard's scan
    take 300 ms, 12 shards 3.6 s; the signal goes once the scan's progress line shows."""
    import numpy as np
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        rng.integers(0, 256, 4096, dtype=np.uint16).tofile(shards / f"s{i:02d}.u16")
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", MXTRAIN_TEST_SLOW_SCAN_MS="300",
               MXTRAIN_TEST_PROGRESS_S="0")
    p = subprocess.Popen([MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                          "--set", f"data.path={shards}", "--set", "data.format=u16",
                          "--set", "train.steps=3", "--set", "train.seq_len=32",
                          "--set", "run.sample_tokens=0", "--set", f"run.out_dir={out}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err, t0 = "", None
    for line in p.stderr:  # info lines reach stderr as they happen
        err += line
        if "checking ids" in line:
            p.send_signal(sig)
            t0 = time.monotonic()
            break
    err += p.stderr.read()
    p.wait(timeout=120)
    assert t0 is not None, err[-2000:]
    assert p.returncode == code, err[-2000:]
    assert time.monotonic() - t0 < 2.5, "the scan went on after the signal"
    assert "during start-up (checking data.path), before the first step" in err, err[-2000:]
    assert not list(out.rglob("step_*")), list(out.rglob("*"))
    assert not (out / "metrics.jsonl").exists() or (out / "metrics.jsonl").read_text() == ""


@pytest.mark.parametrize("source", ["resume", "init.from"])
def test_a_stop_while_the_weights_load_ends_the_run_there(tmp_path, source):
    """Loading a checkpoint (or init.from's Hugging Face weights) takes minutes for a large
    model on S3. A stop then waited for the whole load and the first step, and the resumed run
    wrote a checkpoint one step on. Now the load ends between tensors and the run with it: no
    new step, the checkpoint it read byte for byte as it was, exit 143. The load shows its
    progress (MXTRAIN_TEST_PROGRESS_S=0: a line after each tensor); MXTRAIN_TEST_SLOW_LOAD_MS
    makes each tensor's read take 300 ms; the signal goes at the first line."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a stitch in time saves nine. " * 400)
    base = [MXTRAIN_BIN, "train", "--set", f"data.path={corpus}", "--set", "train.seq_len=32",
            "--set", "train.eval_every=0", "--set", "run.sample_tokens=0",
            "--set", "checkpoint.every=1"]
    first = tmp_path / "first"
    tiny = ["--set", "model.preset=tiny"]
    r = subprocess.run(base + tiny + ["--set", "train.steps=1", "--set", f"run.out_dir={first}"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    step1 = first / "checkpoints" / "step_00000001"
    if source == "resume":
        out, line = first, "checkpoint: loading"
        extra = tiny + ["--set", "train.steps=3", "--set", f"run.out_dir={out}"]
    else:
        r = subprocess.run([MXTRAIN_BIN, "ckpt", "export-hf", str(step1), str(tmp_path / "hf")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out = tmp_path / "second"
        extra = ["--set", "train.steps=3", "--set", f"init.from={tmp_path / 'hf'}",
                 "--set", f"run.out_dir={out}"]
        line = f"loading {tmp_path / 'hf'}:"
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    env = dict(os.environ, OMP_NUM_THREADS="1", MXTRAIN_TEST_SLOW_LOAD_MS="300",
               MXTRAIN_TEST_PROGRESS_S="0")
    p = subprocess.Popen(base + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err, t0 = "", None
    for l in p.stderr:
        err += l
        if line in l:
            p.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            break
    err += p.stderr.read()
    p.wait(timeout=120)
    assert t0 is not None, err[-2000:]
    assert p.returncode == 143, err[-2000:]
    assert time.monotonic() - t0 < 2.5, "the load went on after the signal"
    during = "loading the checkpoint" if source == "resume" else "loading init.from"
    assert f"during start-up ({during}), before the first step" in err, err[-2000:]
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    assert not (out / "checkpoints" / "step_00000002").exists()


def test_a_stop_before_the_first_step_writes_no_checkpoint(tmp_path):
    """A stop between start-up and the first step (MXTRAIN_TEST_SIGNAL_BEFORE_FIRST_STEP: the
    process signals itself there) wrote the untrained weights as step 0, or, on a resumed run,
    rewrote the step it had resumed from (on S3: uncommitted first, so a failure lost it). Now
    nothing is written, and the resumed-from step stays byte for byte."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a stitch in time saves nine. " * 400)
    out = tmp_path / "run"
    base = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus}",
            "--set", "train.seq_len=32", "--set", "train.eval_every=0",
            "--set", "run.sample_tokens=0", "--set", f"run.out_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    stop = dict(env, MXTRAIN_TEST_SIGNAL_BEFORE_FIRST_STEP="1")
    r = subprocess.run(base + ["--set", "train.steps=2"], capture_output=True, text=True,
                       env=stop, timeout=120)
    assert r.returncode == 143, r.stderr
    assert "before the first step: nothing trained, no checkpoint written" in r.stderr, r.stderr
    assert not list(out.rglob("step_*")), list(out.rglob("*"))
    r = subprocess.run(base + ["--set", "train.steps=2"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    r = subprocess.run(base + ["--set", "train.steps=4"], capture_output=True, text=True,
                       env=stop, timeout=120)
    assert r.returncode == 143, r.stderr
    assert "the checkpoint it resumed from stands" in r.stderr and "step_00000002" in r.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns)
            for p in out.rglob("*") if p.is_file()} == before
    # resumed from another run's step: that step is the one named (not this run's directory)
    other = tmp_path / "other"
    r = subprocess.run(base[:-2] + ["--set", f"run.out_dir={other}", "--set", "train.steps=4",
                                    "--set", f"checkpoint.resume={out}/checkpoints/step_00000002"],
                       capture_output=True, text=True, env=stop, timeout=120)
    assert r.returncode == 143, r.stderr
    assert f"stands ({out}/checkpoints/step_00000002)" in r.stderr, r.stderr


def test_a_second_ctrl_c_quits_at_once(tmp_path, monkeypatch):
    """A stop waits for a step boundary, which a long start-up reaches minutes later: the first
    Ctrl-C says so, a second quits at once (killed by SIGINT, no stop checkpoint)."""
    monkeypatch.setenv("MXTRAIN_TEST_SLOW_STOP_MS", "20000")  # the stop checkpoint hangs on
    p, out = start_training(tmp_path, 1000000, 0)
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert p.poll() is None  # the first stops at a step boundary, held by the slow stop
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT, (p.returncode, err[-2000:])
    assert time.monotonic() - t0 < 15, "the second Ctrl-C waited for the stop"
    assert "Ctrl-C again to quit at once" in err, err[-2000:]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_checkpoints_and_exits(tmp_path, sig, code):
    p, out = start_training(tmp_path, 1000000, 0)
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    recs = [json.loads(l) for l in metrics.read_text().splitlines()]
    summary = recs[-1]
    assert summary["summary"] and summary["stopped_by_signal"] == int(sig)
    steps = [r["step"] for r in recs if not r.get("summary")]
    ckpt = out / "checkpoints" / f"step_{steps[-1]:08d}"  # the last completed step
    assert (ckpt / "manifest.json").exists(), (sorted(os.listdir(out / "checkpoints")), steps)
    v = subprocess.run([MXTRAIN_BIN, "ckpt", "verify", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_the_end_of_run_sample_ends_it(tmp_path, sig, code):
    """The signal flag was read only between training steps: during the end-of-run sample
    (up to run.sample_tokens = 2^20 tokens) SIGTERM and Ctrl-C were taken and ignored, and a
    SageMaker stop waited its 120 s for SIGKILL. Now the sample ends at the next token, is
    printed as far as it got, and the run exits with the signal's code; the training's
    checkpoint and summary are already complete."""
    p, out = start_training(tmp_path, 2, 200000)
    metrics = out / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and '"summary"' in metrics.read_text())
    time.sleep(1.0)  # into the sample (200,000 tokens take far longer than this test)
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        outs, err = p.communicate(timeout=60)
    finally:
        p.kill()  # a binary that ignores the signal would sample on after the test
    assert p.returncode == code, err
    assert time.monotonic() - t0 < 30
    assert "--- sample" in outs and outs.rstrip().endswith("---"), outs[-200:]
    stopped = [l for l in err.splitlines() if "sample stopped by signal" in l]
    assert len(stopped) == 1 and f"signal {int(sig)} after" in stopped[0], err
    assert "of 200000 tokens" in stopped[0]
    v = subprocess.run([MXTRAIN_BIN, "ckpt", "verify", str(out / "checkpoints" / "step_00000002")],
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143)])
def test_a_signal_during_validation_ends_it(tmp_path, sig, code):
    """The flag was read only between training steps: a validation of many eval_batches ran
    every batch before the run heard SIGTERM (10 minutes on, still validating). Now the ranks
    stop it at the next batch: no val_loss that step, the step's checkpoint written, exit 143.
    And a validation larger than a step may be (1e11 batches) is refused at start."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("a stitch in time saves nine. " * 400)
    out = tmp_path / "run"
    args = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus}",
            "--set", "train.steps=1000000", "--set", "train.seq_len=32",
            "--set", "train.eval_every=2", "--set", "train.log_every=1",
            "--set", "run.sample_tokens=0", "--set", f"run.out_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(args + ["--set", "train.eval_batches=100000000000"], capture_output=True,
                       text=True, env=env, timeout=60)
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "train.eval_batches" in errors[0], r.stderr
    p = subprocess.Popen(args + ["--set", "train.eval_batches=10000000"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    metrics = out / "metrics.jsonl"
    try:
        wait_for(lambda: metrics.exists() and '"step":1,' in metrics.read_text())
        time.sleep(2.0)  # step 2, then into its validation (10^7 batches: hours)
        t0 = time.monotonic()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, err[-2000:]
    assert time.monotonic() - t0 < 30
    stopped = [l for l in err.splitlines() if "validation stopped by a signal" in l]
    assert len(stopped) == 1 and "of 10000000 batches" in stopped[0], err[-2000:]
    recs = [json.loads(l) for l in metrics.read_text().splitlines()]
    steps = [r for r in recs if not r.get("summary")]
    assert steps[-1]["step"] == 2 and "val_loss" not in steps[-1], steps
    ckpt = out / "checkpoints" / "step_00000002"
    v = subprocess.run([MXTRAIN_BIN, "ckpt", "verify", str(ckpt)], capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
