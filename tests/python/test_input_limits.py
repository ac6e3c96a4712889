"""Files and names from outside, at their limits: JSON nested past any real input, keys given
twice, NUL bytes, an output path that is a device or a FIFO, a 0-d tensor, an error message
holding a newline, and a checkpoint whose descriptions of itself disagree. Each case is what a
hunt found the binary doing wrong (a crash, a silently dropped tensor, a replaced device node, a
two-line error, an edited step that verified); the references are the safetensors format's
rules, the input's own bytes and shape, and the run's own files."""
import json
import os
import resource
import shutil
import struct
import subprocess
import time

import numpy as np
import pytest

import hf_io
from conftest import assert_one_error, english_text, error_lines, set_args
from test_checkpoint_resume import crc32c_ref


def raw_safetensors(path, header_bytes, data=b""):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        f.write(data)


def quantize(mxtrain, src, dst, fmt="e4m3"):
    return mxtrain(["numerics", "quantize", "--format", fmt, "--in", src, "--out", dst],
                   timeout=60)


# ---- safetensors headers -----------------------------------------------------------------

def test_deeply_nested_header_is_refused_not_a_crash(tmp_path, mxtrain):
    """A 200 KB header whose "shape" nests 100000 arrays: the error message's dump() of it
    recursed off the stack (SIGSEGV, exit 139). Now the parser refuses nesting past 64."""
    depth = 100000
    header = ('{"w":{"dtype":"F32","shape":' + "[" * depth + "]" * depth +
              ',"data_offsets":[0,4]}}').encode()
    src = tmp_path / "deep.safetensors"
    raw_safetensors(src, header, b"\0" * 4)
    r = quantize(mxtrain, src, tmp_path / "out.safetensors")
    assert_one_error(r, "deeper than 64 levels")
    assert len(error_lines(r)[0]) < 300  # the value is not quoted
    assert not (tmp_path / "out.safetensors").exists()


def test_tensor_named_twice_is_refused(tmp_path, mxtrain):
    """Two header entries named "w": JSON parsers keep the last, so the first tensor was
    dropped and exit 0; the safetensors library refuses such a file."""
    a = np.arange(4, dtype=np.float32)
    b = np.array([100, 200], dtype=np.float32)
    header = (b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
              b'"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}')
    src = tmp_path / "dup.safetensors"
    raw_safetensors(src, header, a.tobytes() + b.tobytes())
    r = quantize(mxtrain, src, tmp_path / "out.safetensors")
    assert_one_error(r, 'the key "w" twice')
    assert not (tmp_path / "out.safetensors").exists()


