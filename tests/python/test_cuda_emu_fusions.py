"""The CUDA backend's fused and alternative paths in the trainer, under mxemu (see
test_cuda_emu.py, whose helpers these share: cuda_emu_run.py): the casts' kernel forms, the
SwiGLU fusions, x^T's codes kept by the forward and the RMSNorm's amax for the inputs' casts
each give the trainer the same bits as the unfused or plain form, which test_cuda_emu.py compares with the CPU. A file of its own so that
the two halves of the emulated trainer's tests run on both test workers (--dist loadfile)."""
import os
import subprocess

import pytest

from cuda_emu_run import EMU_BIN, STEPS, WIDE, require_emu, train


@pytest.mark.parametrize("recipe,sm,extra,forms", [("fp8-block", "90", WIDE, (1, 2)),
                                                   ("fp8-delayed", "90", (), (1, 2)),
                                                   ("mxfp8", "100", (), (1,))])
def test_cast_forms_give_the_trainer_the_same_bits(tmp_path, recipe, sm, extra, forms):
    """The casts' kernel forms (docs/cuda.md, "Cast tuning") in the trainer: at the tiny shapes
    tuning keeps each cast's first form, so MXTRAIN_TEST_CAST_FORM forces the others (fp8-block:
    form 1 the row-piece, column-block and two-pass kernels and dy's two quantizations as two
    calls, form 2 four row pieces a warp, the tiled kernels and dy's fused kernel; fp8-delayed: form 1 two vectors a thread and the tiled transposing
    kernel, form 2 four vectors and the column-block transposing kernel; mxfp8 on sm_100: form
    1 the row-piece kernel, the column kernel writing x^T's and dy^T's codes directly and dy's
    two quantizations as two calls; form 0 dy's in one kernel), with
    shared inputs, bf16 codes and amax slots as the trainer uses them. The forms write the same
    bytes, so every step's loss and gradient norm must equal the first form's run bit for bit
    (which test_cuda_trainer_matches_cpu compares with the CPU)."""
    require_emu()
    # (the first form's run is test_cuda_trainer_matches_cpu's, race check and all)
    base, _, _ = train(tmp_path, "form0", EMU_BIN, "cuda", recipe, sm=sm, extra=extra,
                       racecheck=False)
    for k in forms:
        run, summary, _ = train(tmp_path, f"form{k}", EMU_BIN, "cuda", recipe, sm=sm,
                                extra=extra, env_extra={"MXTRAIN_TEST_CAST_FORM": str(k)})
        assert summary["fp8_shared_operands"] > 0, summary
        for a, b in zip(base, run):
            assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (k, a, b)


@pytest.mark.parametrize("recipe,sm,extra", [("mxfp8", "100", ()), ("fp8-block", "90", WIDE)])
def test_block_scaled_swiglu_backward_gives_the_same_bits(tmp_path, recipe, sm, extra):
    """The block-scaled recipes on tensor cores (mxfp8 on sm_100, fp8-block on sm_90's block
    GEMMs): gate's and up's backward take dg's and du's operands in both layouts straight from
    SwiGLU's backward (swiglu_backward_mxfp8 / swiglu_backward_fp8_block, one read of ds, g and
    u), the bytes and scales quantize_mxfp8_both / quantize_fp8_block_both write from their bf16
    codes, so every step's loss and gradient norm equal MXTRAIN_FP8_FUSE_SWIGLU=0's bit for
    bit; one a block and step. The forward's fusion (down's input made from g and u, its x^T
    codes kept) is on and off with it: one a block and step too."""
    require_emu()
    # (the default run is test_cuda_trainer_matches_cpu's, race check and all)
    on, summary, _ = train(tmp_path, "on", EMU_BIN, "cuda", recipe, sm=sm, extra=extra,
                           racecheck=False)
    off, summary_off, _ = train(tmp_path, "off", EMU_BIN, "cuda", recipe, sm=sm, extra=extra,
                                env_extra={"MXTRAIN_FP8_FUSE_SWIGLU": "0"})
    assert summary["fp8_fused_swiglu_grads"] == 2 * STEPS, summary  # tiny: 2 blocks
    assert summary_off["fp8_fused_swiglu_grads"] == 0, summary_off
    assert summary["fp8_fused_swiglu_inputs"] == 2 * STEPS, summary
    assert summary_off["fp8_fused_swiglu_inputs"] == 0, summary_off
    for a, b in zip(on, off):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)


# fp8-block's GEMMs want every width a multiple of 128: k's and v's too
WIDE_KV = WIDE + ("--set", "model.num_key_value_heads=4")


@pytest.mark.parametrize("recipe,sm,extra", [("fp8-delayed", "90", ()),
                                             ("fp8-current", "90", ()),
                                             ("mxfp8", "100", ()),
                                             ("fp8-block", "90", WIDE_KV)])
