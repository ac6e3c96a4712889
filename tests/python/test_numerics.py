"""mxtrain numerics against live references: every codec against ml_dtypes bit for bit (through
the hidden `mxtrain numerics codec` command), the quantizers against numerics_ref.py (a plain
numpy reference), stochastic rounding's bias and reproducibility, and bad inputs."""
import ml_dtypes
import numpy as np
import pytest

import hf_io
import numerics_ref as ref
from conftest import run_mxtrain, require_binary

MD = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu,
    "ue4m3": ml_dtypes.float8_e4m3fn,
    "bf16": ml_dtypes.bfloat16,
}
NCODES = {"e4m3": 256, "e5m2": 256, "e2m1": 16, "e8m0": 256, "ue4m3": 256, "bf16": 65536}
MAXCODE = {"e4m3": 0x7E, "e5m2": 0x7B, "e2m1": 0x7, "bf16": 0x7F7F}
SIGNBIT = {"e4m3": 0x80, "e5m2": 0x80, "e2m1": 0x8, "bf16": 0x8000}
SAT_NAN = {"e4m3": 0x7F, "e5m2": 0x7F, "e2m1": 0x7, "bf16": 0x7FFF}


def f32(bit_list):
    return np.array(bit_list, dtype=np.uint32).view(np.float32)


def md_codes(x, fmt):
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(x, np.float32).astype(MD[fmt])
    return y.view(np.uint16 if fmt == "bf16" else np.uint8).astype(np.int64)


def codec(tmp_path, fmt, tensors, *extra):
    require_binary()
    src, dst = tmp_path / f"codec_in_{fmt}.safetensors", tmp_path / f"codec_out_{fmt}.safetensors"
    hf_io.write_safetensors(src, tensors)
    r = run_mxtrain(["numerics", "codec", "--format", fmt, "--in", src, "--out", dst, *extra])
    assert r.rc == 0, r
    return hf_io.read_safetensors(dst)


def codes_of(out, name, fmt):
    c = out[name + ".codes"]
    return (c.view(np.uint16) if fmt == "bf16" else c).astype(np.int64)


def special_inputs():
    return f32([
        0x00000000, 0x80000000,                          # +-0
        0x00000001, 0x80000001, 0x00400000, 0x007FFFFF,  # fp32 subnormals
        0x80400000, 0x807FFFFF, 0x00600000, 0x00200000,
        0x00800000, 0x80800000,                          # fp32 min normal
        0x7F800000, 0xFF800000,                          # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FA00000,  # NaNs
        0x7F7FFFFF, 0xFF7FFFFF, 0x5F000000, 0xDF000000,  # FLT_MAX, +-2^63
    ])


def midpoint_inputs(fmt):
    """Every representable finite value, every midpoint between consecutive ones (and the
    overflow midpoint max + ulp/2), each with one fp32 ulp either side; both signs."""
    all_codes = np.arange(NCODES[fmt], dtype=np.uint16 if fmt == "bf16" else np.uint8)
    vals = all_codes.view(MD[fmt]).astype(np.float64)
    vals = np.unique(np.abs(vals[np.isfinite(vals)]))
    mids = (vals[:-1] + vals[1:]) / 2
    top = vals[-1] + (vals[-1] - vals[-2]) / 2  # the midpoint to the first value past max
    exact = np.concatenate([vals, mids, [top, min(2 * vals[-1], 3.4e38)]])
    pts = exact.astype(np.float32)
    assert np.all(pts.astype(np.float64) == exact) or fmt == "bf16"  # 3.4e38 is not exact
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(-np.inf))])
    pts = np.concatenate([pts, -pts, special_inputs()])
    return pts.astype(np.float32)


# ---- decode: every code ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "e8m0", "bf16"])
def test_decode_every_code_matches_ml_dtypes(tmp_path, fmt):
    if fmt == "bf16":
        codes = np.arange(65536, dtype=np.uint16).view(np.int16)
        want = codes.view(np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    else:
        codes = np.arange(NCODES[fmt], dtype=np.uint8)
        want = codes.view(MD[fmt]).astype(np.float32)
    out = codec(tmp_path, fmt, {"c": codes})
    got = out["c.decoded"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
        np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))[:10]


def test_decode_ue4m3_is_e4m3_without_sign(tmp_path):
    codes = np.arange(256, dtype=np.uint8)
    out = codec(tmp_path, "ue4m3", {"c": codes})
    want = (codes & 0x7F).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(out["c.decoded"].view(np.uint32), want.view(np.uint32))


# ---- encode: RNE at every midpoint, specials, both saturation rules -----------------------------