def test_header_with_a_nul_byte_is_refused(tmp_path, mxtrain):
    """The parser stopped at a NUL: what followed it was never read (here: garbage)."""
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}\0 not json {{{'
    src = tmp_path / "nul.safetensors"
    raw_safetensors(src, header, np.ones(1, np.float32).tobytes())
    r = quantize(mxtrain, src, tmp_path / "out.safetensors")
    assert_one_error(r, "NUL byte")


def test_zero_dimensional_tensor_keeps_its_shape(tmp_path, mxtrain):
    """numerics quantize writes x.dequant in x's shape (DESIGN.md): a 0-d tensor came back [1].
    The value is the 1-element tensor's (the same quantization of the same number)."""
    x = np.float32(3.3)
    scalar = tmp_path / "s.safetensors"
    raw_safetensors(scalar, b'{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}',
                    x.tobytes())
    one = tmp_path / "one.safetensors"
    hf_io.write_safetensors(one, {"s": np.array([x], np.float32)})
    for fmt in ("e4m3", "mxfp8", "nvfp4"):
        r = quantize(mxtrain, scalar, tmp_path / f"s_{fmt}.safetensors", fmt)
        assert r.rc == 0, r
        r = quantize(mxtrain, one, tmp_path / f"one_{fmt}.safetensors", fmt)
        assert r.rc == 0, r
        got = hf_io.read_safetensors(tmp_path / f"s_{fmt}.safetensors")
        ref = hf_io.read_safetensors(tmp_path / f"one_{fmt}.safetensors")
        assert got["s.dequant"].shape == () and got["s.codes"].shape == (), (fmt, got)
        assert got["s.dequant"].reshape(1).tobytes() == ref["s.dequant"].tobytes(), fmt
        assert got["s.codes"].reshape(1).tobytes() == ref["s.codes"].tobytes(), fmt


# ---- output paths that are not regular files --------------------------------------------

def test_output_onto_a_fifo_or_directory_is_refused_untouched(tmp_path, mxtrain):
    """The atomic write renamed its temporary file over whatever the path was: a FIFO (or, as
    root, `--out /dev/null`: the device node itself) became a regular file, exit 0."""
    src = tmp_path / "in.safetensors"
    hf_io.write_safetensors(src, {"w": np.ones((4, 4), np.float32)})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep").write_text("x")
    for target in (fifo, folder):
        r = quantize(mxtrain, src, target)
        assert_one_error(r, str(target), "not a regular file")
    assert fifo.is_fifo()
    assert [p.name for p in folder.iterdir()] == ["keep"]
    assert not [p for p in tmp_path.iterdir() if ".tmp." in p.name]
    if os.geteuid() == 0 and hasattr(os, "mknod"):  # a device node (root only): untouched
        import stat
        dev = tmp_path / "null_dev"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        r = quantize(mxtrain, src, dev)
        assert_one_error(r, "not a regular file")
        assert stat.S_ISCHR(os.lstat(dev).st_mode)


# ---- one line per error ------------------------------------------------------------------

def test_a_newline_in_a_value_stays_on_the_error_line(mxtrain):
    r = mxtrain(["train", "--set", "train.steps=3\n4"], timeout=60)
    assert r.rc == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r
    assert "train.steps=3\\n4" in lines[0] and "expected an integer" in lines[0], lines


# ---- checkpoints whose files disagree ----------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import run_mxtrain
    d = tmp_path_factory.mktemp("ckpt")
    corpus = d / "c.txt"
    corpus.write_text(english_text(4000))
    r = run_mxtrain(["train"] + set_args({
        "model.preset": "tiny", "train.steps": 2, "train.seq_len": 32, "train.micro_batch": 2,
        "data.path": corpus, "run.out_dir": d / "run", "run.sample_tokens": 0,
        "train.eval_every": 0}), threads=1)
    assert r.rc == 0, r
    return d / "run" / "checkpoints"


def rewrite(step, name, data):
    """Replaces a step's file and records its new size and CRC32C in the manifest, as a
    consistent edit would (so only the contents can give it away)."""
    (step / name).write_bytes(data)
    m = json.loads((step / "manifest.json").read_text())
    for f in m["files"]:
        if f["name"] == name:
            f["crc32c"], f["size"] = f"{crc32c_ref(data):08x}", len(data)
    (step / "manifest.json").write_text(json.dumps(m))


def test_verify_refuses_a_config_json_that_is_not_the_manifests_model(trained, tmp_path,
                                                                      mxtrain):
    """config.json (what Hugging Face tools read) and the manifest's model (what mxtrain reads)
    must describe one model: a consistent edit of either side verified, and export-hf then
    wrote the edited rope_theta."""
    for side in ("config.json", "manifest.json"):
        root = tmp_path / side
        shutil.copytree(trained, root)
        step = root / "step_00000002"
        if side == "config.json":
            cfg = json.loads((step / "config.json").read_text())
            cfg["rope_theta"] = 500000.0
            rewrite(step, "config.json", json.dumps(cfg).encode())
        else:
            m = json.loads((step / "manifest.json").read_text())
            m["model"]["rms_norm_eps"] = 1e-3
            (step / "manifest.json").write_text(json.dumps(m))
        r = mxtrain(["ckpt", "verify", step], timeout=60)
        assert_one_error(r, "config.json", "another model")
        r = mxtrain(["ckpt", "export-hf", root, tmp_path / f"out_{side}"], timeout=60)
        assert r.rc == 2, r
        assert not (tmp_path / f"out_{side}").exists()


@pytest.mark.parametrize("key,value", [("world_size", 8), ("sharding", "none")])
def test_verify_refuses_a_state_json_that_contradicts_the_manifest(trained, tmp_path, mxtrain,
                                                                  key, value):
    root = tmp_path / "ck"
    shutil.copytree(trained, root)
    step = root / "step_00000002"
    state = json.loads((step / "state.json").read_text())
    state[key] = value
    rewrite(step, "state.json", json.dumps(state).encode())
    r = mxtrain(["ckpt", "verify", step], timeout=60)
    assert_one_error(r, "state.json", key)


def test_a_small_manifest_cannot_make_verify_build_a_huge_one(trained, tmp_path):
    """The manifest's derived lists were rebuilt from its model and shard_size before any was
    compared: 15 KB naming 4096 layers and 200 shards (no shard list) took 29 s and 3.1 GB,
    and under a 1 GB address-space limit the binary aborted (std::bad_alloc in a destructor).
    The lists' lengths are now compared first: one error line, exit 2, within the limit."""
    import resource
    from conftest import MXTRAIN_BIN, require_binary
    require_binary()
    root = tmp_path / "ck"
    shutil.copytree(trained, root)
    step = root / "step_00000002"
    m = json.loads((step / "manifest.json").read_text())
    shards = 200
    m["model"]["num_hidden_layers"] = 4096
    m["shard_size"] = shards
    m["files"] = [f for f in m["files"] if f["name"] in ("config.json", "state.json")] + [
        {"name": f"rank_{r:05d}-of-{shards:05d}.safetensors", "size": 0, "crc32c": "00000000"}
        for r in range(shards)]
    m["units"] = [{"name": "x", "numel": 1}]
    del m["tensors"], m["shards"]
    (step / "manifest.json").write_text(json.dumps(m))
    assert (step / "manifest.json").stat().st_size < 20000

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    p = subprocess.run([MXTRAIN_BIN, "ckpt", "verify", str(step)], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    errs = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert p.returncode == 2 and len(errs) == 1, (p.returncode, p.stderr[-2000:])
    assert "'units' list does not match" in errs[0], errs


def test_verify_refuses_a_tensor_that_is_not_f32(trained, tmp_path, mxtrain):
    """A rank file whose header says I32 for an F32 tensor (same bytes, CRC refreshed) verified,
    so resume = auto took the step and failed on it instead of falling back."""
    root = tmp_path / "ck"
    shutil.copytree(trained, root)
    step = root / "step_00000002"
    (rank,) = [p for p in step.iterdir() if p.name.startswith("rank_")]
    data = rank.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = data[8:8 + n]
    i = header.index(b'"F32"')
    header = header[:i] + b'"I32"' + header[i + 5:]
    rewrite(step, rank.name, data[:8] + header + data[8 + n:])
    r = mxtrain(["ckpt", "verify", step], timeout=60)
    assert_one_error(r, rank.name, "I32, not F32")


def test_export_into_an_existing_file_is_bad_input(trained, tmp_path, mxtrain):
    target = tmp_path / "file.txt"
    target.write_text("keep")
    r = mxtrain(["ckpt", "export-hf", trained, target], timeout=60)
    assert_one_error(r, "not a directory")
    assert target.read_text() == "keep"


@pytest.mark.parametrize("args,word,known", [(["sagemaker", "serve"], "serve", "train"),
                                              (["ckpt", "lst"], "lst", "verify"),
                                              (["trian"], "trian", "generate")])
def test_unknown_subcommand_is_named_at_every_level(mxtrain, args, word, known):
    """`mxtrain sagemaker serve` (SageMaker's hosting command) said only "A subcommand is
    required"."""
    r = mxtrain(args, timeout=30)
    assert_one_error(r, f"'{word}'", known)


def test_deeply_nested_toml_is_refused_not_a_crash(tmp_path, mxtrain):
    """toml11 parses arrays and inline tables recursively: 100000 nested `[` (or `{a=`) in a
    config file crashed train with SIGSEGV. Brackets inside strings and comments do not count:
    a config holding 200 of them in each loads (and fails later, on its missing data file)."""
    deep = tmp_path / "deep.toml"
    deep.write_text("[train]\nx = " + "[" * 100000 + "]" * 100000 + "\n")
    tables = tmp_path / "tables.toml"
    tables.write_text("[train]\nx = " + "{a=" * 20000 + "1" + "}" * 20000 + "\n")
    # a dotted key or a table header of 60000 parts nests as deep (SIGSEGV, exit 139, too)
    dotted = tmp_path / "dotted.toml"
    dotted.write_text("[run]\n" + ".".join(["a"] * 60000) + " = 1\n")
    header = tmp_path / "header.toml"
    header.write_text("[" + ".".join(["a"] * 60000) + "]\n")
    # a multi-line string closed by four or five quotes ("""x"""" is x") was read as closed
    # at the first three, its last quote as an unterminated string hiding the line's brackets
    quotes = []
    for q in ('"', "'"):
        for extra in (1, 2):
            f = tmp_path / f"quotes{len(quotes)}.toml"
            f.write_text(f"a = [{q * 3}x{q * (3 + extra)}, " + "[" * 100000 + "]" * 100000 +
                         "]\n")
            quotes.append(f)
    for f in (deep, tables, dotted, header, *quotes):
        r = mxtrain(["train", "--config", f], timeout=60)
        assert_one_error(r, str(f), "deeper than 64 levels")
    b = "[" * 200
    ok = tmp_path / "ok.toml"
    ok.write_text(f'[model] # {b}\npreset = "tiny"\n[data]\npath = "/nonexistent/{b}"\n'
                  f"[run]\nout_dir = '''\n{tmp_path}/{b}'''\n")
    r = mxtrain(["train", "--config", ok], timeout=60)
    assert_one_error(r, "/nonexistent/")
    # dotted keys and floats of real configs stay well inside the limit
    fine = tmp_path / "fine.toml"
    fine.write_text('model.preset = "tiny"\n[train]\nlr = 6.0e-4\nsteps = 1\n'
                    f'[data]\npath = "/nonexistent/{"." * 200}"\n')
    r = mxtrain(["train", "--config", fine], timeout=60)
    assert_one_error(r, "/nonexistent/")
    # those closings are TOML: the strings end there and what follows counts as usual
    q3 = "'" * 3
    fine.write_text('[model]\npreset = """tiny"""\n[data]\npath = """/nonexistent/a""""\n'
                    f"[run]\nout_dir = {q3}{tmp_path}/[[{q3}''\n")
    r = mxtrain(["train", "--config", fine], timeout=60)
    assert_one_error(r, '/nonexistent/a"')


def test_config_that_is_not_utf8_is_refused(tmp_path, mxtrain):
    """toml11 read past its buffer on invalid UTF-8 inside a literal string (a heap over-read
    under AddressSanitizer; the binary said "is not valid TOML: basic_string::_M_create").
    TOML is UTF-8: the first bad byte is named; valid multi-byte text loads."""
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"[run]\nname = 'ok'\na = 'd\x9f'\n")
    r = mxtrain(["train", "--config", bad], timeout=60)
    assert_one_error(r, str(bad), "not valid UTF-8", "line 3", "byte 24")
    good = tmp_path / "good.toml"
    good.write_text('# Grüße, 日本語, 🙂\n[model]\npreset = "tiny"\n'
                    '[data]\npath = "/nonexistent/Grüße"\n', encoding="utf-8")
    r = mxtrain(["train", "--config", good], timeout=60)
    assert_one_error(r, "/nonexistent/Grüße")


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_data_file_changed_during_training_ends_the_run_cleanly(tmp_path, change):
    """The u16 file was memory-mapped and its ids checked once, at start-up: cut short under a
    running job it killed it with SIGBUS; rewritten with ids past vocab_size it fed them to the
    embedding lookup (out-of-bounds reads and writes, loss 83). Now each window is read and
    checked as the sampler asks for it."""
    from conftest import MXTRAIN_BIN, require_binary
    require_binary()
    rng = np.random.default_rng(0)
    data = tmp_path / "tokens.u16"
    data.write_bytes(rng.integers(0, 256, 400000, dtype=np.uint16).tobytes())
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen([MXTRAIN_BIN, "train"] + [str(a) for a in set_args({
        "model.preset": "tiny", "train.seq_len": 32, "train.micro_batch": 2,
        "train.steps": 1000000, "train.eval_every": 0, "run.sample_tokens": 0,
        "data.path": data, "run.out_dir": out, "checkpoint.every": 0})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (
                (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
            assert p.poll() is None, p.communicate()
            time.sleep(0.1)
        if change == "truncate":
            os.truncate(data, 4096)
            needle = "shrank during the run"
        else:
            with open(data, "r+b") as f:
                f.write(b"\xff\xff" * 400000)
            needle = "changed during the run"
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    errs = [l for l in err.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and len(errs) == 1, (p.returncode, err[-2000:])
    assert str(data) in errs[0] and needle in errs[0], errs


@pytest.mark.parametrize("key,value", [("model.intermediate_size", 2**62),
                                       ("model.num_hidden_layers", 10**12),
                                       ("model.hidden_size", 2**40)])
def test_model_sizes_past_any_model_are_refused_at_once(tmp_path, mxtrain, key, value):
    """intermediate_size 2^62 made the MLP's 4 x 2^62 elements wrap to 0 in int64: a
    "2.2K-parameter" model trained, checkpointed, then crashed (SIGSEGV) generating; 10^12
    layers built tables for seconds, growing memory, before any size check. "At once" is
    counted in the child's CPU seconds, not wall time: a CI machine busy with other work (a
    build, the README's training job) stretches the wall time of a refusal that takes 9 ms of
    CPU alone, while tables built for seconds are CPU seconds on any machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = mxtrain(["train", "--set", "model.preset=tiny", "--set", f"{key}={value}",
                 "--set", f"run.out_dir={tmp_path / 'run'}"], timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert_one_error(r, key, "largest supported")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 2.0, cpu
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_empty_or_directory_output_paths_are_bad_input(tmp_path, mxtrain, trained):
    src = tmp_path / "in.safetensors"
    hf_io.write_safetensors(src, {"w": np.ones((4, 4), np.float32)})
    r = mxtrain(["numerics", "quantize", "--format", "e4m3", "--in", src, "--out", ""])
    assert_one_error(r, "empty")
    r = mxtrain(["ckpt", "export-hf", trained, ""], timeout=60)
    assert_one_error(r, "empty")
    (tmp_path / "m").mkdir()
    r = mxtrain(["train", "--set", "model.preset=tiny", "--set", "data.format=random",
                 "--set", f"run.metrics={tmp_path / 'm'}", "--set", "train.steps=1"],
                timeout=60)
    assert_one_error(r, "run.metrics", "is a directory")


def test_a_nul_in_safetensors_metadata_is_json_like_any_other(tmp_path, mxtrain):
    """A "\\u0000" inside a header's metadata string is valid JSON, which nothing reads as a
    path: a file with one is read (a check against NULs in every JSON string refused it)."""
    src = tmp_path / "m.safetensors"
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    header = json.dumps({"__metadata__": {"note": "a\u0000b"},
                         "x": {"dtype": "F32", "shape": [2, 32], "data_offsets": [0, 256]}})
    assert "\\u0000" in header
    raw_safetensors(src, header.encode(), x.tobytes())
    r = quantize(mxtrain, src, tmp_path / "q.safetensors")
    assert r.rc == 0, r


def test_escaped_nul_in_a_config_value_is_shown_not_cut(tmp_path, mxtrain):
    """A message carrying the value "si\\u0000lu" stopped at the NUL ('si), losing the rest."""
    cfg = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 256, "hidden_act": "si\u0000lu"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = mxtrain(["generate", "--model", tmp_path, "--prompt", "hi"], timeout=60)
    assert_one_error(r, "hidden_act", "si\\u0000lu", "only 'silu'")


@pytest.mark.parametrize("key", ["train.beta1", "train.beta2"])
def test_a_beta_that_rounds_to_one_in_float32_is_refused(tmp_path, mxtrain, key):
    """0.99999999 passed the [0, 1) check, then the fp32 optimizer rounded it to 1.0f: bias
    correction 1 - 1^t = 0, update 0 / 0, 'loss is -nan at step 2'. The largest float32 below 1
    (1 - 2^-24) still trains."""
    base = {"model.preset": "tiny", "data.format": "random", "train.steps": 3,
            "train.seq_len": 16, "train.micro_batch": 2, "train.eval_every": 0,
            "run.sample_tokens": 0}
    below_one = float(np.nextafter(np.float32(1), np.float32(0)))
    assert np.float32(0.99999999) == 1 and below_one < 1
    r = mxtrain(["train"] + set_args(dict(base, **{key: 0.99999999,
                                                   "run.out_dir": tmp_path / "a"})))
    assert_one_error(r, key, "float32", "got 0.99999999")
    assert "step 1/" not in r.stderr
    r = mxtrain(["train"] + set_args(dict(base, **{key: repr(below_one),
                                                   "run.out_dir": tmp_path / "b"})))
    assert r.rc == 0 and "nan" not in r.stderr.lower(), r


def test_the_start_up_line_names_a_data_path_with_a_newline_on_one_line(tmp_path, mxtrain):
    """A data file whose name holds a newline split the start-up line in two; an output
    directory whose name holds one split the closing line (its checkpoint and metrics paths)
    and the resume lines, and an escape byte in it reached the terminal."""
    data = tmp_path / "a\nb.txt"
    data.write_text(english_text(2000))
    out = tmp_path / "o\nut\x1b[2J"
    run = {"model.preset": "tiny", "data.path": data, "train.steps": 1, "train.seq_len": 16,
           "run.sample_tokens": 0, "run.out_dir": out, "checkpoint.every": 1}
    r = mxtrain(["train"] + set_args(run))
    assert r.rc == 0, r
    start = [l for l in r.stderr.splitlines() if l.startswith("mxtrain: ")]
    assert len(start) == 1 and f"data {tmp_path}/a\\nb.txt (" in start[0], r.stderr
    done = [l for l in r.stderr.splitlines() if l.startswith("done: ")]
    assert len(done) == 1 and "o\\nut\\x1b[2J/metrics.jsonl" in done[0], r.stderr
    r = mxtrain(["train"] + set_args(dict(run, **{"train.steps": 2, "train.seed": 9})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    for r_ in (r,):
        assert "\x1b" not in r_.stderr, r_.stderr
        assert not [l for l in r_.stderr.splitlines() if l.startswith(("b.txt", "ut"))], r_.stderr


@pytest.mark.parametrize("key,value,says", [
    ("train.eps", "1e-50", "train.eps must be positive and finite as a float32"),
    ("train.lr", "1e39", "train.lr must be positive and finite as a float32"),
    ("train.lr", "1e-320", "train.lr must be positive and finite as a float32"),
    ("train.weight_decay", "1e39", "train.weight_decay must be >= 0 and finite as a float32"),
    ("train.lr", "1e400", "--set train.lr=1e400: expected a finite number"),
    ("run.threads", "4294967298", "run.threads must be in [0, 4096]"),
    ("run.name", "..", "run.name must be a non-empty name without '/', not . or .."),
    ("run.name", ".", "run.name must be a non-empty name without '/', not . or .."),
])
def test_values_the_fp32_optimizer_or_the_runtime_cannot_take_are_refused(tmp_path, mxtrain,
                                                                         key, value, says):
    """A hunt found these accepted: eps below float32's smallest subnormal became 0 (0 / 0 at
    step 2, reported as divergence), lr or weight decay 1e39 became inf; run.threads was cut to
    an int (2^32 + 2 ran 2 threads); run.name ".." wrote the run beside runs/; a subnormal
    "--set train.lr=1e-320" was called "expected a number"."""
    monkey_cwd = tmp_path / "cwd"
    monkey_cwd.mkdir()
    r = mxtrain(["train", "--set", "model.preset=tiny", "--set", "data.format=random",
                 "--set", "train.steps=2", "--set", f"{key}={value}"], cwd=monkey_cwd)
    assert_one_error(r, says)
    assert not any(monkey_cwd.iterdir())  # nothing written


def test_empty_numbers_and_out_directories_on_the_command_line(tmp_path, mxtrain, trained):
    """An empty argument (an unset shell variable) was read as 0 for numeric options
    (`--top-k ""` sampled the whole vocabulary); a 20-digit unsigned --seed was clamped; an
    --out under a directory not made yet failed after the work as a storage failure (exit 3);
    `--block ""` passed with a format that has no blocks."""
    src = tmp_path / "x.safetensors"
    x = np.arange(64, dtype=np.float32).reshape(2, 32)
    header = json.dumps({"x": {"dtype": "F32", "shape": [2, 32], "data_offsets": [0, 256]}})
    raw_safetensors(src, header.encode(), x.tobytes())
    step = trained / "step_00000002"
    for args, says in [
        (["generate", "--model", step, "--prompt-ids", "1 2", "--top-k", ""], "--top-k: an empty value"),
        (["generate", "--model", step, "--prompt-ids", "1 2", "--temperature", ""], "--temperature: an empty value"),
        (["bench", "fma", "--seconds", ""], "--seconds: an empty value"),
        (["numerics", "quantize", "--format", "e4m3", "--in", src, "--out", tmp_path / "q.st",
          "--margin", ""], "--margin: an empty value"),
        (["numerics", "quantize", "--format", "e4m3", "--stochastic", "--in", src, "--out",
          tmp_path / "q.st", "--seed", "99999999999999999999"], "out of range for a 64-bit unsigned"),
        (["numerics", "quantize", "--format", "e4m3", "--in", src, "--out", tmp_path / "q.st",
          "--block", ""], "--block does not apply to --format e4m3"),
        (["numerics", "quantize", "--format", "mxfp8", "--in", src, "--out", tmp_path / "q.st",
          "--block", ""], "--block for mxfp8 must be 1x32"),
    ]:
        assert_one_error(mxtrain(args), says)
    assert not (tmp_path / "q.st").exists()
    # --out under directories that do not exist yet: made, as export-hf makes its own
    out = tmp_path / "new" / "sub" / "q.safetensors"
    r = mxtrain(["numerics", "quantize", "--format", "e4m3", "--in", src, "--out", out])
    assert r.rc == 0 and out.is_file(), r
    r = mxtrain(["numerics", "codec", "--format", "bf16", "--in", src, "--out",
                 tmp_path / "new2" / "c.safetensors"])
    assert r.rc == 0 and (tmp_path / "new2" / "c.safetensors").is_file(), r
    # a path ending in '/' names a directory: refused, and nothing made
    r = mxtrain(["numerics", "quantize", "--format", "e4m3", "--in", src, "--out",
                 str(tmp_path / "nd") + "/"])
    assert r.rc == 2 and len(error_lines(r)) == 1 and not (tmp_path / "nd").exists(), r


def test_text_data_larger_than_half_the_memory_is_refused(tmp_path, mxtrain):
    """Text data is read into memory whole: a 1 TB (sparse) .txt said "out of memory" and
    advised a smaller micro_batch. Now a text file past half the machine's memory is refused
    by name, with the way out (token shards stay on disk). The file here is sparse, as large
    as the whole memory."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(ram + 1)
    r = mxtrain(["train", "--set", "model.preset=tiny", "--set", f"data.path={big}",
                 "--set", "train.steps=1", "--set", f"run.out_dir={tmp_path / 'o'}"])
    # (or the container's limit, where a cgroup's is lower)
    assert_one_error(r, str(big), "more than half this", "convert it to u16 / u32 token shards")


def test_the_text_limit_counts_validation_text_and_the_ranks_on_a_host(tmp_path, mxtrain):
    """The limit held per dataset and per process: training text and data.val_path text each
    passed alone while together past it, and 8 ranks on one host each held a copy under a
    limit meant for one. MXTRAIN_TEST_MEMORY_BYTES stands for the memory (2 MiB: 1 MiB of text)."""
    from conftest import MXTRAIN_BIN
    text = ("the quick brown fox jumps over the lazy dog. " * 15000)[:600_000]
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "v.txt").write_text(text)
    env = {"MXTRAIN_TEST_MEMORY_BYTES": str(2 << 20)}
    base = ["train", "--set", "model.preset=tiny", "--set", f"data.path={tmp_path / 'a.txt'}",
            "--set", "train.steps=1", "--set", "train.seq_len=16", "--set", "run.sample_tokens=0",
            "--set", "train.eval_every=0"]
    r = mxtrain(base + ["--set", f"run.out_dir={tmp_path / 'alone'}"], env=env)
    assert r.rc == 0, r
    r = mxtrain(base + ["--set", f"data.val_path={tmp_path / 'v.txt'}",
                        "--set", f"run.out_dir={tmp_path / 'both'}"], env=env)
    assert_one_error(r, str(tmp_path / "v.txt"), "1.1 MiB of text data (training and validation "
                     "data together)", "more than half MXTRAIN_TEST_MEMORY_BYTES (2.0 MiB)")
    assert not (tmp_path / "both").exists()
    # two ranks on this host: 600 kB each, 1.2 MB on the host, past 1 MiB
    flags = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()
    p = subprocess.run(["mpirun", "-np", "2", *flags, "-x", "MXTRAIN_TEST_MEMORY_BYTES",
                        MXTRAIN_BIN, *base, "--set", f"run.out_dir={tmp_path / 'two'}"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, **env, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    assert p.returncode == 2, p.stderr
    assert "in each of the 2 processes on this host" in p.stderr, p.stderr


def test_the_sample_says_what_it_cannot_show(tmp_path, mxtrain):
    """The end-of-run sample dropped ids >= 256 (a model with a larger vocabulary than the
    byte-level tokenizer's) without a word, and skipped the whole sample for a vocabulary
    under 256; `generate` said so, the trainer did not."""
    base = ["train", "--set", "model.preset=tiny", "--set", "data.format=random",
            "--set", "train.steps=1", "--set", "train.seq_len=16", "--set", "run.sample_tokens=20"]
    r = mxtrain(base + ["--set", "model.vocab_size=100000", "--set", f"run.out_dir={tmp_path / 'a'}"])
    assert r.rc == 0, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning: sample:")]
    assert len(warns) == 1 and "of the 20 generated tokens have ids >= 256" in warns[0], r.stderr
    r = mxtrain(base + ["--set", "model.vocab_size=200", "--set", f"run.out_dir={tmp_path / 'b'}"])
    assert r.rc == 0 and "no sample: the model's vocabulary (200) is smaller" in r.stderr, r



@pytest.mark.parametrize("line,key", [
    ("[train]\nwarmup_steps = 99999999999999999999", "train.warmup_steps"),
    ("[train]\nsteps = 99999999999999999999", "train.steps"),
    ("[train]\nseed = -9223372036854775809", "train.seed"),
    ("[train]\nseed = 0x1_0000_0000_0000_0000", "train.seed"),
    ("[train]\nlr = 1e400", "train.lr"),
    ("[train]\ngrad_clip = 1e400", "train.grad_clip"),
    ("[train]\ngrad_clip = -1_000e400", "train.grad_clip"),
    ("[train]\ngrad_clip = inf", "train.grad_clip"),
    ("[model]\nrope_theta = 1e400", "model.rope_theta"),
])
def test_toml_numbers_that_do_not_fit_are_refused_not_clamped(tmp_path, mxtrain, line, key):
    """TOML's integers are 64-bit and "a value that cannot be represented losslessly" is an
    error (toml.io, v1.0.0); a float too large for a double is not a number either. A hunt found
    them clamped: warmup_steps = 10^20 trained with a warmup of 2^63 - 1, lr = 1e400 was read as
    1.79769e+308, grad_clip = 1e400 (or inf) was accepted. `--set` already refused all these."""
    cfg = tmp_path / "run.toml"
    cfg.write_text('[data]\nformat = "random"\n' + line + "\n")
    out = tmp_path / "out"
    r = mxtrain(["train", "--config", cfg, "--set", "model.preset=tiny",
                 "--set", "train.seq_len=32", "--set", f"run.out_dir={out}"], timeout=60)
    assert_one_error(r, key, str(cfg))
    assert not out.exists()


def test_toml_numbers_at_the_limits_still_load(tmp_path, mxtrain):
    """The control: the extreme values that do fit (and underscores, hex, a subnormal) load;
    the run fails later on its missing data file, not on the numbers."""
    cfg = tmp_path / "ok.toml"
    cfg.write_text("[train]\nseed = -9223372036854775808\nwarmup_steps = 9_223_372_036_854_775_807"
                   "\ngrad_clip = 1.7976931348623157e308\nweight_decay = 4.9e-324\n"
                   "eval_every = 0x7fff_ffff_ffff_ffff\n"
                   "[data]\npath = '/nonexistent/data.bin'\n")
    r = mxtrain(["train", "--config", cfg, "--set", f"run.out_dir={tmp_path / 'out'}"],
                timeout=60)
    assert_one_error(r, "/nonexistent/data.bin")


@pytest.mark.parametrize("key,value", [("model.rms_norm_eps", "1e300"),
                                       ("model.rms_norm_eps", "1e39"),
                                       ("model.rms_norm_eps", "1e-50"),
                                       ("model.rope_theta", "1e39")])
def test_model_floats_must_be_finite_and_positive_as_float32(tmp_path, mxtrain, key, value):
    """The model computes in float32: rms_norm_eps = 1e300 (or 1e39) is inf there, every
    normalized activation 0, and the run trained to exit 0 with its loss stuck at ln 256 and a
    grad_norm of 0. Refused as train.eps already is, at start-up."""
    r = mxtrain(["train", "--set", "model.preset=tiny", "--set", "data.format=random",
                 "--set", f"{key}={value}", "--set", f"run.out_dir={tmp_path / 'out'}"],
                timeout=60)
    assert_one_error(r, key, "finite as a float32")
    assert not (tmp_path / "out").exists()
    # and the file form, where `inf` is a TOML float
    cfg = tmp_path / "m.toml"
    cfg.write_text(f"[model]\n{key.split('.')[1]} = inf\n")
    r = mxtrain(["train", "--config", cfg, "--set", "model.preset=tiny",
                 "--set", "data.format=random", "--set", f"run.out_dir={tmp_path / 'out'}"],
                timeout=60)
    assert_one_error(r, key)
    assert not (tmp_path / "out").exists()
