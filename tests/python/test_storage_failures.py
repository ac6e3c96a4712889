"""Local storage failures: one `error:` line, exit 3 (2 for a path that is bad input), and no
earlier data damaged.

Failures are made for real: a file-size limit (RLIMIT_FSIZE: writes fail with EFBIG), /dev/full,
a FIFO nobody reads, and system calls made to fail by strace's fault injection (rename,
renameat2), which is how a disk that throws EIO looks to the program. The expected outcome is
what the files held before the failure, byte for byte."""
import json
import os
import resource
import shutil
import subprocess

import pytest

from conftest import MXTRAIN_BIN, run_mxtrain, set_args

RANK_FILE = "rank_00000-of-00001.safetensors"


def run1(args, **kw):
    return run_mxtrain(args, threads=1, **kw)


def tiny(tmp_path, name, **over):
    s = {"model.preset": "tiny", "data.format": "random", "train.steps": 4,
         "checkpoint.every": 2, "train.micro_batch": 2, "train.seq_len": 32,
         "train.eval_every": 0, "run.sample_tokens": 0, "run.out_dir": tmp_path / name}
    s.update(over)
    return ["train"] + set_args(s)


def errors(r):
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


def tree_bytes(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def strace_usable():
    """strace (installed by scripts/setup.sh --tests) needs ptrace, which a container may deny."""
    if not shutil.which("strace"):
        pytest.fail("strace is missing: scripts/setup.sh --tests installs it")
    p = subprocess.run(["strace", "-f", "-qq", "-o", "/dev/null", "true"], capture_output=True)
    if p.returncode != 0:
        pytest.skip(f"strace cannot trace here: {p.stderr.decode()[-200:]}")


def run_strace(inject_path, injections, args):
    """mxtrain under strace, failing the listed system calls whose first path is inject_path."""
    strace_usable()
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(inject_path),
           "-e", "trace=" + ",".join(sorted({i.split(":")[0] for i in injections}))]
    for i in injections:
        cmd += ["-e", "inject=" + i]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(cmd + [MXTRAIN_BIN] + [str(a) for a in args], capture_output=True,
                       text=True, env=env, timeout=240)
    return p


def test_a_failed_replacing_commit_keeps_the_committed_step(tmp_path, mxtrain):
    """A run that saves a step number its root already holds (resume = none into a used root)
    swaps it in atomically; when neither the swap nor the fallback's renames work, the committed
    step stays as it was (before: the old step was moved aside and then deleted)."""
    r = run1(tiny(tmp_path, "run", **{"checkpoint.resume": "none"}))
    assert r.rc == 0, r
    ckpt = tmp_path / "run" / "checkpoints"
    before = tree_bytes(ckpt / "step_00000002")
    # Another seed: the new step 2 would differ from the old one.
    p = run_strace(ckpt / ".step_00000002.partial",
                   ["renameat2:error=EIO", "rename:error=EIO"],
                   tiny(tmp_path, "run", **{"checkpoint.resume": "none", "train.seed": 7}))
    assert p.returncode == 3, p.stderr
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "step_00000002" in errs[0], p.stderr
    assert tree_bytes(ckpt / "step_00000002") == before
    assert mxtrain(["ckpt", "verify", ckpt / "step_00000002"]).rc == 0
    # Without injected failures the same rerun replaces step 2 with its own.
    r = run1(tiny(tmp_path, "run", **{"checkpoint.resume": "none", "train.seed": 7}))
    assert r.rc == 0, r
    assert (ckpt / "step_00000002" / RANK_FILE).read_bytes() != before[RANK_FILE]
    assert not [n.name for n in ckpt.iterdir() if n.name.startswith(".")]


