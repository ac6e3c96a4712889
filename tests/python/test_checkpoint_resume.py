"""Checkpoints are verifiable and resume is exact under SIGKILL.

The manifest (manifest.json, written last) is the commit: it lists every file's size and
CRC32C. A run killed at a random moment (with checkpoint.every=1 the kill often lands while a
checkpoint is being written) and resumed must end with weights bit-identical to an uninterrupted
run; a corrupt newest checkpoint is skipped with a warning; `ckpt verify` catches a flipped byte
and a truncated file; a manifest naming '../x' is rejected."""
import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from conftest import MXTRAIN_BIN, english_text, read_metrics, set_args

STEPS = 40


def run1(args, **kw):
    """One thread: the tiny model gains nothing from more, and a loaded machine loses a lot."""
    from conftest import run_mxtrain
    return run_mxtrain(args, threads=1, **kw)


def crc32c_ref(data: bytes) -> int:
    """Bytewise reference CRC32C (reflected Castagnoli 0x82F63B78), independent of the C++ one."""
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def test_crc32c_reference_is_right():
    assert crc32c_ref(b"123456789") == 0xE3069283
    assert crc32c_ref(bytes(32)) == 0x8A9136AA
    assert crc32c_ref(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_ref(bytes(range(32))) == 0x46DD794E


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The corpus, the settings, and one uninterrupted 40-step run (the reference)."""
    from conftest import require_binary, run_mxtrain
    require_binary()
    tmp = tmp_path_factory.mktemp("ckres")
    corpus = tmp / "english.txt"
    corpus.write_text(english_text(6000))
    common = {
        "model.preset": "tiny", "train.micro_batch": 2, "train.seq_len": 32,
        # min_lr == lr: the schedule does not depend on train.steps, so 20 + 20 steps equal 40.
        "train.lr": 2e-3, "train.min_lr": 2e-3, "train.warmup_steps": 2, "train.seed": 11,
        "train.log_every": 1, "train.grad_clip": 1.0, "train.weight_decay": 0.1,
        "data.path": corpus, "data.format": "text", "data.shuffle": True,
        "data.val_fraction": 0.0, "run.sample_tokens": 0, "checkpoint.keep": 0,
    }
    ref = dict(common, **{"train.steps": STEPS, "run.out_dir": tmp / "ref",
                          "checkpoint.every": 10, "checkpoint.resume": "none"})
    r = run1(["train"] + set_args(ref))
    assert r.rc == 0, r
    ref_root = tmp / "ref" / "checkpoints"
    # The 20-step first half, shared by the trials below.
    half = dict(common, **{"train.steps": 20, "run.out_dir": tmp / "half",
                           "checkpoint.every": 10, "checkpoint.resume": "none"})
    r = run1(["train"] + set_args(half))
    assert r.rc == 0, r
    return dict(tmp=tmp, common=common, ref_root=ref_root, half_root=tmp / "half" / "checkpoints")


RANK_FILE = "rank_00000-of-00001.safetensors"


def final_files(root):
    """The step-40 rank file (master weights and both AdamW moments) and the state."""
    d = root / f"step_{STEPS:08d}"
    return (d / RANK_FILE).read_bytes(), json.loads((d / "state.json").read_text())["step"]


def test_manifest_matches_an_independent_crc32c(setup):
    step = setup["ref_root"] / "step_00000040"
    m = json.loads((step / "manifest.json").read_text())
    assert m["format_version"] == 2 and m["step"] == 40 and m["world_size"] == 1
    assert m["shard_size"] == 1
    assert m["model"]["hidden_size"] == 64 and m["model"]["num_hidden_layers"] == 2
    names = {f["name"] for f in m["files"]}
    assert names == {RANK_FILE, "config.json", "state.json"}
    for f in m["files"]:
        data = (step / f["name"]).read_bytes()
        assert f["size"] == len(data), f
        assert int(f["crc32c"], 16) == crc32c_ref(data), f
    units = {u["name"]: u for u in m["units"]}
    shapes = {t["name"]: t["shape"] for u in m["units"] for t in u["tensors"]}
    assert shapes["model.embed_tokens.weight"] == [256, 64]
    assert shapes["model.layers.1.mlp.up_proj.weight"] == [160, 64]
    # One shard: its slice of every unit is the whole unit.
    (shard,) = m["shards"]
    assert shard["file"] == RANK_FILE
    for sl in shard["slices"]:
        assert sl["begin"] == 0 and sl["end"] == m["units"][sl["unit"]]["numel"]
    # A block: 2 norms of 64, q/o 64x64, k/v 32x64 (2 KV heads of 16), gate/up/down 160x64.
    assert units["block.1"]["numel"] == 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64


def test_rank_file_holds_the_exported_weights(setup, tmp_path, mxtrain):
    """The flat master shard, cut at the manifest's offsets, is the exported HF model."""
    import numpy as np
    import hf_io
    step = setup["ref_root"] / "step_00000040"
    m = json.loads((step / "manifest.json").read_text())
    r = run1(["ckpt", "export-hf", step, tmp_path / "hf"])
    assert r.rc == 0, r
    exported = hf_io.read_safetensors(str(tmp_path / "hf" / "model.safetensors"))
    shard = hf_io.read_safetensors(str(step / RANK_FILE))
    for u in m["units"]:
        flat = shard["master." + u["name"]]
        assert flat.shape == (u["numel"],)
        for t in u["tensors"]:
            n = int(np.prod(t["shape"]))
            piece = flat[t["offset"]:t["offset"] + n].reshape(t["shape"])
            assert np.array_equal(piece, exported[t["name"]]), t["name"]
        assert ("exp_avg." + u["name"]) in shard and ("exp_avg_sq." + u["name"]) in shard


def test_exact_resume_after_sigkill(setup, tmp_path):
    """20 steps, then runs to 40 with checkpoint.every=1 killed by SIGKILL after random delays,
    resumed until done: step 40's weights and moments equal the uninterrupted run's, bit for bit."""
    from conftest import run_mxtrain
    want = final_files(setup["ref_root"])
    seed = int(os.environ.get("MXTRAIN_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # as run1 does: the same threads as the reference
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    kills, kills_mid_write = 0, 0
    # Kill times are drawn relative to how long resuming from step 20 to 40 takes on this
    # machine right now, so a fast (idle) machine cannot finish every run before its kill.
    calib = tmp_path / "calibrate"
    shutil.copytree(setup["half_root"], calib)
    t_cal = time.monotonic()
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": STEPS, "run.out_dir": tmp_path / "run_calibrate",
        "checkpoint.dir": calib, "checkpoint.every": 1, "checkpoint.resume": "auto"})))
    assert r.rc == 0, r
    full_run_s = time.monotonic() - t_cal
    for trial in range(3):
        root = tmp_path / f"trial{trial}"
        shutil.copytree(setup["half_root"], root)
        args = ["train"] + set_args(dict(setup["common"], **{
            "train.steps": STEPS, "run.out_dir": tmp_path / f"run{trial}",
            "checkpoint.dir": root, "checkpoint.every": 1, "checkpoint.resume": "auto"}))
        # Kill, resume, kill again...: each attempt resumes from what the last one committed.
        for kill_round in range(3):
            t0 = time.monotonic()
            p = subprocess.Popen([MXTRAIN_BIN] + [str(a) for a in args], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            delay = rng.uniform(0.05, 0.85) * full_run_s
            try:
                p.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
            if p.returncode != -signal.SIGKILL:
                # Finished before the kill (rc checked by the run below; the rounds after it
                # would find the run complete). A first round did the calibration's work
                # faster than it (a busy machine then, idle now: CI once drew no kill in any
                # trial): later trials draw their kills against this run's time instead.
                if kill_round == 0:
                    full_run_s = min(full_run_s, time.monotonic() - t0)
                break
            kills += 1
            if any(n.name.startswith(".step_") for n in root.iterdir()):
                kills_mid_write += 1
            # Whatever the kill left, every committed step verifies.
            v = run1(["ckpt", "verify", root])
            assert v.rc == 0, (seed, trial, kill_round, time.monotonic() - t0, v)
        r = run1(args)
        assert r.rc == 0, (seed, trial, r)
        got = final_files(root)
        assert got[0] == want[0], f"weights or moments differ (seed {seed}, trial {trial})"
        assert got[1] == want[1]
    print(f"kill seed {seed}: {kills} kills, {kills_mid_write} left a partial checkpoint")
    assert kills >= 1, f"no run was killed (seed {seed}): the test proved nothing"


def flip_byte(path, offset=-100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_bf16_export_says_bfloat16_and_rounds_to_nearest_even(setup, tmp_path):
    """--dtype bf16: every tensor BF16, each value the F32 export rounded to nearest even
    (ml_dtypes), and config.json's torch_dtype "bfloat16" (it said "float32")."""
    import struct
    import ml_dtypes
    import numpy as np
    import hf_io
    step = setup["ref_root"] / "step_00000040"
    for d in ("f32", "bf16"):
        r = run1(["ckpt", "export-hf", step, tmp_path / d, "--dtype", d])
        assert r.rc == 0, r
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["torch_dtype"] == "float32"
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    f32 = hf_io.read_safetensors(str(tmp_path / "f32" / "model.safetensors"))
    raw = (tmp_path / "bf16" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    assert set(header) == set(f32)
    for name, e in header.items():
        assert e["dtype"] == "BF16", name
        b, t = e["data_offsets"]
        got = np.frombuffer(raw[8 + n + b:8 + n + t], dtype="<u2")
        want = f32[name].astype(ml_dtypes.bfloat16).view(np.uint16).reshape(-1)
        assert np.array_equal(got, want), name
    r = run1(["ckpt", "export-hf", step, tmp_path / "x", "--dtype", "fp32"])
    assert r.rc == 2 and "(got fp32)" in r.stderr, r  # the value as given


def test_rolling_back_into_a_directory_with_newer_steps_is_refused(setup, tmp_path):
    """Resuming from step 20 while the run's own checkpoint directory holds step 40: the new
    steps would mix with the old run's (checkpoint.keep = 1 deleted the new step 25 and kept the
    old 40, exit 0; resume = auto would later pick 40). Refused, nothing touched. A fresh start
    (resume = none) into such a directory is allowed, with a warning."""
    run_dir = tmp_path / "ref"
    shutil.copytree(setup["tmp"] / "ref", run_dir)
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": 25, "run.out_dir": run_dir, "checkpoint.keep": 1,
        "checkpoint.resume": run_dir / "checkpoints" / "step_00000020"})))
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.rc == 2 and len(err) == 1 and "step_00000040" in err[0], r
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": 2, "run.out_dir": run_dir, "run.metrics": tmp_path / "m.jsonl",
        "checkpoint.resume": "none"})))
    assert r.rc == 0, r
    assert any(l.startswith("warning:") and "step_00000040" in l
               for l in r.stderr.splitlines()), r


