"""The FP8 recipes (per-tensor; fp8-block and mxfp8 below) and nvfp4 through the backend's FP8 Linear ops
(Backend::fp8_linear_*), the path `run.device = cuda` takes on FP8 tensor cores, run here on the
CPU: MXTRAIN_TEST_FP8_OPS=1 makes the CPU backend offer those ops, whose CPU form is the recipe's
exact emulation with the same GEMM calls. So everything the model does around them (which
operand gets which format and scale, fp8-delayed's amax slots recorded into the histories later,
flushed before a key is reused under activation recompute, at the end of each micro-batch and
before the emulated path) must leave the run bit-identical to the emulated one: losses, gradient
norms and checkpoints (which hold every delayed scale and amax history). The CUDA forms of the
ops are checked against these CPU forms by tests/cuda/op_check.cu on a GPU."""
import json
import os
import subprocess

import pytest

from conftest import MXTRAIN_BIN, require_binary
from test_device import checkpoint_files, corpus


def train(tmp_path, name, fp8_ops, staged, extra, preset="tiny", seq=32, batch=4, env_extra=()):
    require_binary()
    out = tmp_path / name
    args = [MXTRAIN_BIN, "train", "--set", f"model.preset={preset}",
            "--set", f"data.path={corpus(tmp_path)}", "--set", "train.steps=12",
            "--set", f"train.seq_len={seq}", "--set", f"train.micro_batch={batch}",
            "--set", "train.warmup_steps=3", "--set", "train.grad_clip=0.5",
            "--set", "train.eval_every=0", "--set", "train.log_every=1",
            "--set", "checkpoint.every=6", "--set", f"run.out_dir={out}"] + list(extra)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MXTRAIN_TEST_STAGING="1" if staged else "0",
               MXTRAIN_TEST_FP8_OPS="1" if fp8_ops else "0", **dict(env_extra))
    p = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, f"{args}\n{p.stderr[-3000:]}"
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["step"], r["loss"], r["grad_norm"]) for r in records if not r.get("summary")]
    return steps, out, p.stderr


def shared_operands(out):
    """The run's count of FP8 operands taken from a kept quantization of a shared input."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines if '"summary"' in l][-1]["fp8_shared_operands"]


def expected_shares(layers, accum, ckpt, steps=12):
    """Exact count: per block and micro-batch, k and v take q's quantization of h1 and up takes
    gate's of h2, in forward (3) and in the weight gradients (3); full recompute runs the
    forward again (3 more). No validation runs (eval_every = 0)."""
    return layers * steps * accum * (6 + (3 if ckpt == "full" else 0))


def assert_ops_path_identical(tmp_path, extra, staged, ckpt_steps=(6, 12), ref_staged=None,
                              gemms="FP8", shares=None, env_extra=(), **shape):
    """Trains the emulated run and the ops run; losses, gradient norms and checkpoints equal.
    shares: the ops run's exact count of shared-input operands (the emulated run has none)."""
    ref, ref_out, ref_log = train(tmp_path, "emulated", False,
                                  staged if ref_staged is None else ref_staged, extra, **shape)
    got, got_out, got_log = train(tmp_path, "ops", True, staged, extra, env_extra=env_extra,
                                  **shape)
    assert "block Linears emulated" in ref_log
    assert f"block Linears on the backend's {gemms} GEMMs" in got_log
    assert len(ref) == 12 and got == ref
    for step in ckpt_steps:
        a, b = checkpoint_files(ref_out, step), checkpoint_files(got_out, step)
        assert a and a == b, f"checkpoint at step {step} differs"
    assert shared_operands(ref_out) == 0
    if shares is not None:
        assert shared_operands(got_out) == shares