def test_a_step_moved_aside_by_an_interrupted_commit_comes_back(tmp_path, mxtrain):
    """A replacing commit stopped between its two renames (the fallback where the file system
    has no atomic exchange) leaves the committed step at .step_N.old: the next run puts it back
    before choosing where to resume, and resumes from it."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    ckpt = tmp_path / "run" / "checkpoints"
    (ckpt / "step_00000002").rename(ckpt / ".step_00000002.old")
    r = run1(tiny(tmp_path, "run"))
    assert r.rc == 0, r
    assert "resumed from" in r.stderr and "step_00000002" in r.stderr, r
    assert sorted(n.name for n in ckpt.iterdir()) == ["step_00000002", "step_00000004"]


def test_a_step_retention_cannot_delete_stays_with_a_warning(tmp_path, mxtrain):
    """checkpoint.keep: a step that cannot be deleted stays and the run goes on to its last
    checkpoint (before: exit 3 at the first failed delete, the run's later steps lost)."""
    p = run_strace(tmp_path / "run" / "checkpoints" / "step_00000002", ["rename:error=EPERM"],
                   tiny(tmp_path, "run", **{"train.steps": 6, "checkpoint.keep": 1}))
    assert p.returncode == 0, p.stderr
    assert "warning: checkpoint.keep" in p.stderr and "Operation not permitted" in p.stderr
    ckpt = tmp_path / "run" / "checkpoints"
    assert sorted(n.name for n in ckpt.iterdir()) == ["step_00000002", "step_00000006"]


def fsize_limit(nbytes):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


@pytest.mark.parametrize("async_", [True, False])
def test_a_file_size_limit_is_a_storage_failure_not_a_kill(tmp_path, mxtrain, async_):
    """Under `ulimit -f` a write beyond the limit raises SIGXFSZ, which killed mxtrain without an
    error line (exit 153 in a shell); ignored, the write fails with EFBIG, is retried, and ends
    the run with exit 3, from the background writer or from the training thread. Export
    likewise, leaving no temporary file behind."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    # The tiny model's rank file is ~1.4 MB; metrics lines are far below 200 kB.
    args = tiny(tmp_path, "run", **{"checkpoint.async": async_})
    p = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args],
                       capture_output=True, text=True, env=env, timeout=240,
                       preexec_fn=fsize_limit(200_000))
    assert p.returncode == 3, (p.returncode, p.stderr)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errs) == 1 and "File too large" in errs[0], p.stderr
    assert "retrying" in p.stderr
    # Export of a real checkpoint under the same limit.
    r = run1(tiny(tmp_path, "ok"))
    assert r.rc == 0, r
    out = tmp_path / "export"
    p = subprocess.run([MXTRAIN_BIN, "ckpt", "export-hf", str(tmp_path / "ok" / "checkpoints"),
                        str(out)], capture_output=True, text=True, env=env, timeout=240,
                       preexec_fn=fsize_limit(200_000))
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert p.stderr.startswith("error:") and "File too large" in p.stderr, p.stderr
    assert sorted(n.name for n in out.iterdir()) == [], list(out.iterdir())


def test_an_unusable_checkpoint_directory_is_found_before_training(tmp_path, mxtrain):
    """A checkpoint.dir that cannot be written fails at start-up, not at the first save after
    the training it was to keep. One under a regular file cannot exist as configured: bad
    input (exit 2), as a dangling link is, not a storage failure."""
    blocker = tmp_path / "file"
    blocker.write_text("a file\n")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    for ckdir, code, says in ((blocker / "ck", 2, "Not a directory"), (dangling, 2, "nowhere"),
                              (blocker, 2, "not a directory")):
        r = run1(tiny(tmp_path, "run", **{"checkpoint.dir": ckdir}))
        assert r.rc == code, r
        assert len(errors(r)) == 1 and says in errors(r)[0], r
        assert "step 1/" not in r.stdout, r  # nothing trained
    assert blocker.read_text() == "a file\n"
    assert not (tmp_path / "nowhere").exists()


def test_metrics_may_not_overwrite_an_input_or_a_checkpoint(tmp_path, mxtrain):
    """run.metrics naming the data file (u16: memory-mapped, its truncation killed the run with
    SIGBUS after emptying it), the config file, or a file in a checkpoint is refused."""
    data = tmp_path / "tokens.u16"
    data.write_bytes(bytes(range(256)) * 400)
    config = tmp_path / "run.toml"
    config.write_text("[train]\nsteps = 2\n")
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    before = tree_bytes(step)
    for metrics, extra, says in (
            (data, {"data.format": "u16", "data.path": data}, "data.path"),
            (tmp_path / "." / "tokens.u16", {"data.format": "u16", "data.path": data}, "data.path"),
            (config, {}, "--config"),
            (step / "metrics.jsonl", {}, "inside the checkpoint"),
            (step / RANK_FILE, {}, "inside the checkpoint")):
        args = tiny(tmp_path, "other", **dict(extra, **{"run.metrics": metrics}))
        r = run1(["train", "--config", config] + args[1:])
        assert r.rc == 2, r
        assert len(errors(r)) == 1 and says in errors(r)[0], r
    assert data.read_bytes() == bytes(range(256)) * 400
    assert config.read_text() == "[train]\nsteps = 2\n"
    assert tree_bytes(step) == before


def test_a_torn_metrics_line_is_dropped_when_a_run_resumes(tmp_path, mxtrain):
    """A run stopped mid-line (a full disk, SIGKILL) leaves half a JSON object; the resumed run
    starts a fresh line instead of gluing its first record onto it."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    metrics = tmp_path / "run" / "metrics.jsonl"
    whole = metrics.read_text()
    with open(metrics, "a") as f:
        f.write('{"step": 3, "loss": 5.5')
    r = run1(tiny(tmp_path, "run"))
    assert r.rc == 0, r
    text = metrics.read_text()
    assert text.startswith(whole)
    records = [json.loads(l) for l in text.splitlines()]  # every line parses
    assert [o["step"] for o in records if not o.get("summary")][-2:] == [3, 4]


def test_a_metrics_line_missing_only_its_newline_is_kept_when_a_run_resumes(tmp_path, mxtrain):
    """A last line that is a whole JSON object but for its newline (a kill between the two
    writes) was dropped as torn, and its step, already checkpointed, was not redone: its line
    was lost. It gets its newline now; a half object is still dropped (the test above)."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    metrics = tmp_path / "run" / "metrics.jsonl"
    text = metrics.read_text()
    lines = text.splitlines()
    last = json.dumps({"step": 2, "loss": 5.5, "note": "whole but for its newline"})
    metrics.write_text("\n".join(lines) + "\n" + last)
    r = run1(tiny(tmp_path, "run", **{"train.steps": 3}))
    assert r.rc == 0, r
    records = [json.loads(l) for l in metrics.read_text().splitlines()]  # every line parses
    assert json.loads(last) in records
    assert [o["step"] for o in records if not o.get("summary")][-2:] == [2, 3]


def test_a_metrics_fifo_nobody_reads_fails_instead_of_hanging(tmp_path, mxtrain):
    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    r = run1(tiny(tmp_path, "run", **{"run.metrics": fifo}), timeout=60)
    assert r.rc == 3, r
    assert len(errors(r)) == 1 and "FIFO" in errors(r)[0], r


def test_a_metrics_directory_that_cannot_be_made_says_why(tmp_path, mxtrain):
    """The directory's creation failed silently and the open after it said "No such file or
    directory". /sys refuses new directories (EPERM, or read-only) where this runs; where it
    does not (a test machine with a writable /sys), the case is skipped."""
    probe = f"/sys/mxtrain_probe_{os.getpid()}"
    try:
        os.mkdir(probe)
        os.rmdir(probe)
        pytest.skip("/sys takes new directories here")
    except OSError as e:
        why = os.strerror(e.errno)
    r = run1(tiny(tmp_path, "run", **{"run.metrics": f"{probe}/m.jsonl"}), timeout=60)
    assert r.rc == 3, r
    assert len(errors(r)) == 1 and probe in errors(r)[0] and why in errors(r)[0], r


def test_output_that_cannot_be_written_is_a_storage_failure(tmp_path, mxtrain):
    """stdout onto a full disk (/dev/full): exit 3 and an error line, not exit 0 and nothing."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for args in (["ckpt", "ls", tmp_path / "run" / "checkpoints"],
                 ["generate", "--model", tmp_path / "run" / "checkpoints", "--max-tokens", "50"]):
        with open("/dev/full", "w") as full:
            p = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args], stdout=full,
                               stderr=subprocess.PIPE, text=True, env=env, timeout=240)
        assert p.returncode == 3, (args, p.returncode, p.stderr)
        assert "error: cannot write standard output: No space left on device" in p.stderr