def test_resume_with_a_different_rope_theta_is_refused(setup, tmp_path):
    run_dir = tmp_path / "half"
    shutil.copytree(setup["tmp"] / "half", run_dir)
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": 30, "run.out_dir": run_dir, "model.rope_theta": 500.0,
        "checkpoint.resume": "auto"})))
    assert r.rc == 2 and "different model" in r.stderr, r


def test_a_finished_run_started_again_changes_nothing(setup, tmp_path):
    """The same command again after the run finished (a retried SageMaker job does this): exit
    0, nothing trained, and no second summary of zero steps (final loss NaN, 0 tok/s) appended
    after the real one."""
    run_dir = tmp_path / "half"
    shutil.copytree(setup["tmp"] / "half", run_dir)
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": 20, "run.out_dir": run_dir, "checkpoint.every": 10,
        "checkpoint.resume": "auto"})))
    assert r.rc == 0, r
    assert "already complete" in r.stderr, r
    after = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_corrupt_newest_is_skipped(setup, tmp_path, mxtrain):
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    flip_byte(root / "step_00000020" / RANK_FILE)
    args = ["train"] + set_args(dict(setup["common"], **{
        "train.steps": STEPS, "run.out_dir": tmp_path / "run", "run.metrics": tmp_path / "m.jsonl",
        "checkpoint.dir": root, "checkpoint.every": 10, "checkpoint.resume": "auto"}))
    r = run1(args)
    assert r.rc == 0, r
    warnings = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert any("step_00000020" in l and RANK_FILE in l for l in warnings), r
    steps, _ = read_metrics(tmp_path / "m.jsonl")
    assert steps[0]["step"] == 11, steps[0]  # resumed from step 10, the previous one
    assert final_files(root) == final_files(setup["ref_root"])