@pytest.mark.parametrize("recipe,ckpt,staged,share", [
    ("fp8-current", "none", False, True),
    ("fp8-current", "none", False, False),  # MXTRAIN_FP8_SHARED_INPUT=0: every operand its own
    ("fp8-delayed", "none", False, True),
    ("fp8-delayed", "full", True, True),  # recompute: a key quantized twice per step; staged
])
def test_fp8_ops_path_is_identical(tmp_path, recipe, ckpt, staged, share):
    # q, k and v share h1's quantization, gate and up h2's (fp8-delayed: each Linear's amax
    # slot still receives the amax, or its history, and so the checkpoints, would differ).
    extra = ["--set", f"precision.recipe={recipe}",
             "--set", f"memory.activation_checkpointing={ckpt}", "--set", "train.grad_accum=2"]
    assert_ops_path_identical(tmp_path, extra, staged,
                              shares=expected_shares(2, 2, ckpt) if share else 0,
                              env_extra={} if share else {"MXTRAIN_FP8_SHARED_INPUT": "0"})


def test_fp8_ops_with_stats_steps_is_identical(tmp_path):
    # Telemetry steps take the emulated path (its quantize() calls feed the statistics), the
    # other steps the ops: fp8-delayed's histories must carry over between the two.
    extra = ["--set", "precision.recipe=fp8-delayed", "--set", "precision.stats_every=5"]
    ref, ref_out, _ = train(tmp_path, "emulated", False, False, extra)
    got, got_out, _ = train(tmp_path, "ops", True, False, extra)
    assert len(ref) == 12 and got == ref
    assert checkpoint_files(ref_out, 12) == checkpoint_files(got_out, 12)


def test_fp8_block_ops_path_is_identical(tmp_path):
    # fp8-block goes to the ops only when every Linear dimension is a multiple of 128 (cuBLASLt's
    # 1x128 / 128x128 scale modes): the small preset (384 / 1152 / kv 128) with 128 tokens.
    extra = ["--set", "precision.recipe=fp8-block", "--set", "train.grad_accum=2",
             "--set", "memory.activation_checkpointing=selective"]
    assert_ops_path_identical(tmp_path, extra, True, ckpt_steps=(12,), ref_staged=False,
                              preset="small", seq=64, batch=2,
                              shares=expected_shares(6, 2, "selective"))


@pytest.mark.parametrize("ckpt,staged,accum", [("none", False, 2), ("full", True, 1)])
def test_mxfp8_ops_path_is_identical(tmp_path, ckpt, staged, accum):
    # mxfp8 goes to the ops (cuBLASLt's VEC32_UE8M0 GEMMs on Blackwell) when every Linear
    # dimension is a multiple of 32: the tiny preset (64 / 160 / q 64 / kv 32) with 128 tokens.
    # Rowwise 1x32 and columnwise 32x1 copies each from the fp32 tensor, as the recipe does.
    extra = ["--set", "precision.recipe=mxfp8", "--set", f"train.grad_accum={accum}",
             "--set", f"memory.activation_checkpointing={ckpt}"]
    assert_ops_path_identical(tmp_path, extra, staged, shares=expected_shares(2, accum, ckpt))


@pytest.mark.parametrize("ckpt,staged,accum", [("none", False, 2), ("full", True, 1)])
def test_nvfp4_ops_path_is_identical(tmp_path, ckpt, staged, accum):
    # nvfp4 goes to the ops (cuBLASLt's FP4 GEMMs with VEC16_UE4M3 scales on Blackwell) when
    # every Linear dimension is a multiple of 32: the tiny preset with 128 tokens. The operands
    # must be cut and rounded as the emulation does: 1x16 blocks along the reduction, 16x16 for
    # the weight (transposed for the data gradient), stochastic rounding of the gradients from
    # the recipe's random stream of that (step, layer, linear, operand), and the weight
    # gradient's operands transposed and put through the RHT of that (layer, linear) first.
    # Full recompute quantizes a key twice a step; staged copies as on a GPU.
    extra = ["--set", "precision.recipe=nvfp4", "--set", f"train.grad_accum={accum}",
             "--set", f"memory.activation_checkpointing={ckpt}"]
    # q, k and v share h1's 1x16 quantization, gate and up h2's, in the forward (and its
    # recompute) only: the weight gradients' operands are each Linear's own transform
    assert_ops_path_identical(tmp_path, extra, staged, gemms="FP4",
                              shares=2 * 12 * accum * (3 if ckpt == "none" else 6))


