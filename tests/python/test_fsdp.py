"""FSDP under a real mpirun: the same global batch trained by 1, 2 and 4 processes gives the
same loss trajectory for every sharding strategy; sharded state really is split; resuming on
another process count continues the run; a failure on one rank ends the job.

The reference is the 1-process run (exact math says data-parallel averaging of per-rank mean
losses and gradients over equal token counts equals the 1-process mean), compared within 1e-5
relative as the issue asks; float summation order is the only difference."""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import MXTRAIN_BIN, run_mxtrain, tiny_checkpoint

STEPS = 30
GLOBAL_BATCH = 4
MPIRUN_FLAGS = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()


def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    text = ("It was the best of times, it was the worst of times, it was the age of wisdom, "
            "it was the age of foolishness, it was the epoch of belief. ") * 60
    path.write_text(text)
    return path


def train(tmp_path, np_, sharding, extra=(), name=None, timeout=180, env_extra=None, log=None):
    out = tmp_path / (name or f"run_{np_}_{sharding}")
    args = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
            "--set", f"train.steps={STEPS}", "--set", "train.seq_len=32",
            "--set", f"train.micro_batch={GLOBAL_BATCH // np_}", "--set", "train.grad_accum=2",
            "--set", "train.warmup_steps=5", "--set", "train.grad_clip=0.5",
            "--set", "train.eval_every=0", "--set", "run.sample_tokens=0",
            "--set", f"parallel.sharding={sharding}", "--set", f"run.out_dir={out}"]
    if sharding == "hybrid":
        args += ["--set", f"parallel.shard_group={min(2, np_)}"]
    args += list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(env_extra or {})
    cmd = (["mpirun", "-np", str(np_)] + MPIRUN_FLAGS + args) if np_ > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                       errors="replace")
    assert p.returncode == 0, f"{cmd}\n{p.stderr[-3000:]}"
    if log is not None:
        log.append(p)
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if not r.get("summary")]
    return steps, records[-1], out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp_ref")
    steps, summary, _ = train(tmp, 1, "full")
    return [r["loss"] for r in steps], [r["grad_norm"] for r in steps], summary


@pytest.mark.parametrize("np_", [1, 2, 4])
@pytest.mark.parametrize("sharding", ["full", "grad-op", "none", "hybrid"])
def test_loss_trajectory_matches_one_process(tmp_path, reference, np_, sharding):
    ref_loss, ref_norm, _ = reference
    steps, summary, _ = train(tmp_path, np_, sharding)
    assert summary["world_size"] == np_
    losses = [r["loss"] for r in steps]
    norms = [r["grad_norm"] for r in steps]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.5  # it trains
    for i, (a, b) in enumerate(zip(losses, ref_loss)):
        assert abs(a - b) <= 1e-5 * abs(b), (np_, sharding, i + 1, a, b)
    for i, (a, b) in enumerate(zip(norms, ref_norm)):
        assert abs(a - b) <= 1e-4 * abs(b), (np_, sharding, i + 1, a, b)


@pytest.mark.parametrize("tied", [False, True])
def test_large_vocabulary_units_match_one_process(tmp_path, tied):
    # Embedding and head 4x a block (vocab 4096 at hidden 64), as at Llama's 128K vocabulary:
    # full sharding then holds one slot of that size and two of a block's, grad-op one slot per
    # unit of its own size. Validation passes run too (a forward-only pass through the slots).
    extra = ["--set", "model.vocab_size=4096", "--set", f"model.tie_word_embeddings={str(tied).lower()}",
             "--set", "train.steps=8", "--set", "train.eval_every=4", "--set", "data.val_fraction=0.2"]
    ref, _, _ = train(tmp_path, 1, "full", extra, name="ref")
    for sharding in ("full", "grad-op"):
        steps, summary, _ = train(tmp_path, 2, sharding, extra, name=f"np2_{sharding}")
        assert len(steps) == len(ref) == 8
        for a, b in zip(steps, ref):
            assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (sharding, a, b)
            if "val_loss" in b:
                assert abs(a["val_loss"] - b["val_loss"]) <= 1e-5 * abs(b["val_loss"]), sharding


def test_full_sharding_splits_the_state(tmp_path, reference):
    _, _, one = reference
    _, four, _ = train(tmp_path, 4, "full")
    # tiny: the largest unit is the embedding (or head) of 256 x 64 floats.
    largest_unit_bytes = 256 * 64 * 4
    assert four["fsdp_state_bytes"] <= one["fsdp_state_bytes"] / 4 + largest_unit_bytes, (four, one)
    assert four["fsdp_state_bytes"] < one["fsdp_state_bytes"] / 3
    assert one["fsdp_transient_bytes"] == 0  # one process gathers nothing
    assert four["peak_mem_bytes_max_rank"] < one["peak_mem_bytes"]