def test_explicit_checkpoint_that_does_not_verify_is_an_error(setup, tmp_path, mxtrain):
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    flip_byte(root / "step_00000020" / RANK_FILE)
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": STEPS, "run.out_dir": tmp_path / "run",
        "checkpoint.resume": root / "step_00000020"})))
    assert r.rc == 2, r
    assert r.stderr.count("error:") == 1 and RANK_FILE in r.stderr, r
    r = run1(["ckpt", "export-hf", root / "step_00000020", tmp_path / "out"])
    assert r.rc == 2 and RANK_FILE in r.stderr, r
    assert not (tmp_path / "out").exists()


def test_verify_catches_flipped_byte_and_truncation(setup, tmp_path, mxtrain):
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    r = run1(["ckpt", "verify", root / "step_00000020"])
    assert r.rc == 0 and "OK" in r.stdout, r
    r = run1(["ckpt", "ls", root, "--verify"])
    assert r.rc == 0 and r.stdout.count(" yes ") == 2, r

    flip_byte(root / "step_00000020" / RANK_FILE, offset=-5)
    r = run1(["ckpt", "verify", root / "step_00000020"])
    assert r.rc == 2, r
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and RANK_FILE in err[0] and "CRC32C" in err[0], r

    p = root / "step_00000010" / RANK_FILE
    p.write_bytes(p.read_bytes()[:-1000])
    r = run1(["ckpt", "verify", root / "step_00000010"])
    assert r.rc == 2, r
    assert RANK_FILE in r.stderr and "size" in r.stderr, r
    r = run1(["ckpt", "verify", root])  # the root: every step, both bad
    assert r.rc == 2 and r.stderr.count("error:") == 2, r
    r = run1(["ckpt", "ls", root, "--verify"])
    assert r.rc == 0 and r.stdout.count(" NO ") == 2, r

    # A header corrupted consistently with the manifest still fails: the safetensors must parse.
    step = root / "step_00000020"
    data = bytearray((step / RANK_FILE).read_bytes())
    data[8:9] = b"#"  # the first byte of the JSON header
    (step / RANK_FILE).write_bytes(bytes(data))
    m = json.loads((step / "manifest.json").read_text())
    for f in m["files"]:
        if f["name"] == RANK_FILE:
            f["crc32c"] = f"{crc32c_ref(bytes(data)):08x}"
    (step / "manifest.json").write_text(json.dumps(m))
    r = run1(["ckpt", "verify", step])
    assert r.rc == 2 and RANK_FILE in r.stderr and "parse" in r.stderr, r


