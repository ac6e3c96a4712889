"""Bad input gets exit code 2 and one `error:` line (the last stderr line) naming the problem; no
crash, and nothing written over what was there before."""
import os
import re
import struct

import numpy as np
import pytest

import hf_io
import llama_ref
from conftest import english_text, set_args, tiny_checkpoint, write_model, write_tokens_i32

CRASH_MARKERS = ("Traceback", "terminate called", "Segmentation fault", "Aborted", "what():",
                 "core dumped", "AddressSanitizer", "runtime error:")

BASE = {
    "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
    "model.num_attention_heads": 4, "model.num_key_value_heads": 2, "model.vocab_size": 256,
    "train.steps": 1, "train.micro_batch": 1, "train.seq_len": 16, "train.log_every": 1,
    "data.format": "text", "data.val_fraction": 0.0, "run.sample_tokens": 0,
}


def snapshot(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def check_error(r, keywords):
    assert r.rc == 2, r
    assert not any(m in r.stderr or m in r.stdout for m in CRASH_MARKERS), r
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines, r
    assert lines[-1].startswith("error:"), r
    assert sum(l.startswith("error:") for l in lines) == 1, r
    msg = lines[-1].lower()
    assert any(k.lower() in msg for k in keywords), (keywords, lines[-1])


@pytest.fixture
def env(tmp_path):
    """A valid training setup (text data, a fresh out_dir holding earlier good files)."""
    text = tmp_path / "corpus.txt"
    text.write_text(english_text(2000))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (out_dir / "keep.txt").write_text("earlier good data\n")
    base = dict(BASE)
    base["data.path"] = text
    base["run.out_dir"] = out_dir
    base["run.metrics"] = out_dir / "metrics.jsonl"
    base["checkpoint.dir"] = out_dir / "checkpoints"
    return tmp_path, out_dir, base


def test_base_config_is_valid(mxtrain, env):
    """The control: without the injected fault, the same setup trains (so the errors below are
    caused by the fault, not by the base)."""
    tmp, out_dir, base = env
    base["run.metrics"] = tmp / "control_metrics.jsonl"
    r = mxtrain(["train"] + set_args(base))
    assert r.rc == 0, r
    assert "error:" not in r.stderr, r


def _u16(path, values):
    np.asarray(values, dtype="<u2").tofile(path)
    return path


def _prepare(case, tmp):
    """Builds the files a case needs; returns (settings to add, extra argv, keywords of which the
    error line must name at least one)."""
    if case == "unknown_section":
        return {"bogus.thing": 1}, [], ["bogus"]
    if case == "unknown_key":
        return {"train.stepz": 3}, [], ["stepz"]
    if case == "wrong_type":
        return {"train.steps": "abc"}, [], ["steps", "abc"]
    if case == "negative_steps":
        return {"train.steps": -1}, [], ["steps"]
    if case == "zero_micro_batch":
        return {"train.micro_batch": 0}, [], ["micro_batch"]
    if case == "bad_format":
        return {"data.format": "parquet"}, [], ["format", "parquet"]
    if case == "bad_checkpointing":
        return {"memory.activation_checkpointing": "sometimes"}, [], ["activation_checkpointing",
                                                                       "sometimes"]
    if case == "heads_not_dividing_hidden":
        return {"model.num_attention_heads": 6}, [], ["num_attention_heads", "hidden_size", "heads"]
    if case == "kv_not_dividing_heads":
        return {"model.num_key_value_heads": 3}, [], ["num_key_value_heads", "kv"]
    if case == "missing_config_file":
        return {}, ["--config", str(tmp / "nope" / "missing.toml")], ["missing.toml"]
    if case == "malformed_toml":
        p = tmp / "broken.toml"
        p.write_text("[train\nsteps = = 3\n")
        return {}, ["--config", str(p)], ["broken.toml", "toml", "parse"]
    if case == "missing_data_file":
        return {"data.path": tmp / "nope.bin"}, [], ["nope.bin"]
    if case == "token_out_of_vocab":
        p = _u16(tmp / "big.u16", [1, 2, 3] * 50 + [300] + [4] * 50)
        return {"data.path": p, "data.format": "u16"}, [], ["300", "vocab"]
    if case == "truncated_u16":
        p = tmp / "odd.u16"
        p.write_bytes(b"\x01\x00" * 100 + b"\x02")
        return {"data.path": p, "data.format": "u16"}, [], ["odd.u16"]
    if case == "empty_data_file":
        p = tmp / "empty.u16"
        p.write_bytes(b"")
        return {"data.path": p, "data.format": "u16"}, [], ["empty.u16"]
    if case == "init_without_config_json":
        d = tmp / "noconfig"
        d.mkdir()
        cfg = llama_ref.make_shape(32, 64, 1, 4, 2, 256)
        hf_io.write_safetensors(d / "model.safetensors", llama_ref.random_params(cfg, 1))
        return {"init.from": d}, [], ["config.json"]
    if case == "init_malformed_safetensors":
        cfg = llama_ref.make_shape(32, 64, 1, 4, 2, 256)
        d = write_model(tmp / "badst", cfg, llama_ref.random_params(cfg, 1))
        raw = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + raw[8:200])
        return {"init.from": d}, [], ["model.safetensors", "safetensors"]
    if case == "init_with_a_model_key":  # the key was ignored silently
        cfg = llama_ref.make_shape(32, 64, 1, 4, 2, 256)
        d = write_model(tmp / "okmodel", cfg, llama_ref.random_params(cfg, 1))
        return {"init.from": d, "model.hidden_size": 64}, [], ["model.hidden_size", "init.from"]
    if case == "unknown_preset":
        return {"model.preset": "gpt5"}, [], ["gpt5"]
    if case == "unknown_flag":
        return {}, ["--bogus-flag"], ["bogus-flag"]
    # Sizes whose products overflow 64 bits: a grad_accum of 2^62 once gave "0 tokens/step" and
    # a step that never ended (ignoring SIGTERM, which is honoured at step boundaries).
    if case == "huge_grad_accum":
        return {"train.grad_accum": 2 ** 62}, [], ["grad_accum"]
    if case == "huge_micro_batch":
        return {"train.micro_batch": 2 ** 63 - 1}, [], ["micro_batch"]
    if case == "huge_steps":
        return {"train.steps": 2 ** 62}, [], ["steps"]
    if case == "zero_kv_heads":
        return {"model.num_key_value_heads": 0}, [], ["num_key_value_heads"]
    if case == "zero_head_dim":
        return {"model.head_dim": 0}, [], ["head_dim"]
    if case == "config_is_directory":
        return {}, ["--config", str(tmp)], ["directory"]
    if case == "data_is_fifo":  # open() waited for a writer forever
        fifo = tmp / "tokens.fifo"
        os.mkfifo(fifo)
        return {"data.path": fifo, "data.format": "u16"}, [], ["not a regular file"]
    if case == "checkpoint_dir_is_a_file":  # found only at the first save, after training
        f = tmp / "afile"
        f.write_text("data\n")
        return {"checkpoint.dir": f}, [], ["not a directory"]
    raise KeyError(case)


