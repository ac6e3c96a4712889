"""`mxtrain plan` against the engine's measured peak memory (CPU: one process, and 2 / 4
processes under mpirun with every sharding strategy and several recipes), plus the GPU model's
contract: JSON fields, fits flipping with micro_batch, bad input."""
import json
import os
import subprocess

import numpy as np
import pytest

import llama_ref
from conftest import MXTRAIN_BIN, read_metrics, set_args, write_model, write_tokens_i32

TOLERANCE = 0.03  # the brief's bound; on CPU the replay is exact, so we also report the error


def plan(mxtrain, settings, gpu="cpu", gpus=1, nodes=1, extra=()):
    args = ["plan", "--gpu", gpu, "--gpus", gpus, "--nodes", nodes, "--json"] + set_args(settings)
    r = mxtrain(args + list(extra))
    assert r.rc == 0, r
    return json.loads(r.stdout)


# (model settings, micro_batch, seq_len, policy): presets, a custom odd shape, 125m at short seq.
TRAIN_CASES = [
    (dict(**{"model.preset": "tiny"}), 2, 64, "none"),
    (dict(**{"model.preset": "tiny"}), 2, 64, "selective"),
    (dict(**{"model.preset": "tiny"}), 2, 64, "full"),
    (dict(**{"model.preset": "tiny"}), 1, 200, "none"),
    (dict(**{"model.preset": "small"}), 2, 128, "none"),
    (dict(**{"model.preset": "small"}), 2, 128, "selective"),
    (dict(**{"model.preset": "tiny"}), 3, 50, "selective"),
    ({"model.preset": "tiny", "model.hidden_size": 96, "model.intermediate_size": 200,
      "model.num_attention_heads": 6, "model.num_key_value_heads": 2, "model.vocab_size": 300},
     3, 37, "none"),
    ({"model.preset": "tiny", "model.hidden_size": 96, "model.intermediate_size": 200,
      "model.num_attention_heads": 6, "model.num_key_value_heads": 2, "model.vocab_size": 300},
     3, 37, "full"),
]


def assert_plan_matches_one_step(mxtrain, tmp_path, settings):
    """One training step's peak_mem_bytes against `plan --gpu cpu` of the same settings."""
    run = dict(settings)
    run.update({"train.steps": 1, "data.format": "random", "run.sample_tokens": 0,
                "run.out_dir": str(tmp_path / "run"), "train.eval_every": 0})
    r = mxtrain(["train"] + set_args(run))
    assert r.rc == 0, r
    steps, summary = read_metrics(tmp_path / "run" / "metrics.jsonl")
    measured = summary["peak_mem_bytes"]
    predicted = plan(mxtrain, dict(settings, **{"train.eval_every": 0}))["memory"]["total_bytes"]
    err = abs(predicted - measured) / measured
    print(f"{settings}: measured {measured} predicted {predicted} error {err:.2e}")
    assert err <= TOLERANCE, (measured, predicted)


@pytest.mark.parametrize("model,batch,seq,policy", TRAIN_CASES)
def test_cpu_plan_matches_train_peak(mxtrain, tmp_path, model, batch, seq, policy):
    settings = dict(model)
    settings.update({"train.micro_batch": batch, "train.seq_len": seq,
                     "memory.activation_checkpointing": policy})
    assert_plan_matches_one_step(mxtrain, tmp_path, settings)


# Several processes: `mpirun -np N mxtrain train` against `mxtrain plan --gpu cpu --gpus N`,
# across presets (tiny, small, a 2-layer 125m shape, an odd padded shape, a tied head), sequence
# lengths, checkpointing policies, recipes (fp32 and emulated bf16 / FP8 / MXFP8 / NVFP4),
# every sharding strategy, grad accumulation and the eval forward. The measured side is the
# engine's MemoryTracker peak on rank 0 and the maximum over ranks.
MPIRUN_FLAGS = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()
ODD = {"model.preset": "tiny", "model.hidden_size": 96, "model.intermediate_size": 200,
       "model.num_attention_heads": 6, "model.num_key_value_heads": 2, "model.vocab_size": 301}
