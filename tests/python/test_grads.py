"""`mxtrain debug grads` against the float64 PyTorch reference: loss and every parameter's gradient,
for several shapes and every activation-checkpointing policy."""
import numpy as np
import pytest

import hf_io
import llama_ref
from conftest import write_model, write_tokens_i32

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4  # relative to the tensor's max |reference value|

DEFAULT = dict(shape=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                          num_attention_heads=6, num_key_value_heads=2, vocab_size=300),
               batch=2, seq=37)
CASES = {
    "gqa_untied": DEFAULT,
    "tied": dict(shape=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                            tie_word_embeddings=True), batch=2, seq=31),
    "mha": dict(shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, vocab_size=200,
                           rope_theta=500000.0), batch=3, seq=20),
    "explicit_head_dim": dict(shape=dict(hidden_size=48, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=16, vocab_size=100,
                                         rms_norm_eps=1e-6), batch=2, seq=24),
    "three_layers_seq64": dict(shape=dict(hidden_size=64, intermediate_size=128,
                                          num_hidden_layers=3, num_attention_heads=4,
                                          num_key_value_heads=1, vocab_size=128),
                               batch=2, seq=64),
}


def make_case(tmp_path, case, seed=0, std=0.1):
    cfg = llama_ref.make_shape(**case["shape"])
    params = llama_ref.random_params(cfg, seed=seed, std=std)
    rng = np.random.default_rng(seed + 1000)
    tokens = rng.integers(0, cfg["vocab_size"], size=(case["batch"], case["seq"] + 1))
    model_dir = write_model(tmp_path / "model", cfg, params)
    tok_path = tmp_path / "tokens.bin"
    write_tokens_i32(tok_path, tokens)
    return cfg, params, tokens, model_dir, tok_path


def run_debug_grads(mxtrain, tmp_path, case, model_dir, tok_path, policy=None):
    out = tmp_path / f"grads_{policy or 'default'}.safetensors"
    args = ["debug", "grads", "--init", model_dir, "--tokens", tok_path,
            "--batch", case["batch"], "--seq", case["seq"], "--out", out]
    if policy:
        args += ["--checkpointing", policy]
    r = mxtrain(args)
    assert r.rc == 0, r
    return float(r.value("loss")), int(r.value("peak_mem_bytes")), hf_io.read_safetensors(out)


def check_against_reference(cfg, loss, grads, ref_loss, ref_grads):
    assert abs(loss - ref_loss) <= LOSS_RTOL * abs(ref_loss), (loss, ref_loss)
    expected = set(llama_ref.param_shapes(cfg))
    assert set(grads) == expected, (sorted(set(grads) - expected), sorted(expected - set(grads)))
    worst = []
    for name, ref in ref_grads.items():
        got = grads[name]
        assert got.dtype == np.float32, (name, got.dtype)
        assert got.shape == ref.shape, (name, got.shape, ref.shape)
        scale = float(np.abs(ref).max())
        assert scale > 0, name
        err = float(np.abs(got.astype(np.float64) - ref).max()) / scale
        worst.append((err, name))
    worst.sort(reverse=True)
    assert worst[0][0] <= GRAD_RTOL, f"worst relative gradient errors: {worst[:5]}"


@pytest.mark.parametrize("name", list(CASES))
def test_grads_match_pytorch(mxtrain, tmp_path, name):
    case = CASES[name]
    cfg, params, tokens, model_dir, tok_path = make_case(tmp_path, case)
    ref_loss, ref_grads = llama_ref.loss_and_grads(params, cfg, tokens)
    # The reference loss must be far from the trivial ln(V) so the weights matter.
    assert abs(ref_loss - np.log(cfg["vocab_size"])) > 0.01, ref_loss
    loss, _, grads = run_debug_grads(mxtrain, tmp_path, case, model_dir, tok_path)
    check_against_reference(cfg, loss, grads, ref_loss, ref_grads)


def test_checkpointing_policies_agree_and_save_memory(mxtrain, tmp_path):
    case = DEFAULT
    cfg, params, tokens, model_dir, tok_path = make_case(tmp_path, case, seed=11, std=0.15)
    ref_loss, ref_grads = llama_ref.loss_and_grads(params, cfg, tokens)
    results = {p: run_debug_grads(mxtrain, tmp_path, case, model_dir, tok_path, policy=p)
               for p in ("none", "selective", "full")}
    for policy, (loss, _, grads) in results.items():
        check_against_reference(cfg, loss, grads, ref_loss, ref_grads)
    base_loss, _, base = results["none"]
    for policy in ("selective", "full"):
        loss, _, grads = results[policy]
        assert abs(loss - base_loss) <= 1e-6 * abs(base_loss), (policy, loss, base_loss)
        for name, g in base.items():
            scale = float(np.abs(g).max())
            err = float(np.abs(grads[name].astype(np.float64) - g).max())
            assert err <= 1e-6 * scale, (policy, name, err / scale)
    peaks = {p: r[1] for p, r in results.items()}
    assert peaks["none"] > peaks["selective"] > peaks["full"] > 0, peaks