TRAIN_CASES = ["unknown_section", "unknown_key", "wrong_type", "negative_steps",
               "zero_micro_batch", "bad_format", "bad_checkpointing", "heads_not_dividing_hidden",
               "kv_not_dividing_heads", "missing_config_file", "malformed_toml",
               "missing_data_file", "token_out_of_vocab", "truncated_u16", "empty_data_file",
               "init_without_config_json", "init_malformed_safetensors", "unknown_preset",
               "unknown_flag", "huge_grad_accum", "huge_micro_batch", "huge_steps",
               "zero_kv_heads", "zero_head_dim", "config_is_directory", "data_is_fifo",
               "checkpoint_dir_is_a_file", "init_with_a_model_key"]


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_train_bad_input(mxtrain, env, case):
    tmp, out_dir, base = env
    settings, argv, keywords = _prepare(case, tmp)
    if "init.from" in settings:  # the model comes from the directory
        base = {k: v for k, v in base.items() if not k.startswith("model.")}
    base.update(settings)
    before = snapshot(out_dir)
    r = mxtrain(["train"] + argv + set_args(base), timeout=60)
    check_error(r, keywords)
    assert snapshot(out_dir) == before, "out_dir changed by a failed run"


# ---- debug grads, ckpt export-hf, generate ----

