"""Hugging Face model directories, generate and plan given odd input: what loads must compute what
the PyTorch reference computes from the same files, and what cannot be honoured is an `error:`
line with exit 2, never a silently different model or an internal error."""
import json
import os

import numpy as np
import pytest

import hf_io
import llama_ref
from conftest import english_text, set_args, tiny_checkpoint, write_model

CFG = llama_ref.make_shape(48, 96, 2, 4, 2, 256)


def errors(r):
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


def model_dir(tmp_path, name, config_edit=None, params=None, cfg=CFG):
    d = write_model(tmp_path / name, cfg, params or llama_ref.random_params(cfg, 3, std=0.3))
    if config_edit:
        c = json.loads((d / "config.json").read_text())
        config_edit(c)
        (d / "config.json").write_text(json.dumps(c))
    return d


def generate(mxtrain, d, prompt, n):
    return mxtrain(["generate", "--model", d, "--prompt", prompt, "--max-tokens", n,
                    "--temperature", "0"])


def test_a_generated_zero_byte_does_not_cut_the_text(tmp_path, mxtrain):
    """Byte 0 is a token like any other: the text after it (and the train sample's closing line)
    was lost to printf's %s."""
    params = llama_ref.random_params(CFG, 3, std=0.3)
    params["model.norm.weight"] = np.zeros_like(params["model.norm.weight"])  # all logits 0
    d = model_dir(tmp_path, "m", params=params)
    want = llama_ref.greedy_generate(params, CFG, list(b"Hi "), 12)
    assert want == [0] * 12  # the reference's argmax takes the first of equal logits
    r = generate(mxtrain, d, "Hi ", 12)
    assert r.rc == 0, r
    assert r.stdout == "Hi " + "\0" * 12 + "\n"


def test_rope_parameters_of_newer_configs_are_read(tmp_path, mxtrain):
    """transformers 5 writes rope_theta inside rope_parameters: its theta was ignored (10000
    used); any rope_type but 'default' is scaling, which is refused as rope_scaling is."""
    cfg = dict(CFG, rope_theta=500000.0)
    params = llama_ref.random_params(CFG, 3, std=0.3)
    params["lm_head.weight"][128:] = 0  # logit 0 for non-ASCII bytes: the text stays ASCII

    def v5(c):
        del c["rope_theta"]
        c["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}
    d = model_dir(tmp_path, "v5", v5, params=params)
    prompt = "hello world, "
    want = llama_ref.greedy_generate(params, cfg, list(prompt.encode()), 16)
    other = llama_ref.greedy_generate(params, CFG, list(prompt.encode()), 16)
    assert want != other  # theta matters to this model, so the check below can fail
    assert max(want) < 128
    r = generate(mxtrain, d, prompt, 16)
    assert r.rc == 0, r
    assert r.stdout == prompt + bytes(want).decode("ascii") + "\n"
    for name, edit, says in (
            ("yarn", lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                          "rope_theta": 10000.0}), "yarn"),
            ("clash", lambda c: c.update(rope_parameters={"rope_theta": 20000.0}), "rope_theta"),
            ("notobj", lambda c: c.update(rope_parameters=[1]), "rope_parameters"),
            # transformers rotates only this fraction of each head: it loaded and ran full RoPE
            ("partial", lambda c: c.update(partial_rotary_factor=0.5), "partial_rotary_factor"),
            ("rp_partial", lambda c: c.update(rope_parameters={
                "rope_type": "default", "partial_rotary_factor": 0.25}), "partial_rotary_factor")):
        r = generate(mxtrain, model_dir(tmp_path, name, edit), "hi", 4)
        assert r.rc == 2, r
        assert len(errors(r)) == 1 and says in errors(r)[0], r


@pytest.mark.parametrize("field,value", [("num_key_value_heads", 0), ("head_dim", 0),
                                         ("max_position_embeddings", -5)])
def test_config_fields_below_one_are_refused(tmp_path, mxtrain, field, value):
    """num_key_value_heads = 0 was read as 'as many as the heads' (so weights shaped for that
    loaded silently); a negative max_position_embeddings was taken."""
    d = model_dir(tmp_path, "m", lambda c: c.update({field: value}))
    r = generate(mxtrain, d, "hi", 4)
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and field in errors(r)[0], r