@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16"])
def test_encode_nosat_matches_ml_dtypes_astype(tmp_path, fmt):
    x = midpoint_inputs(fmt)
    out = codec(tmp_path, fmt, {"x": x}, "--saturation", "nosat")
    got, want = codes_of(out, "x", fmt), md_codes(x, fmt)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), got[i], want[i]) for i in bad[:10]]
    # decoded values are the decode of the codes
    assert np.array_equal(out["x.decoded"].view(np.uint32),
                          np.asarray(want, np.uint16 if fmt == "bf16" else np.uint8)
                          .view(MD[fmt]).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "e2m1", "bf16"])
def test_encode_satfinite_rule(tmp_path, fmt):
    """SATFINITE: ml_dtypes' result wherever that is finite; finite overflow and +-inf clamp to
    +-max; NaN becomes the canonical positive NaN (E2M1, which has none: +6)."""
    x = midpoint_inputs(fmt)
    out = codec(tmp_path, fmt, {"x": x}, "--saturation", "satfinite")
    got, want = codes_of(out, "x", fmt), md_codes(x, fmt)
    nan_in = np.isnan(x)
    dec = np.asarray(want, np.uint16 if fmt == "bf16" else np.uint8).view(MD[fmt]).astype(
        np.float32)
    overflow = ~nan_in & ~np.isfinite(dec)  # ml_dtypes gave NaN/inf for a non-NaN input
    sign = np.where(np.signbit(x), SIGNBIT[fmt], 0)
    expect = want.copy()
    expect[overflow] = sign[overflow] | MAXCODE[fmt]
    expect[nan_in] = SAT_NAN[fmt]
    if fmt in ("e4m3", "e5m2", "bf16"):
        assert overflow.sum() > 10  # the rule is exercised: finite overflow and inf both present
    assert np.all(got[np.isinf(x)] == (sign | MAXCODE[fmt])[np.isinf(x)])
    bad = np.flatnonzero(got != expect)
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), got[i], expect[i]) for i in bad[:10]]


def test_encode_satfinite_edges_explicit(tmp_path):
    """The documented corners: E4M3 464 (max + ulp/2) rounds to even = 448, just above -> 448
    (ml_dtypes: NaN); E5M2 61440 (max + ulp/2) would round up to inf -> 57344 under SATFINITE."""
    x = np.array([464.0, np.nextafter(np.float32(464), np.float32(1e9)), 1e6, -1e6], np.float32)
    out = codec(tmp_path, "e4m3", {"x": x})
    assert list(codes_of(out, "x", "e4m3")) == [0x7E, 0x7E, 0x7E, 0xFE]
    assert list(md_codes(x, "e4m3")) == [0x7E, 0x7F, 0x7F, 0xFF]
    y = np.array([61440.0, -61440.0, np.inf], np.float32)
    out = codec(tmp_path, "e5m2", {"y": y})
    assert list(codes_of(out, "y", "e5m2")) == [0x7B, 0xFB, 0x7B]
    assert list(md_codes(y, "e5m2")) == [0x7C, 0xFC, 0x7C]


def e8m0_inputs():
    e = np.arange(-127, 128, dtype=np.float64)
    pows = (2.0 ** e).astype(np.float32)
    mids = (1.5 * 2.0 ** e).astype(np.float32)  # 1.5 * 2^127 overflows fp32 -> inf: fine
    pts = np.concatenate([pows, mids])
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)),
                          np.nextafter(pts, np.float32(-np.inf))])
    return np.concatenate([pts, -pts[:10], special_inputs(), [3.0, 0.75, 5.0]]).astype(
        np.float32)


def test_e8m0_nearest_nosat_matches_ml_dtypes(tmp_path):
    x = e8m0_inputs()
    out = codec(tmp_path, "e8m0", {"x": x}, "--saturation", "nosat", "--rounding", "nearest")
    got, want = codes_of(out, "x", "e8m0"), md_codes(x, "e8m0")
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), got[i], want[i]) for i in bad[:10]]


def test_e8m0_up_satfinite_is_te_float_to_e8m0(tmp_path):
    x = e8m0_inputs()
    x = x[~(np.signbit(x) & ~np.isnan(x))]  # TE's rule is for non-negative inputs (amaxes)
    out = codec(tmp_path, "e8m0", {"x": x}, "--saturation", "satfinite", "--rounding", "up")
    want = np.array([ref.e8m0_up_satfinite(v) for v in x])
    got = codes_of(out, "x", "e8m0")
    assert np.array_equal(got, want)
    # and it is the exact ceil(log2 x) for positive finite x in range
    pos = (x > 2.0 ** -126) & (x < 2.0 ** 127)
    assert np.array_equal(got[pos] - 127, np.ceil(np.log2(x[pos].astype(np.float64))))


