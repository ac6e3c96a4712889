"""What a checkpoint holds, beyond its bytes matching the manifest: every value finite, second
moments non-negative, FP8 recipe state that names the model's operands with usable scales; and
where a checkpoint root may be (not inside another checkpoint's step). Each case is a
checkpoint edited consistently with its manifest (the CRC32C and size rewritten, with the
independent CRC32C of test_checkpoint_resume), so only the value check can catch it. A hunt
found each one accepted: a NaN weight verified, generated garbage and exported a model that
mxtrain then refused to load; resume reported it steps later as "training diverged"."""
import json
import shutil
import struct

import numpy as np
import pytest

from conftest import english_text, set_args
from test_checkpoint_resume import crc32c_ref, run1

RANK_FILE = "rank_00000-of-00001.safetensors"


def tensor_offsets(path):
    """name -> (byte offset of its data in the file, dtype, shape), from the safetensors header."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {k: (8 + n + v["data_offsets"][0], v["dtype"], v["shape"])
            for k, v in header.items() if k != "__metadata__"}


def set_floats(step, name, values, file=RANK_FILE):
    """Writes float32 values at the start of tensor `name`, then the manifest's size and CRC."""
    p = step / file
    off, dtype, _ = tensor_offsets(p)[name]
    assert dtype == "F32"
    data = bytearray(p.read_bytes())
    blob = np.asarray(values, "<f4").tobytes()
    data[off:off + len(blob)] = blob
    p.write_bytes(bytes(data))
    fix_manifest(step, file)


def fix_manifest(step, file):
    data = (step / file).read_bytes()
    m = json.loads((step / "manifest.json").read_text())
    for f in m["files"]:
        if f["name"] == file:
            f["crc32c"], f["size"] = f"{crc32c_ref(data):08x}", len(data)
    (step / "manifest.json").write_text(json.dumps(m))


def rename_tensor(step, old, new, file=RANK_FILE):
    """Renames a tensor in the header (same length, so the offsets stand)."""
    assert len(old) == len(new)
    p = step / file
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + n].replace(f'"{old}"'.encode(), f'"{new}"'.encode())
    p.write_bytes(raw[:8] + header + raw[8 + n:])
    fix_manifest(step, file)


def shorten_tensor(step, name, keep, file=RANK_FILE):
    """Keeps the first `keep` float32 values of tensor `name` (header shape and offsets, and the
    manifest's shape, rewritten; the bytes after it become a gap, which safetensors allows)."""
    p = step / file
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    a, _ = header[name]["data_offsets"]
    header[name] = dict(header[name], shape=[keep], data_offsets=[a, a + 4 * keep])
    h = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    m = json.loads((step / "manifest.json").read_text())
    for t in m.get("tensors", []):
        if t["file"] == file and t["name"] == name:
            t["shape"] = [keep]
    (step / "manifest.json").write_text(json.dumps(m))
    fix_manifest(step, file)


def errors(r):
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckval")
    corpus = tmp / "english.txt"
    corpus.write_text(english_text(4000))
    common = {"model.preset": "tiny", "train.micro_batch": 2, "train.seq_len": 32,
              "data.path": corpus, "data.format": "text", "run.sample_tokens": 0,
              "train.eval_every": 0, "checkpoint.every": 2, "checkpoint.keep": 0}
    out = {}
    for recipe in ("fp32", "fp8-delayed"):
        s = dict(common, **{"train.steps": 4, "precision.recipe": recipe,
                            "run.out_dir": tmp / recipe})
        r = run1(["train"] + set_args(s))
        assert r.rc == 0, r
        out[recipe] = (s, tmp / recipe / "checkpoints")
    return tmp, out


def copy_run(runs, recipe, dest):
    tmp, out = runs
    settings, root = out[recipe]
    shutil.copytree(root, dest / "checkpoints")
    return dict(settings, **{"run.out_dir": dest, "train.steps": 6}), dest / "checkpoints"


