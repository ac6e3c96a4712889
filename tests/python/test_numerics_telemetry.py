"""Numerics telemetry (precision.stats_every) against an independent numpy computation.

1. Known tensors through each recipe's real quantizer path (`mxtrain numerics stats`, hidden: a
   one-block LinearRecipe quantizing the tensor as one GEMM operand with collection on): amax,
   share saturated, share flushed to zero and SQNR must equal what numpy computes from the plain
   reference quantizers of numerics_ref.py (ml_dtypes casts, TE formulas) with the definitions
   of docs/numerics.md.
2. End to end: the tiny preset trained under fp8-current with stats_every=2 writes a "numerics"
   object on steps 2, 4, 6 only, one record per (block, Linear, GEMM operand), with plausible
   values (weights at init are Gaussian, so their E4M3 SQNR must be near the Gaussian SQNR that
   ml_dtypes gives); a forced collapse (test-only knob) warns naming that block; the default
   (stats_every=0) writes nothing; a negative interval is a config error; two MPI ranks work.
"""
import json
import math
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import hf_io
import numerics_ref as R
from conftest import MXTRAIN_BIN, read_metrics, set_args

F32 = np.float32
GRADIENT = {"dgrad.grad_output", "wgrad.grad_output"}
WEIGHT = {"fwd.weight", "dgrad.weight"}
OPERANDS = ["fwd.input", "fwd.weight", "dgrad.grad_output", "dgrad.weight",
            "wgrad.grad_output", "wgrad.input"]
# Does the operand's GEMM reduce along its columns (blocks along rows)? As in llama.cpp.
ALONG_ROWS = {"fwd.input": True, "fwd.weight": True, "dgrad.grad_output": True,
              "dgrad.weight": False, "wgrad.grad_output": False, "wgrad.input": False}
MAX = {"e4m3": F32(448), "e5m2": F32(57344), "e2m1": F32(6),
       "bf16": F32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)}
DTYPE = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
         "bf16": ml_dtypes.bfloat16}


def first_clamped(fmt):
    """The smallest float32 magnitude that an unclamped RNE cast rounds past the format's max
    (so SATFINITE clamps it), found with ml_dtypes' non-saturating cast: max + ulp/2, or the
    next float when that tie rounds down to an even max. E2M1 has no overflow in ml_dtypes (it
    clamps): 7 is the tie between 6 (odd mantissa 1.1b x 2^2) and 8 (even), so 7 rounds past."""
    if fmt == "e2m1":
        return F32(7.0)
    dt = DTYPE[fmt]
    m = MAX[fmt]
    # the overflow point lies in (max, 2 max]: bisect on the float32 bit patterns
    with np.errstate(over="ignore", invalid="ignore"):
        lo, hi = int(R.bits(np.nextafter(m, F32(np.inf)))), int(R.bits(F32(2) * m))
        while lo < hi:
            mid = (lo + hi) // 2
            v = R.from_bits(np.uint32(mid))[()]
            if np.isfinite(np.array([v], F32).astype(dt).astype(F32)[0]):
                lo = mid + 1
            else:
                hi = mid
    return R.from_bits(np.uint32(lo))[()]


def fmt_of(recipe, operand):
    if recipe == "bf16":
        return "bf16"
    if recipe == "nvfp4":
        return "e2m1"
    if recipe in ("fp8-current", "fp8-delayed"):
        return "e5m2" if operand in GRADIENT else "e4m3"
    return "e4m3"  # fp8-block, mxfp8


def expand(scales, rows, cols, br, bc):
    return np.repeat(np.repeat(scales, br, axis=0), bc, axis=1)[:rows, :cols]