def test_e8m0_down_is_floor_log2(tmp_path):
    x = e8m0_inputs()
    x = x[np.isfinite(x) & (x >= 2.0 ** -127)]
    out = codec(tmp_path, "e8m0", {"x": x}, "--saturation", "nosat", "--rounding", "down")
    want = np.floor(np.log2(x.astype(np.float64))).astype(np.int64) + 127
    assert np.array_equal(codes_of(out, "x", "e8m0"), np.clip(want, 0, 254))


def test_ue4m3_encode(tmp_path):
    x = midpoint_inputs("e4m3")
    x = x[~np.isnan(x)]
    out = codec(tmp_path, "ue4m3", {"x": x})
    got = codes_of(out, "x", "ue4m3")
    pos = ~np.signbit(x)
    want = md_codes(np.minimum(x[pos], 448.0), "e4m3")
    assert np.array_equal(got[pos], want)
    assert np.all(got[~pos] == 0)


# ---- stochastic rounding -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt,value,lo,hi", [
    ("e4m3", 1.0375, 1.0, 1.125),
    ("e5m2", 0.2, 0.1875, 0.21875),
    ("e2m1", 2.4, 2.0, 3.0),
    ("e2m1", -0.3, -0.5, 0.0),
    ("bf16", 1.0 + 2.0 ** -9, 1.0, 1.0 + 2.0 ** -7),
])
def test_stochastic_rounding_unbiased(tmp_path, fmt, value, lo, hi):
    n = 40000
    x = np.full(n, value, np.float32)
    out = codec(tmp_path, fmt, {"x": x}, "--rounding", "sr", "--seed", "1234")
    dec = out["x.decoded"].astype(np.float64)
    assert set(np.unique(dec)) <= {lo, hi}  # only the two neighbours
    v = float(np.float32(value))
    p = (v - lo) / (hi - lo)
    stderr = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert abs(dec.mean() - v) < 4 * stderr, (dec.mean(), v, stderr)


def test_stochastic_rounding_exact_values_never_move(tmp_path):
    vals = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    vals = np.repeat(vals[np.isfinite(vals)], 20)
    out = codec(tmp_path, "e4m3", {"x": vals}, "--rounding", "sr", "--seed", "7")
    assert np.array_equal(out["x.decoded"].view(np.uint32), vals.view(np.uint32))


def quantize(tmp_path, fmt, tensors, *extra, tag="q"):
    require_binary()
    src, dst = tmp_path / f"{tag}_in.safetensors", tmp_path / f"{tag}_out.safetensors"
    hf_io.write_safetensors(src, tensors)
    r = run_mxtrain(["numerics", "quantize", "--format", fmt, "--in", src, "--out", dst, *extra])
    assert r.rc == 0, r
    return hf_io.read_safetensors(dst)


def test_stochastic_quantize_reproducible_from_seed(tmp_path):
    rng = np.random.default_rng(3)
    t = {"w": rng.standard_normal((8, 64)).astype(np.float32)}
    for fmt in ["nvfp4", "mxfp8", "e4m3"]:
        a = quantize(tmp_path, fmt, t, "--stochastic", "--seed", "11", tag="a")
        b = quantize(tmp_path, fmt, t, "--stochastic", "--seed", "11", tag="b")
        c = quantize(tmp_path, fmt, t, "--stochastic", "--seed", "12", tag="c")
        rne = quantize(tmp_path, fmt, t, tag="d")
        assert np.array_equal(a["w.codes"], b["w.codes"])
        assert not np.array_equal(a["w.codes"], c["w.codes"])
        assert not np.array_equal(a["w.codes"], rne["w.codes"])
        assert np.array_equal(a["w.scales"], rne["w.scales"])  # scales never SR


