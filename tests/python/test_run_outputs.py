"""What a training run does to the files that are already in its output directory, and to the
pipes it writes to: a second run into a directory in use is refused, an earlier run's metrics
are kept, a closed stdout or stderr ends nothing, and an output path the configuration makes
impossible is bad input (exit 2), not a storage failure (exit 3)."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import (MXTRAIN_BIN, english_text, error_lines, read_metrics, require_binary,
                      set_args)

TINY = {"model.preset": "tiny", "train.seq_len": 32, "train.micro_batch": 1,
        "train.log_every": 1, "train.eval_every": 0, "run.sample_tokens": 0,
        "data.format": "random"}


def env1():
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def metrics_lines(path):
    """Every line parses as JSON (no torn or interleaved line)."""
    with open(path) as f:
        return [json.loads(l) for l in f.read().splitlines()]


def test_a_second_run_into_an_out_dir_in_use_is_refused(tmp_path, mxtrain):
    """Two runs into one run.out_dir both exited 0: metrics.jsonl got both runs' lines, two
    summaries and a torn line, and one run's final checkpoint replaced the other's. The second
    is now refused at start-up, naming the directory and the first run's pid, and touches
    nothing of the first."""
    require_binary()
    out = tmp_path / "out"
    first = subprocess.Popen([MXTRAIN_BIN, "train"] + set_args(
        dict(TINY, **{"train.steps": 100000, "run.out_dir": out, "checkpoint.every": 0})),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env1())
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not ((out / "metrics.jsonl").exists() and
                                              (out / "metrics.jsonl").stat().st_size > 0):
            time.sleep(0.1)
        assert (out / "metrics.jsonl").exists(), "the first run did not start"
        for extra in ({}, {"run.metrics": tmp_path / "other.jsonl"}):
            r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 2,
                                                           "run.out_dir": out}, **extra)),
                        timeout=60)
            errs = error_lines(r)
            assert r.rc == 2 and len(errs) == 1, r
            assert str(out) in errs[0] and str(first.pid) in errs[0], errs[0]
        # the same checkpoint directory from another out_dir
        r = mxtrain(["train"] + set_args(dict(TINY, **{
            "train.steps": 2, "run.out_dir": tmp_path / "out2",
            "checkpoint.dir": out / "checkpoints"})), timeout=60)
        assert r.rc == 2 and len(error_lines(r)) == 1, r
        assert str(out / "checkpoints") in error_lines(r)[0], r
        assert not (tmp_path / "other.jsonl").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert "error:" not in err, err
    lines = metrics_lines(out / "metrics.jsonl")
    steps = [l["step"] for l in lines if not l.get("summary")]
    assert steps == list(range(1, len(steps) + 1)), steps
    assert sum(1 for l in lines if l.get("summary")) == 1
    # once it ended, the directory is free: a run there resumes from its stop checkpoint
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": steps[-1] + 1,
                                                   "run.out_dir": out})), timeout=120)
    assert r.rc == 0 and "resumed from" in r.stderr, r


def test_a_second_run_into_a_metrics_file_in_use_is_refused(tmp_path, mxtrain):
    """Two runs with their own out_dirs but one run.metrics outside both (their out_dir locks do
    not cover it) wrote into one file: the second's start moved the first's file aside as
    `.1` while it wrote on, then both wrote lines. The second is refused at start-up, exit 2,
    the first's file left where it is; once the first ended, the file is free again."""
    require_binary()
    shared = tmp_path / "shared.jsonl"
    first = subprocess.Popen([MXTRAIN_BIN, "train"] + set_args(
        dict(TINY, **{"train.steps": 100000, "run.out_dir": tmp_path / "a",
                      "run.metrics": shared, "checkpoint.every": 0})),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env1())
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (shared.exists() and shared.stat().st_size > 0):
            time.sleep(0.1)
        assert shared.exists(), "the first run did not start"
        for resume in ("none", "auto"):
            r = mxtrain(["train"] + set_args(dict(TINY, **{
                "train.steps": 2, "run.out_dir": tmp_path / f"b_{resume}",
                "run.metrics": shared, "checkpoint.resume": resume})), timeout=60)
            errs = error_lines(r)
            assert r.rc == 2 and len(errs) == 1, r
            assert str(shared) in errs[0] and "another run" in errs[0], errs[0]
        assert not (tmp_path / "shared.jsonl.1").exists()
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert "error:" not in err, err
    lines = metrics_lines(shared)
    steps = [l["step"] for l in lines if not l.get("summary")]
    assert steps == list(range(1, len(steps) + 1)) and lines[-1].get("summary"), steps
    # free once the first ended: a fresh run keeps its lines as .1 and writes its own
    r = mxtrain(["train"] + set_args(dict(TINY, **{
        "train.steps": 2, "run.out_dir": tmp_path / "c", "run.metrics": shared})), timeout=60)
    assert r.rc == 0, r
    assert metrics_lines(tmp_path / "shared.jsonl.1") == lines