SHAPE_125M = {"model.preset": "125m", "model.num_hidden_layers": 2, "model.vocab_size": 2048}
TINY = {"model.preset": "tiny"}
SMALL = {"model.preset": "small"}
# (name, model, procs, sharding, seq, micro_batch, policy, recipe, extra settings)
MULTI_CASES = [
    ("tiny-1p-nvfp4", TINY, 1, "full", 64, 2, "none", "nvfp4", {}),
    ("tiny-1p-fp8delayed-hp", TINY, 1, "full", 48, 1, "selective", "fp8-delayed",
     {"precision.high_precision_first": 1}),
    ("tiny-1p-mxfp8-hp-fp32", TINY, 1, "full", 64, 1, "none", "mxfp8",
     {"precision.high_precision_last": 1, "precision.high_precision": "fp32"}),
    ("tiny-2p-full", TINY, 2, "full", 32, 2, "none", "fp32", {}),
    ("tiny-2p-gradop-sel", TINY, 2, "grad-op", 64, 1, "selective", "fp32", {}),
    ("tiny-2p-none-bf16", TINY, 2, "none", 32, 2, "full", "bf16", {}),
    ("tiny-2p-full-eval", TINY, 2, "full", 32, 2, "selective", "fp32",
     {"train.eval_every": 1, "data.val_fraction": 0.5}),
    ("tiny-4p-full-fp8cur", TINY, 4, "full", 32, 1, "selective", "fp8-current", {}),
    ("tiny-4p-hybrid", TINY, 4, "hybrid", 48, 1, "none", "fp32", {"parallel.shard_group": 2}),
    ("tiny-4p-gradop-nvfp4", TINY, 4, "grad-op", 32, 1, "full", "nvfp4", {}),
    ("tied-2p-gradop", TINY, 2, "grad-op", 40, 1, "none", "fp32",
     {"model.tie_word_embeddings": True}),
    ("odd-4p-full-accum", ODD, 4, "full", 37, 1, "full", "fp32", {"train.grad_accum": 2}),
    ("small-2p-full-mxfp8", SMALL, 2, "full", 64, 1, "selective", "mxfp8", {}),
    ("small-4p-none", SMALL, 4, "none", 128, 1, "full", "fp32", {}),
    ("125m-2p-full", SHAPE_125M, 2, "full", 32, 1, "none", "fp32", {}),
    ("tiny-2p-gradop-bf16act", TINY, 2, "grad-op", 32, 2, "none", "bf16",
     {"precision.activations": "bf16"}),
    # embedding and head larger than a block (as at a 128K vocabulary): one large FSDP slot and
    # two block-sized ones; a tied head's unit (its final norm) takes a block-sized one
    ("bigvocab-2p-full-eval", dict(TINY, **{"model.vocab_size": 4096}), 2, "full", 32, 1, "none",
     "fp32", {"train.eval_every": 1, "data.val_fraction": 0.5}),
    ("bigvocab-tied-4p-hybrid", dict(TINY, **{"model.vocab_size": 4096,
                                             "model.tie_word_embeddings": True}), 4, "hybrid",
     32, 1, "selective", "fp32", {"parallel.shard_group": 2}),
]


def train_mpi(tmp_path, procs, settings, timeout=300, env_extra=None):
    out = tmp_path / "run"
    run = dict(settings)
    run.update({"train.steps": 1, "run.sample_tokens": 0, "run.out_dir": str(out)})
    run.setdefault("data.format", "random")
    args = [MXTRAIN_BIN, "train"] + set_args(run)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               **(env_extra or {}))
    cmd = (["mpirun", "-np", str(procs)] + MPIRUN_FLAGS + args) if procs > 1 else args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{cmd}\n{p.stderr[-3000:]}"
    _, summary = read_metrics(out / "metrics.jsonl")
    assert summary["world_size"] == procs
    return summary


def case_settings(model, sharding, seq, batch, policy, recipe, extra):
    settings = dict(model)
    settings.update({"train.micro_batch": batch, "train.seq_len": seq,
                     "memory.activation_checkpointing": policy, "parallel.sharding": sharding,
                     "precision.recipe": recipe, "train.eval_every": 0})
    settings.update(extra)
    return settings


@pytest.mark.parametrize("name,model,procs,sharding,seq,batch,policy,recipe,extra", MULTI_CASES,
                         ids=[c[0] for c in MULTI_CASES])
def test_cpu_plan_matches_multiprocess_peak(mxtrain, tmp_path, name, model, procs, sharding,
                                            seq, batch, policy, recipe, extra):
    settings = case_settings(model, sharding, seq, batch, policy, recipe, extra)
    if "data.val_fraction" in settings:  # eval needs held-out text: a small file
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("the quick brown fox jumps over the lazy dog. " * 40)
        settings["data.path"] = str(corpus)
        settings["data.format"] = "text"
    summary = train_mpi(tmp_path, procs, settings)
    measured = summary["peak_mem_bytes"]
    measured_max = summary.get("peak_mem_bytes_max_rank", measured)
    out = plan(mxtrain, settings, gpus=procs)
    mem = out["memory"]
    assert out["config"]["recipe"] == recipe and out["world_size"] == procs
    assert mem["total_bytes"] == sum(mem["breakdown"].values())
    predicted, predicted_max = mem["total_bytes"], mem["total_bytes_max_rank"]
    err = abs(predicted - measured) / measured
    err_max = abs(predicted_max - measured_max) / measured_max
    print(f"{name}: measured {measured} (max rank {measured_max}) predicted {predicted} "
          f"(max rank {predicted_max}) error {err:.2e} / {err_max:.2e}")
    assert err <= TOLERANCE, (measured, predicted)
    assert err_max <= TOLERANCE, (measured_max, predicted_max)


# debug grads (no optimizer state): 125m at a short sequence and the odd shape.
GRADS_CASES = [
    ("125m", dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=12, vocab_size=32000), 1, 32,
     "none"),
    ("tied", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                  tie_word_embeddings=True), 2, 31, "full"),
    ("odd", dict(hidden_size=48, intermediate_size=128, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=100),
     2, 24, "selective"),
]


