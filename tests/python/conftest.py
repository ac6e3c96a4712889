"""Shared test plumbing: where the binary is, running it, temp dirs, writing inputs it reads."""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
MXTRAIN_BIN = os.environ.get("MXTRAIN_BIN", str(REPO / "build" / "mxtrain"))

# Before numpy and torch load OpenBLAS: the PyTorch references run on mxtrain's kernels.
import blas_env  # noqa: E402

blas_env.match_mxtrain_blas(MXTRAIN_BIN)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hf_io  # noqa: E402


class Result:
    def __init__(self, args, rc, stdout, stderr):
        self.args, self.rc, self.stdout, self.stderr = args, rc, stdout, stderr

    def __repr__(self):
        return (f"mxtrain {' '.join(map(str, self.args))}\n  exit {self.rc}\n"
                f"  stdout: {self.stdout[-3000:]}\n  stderr: {self.stderr[-3000:]}")

    def value(self, key):
        """The value of a `key <value>` line on stdout (the last one if repeated)."""
        found = None
        for line in self.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key:
                found = parts[1]
        if found is None:
            raise AssertionError(f"no '{key} <value>' line in stdout:\n{self.stdout}")
        return found


def run_mxtrain(args, timeout=240, env=None, cwd=None, threads=2):
    """Runs the binary; returns Result(rc, stdout, stderr). rc is None on timeout."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", str(threads))
    full_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    try:
        p = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args], capture_output=True,
                           text=True, errors="replace", timeout=timeout, env=full_env, cwd=cwd)
        return Result(args, p.returncode, p.stdout, p.stderr)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return Result(args, None, out, err + f"\n[timed out after {timeout}s]")


def error_lines(r):
    """The `error:` lines of a Result's stderr."""
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


def assert_one_error(r, *needles, rc=2):
    """Exactly one `error:` line, holding every needle, and exit code rc."""
    errs = error_lines(r)
    assert r.rc == rc and len(errs) == 1, r
    for n in needles:
        assert n in errs[0], (n, errs[0])


def cpu_flags():
    """The feature flags of the first CPU in /proc/cpuinfo (empty where there is none)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def binary_available():
    return os.path.isfile(MXTRAIN_BIN) and os.access(MXTRAIN_BIN, os.X_OK)


def require_binary():
    """A missing binary fails the test (a suite that silently skips everything can't fail);
    MXTRAIN_SKIP_MISSING=1 turns that into a skip, for working on the reference alone."""
    if binary_available():
        return
    msg = f"mxtrain binary not built at {MXTRAIN_BIN} (build it, or set MXTRAIN_BIN)"
    if os.environ.get("MXTRAIN_SKIP_MISSING") == "1":
        pytest.skip(msg)
    pytest.fail(msg)


@pytest.fixture
def mxtrain():
    require_binary()
    return run_mxtrain


def write_tokens_i32(path, tokens):
    np.ascontiguousarray(np.asarray(tokens, dtype="<i4")).tofile(path)


def write_model(dir_path, cfg, params):
    hf_io.write_hf_dir(str(dir_path), cfg, params)
    return dir_path


def tiny_checkpoint(mxtrain, out_dir, steps=1):
    """Trains the tiny preset for `steps` steps on random data into out_dir; returns its
    checkpoint root (out_dir/checkpoints)."""
    r = mxtrain(["train"] + set_args({
        "model.preset": "tiny", "train.steps": steps, "train.seq_len": 16,
        "train.micro_batch": 1, "run.sample_tokens": 0, "train.eval_every": 0,
        "data.format": "random", "run.out_dir": out_dir}), timeout=120)
    assert r.rc == 0, r
    return out_dir / "checkpoints"


def read_metrics(path):
    """Returns (list of per-step objects, summary object or None)."""
    steps, summary = [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            if obj.get("summary"):
                summary = obj
            else:
                steps.append(obj)
    return steps, summary


def set_args(settings):
    """{'train.steps': 8, ...} -> ['--set', 'train.steps=8', ...] (bools as true/false)."""
    out = []
    for k, v in settings.items():
        if isinstance(v, bool):
            v = "true" if v else "false"
        out += ["--set", f"{k}={v}"]
    return out


ENGLISH = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
    "single step. All that glitters is not gold. The early bird catches the worm, but the second "
    "mouse gets the cheese. Knowledge is power, and time is money. When in Rome, do as the Romans "
    "do. Actions speak louder than words. Practice makes perfect. Where there is a will, there is "
    "a way. Every cloud has a silver lining. Fortune favors the bold. Honesty is the best policy. "
    "The pen is mightier than the sword. Rome was not built in a day. Two heads are better than "
    "one. Better late than never. Curiosity killed the cat, but satisfaction brought it back. "
    "Do not count your chickens before they hatch. Look before you leap. Still waters run deep. "
    "There is no place like home. You cannot judge a book by its cover. Birds of a feather flock "
    "together. A picture is worth a thousand words. Beauty is in the eye of the beholder. "
)


def english_text(n_bytes=6000):
    reps = n_bytes // len(ENGLISH) + 1
    return (ENGLISH * reps)[:n_bytes]
