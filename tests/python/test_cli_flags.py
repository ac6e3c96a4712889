"""Command-line flags and the command's own output: integers are decimal (as `--set` reads
them), help that cannot be written is a storage failure, and the small words of the output say
what they mean. Each case is what a hunt found the binary doing instead."""
import errno
import json
import os

import numpy as np
import pytest

from conftest import assert_one_error, error_lines, set_args


def sgemm(mxtrain, size):
    return mxtrain(["bench", "sgemm", "--size", size, "--seconds", "0"], timeout=60)


def test_integer_flags_are_decimal(mxtrain):
    """`--size 020` was read as octal 16 and `--size 0x10` as hex 16 (CLI11's conversion, and
    strtoll with base 0 in the range check), `--max-tokens 09` was "Could not convert". The rule
    is `--set`'s (docs/config.md): decimal, 010 is 10, 0x10 an error."""
    for text, size in [("020", 20), ("0020", 20), ("+20", 20), ("20", 20)]:
        r = sgemm(mxtrain, text)
        assert r.rc == 0, r
        assert json.loads(r.stdout)["size"] == size, (text, r.stdout)
    for text in ("0x10", "0b10", "0o20", "1e2", "20.0", " 20", "2_0"):
        assert_one_error(sgemm(mxtrain, text), "--size")


def test_an_unsigned_flag_refuses_a_negative_number(tmp_path, mxtrain):
    """`numerics quantize --seed -1` wrapped to 18446744073709551615 and said so."""
    src = tmp_path / "x.safetensors"
    x = np.zeros((1, 32), dtype=np.float32)
    header = json.dumps({"x": {"dtype": "F32", "shape": [1, 32], "data_offsets": [0, 128]}})
    with open(src, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header.encode() + x.tobytes())
    r = mxtrain(["numerics", "quantize", "--format", "e4m3", "--stochastic", "--in", src,
                 "--out", tmp_path / "q.safetensors", "--seed", "-1"])
    assert_one_error(r, "--seed")
    assert "18446744073709551615" not in r.stderr
    assert not (tmp_path / "q.safetensors").exists()


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["--help-all"],
                                  ["bench", "sgemm", "--help"], ["--version"]])
def test_help_that_cannot_be_written_is_a_storage_failure(mxtrain, args):
    """`mxtrain --help > /dev/full` exited 0 with nothing written (`--list-keys > /dev/full`
    was already exit 3)."""
    import subprocess
    from conftest import MXTRAIN_BIN
    with open("/dev/full", "w") as full:
        p = subprocess.run([MXTRAIN_BIN] + args, stdout=full, stderr=subprocess.PIPE, text=True,
                           timeout=60)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 3 and len(errs) == 1 and "standard output" in errs[0], p.stderr
    # and why, as the kernel said it (ENOSPC: `--version` said only "write error")
    assert os.strerror(errno.ENOSPC) in errs[0], p.stderr
    assert mxtrain(args).rc == 0  # the control: to a pipe it is written, exit 0


def test_small_words_of_the_output(tmp_path, mxtrain):
    """A hunt found: `done: 1 steps`; the summary's token count written as a float
    ("tokens": 32.0); plan's header saying `tiny (0.000119104B parameters)`; `bench sgemm
    --device tpu` naming run.device, a key that command does not have; `mxtrain --set a=b train`
    listing the unexpected arguments in reverse ("a=b --set")."""
    out = tmp_path / "out"
    r = mxtrain(["train"] + set_args({"model.preset": "tiny", "data.format": "random",
                                      "train.steps": 1, "train.seq_len": 32,
                                      "train.micro_batch": 1, "run.sample_tokens": 0,
                                      "run.out_dir": out}), timeout=120)
    assert r.rc == 0, r
    done = [l for l in r.stderr.splitlines() if l.startswith("done: ")]
    assert done and done[0].startswith("done: 1 step, "), r.stderr
    summary = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert summary["summary"] and type(summary["tokens"]) is int and summary["tokens"] == 32
    r = mxtrain(["plan", "--set", "model.preset=tiny", "--gpu", "h100", "--gpus", "1"])
    assert r.rc == 0, r
    header = (r.stdout + r.stderr).splitlines()[0]
    assert "tiny (119.1k parameters)" in header, header
    assert_one_error(mxtrain(["bench", "sgemm", "--device", "tpu"]), "--device 'tpu'")
    assert "run.device" not in mxtrain(["bench", "sgemm", "--device", "tpu"]).stderr
    assert_one_error(mxtrain(["--set", "a=b", "train"]), "not expected: --set a=b ")


@pytest.mark.parametrize("value", [" 1e-3", "1e-3 ", "\t1e-3"])
def test_a_number_with_white_space_around_it_is_refused_at_either_end(mxtrain, value):
    """`--set "train.lr= 1e-3"` was taken (strtod skips leading white space) while a trailing
    space was refused: both are refused now, as for integers."""
    assert_one_error(mxtrain(["train", "--set", f"train.lr={value}"]), "train.lr=",
                     "expected a number")
    assert_one_error(mxtrain(["train", "--set", f"train.steps={value.replace('1e-3', '3')}"]),
                     "expected an integer")


def test_version_names_the_commit_it_was_built_from(mxtrain):
    """`mxtrain --version` said "A subcommand is required" (exit 2). It prints the commit the
    build came from (git HEAD at build time, "-dirty" with uncommitted changes), exit 0."""
    import re
    r = mxtrain(["--version"])
    assert r.rc == 0 and not r.stderr, r
    assert re.fullmatch(r"mxtrain, built from (commit [0-9a-f]{12}(-dirty)?|an unknown commit)\n",
                        r.stdout), r.stdout