def test_nvfp4_bf16_path_reads_the_codes(tmp_path):
    # The bf16 path (bf16 activations on native bf16 GEMMs, as on CUDA): nvfp4's Linears take
    # their inputs and output gradients as the bf16 codes the path keeps (Fp8Operand::bf16;
    # CUDA's 1x16 and Hadamard-transformed quantizers read them), where the emulation widens
    # each to fp32 first: the same values, so the same bits, and fewer widening ops in the
    # profile (the CPU's own bf16 ops widen too; test_cuda_emu.py's nvfp4 run has none left).
    extra = ["--set", "precision.recipe=nvfp4", "--set", "precision.activations=bf16",
             "--set", "run.profile=true"]
    env = {"MXTRAIN_TEST_BF16_GEMM": "1"}
    ref, ref_out, ref_log = train(tmp_path, "emulated", False, False, extra, env_extra=env)
    got, got_out, got_log = train(tmp_path, "ops", True, False, extra, env_extra=env)
    assert "block Linears emulated" in ref_log
    assert "block Linears on the backend's FP4 GEMMs" in got_log
    assert len(ref) == 12 and got == ref
    for step in (6, 12):
        a, b = checkpoint_files(ref_out, step), checkpoint_files(got_out, step)
        assert a and a == b, f"checkpoint at step {step} differs"
    def widenings(out):
        ops = summary_of(out)["op_profile"]["ops"]
        return sum(o["calls"] for o in ops if o["op"] == "unpack_bf16")
    assert widenings(got_out) < widenings(ref_out), (widenings(got_out), widenings(ref_out))


def test_bf16_path_shares_inputs(tmp_path):
    # The bf16 path (bf16 activations on native bf16 GEMMs, as on CUDA): the FP8 Linears read
    # h1 and h2 as bf16 codes (Fp8Operand::bf16), and the kept quantization is keyed by the
    # codes' pointer. Exact count, and the same run with sharing off gives the same bits (the
    # bits of this path against the rounding path: test_recipes.py).
    extra = ["--set", "precision.recipe=fp8-delayed", "--set", "precision.activations=bf16",
             "--set", "memory.activation_checkpointing=full"]
    on, on_out, _ = train(tmp_path, "on", True, False, extra,
                          env_extra={"MXTRAIN_TEST_BF16_GEMM": "1"})
    off, off_out, _ = train(tmp_path, "off", True, False, extra,
                            env_extra={"MXTRAIN_TEST_BF16_GEMM": "1",
                                       "MXTRAIN_FP8_SHARED_INPUT": "0"})
    assert len(on) == 12 and on == off
    assert checkpoint_files(on_out, 12) == checkpoint_files(off_out, 12)
    assert shared_operands(on_out) == expected_shares(2, 1, "full")
    assert shared_operands(off_out) == 0


def summary_of(out):
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(l) for l in lines if '"summary"' in l][-1]


def round64(n):
    return (n + 63) // 64 * 64


# fp8-block on the ops wants every width a multiple of 128 (tiny: 64 / 160 / kv 32)
BLOCK_WIDE = ["model.hidden_size=128", "model.intermediate_size=256", "model.num_key_value_heads=4"]


@pytest.mark.parametrize("recipe,sets", [
    ("fp8-delayed", []), ("fp8-current", []),
    # a block left in high precision and telemetry steps keep no x^T codes: their backward
    # recomputes the inputs' bf16 codes instead
    ("fp8-delayed", ["precision.high_precision_first=1", "precision.stats_every=3"]),
    # the block recipes keep the weight gradient's 32x1 / 128x1 codes and their block scales
    ("mxfp8", []), ("fp8-block", BLOCK_WIDE)])