@pytest.mark.parametrize("bad_name", ["../x", "sub/state.json", ".."])
def test_manifest_with_path_in_file_name_is_rejected(setup, tmp_path, mxtrain, bad_name):
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    (tmp_path / "x").write_bytes(b"outside")
    step = root / "step_00000020"
    m = json.loads((step / "manifest.json").read_text())
    m["files"].append({"name": bad_name, "size": 7, "crc32c": f"{crc32c_ref(b'outside'):08x}"})
    (step / "manifest.json").write_text(json.dumps(m))
    r = run1(["ckpt", "verify", step])
    assert r.rc == 2 and "not a plain file name" in r.stderr and bad_name in r.stderr, r
    r = run1(["train"] + set_args(dict(setup["common"], **{
        "train.steps": STEPS, "run.out_dir": tmp_path / "run", "checkpoint.resume": step})))
    assert r.rc == 2 and "not a plain file name" in r.stderr, r


def _edit_units_shape(m):
    m["units"][0]["tensors"][0]["shape"] = [256, 65]


def _edit_slice_end(m):
    m["shards"][0]["slices"][0]["end"] = 10 ** 12


def _edit_tensor_list(m):
    m["tensors"] = []


def _edit_shards(m):
    m["shards"] = []


def _edit_world_size(m):
    m["world_size"] = 0


def _edit_sharding(m):
    m["sharding"] = "weird"


@pytest.mark.parametrize("edit,keyword", [
    (_edit_units_shape, "'units'"), (_edit_slice_end, "'shards'"), (_edit_shards, "'shards'"),
    (_edit_tensor_list, "'tensors'"), (_edit_world_size, "world_size"),
    (_edit_sharding, "sharding")])