def _grads_setup(tmp):
    cfg = llama_ref.make_shape(32, 64, 1, 4, 2, 50)
    model = write_model(tmp / "model", cfg, llama_ref.random_params(cfg, 2))
    toks = tmp / "tokens.i32"
    write_tokens_i32(toks, np.random.default_rng(0).integers(0, 50, size=(2, 9)))
    out = tmp / "grads.safetensors"
    out.write_bytes(b"earlier good data")
    return cfg, model, toks, out


@pytest.mark.parametrize("case", ["missing_tokens", "token_out_of_vocab", "short_tokens",
                                  "malformed_safetensors", "missing_init", "bad_batch"])
def test_debug_grads_bad_input(mxtrain, tmp_path, case):
    cfg, model, toks, out = _grads_setup(tmp_path)
    batch, seq = 2, 8
    keywords = []
    if case == "missing_tokens":
        toks = tmp_path / "nothere.i32"
        keywords = ["nothere.i32"]
    elif case == "token_out_of_vocab":
        bad = np.zeros((2, 9), dtype=np.int64)
        bad[1, 4] = 50
        write_tokens_i32(toks, bad)
        keywords = ["50", "vocab"]
    elif case == "short_tokens":
        write_tokens_i32(toks, np.zeros(2 * 9 - 1, dtype=np.int64))
        keywords = ["tokens.i32", "tokens"]
    elif case == "malformed_safetensors":
        (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
        keywords = ["model.safetensors", "safetensors"]
    elif case == "missing_init":
        model = tmp_path / "nomodel"
        keywords = ["nomodel"]
    elif case == "bad_batch":
        batch = 0
        keywords = ["batch"]
    r = mxtrain(["debug", "grads", "--init", model, "--tokens", toks, "--batch", batch,
                 "--seq", seq, "--out", out], timeout=60)
    check_error(r, keywords)
    assert out.read_bytes() == b"earlier good data"


@pytest.mark.parametrize("target", ["tokens", "tokens_link", "weights"])
def test_debug_grads_will_not_write_over_its_inputs(mxtrain, tmp_path, target):
    cfg, model, toks, _ = _grads_setup(tmp_path)
    keep = {p: p.read_bytes() for p in [toks, model / "model.safetensors", model / "config.json"]}
    out = {"tokens": toks, "weights": model / "model.safetensors",
           "tokens_link": tmp_path / "link.i32"}[target]
    if target == "tokens_link":
        out.symlink_to(toks)
    r = mxtrain(["debug", "grads", "--init", model, "--tokens", toks, "--batch", 2, "--seq", 8,
                 "--out", out], timeout=60)
    check_error(r, ["--out"])
    assert {p: p.read_bytes() for p in keep} == keep


def test_debug_grads_huge_shape_is_named(mxtrain, tmp_path):
    cfg, model, toks, out = _grads_setup(tmp_path)
    r = mxtrain(["debug", "grads", "--init", model, "--tokens", toks, "--batch", 2000000000,
                 "--seq", 2000000000, "--out", out], timeout=60)
    check_error(r, ["--batch"])
    assert not re.search(r"-\d", r.stderr), r  # no wrapped-around (negative) size


@pytest.mark.parametrize("sub", ["quantize", "codec"])
def test_numerics_will_not_write_over_its_input(mxtrain, tmp_path, sub):
    src = tmp_path / "x.safetensors"
    hf_io.write_safetensors(src, {"a": np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)})
    before = src.read_bytes()
    fmt = "e4m3"
    r = mxtrain(["numerics", sub, "--format", fmt, "--in", src, "--out", tmp_path / "." / "x.safetensors"],
                timeout=60)
    check_error(r, ["--out"])
    assert src.read_bytes() == before