def test_export_named_after_its_step_is_allowed_but_not_into_a_root(tmp_path, mxtrain):
    """An output path with a component named like a step (exports/step_00000002, a common
    name for an export of that step) was refused as "inside the checkpoint" by its name alone.
    Exporting into a checkpoint root was allowed, and its config.json then made the root read
    as a Hugging Face model: generate --model ROOT loaded the export, not the newest step."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    root = tmp_path / "run" / "checkpoints"
    before = tree_bytes(root)
    for out in (tmp_path / "exports" / "step_00000002", tmp_path / "e" / "step_00000002" / "hf"):
        r = mxtrain(["ckpt", "export-hf", root / "step_00000002", out])
        assert r.rc == 0, r
        assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    # a step the root has not made yet is still inside it; the root itself is refused
    for out, says in ((root / "step_00000009", "lies inside the checkpoint"),
                      (root, "is a checkpoint root")):
        r = mxtrain(["ckpt", "export-hf", root / "step_00000002", out])
        assert r.rc == 2 and len(errors(r)) == 1 and says in errors(r)[0], r
    assert tree_bytes(root) == before


def test_export_into_a_checkpoint_is_refused(tmp_path, mxtrain):
    """ckpt export-hf into the step it reads (or any step directory) would rewrite that
    checkpoint's config.json (bf16: a byte more) and invalidate it."""
    r = run1(tiny(tmp_path, "run", **{"train.steps": 2}))
    assert r.rc == 0, r
    step = tmp_path / "run" / "checkpoints" / "step_00000002"
    before = tree_bytes(step)
    for out in (step, step / "hf"):
        r = mxtrain(["ckpt", "export-hf", step, out, "--dtype", "bf16"])
        assert r.rc == 2, r
        assert len(errors(r)) == 1 and "lies inside the checkpoint" in errors(r)[0], r
    assert tree_bytes(step) == before
    assert mxtrain(["ckpt", "verify", step]).rc == 0