def test_manifest_whose_lists_contradict_its_model_is_rejected(setup, tmp_path, mxtrain, edit,
                                                               keyword):
    """The descriptive lists (tensor offsets and shapes, shard slices, the tensor list) are what
    readers other than mxtrain go by (hf_io.py does): an edited one fails verify, resume and
    export, though every file's CRC still matches."""
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    step = root / "step_00000020"
    m = json.loads((step / "manifest.json").read_text())
    edit(m)
    (step / "manifest.json").write_text(json.dumps(m))
    for args in (["ckpt", "verify", step], ["ckpt", "export-hf", step, tmp_path / "out"],
                 ["train"] + set_args(dict(setup["common"], **{
                     "train.steps": STEPS, "run.out_dir": tmp_path / "run",
                     "checkpoint.resume": step}))):
        r = run1(args)
        err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert r.rc == 2 and len(err) == 1, r
        assert "manifest.json" in err[0] and keyword in err[0], r
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field,value", [("samples_seen", -1), ("samples_seen", 2**63 - 1),
                                         ("seed", "x"), ("world_size", 0), ("recipe", 7),
                                         ("data_tokens", -5), ("data_tokens", "many"),
                                         ("data_fingerprint", 12),
                                         ("data_fingerprint", "0123456789ABCDEF"),
                                         ("data_fingerprint", "0123"),
                                         ("val_tokens", -1), ("val_fingerprint", "xyz"),
                                         ("val_crc32c", "0123ABCD"), ("data_crc32c", 5),
                                         ("shuffle", "yes"), ("shuffle", 1)])
def test_state_json_with_bad_fields_fails_verify(setup, tmp_path, mxtrain, field, value):
    """state.json edited consistently with the manifest (its CRC32C and size rewritten) still
    fails when a field has the wrong type or range."""
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    step = root / "step_00000020"
    state = json.loads((step / "state.json").read_text())
    state[field] = value
    data = json.dumps(state).encode()
    (step / "state.json").write_bytes(data)
    m = json.loads((step / "manifest.json").read_text())
    for f in m["files"]:
        if f["name"] == "state.json":
            f["crc32c"], f["size"] = f"{crc32c_ref(data):08x}", len(data)
    (step / "manifest.json").write_text(json.dumps(m))
    r = run1(["ckpt", "verify", step])
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.rc == 2 and len(err) == 1 and "state.json" in err[0] and field in err[0], r


def test_oversized_manifest_is_refused_before_reading(setup, tmp_path, mxtrain):
    root = tmp_path / "ckpt"
    shutil.copytree(setup["half_root"], root)
    step = root / "step_00000020"
    with open(step / "manifest.json", "ab") as f:
        f.truncate(65 << 20)  # sparse: 65 MiB of zeros after the JSON
    r = run1(["ckpt", "verify", step])
    assert r.rc == 2 and "manifest.json" in r.stderr, r


def test_exact_resume_keeps_fp8_delayed_amax_histories(tmp_path, mxtrain):
    """fp8-delayed quantizes with scales from amax histories: a resume must restore them (they
    live in the rank file), or step 11 on would quantize differently than the uninterrupted run."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(4000))
    base = {"model.preset": "tiny", "train.micro_batch": 2, "train.seq_len": 32,
            "train.lr": 2e-3, "train.min_lr": 2e-3, "train.warmup_steps": 2, "train.seed": 3,
            "train.eval_every": 0, "data.path": corpus, "data.format": "text",
            "run.sample_tokens": 0, "precision.recipe": "fp8-delayed", "checkpoint.every": 5}
    r = run1(["train"] + set_args(dict(base, **{"train.steps": 10, "run.out_dir": tmp_path / "ref",
                                               "checkpoint.resume": "none"})))
    assert r.rc == 0, r
    r = run1(["train"] + set_args(dict(base, **{"train.steps": 5, "run.out_dir": tmp_path / "a",
                                               "checkpoint.resume": "none"})))
    assert r.rc == 0, r
    import hf_io
    shard = hf_io.read_safetensors(str(tmp_path / "a" / "checkpoints" / "step_00000005" / RANK_FILE))
    hist = [k for k in shard if k.startswith("recipe.delayed.")]
    # 2 layers x 7 linears x 6 operands... at least the forward operands of every linear.
    assert len(hist) >= 2 * 7 * 2, sorted(shard)
    assert all(shard[k].shape == (1 + 1024,) for k in hist)  # scale + a 1024-long history
    assert any(shard[k][1:].max() > 0 for k in hist)
    r = run1(["train"] + set_args(dict(base, **{"train.steps": 10, "run.out_dir": tmp_path / "b",
                                               "checkpoint.dir": tmp_path / "a" / "checkpoints",
                                               "checkpoint.resume": "auto"})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    want = (tmp_path / "ref" / "checkpoints" / "step_00000010" / RANK_FILE).read_bytes()
    got = (tmp_path / "a" / "checkpoints" / "step_00000010" / RANK_FILE).read_bytes()
    assert got == want