def test_forward_kept_xt_codes_give_the_same_bits(tmp_path, recipe, sm, extra):
    """x^T's FP8 codes kept by the forward for the weight gradients (LlamaModel::saves_xt:
    h1, h2 and SwiGLU's product, policy none) are the bytes the backward would quantize from x
    itself, so the run equals MXTRAIN_FP8_SAVE_XT=0's bit for bit, and every weight gradient
    of q, k, v, gate, up and down took them (6 a block and step: fp8-delayed's histories keep
    its forward-input and weight-gradient-input scales equal; mxfp8's 32x1 and fp8-block's
    128x1 blocks with their scales, from the same read as the forward's 1x32 / 1x128 codes).
    Selective checkpointing keeps no such input: none taken."""
    require_emu()
    def run(name, **kw):
        return train(tmp_path, name, EMU_BIN, "cuda", recipe, sm=sm,
                     extra=extra + kw.pop("more", ()), **kw)
    # (the default run: test_cuda_trainer_matches_cpu's but for fp8-block's narrower k and v)
    on, summary, _ = run("on", racecheck=bool(extra))
    off, summary_off, _ = run("off", env_extra={"MXTRAIN_FP8_SAVE_XT": "0"})
    assert summary["fp8_saved_xt_operands"] == 6 * 2 * STEPS, summary  # tiny: 2 blocks
    assert summary_off["fp8_saved_xt_operands"] == 0, summary_off
    for a, b in zip(on, off):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
    # the activations arena holds the codes and their scales in place of the bf16 codes
    assert summary["peak_mem_bytes"] < summary_off["peak_mem_bytes"], (summary, summary_off)
    # down's cast made s from SwiGLU's operands (fp8_codes_both_swiglu; swiglu_forward_mxfp8,
    # swiglu_forward_fp8_block) in each block and step: the same bits as swiglu_forward_bf16
    # then the cast (MXTRAIN_FP8_FUSE_SWIGLU=0)
    assert summary["fp8_fused_swiglu_inputs"] == 2 * STEPS, summary
    assert summary_off["fp8_fused_swiglu_inputs"] == 0, summary_off
    unfused, summary_unfused, _ = run("unfused", env_extra={"MXTRAIN_FP8_FUSE_SWIGLU": "0"})
    assert summary_unfused["fp8_fused_swiglu_inputs"] == 0, summary_unfused
    # gate's and up's backward from SwiGLU's (swiglu_backward_fp8: dg's and du's FP8 operands
    # in both layouts from one read of ds, g and u), kept codes or not; off with the variable
    assert summary["fp8_fused_swiglu_grads"] == summary_off["fp8_fused_swiglu_grads"] \
        == 2 * STEPS, (summary, summary_off)
    assert summary_unfused["fp8_fused_swiglu_grads"] == 0, summary_unfused
    for a, b in zip(on, unfused):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
    if recipe in ("mxfp8", "fp8-block"):
        # (what selective checkpointing, a high-precision block and a telemetry step keep is
        # the model's rule for every recipe: the per-tensor cases run it, fp8-current with
        # its norm and weight amaxes under recompute, in half the time)
        return
    _, selective, _ = run("selective",
                          more=("--set", "memory.activation_checkpointing=selective"))
    assert selective["fp8_saved_xt_operands"] == 0, selective
    # The activations arena sized for the codes alone: a block left in high precision and a
    # telemetry step keep none, and their backward recomputes the inputs' bf16 codes (the
    # same bits again)
    hp = ("--set", "precision.high_precision_first=1", "--set", "precision.stats_every=2")
    on, summary, _ = run("hp-on", more=hp)
    off, _, _ = run("hp-off", more=hp, env_extra={"MXTRAIN_FP8_SAVE_XT": "0"})
    assert 0 < summary["fp8_saved_xt_operands"] < 6 * STEPS, summary
    for a, b in zip(on, off):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)


