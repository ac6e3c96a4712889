"""Eight steps of `mxtrain train` against the same run in PyTorch: torch.optim.AdamW with decay / no
decay groups, clip_grad_norm_, warmup + cosine LR, grad accumulation, unshuffled windows."""
import numpy as np
import pytest

import llama_ref
from conftest import read_metrics, set_args, write_model

SHAPE = dict(hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=64)
STEPS, MICRO_BATCH, SEQ, GRAD_ACCUM = 8, 2, 16, 2
LR, MIN_LR, WARMUP, WEIGHT_DECAY = 3e-3, 3e-4, 2, 0.1
NUM_WINDOWS = 20  # fewer than the 32 samples the run reads, so the sampler wraps around


def make_tokens(seed):
    """A noisy repeating pattern (so training has something to learn) of n = W*T + 1 + 5 tokens."""
    rng = np.random.default_rng(seed)
    n = NUM_WINDOWS * SEQ + 1 + 5  # 5 spare tokens: W = (n-1)//T must still be NUM_WINDOWS
    base = rng.integers(0, SHAPE["vocab_size"], size=11)
    toks = np.array([base[i % 11] for i in range(n)])
    noise = rng.random(n) < 0.3
    toks[noise] = rng.integers(0, SHAPE["vocab_size"], size=int(noise.sum()))
    return toks


def micro_batches(tokens, step):
    """The contract: sample i = (s*grad_accum + m)*micro_batch + b reads window i % W."""
    W = (len(tokens) - 1) // SEQ
    out = []
    for m in range(GRAD_ACCUM):
        rows = []
        for b in range(MICRO_BATCH):
            w = ((step * GRAD_ACCUM + m) * MICRO_BATCH + b) % W
            rows.append(tokens[w * SEQ: w * SEQ + SEQ + 1])
        out.append(np.stack(rows))
    return out


def reference_run(params, cfg, tokens, grad_clip):
    tr = llama_ref.RefTrainer(params, cfg, lr=LR, min_lr=MIN_LR, warmup=WARMUP, steps=STEPS,
                              weight_decay=WEIGHT_DECAY, grad_clip=grad_clip)
    return [tr.step(micro_batches(tokens, s)) for s in range(STEPS)]


@pytest.mark.parametrize("tied,policy", [(False, "none"), (True, "full")])
def test_training_matches_pytorch(mxtrain, tmp_path, tied, policy):
    cfg = llama_ref.make_shape(**SHAPE, tie_word_embeddings=tied)
    params = llama_ref.random_params(cfg, seed=21, std=0.1)
    tokens = make_tokens(22)
    assert (len(tokens) - 1) // SEQ == NUM_WINDOWS

    # Pick a clip threshold that the unclipped run crosses on some steps but not all.
    free = reference_run(params, cfg, tokens, grad_clip=0.0)
    grad_clip = float(f"{np.median([r['grad_norm'] for r in free]):.4g}")
    ref = reference_run(params, cfg, tokens, grad_clip=grad_clip)
    clipped = sum(r["grad_norm"] > grad_clip for r in ref)
    assert 1 <= clipped < STEPS, ([r["grad_norm"] for r in ref], grad_clip)

    model_dir = write_model(tmp_path / "init", cfg, params)
    data = tmp_path / "tokens.u32"
    tokens.astype("<u4").tofile(data)
    metrics = tmp_path / "metrics.jsonl"
    config = tmp_path / "run.toml"
    config.write_text(
        f"""[train]
steps = {STEPS}
micro_batch = {MICRO_BATCH}
seq_len = {SEQ}
grad_accum = {GRAD_ACCUM}
lr = {LR}
min_lr = {MIN_LR}
warmup_steps = {WARMUP}
weight_decay = {WEIGHT_DECAY}
log_every = 1
eval_every = 0

[data]
path = "{data}"
format = "u32"
shuffle = false
val_fraction = 0.0

[init]
from = "{model_dir}"
""")
    r = mxtrain(["train", "--config", config] + set_args({
        "train.grad_clip": grad_clip,
        "memory.activation_checkpointing": policy,
        "run.name": "train_ref",
        "run.out_dir": tmp_path / "run",
        "run.metrics": metrics,
        "run.sample_tokens": 0,
    }))
    assert r.rc == 0, r
    steps, summary = read_metrics(metrics)
    assert summary is not None
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), [s["step"] for s in steps]
    report = []
    for got, want in zip(steps, ref):
        report.append((got["step"], got["loss"], want["loss"], got["lr"], want["lr"],
                       got["grad_norm"], want["grad_norm"]))
    for step, loss, rloss, lr, rlr, gn, rgn in report:
        assert abs(loss - rloss) <= 1e-4 * abs(rloss), ("loss", step, report)
        assert abs(lr - rlr) <= 1e-6 * abs(rlr), ("lr", step, report)
        assert abs(gn - rgn) <= 1e-3 * abs(rgn), ("grad_norm", step, report)