@pytest.mark.parametrize("name,shape,batch,seq,policy", GRADS_CASES)
def test_cpu_plan_matches_debug_grads_peak(mxtrain, tmp_path, name, shape, batch, seq, policy):
    cfg = llama_ref.make_shape(**shape)
    shapes = llama_ref.param_shapes(cfg)
    rng = np.random.default_rng(0)
    # Memory does not depend on the values: zeros keep the 125m case's 500 MB cheap to write.
    params = {k: np.zeros(s, dtype=np.float32) for k, s in shapes.items()}
    model_dir = write_model(tmp_path / "model", cfg, params)
    tokens = rng.integers(0, cfg["vocab_size"], size=(batch, seq + 1))
    write_tokens_i32(tmp_path / "tok.bin", tokens)
    r = mxtrain(["debug", "grads", "--init", model_dir, "--tokens", tmp_path / "tok.bin",
                 "--batch", batch, "--seq", seq, "--out", tmp_path / "g.safetensors",
                 "--checkpointing", policy])
    assert r.rc == 0, r
    measured = int(r.value("peak_mem_bytes"))
    settings = {"model.preset": "tiny", "train.micro_batch": batch, "train.seq_len": seq,
                "memory.activation_checkpointing": policy, "train.eval_every": 0}
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings"):
        settings["model." + k] = cfg[k]
    out = plan(mxtrain, settings)
    b = out["memory"]["breakdown"]
    predicted = out["memory"]["total_bytes"] - b["adam_m"] - b["adam_v"]  # debug grads: no AdamW
    err = abs(predicted - measured) / measured
    print(f"{name} B={batch} T={seq} {policy}: measured {measured} predicted {predicted} "
          f"error {err:.2e}")
    assert err <= TOLERANCE, (measured, predicted)


# What this build's CUDA engine allocates per GPU (`plan --gpu ...`, memory.engine) against the
# engine itself: MXTRAIN_TEST_DEVICE_MEMORY=1 makes the CPU backend allocate its arenas through
# a counting MemoryResource, as the CUDA backend's cudaMalloc would (device-sized head chunks
# included), and the run reports the bytes it holds (device_mem_bytes). 1 and 2 processes,
# every sharding strategy, recipes with and without operand copies, eval on and off. Where a
# recipe runs, precision.activations is set: its default is bf16 on a GPU but fp32 on the CPU.
ENGINE_CASES = [
    ("tiny-1p-bf16", TINY, 1, "full", 64, 2, "none", "bf16", {"precision.activations": "bf16"}),
    # recipe bf16 with bf16 activations: a GPU runs every block on the bf16 path with native
    # GEMMs, and its arenas are sized for that alone (the CPU takes the path under
    # MXTRAIN_TEST_BF16_GEMM, below; under the other recipes it widens the Linears' operands)
    ("tiny-1p-bf16-sel-eval", TINY, 1, "full", 64, 2, "selective", "bf16",
     {"precision.activations": "bf16", "train.eval_every": 1}),
    ("small-2p-bf16-full-eval", SMALL, 2, "full", 64, 1, "full", "bf16",
     {"precision.activations": "bf16", "train.eval_every": 1}),
    ("tiny-1p-bf16-telemetry", TINY, 1, "full", 64, 2, "none", "bf16",
     {"precision.activations": "bf16", "precision.stats_every": 1}),
    ("tiny-1p-fp32-sel", TINY, 1, "full", 48, 1, "selective", "fp32", {"train.eval_every": 1}),
    ("small-1p-mxfp8-hp", SMALL, 1, "full", 64, 1, "full", "mxfp8",
     {"precision.high_precision_last": 1}),
    ("tiny-2p-full-bf16", TINY, 2, "full", 32, 2, "none", "bf16", {"precision.activations": "fp32"}),
    ("tiny-1p-sel-mxfp8-bf16act", TINY, 1, "full", 48, 2, "selective", "mxfp8",
     {"precision.activations": "bf16"}),
    ("odd-2p-gradop-fp32", ODD, 2, "grad-op", 37, 1, "selective", "fp32", {}),
    # (nvfp4 on the backend's FP4 ops and the bf16 path, as a B200 runs it: the RMSNorm's amax
    # floats, amax_slot_bytes 8, are allocated there)
    ("tied-2p-none-nvfp4", dict(TINY, **{"model.tie_word_embeddings": True}), 2, "none", 32, 1,
     "full", "nvfp4", {"precision.activations": "bf16"}),
    # FSDP's bf16 gathers (parallel.gather_dtype auto: the blocks' weight slots hold codes)
    ("tiny-2p-gradop-bf16-gathers", TINY, 2, "grad-op", 32, 1, "selective", "bf16",
     {"precision.activations": "bf16"}),
    ("tied-2p-full-bf16-gathers", dict(TINY, **{"model.tie_word_embeddings": True}), 2, "full",
     32, 1, "none", "bf16", {"precision.activations": "bf16", "train.eval_every": 1}),
    ("tiny-2p-full-bf16-gather-fp32", TINY, 2, "full", 32, 1, "none", "bf16",
     {"precision.activations": "bf16", "parallel.gather_dtype": "fp32"}),
    # the recipes' Linears on the backend's FP8 ops (MXTRAIN_TEST_FP8_OPS, as a GPU's tensor
    # cores), bf16 activations, policy none: `saved` holds x^T's FP8 codes of h1, h2 and the
    # SwiGLU product in place of their bf16 codes (a 4-byte scale; mxfp8's n / 32 bytes)
    ("tiny-1p-none-fp8delayed-xt", TINY, 1, "full", 32, 4, "none", "fp8-delayed",
     {"precision.activations": "bf16"}),
    ("tiny-1p-none-mxfp8-xt", TINY, 1, "full", 32, 4, "none", "mxfp8",
     {"precision.activations": "bf16"}),
    # fp8-current: the floats the RMSNorms write their outputs' amaxes into (amax_slot_bytes 8)
    ("tiny-1p-none-fp8current-xt", TINY, 1, "full", 32, 4, "none", "fp8-current",
     {"precision.activations": "bf16"}),
]


