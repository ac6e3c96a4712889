"""run.profile: each backend op's own time over the training steps after the first
(backend/op_profile.h). The time cannot be checked against a reference, so what is checked is
what exact arithmetic fixes: every GEMM FLOP of the steps lands on the `gemm` row (counted from
the model's shape, not from mxtrain), and no other op carries FLOPs (nested ops are not charged
to their callers); the call counts of the per-token ops follow from the layer count; validation
is left out; the profiled seconds are the profiled steps' step times and the rows never add up
to more; each logged step carries the profile so far."""
import math

import pytest

from conftest import english_text, read_metrics, require_binary, run_mxtrain, set_args

C, I, L, H, KV, V = 64, 160, 2, 4, 2, 256
D = C // H
SHAPE = {"model.hidden_size": C, "model.intermediate_size": I, "model.num_hidden_layers": L,
         "model.num_attention_heads": H, "model.num_key_value_heads": KV, "model.vocab_size": V,
         "model.tie_word_embeddings": False}
B, T, STEPS = 2, 32, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("corpus") / "english.txt"
    p.write_text(english_text(6000))
    return p


def train(tmp_path, corpus, **extra):
    require_binary()
    settings = dict(SHAPE)
    settings.update({"train.steps": STEPS, "train.micro_batch": B, "train.seq_len": T,
                     "train.log_every": 1, "train.eval_every": 2, "train.eval_batches": 2,
                     "data.path": corpus, "data.format": "text", "data.val_fraction": 0.2,
                     "run.out_dir": tmp_path / "run", "run.sample_tokens": 0,
                     "checkpoint.resume": "none"})
    settings.update(extra)
    r = run_mxtrain(["train"] + set_args(settings), timeout=120)
    return r, tmp_path / "run" / "metrics.jsonl"


def test_profile_charges_each_op_its_own_time_and_flops(tmp_path, corpus):
    r, metrics = train(tmp_path, corpus, **{"run.profile": True})
    assert r.rc == 0, r
    steps, summary = read_metrics(metrics)
    prof = summary["op_profile"]
    assert (prof["first_step"], prof["last_step"]) == (2, STEPS), prof
    profiled = STEPS - 1
    # the profiled wall time is those steps' step times, and the ops fit inside it
    want_s = sum(s["step_time_s"] for s in steps if s["step"] >= 2)
    assert math.isclose(prof["seconds"], want_s, rel_tol=1e-9), (prof["seconds"], want_s)
    ops = {o["op"]: o for o in prof["ops"]}
    assert sum(o["seconds"] for o in ops.values()) <= prof["seconds"] * (1 + 1e-9)
    # the table's "(outside backend ops)" row, in the JSON too
    assert math.isclose(prof["outside_ops_seconds"],
                        prof["seconds"] - sum(o["seconds"] for o in ops.values()),
                        rel_tol=1e-9, abs_tol=1e-12), prof
    # GEMMs: per step 7 Linears a block forward, 14 backward (dx and dW), and the head's 3 (one
    # chunk at 64 tokens); FLOPs 2 N in out per GEMM
    N = B * T
    linear = C * C + 2 * C * (KV * D) + C * C + 2 * C * I + I * C
    gemm_flops = 3 * 2 * N * (L * linear + V * C) * profiled
    g = ops["gemm"]
    assert g["calls"] == (21 * L + 3) * profiled, g
    assert math.isclose(g["gflops"] * 1e9 * g["seconds"], gemm_flops, rel_tol=1e-9), g
    for name, o in ops.items():  # the GEMMs inside the Linears and the head are gemm's alone
        if name != "gemm":
            assert o["gflops"] == 0, o
    # per-step counts fixed by the shape: 2 norms a block and the final one, each way;
    # attention once a block each way; no validation pass among them (eval_every 2)
    assert ops["rmsnorm_forward"]["calls"] == (2 * L + 1) * profiled, ops["rmsnorm_forward"]
    assert ops["rmsnorm_backward"]["calls"] == (2 * L + 1) * profiled
    assert ops["attention_forward"]["calls"] == L * profiled
    assert ops["attention_backward"]["calls"] == L * profiled
    assert ops["head_cross_entropy"]["calls"] == profiled
    assert "val" in steps[1] or "val_loss" in steps[1], steps[1]  # validation did run
    assert "profile of steps 2-4" in r.stderr and "(outside backend ops)" in r.stderr, r
    # a table, one op a line (a one-line escaping of log lines once printed it as one line)
    lines = r.stderr.splitlines()
    head = next(i for i, l in enumerate(lines) if "profile of steps 2-4" in l)
    table = lines[head + 1:head + 1 + len(ops)]
    assert "\\n" not in lines[head] and any(l.split()[:1] == ["gemm"] for l in table), lines[head:]
    # each logged step after the first carries the profile so far (a stopped run leaves one)
    assert "op_profile" not in steps[0]
    for s in steps[1:]:
        p = s["op_profile"]
        assert (p["first_step"], p["last_step"]) == (2, s["step"]), p
        done = s["step"] - 1
        g = {o["op"]: o for o in p["ops"]}["gemm"]
        assert g["calls"] == (21 * L + 3) * done, (s["step"], g)
    assert steps[-1]["op_profile"] == prof


def test_profile_off_one_step_and_bad_value(tmp_path, corpus):
    r, metrics = train(tmp_path / "off", corpus)
    assert r.rc == 0, r
    assert "op_profile" not in read_metrics(metrics)[1]
    r, metrics = train(tmp_path / "one", corpus, **{"run.profile": True, "train.steps": 1})
    assert r.rc == 0, r
    prof = read_metrics(metrics)[1]["op_profile"]
    assert (prof["first_step"], prof["last_step"]) == (1, 1), prof
    assert prof["ops"] and prof["seconds"] > 0
    r, _ = train(tmp_path / "bad", corpus, **{"run.profile": "maybe"})
    assert r.rc == 2, r
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "run.profile" in lines[0], r