def test_a_config_larger_than_its_weights_is_refused_before_allocating(tmp_path):
    """config.json claiming a model far larger than its 40 KB of weights: generate and train's
    init.from filled the config's size with zeroes first (2 GB for 2048 x 128256), then named
    the shape; under a memory limit they said "out of memory" instead. The files are checked
    against the config before anything is sized by it: here under a 3 GiB address-space limit,
    for a config of about 10 GB of fp32 weights."""
    import resource
    import subprocess
    from conftest import MXTRAIN_BIN
    d = model_dir(tmp_path, "big", lambda c: c.update(hidden_size=4096, vocab_size=300000,
                                                      intermediate_size=8192))
    limit = 3 << 30

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for args in (["generate", "--model", d, "--prompt", "hi", "--max-tokens", "2"],
                 ["train", "--set", f"init.from={d}", "--set", "data.format=random",
                  "--set", "train.steps=1", "--set", "train.seq_len=8",
                  "--set", f"run.out_dir={tmp_path / 'o'}"]):
        r = subprocess.run([MXTRAIN_BIN] + [str(a) for a in args], capture_output=True,
                           text=True, timeout=120, env=env, preexec_fn=limited)
        lines = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert r.returncode == 2 and len(lines) == 1, (args[0], r.returncode, r.stderr)
        assert "model.embed_tokens.weight" in lines[0] and "has shape" in lines[0] and \
            "the config needs [300000,4096]" in lines[0], lines


def test_a_tensor_in_two_shards_is_refused(tmp_path, mxtrain):
    """The last file that held a tensor won, whatever the index said: a zeroed copy of the final
    norm in a second shard was used although the index names the first."""
    params = llama_ref.random_params(CFG, 3, std=0.3)
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_io.llama_config_dict(CFG)))
    hf_io.write_safetensors(d / "a.safetensors", {k: np.float32(v) for k, v in params.items()})
    hf_io.write_safetensors(d / "b.safetensors",
                            {"model.norm.weight": np.zeros(48, np.float32)})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": dict({k: "a.safetensors" for k in params},
                            **{"model.norm.weight": "a.safetensors"})}))
    # b.safetensors is not in the index: mxtrain reads only the files the index names
    r = generate(mxtrain, d, "hi", 4)
    assert r.rc == 0, r
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": dict({k: "a.safetensors" for k in params},
                            **{"model.embed_tokens.weight": "b.safetensors"})}))
    r = generate(mxtrain, d, "hi", 4)
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "model.norm.weight" in errors(r)[0], r
    # a NUL ends the name the file system sees: "a.safetensors\0x" opened a.safetensors
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: "a.safetensors\u0000x" for k in params}}))
    r = generate(mxtrain, d, "hi", 4)
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "NUL" in errors(r)[0], r


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused(tmp_path, mxtrain, bad):
    params = llama_ref.random_params(CFG, 3, std=0.3)
    params["model.layers.1.mlp.up_proj.weight"][5, 7] = bad
    d = model_dir(tmp_path, "m", params=params)
    r = generate(mxtrain, d, "hi", 4)
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "model.layers.1.mlp.up_proj.weight" in errors(r)[0], r
    assert "element 247" in errors(r)[0]  # row 5 x 48 columns + 7
    r = mxtrain(["train"] + set_args({"init.from": d, "train.steps": 1, "data.format": "random",
                                      "train.seq_len": 16, "train.micro_batch": 1,
                                      "run.out_dir": tmp_path / "run"}))
    assert r.rc == 2, r
    assert "non-finite" in errors(r)[0] and "diverged" not in r.stderr, r


def test_lengths_past_the_limits_are_errors_not_overflows(tmp_path, mxtrain):
    d = model_dir(tmp_path, "m")
    r = generate(mxtrain, d, "ab", 2**63 - 1)  # prompt + max-tokens overflowed: exit 1
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "positions" in errors(r)[0], r
    r = mxtrain(["train"] + set_args({"model.preset": "tiny", "data.format": "random",
                                      "run.sample_tokens": 2**63 - 1,
                                      "run.out_dir": tmp_path / "run"}))
    assert r.rc == 2, r
    assert "run.sample_tokens" in errors(r)[0] and "step 1/" not in r.stderr, r


