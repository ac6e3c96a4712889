"""`mxtrain plan` against the engine's measured peak memory (CPU, one process), plus the GPU
model's contract: JSON fields, fits flipping with micro_batch, bad input."""
import json

import numpy as np
import pytest

import llama_ref
from conftest import read_metrics, set_args, write_model, write_tokens_i32

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


@pytest.mark.parametrize("model,batch,seq,policy", TRAIN_CASES)
def test_cpu_plan_matches_train_peak(mxtrain, tmp_path, model, batch, seq, policy):
    settings = dict(model)
    settings.update({"train.micro_batch": batch, "train.seq_len": seq,
                     "memory.activation_checkpointing": policy})
    run = dict(settings)
    run.update({"train.steps": 1, "data.format": "random", "run.sample_tokens": 0,
                "run.out_dir": str(tmp_path / "run"), "train.eval_every": 0})
    r = mxtrain(["train"] + set_args(run))
    assert r.rc == 0, r
    steps, summary = read_metrics(tmp_path / "run" / "metrics.jsonl")
    measured = summary["peak_mem_bytes"]
    settings["train.eval_every"] = 0
    predicted = plan(mxtrain, settings)["memory"]["total_bytes"]
    err = abs(predicted - measured) / measured
    print(f"{model} B={batch} T={seq} {policy}: measured {measured} predicted {predicted} "
          f"error {err:.2e}")
    assert err <= TOLERANCE, (measured, predicted)


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
    ["--gpu", "cpu", "--gpus", "1", "--set", "precision.recipe=bf16"],
    ["--gpu", "h100", "--gpus", "8", "--nodes", "2", "--set", "parallel.sharding=hybrid",
     "--set", "parallel.shard_group=3"],
    ["--gpu", "h100", "--gpus", "8", "--set", "model.preset=7b"],
    ["--gpu", "h100", "--gpus", "eight"],
])
def test_bad_input_exits_2(mxtrain, args):
    r = mxtrain(["plan"] + args)
    assert r.rc == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r