def test_reshard_resume_continues_the_loss(tmp_path, reference):
    ref_loss, _, _ = reference
    out = tmp_path / "reshard"
    common = ["--set", f"checkpoint.dir={out / 'ckpt'}"]
    # 4 processes train the 30-step schedule with a checkpoint at step 15; 2 and then 1
    # process resume from that checkpoint and must continue the 1-process trajectory.
    train(tmp_path, 4, "full", name="reshard_a", extra=common + ["--set", "checkpoint.every=15"])
    ckpt = out / "ckpt" / "step_00000015"
    assert (ckpt / "state.json").exists()
    for np_ in (2, 1):
        steps, _, _ = train(tmp_path, np_, "full", name=f"reshard_{np_}",
                            extra=["--set", f"checkpoint.resume={ckpt}",
                                   "--set", f"checkpoint.dir={out / f'ckpt_{np_}'}"])
        assert [r["step"] for r in steps] == list(range(16, STEPS + 1))
        for r in steps:
            b = ref_loss[r["step"] - 1]
            assert abs(r["loss"] - b) <= 1e-5 * abs(b), (np_, r["step"], r["loss"], b)


@pytest.mark.parametrize("case", ["missing data", "bad value", "resume past steps"])
def test_bad_config_on_every_rank_ends_the_job(tmp_path, case):
    """An error every rank finds ends the job with one error line, rank 0's: it was printed by
    every rank that got there before mpirun's kill (a bad value before the world exists; a
    checkpoint past train.steps, found after)."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    sets = {"missing data": [f"data.path={tmp_path / 'missing.bin'}"],
            "bad value": ["train.steps=-1"],
            "resume past steps": ["data.format=random", "train.steps=1", "train.seq_len=16",
                                  "train.micro_batch=1", "checkpoint.resume=auto"]}[case]
    if case == "resume past steps":
        tiny_checkpoint(run_mxtrain, tmp_path / "x", steps=2)
    t0 = time.monotonic()
    p = subprocess.run(["mpirun", "-np", "3"] + MPIRUN_FLAGS +
                       [MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                        "--set", f"run.out_dir={tmp_path / 'x'}"] +
                       [a for s in sets for a in ("--set", s)],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    assert time.monotonic() - t0 < 30
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    says = {"missing data": "missing.bin", "bad value": "train.steps",
            "resume past steps": "past train.steps"}[case]
    assert len(errors) == 1 and errors[0].startswith("error: rank 0: ") and says in errors[0], \
        p.stderr


@pytest.mark.parametrize("rank1_extra,named", [
    (["--set", "train.steps=5"], "--set train.steps=5"),  # hung after rank 0's last step
    (["--set", "model.num_hidden_layers=3"], "--set model.num_hidden_layers=3"),  # MPI error
    (["--set", "parallel.sharding=none"], "--set parallel.sharding=none"),  # hung
    (["--set", "train.micro_batch=1"], "--set train.micro_batch=1"),  # trained on, silently
])
def test_ranks_started_with_different_settings_end_the_job(tmp_path, rank1_extra, named):
    """Rank 1 given one more --set than rank 0 (a stale config on one node): the job ends at
    start-up with exit 2 and rank 1's error naming the setting, instead of hanging in the first
    collective whose sizes differ, failing inside MPI (exit 1), or training on silently."""
    wrapper = tmp_path / "rank1_differs.sh"
    extra = " ".join(f"'{a}'" for a in rank1_extra)
    wrapper.write_text('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" '
                       f'{extra}; fi\nexec "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS +
                       [str(wrapper), MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                        "--set", f"data.path={corpus(tmp_path)}", "--set", "train.seq_len=32",
                        "--set", "train.steps=2", "--set", "train.micro_batch=2",
                        "--set", "run.sample_tokens=0", "--set", "train.eval_every=0",
                        "--set", f"run.out_dir={tmp_path / 'x'}"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    assert time.monotonic() - t0 < 30
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, p.stderr
    assert errors[0].startswith("error: rank 1: ") and named in errors[0], p.stderr


def test_config_error_before_the_world_exists_names_the_rank(tmp_path):
    """A bad key fails before MPI starts; the line still says which rank, as abort_all's do."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS +
                       [MXTRAIN_BIN, "train", "--set", "train.stepz=3",
                        "--set", f"run.out_dir={tmp_path / 'x'}"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert errors and all(re.match(r"error: rank [01]: unknown config key 'train.stepz'", l)
                          for l in errors), p.stderr


def test_hybrid_group_must_divide_the_world(tmp_path):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    p = subprocess.run(["mpirun", "-np", "4"] + MPIRUN_FLAGS +
                       [MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
                        "--set", f"data.path={corpus(tmp_path)}", "--set", "train.seq_len=32",
                        "--set", "parallel.sharding=hybrid", "--set", "parallel.shard_group=3",
                        "--set", f"run.out_dir={tmp_path / 'x'}"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    assert "error: rank" in p.stderr and "shard_group" in p.stderr, p.stderr


# bf16 gathers (parallel.gather_dtype): under recipe bf16 on the bf16 path every block Linear
# runs on bf16 GEMMs, which round the weights they read to bf16 (RNE), so gathering the blocks
# as bf16 codes of the master weights must give the same bits as gathering fp32, at half the
# bytes; the RMSNorm weights travel exactly beside the codes. The CPU runs that path under
# MXTRAIN_TEST_BF16_GEMM=1 (native bf16 GEMMs, emulated). The shape makes a shard boundary cut
# a norm in two: hidden 32, intermediate 43, 2 heads of 16 gives 8288-element blocks, whose
# post_attention_layernorm ([4128, 4160)) 2 shards of 4144 split, and 4 shards of 2072 do not.
BF16_GATHER_SHAPE = ["--set", "model.hidden_size=32", "--set", "model.num_attention_heads=2",
                     "--set", "model.num_key_value_heads=2", "--set", "model.intermediate_size=43"]


def block_elements(C=32, I=43, H=2, KV=2, D=16):
    return 2 * C + 2 * C * H * D + 2 * C * KV * D + 3 * C * I


def r64(b):
    return (b + 63) // 64 * 64


def padded(n, S):
    return -(-n // S) * S


def block_slots(S, C=32):
    """(fp32, bf16) weight-slot bytes of one block unit at S shards; the bf16 slot's exchange
    from a brute-force walk over the unit's elements (independent of the engine's pieces)."""
    n = block_elements()
    shard = -(-n // S)
    post = C + 2 * C * 32 + 2 * C * 32  # after input_layernorm, q, k, v, o
    norms = list(range(0, C)) + list(range(post, post + C))
    per_rank = max(sum(1 for i in norms if i // shard == r) for r in range(S))
    return r64(4 * padded(n, S)), r64(2 * padded(n, S)) + r64(4 * S * per_rank) + r64(4 * 2 * C)


def weight_slot_saving(S, sharding, C=32, V=256, L=2):
    """fp32 minus bf16 bytes of all weight slots (tiny's untied embedding and head, L blocks)."""
    fp32_block, bf16_block = block_slots(S, C)
    others = [r64(4 * padded(V * C, S)), r64(4 * padded(C + V * C, S))]  # embed, head
    if sharding == "grad-op":  # one slot per unit
        return L * (fp32_block - bf16_block)
    # full / hybrid: the largest unit's slot and two block-sized ones (the head is large here)
    return (max(others + [fp32_block]) + 2 * fp32_block) - \
        (max(others + [bf16_block]) + 2 * bf16_block)


def test_resident_block_codes_give_the_rounding_paths_bits(tmp_path):
    """One process under parallel.gather_dtype auto on the bf16 path keeps the blocks' bf16
    codes resident, rewritten by AdamW in its pass (Fsdp::resident_codes), and the bf16 GEMMs
    read them instead of rounding the fp32 weights at every use: the same values, so the same
    bits as gather_dtype fp32 (which rounds inside each GEMM), in the losses, gradient norms,
    validation, sample and checkpoints. A resume from the step-3 checkpoint (codes remade from
    the loaded weights) continues the uninterrupted run exactly; stale codes would not."""
    extra = BF16_GATHER_SHAPE + [
        "--set", "precision.recipe=bf16", "--set", "precision.activations=bf16",
        "--set", "memory.activation_checkpointing=full", "--set", "train.steps=6",
        "--set", "train.eval_every=3", "--set", "data.val_fraction=0.2",
        "--set", "run.sample_tokens=12", "--set", "checkpoint.every=3"]
    env = {"MXTRAIN_TEST_BF16_GEMM": "1", "MXTRAIN_TEST_DEVICE_MEMORY": "1"}
    runs = {}
    for g in ("fp32", "auto"):
        log = []
        runs[g] = train(tmp_path, 1, "full", extra + ["--set", f"parallel.gather_dtype={g}"],
                        name=g, env_extra=env, log=log) + (log[0].stdout, log[0].stderr)
    (f_steps, f_sum, f_out, f_text, f_err), (b_steps, b_sum, b_out, b_text, b_err) = \
        runs["fp32"], runs["auto"]
    assert "(bf16 block codes resident)" in b_err and "(bf16 block codes" not in f_err
    assert f_sum["fsdp_resident_code_bytes"] == 0
    # 2 bytes a block element, each block's codes 64-byte rounded; 2 blocks in tiny
    assert b_sum["fsdp_resident_code_bytes"] == 2 * r64(2 * block_elements())
    assert b_sum["device_mem_bytes"] - f_sum["device_mem_bytes"] == \
        b_sum["fsdp_resident_code_bytes"]
    assert len(b_steps) == 6 and any("val_loss" in r for r in b_steps)
    for a, b in zip(b_steps, f_steps):
        assert (a["loss"], a["grad_norm"], a.get("val_loss")) == \
            (b["loss"], b["grad_norm"], b.get("val_loss")), (a, b)
    assert "sample" in b_text and b_text.split("sample", 1)[1] == f_text.split("sample", 1)[1]
    f_files = sorted(p.relative_to(f_out) for p in (f_out / "checkpoints").rglob("*.safetensors"))
    b_files = sorted(p.relative_to(b_out) for p in (b_out / "checkpoints").rglob("*.safetensors"))
    assert f_files == b_files and len(f_files) == 2
    for rel in f_files:
        assert (f_out / rel).read_bytes() == (b_out / rel).read_bytes(), rel
    ckpt = b_out / "checkpoints" / "step_00000003"
    r_steps, _, _ = train(tmp_path, 1, "full", extra + [
        "--set", f"checkpoint.resume={ckpt}", "--set", "run.sample_tokens=0"],
        name="resumed", env_extra=env)
    assert [r["step"] for r in r_steps] == [4, 5, 6]
    for a, b in zip(r_steps, f_steps[3:]):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)


@pytest.mark.parametrize("np_,sharding,policy,env", [
    (2, "full", "none", {"MXTRAIN_TEST_STAGING": "1"}),
    (2, "grad-op", "selective", {"MXTRAIN_TEST_DEVICE_MEMORY": "1"}),
    (4, "hybrid", "full", {}),
], ids=["np2-full-staged", "np2-gradop-counted", "np4-hybrid"])
def test_bf16_gathers_give_the_fp32_gathers_bits(tmp_path, np_, sharding, policy, env):
    extra = BF16_GATHER_SHAPE + [
        "--set", "precision.recipe=bf16", "--set", "precision.activations=bf16",
        "--set", f"memory.activation_checkpointing={policy}", "--set", "train.steps=6",
        "--set", "train.eval_every=3", "--set", "data.val_fraction=0.2",
        "--set", "run.sample_tokens=12", "--set", "checkpoint.every=3"]
    env = dict(env, MXTRAIN_TEST_BF16_GEMM="1")
    runs = {}
    for g in ("fp32", "auto"):
        log = []
        steps, summary, out = train(tmp_path, np_, sharding, extra + ["--set", f"parallel.gather_dtype={g}"],
                                    name=f"{g}", env_extra=env, log=log)
        runs[g] = (steps, summary, out, log[0].stdout)
    (f_steps, f_sum, f_out, f_text), (b_steps, b_sum, b_out, b_text) = runs["fp32"], runs["auto"]
    assert f_sum["fsdp_gather_dtype"] == "fp32" and b_sum["fsdp_gather_dtype"] == "bf16"
    assert len(b_steps) == 6
    for a, b in zip(b_steps, f_steps):
        assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], (a, b)
        assert a.get("val_loss") == b.get("val_loss"), (a, b)
    assert any("val_loss" in r for r in b_steps)
    assert "sample" in b_text and b_text.split("sample", 1)[1] == f_text.split("sample", 1)[1]
    # Every checkpoint file (both steps, every rank's shards) byte for byte.
    f_files = sorted(p.relative_to(f_out) for p in (f_out / "checkpoints").rglob("*.safetensors"))
    b_files = sorted(p.relative_to(b_out) for p in (b_out / "checkpoints").rglob("*.safetensors"))
    assert f_files == b_files and len(f_files) == 2 * (2 if sharding == "hybrid" else np_)
    for rel in f_files:
        assert (f_out / rel).read_bytes() == (b_out / rel).read_bytes(), rel
    # The weight slots: grad-op keeps one per unit, full and hybrid hold two block-sized ones
    # beside the large one; each block slot holds codes now (gradient slots stay fp32).
    S = 2 if sharding == "hybrid" else np_
    saving = weight_slot_saving(S, sharding)
    assert saving > 0
    assert f_sum["fsdp_transient_bytes"] - b_sum["fsdp_transient_bytes"] == saving, \
        (f_sum["fsdp_transient_bytes"], b_sum["fsdp_transient_bytes"], saving)


def test_gather_dtype_errors(tmp_path):
    """A bad value, or bf16 gathers where the blocks do not all run on bf16 GEMMs: one error
    line, exit 2, before anything is written."""
    from conftest import run_mxtrain
    base = ["train", "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
            "--set", "train.seq_len=32", "--set", "train.steps=2"]
    cases = [
        (["--set", "parallel.gather_dtype=fp16"], {}, "must be auto, fp32 or bf16"),
        (["--set", "parallel.gather_dtype=bf16", "--set", "precision.recipe=fp8-current",
          "--set", "precision.activations=bf16"], {}, "needs every block on native bf16 GEMMs"),
        (["--set", "parallel.gather_dtype=bf16", "--set", "precision.recipe=bf16",
          "--set", "precision.activations=bf16", "--set", "precision.stats_every=2"], {},
         "needs every block on native bf16 GEMMs"),
        (["--set", "parallel.gather_dtype=bf16", "--set", "precision.recipe=bf16"], {},
         "needs every block on native bf16 GEMMs"),  # fp32 activations on the CPU
        # the configuration allows it; the CPU's GEMMs are fp32 (no test knob)
        (["--set", "parallel.gather_dtype=bf16", "--set", "precision.recipe=bf16",
          "--set", "precision.activations=bf16"], {}, "on a device that has them"),
    ]
    for i, (args, env, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        r = run_mxtrain(base + args + ["--set", f"run.out_dir={out}"], env=env)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), (args, r)
        assert message in lines[0] and "parallel.gather_dtype" in lines[0], (args, lines)
        assert not (out / "checkpoints").exists()


def mpmd(tmp_path, per_rank, timeout=120):
    """mpirun with one app context per rank: per_rank = [(working dir, [args...]), ...]."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    cmd = ["mpirun"] + MPIRUN_FLAGS
    for i, (wdir, args) in enumerate(per_rank):
        cmd += ([":"] if i else []) + ["-np", "1", "-wdir", str(wdir),
                                       os.path.abspath(MXTRAIN_BIN)] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          errors="replace")


def test_a_checkpoint_directory_each_rank_has_its_own_copy_of_is_refused(tmp_path):
    """Two 'nodes' (working directories) with the same relative checkpoint path: rank 0 committed
    steps without rank 1's file (exit 0, then `ckpt verify` failed). Now refused before any
    training."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    args = ["train", "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
            "--set", "train.seq_len=32", "--set", "train.steps=2", "--set", "train.micro_batch=2",
            "--set", "run.sample_tokens=0", "--set", "run.out_dir=out"]
    for n in nodes:
        n.mkdir()
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert_refused_before_training(p, "is not the same directory on every rank: rank 1")
    for n in nodes:
        assert not list((n / "out" / "checkpoints").glob("step_*"))


def train_on_node_copies(tmp_path, copies):
    """One rank per 'node' (working directory), each reading its own copy of data.txt."""
    nodes = [tmp_path / f"n{i}" for i in range(len(copies))]
    for n, text in zip(nodes, copies):
        n.mkdir(exist_ok=True)
        (n / "data.txt").write_text(text)
    args = ["train", "--set", "model.preset=tiny", "--set", "data.path=data.txt",
            "--set", "train.seq_len=32", "--set", "train.steps=2", "--set", "train.micro_batch=2",
            "--set", "run.sample_tokens=0", "--set", f"run.out_dir={tmp_path / 'out'}"]
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    return p, [l for l in p.stderr.splitlines() if l.startswith("error:")]


def test_ranks_reading_different_data_are_refused(tmp_path):
    text = corpus(tmp_path).read_text()
    p, errors = train_on_node_copies(tmp_path, [text, text[: len(text) // 2]])
    assert p.returncode == 2, p.stderr
    assert errors and all("is not the same data on every rank" in l for l in errors), p.stderr


def test_ranks_reading_same_size_other_data_are_refused(tmp_path):
    """Another version of the dataset on one node, the same size: the sizes agreed, so each
    rank trained on other tokens and the run exited 0. Now the ranks compare a sample of the
    tokens with rank 0's; a copy that differs in one sampled token (the last) is refused, the
    rank named, before any step."""
    text = corpus(tmp_path).read_text()
    assert text[-1] != "#"
    p, errors = train_on_node_copies(tmp_path, [text, text, text[:-1] + "#"])
    assert p.returncode == 2, p.stderr
    assert errors and all("is not the same data on every rank: rank 2 reads other tokens" in l
                          for l in errors), p.stderr
    assert "step 1/" not in p.stderr
    # the same file everywhere still trains
    p, _ = train_on_node_copies(tmp_path, [text, text, text])
    assert p.returncode == 0, p.stderr


def tiny_args(tmp_path, *extra, preset=True):
    return ["train"] + (["--set", "model.preset=tiny"] if preset else []) + [
            "--set", f"data.path={corpus(tmp_path)}",
            "--set", "train.seq_len=32", "--set", "train.steps=2", "--set", "train.micro_batch=2",
            "--set", "run.sample_tokens=0", *extra]


def assert_refused_before_training(p, needle, step="step 1/"):
    """Exit 2, every error line (one per rank that reports) says `needle`, no step ran."""
    assert p.returncode == 2, p.stderr
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert errors and all(needle in l for l in errors), p.stderr
    assert step not in p.stderr


@pytest.mark.parametrize("other", [["train", "--help"], ["train", "--list-keys"]])
def test_a_rank_that_ends_without_joining_the_job_ends_it(tmp_path, other):
    """One rank of an app file given `train --help` (or --list-keys) exited 0 before MPI_Init,
    which Open MPI takes as normal: the rank that joined waited for it forever."""
    p = mpmd(tmp_path, [(tmp_path, tiny_args(tmp_path, "--set", f"run.out_dir={tmp_path}/o")),
                        (tmp_path, other)], timeout=60)
    assert p.returncode == 2, p.stderr
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: rank 1: ") and \
        "ended without joining it" in errors[0] and " ".join(other) in errors[0], p.stderr
    assert "step 1/" not in p.stderr


def test_config_sources_past_the_256th_are_compared(tmp_path):
    """Only the first 256 sources (config file, --set flags) were compared: a rank whose 257th
    differed trained on (here: other train.steps, so it then hung)."""
    pad = ["--set", "run.threads=1"] * 256
    a = tiny_args(tmp_path, "--set", f"run.out_dir={tmp_path}/o", *pad)
    p = mpmd(tmp_path, [(tmp_path, a + ["--set", "train.steps=2"]),
                        (tmp_path, a + ["--set", "train.steps=3"])], timeout=60)
    assert_refused_before_training(p, "after the first 256 config sources differ from rank 0's")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two committed step-2 checkpoints of the same tiny model trained at other learning rates,
    and their Hugging Face exports: [(checkpoint root, export dir)] x 2."""
    tmp = tmp_path_factory.mktemp("two_runs")
    out = []
    for i, lr in enumerate(["1e-3", "3e-3"]):
        r = subprocess.run([MXTRAIN_BIN] + tiny_args(tmp, "--set", f"train.lr={lr}",
                                                      "--set", f"run.out_dir={tmp}/r{i}"),
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 0, r.stderr
        ck = tmp / f"r{i}" / "checkpoints"
        r = subprocess.run([MXTRAIN_BIN, "ckpt", "export-hf", str(ck), str(tmp / f"hf{i}")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out.append((ck, tmp / f"hf{i}"))
    return out


def test_a_resume_each_rank_reads_another_copy_of_is_refused(tmp_path, two_runs):
    """An explicit checkpoint.resume through a relative path, each 'node' holding another
    checkpoint of the same shape: every rank loaded its own and the job exited 0 on a stitched
    model. Now the ranks compare the manifest (every file's CRC32C) with rank 0's."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for n, (ck, _) in zip(nodes, two_runs):
        shutil.copytree(ck, n / "ck")
    args = tiny_args(tmp_path, "--set", "train.steps=3", "--set", f"run.out_dir={tmp_path}/o",
                     "--set", "checkpoint.resume=ck/step_00000002")
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert_refused_before_training(p, "is not the same checkpoint on every rank: rank 1", "step 3/")
    assert not list((tmp_path / "o" / "checkpoints").glob("step_*"))
    # the same checkpoint on both nodes resumes
    shutil.rmtree(nodes[1] / "ck")
    shutil.copytree(two_runs[0][0], nodes[1] / "ck")
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert p.returncode == 0 and "resumed from" in p.stderr, p.stderr


def test_init_from_that_differs_between_ranks_is_refused(tmp_path, two_runs):
    """init.from through a relative path, another model on each 'node': the same shape trained
    a stitched model (exit 0), another config failed inside MPI (MPI_ERR_TRUNCATE)."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    args = tiny_args(tmp_path, "--set", f"run.out_dir={tmp_path}/o", "--set", "init.from=model",
                     preset=False)
    # other weights, same config.json
    for n, (_, hf) in zip(nodes, two_runs):
        shutil.copytree(hf, n / "model")
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert_refused_before_training(p, "is not the same weights on every rank: rank 1")
    # the same weights, another config.json (rms_norm_eps: the same shapes, other math)
    shutil.rmtree(nodes[1] / "model")
    shutil.copytree(two_runs[0][1], nodes[1] / "model")
    cfg = json.loads((nodes[1] / "model" / "config.json").read_text())
    cfg["rms_norm_eps"] = cfg["rms_norm_eps"] * 10
    (nodes[1] / "model" / "config.json").write_text(json.dumps(cfg))
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert_refused_before_training(p, "is not the same model on every rank: rank 1")
    # identical copies train
    shutil.rmtree(nodes[1] / "model")
    shutil.copytree(two_runs[0][1], nodes[1] / "model")
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert p.returncode == 0 and "initialized from model" in p.stderr, p.stderr


def test_resume_auto_from_a_directory_each_rank_has_its_own_copy_of_is_refused(tmp_path,
                                                                               two_runs):
    """resume = auto in a relative checkpoint.dir that only rank 0's 'node' holds steps in:
    rank 1 failed with "cannot read .../manifest.json"; the directory check now comes first."""
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    shutil.copytree(two_runs[0][0], nodes[0] / "ck")
    nodes[1].mkdir()
    args = tiny_args(tmp_path, "--set", "train.steps=3", "--set", f"run.out_dir={tmp_path}/o",
                     "--set", "checkpoint.dir=ck")
    p = mpmd(tmp_path, [(n, args) for n in nodes])
    assert_refused_before_training(p, "is not the same directory on every rank: rank 1")


@pytest.mark.parametrize("async_", ["true", "false"])
def test_a_checkpoint_write_failing_on_one_rank_is_reported_once_by_it(tmp_path, async_):
    """Rank 1 cannot write its shard (a file-size limit: EFBIG). Every rank threw and printed,
    rank 0's "another rank could not write its file" often first: one line now, the cause,
    from the rank it happened on; exit 3 and no step committed."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    args = [os.path.abspath(MXTRAIN_BIN)] + tiny_args(
        tmp_path, "--set", f"run.out_dir={tmp_path}/o", "--set", "checkpoint.every=1",
        "--set", f"checkpoint.async={async_}")
    limited = ["bash", "-c", "ulimit -f 64; exec \"$@\"", "limited"] + args
    cmd = ["mpirun"] + MPIRUN_FLAGS + ["-np", "1"] + args + [":", "-np", "1"] + limited + \
        [":", "-np", "1"] + args
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                       errors="replace")
    assert p.returncode == 3, p.stderr
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: rank 1: ") and \
        "File too large" in errors[0], p.stderr
    assert time.monotonic() - t0 < 50, "the other ranks waited for their fallback"
    assert not list((tmp_path / "o" / "checkpoints").glob("step_*"))


def test_ranks_reading_copies_that_differ_between_the_sampled_places_are_refused(tmp_path):
    """Two copies of a 1 MB corpus differing in one byte between the 64 windows the fingerprint
    samples: the sizes and the fingerprint agreed, and each rank trained on its own copy. The
    ranks now compare the CRC32C of every id too, which the vocabulary check reads anyway."""
    text = ("It was the best of times, it was the worst of times. " * 20000)[:1_000_000]
    n = len(text)
    # the sampled windows start at (n - 1024) * w / 63 (data/token_dataset.cpp fingerprint)
    sampled = [(((n - 1024) * w) // 63, ((n - 1024) * w) // 63 + 1024) for w in range(64)]
    at = 5000
    assert not any(a <= at < b for a, b in sampled) and text[at] != "#"
    p, errors = train_on_node_copies(tmp_path, [text, text[:at] + "#" + text[at + 1:]])
    assert p.returncode == 2, p.stderr
    assert errors and all("is not the same data on every rank: rank 1" in l and
                          "CRC32C" in l for l in errors), p.stderr
    assert "step 1/" not in p.stderr


def test_a_resume_warning_is_said_once_not_by_every_rank(tmp_path):
    """What a resume compares with the checkpoint (seed, data, seq_len, the split) is the same
    on every rank: each of the W ranks printed the same warning."""
    base = tiny_args(tmp_path, "--set", f"run.out_dir={tmp_path}/o", "--set", "checkpoint.every=1")
    p = mpmd(tmp_path, [(tmp_path, base + ["--set", "train.steps=1"])] * 2)
    assert p.returncode == 0, p.stderr
    p = mpmd(tmp_path, [(tmp_path, base + ["--set", "train.steps=2", "--set", "train.seed=7",
                                           "--set", "data.val_fraction=0.3"])] * 2)
    assert p.returncode == 0 and "resumed from" in p.stderr, p.stderr
    warns = [l for l in p.stderr.splitlines() if l.startswith("warning:")]
    assert len([l for l in warns if "train.seed is 7" in l]) == 1, p.stderr
    assert len([l for l in warns if "training reads" in l]) == 1, p.stderr


def test_sweep_under_mpirun_is_refused(tmp_path):
    """Its runs joined the launcher's job (a 1-process point trained as 2 and was recorded as
    1; the next failed inside MPI), and every rank's sweep wrote the same --out."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")
    p = subprocess.run(["mpirun", "-np", "2"] + MPIRUN_FLAGS +
                       [MXTRAIN_BIN, "sweep", "--grid", "train.micro_batch=1,2",
                        "--set", "model.preset=tiny", "--set", f"data.path={corpus(tmp_path)}",
                        "--steps", "2", "--out", str(tmp_path / "sw")],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert errors and all("not under mpirun" in l for l in errors), p.stderr
    assert not (tmp_path / "sw").exists()


# fp8-delayed across ranks: each pass's amaxes are reduced (max) over the ranks before they enter
# the histories (Transformer Engine's amax reduction), so every rank quantizes with the same
# scales and checkpoints the same histories.
FP8_DELAYED = ["--set", "precision.recipe=fp8-delayed"]


def delayed_histories(run_dir, step):
    import hf_io
    d = run_dir / "checkpoints" / f"step_{step:08d}"
    shards = [hf_io.read_safetensors(str(f)) for f in sorted(d.glob("rank_*.safetensors"))]
    return [{k: v for k, v in s.items() if k.startswith("recipe.delayed.")} for s in shards]


def test_fp8_delayed_amaxes_are_the_max_over_ranks(tmp_path):
    """One step of 2 micro-batches on 2 processes: every rank file holds the same scale and
    history for every operand, and they equal the 1-process run's on the same global batch:
    the max over the ranks' windows of |x| is the max over all of them, and each rank's loss
    gradient is its share of the global mean (gradients summed over the ranks), so the
    backward's operands (dy) are the 1-process run's too. Per-rank histories (before) differed
    between the ranks and from the 1-process run; with a per-rank mean averaged afterwards, the
    gradient operands' amaxes were 2x the 1-process run's. Within 1e-6, not to the bit:
    OpenBLAS can round a 32-row product differently from a 64-row one (on some CPUs' kernels
    the forward of layer 1's o_proj input differs in the last bit)."""
    import numpy as np
    one_step = FP8_DELAYED + ["--set", "train.steps=1", "--set", "checkpoint.every=1"]
    _, _, one = train(tmp_path, 1, "full", one_step, name="one")
    _, _, two = train(tmp_path, 2, "full", one_step, name="two")
    (ref,) = delayed_histories(one, 1)
    ranks = delayed_histories(two, 1)
    assert len(ranks) == 2 and len(ref) == 2 * 7 * 6, sorted(ref)  # tiny: 2 layers x 7 x 6
    for key, want in ref.items():
        assert (ranks[0][key] == ranks[1][key]).all(), key
        # every operand: fwd x, fwd W, dgrad dy, dgrad W, wgrad dy, wgrad x
        assert np.allclose(ranks[0][key], want, rtol=1e-6, atol=0), (key, ranks[0][key][:3],
                                                                     want[:3])
        assert (want[1:3] > 0).all(), key  # both micro-batches recorded an amax


def test_fp8_delayed_trains_as_one_process_does(tmp_path):
    """fp8-delayed's scales follow the operands' amaxes, so a rank whose gradients were W
    times one process's (a per-rank mean, averaged after the backward) quantized them with
    other scales from the first step on: 2 processes were 1.3e-5 off the 1-process loss at
    step 2 and 6.5e-5 at step 3, where fp32 agrees to 1e-10. Now the first steps agree within
    1e-6 (later ones drift: a code that flips between two FP8 neighbours, on a 1-ulp
    difference in a GEMM's sum, moves the loss by more than the sums' rounding does)."""
    three = FP8_DELAYED + ["--set", "train.steps=3"]
    ref, _, _ = train(tmp_path, 1, "full", three, name="one")
    got, _, _ = train(tmp_path, 2, "full", three, name="two")
    assert [r["step"] for r in got] == [1, 2, 3]
    for a, b in zip(got, ref):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])


@pytest.mark.parametrize("sharding", ["none", "hybrid"])
def test_fp8_delayed_resume_is_exact_when_replicas_share_a_file(tmp_path, sharding):
    """Under none / hybrid one replica of each shard writes the rank file; with the histories
    the same on every rank, a resume restores every rank's exactly: stopped at step 4 and
    resumed, the run ends with the uninterrupted run's bytes (it continued only close to it)."""
    const = FP8_DELAYED + ["--set", "train.lr=2e-3", "--set", "train.min_lr=2e-3",
                           "--set", "checkpoint.every=4"]
    np_ = 4 if sharding == "hybrid" else 2
    _, _, ref = train(tmp_path, np_, sharding, const + ["--set", "train.steps=8"], name="ref")
    _, _, a = train(tmp_path, np_, sharding, const + ["--set", "train.steps=4"], name="a")
    steps, _, _ = train(tmp_path, np_, sharding, const + [
        "--set", "train.steps=8", "--set", f"checkpoint.dir={a / 'checkpoints'}"], name="b")
    assert [r["step"] for r in steps] == [5, 6, 7, 8]
    want = sorted((ref / "checkpoints" / "step_00000008").glob("rank_*"))
    got = sorted((a / "checkpoints" / "step_00000008").glob("rank_*"))
    assert [p.name for p in got] == [p.name for p in want] and want
    for g, w in zip(got, want):
        assert g.read_bytes() == w.read_bytes(), g.name


@pytest.mark.parametrize("setting", ["precision.fp8_attention", "precision.fp8_head"])
def test_fp8_attention_and_head_train_as_one_process_does(tmp_path, setting):
    """precision.fp8_attention scales q, k, v and dO by their amax over the micro-batch, so
    with one sequence a micro-batch 2 ranks (accumulating 2) quantize the same sequences at the
    same scales as 1 process accumulating 4: the per-rank mean's factor 2 is a power of two,
    which the power-of-two scales absorb exactly. precision.fp8_head likewise: h's scale is the
    micro-batch's, W's the same weights', and the logits gradient's, 57344 / |grad_scale|,
    doubles exactly with the gradient's factor 2 (so the codes are the same). The losses agree
    to summation order; without the setting the run lands measurably elsewhere, so the
    comparison sees it."""
    fp8 = ["--set", "precision.recipe=fp8-current", "--set", "train.steps=4",
           "--set", "train.micro_batch=1"]
    on = fp8 + ["--set", f"{setting}=true"]
    one, _, _ = train(tmp_path, 1, "full", on + ["--set", "train.grad_accum=4"], name="one")
    two, _, _ = train(tmp_path, 2, "full", on + ["--set", "train.grad_accum=2"], name="two")
    plain, _, _ = train(tmp_path, 2, "full", fp8 + ["--set", "train.grad_accum=2"], name="plain")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(two, one):
        assert abs(a["loss"] - b["loss"]) <= 1e-9 * abs(b["loss"]), (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-6 * b["grad_norm"], a["step"]
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(plain, one)) > 1e-6