@pytest.mark.parametrize("args,says", [
    (["--gpu", "b200", "--gpus", "8", "--nodes", "2147483647"], "ranks"),
    (["--gpu", "b200", "--gpus", "8", "--nodes", "99999999999"], "ranks"),
    (["--gpu", "cpu", "--gpus", "1048577"], "processes per node"),
    (["--gpu", "h100", "--gpus", "8", "--recipes", ",,"], "empty item"),
])
def test_plan_refuses_impossible_jobs(mxtrain, args, says):
    r = mxtrain(["plan"] + args + ["--set", "model.preset=tiny"])
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and says in errors(r)[0], r


def test_a_validation_share_that_starves_training_names_the_key(tmp_path, mxtrain):
    corpus = tmp_path / "c.txt"
    corpus.write_text(english_text(20000))
    r = mxtrain(["train"] + set_args({
        "model.preset": "tiny", "data.path": corpus, "train.seq_len": 32,
        "train.micro_batch": 2, "train.steps": 2, "data.val_fraction": 0.999,
        "run.out_dir": tmp_path / "run"}))
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "data.val_fraction" in errors(r)[0], r


@pytest.mark.parametrize("args", [
    ["generate", "--model", "MODEL", "--seed", "99999999999999999999"],
    ["generate", "--model", "MODEL", "--max-tokens", "-99999999999999999999"],
    ["plan", "--gpu", "b200", "--gpus", "8", "--nodes", "9223372036854775808"],
])
def test_integers_beyond_64_bits_are_errors_not_clamped(tmp_path, mxtrain, args):
    """CLI11 clamped them to 2^63 - 1 (every seed above it gave the same text)."""
    d = model_dir(tmp_path, "m")
    r = mxtrain([str(d) if a == "MODEL" else a for a in args])
    assert r.rc == 2, r
    assert len(errors(r)) == 1 and "out of range" in errors(r)[0], r
    assert r.stdout == ""


def test_token_ids_in_and_out_for_models_past_the_byte_vocabulary(tmp_path, mxtrain):
    """A model with a vocabulary past 256 (an HF Llama's tokenizer is not bytes) generated ids
    the byte-level text silently left out. Now `--ids` prints every id, `--prompt-ids` gives the
    prompt as ids (a vocabulary below 256 included), and the text says how many it left out."""
    cfg = llama_ref.make_shape(48, 96, 2, 4, 2, 400)
    params = llama_ref.random_params(cfg, 5, std=0.3)
    d = model_dir(tmp_path, "big", params=params, cfg=cfg)
    prompt = [3, 399, 17, 260]
    want = llama_ref.greedy_generate(params, cfg, prompt, 24)
    assert any(i >= 256 for i in want) and any(i < 256 for i in want)  # both kinds generated
    base = ["generate", "--model", d, "--max-tokens", 24, "--temperature", "0"]
    r = mxtrain(base + ["--prompt-ids", "3 399,17 260", "--ids"])
    assert r.rc == 0, r
    assert r.stdout == " ".join(str(i) for i in prompt + want) + "\n"
    r = mxtrain(base + ["--prompt-ids", "3,399,17,260"])
    assert r.rc == 0, r
    assert r.stdout.encode("utf-8", "surrogateescape") != b""
    beyond = sum(i >= 256 for i in want)
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1, r
    assert f"{beyond} of the 24 generated tokens and 2 of the 4 prompt tokens have ids >= 256" \
        in warns[0], r
    # a byte prompt, ids out: the prompt's bytes are its ids
    r = mxtrain(["generate", "--model", d, "--max-tokens", 3, "--temperature", "0", "--prompt",
                 "hi", "--ids"])
    assert r.rc == 0, r
    assert r.stdout.split()[:2] == ["104", "105"]
    assert [int(x) for x in r.stdout.split()[2:]] == llama_ref.greedy_generate(params, cfg, [104, 105], 3)
    # a vocabulary below the bytes works with ids, and is refused with text
    small = llama_ref.make_shape(48, 96, 2, 4, 2, 100)
    sp = llama_ref.random_params(small, 6, std=0.3)
    ds = model_dir(tmp_path, "small", params=sp, cfg=small)
    r = mxtrain(["generate", "--model", ds, "--prompt-ids", "7 99", "--ids", "--max-tokens", 5,
                 "--temperature", "0"])
    assert r.rc == 0, r
    assert [int(x) for x in r.stdout.split()] == [7, 99] + llama_ref.greedy_generate(sp, small, [7, 99], 5)
    r = mxtrain(["generate", "--model", ds, "--prompt", "hi"])
    assert r.rc == 2 and "--prompt-ids" in errors(r)[0], r
    # prompt ids past the bytes are counted too
    r = mxtrain(["generate", "--model", d, "--prompt-ids", "300 301 65", "--max-tokens", 4,
                 "--temperature", "0"])
    gen = llama_ref.greedy_generate(params, cfg, [300, 301, 65], 4)
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert r.rc == 0 and len(warns) == 1, r
    assert f"{sum(i >= 256 for i in gen)} of the 4 generated tokens and 2 of the 3 prompt" in warns[0]
    for bad, says in (("3 400", "400 is not below the model's vocab_size 400"), ("3 x", "not a list"),
                      ("-3", "not a list"), (" , ", "at least one"), ("", "at least one"),
                      ("99999999999999999999", "not a list")):
        r = mxtrain(["generate", "--model", d, "--prompt-ids", bad])
        assert r.rc == 2 and len(errors(r)) == 1 and says in errors(r)[0], (bad, r)
    r = mxtrain(["generate", "--model", d, "--prompt-ids", "3", "--prompt", "hi"])
    assert r.rc == 2 and len(errors(r)) == 1 and "excludes" in errors(r)[0].lower(), r


