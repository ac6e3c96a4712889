"""What a resumed or validated run reads and trains on.

The data a step reads is seen through its loss: with a learning rate of 1e-30 and no weight
decay the weights do not move, so each step's logged loss is the PyTorch reference's loss of the
checkpoint's weights on the windows that step read."""
import json

import numpy as np
import torch

import hf_io
import llama_ref
from conftest import english_text, read_metrics, set_args

T, WINDOWS = 16, 20
CFG_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "head_dim", "rope_theta", "rms_norm_eps",
            "tie_word_embeddings"]


def run1(mxtrain, args):
    return mxtrain(args, threads=1)


def frozen(tmp_path, **over):
    s = {"model.preset": "tiny", "train.seq_len": T, "run.out_dir": tmp_path / "run",
         "run.sample_tokens": 0, "train.eval_every": 0, "data.path": tmp_path / "d.txt",
         "data.format": "text", "data.val_fraction": 0, "data.shuffle": False,
         "train.lr": 1e-30, "train.min_lr": 0, "train.weight_decay": 0, "train.steps": 6}
    s.update(over)
    return ["train"] + set_args(s)


def test_a_resume_with_another_global_batch_continues_at_the_next_unread_sample(tmp_path,
                                                                                mxtrain):
    """3 steps of 2 samples, then resumed with 4 per step: steps 4-6 read samples 6-17 (windows
    6..17), not step x 4 = samples 12-23 (windows 12..19, 0..3), which skipped windows 6-11."""
    rng = np.random.default_rng(7)
    data = bytes(rng.integers(0, 256, WINDOWS * T + 4).astype(np.uint8))
    (tmp_path / "d.txt").write_bytes(data)
    r = run1(mxtrain, frozen(tmp_path, **{"train.micro_batch": 2, "checkpoint.every": 3,
                                          "train.steps": 3}))
    assert r.rc == 0, r
    step3 = tmp_path / "run" / "checkpoints" / "step_00000003"
    state = json.loads((step3 / "state.json").read_text())
    assert state["samples_seen"] == 6
    r = run1(mxtrain, frozen(tmp_path, **{"train.micro_batch": 4}))
    assert r.rc == 0, r
    assert "continue at sample 6" in r.stderr, r
    assert json.loads((tmp_path / "run" / "checkpoints" / "step_00000006" / "state.json")
                      .read_text())["samples_seen"] == 18

    c = json.loads((step3 / "config.json").read_text())
    cfg = llama_ref.make_shape(**{k: c[k] for k in CFG_KEYS})
    p = llama_ref.to_torch(hf_io.read_checkpoint_weights(str(step3)), requires_grad=False)
    tokens = torch.tensor(np.frombuffer(data, dtype=np.uint8).astype(np.int64))

    def ref_loss(windows):
        with torch.no_grad():
            return float(np.mean([float(llama_ref.loss_fn(
                p, cfg, tokens[w * T:w * T + T][None], tokens[w * T + 1:w * T + T + 1][None]))
                for w in windows]))
    steps, _ = read_metrics(tmp_path / "run" / "metrics.jsonl")
    resumed = [s for s in steps if s["step"] > 3][-3:]
    assert [s["step"] for s in resumed] == [4, 5, 6]
    for k, s in enumerate(resumed):
        want = ref_loss(range(6 + 4 * k, 10 + 4 * k))
        assert abs(s["loss"] - want) < 1e-5 * abs(want), (s["step"], s["loss"], want)


def test_validation_does_not_change_training_under_fp8_delayed(tmp_path, mxtrain):
    """Validation only reports: its forward quantizes with the training's scales and records no
    amax (its amaxes moved the next steps' fp8-delayed scales, so eval_every changed the weights
    from step 2 on)."""
    (tmp_path / "c.txt").write_text(english_text(6000))
    rank_files = []
    for e in (0, 1):
        out = tmp_path / f"e{e}"
        r = run1(mxtrain, ["train"] + set_args({
            "model.preset": "tiny", "data.path": tmp_path / "c.txt", "train.seq_len": 16,
            "train.micro_batch": 2, "train.steps": 4, "precision.recipe": "fp8-delayed",
            "train.eval_every": e, "run.out_dir": out, "run.sample_tokens": 0}))
        assert r.rc == 0, r
        if e:
            assert all("val_loss" in s for s in read_metrics(out / "metrics.jsonl")[0])
        rank_files.append((out / "checkpoints" / "step_00000004" /
                           "rank_00000-of-00001.safetensors").read_bytes())
    assert rank_files[0] == rank_files[1]


def test_validation_that_would_repeat_windows_says_so(tmp_path, mxtrain):
    (tmp_path / "c.txt").write_text(english_text(6000))
    r = run1(mxtrain, ["train"] + set_args({
        "model.preset": "tiny", "data.path": tmp_path / "c.txt", "train.seq_len": 16,
        "train.micro_batch": 8, "train.steps": 1, "train.eval_every": 1,
        "train.eval_batches": 8, "data.val_fraction": 0.03, "run.out_dir": tmp_path / "run",
        "run.sample_tokens": 0}))
    assert r.rc == 0, r
    assert "validation reads 64 windows" in r.stderr, r


def test_resume_warns_about_other_data_not_another_spelling_of_it(tmp_path, mxtrain):
    """A resume that reads another data file (or another seed) says so; the same file named
    another way (relative vs absolute, through a symlink) is the same data: no warning (the
    paths were compared as strings). Each resume continues from the previous run's step."""
    (tmp_path / "d.txt").write_text(english_text(3000))
    (tmp_path / "e.txt").write_text(english_text(3000)[::-1])
    (tmp_path / "link.txt").symlink_to(tmp_path / "d.txt")
    r = run1(mxtrain, frozen(tmp_path, **{"train.steps": 2, "checkpoint.every": 2}))
    assert r.rc == 0, r
    for i, (path, seed, warned) in enumerate([(tmp_path / "link.txt", None, False),
                                              (tmp_path / "e.txt", None, True),
                                              (tmp_path / "e.txt", 5, False)]):
        over = {"train.steps": 3 + i, "data.path": path}
        if seed is not None:
            over["train.seed"] = seed
        r = run1(mxtrain, frozen(tmp_path, **over))
        assert r.rc == 0 and f"at step {2 + i}" in r.stderr, r
        assert ("training goes on with the new data" in r.stderr) == warned, (path, r.stderr)
        assert ("train.seed is 5" in r.stderr) == (seed is not None), r.stderr


def test_resume_with_data_shuffle_changed_says_so(tmp_path, mxtrain):
    """data.shuffle turned on or off at a resume changes the rest of the epoch's order: it was
    not recorded in state.json and went by without a word (as a changed seed does not)."""
    (tmp_path / "d.txt").write_text(english_text(3000))
    r = run1(mxtrain, frozen(tmp_path, **{"train.steps": 2, "checkpoint.every": 2}))
    assert r.rc == 0, r
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_00000002" /
                        "state.json").read_text())
    assert state["shuffle"] is False
    for i, shuffle in enumerate([False, True]):
        r = run1(mxtrain, frozen(tmp_path, **{"train.steps": 3 + i, "data.shuffle": shuffle}))
        assert r.rc == 0 and f"at step {2 + i}" in r.stderr, r
        warned = [l for l in r.stderr.splitlines() if "data.shuffle is" in l]
        assert len(warned) == int(shuffle), r.stderr
        if shuffle:
            assert warned[0].startswith("warning:") and "used false" in warned[0], warned