@pytest.mark.parametrize("tensor,value,says", [
    ("master.block.0", float("nan"), "holds nan at element 0 (every value must be finite)"),
    ("exp_avg.embed", float("inf"), "holds inf at element 0 (every value must be finite)"),
    ("exp_avg_sq.block.1", -1e-8, "holds -1e-08 at element 0 (a second moment must be finite and >= 0)"),
])
def test_a_checkpoint_with_a_bad_value_is_refused_by_name(runs, tmp_path, tensor, value, says):
    settings, root = copy_run(runs, "fp32", tmp_path / "o")
    step4 = root / "step_00000004"
    names = tensor_offsets(step4 / RANK_FILE)
    assert tensor in names, sorted(names)
    set_floats(step4, tensor, [value])
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    # explicit resume from the step: one error naming the tensor, exit 2
    r = run1(["train"] + set_args(dict(settings, **{"checkpoint.resume": str(step4)})))
    assert r.rc == 2 and len(errors(r)) == 1, r
    assert f"{RANK_FILE}: {tensor} {says}" in errors(r)[0], r
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    # verify reads every byte and applies the same rules: the value is named there too (a
    # negative second moment verified, so resume = auto stopped on it instead of skipping it)
    r = run1(["ckpt", "verify", step4])
    assert r.rc == 2 and f"{tensor} {says}" in r.stderr, r
    # resume = auto skips the step with a warning and resumes from step 2
    r = run1(["train"] + set_args(settings))
    assert r.rc == 0 and "resumed from" in r.stderr and "step_00000002" in r.stderr, r
    assert "skipping checkpoint" in r.stderr and tensor in r.stderr, r


def test_generate_and_export_refuse_a_nan_weight(runs, tmp_path):
    _, root = copy_run(runs, "fp32", tmp_path / "o")
    step4 = root / "step_00000004"
    set_floats(step4, "master.block.0", [1.0, float("nan")])
    r = run1(["generate", "--model", step4, "--prompt-ids", "1 2 3", "--max-tokens", "2"])
    assert r.rc == 2 and len(errors(r)) == 1 and "master.block.0 holds nan at element 1" in r.stderr, r
    r = run1(["ckpt", "export-hf", step4, tmp_path / "hf"])
    assert r.rc == 2 and "holds nan" in r.stderr, r
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_fp8_delayed_state_is_checked_and_named(runs, tmp_path):
    """Scales without a finite reciprocal (0, a subnormal) and negative or NaN amaxes were
    accepted or refused without naming the file; a tensor of the family that names no operand
    of the model was kept silently."""
    for i, (edit, says) in enumerate([
        (lambda st, n: set_floats(st, n, [0.0]), "is not a positive number with a finite reciprocal"),
        (lambda st, n: set_floats(st, n, [1e-45]), "is not a positive number with a finite reciprocal"),
        (lambda st, n: set_floats(st, n, [1.0, -2.0]), "amax -2 is not a finite non-negative number"),
        (lambda st, n: rename_tensor(st, n, "recipe.delayed.9" + n[len("recipe.delayed.0"):]),
         "names no operand of this model's Linears"),
        # a history of another length was refused only by the resume, after verify passed it
        (lambda st, n: shorten_tensor(st, n, 3), "holds 3 values, not a scale and an amax history of 1024"),
    ]):
        settings, root = copy_run(runs, "fp8-delayed", tmp_path / f"o{i}")
        step4 = root / "step_00000004"
        names = [n for n in tensor_offsets(step4 / RANK_FILE) if n.startswith("recipe.delayed.0.")]
        assert names, "fp8-delayed saved no recipe state"
        edit(step4, names[0])
        r = run1(["train"] + set_args(dict(settings, **{"checkpoint.resume": str(step4)})))
        assert r.rc == 2 and len(errors(r)) == 1, r
        assert str(step4) in errors(r)[0] and says in errors(r)[0], r
        r = run1(["ckpt", "verify", step4])  # the same rules, so resume = auto skips it
        assert r.rc == 2 and says in r.stderr, r


def edit_header(step, name, new_name=None, shape=None, file=RANK_FILE):
    """Renames tensor `name` and/or gives it another shape in the rank file's header (its bytes
    stay where they are), then the manifest's size and CRC."""
    p = step / file
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    entry = header.pop(name)
    if shape is not None:
        entry = dict(entry, shape=shape)
    header[new_name or name] = entry
    h = json.dumps(header).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    fix_manifest(step, file)