def test_a_killed_run_leaves_no_lock_behind(tmp_path, mxtrain):
    """kill -9 (a spot reclaim without notice) ends the lock with the process: the next run
    into the same directory starts."""
    require_binary()
    out = tmp_path / "out"
    p = subprocess.Popen([MXTRAIN_BIN, "train"] + set_args(
        dict(TINY, **{"train.steps": 100000, "run.out_dir": out})),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env1())
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "metrics.jsonl").exists():
        time.sleep(0.1)
    p.kill()
    p.wait()
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 1, "run.out_dir": out,
                                                   "checkpoint.resume": "none"})), timeout=120)
    assert r.rc == 0, r


def test_a_fresh_run_keeps_an_earlier_runs_metrics(tmp_path, mxtrain):
    """A fresh run (checkpoint.resume = none, or checkpoints kept elsewhere) into an out_dir
    holding an earlier run's metrics.jsonl truncated it without a word. The earlier file is now
    kept as metrics.jsonl.1 (then .2, ...), and a warning says so."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = '{"step": 1, "loss": 5.0}\n{"summary": true}\n'
    (out / "metrics.jsonl").write_text(earlier)
    (out / "metrics.jsonl.1").write_text("older\n")
    run = dict(TINY, **{"train.steps": 1, "run.out_dir": out, "checkpoint.resume": "none"})
    r = mxtrain(["train"] + set_args(run), timeout=120)
    assert r.rc == 0, r
    assert (out / "metrics.jsonl.1").read_text() == "older\n"
    assert (out / "metrics.jsonl.2").read_text() == earlier
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1 and "metrics.jsonl.2" in warns[0], r.stderr
    steps, summary = read_metrics(out / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1] and summary is not None
    # an empty file holds nothing to keep: no warning, no copy
    (out / "metrics.jsonl").write_text("")
    r = mxtrain(["train"] + set_args(run), timeout=120)
    assert r.rc == 0 and "metrics.jsonl.3" not in r.stderr, r
    assert not (out / "metrics.jsonl.3").exists()


def test_a_metrics_link_is_written_through_not_moved(tmp_path, mxtrain):
    """run.metrics = /dev/stdout with stdout a non-empty log file: the earlier-metrics rename
    moved the link /dev/stdout itself aside (stat followed it, rename moved it), breaking it
    for every later process. A link is now written through as before; here a link to a
    non-empty file stands for /dev/stdout."""
    log = tmp_path / "log.txt"
    log.write_text("earlier output\n")
    link = tmp_path / "stdout"
    link.symlink_to(log)
    run = dict(TINY, **{"train.steps": 1, "run.out_dir": tmp_path / "o", "run.metrics": link})
    r = mxtrain(["train"] + set_args(run), timeout=120)
    assert r.rc == 0, r
    assert link.is_symlink() and os.readlink(link) == str(log), list(tmp_path.iterdir())
    assert not (tmp_path / "stdout.1").exists()
    steps, _ = read_metrics(log)
    assert [s["step"] for s in steps] == [1]


def test_a_run_makes_no_out_dir_it_does_not_write(tmp_path, mxtrain):
    """With run.metrics and checkpoint.dir elsewhere nothing goes to run.out_dir, which the lock
    created anyway (a read-only working directory then refused the run)."""
    run = dict(TINY, **{"train.steps": 1, "run.out_dir": tmp_path / "o",
                        "run.metrics": tmp_path / "m" / "metrics.jsonl",
                        "checkpoint.dir": tmp_path / "ck"})
    r = mxtrain(["train"] + set_args(run), timeout=120)
    assert r.rc == 0, r
    assert not (tmp_path / "o").exists()
    assert (tmp_path / "ck" / "step_00000001").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to leave another user's file")
def test_a_lock_file_another_user_left_is_taken_over(tmp_path):
    """A killed run's .mxtrain.lock (0644, another user's) stopped everyone else for good:
    'cannot create the lock file ...: Permission denied'. flock needs no write access: the file
    is taken read-only."""
    import shutil
    import tempfile
    from pathlib import Path
    out = Path(tempfile.mkdtemp(prefix="mxtrain-lock-", dir="/tmp"))  # (tmp_path is 0700)
    try:
        os.chmod(out, 0o777)
        (out / ".mxtrain.lock").write_text("12345\n")  # root's, as a killed root run leaves it
        run = dict(TINY, **{"train.steps": 1, "run.out_dir": out})
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            MXTRAIN_BIN, "train"] + [str(a) for a in set_args(run)],
                           capture_output=True, text=True, env=env1(), timeout=120, cwd="/tmp")
        assert p.returncode == 0, p.stderr
    finally:
        shutil.rmtree(out, ignore_errors=True)


NO_FLOCK_SHIM = r"""
#include <errno.h>
int flock(int fd, int operation) {  /* every flock fails as on a file system without locks */
  (void)fd; (void)operation;
  errno = ENOLCK;
  return -1;
}
"""


@pytest.mark.parametrize("earlier", [False, True])
def test_a_file_system_without_locks_runs_unguarded_and_says_so(tmp_path, earlier):
    """Where flock fails (ENOLCK, EOPNOTSUPP: some FUSE and NFS mounts; here every flock call,
    through an LD_PRELOAD shim) the run goes on unguarded: it said nothing of that, and left
    the .mxtrain.lock it made behind in every directory for good. Now a warning says so, for
    run.out_dir and for checkpoint.dir, and a lock file this run made is removed again; one that
    was there (earlier=True) stays, since elsewhere another run may hold it."""
    require_binary()
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler for the flock shim"
    (tmp_path / "shim.c").write_text(NO_FLOCK_SHIM)
    shim = tmp_path / "noflock.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c")],
                   check=True, timeout=60)
    out = tmp_path / "out"
    if earlier:
        out.mkdir()
        (out / ".mxtrain.lock").write_text("12345\n")
    run = dict(TINY, **{"train.steps": 2, "run.out_dir": out})
    p = subprocess.run([MXTRAIN_BIN, "train"] + [str(a) for a in set_args(run)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(env1(), LD_PRELOAD=str(shim)))
    assert p.returncode == 0, p.stderr[-2000:]
    warned = [l for l in p.stderr.splitlines() if "takes no file locks" in l]
    want = {f"warning: run.out_dir {out}: this file system takes no file locks (flock: No locks "
            "available), so nothing stops a second run from writing into it at the same time",
            f"warning: checkpoint.dir {out / 'checkpoints'}: this file system takes no file locks "
            "(flock: No locks available), so nothing stops a second run from writing into it at "
            "the same time"}
    assert len(warned) == 2 and set(warned) == want, p.stderr[-2000:]
    assert (out / "checkpoints" / "step_00000002").is_dir()  # the run itself as ever
    assert not (out / "checkpoints" / ".mxtrain.lock").exists()
    if earlier:
        assert (out / ".mxtrain.lock").read_text() == "12345\n"
        return
    assert not (out / ".mxtrain.lock").exists(), sorted(out.iterdir())
    # A resume appending to a metrics file with another name (a hard link) copies it first
    # and appends to the copy, which it locked: there the lock's failure was a storage error
    # (exit 3); now the copy goes unlocked, as any metrics file there does.
    hard = tmp_path / "hard.jsonl"
    os.link(out / "metrics.jsonl", hard)
    run = dict(TINY, **{"train.steps": 3, "run.out_dir": out, "run.metrics": hard})
    p = subprocess.run([MXTRAIN_BIN, "train"] + [str(a) for a in set_args(run)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(env1(), LD_PRELOAD=str(shim)))
    assert p.returncode == 0, p.stderr[-2000:]
    assert any(l.startswith("warning:") and "hard links" in l for l in p.stderr.splitlines())
    assert [l["step"] for l in metrics_lines(hard) if not l.get("summary")] == [1, 2, 3]
    assert [l["step"] for l in metrics_lines(out / "metrics.jsonl")
            if not l.get("summary")] == [1, 2]


def run_with_closed_pipe(args, which):
    """Runs mxtrain with stdout and/or stderr a pipe whose read end is already closed (what
    `| head -1` leaves once head has exited); the other stream is captured."""
    rd, wr = os.pipe()
    os.close(rd)
    try:
        p = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args],
                           stdout=wr if "out" in which else subprocess.PIPE,
                           stderr=wr if "err" in which else subprocess.PIPE,
                           env=env1(), timeout=120, text=True)
    finally:
        os.close(wr)
    return p


def test_a_closed_pipe_ends_no_training_run(tmp_path):
    """`mxtrain train ... 2>&1 | head -1` killed the run with SIGPIPE (exit 141, no `error:`,
    no checkpoint) at its second line on stderr. Progress that cannot be written now ends
    nothing: the run trains, writes its metrics and its checkpoint."""
    require_binary()
    out = tmp_path / "out"
    p = run_with_closed_pipe(["train"] + set_args(dict(TINY, **{"train.steps": 2,
                                                                 "run.out_dir": out})),
                             ("out", "err"))
    assert p.returncode == 0, p
    steps, summary = read_metrics(out / "metrics.jsonl")
    assert len(steps) == 2 and summary is not None
    assert (out / "checkpoints" / "step_00000002" / "manifest.json").is_file()


def test_a_result_that_cannot_reach_a_closed_pipe_is_a_storage_failure(tmp_path):
    """A command's result on stdout that cannot be written is exit 3 with one error line (as
    `> /dev/full` already was), not a silent death by SIGPIPE."""
    require_binary()
    p = run_with_closed_pipe(["train", "--list-keys"], ("out",))
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 3 and len(errs) == 1 and "standard output" in errs[0], p


@pytest.mark.parametrize("case", ["long_name", "out_dir_under_file", "metrics_under_file",
                                  "checkpoint_dir_under_file"])
def test_output_paths_the_config_makes_impossible_are_bad_input(tmp_path, mxtrain, case):
    """A 300-character run.name ("File name too long"), or an out_dir or metrics path under a
    regular file ("Not a directory") failed as a storage failure (exit 3): they are the
    configuration's, exit 2, and nothing is written."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "file").write_text("keep\n")
    run = dict(TINY, **{"train.steps": 1})
    if case == "long_name":
        run["run.name"] = "n" * 300
    elif case == "out_dir_under_file":
        run["run.out_dir"] = "file/out"
    elif case == "metrics_under_file":
        run["run.out_dir"] = "out"
        run["run.metrics"] = "file/m.jsonl"
    else:
        run["run.out_dir"] = "out"
        run["checkpoint.dir"] = "file/ck"
    r = mxtrain(["train"] + set_args(run), cwd=cwd, timeout=120)
    errs = error_lines(r)
    assert r.rc == 2 and len(errs) == 1, r
    assert (cwd / "file").read_text() == "keep\n"
    assert not list((cwd / "out").glob("**/step_*")) if (cwd / "out").exists() else True


