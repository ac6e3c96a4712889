"""Checks on the checkers: the PyTorch reference against a second, loop-by-loop numpy Llama, and
hf_io against hand-assembled safetensors bytes. These need no mxtrain binary."""
import json
import math
import struct

import numpy as np
import pytest

import hf_io
import llama_ref


def numpy_llama_loss(params, cfg, tokens):
    """Scalar loops over batch, position and head; RoPE by explicit pair rotation (j, j + D/2)."""
    P = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    tokens = np.asarray(tokens)
    B, T1 = tokens.shape
    T = T1 - 1

    def norm(x, w):
        return x / math.sqrt(float(np.mean(x * x)) + eps) * w

    def rope(vec, t):
        out = vec.copy()
        for j in range(D // 2):
            ang = t * theta ** (-2.0 * j / D)
            a, b = vec[j], vec[j + D // 2]
            out[j] = a * math.cos(ang) - b * math.sin(ang)
            out[j + D // 2] = b * math.cos(ang) + a * math.sin(ang)
        return out

    total = 0.0
    for bi in range(B):
        xs = [P["model.embed_tokens.weight"][tokens[bi, t]].copy() for t in range(T)]
        for l in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            hs = [norm(x, P[pre + "input_layernorm.weight"]) for x in xs]
            qs = [P[pre + "self_attn.q_proj.weight"] @ h for h in hs]
            ks = [P[pre + "self_attn.k_proj.weight"] @ h for h in hs]
            vs = [P[pre + "self_attn.v_proj.weight"] @ h for h in hs]
            new = []
            for t in range(T):
                heads = []
                for hd in range(H):
                    g = hd // (H // KV)
                    q = rope(qs[t][hd * D:(hd + 1) * D], t)
                    sc = np.array([q @ rope(ks[s][g * D:(g + 1) * D], s) / math.sqrt(D)
                                   for s in range(t + 1)])
                    w = np.exp(sc - sc.max())
                    w /= w.sum()
                    heads.append(sum(w[s] * vs[s][g * D:(g + 1) * D] for s in range(t + 1)))
                new.append(xs[t] + P[pre + "self_attn.o_proj.weight"] @ np.concatenate(heads))
            xs = new
            for t in range(T):
                h = norm(xs[t], P[pre + "post_attention_layernorm.weight"])
                gte = P[pre + "mlp.gate_proj.weight"] @ h
                up = P[pre + "mlp.up_proj.weight"] @ h
                act = gte / (1.0 + np.exp(-gte)) * up
                xs[t] = xs[t] + P[pre + "mlp.down_proj.weight"] @ act
        head = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
        for t in range(T):
            z = head @ norm(xs[t], P["model.norm.weight"])
            m = z.max()
            total += (m + math.log(np.exp(z - m).sum())) - z[tokens[bi, t + 1]]
    return total / (B * T)


@pytest.mark.parametrize("shape", [
    dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
         num_key_value_heads=2, vocab_size=50),
    dict(hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
         num_key_value_heads=2, vocab_size=30, tie_word_embeddings=True, rope_theta=500.0),
    dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=4,
         num_key_value_heads=1, head_dim=6, vocab_size=20, rms_norm_eps=1e-3),
])
def test_reference_matches_loop_implementation(shape):
    cfg = llama_ref.make_shape(**shape)
    params = llama_ref.random_params(cfg, seed=3, std=0.3)
    tokens = np.random.default_rng(4).integers(0, cfg["vocab_size"], size=(2, 9))
    ref, _ = llama_ref.loss_and_grads(params, cfg, tokens)
    loop = numpy_llama_loss(params, cfg, tokens)
    assert abs(ref - loop) <= 1e-10 * abs(loop), (ref, loop)


def test_reference_grads_match_finite_differences():
    cfg = llama_ref.make_shape(hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                               num_attention_heads=2, num_key_value_heads=1, vocab_size=11)
    params = llama_ref.random_params(cfg, seed=5, std=0.4)
    tokens = np.random.default_rng(6).integers(0, 11, size=(1, 6))
    _, grads = llama_ref.loss_and_grads(params, cfg, tokens)
    rng = np.random.default_rng(7)
    for name in params:
        idx = tuple(int(rng.integers(0, s)) for s in params[name].shape)
        hstep = 1e-6
        plus = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
        minus = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
        plus[name][idx] += hstep
        minus[name][idx] -= hstep
        fd = (numpy_llama_loss(plus, cfg, tokens) - numpy_llama_loss(minus, cfg, tokens)) / (2 * hstep)
        assert abs(fd - grads[name][idx]) <= 1e-6 + 1e-5 * abs(fd), (name, fd, grads[name][idx])


def test_safetensors_matches_spec_bytes(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, -1], dtype=np.int32)
    path = tmp_path / "x.safetensors"
    hf_io.write_safetensors(path, {"b": b, "a": a})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
    assert header["b"] == {"dtype": "I32", "shape": [2], "data_offsets": [24, 32]}
    body = raw[8 + n:]
    assert body == struct.pack("<6f", *range(6)) + struct.pack("<2i", 7, -1)
    back = hf_io.read_safetensors(path)
    assert np.array_equal(back["a"], a) and np.array_equal(back["b"], b)


def test_safetensors_reader_rejects_truncation(tmp_path):
    path = tmp_path / "x.safetensors"
    hf_io.write_safetensors(path, {"a": np.ones((4, 4), np.float32)})
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError):
        hf_io.read_safetensors(path)


def test_lr_schedule_formula():
    # warmup 2 of 10 steps, lr 1.0 -> 0.1: 0.5, 1.0, then cosine over 8 steps
    got = [llama_ref.lr_at(s, 10, 1.0, 0.1, 2) for s in range(10)]
    assert got[0] == 0.5 and got[1] == 1.0
    assert got[2] == pytest.approx(1.0)
    assert got[6] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))
    assert got[9] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 7 / 8)))