@pytest.mark.parametrize("edit,says", [
    # "01" read as layer 1 too: two tensors fed one operand, the second replacing the first
    (lambda st: edit_header(st, "recipe.delayed.1.0.0", "recipe.delayed.01.0.0"),
     "recipe.delayed.01.0.0 is not spelled as mxtrain writes it (recipe.delayed.1.0.0"),
    (lambda st: edit_header(st, "recipe.delayed.1.2.3", "recipe.delayed.+1.2.3"),
     "is not spelled as mxtrain writes it"),
    (lambda st: edit_header(st, "recipe.delayed.0.0.0", shape=[1, 1025]),
     "recipe.delayed.0.0.0 is not a 1-D F32 tensor"),
])
def test_fp8_delayed_state_is_spelled_and_shaped_as_written(runs, tmp_path, edit, says):
    """A hunt renamed and reshaped fp8-delayed state in a checkpoint (the manifest's CRC
    rewritten): `recipe.delayed.01.0.0`, `+1` and a [1, 1025] shape all resumed and verified,
    the first feeding layer 1's state into one operand twice. Each is refused now, by verify
    (so resume = auto skips the step) and by an explicit resume."""
    settings, root = copy_run(runs, "fp8-delayed", tmp_path / "o")
    step4 = root / "step_00000004"
    edit(step4)
    r = run1(["ckpt", "verify", step4])
    assert r.rc == 2 and len(errors(r)) == 1 and says in errors(r)[0], r
    r = run1(["train"] + set_args(dict(settings, **{"checkpoint.resume": str(step4)})))
    assert r.rc == 2 and len(errors(r)) == 1 and says in errors(r)[0], r