def test_bf16_path_keeps_the_forwards_xt_codes(tmp_path, recipe, sets):
    # x^T's FP8 codes kept by the forward for the weight gradients of q, k, v (h1), gate, up
    # (h2) and down (SwiGLU's product) where policy none keeps those inputs (LlamaModel::
    # saves_xt): the bytes the backward would quantize from x, so the run and its checkpoints
    # (fp8-delayed's amax histories, the weight-gradient inputs' fed from the forward's amax)
    # equal the run with it off bit for bit. 6 operands a block and step; 0 when off.
    extra = ["--set", f"precision.recipe={recipe}", "--set", "precision.activations=bf16",
             "--set", "memory.activation_checkpointing=none"]
    for kv in sets:
        extra += ["--set", kv]
    blocks = recipe in ("mxfp8", "fp8-block")
    on, on_out, _ = train(tmp_path, "on", True, False, extra,
                          env_extra={"MXTRAIN_TEST_BF16_GEMM": "1"})
    off, off_out, _ = train(tmp_path, "off", True, False, extra,
                            env_extra={"MXTRAIN_TEST_BF16_GEMM": "1", "MXTRAIN_FP8_SAVE_XT": "0"})
    assert len(on) == 12 and on == off
    assert checkpoint_files(on_out, 12) == checkpoint_files(off_out, 12)
    saved_on, saved_off = summary_of(on_out), summary_of(off_out)
    assert saved_off["fp8_saved_xt_operands"] == 0
    if "precision.stats_every=3" in sets:  # (and the high-precision block)
        assert 0 < saved_on["fp8_saved_xt_operands"] < 6 * 12, saved_on
        return
    assert saved_on["fp8_saved_xt_operands"] == 6 * 2 * 12
    # The down projection's cast made s from SwiGLU's operands (Fp8Operand::swiglu_g) in each
    # block and step, the same bits as with s's codes written and read
    # (MXTRAIN_FP8_FUSE_SWIGLU=0); off with the kept codes off
    assert saved_on["fp8_fused_swiglu_inputs"] == 2 * 12
    assert saved_off["fp8_fused_swiglu_inputs"] == 0
    # and gate's and up's backward took dg's and du's operands from SwiGLU's backward
    # (Backend::fp8_swiglu_backward), kept codes or not
    assert saved_on["fp8_fused_swiglu_grads"] == saved_off["fp8_fused_swiglu_grads"] == 2 * 12
    unfused, unfused_out, _ = train(tmp_path, "unfused", True, False, extra,
                                    env_extra={"MXTRAIN_TEST_BF16_GEMM": "1",
                                               "MXTRAIN_FP8_FUSE_SWIGLU": "0"})
    assert unfused == on
    assert checkpoint_files(unfused_out, 12) == checkpoint_files(on_out, 12)
    saved_unfused = summary_of(unfused_out)
    assert saved_unfused["fp8_fused_swiglu_inputs"] == 0
    assert saved_unfused["fp8_fused_swiglu_grads"] == 0
    assert saved_unfused["fp8_saved_xt_operands"] == 6 * 2 * 12
    # The activations arena holds the codes (1 byte an element, a 4-byte scale, 64-byte
    # rounding; the block recipes' scales: fp8-block's 128x1 floats, mxfp8's 32x1 bytes, n / 32
    # bytes either way) in place of the bf16 codes (2 bytes): 4 x 32 tokens, 2 blocks, hidden
    # 64 and intermediate 160 (tiny) or 128 and 256.
    hidden, inter = (128, 256) if recipe == "fp8-block" else (64, 160)
    n_h, n_s = 128 * hidden, 128 * inter
    less = 2 * sum(round64(2 * n) - round64(round64(n) + (n // 32 if blocks else 4))
                   for n in (n_h, n_h, n_s))
    assert saved_off["peak_mem_bytes"] - saved_unfused["peak_mem_bytes"] == less, \
        (saved_unfused, saved_off)


def native_linears(hidden, inter, heads, kv_heads, tokens, multiple):
    """Which of a block's Linears (q, k, v, o, gate, up, down: (in, out) widths) have both
    widths and the token count multiples of `multiple`, worked out here from the shapes."""
    d = hidden // heads
    shapes = [(hidden, heads * d), (hidden, kv_heads * d), (hidden, kv_heads * d),
              (heads * d, hidden), (hidden, inter), (hidden, inter), (inter, hidden)]
    return [tokens % multiple == 0 and i % multiple == 0 and o % multiple == 0
            for i, o in shapes]


# (recipe, sets, the block's multiple, hidden, intermediate, kv heads, seq): tiny has 4 heads.
SHAPES = [
    ("fp8-block", [], 128, 64, 160, 2, 32),  # none: tiny's widths are below 128
    ("fp8-block", ["model.hidden_size=128", "model.intermediate_size=256"], 128, 128, 256, 2, 32),
    ("fp8-block", ["model.hidden_size=128", "model.intermediate_size=256",
                   "model.num_key_value_heads=4"], 128, 128, 256, 4, 32),
    ("fp8-current", ["train.seq_len=37"], 16, 64, 160, 2, 37),  # 4 x 37 tokens
    ("fp8-current", [], 16, 64, 160, 2, 32),
    ("mxfp8", ["model.intermediate_size=176"], 32, 64, 176, 2, 32),  # gate, up, down: 176
]


@pytest.mark.parametrize("recipe,sets,multiple,hidden,inter,kv,seq", SHAPES)
def test_startup_line_says_which_linears_take_the_fp8_gemms(tmp_path, recipe, sets, multiple,
                                                           hidden, inter, kv, seq):
    """The trainer's start-up line reports, for the run's shape, how many of a block's Linears
    the backend's FP8 GEMMs take (each width and the tokens of a micro-batch a multiple of the
    recipe's block); the rest run the emulation. Counted here from the shapes, and checked
    against the run: shared-input operands exist only where q (h1) or gate (h2) is native."""
    extra = ["--set", f"precision.recipe={recipe}", "--set", "train.steps=1"]
    for s in sets:
        extra += ["--set", s]
    require_binary()
    out = tmp_path / "run"
    args = [MXTRAIN_BIN, "train", "--set", "model.preset=tiny",
            "--set", f"data.path={corpus(tmp_path)}", "--set", "train.steps=1",
            "--set", f"train.seq_len={seq}", "--set", "train.micro_batch=4",
            "--set", "train.eval_every=0", "--set", "run.sample_tokens=0",
            "--set", "checkpoint.resume=none", "--set", f"run.out_dir={out}"] + extra
    env = dict(os.environ, OMP_NUM_THREADS="1", MXTRAIN_TEST_FP8_OPS="1")
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    native = native_linears(hidden, inter, 4, kv, 4 * seq, multiple)
    n = sum(native)
    rule = (f"the backend's GEMMs need the tokens of a micro-batch and every Linear width "
            f"multiples of {multiple})")
    line = [l for l in p.stderr.splitlines() if "block Linears" in l]
    assert len(line) == 1, p.stderr[-2000:]
    if n == 7:
        assert line[0].endswith(f"precision {recipe}: block Linears on the backend's FP8 GEMMs "
                                "(tensor cores on a GPU)"), line
    elif n > 0:
        assert line[0].endswith(f"precision {recipe}: block Linears: {n} of 7 on the backend's "
                                f"FP8 GEMMs (tensor cores on a GPU), the others emulated at this "
                                f"shape ({rule}"), line
    else:
        assert line[0].endswith(f"precision {recipe}: block Linears emulated at this shape "
                                f"(fp32 GEMMs over dequantized operands; {rule}"), line
    # q, k and v share h1's quantization where all three are native, gate and up h2's where
    # both are: the run's count shows which Linears took the ops.
    assert (shared_operands(out) > 0) == (all(native[:3]) or all(native[4:6]))


@pytest.mark.parametrize("recipe,ckpt", [("fp8-current", "none"), ("fp8-current", "full"),
                                         ("nvfp4", "none")])
def test_bf16_path_takes_the_norms_amax(tmp_path, recipe, ckpt):
    # h1's and h2's amax from the RMSNorm that writes their codes (rmsnorm_forward_bf16's amax,
    # Fp8Operand::x_amax) for fp8-current's casts and nvfp4's 1x16 rows of q's, k's, v's, gate's
    # and up's input, and (fp8-current) the residual gradient's from the RMSNorm backward for
    # o's and down's dy, and each weight's from its forward cast for the data gradient's and
    # the recompute's (fp8-current and nvfp4; LlamaModel::weight_amax): the CPU twin checks
    # each given amax against max |x| bit for bit (an internal error otherwise), and the run
    # and its checkpoints equal the run with both off (MXTRAIN_FP8_NORM_AMAX=0,
    # MXTRAIN_FP8_WEIGHT_AMAX=0). 2 a block and step; full checkpointing's recompute 2 more.
    extra = ["--set", f"precision.recipe={recipe}", "--set", "precision.activations=bf16",
             "--set", f"memory.activation_checkpointing={ckpt}"]
    env = {"MXTRAIN_TEST_BF16_GEMM": "1"}
    on, on_out, _ = train(tmp_path, "on", True, False, extra, env_extra=env)
    off, off_out, _ = train(tmp_path, "off", True, False, extra,
                            env_extra=dict(env, MXTRAIN_FP8_NORM_AMAX="0",
                                           MXTRAIN_FP8_WEIGHT_AMAX="0"))
    assert len(on) == 12 and on == off
    assert checkpoint_files(on_out, 12) == checkpoint_files(off_out, 12)
    assert summary_of(on_out)["fp8_norm_amax_inputs"] == 2 * 2 * 12 * (2 if ckpt == "full" else 1)
    assert summary_of(off_out)["fp8_norm_amax_inputs"] == 0
    # fp8-current's output projections' dy, the residual gradient, with the amax the RMSNorm
    # backward that updated it took (o in both blocks, down in the lower one: the top block's
    # comes from the final norm's backward, which takes none)
    grads = 3 * 12 if recipe == "fp8-current" else 0
    assert summary_of(on_out)["fp8_norm_amax_grads"] == grads
    assert summary_of(off_out)["fp8_norm_amax_grads"] == 0
    # and the weights (fp8-current's per-tensor scale, nvfp4's 16x16 blocks' global scale):
    # each W's amax taken by its forward cast, given to the data gradient's W^T (7 Linears a
    # block) and to full checkpointing's recompute (7 more)
    reuses = 7 * 2 * 12 * (2 if ckpt == "full" else 1)
    assert summary_of(on_out)["fp8_weight_amax_reuses"] == reuses
    assert summary_of(off_out)["fp8_weight_amax_reuses"] == 0


def test_weight_amax_lasts_until_the_weights_change(tmp_path):
    # Each weight's amax is kept while Fsdp's weights_version stays (LlamaModel::weight_amax):
    # taken by the first cast of W after an optimizer step, given to every later cast until
    # the next (the data gradients', the other micro-batches', validation's). The CPU twin
    # checks each given amax against max |W| bit for bit, so one kept past a change of W stops
    # the run (an internal error); the run equals the run without it. fp8-current, policy
    # none, 2 micro-batches a step: 4 casts of each W a step, 3 taking the kept amax; a
    # validation (after steps 4, 8 and 12: 2 batches) casts W twice more and leaves its amax
    # to the next step, whose casts then all take it: 2 more a validation that a step follows,
    # 1 for the last.
    extra = ["--set", "precision.recipe=fp8-current", "--set", "precision.activations=bf16",
             "--set", "memory.activation_checkpointing=none", "--set", "train.grad_accum=2",
             "--set", "train.eval_every=4", "--set", "train.eval_batches=2"]
    env = {"MXTRAIN_TEST_BF16_GEMM": "1"}
    on, on_out, _ = train(tmp_path, "on", True, False, extra, env_extra=env)
    off, off_out, _ = train(tmp_path, "off", True, False, extra,
                            env_extra=dict(env, MXTRAIN_FP8_WEIGHT_AMAX="0"))
    assert len(on) == 12 and on == off
    assert checkpoint_files(on_out, 12) == checkpoint_files(off_out, 12)
    linears = 7 * 2  # tiny: 2 blocks
    assert summary_of(on_out)["fp8_weight_amax_reuses"] == linears * (12 * 3 + 2 * 2 + 1)
    assert summary_of(off_out)["fp8_weight_amax_reuses"] == 0