def test_stochastic_nvfp4_unbiased_on_average(tmp_path):
    """E[dequant] = x for SR NVFP4 (scales fixed): the mean error over many elements is within
    a few standard errors of 0, while RNE's per-element errors are not what is measured."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.5, 1.0, (64, 256)).astype(np.float32)
    x[:, 0] = 1.0  # every block sees the same amax, hence the same scale
    out = quantize(tmp_path, "nvfp4", {"x": x}, "--stochastic", "--seed", "99")
    err = (out["x.dequant"].astype(np.float64) - x)[:, 1:]
    assert abs(err.mean()) < 4 * err.std() / np.sqrt(err.size)


# ---- quantizers vs the numpy reference ---------------------------------------------------------

def random_tensors(seed=0):
    rng = np.random.default_rng(seed)
    t = {}
    shapes = [(1, 32), (3, 64), (5, 100), (7, 17), (33, 48), (48,), (2, 3, 64), (130, 160)]
    for i, shape in enumerate(shapes):
        for scale in [1.0, 1e-3, 1e4, 1e-38]:
            t[f"t{i}_{scale:g}"] = (rng.standard_normal(shape) * scale).astype(np.float32)
    z = rng.standard_normal((4, 96)).astype(np.float32)
    z[0, :] = 0.0          # all-zero row (blocks)
    z[1, 32:64] = 0.0      # one all-zero 32-block
    z[2, 5] = 3e4          # one huge value in a block
    z[3, :16] = 1e-41      # denormal-range values
    z[3, 16:32] = rng.standard_normal(16).astype(np.float32) * np.float32(1e-39)
    t["edge"] = z
    t["zeros"] = np.zeros((3, 40), np.float32)
    t["tiny"] = (rng.standard_normal((2, 64)) * 1e-44).astype(np.float32)
    t["huge"] = (rng.standard_normal((2, 64)) * 1e37).astype(np.float32)
    t["powers"] = np.array([[2.0 ** k for k in range(-20, 12)] * 2], np.float32) * 448 / 2 ** 11
    return t


def assert_bits_equal(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if got.dtype == np.float32:
        g, w = got.view(np.uint32), want.astype(np.float32).view(np.uint32)
    else:
        g, w = got, want
    bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
    assert bad.size == 0, (what, bad[:8], g.reshape(-1)[bad[:8]], w.reshape(-1)[bad[:8]])


@pytest.mark.parametrize("extra,columnwise,elem,rule", [
    ([], False, "e4m3", "ceil"),
    (["--block", "32x1"], True, "e4m3", "ceil"),
    (["--scale-rule", "floor"], False, "e4m3", "floor"),
    (["--mx-elem", "e5m2"], False, "e5m2", "ceil"),
])
def test_mxfp8_matches_reference(tmp_path, extra, columnwise, elem, rule):
    t = random_tensors(1)
    out = quantize(tmp_path, "mxfp8", t, *extra)
    for name, x in t.items():
        codes, scales, deq = ref.mxfp8_ref(x, columnwise, elem, rule)
        assert_bits_equal(out[name + ".codes"], codes, name + ".codes")
        assert_bits_equal(out[name + ".scales"], scales, name + ".scales")
        assert_bits_equal(out[name + ".dequant"], deq, name + ".dequant")


@pytest.mark.parametrize("two_d", [False, True])
def test_nvfp4_matches_reference(tmp_path, two_d):
    t = random_tensors(2)
    out = quantize(tmp_path, "nvfp4", t, *(["--block", "16x16"] if two_d else []))
    for name, x in t.items():
        codes, scales, s_enc, deq = ref.nvfp4_ref(x, two_d)
        assert_bits_equal(out[name + ".codes"], codes, name + ".codes")
        assert_bits_equal(out[name + ".scales"], scales, name + ".scales")
        assert_bits_equal(out[name + ".global_scale"], np.array([s_enc], np.float32), name)
        assert_bits_equal(out[name + ".dequant"], deq, name + ".dequant")


def test_nvfp4_dequant_close_to_input():
    # a sanity bound independent of both implementations' details: relative error of E2M1
    # with a good scale is at most half an ulp at the top binade (1/6 of the block amax / 2)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    _, _, _, deq = ref.nvfp4_ref(x)
    blk_amax = np.abs(x).reshape(16, 4, 16).max(axis=2, keepdims=True)
    err = np.abs(deq - x).reshape(16, 4, 16)
    assert np.all(err <= blk_amax * (1.0 / 6.0) * 1.07 + 1e-6)


@pytest.mark.parametrize("extra,br,pow2", [
    ([], 1, True), (["--block", "128x128"], 128, True), (["--no-pow2-scales"], 1, False)])
def test_fp8_block_matches_reference(tmp_path, extra, br, pow2):
    t = random_tensors(3)
    out = quantize(tmp_path, "fp8-block", t, *extra)
    for name, x in t.items():
        codes, scales, deq = ref.fp8_block_ref(x, br, 128, pow2)
        assert_bits_equal(out[name + ".codes"], codes, name + ".codes")
        assert_bits_equal(out[name + ".scales"], scales, name + ".scales")
        assert_bits_equal(out[name + ".dequant"], deq, name + ".dequant")


@pytest.mark.parametrize("fmt,margin", [("e4m3", 0), ("e5m2", 0), ("e4m3", 2)])
def test_fp8_per_tensor_matches_reference(tmp_path, fmt, margin):
    t = random_tensors(4)
    out = quantize(tmp_path, fmt, t, "--margin", str(margin))
    for name, x in t.items():
        codes, scales, deq = ref.fp8_tensor_ref(x, fmt, margin)
        assert_bits_equal(out[name + ".codes"], codes, name + ".codes")
        assert_bits_equal(out[name + ".scales"], scales, name + ".scales")
        assert_bits_equal(out[name + ".dequant"], deq, name + ".dequant")


@pytest.mark.parametrize("fmt,margin", [("e4m3", 64), ("e5m2", 20), ("e4m3", 20), ("e4m3", 0), ("e5m2", 0)])
def test_fp8_per_tensor_scale_underflow_is_clamped(tmp_path, fmt, margin):
    """448 / amax / 2^margin underflowed to 0 or a subnormal for large amaxes: the stored
    1 / scale was inf and every dequantized value NaN, exit 0; a first clamp (to FLT_MIN) still
    decoded values near FLT_MAX to inf. The scale is at least max / (FLT_MAX / 2); the
    reference applies that rule, and independently of it every dequantized value of a finite
    input must be finite."""
    t = {"x": np.array([[1e30, 1, 0, -3e29]], np.float32),
         "y": np.array([[1e38, 5e37, 1, 0]], np.float32),
         "w": np.array([[3.3e38, 1, -3.35e38, 3e38]], np.float32),
         "m": np.array([[np.finfo(np.float32).max, -np.finfo(np.float32).max, 2.0]], np.float32),
         "z": np.array([[3.0, -1.0]], np.float32)}
    out = quantize(tmp_path, fmt, t, "--margin", str(margin))
    for name, x in t.items():
        codes, scales, deq = ref.fp8_tensor_ref(x, fmt, margin)
        assert np.all(np.isfinite(deq)), (name, deq)
        assert_bits_equal(out[name + ".codes"], codes, name + ".codes")
        assert_bits_equal(out[name + ".scales"], scales, name + ".scales")
        assert_bits_equal(out[name + ".dequant"], deq, name + ".dequant")
    for name in t:
        assert np.all(np.isfinite(out[name + ".scales"])), name
        assert np.all(np.isfinite(out[name + ".dequant"])), (name, out[name + ".dequant"])


def test_quantize_reads_bf16_and_f16(tmp_path):
    x = np.random.default_rng(6).standard_normal((4, 32)).astype(np.float16)
    out = quantize(tmp_path, "mxfp8", {"h": x})
    codes, scales, deq = ref.mxfp8_ref(x.astype(np.float32))
    assert_bits_equal(out["h.codes"], codes, "f16 codes")


# ---- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["format", "dtype", "missing", "nan", "block", "seed",
                                  "margin_on_mxfp8", "seed_without_stochastic",
                                  "scale_rule_on_e4m3", "mx_elem_on_nvfp4", "pow2_on_mxfp8"])
def test_bad_input_exit_2_one_error_line(tmp_path, case):
    require_binary()
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    x = np.ones((2, 32), np.float32)
    args = ["--format", "mxfp8"]
    if case == "format":
        args = ["--format", "fp3"]
    elif case == "dtype":
        x = np.ones((2, 32), np.int32)
    elif case == "missing":
        src = tmp_path / "nope.safetensors"
    elif case == "nan":
        x[1, 3] = np.nan
    elif case == "block":
        args += ["--block", "1x64"]
    elif case == "seed":
        args += ["--stochastic", "--seed", str(2 ** 40)]
    # options the format does not use (they were ignored: the output not what the line says)
    elif case == "margin_on_mxfp8":
        args += ["--margin", "1"]
    elif case == "seed_without_stochastic":
        args += ["--seed", "5"]
    elif case == "scale_rule_on_e4m3":
        args = ["--format", "e4m3", "--scale-rule", "floor"]
    elif case == "mx_elem_on_nvfp4":
        args = ["--format", "nvfp4", "--mx-elem", "e5m2"]
    elif case == "pow2_on_mxfp8":
        args += ["--no-pow2-scales"]
    if case != "missing":
        hf_io.write_safetensors(src, {"x": x})
    r = run_mxtrain(["numerics", "quantize", *args, "--in", src, "--out", dst])
    assert r.rc == 2, r
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r
    assert not dst.exists()