def test_another_recipe_on_resume_warns_and_drops_fp8_delayed_state(runs, tmp_path):
    """fp8-delayed's amax histories were restored under any recipe, never used, and saved into
    every later checkpoint (stale by then), and a change of recipe on resume went without a
    word. Now: a warning naming both recipes, and a bf16 run's checkpoints hold no
    recipe.delayed tensors; an fp32 checkpoint resumed as fp8-delayed says its scales start
    at 1; and fp8-delayed state for fewer blocks than the run quantizes (high_precision_first
    changed) says how many operands start afresh."""
    settings, root = copy_run(runs, "fp8-delayed", tmp_path / "a")
    r = run1(["train"] + set_args(dict(settings, **{"precision.recipe": "bf16",
                                                    "checkpoint.every": 1})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1 and "precision.recipe is bf16, the checkpoint's run used " \
        "fp8-delayed" in warns[0] and "amax histories do not" in warns[0], r.stderr
    names = tensor_offsets(root / "step_00000006" / RANK_FILE)
    assert not [n for n in names if n.startswith("recipe.delayed.")], sorted(names)
    # an fp32 checkpoint resumed as fp8-delayed
    settings, root = copy_run(runs, "fp32", tmp_path / "b")
    r = run1(["train"] + set_args(dict(settings, **{"precision.recipe": "fp8-delayed"})))
    assert r.rc == 0, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1 and "scales start at 1" in warns[0], r.stderr
    # the same recipe, block 0 left in high precision when saved, quantized now: 42 of 84
    tmp, _ = runs
    corpus = tmp / "english.txt"
    base = dict(settings, **{"precision.recipe": "fp8-delayed", "train.steps": 2,
                             "checkpoint.every": 2, "run.out_dir": tmp_path / "c",
                             "data.path": corpus})
    r = run1(["train"] + set_args(dict(base, **{"precision.high_precision_first": 1})))
    assert r.rc == 0, r
    names = tensor_offsets(tmp_path / "c" / "checkpoints" / "step_00000002" / RANK_FILE)
    assert len([n for n in names if n.startswith("recipe.delayed.")]) == 7 * 6, sorted(names)
    r = run1(["train"] + set_args(dict(base, **{"train.steps": 3})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1 and "fp8-delayed state for 42 of the 84 operands" in warns[0], r.stderr
    # and the other way (saved for both blocks, block 0 high precision now): silent, and the
    # next checkpoint holds only the quantized block's state
    r = run1(["train"] + set_args(dict(base, **{"train.steps": 4, "checkpoint.every": 1,
                                                "precision.high_precision_first": 1})))
    assert r.rc == 0 and "resumed from" in r.stderr, r
    assert not [l for l in r.stderr.splitlines() if l.startswith("warning:")], r.stderr
    names = tensor_offsets(tmp_path / "c" / "checkpoints" / "step_00000004" / RANK_FILE)
    kept = sorted(n for n in names if n.startswith("recipe.delayed."))
    assert len(kept) == 42 and all(n.startswith("recipe.delayed.1.") for n in kept), kept


def with_gap(step, before, gap, file=RANK_FILE):
    """Rewrites a rank file with `gap` bytes inserted before tensor `before` (its offset and
    every later one moved): still a valid safetensors file, tensors no longer 4-byte aligned."""
    p = step / file
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    names = sorted((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][0])
    out, new = bytearray(), dict(header)
    for k in names:
        a, b = header[k]["data_offsets"]
        if k == before:
            out += gap
        new[k] = dict(header[k], data_offsets=[len(out), len(out) + b - a])
        out += data[a:b]
    h = json.dumps(new).encode()
    p.write_bytes(struct.pack("<Q", len(h)) + h + bytes(out))
    fix_manifest(step, file)


def test_verify_scans_each_tensor_wherever_it_lies(runs, tmp_path):
    """verify's value scan read the data buffer as packed 4-byte words from its start: a valid
    file with a gap before a tensor (the format allows it) was refused with a made-up NaN, and
    a NaN after such a gap went unreported. Each tensor is now scanned over its own range."""
    settings, root = copy_run(runs, "fp32", tmp_path / "o")
    step4 = root / "step_00000004"
    with_gap(step4, "master.block.0", b"\x00\x00\xc0\x7f")  # NaN bytes, in no tensor
    r = run1(["ckpt", "verify", step4])
    assert r.rc == 0, r
    r = run1(["train"] + set_args(settings))
    assert r.rc == 0 and "resumed from" in r.stderr and "step_00000004" in r.stderr, r
    settings, root = copy_run(runs, "fp32", tmp_path / "p")
    step4 = root / "step_00000004"
    with_gap(step4, "exp_avg.block.1", b"\x01")
    set_floats(step4, "exp_avg_sq.head", [0.5, 0.25, float("nan")])
    r = run1(["ckpt", "verify", step4])
    assert r.rc == 2 and "exp_avg_sq.head holds nan at element 2" in r.stderr, r


def test_a_checkpoint_root_inside_a_step_is_refused(runs, tmp_path):
    """checkpoint.dir inside another run's step (or its hidden partial directory) trained with
    exit 0, and the other run's next start or retention deleted what it wrote."""
    settings, root = copy_run(runs, "fp32", tmp_path / "a")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for inside in (root / "step_00000002", root / "step_00000002" / "sub",
                   root / ".step_00000099.partial"):
        r = run1(["train"] + set_args(dict(settings, **{"run.out_dir": tmp_path / "b",
                                                        "checkpoint.dir": inside})))
        assert r.rc == 2 and len(errors(r)) == 1, r
        assert "lies inside the checkpoint step" in errors(r)[0], r
    r = run1(["train"] + set_args(dict(settings, **{
        "run.out_dir": tmp_path / "c", "checkpoint.s3_uri": "s3://bucket/run/step_00000002/x"})))
    assert r.rc == 2 and "inside the checkpoint step s3://bucket/run/step_00000002:" in errors(r)[0], r
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert not (root / ".step_00000099.partial").exists()


def test_train_steps_past_eight_digits_are_refused(tmp_path):
    """Step 10^8 was written as step_100000000, which nothing lists, resumes or exports."""
    r = run1(["train", "--set", "model.preset=tiny", "--set", "train.steps=100000000",
              "--set", f"run.out_dir={tmp_path / 'o'}"])
    assert r.rc == 2 and len(errors(r)) == 1 and "at most 99999999" in errors(r)[0], r
    assert not (tmp_path / "o").exists()