def reference(recipe, operand, x):
    """(dequant, per-element encode multiplier) of x as that operand, from numerics_ref."""
    rows, cols = x.shape
    along_rows = ALONG_ROWS[operand]
    if recipe == "bf16":
        return x.astype(ml_dtypes.bfloat16).astype(F32), np.ones_like(x)
    if recipe in ("fp8-current", "fp8-delayed"):
        fmt = fmt_of(recipe, operand)
        if recipe == "fp8-current":
            _, _, deq = R.fp8_tensor_ref(x, fmt)
            scale = R.fp8_scale_from_amax(np.max(np.abs(x)), MAX[fmt])
        else:  # the first quantization of a delayed-scaling operand uses the initial scale 1
            scale = F32(1.0)
            deq = R.decode(R.sat_cast(x * scale, DTYPE[fmt], MAX[fmt]), DTYPE[fmt]) / scale
        return deq, np.full_like(x, scale)
    if recipe == "fp8-block":
        br, bc = (128, 128) if operand in WEIGHT else ((1, 128) if along_rows else (128, 1))
        _, scales, deq = R.fp8_block_ref(x, br, bc)
        return deq, F32(1.0) / expand(scales, rows, cols, br, bc)
    if recipe == "mxfp8":
        _, e8, deq = R.mxfp8_ref(x, columnwise=not along_rows)
        br, bc = (1, 32) if along_rows else (32, 1)
        mult = np.vectorize(lambda b: R.exp2f_rcp(int(b)), otypes=[F32])(e8)
        return deq, expand(mult, rows, cols, br, bc)
    assert recipe == "nvfp4" and operand not in GRADIENT  # gradients: stochastic rounding
    transposed = operand not in WEIGHT and not along_rows
    xt = np.ascontiguousarray(x.T) if transposed else x
    blocks_2d = operand in WEIGHT
    _, sb, s_enc, deq = R.nvfp4_ref(xt, blocks_2d=blocks_2d)
    s_dec = F32(1.0) / s_enc
    sb_dec = R.decode(sb, ml_dtypes.float8_e4m3fn)
    with np.errstate(divide="ignore", over="ignore"):
        mult = np.minimum(F32(1.0) / (sb_dec * s_dec), R.FLT_MAX).astype(F32)
    mult = expand(mult, *xt.shape, 16 if blocks_2d else 1, 16)
    if transposed:
        return np.ascontiguousarray(deq.T), np.ascontiguousarray(mult.T)
    return deq, mult


def ref_stats(x, deq, mult, fmt):
    x64, d64 = x.astype(np.float64), deq.astype(np.float64)
    with np.errstate(over="ignore"):
        scaled = np.abs(x * mult)  # float32 products, as the quantizer forms them
    return {
        "amax": float(np.max(np.abs(x))),
        "saturated": float(np.mean(scaled >= first_clamped(fmt))),
        "flushed": float(np.mean((x != 0) & (deq == 0))),
        "sqnr_db": 10 * math.log10(np.sum(x64 * x64) / np.sum((x64 - d64) ** 2)),
        "numel": x.size,
    }


def tensors():
    rng = np.random.default_rng(11)
    out = {
        "gauss": rng.standard_normal((64, 256)).astype(F32),
        # log-normal magnitudes over ~12 binades: values underflow (flush) in every format
        "wide": (rng.standard_normal((96, 160)) * np.exp(3.0 * rng.standard_normal((96, 160)))).astype(F32),
        # partial blocks everywhere (rows and cols not multiples of 16/32/128), big values: the
        # first delayed-scaling quantization (scale 1) saturates them
        "big": (300.0 * rng.standard_normal((45, 77))).astype(F32),
    }
    spiky = rng.standard_normal((32, 128)).astype(F32)
    spiky[::7, ::13] *= F32(5000.0)
    out["spiky"] = spiky
    # NVFP4 saturates only when a block's E4M3 scale is subnormal (block amax ~1e-5 of the
    # tensor's) and rounds down by more than a sixth: blocks of amax ~0.6 next to one 1e5
    tiny_blocks = (0.25 * rng.standard_normal((32, 64))).astype(F32)
    tiny_blocks[0, 0] = F32(1e5)
    out["tiny_blocks"] = tiny_blocks
    return out