@pytest.mark.parametrize("where", ["under_a_file", "name_too_long"])
@pytest.mark.parametrize("tool", ["debug_grads", "numerics_quantize"])
def test_an_out_path_that_cannot_exist_is_bad_input(mxtrain, tmp_path, tool, where):
    """ENOTDIR / ENAMETOOLONG on --out are the flag's fault: exit 2, as train's run.metrics
    (core/output_dirs.h). They were exit 3, a storage failure."""
    if tool == "debug_grads":
        cfg, model, toks, _ = _grads_setup(tmp_path)
        args = ["debug", "grads", "--init", model, "--tokens", toks, "--batch", 2, "--seq", 8]
        a_file = toks
    else:
        a_file = tmp_path / "x.safetensors"
        hf_io.write_safetensors(a_file, {"a": np.linspace(-3, 3, 64, dtype=np.float32)
                                         .reshape(2, 32)})
        args = ["numerics", "quantize", "--format", "e4m3", "--in", a_file]
    out = a_file / "x.safetensors" if where == "under_a_file" else tmp_path / ("a" * 300)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    r = mxtrain(args + ["--out", out], timeout=60)
    check_error(r, ["--out" if where == "under_a_file" else "a" * 300])
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_out_name_that_fits_is_written_whatever_its_temporary(mxtrain, tmp_path):
    """A 250-character --out is a valid name (NAME_MAX is 255), but its temporary name
    (+ ".tmp.<pid>") is not: it was refused as too long. Written now, and nothing else left."""
    src = tmp_path / "x.safetensors"
    hf_io.write_safetensors(src, {"a": np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)})
    out = tmp_path / ("b" * 238 + ".safetensors")
    assert len(out.name) == 250
    r = mxtrain(["numerics", "quantize", "--format", "e4m3", "--in", src, "--out", out],
                timeout=60)
    assert r.rc == 0, r
    assert set(hf_io.read_safetensors(out)) == {"a.codes", "a.scales", "a.dequant"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, out.name])


def test_export_hf_into_a_path_through_a_file_is_bad_input(mxtrain, tmp_path):
    """export-hf's output directory under a regular file ("Not a directory") was exit 3, a
    storage failure; as the output argument's fault it is exit 2, the file untouched."""
    root = tiny_checkpoint(mxtrain, tmp_path / "run")
    a_file = tmp_path / "afile"
    a_file.write_text("keep")
    r = mxtrain(["ckpt", "export-hf", root, a_file / "sub"], timeout=60)
    check_error(r, ["afile"])
    assert a_file.read_text() == "keep"


def test_export_hf_missing_checkpoint(mxtrain, tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text('{"good": true}')
    r = mxtrain(["ckpt", "export-hf", tmp_path / "no_such_ckpt", out], timeout=60)
    check_error(r, ["no_such_ckpt"])
    assert snapshot(out) == {"config.json": b'{"good": true}'}


def test_generate_missing_model(mxtrain, tmp_path):
    r = mxtrain(["generate", "--model", tmp_path / "no_model", "--prompt", "hi",
                 "--max-tokens", 4, "--temperature", 1.0, "--top-k", 1, "--seed", 0], timeout=60)
    check_error(r, ["no_model"])


@pytest.mark.parametrize("args,keyword", [(["--temperature", "inf"], "--temperature"),
                                          (["--temperature", "nan"], "--temperature"),
                                          (["--seed", "-1"], "--seed")])
def test_generate_bad_options(mxtrain, tmp_path, args, keyword):
    r = mxtrain(["generate", "--model", tmp_path / "no_model", *args], timeout=60)
    check_error(r, [keyword])


def test_unknown_subcommand_is_named(mxtrain):
    r = mxtrain(["nosuch", "--flag"], timeout=60)
    check_error(r, ["nosuch"])
    assert "train" in r.stderr, r  # the known subcommands are listed


@pytest.mark.parametrize("args,keyword", [(["--seconds", "-1"], "--seconds"),
                                          (["--size", "8"], "--size")])
def test_bench_sgemm_bad_input(mxtrain, args, keyword):
    r = mxtrain(["bench", "sgemm", *args], timeout=60)
    check_error(r, [keyword])