def test_top_k_keeps_the_tokens_tied_at_the_kth_logit(tmp_path, mxtrain):
    """Top-k kept exactly k tokens: of two tokens whose logits are equal (here every head row
    2j+1 is row 2j's copy) and the largest, --top-k 1 picked the lower id every time. Hugging
    Face's top-k filter removes only logits below the k-th, so both stay, each drawn about half
    the time (40 seeds: each at least 5 times unless the sampler ignores one, p < 1e-6)."""
    params = llama_ref.random_params(CFG, 3, std=0.3)
    head = params["lm_head.weight"]
    head[1::2] = head[0::2]
    d = model_dir(tmp_path, "dup", params=params)
    picks = []
    for seed in range(40):
        r = mxtrain(["generate", "--model", d, "--prompt-ids", "1 2", "--ids", "--max-tokens", 1,
                     "--temperature", 1, "--top-k", 1, "--seed", seed])
        assert r.rc == 0, r
        picks.append(int(r.stdout.split()[-1]))
    best = llama_ref.greedy_generate(params, CFG, [1, 2], 1)[0]  # the first of the tied pair
    assert best % 2 == 0 and set(picks) == {best, best + 1}, picks
    assert min(picks.count(best), picks.count(best + 1)) >= 5, picks


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_logits_that_overflow_are_named_not_sampled(tmp_path, mxtrain, temperature):
    """Finite weights whose head overflows float32 (rows of +-3e38): generate printed tokens
    picked from inf / NaN logits, exit 0. Now one error naming the logit, exit 2."""
    params = llama_ref.random_params(CFG, 3, std=0.3)
    params["lm_head.weight"][:] = np.sign(params["lm_head.weight"]) * np.float32(3e38)
    d = model_dir(tmp_path, "big", params=params)
    r = mxtrain(["generate", "--model", d, "--prompt-ids", "1 2", "--ids", "--max-tokens", 3,
                 "--temperature", temperature, "--top-k", 5])
    assert r.rc == 2 and len(errors(r)) == 1, r
    assert "logit" in errors(r)[0] and "position 2" in errors(r)[0], r


def test_a_step_without_its_manifest_is_named_not_committed(tmp_path, mxtrain):
    """A checkpoint step without manifest.json (its writer stopped before the commit) has a
    config.json of its own and was read as a Hugging Face directory: 'no model.safetensors'."""
    step = tiny_checkpoint(mxtrain, tmp_path / "run") / "step_00000001"
    (step / "manifest.json").unlink()
    r = mxtrain(["generate", "--model", step, "--prompt-ids", "1 2", "--ids",
                 "--max-tokens", 2])
    assert r.rc == 2 and len(errors(r)) == 1, r
    assert "not committed" in errors(r)[0] and "manifest.json" in errors(r)[0], r