@pytest.fixture(scope="module")
def stats_input(tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "x.safetensors"
    ts = tensors()
    hf_io.write_safetensors(str(path), ts)
    return path, ts


CASES = [(r, o) for r in ["bf16", "fp8-current", "fp8-delayed", "fp8-block", "mxfp8"]
         for o in OPERANDS] + [("nvfp4", o) for o in OPERANDS if o not in GRADIENT]


@pytest.mark.parametrize("recipe,operand", CASES)
def test_stats_match_numpy(mxtrain, stats_input, recipe, operand):
    path, ts = stats_input
    r = mxtrain(["numerics", "stats", "--recipe", recipe, "--operand", operand, "--in", path])
    assert r.rc == 0, r
    got = json.loads(r.stdout)
    fmt = fmt_of(recipe, operand)
    for name, x in ts.items():
        deq, mult = reference(recipe, operand, x)
        want = ref_stats(x, deq, mult, fmt)
        g = got[name]
        assert g["format"] == fmt, (name, g)
        assert g["numel"] == want["numel"]
        assert g["amax"] == want["amax"], (name, g, want)
        assert abs(g["saturated"] - want["saturated"]) < 1e-12, (name, g, want)
        assert abs(g["flushed"] - want["flushed"]) < 1e-12, (name, g, want)
        assert abs(g["sqnr_db"] - want["sqnr_db"]) < 1e-6, (name, g, want)


def test_stats_cases_exercise_saturation_and_flush(stats_input):
    """The reference itself must see saturated and flushed values somewhere, or the exact
    comparisons above would not test those two counts."""
    _, ts = stats_input
    sat = ref_stats(ts["big"], *reference("fp8-delayed", "fwd.input", ts["big"]), "e4m3")
    assert sat["saturated"] > 0.1, sat
    nv = ref_stats(ts["tiny_blocks"], *reference("nvfp4", "fwd.input", ts["tiny_blocks"]), "e2m1")
    assert nv["saturated"] > 0, nv  # subnormal E4M3 block scales rounded down clip block maxima
    fl = ref_stats(ts["wide"], *reference("fp8-current", "fwd.input", ts["wide"]), "e4m3")
    assert fl["flushed"] > 0.01, fl


def test_stochastic_gradient_operands_nvfp4(mxtrain, stats_input):
    """NVFP4 gradients use stochastic rounding (Philox; not in the numpy reference): amax and
    the saturated share depend only on the scales and must still match exactly; SQNR must be
    below the RNE value (SR adds noise) but within a few dB of it."""
    path, ts = stats_input
    for operand in GRADIENT:
        r = mxtrain(["numerics", "stats", "--recipe", "nvfp4", "--operand", operand, "--in", path])
        assert r.rc == 0, r
        got = json.loads(r.stdout)["gauss"]
        x = ts["gauss"]
        # the same operand rounded to nearest (its layout is the one of fwd.input / wgrad.input)
        rne_as = "fwd.input" if ALONG_ROWS[operand] else "wgrad.input"
        want = ref_stats(x, *reference("nvfp4", rne_as, x), "e2m1")
        assert got["amax"] == want["amax"]
        assert abs(got["saturated"] - want["saturated"]) < 1e-12, (got, want)
        assert want["sqnr_db"] - 6 < got["sqnr_db"] < want["sqnr_db"], (got, want)


# ---- end to end --------------------------------------------------------------------------------

def gaussian_sqnr(fmt):
    """SQNR of per-tensor current-scaled N(0,1) data (200k samples) under the format, ml_dtypes."""
    x = np.random.default_rng(0).standard_normal(200_000).astype(F32).reshape(-1, 1000)
    _, _, deq = R.fp8_tensor_ref(x, fmt)
    x64 = x.astype(np.float64)
    return 10 * math.log10(np.sum(x64 ** 2) / np.sum((x64 - deq) ** 2))


def train_tiny(mxtrain, tmp_path, extra=None, env=None, steps=6):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    settings = {"model.preset": "tiny", "data.path": corpus, "train.steps": steps,
                "train.seq_len": 32, "train.micro_batch": 4, "train.eval_every": 0,
                "run.sample_tokens": 0, "precision.recipe": "fp8-current",
                "precision.stats_every": 2, "run.out_dir": tmp_path / "r"}
    settings.update(extra or {})
    r = mxtrain(["train"] + set_args(settings), env=env)
    return r, tmp_path / "r" / "metrics.jsonl"


def test_training_writes_numerics_records(mxtrain, tmp_path):
    r, metrics = train_tiny(mxtrain, tmp_path)
    assert r.rc == 0, r
    steps, summary = read_metrics(metrics)
    assert summary is not None
    with_stats = [s["step"] for s in steps if "numerics" in s]
    assert with_stats == [2, 4, 6], with_stats
    expected_gauss = {f: gaussian_sqnr(f) for f in ("e4m3", "e5m2")}
    assert 30 < expected_gauss["e4m3"] < 33 and 24 < expected_gauss["e5m2"] < 27, expected_gauss
    for s in steps:
        if "numerics" not in s:
            continue
        num = s["numerics"]
        # tiny: 2 blocks x 7 Linears x 6 operands
        names = {f"layers.{l}.{lin}.{op}" for l in range(2) for lin in
                 ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") for op in OPERANDS}
        assert set(num) == names, sorted(set(num) ^ names)
        for name, v in num.items():
            fmt = "e5m2" if name.endswith("grad_output") else "e4m3"  # HYBRID
            assert v["format"] == fmt, (name, v)
            assert v["amax"] > 0, (name, v)
            assert 0 <= v["saturated"] <= 1 and 0 <= v["flushed"] <= 1, (name, v)
            assert v["saturated"] == 0, (name, v)  # current scaling maps amax to max exactly
            assert v["sqnr_db"] is not None and math.isfinite(v["sqnr_db"]), (name, v)
            # Floating-point formats keep a roughly constant relative error: far above the
            # collapse floors, and not above the Gaussian value by more than a few dB.
            assert 12 < v["sqnr_db"] < expected_gauss[fmt] + 6, (name, v)
            if name.endswith("weight"):  # Gaussian at init, a few small updates since
                assert abs(v["sqnr_db"] - expected_gauss["e4m3"]) < 1.0, (name, v)
    assert "SQNR collapsed" not in r.stderr, r.stderr[-2000:]


def test_high_precision_blocks_have_no_stats(mxtrain, tmp_path):
    r, metrics = train_tiny(mxtrain, tmp_path, {"precision.high_precision_last": 1}, steps=2)
    assert r.rc == 0, r
    steps, _ = read_metrics(metrics)
    num = steps[-1]["numerics"]
    assert num and all(k.startswith("layers.0.") for k in num), sorted(num)


def test_fp8_attention_telemetry(mxtrain, tmp_path):
    # precision.fp8_attention on a telemetry step: per block the recipe covers (block 1 is left
    # in high precision here), each tensor FP8 attention encodes, with its amax before the
    # encoding, its encode scale and headroom = the format's max / (amax x scale). The scales
    # are recomputed here from the reported amaxes of q, k, v and dO by docs/numerics.md's table
    # (numerics_ref's TE scale rule with pow2), so a bound-derived scale that drifted from the
    # documented formula fails; the headrooms are checked against what each rule guarantees.
    r, metrics = train_tiny(mxtrain, tmp_path, {"precision.fp8_attention": "true",
                                                "precision.high_precision_last": 1}, steps=2)
    assert r.rc == 0, r
    assert "FP8 attention saturated" not in r.stderr, r.stderr[-2000:]
    steps, _ = read_metrics(metrics)
    num = steps[-1]["numerics"]
    attn = {k.split(".")[-1]: v for k, v in num.items() if ".fp8_attention." in k}
    assert all(k.startswith("layers.0.") for k in num if ".fp8_attention." in k), sorted(num)
    assert sorted(attn) == sorted(["q", "k", "v", "p", "o", "do", "ds", "dq", "dk", "dv"]), attn
    T, H, KV, D = 32, 4, 2, 16  # train_tiny's seq_len; the tiny preset's heads and head dim
    rows = T * H // KV
    amax = {t: F32(v["amax"]) for t, v in attn.items()}

    def scale(bound, fmt):
        return float(R.fp8_scale_from_amax(F32(bound), MAX[fmt], pow2=True))
    a_q, a_k, a_v, a_do = amax["q"], amax["k"], amax["v"], amax["do"]
    s = F32(1 / math.sqrt(D))
    b_s = F32(2) * F32(D) * a_do * a_v
    want = {"q": scale(a_q, "e4m3"), "k": scale(a_k, "e4m3"), "v": scale(a_v, "e4m3"),
            "p": 256.0, "o": scale(a_v, "e4m3") / 2, "do": scale(a_do, "e5m2"),
            "ds": scale(F32(2) * b_s, "e5m2"), "dq": scale(F32(2) * s * b_s * a_k, "e5m2"),
            "dk": scale(F32(2) * s * b_s * a_q * F32(rows), "e5m2"),
            "dv": scale(F32(2) * F32(rows) * a_do, "e5m2")}
    for t, v in attn.items():
        fmt = "e4m3" if t in ("q", "k", "v", "p", "o") else "e5m2"
        assert v["format"] == fmt and v["scale"] == want[t], (t, v, want[t])
        assert v["amax"] > 0 and v["headroom"] >= 1, (t, v)  # no encoding saturated
        assert v["headroom"] == pytest.approx(float(MAX[fmt]) / (v["amax"] * v["scale"]))
    for t in ("q", "k", "v", "do"):  # current power-of-two scaling: amax x scale in (max/2, max]
        assert 1 <= attn[t]["headroom"] < 2, (t, attn[t])
    assert attn["p"]["amax"] == pytest.approx(1.0, abs=1e-6)  # query 0 sees key 0 alone
    assert attn["o"]["headroom"] >= 448 / 280, attn["o"]  # the O bound's guarantee


def test_fp8_head_telemetry(mxtrain, tmp_path):
    # precision.fp8_head on a telemetry step: the head's forward operands as it quantizes them
    # (E4M3 at current per-tensor scales) as "head.fwd.input" / "head.fwd.weight". At step 1
    # W is the lm_head written here (init.from), so its record is recomputed from numerics_ref
    # exactly; h, the final norm's output, is not known outside: its record's shape and sanity.
    # The logits gradient as "head.bwd.grad_output": its E5M2 scale from the bound |grad_scale|
    # = 1 / (tokens x micro-batches) (exact math; its amax's value is checked against a double
    # reference by the gtest CpuOps.HeadCrossEntropyFp8OperandsMatchTheirDefinition).
    import llama_ref
    from conftest import write_model
    cfg = llama_ref.make_shape(64, 160, 2, 4, 2, vocab_size=256)  # the tiny preset's shape
    params = llama_ref.random_params(cfg, seed=5, std=0.2)
    model = write_model(tmp_path / "m", cfg, params)
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    settings = {"init.from": model, "data.path": corpus, "train.steps": 2, "train.seq_len": 32,
                "train.micro_batch": 4, "train.grad_accum": 2, "train.eval_every": 0,
                "run.sample_tokens": 0,
                "precision.recipe": "fp8-current", "precision.fp8_head": "true",
                "precision.stats_every": 1, "run.out_dir": tmp_path / "r"}
    r = mxtrain(["train"] + set_args(settings))
    assert r.rc == 0, r
    assert "saturated" not in r.stderr, r.stderr[-2000:]
    steps, _ = read_metrics(tmp_path / "r" / "metrics.jsonl")
    bound = 1.0 / (2 * 4 * 32)  # grad_scale of the head: 1 / (grad_accum x tokens), 2^-8
    for s in steps:
        got = s["numerics"]
        assert {"head.fwd.input", "head.fwd.weight", "head.bwd.grad_output"} <= set(got), \
            sorted(got)
        assert not [k for k in got if k.startswith("head.") and k not in
                    ("head.fwd.input", "head.fwd.weight", "head.bwd.grad_output")], sorted(got)
        h = got["head.fwd.input"]  # both micro-batches' h
        assert h["format"] == "e4m3" and h["numel"] == 2 * 4 * 32 * 64, h
        assert h["amax"] > 0 and h["saturated"] == 0 and h["sqnr_db"] > 25, h
        g = got["head.bwd.grad_output"]
        assert g["format"] == "e5m2" and g["scale"] == 57344 / bound, g
        # every element is bound x (softmax - onehot): at most the bound; at initialization
        # some target is unlikely (p_t near 0), which puts the amax near it
        assert 0.5 * bound < g["amax"] <= bound and g["headroom"] >= 1, g
        assert g["headroom"] == pytest.approx(57344 / (g["amax"] * g["scale"])), g
    w = np.asarray(params["lm_head.weight"], F32)
    want = ref_stats(w, *reference("fp8-current", "fwd.weight", w), "e4m3")
    g = steps[0]["numerics"]["head.fwd.weight"]  # W quantized once a micro-batch: twice
    assert g["format"] == "e4m3" and g["numel"] == 2 * want["numel"], (g, want)
    assert g["amax"] == want["amax"], (g, want)
    assert abs(g["saturated"] - want["saturated"]) < 1e-12, (g, want)
    assert abs(g["flushed"] - want["flushed"]) < 1e-12, (g, want)
    assert abs(g["sqnr_db"] - want["sqnr_db"]) < 1e-6, (g, want)
    # step 2's W is the updated one: a record of its own
    assert steps[1]["numerics"]["head.fwd.weight"]["amax"] != g["amax"]
    # without the FP8 head (bf16 head) there are no head entries
    settings.update({"precision.fp8_head": "false", "run.out_dir": tmp_path / "r2"})
    r = mxtrain(["train"] + set_args(settings))
    assert r.rc == 0, r
    steps, _ = read_metrics(tmp_path / "r2" / "metrics.jsonl")
    assert not [k for k in steps[0]["numerics"] if k.startswith("head.")]


def test_every_block_in_high_precision_is_said(mxtrain, tmp_path):
    """high_precision_first + _last covering every block left nothing quantized, silently: the
    start-up line still said the recipe's Linears were emulated, and the loss was bf16's."""
    r, _ = train_tiny(mxtrain, tmp_path, {"precision.high_precision_last": 1000000,
                                          "precision.recipe": "nvfp4"}, steps=1)
    assert r.rc == 0, r
    warns = [l for l in r.stderr.splitlines() if l.startswith("warning:")]
    assert len(warns) == 1 and "covers all 2 blocks" in warns[0] and \
        "nvfp4 quantizes no Linear" in warns[0], r.stderr
    (tmp_path / "b").mkdir()
    r, _ = train_tiny(mxtrain, tmp_path / "b", {"precision.high_precision_last": 1,
                                                "precision.recipe": "nvfp4"}, steps=1)
    assert r.rc == 0 and "quantizes no Linear" not in r.stderr, r


def test_stats_refuses_a_non_finite_tensor(mxtrain, tmp_path):
    """`numerics stats` counted an inf outside amax and wrote a null SQNR for it, exit 0, where
    `numerics quantize` refuses non-finite tensors: the statistics are defined for finite ones
    (a training operand always is)."""
    x = np.ones((1, 32), np.float32)
    x[0, 3] = np.inf
    path = tmp_path / "x.safetensors"
    hf_io.write_safetensors(str(path), {"x": x})
    r = mxtrain(["numerics", "stats", "--recipe", "mxfp8", "--operand", "fwd.input", "--in", path])
    errs = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert r.rc == 2 and len(errs) == 1 and "non-finite value (inf) at flat index 3" in errs[0], r


def test_stats_off_by_default(mxtrain, tmp_path):
    r, metrics = train_tiny(mxtrain, tmp_path, {"precision.stats_every": 0}, steps=4)
    assert r.rc == 0, r
    steps, _ = read_metrics(metrics)
    assert steps and not any("numerics" in s for s in steps)


@pytest.mark.parametrize("shift,field", [(-40, "flushed"), (20, "saturated")])
def test_forced_collapse_warns_naming_the_block(mxtrain, tmp_path, shift, field):
    """MXTRAIN_TEST_SCALE_SHIFT=1:K scales block 1's fp8-current encode scale by 2^K: 2^-40
    flushes everything to zero (SQNR 0 dB: the noise is the signal), 2^20 clamps almost
    everything to +-max (SQNR near 0 dB). Block 0 is untouched. One step (the run diverges
    afterwards), measured."""
    r, metrics = train_tiny(mxtrain, tmp_path, {"precision.stats_every": 1},
                            env={"MXTRAIN_TEST_SCALE_SHIFT": f"1:{shift}"}, steps=1)
    assert r.rc == 0, r
    warnings = [l for l in r.stderr.splitlines() if "SQNR collapsed" in l]
    assert warnings, r.stderr[-2000:]
    assert "layers.1." in warnings[0] and "layers.0." not in warnings[0], warnings
    assert warnings[0].startswith("warning:"), warnings
    steps, _ = read_metrics(metrics)
    num = steps[-1]["numerics"]
    # operands that block 1's own broken GEMMs do not feed (its normed input, its weights)
    for name in ("self_attn.q_proj.fwd.input", "mlp.gate_proj.fwd.weight"):
        hit = num["layers.1." + name]
        assert hit[field] > 0.9, (name, hit)
        assert hit["sqnr_db"] < 3, (name, hit)
        assert num["layers.0." + name]["sqnr_db"] > 20, num["layers.0." + name]


def test_negative_interval_is_a_config_error(mxtrain, tmp_path):
    r, _ = train_tiny(mxtrain, tmp_path, {"precision.stats_every": -1}, steps=2)
    assert r.rc == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "stats_every" in lines[0], r


def test_two_ranks_write_rank0_stats(tmp_path):
    """Under FSDP with 2 processes: rank 0 writes the records (its own operands), no hang."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "r"
    args = [MXTRAIN_BIN, "train"] + set_args({
        "model.preset": "tiny", "data.path": corpus, "train.steps": 4, "train.seq_len": 32,
        "train.micro_batch": 2, "train.eval_every": 0, "run.sample_tokens": 0,
        "precision.recipe": "mxfp8", "precision.stats_every": 2, "train.log_every": 3,
        "run.out_dir": out})
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    flags = os.environ.get("MXTRAIN_MPIRUN_FLAGS", "--oversubscribe --bind-to none").split()
    p = subprocess.run(["mpirun", "-np", "2"] + flags + [str(a) for a in args],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    steps, _ = read_metrics(out / "metrics.jsonl")
    # log_every=3 logs step 3; the stats steps 2 and 4 are logged as well
    assert [s["step"] for s in steps] == [2, 3, 4], [s["step"] for s in steps]
    assert "numerics" in steps[0] and "numerics" not in steps[1] and "numerics" in steps[2]
    assert len(steps[0]["numerics"]) == 2 * 7 * 6