@pytest.mark.parametrize("name,model,procs,sharding,seq,batch,policy,recipe,extra", ENGINE_CASES,
                         ids=[c[0] for c in ENGINE_CASES])
def test_gpu_plan_engine_bytes_match_the_engine(mxtrain, tmp_path, name, model, procs, sharding,
                                                seq, batch, policy, recipe, extra):
    settings = case_settings(model, sharding, seq, batch, policy, recipe, extra)
    # native bf16 GEMMs, as on the GPU (with bf16 activations: the bf16 path)
    env = {"MXTRAIN_TEST_DEVICE_MEMORY": "1", "MXTRAIN_TEST_BF16_GEMM": "1"}
    if name.endswith("-xt") or recipe == "nvfp4":
        env["MXTRAIN_TEST_FP8_OPS"] = "1"
    summary = train_mpi(tmp_path, procs, settings, env_extra=env)
    held = summary["device_mem_bytes"]
    held_max = summary.get("device_mem_bytes_max_rank", held)
    gpu = "b200" if recipe in ("nvfp4", "mxfp8") else "h200"  # planned only where they run
    eng = plan(mxtrain, settings, gpu=gpu, gpus=procs)["memory"]["engine"]
    assert held == held_max == eng["arena_bytes"], (held, held_max, eng)
    assert eng["arena_bytes"] == eng["fsdp_bytes"] + eng["activation_arena_bytes"] + \
        eng["amax_slot_bytes"]
    if recipe in ("fp8-current", "nvfp4"):  # the RMSNorms' two amax floats
        # and the weights' amaxes, a float a Linear (7 a block; tiny: 2 blocks)
        assert eng["amax_slot_bytes"] == 8 + 4 * 7 * 2, eng
    assert eng["total_bytes"] == eng["arena_bytes"] + eng["backend_scratch_bytes"] + \
        eng["allowance_bytes"]
    # The device arenas hold capacities, at least what the CPU run's arenas ever used.
    assert held >= summary["peak_mem_bytes"] - 4 * batch * (seq + 1) - 64
    if name.endswith("-xt"):  # the codes in place of the bf16 codes, exactly (tiny: 2 blocks)
        off = train_mpi(tmp_path / "off", procs, settings,
                        env_extra=dict(env, MXTRAIN_FP8_SAVE_XT="0"))["device_mem_bytes"]
        r64 = lambda n: (n + 63) // 64 * 64
        n_h, n_s = batch * seq * 64, batch * seq * 160
        scale = (lambda n: n // 32) if recipe == "mxfp8" else (lambda n: 4)
        assert off - held == 2 * sum(r64(2 * n) - r64(r64(n) + scale(n))
                                     for n in (n_h, n_h, n_s)), (off, held)


def test_gpu_plan_bf16_gathers_halve_the_grad_op_weight_slots(mxtrain):
    # llama3-8b on 8 ranks, grad-op (every block's gathered weights kept from forward to
    # backward): bf16 gathers hold each of the 32 blocks as codes. Bytes written out: a block
    # is 2C + 2C^2 + 2 kv C + 3 C I elements; its two RMSNorm weights lie in ranks 0 and 1
    # (post_attention_layernorm at C + 2C^2 + 2 kv C, past one shard), so the exchange sends C
    # elements a rank.
    C, I, kv, L, S = 4096, 14336, 1024, 32, 8
    r64 = lambda b: (b + 63) // 64 * 64
    padded = -(-(2 * C + 2 * C * C + 2 * kv * C + 3 * C * I) // S) * S
    assert C + 2 * C * C + 2 * kv * C >= padded // S
    fp32_slot = r64(4 * padded)
    bf16_slot = r64(2 * padded) + r64(4 * S * C) + r64(4 * 2 * C)
    settings = {"model.preset": "llama3-8b", "train.seq_len": 8192, "train.micro_batch": 2,
                "precision.recipe": "bf16", "precision.activations": "bf16",
                "memory.activation_checkpointing": "full", "parallel.sharding": "grad-op"}
    eng = {g: plan(mxtrain, dict(settings, **{"parallel.gather_dtype": g}), gpu="b200",
                   gpus=S, extra=["--recipes", "bf16"])["memory"]["engine"]
           for g in ("fp32", "auto", "bf16")}
    assert eng["auto"] == eng["bf16"]
    assert eng["fp32"]["fsdp_bytes"] - eng["auto"]["fsdp_bytes"] == L * (fp32_slot - bf16_slot)
    assert eng["fp32"]["activation_arena_bytes"] == eng["auto"]["activation_arena_bytes"]
    # Under an FP8 recipe the blocks' Linears quantize fp32 weights: auto gathers fp32.
    fp8 = {g: plan(mxtrain, dict(settings, **{"precision.recipe": "fp8-current",
                                              "parallel.gather_dtype": g}),
                   gpu="b200", gpus=S, extra=["--recipes", "fp8-current"])["memory"]["engine"]
           for g in ("fp32", "auto")}
    assert fp8["fp32"]["fsdp_bytes"] == fp8["auto"]["fsdp_bytes"]


def test_gpu_plan_says_when_this_engine_does_not_fit(mxtrain):
    # llama3-8b at seq 8192, 4 sequences per GPU, no checkpointing: the bf16-activation model
    # fits a B200 (docs/plan.md's table), this build's fp32 activations do not.
    settings = {"model.preset": "llama3-8b", "train.seq_len": 8192, "train.micro_batch": 4,
                "memory.activation_checkpointing": "none"}
    out = plan(mxtrain, settings, gpu="b200", gpus=8, extra=["--recipes", "bf16"])
    eng = out["memory"]["engine"]
    assert out["fits"] is True and eng["fits"] is False
    assert eng["total_bytes"] > out["memory"]["capacity_bytes"]
    assert any("this build's CUDA engine would need" in n for n in out["notes"]), out["notes"]
    # fp32 activations: the activation arenas hold more than the model's bf16 peak.
    assert eng["activation_arena_bytes"] > out["memory"]["breakdown"]["activations"]
    out = plan(mxtrain, dict(settings, **{"train.micro_batch": 1,
                                          "memory.activation_checkpointing": "full"}),
               gpu="b200", gpus=8)
    assert out["memory"]["engine"]["fits"] is True
    # --memory engine: fits and the recommendation go by this engine's bytes.
    model = plan(mxtrain, settings, gpu="b200", gpus=8, extra=["--recipes", "bf16"])
    eng = plan(mxtrain, settings, gpu="b200", gpus=8, extra=["--recipes", "bf16", "--memory", "engine"])
    assert model["memory_basis"] == "model" and eng["memory_basis"] == "engine"
    assert eng["fits"] is False and eng["memory"]["engine"]["fits"] is False
    rec = eng["recommendation"]
    assert rec["found"] is True and rec["memory"]["engine"]["fits"] is True
    assert rec["memory_total_bytes"] == rec["memory"]["engine"]["total_bytes"] <= \
        rec["memory"]["capacity_bytes"]
    # The model's recommendation (4 sequences, no checkpointing) would not fit this engine.
    assert model["recommendation"]["memory"]["engine"]["fits"] is False
    assert (rec["micro_batch"], rec["activation_checkpointing"]) != \
        (model["recommendation"]["micro_batch"], model["recommendation"]["activation_checkpointing"])


def test_bad_cuda_scratch_setting_exits_2():
    from conftest import run_mxtrain
    for value in ("lots", "-5", "0", "12x"):
        r = run_mxtrain(["plan", "--gpu", "h200", "--gpus", "1", "--json"],
                        env={"MXTRAIN_CUDA_SCRATCH_MB": value})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), (value, r)
        assert "MXTRAIN_CUDA_SCRATCH_MB" in lines[0]
    r = run_mxtrain(["plan", "--gpu", "h200", "--gpus", "1", "--json"],
                    env={"MXTRAIN_CUDA_SCRATCH_MB": "256"})
    assert r.rc == 0 and json.loads(r.stdout)["memory"]["engine"]["backend_scratch_bytes"] == \
        256 << 20


def test_cuda_head_chunk_setting(mxtrain):
    """MXTRAIN_CUDA_HEAD_CHUNK_MB sizes the GPU head's fp32 logits chunk, and the plan counts it:
    at llama3-8b's head-bound peak, 1024 MiB instead of 256 adds at least the extra rows' fp32
    logits (floor(MiB * 2^20 / 4 / V) rows each). Bad values: one error line, exit 2."""
    from conftest import run_mxtrain
    for value in ("lots", "-5", "0", "15", "65537", "12x", ""):
        r = run_mxtrain(["plan", "--gpu", "h200", "--gpus", "1", "--json"],
                        env={"MXTRAIN_CUDA_HEAD_CHUNK_MB": value})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), (value, r)
        assert "MXTRAIN_CUDA_HEAD_CHUNK_MB" in lines[0]
    settings = {"model.preset": "llama3-8b", "train.seq_len": 8192, "train.micro_batch": 4}
    total = {}
    for mib in (256, 1024):
        r = run_mxtrain(["plan", "--gpu", "b200", "--gpus", "8", "--json"] + set_args(settings),
                        env={"MXTRAIN_CUDA_HEAD_CHUNK_MB": str(mib)})
        assert r.rc == 0, r
        total[mib] = json.loads(r.stdout)["memory"]["total_bytes"]
    V = 128256
    rows = {mib: (mib << 20) // 4 // V for mib in (256, 1024)}
    assert total[1024] - total[256] >= (rows[1024] - rows[256]) * V * 4


def test_eval_forward_is_in_the_peak(mxtrain, tmp_path):
    """With validation on, the plan takes the max of the training step and the eval forward."""
    settings = {"model.preset": "tiny", "train.micro_batch": 2, "train.seq_len": 64,
                "train.eval_every": 1}
    out = plan(mxtrain, settings)
    assert out["memory"]["exact"] is True
    run = dict(settings)
    run.update({"train.steps": 1, "data.format": "random", "run.sample_tokens": 0,
                "run.out_dir": str(tmp_path / "run")})
    r = mxtrain(["train"] + set_args(run))
    assert r.rc == 0, r
    _, summary = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert abs(out["memory"]["total_bytes"] - summary["peak_mem_bytes"]) <= \
        TOLERANCE * summary["peak_mem_bytes"]


def test_json_contract_and_recommendation(mxtrain):
    out = plan(mxtrain, {"model.preset": "llama3-8b", "train.seq_len": 8192,
                         "train.micro_batch": 4}, gpu="b200", gpus=8)
    for key in ("fits", "memory", "tokens_per_s", "mfu", "recommendation"):
        assert key in out, key
    assert isinstance(out["fits"], bool)
    assert out["memory"]["total_bytes"] == sum(out["memory"]["breakdown"].values())
    assert out["tokens_per_s"] > 0 and 0 < out["mfu"] < 1
    rec = out["recommendation"]
    for key in ("micro_batch", "seq_len", "activation_checkpointing", "sharding", "recipe",
                "reasons"):
        assert key in rec, key
    assert rec["seq_len"] == 8192
    assert rec["fits"] is True and rec["memory_total_bytes"] <= out["gpu"]["memory_bytes"]
    assert rec["reasons"] and all(isinstance(s, str) for s in rec["reasons"])
    assert rec["micro_batch"] * rec["grad_accum"] == 4


def test_fp8_attention_is_planned_from_the_config(mxtrain):
    """precision.fp8_attention reaches the time model from the config: the blocks outside
    high_precision_first / last, faster attention, the same GEMMs and memory; a recipe-fp32
    config with it is refused as train refuses it."""
    base = {"model.preset": "llama3.2-1b", "train.seq_len": 8192, "train.micro_batch": 2,
            "precision.recipe": "fp8-delayed", "precision.high_precision_last": 1}
    off = plan(mxtrain, base, gpu="h200", gpus=8)
    on = plan(mxtrain, dict(base, **{"precision.fp8_attention": True}), gpu="h200", gpus=8)
    assert on["config"]["fp8_attention"] is True and off["config"]["fp8_attention"] is False
    assert on["time"]["fp8_attention_blocks"] == 15 and off["time"]["fp8_attention_blocks"] == 0
    assert on["time"]["attention_s"] < off["time"]["attention_s"]
    assert on["time"]["gemm_s"] == off["time"]["gemm_s"]
    assert on["memory"]["total_bytes"] == off["memory"]["total_bytes"]
    assert on["tokens_per_s"] > off["tokens_per_s"]
    text = mxtrain(["plan", "--gpu", "h200", "--gpus", "8"] +
                   set_args(dict(base, **{"precision.fp8_attention": True})))
    assert text.rc == 0 and "attention in FP8 (precision.fp8_attention) in 15 of 16" in text.stdout
    assert "precision.fp8_attention is MODELLED" in text.stdout
    assert "codes take" not in text.stdout
    # 64b at seq 32768: one sequence's backward codes, 4 T (q_dim + kv_dim) bytes = 4 x 32768 x
    # (8192 + 1024) = 1.125 GiB, pass half the default 1 GiB scratch arena: the note says so
    # and what MXTRAIN_CUDA_SCRATCH_MB avoids it (twice the codes, in MiB: 2304)
    long = mxtrain(["plan", "--gpu", "b300", "--gpus", "8"] + set_args(
        {"model.preset": "64b", "train.seq_len": 32768, "train.micro_batch": 1,
         "precision.recipe": "fp8-delayed", "precision.fp8_attention": True}))
    assert long.rc == 0 and "one sequence's FP8 codes take 1.1 GiB" in long.stdout
    assert "MXTRAIN_CUDA_SCRATCH_MB=2304 or more" in long.stdout
    bad = mxtrain(["plan", "--gpu", "cpu", "--gpus", "1", "--set", "precision.fp8_attention=true"])
    assert bad.rc == 2 and "error: precision.fp8_attention" in bad.stderr


def test_fp8_head_is_planned_from_the_config(mxtrain, tmp_path):
    """precision.fp8_head reaches the time model from the config (faster head GEMMs, their
    casts in the memory-bound time) and, on the CPU, the replay that predicts the engine's
    peak: the head's workspace with the FP8 layout, exact against a training step."""
    base = {"model.preset": "llama3.2-1b", "train.seq_len": 8192, "train.micro_batch": 2,
            "precision.recipe": "fp8-delayed"}
    off = plan(mxtrain, base, gpu="h200", gpus=8)
    on = plan(mxtrain, dict(base, **{"precision.fp8_head": True}), gpu="h200", gpus=8)
    assert on["config"]["fp8_head"] is True and off["config"]["fp8_head"] is False
    assert on["time"]["fp8_head"] is True and off["time"]["fp8_head"] is False
    assert on["time"]["gemm_s"] < off["time"]["gemm_s"]
    assert on["time"]["memory_bound_s"] > off["time"]["memory_bound_s"]
    assert on["time"]["attention_s"] == off["time"]["attention_s"]
    assert on["tokens_per_s"] > off["tokens_per_s"]
    text = mxtrain(["plan", "--gpu", "h200", "--gpus", "8"] +
                   set_args(dict(base, **{"precision.fp8_head": True})))
    assert text.rc == 0 and "head GEMMs in FP8 (precision.fp8_head)" in text.stdout
    assert "precision.fp8_head is MODELLED" in text.stdout
    bad = mxtrain(["plan", "--gpu", "cpu", "--gpus", "1", "--set", "precision.fp8_head=true"])
    assert bad.rc == 2 and "error: precision.fp8_head" in bad.stderr
    # The CPU engine: an odd shape (111 tokens, vocabulary 300), where the head's workspace
    # with FP8 operand copies is the step's peak.
    settings = {"model.preset": "tiny", "model.hidden_size": 96, "model.intermediate_size": 200,
                "model.num_attention_heads": 6, "model.num_key_value_heads": 2,
                "model.vocab_size": 300, "train.micro_batch": 3, "train.seq_len": 37,
                "precision.recipe": "fp8-current", "precision.fp8_head": True}
    assert_plan_matches_one_step(mxtrain, tmp_path, settings)


def test_fits_flips_with_micro_batch_on_h100(mxtrain):
    fits = []
    for mb in (1, 2, 4, 8):
        out = plan(mxtrain, {"model.preset": "llama3-8b", "train.seq_len": 8192,
                             "train.micro_batch": mb,
                             "memory.activation_checkpointing": "none"}, gpu="h100", gpus=8)
        fits.append(out["fits"])
    assert fits[0] is True and fits[-1] is False, fits
    assert fits == sorted(fits, reverse=True), fits  # once it stops fitting it stays so


def test_checkpointing_reason_when_none_does_not_fit(mxtrain):
    out = plan(mxtrain, {"model.preset": "14b", "train.seq_len": 8192, "train.micro_batch": 1,
                         "memory.activation_checkpointing": "none"}, gpu="h100", gpus=8,
               extra=["--recipes", "bf16"])
    assert out["fits"] is False
    rec = out["recommendation"]
    assert rec["activation_checkpointing"] in ("selective", "full")
    assert any("activation checkpointing" in s and "needs" in s for s in rec["reasons"]), rec


def test_64b_answers_quickly(mxtrain):
    import time
    t0 = time.monotonic()
    out = plan(mxtrain, {"model.preset": "64b", "train.seq_len": 8192}, gpu="b300", gpus=8)
    assert time.monotonic() - t0 < 5
    assert out["recommendation"]["found"] is True


@pytest.mark.parametrize("args", [
    ["--gpu", "a100", "--gpus", "8"],
    ["--gpu", "h100", "--gpus", "0"],
    ["--gpu", "h100", "--gpus", "16"],
    ["--gpu", "h100", "--gpus", "8", "--nodes", "0"],
    ["--gpu", "h100", "--gpus", "8", "--set", "train.micro_batch=0"],
    ["--gpu", "h100", "--gpus", "8", "--set", "precision.recipe=fp6"],
    ["--gpu", "h100", "--gpus", "8", "--set", "precision.recipe=nvfp4"],
    ["--gpu", "cpu", "--gpus", "1", "--set", "precision.recipe=fp6"],
    ["--gpu", "cpu", "--gpus", "3", "--set", "parallel.sharding=hybrid",
     "--set", "parallel.shard_group=2"],
    ["--gpu", "h100", "--gpus", "8", "--nodes", "2", "--set", "parallel.sharding=hybrid",
     "--set", "parallel.shard_group=3"],
    ["--gpu", "h100", "--gpus", "8", "--set", "model.preset=7b"],
    ["--gpu", "h100", "--gpus", "eight"],
    ["--gpu", "h100", "--gpus", "8", "--memory", "device"],
    ["--gpu", "h100", "--gpus", "8", "--recipes", "bf16,"],  # an empty last item, as "bf16,,x"
    ["--gpu", "h100", "--gpus", "8", "--recipes", "bf16,,fp8-current"],
])
def test_bad_input_exits_2(mxtrain, args):
    r = mxtrain(["plan"] + args)
    assert r.rc == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r


def test_recipe_from_config_file_as_train_reads_it(mxtrain, tmp_path):
    """precision.recipe (and high_precision_*) come from --config like `train`, and the JSON
    speaks the config's names: on cpu the recipe's operand copies are in the memory, on GPUs
    the recipe's model is used and the recommendation picks among the same names."""
    cfg = tmp_path / "run.toml"
    cfg.write_text('[model]\npreset = "tiny"\n[train]\nseq_len = 64\nmicro_batch = 2\n'
                   'eval_every = 0\n[precision]\nrecipe = "mxfp8"\nhigh_precision_first = 1\n')
    out = plan(mxtrain, {}, extra=["--config", cfg])
    assert out["config"]["recipe"] == "mxfp8" and out["memory"]["exact"] is True
    fp32 = plan(mxtrain, {"precision.recipe": "fp32"}, extra=["--config", cfg])
    assert fp32["config"]["recipe"] == "fp32"
    assert fp32["memory"]["total_bytes"] < out["memory"]["total_bytes"]  # the operand copies
    # No block quantized: with an fp32 head and high-precision blocks, no copies at all; with
    # the default bf16 ones, the rounded operand copies and the head's.
    both = plan(mxtrain, {"precision.high_precision_first": 2,
                          "precision.high_precision": "fp32"}, extra=["--config", cfg])
    assert both["config"]["high_precision"] == "fp32"
    assert both["memory"]["total_bytes"] == fp32["memory"]["total_bytes"]
    hp = plan(mxtrain, {"precision.high_precision_first": 2}, extra=["--config", cfg])
    assert hp["config"]["high_precision"] == "bf16" and out["config"]["high_precision"] == "bf16"
    assert fp32["config"]["high_precision"] == "fp32"
    assert hp["memory"]["total_bytes"] > fp32["memory"]["total_bytes"]
    names = {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "nvfp4"}
    assert out["recommendation"]["recipe"] in names
    gpu = plan(mxtrain, {"model.preset": "llama3-8b", "train.seq_len": 8192,
                         "precision.recipe": "fp8-block"}, gpu="b200", gpus=8)
    assert gpu["config"]["recipe"] == "fp8-block" and gpu["config"]["recipe_modelled"] is True
    assert gpu["recommendation"]["recipe"] in names - {"fp32"}
    # fp8-block's GPU constants were measured on an H200 (docs/plan.md, Calibration); mxfp8's
    # were not (it has not run on a GPU), and the CPU engine's recipes are not modelled at all
    assert gpu["config"]["recipe_calibrated"] is True
    mx = plan(mxtrain, {"model.preset": "llama3-8b", "train.seq_len": 8192,
                        "precision.recipe": "mxfp8"}, gpu="b200", gpus=8)
    assert mx["config"]["recipe_calibrated"] is False and mx["config"]["recipe_modelled"] is True
    assert out["config"]["recipe_calibrated"] is False


def test_memory_engine_on_cpu_says_it_changes_nothing(mxtrain):
    """`--memory engine` on cpu was accepted without a word; on cpu every figure already is the
    engine's own allocation, so the plan is the same and a note says why."""
    s = {"model.preset": "tiny", "train.seq_len": 64, "train.micro_batch": 2}
    model, engine = plan(mxtrain, s), plan(mxtrain, s, extra=["--memory", "engine"])
    for out in (model, engine):
        out["memory"].pop("capacity_bytes")  # the machine's free memory, read at each run
    assert engine["memory"] == model["memory"]
    assert engine["recommendation"]["micro_batch"] == model["recommendation"]["micro_batch"]
    said = [n for n in engine["notes"] if n.startswith("--memory engine")]
    assert len(said) == 1 and "changes nothing" in said[0], engine["notes"]
    assert not [n for n in model["notes"] if n.startswith("--memory engine")]


def test_cpu_processes_share_the_machine_memory(mxtrain):
    """`--gpu cpu --gpus N` is N processes on this machine, sharing one MemAvailable: a rank's
    total was checked against all of it, so 4 x 10 GiB 'fit' in 21 GiB, and the recommendation
    took such a configuration. Now each process has its share."""
    s = {"model.preset": "125m", "train.seq_len": 1024, "train.micro_batch": 16}
    for procs in (1, 4):
        out = plan(mxtrain, s, gpus=procs)
        machine = out["gpu"]["memory_bytes"]
        mem = out["memory"]
        assert mem["capacity_bytes"] == int(machine / procs), (procs, mem, machine)
        assert out["fits"] == (procs * mem["total_bytes"] <= machine), (procs, out["fits"])
        rec = out["recommendation"]
        if rec["fits"]:
            assert procs * rec["memory_total_bytes"] <= machine, (procs, rec)


def test_hybrid_default_shard_group_is_every_rank_as_train_runs_it(mxtrain, tmp_path):
    """parallel.sharding = hybrid with shard_group = 0 (the default): train shards over every
    rank (parallel/fsdp_sizes.cpp), so 4 processes hold a quarter each; the planner took 0 for
    the GPUs of a node and, for 2 nodes x 2, predicted halves. Plan must predict the peak that
    `mpirun -np 4 mxtrain train` measures, however the 4 ranks are spread over nodes."""
    settings = case_settings(TINY, "hybrid", 32, 1, "none", "fp32", {})
    summary = train_mpi(tmp_path, 4, settings)
    measured_max = summary.get("peak_mem_bytes_max_rank", summary["peak_mem_bytes"])
    for gpus, nodes in ((4, 1), (2, 2), (1, 4)):
        mem = plan(mxtrain, settings, gpus=gpus, nodes=nodes)["memory"]
        assert mem["shards"] == 4, (gpus, nodes, mem["shards"])
        # the CPU replay is exact: the bytes, not a tolerance
        assert mem["total_bytes_max_rank"] == measured_max, (gpus, nodes, mem, measured_max)


def test_stray_shard_group_under_full_does_not_abort_the_plan(mxtrain):
    """train ignores parallel.shard_group unless sharding = hybrid; plan on 2 nodes tried a
    hybrid candidate in groups of 3 and exited 2 ("must divide the number of ranks (16)")."""
    settings = {"model.preset": "tiny", "parallel.sharding": "full", "parallel.shard_group": 3}
    out = plan(mxtrain, settings, gpu="h100", gpus=8, nodes=2)
    assert out["config"]["sharding"] == "full" and out["memory"]["shards"] == 16, out["config"]
    best = out["recommendation"]
    assert best["found"], best
    if best["sharding"] == "hybrid":
        assert 16 % best["shard_group"] == 0, best
    # the same search as without the stray key: no candidate dropped
    plain = plan(mxtrain, dict(settings, **{"parallel.shard_group": 0}), gpu="h100", gpus=8,
                 nodes=2)
    assert best["candidates"] == plain["recommendation"]["candidates"]
    # the user's own hybrid configuration is still evaluated as given: 3 does not divide 16
    r = mxtrain(["plan", "--gpu", "h100", "--gpus", 8, "--nodes", 2, "--json"] +
                set_args(dict(settings, **{"parallel.sharding": "hybrid"})))
    assert r.rc == 2 and r.stderr.strip().startswith("error:") and "(16)" in r.stderr, r