@pytest.mark.parametrize("recipe,sm", [("fp8-current", "90"), ("nvfp4", "100")])
def test_norm_amax_gives_the_same_bits(tmp_path, recipe, sm):
    """The RMSNorm kernels take h1's and h2's amax as they write their codes
    (rmsnorm_forward_bf16's amax, Fp8Operand::x_amax), so fp8-current's casts of q's, k's, v's,
    gate's and up's input and nvfp4's 1x16 rows (their global scale) skip their own amax pass
    over them; under fp8-current the RMSNorm backward takes the residual gradient's for o's
    and down's dy too; each weight's amax (fp8-current's scale, nvfp4's 16x16 blocks' global
    scale) is taken by its forward cast for the data gradient's (and the recompute's) cast of
    it (MXTRAIN_FP8_WEIGHT_AMAX=0: off). The same amax, so every step's loss and gradient norm equal
    MXTRAIN_FP8_NORM_AMAX=0's bit for bit; two a block and step. Under full checkpointing the
    backward's recompute takes them too (four), with the same bits again (every policy gives
    the same gradients)."""
    require_emu()
    # (fp8-current's default run is test_cuda_trainer_matches_cpu's, race check and all)
    on, summary, _ = train(tmp_path, "on", EMU_BIN, "cuda", recipe, sm=sm,
                           racecheck=recipe != "fp8-current")
    off, summary_off, _ = train(tmp_path, "off", EMU_BIN, "cuda", recipe, sm=sm,
                                env_extra={"MXTRAIN_FP8_NORM_AMAX": "0",
                                           "MXTRAIN_FP8_WEIGHT_AMAX": "0"})
    assert summary["fp8_norm_amax_inputs"] == 2 * 2 * STEPS, summary  # tiny: 2 blocks
    assert summary_off["fp8_norm_amax_inputs"] == 0, summary_off
    # fp8-current: o's and down's dy, the residual gradient, with the RMSNorm backward's amax
    # (o in both blocks, down in the lower: the top one's comes from the final norm)
    grads = 3 * STEPS if recipe == "fp8-current" else 0
    assert summary["fp8_norm_amax_grads"] == grads, summary
    assert summary_off["fp8_norm_amax_grads"] == 0, summary_off
    # each weight's amax from its forward cast for the data gradient's W^T (nvfp4's 16x16
    # blocks take it for their global scale)
    reuses = 7 * 2 * STEPS
    assert summary["fp8_weight_amax_reuses"] == reuses, summary
    assert summary_off["fp8_weight_amax_reuses"] == 0, summary_off
    for a, b in zip(on, off):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)
    if recipe != "fp8-current":
        return
    full, summary_full, _ = train(tmp_path, "full", EMU_BIN, "cuda", recipe, sm=sm,
                                  extra=("--set", "memory.activation_checkpointing=full"))
    assert summary_full["fp8_norm_amax_inputs"] == 2 * 2 * 2 * STEPS, summary_full
    assert summary_full["fp8_weight_amax_reuses"] == 2 * 7 * 2 * STEPS, summary_full
    for a, b in zip(on, full):
        assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (a, b)


def test_fp8_fast_accumulation_takes_the_forward_gemms_or_all(tmp_path):
    """MXTRAIN_CUDA_FP8_FAST_ACCUM (docs/cuda.md, "FP8 fast accumulation"): cuBLASLt's fast
    accumulation set on the per-tensor FP8 GEMMs it names, counted by the backend. tiny has 2
    blocks of 7 Linears, all on FP8 tensor cores (every width a multiple of 16): `fprop` takes
    each Linear's forward GEMM, 14 a step, and `all` its data- and weight-gradient GEMMs too, 42
    a step. mxemu's cuBLASLt sums in fp32 either way, so the steps equal the run without it bit
    for bit (what fast accumulation costs in accuracy is the GPU op check's
    `fp8_gemm_fast_accum` cases' to say). Any other value is a one-line error, exit 2."""
    require_emu()
    # (the default run is test_cuda_trainer_matches_cpu's, race check and all)
    off, summary_off, _ = train(tmp_path, "off", EMU_BIN, "cuda", "fp8-delayed", racecheck=False)
    assert summary_off["fp8_fast_accum_gemms"] == 0, summary_off
    for mode, per_step in (("fprop", 14), ("all", 42)):
        run, summary, log = train(tmp_path, mode, EMU_BIN, "cuda", "fp8-delayed",
                                  env_extra={"MXTRAIN_CUDA_FP8_FAST_ACCUM": mode})
        assert "cuda fp8: fast accumulation on" in log, log[-2000:]
        assert summary["fp8_fast_accum_gemms"] == per_step * STEPS, (mode, summary)
        for a, b in zip(off, run):
            assert (a["loss"], a["grad_norm"]) == (b["loss"], b["grad_norm"]), (mode, a, b)
    p = subprocess.run([EMU_BIN, "train", "--set", "model.preset=tiny", "--set",
                        "run.device=cuda", "--set", "precision.recipe=fp8-delayed", "--set",
                        f"run.out_dir={tmp_path / 'bad'}"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, MXEMU_SM="90",
                                             MXTRAIN_CUDA_FP8_FAST_ACCUM="yes"))
    errors = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    assert p.returncode == 2 and len(errors) == 1, p.stderr[-2000:]
    assert errors[0].startswith("error: MXTRAIN_CUDA_FP8_FAST_ACCUM must be 0"), errors