def test_metrics_through_links(tmp_path, mxtrain):
    """run.metrics reached through links. A symbolic link to a committed step's state.json:
    refused (it was truncated and written into, and the next resume fell back a step). A link
    to an earlier run's metrics file: the file kept as .1 with a warning, as a plain file is
    (it was emptied). A hard link's other name on a resume: copied before appending (it changed
    the step's file under its own name). Each checked against the bytes before."""
    require_binary()
    good = tmp_path / "good"
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 2, "run.out_dir": good})),
                timeout=120)
    assert r.rc == 0, r
    state = good / "checkpoints" / "step_00000002" / "state.json"
    before = state.read_bytes()

    link = tmp_path / "m.jsonl"
    link.symlink_to(state)
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 2, "run.out_dir": tmp_path / "o",
                                                   "run.metrics": link})), timeout=120)
    errs = error_lines(r)
    assert r.rc == 2 and len(errs) == 1 and "step_00000002" in errs[0], r
    assert state.read_bytes() == before

    kept = tmp_path / "kept.jsonl"
    kept.write_bytes((good / "metrics.jsonl").read_bytes())
    earlier = kept.read_bytes()
    (tmp_path / "sl").mkdir()
    (tmp_path / "sl" / "metrics.jsonl").symlink_to(kept)
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 2,
                                                   "run.out_dir": tmp_path / "sl"})), timeout=120)
    assert r.rc == 0, r
    assert (tmp_path / "kept.jsonl.1").read_bytes() == earlier
    assert any(l.startswith("warning:") and "kept.jsonl.1" in l for l in r.stderr.splitlines()), r
    assert [l["step"] for l in metrics_lines(kept) if not l.get("summary")] == [1, 2]

    # a resume appending to a file with another name (a hard link; here the step's own
    # state.json, as a cp -al backup's names are): copied first, the other name untouched
    hard = tmp_path / "hard.jsonl"
    os.link(state, hard)
    r = mxtrain(["train"] + set_args(dict(TINY, **{"train.steps": 3, "run.out_dir": good,
                                                   "run.metrics": hard})), timeout=120)
    assert r.rc == 0, r
    assert any(l.startswith("warning:") and "hard links" in l for l in r.stderr.splitlines()), r
    assert state.read_bytes() == before and state.stat().st_nlink == 1
    assert hard.read_bytes().startswith(before)
    assert [l["step"] for l in map(json.loads, hard.read_bytes()[len(before):].decode()
                                   .splitlines()) if not l.get("summary")] == [3]
