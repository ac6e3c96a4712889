"""Plain numpy reference of mxtrain's quantizers, written from the formulas of Transformer Engine
(MXFP8 / NVFP4 / Float8BlockScaling / current scaling) and the OCP MX v1.0 spec, independent of
the C++ code. Element casts use ml_dtypes (the format reference); SATFINITE is a clip to +-max
before the cast (a finite value beyond max clamps; RNE below max + half an ulp is unchanged).

Every array is float32 and every arithmetic step is one float32 operation, in the order the
formulas state (numpy float32 ops round once, as fp32 hardware does).
"""
import ml_dtypes
import numpy as np

F32 = np.float32
E4M3_MAX = F32(448.0)
E5M2_MAX = F32(57344.0)
E2M1_MAX = F32(6.0)
FLT_MAX = F32(np.finfo(np.float32).max)

ELEM = {
    "e4m3": (ml_dtypes.float8_e4m3fn, E4M3_MAX, 8),
    "e5m2": (ml_dtypes.float8_e5m2, E5M2_MAX, 15),
}


def bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def from_bits(b):
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def sat_cast(x, dtype, max_value):
    """SATFINITE cast of finite float32 values: clip, then ml_dtypes' RNE cast. Returns the codes."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -max_value, max_value).astype(dtype).view(np.uint8)


def decode(codes, dtype):
    return np.asarray(codes, dtype=np.uint8).view(dtype).astype(np.float32)


def view_2d(x):
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(-1, x.shape[-1])


def blocks(rows, cols, br, bc):
    """Yields (block row, block col, row slice, col slice); edge blocks are partial."""
    for i in range(0, rows, br):
        for j in range(0, cols, bc):
            yield i // br, j // bc, slice(i, min(rows, i + br)), slice(j, min(cols, j + bc))


# ---- E8M0 -------------------------------------------------------------------------------------

def e8m0_up_satfinite(val):
    """Transformer Engine's float_to_e8m0 (utils.cuh): NaN -> 0xFF, inf -> 0xFE, 0 -> 0; else the
    fp32 exponent field, plus one when the mantissa is non-zero (ceil of log2), except at 0xFE
    (satfinite) and for subnormals <= 2^-127 (mantissa <= 0x400000 with exponent field 0)."""
    val = F32(val)
    if np.isnan(val):
        return 0xFF
    if np.isinf(val):
        return 0xFE
    if val == 0:
        return 0
    b = int(bits(val))
    exponent = (b >> 23) & 0xFF
    mantissa = b & 0x7FFFFF
    if mantissa > 0 and exponent != 0xFE and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


def exp2f_rcp(e8):
    """TE's exp2f_rcp: 2^(127 - b) built from the bits, and 1 when b = 0."""
    if e8 == 0:
        return F32(1.0)
    return from_bits(np.uint32(((254 - e8) & 0x1FF) << 23))[()]


def e8m0_value(e8):
    return decode(np.array([e8], dtype=np.uint8), ml_dtypes.float8_e8m0fnu)[0]


# ---- per-tensor and blockwise FP8 ------------------------------------------------------------

def fp8_scale_from_amax(amax, max_value, margin=0.0, pow2=False):
    """TE compute_scale_from_amax: max / amax / 2^margin; 1 for amax 0/inf/NaN; FLT_MAX on
    overflow; at least max / (FLT_MAX / 2), so the largest code decodes finite (TE leaves 0 or
    a subnormal there after a margin, whose reciprocal is inf); pow2 clears the mantissa bits
    (2^floor(log2 scale))."""
    amax = F32(amax)
    if not amax > 0 or np.isinf(amax):
        return F32(1.0)
    with np.errstate(over="ignore"):
        scale = F32(max_value) / amax
        if margin:
            scale = scale / F32(2.0 ** margin)
    smallest = F32(max_value) / (F32(FLT_MAX) * F32(0.5))
    if scale < smallest:
        scale = smallest
    if np.isinf(scale):
        scale = FLT_MAX
    if pow2:
        b = int(bits(scale)) & 0xFF800000
        scale = from_bits(np.uint32(b))[()] if b else F32(1.0)
    return F32(scale)


def fp8_tensor_ref(x, fmt="e4m3", margin=0.0):
    x2 = view_2d(x)
    dtype, max_value, _ = ELEM[fmt]
    scale = fp8_scale_from_amax(np.max(np.abs(x2)), max_value, margin)
    scale_inv = F32(1.0) / scale
    with np.errstate(over="ignore"):
        codes = sat_cast(x2 * scale, dtype, max_value)
    deq = decode(codes, dtype) * scale_inv
    return codes.reshape(np.shape(x)), np.array([scale_inv], np.float32), deq.reshape(np.shape(x))


def fp8_block_ref(x, br=1, bc=128, pow2=True):
    x2 = view_2d(x)
    rows, cols = x2.shape
    scales = np.zeros((-(-rows // br), -(-cols // bc)), np.float32)
    codes = np.zeros(x2.shape, np.uint8)
    deq = np.zeros(x2.shape, np.float32)
    for bi, bj, rs, cs in blocks(rows, cols, br, bc):
        blk = x2[rs, cs]
        scale = fp8_scale_from_amax(np.max(np.abs(blk)), E4M3_MAX, 0.0, pow2)
        scale_inv = F32(1.0) / scale
        scales[bi, bj] = scale_inv
        c = sat_cast(blk * scale, ml_dtypes.float8_e4m3fn, E4M3_MAX)
        codes[rs, cs] = c
        deq[rs, cs] = decode(c, ml_dtypes.float8_e4m3fn) * scale_inv
    return codes.reshape(np.shape(x)), scales, deq.reshape(np.shape(x))


# ---- MXFP8 ------------------------------------------------------------------------------------

def mxfp8_ref(x, columnwise=False, elem="e4m3", rule="ceil"):
    """MXFP8: 32-element blocks along each row (or along dim 0 when columnwise).
    ceil (TE/cuBLAS): b = float_to_e8m0(amax * fp32(1/max)); the elements are cast with the
      multiplier exp2f_rcp(b).
    floor (OCP MX v1.0 section 6.3): b = floor(log2(amax)) - emax_elem + 127 clamped to [0, 254]
      (amax = 0 -> 0, amax = inf -> 254); multiplier 2^(127 - b).
    Elements: SATFINITE RNE cast of x * multiplier. Dequant: decode(code) * 2^(b - 127)."""
    x2 = view_2d(x)
    rows, cols = x2.shape
    dtype, max_value, emax = ELEM[elem]
    max_rcp = F32(1.0) / max_value
    br, bc = (32, 1) if columnwise else (1, 32)
    scales = np.zeros((-(-rows // br), -(-cols // bc)), np.uint8)
    codes = np.zeros(x2.shape, np.uint8)
    deq = np.zeros(x2.shape, np.float32)
    for bi, bj, rs, cs in blocks(rows, cols, br, bc):
        blk = x2[rs, cs]
        amax = F32(np.max(np.abs(blk)))
        if rule == "ceil":
            e8 = e8m0_up_satfinite(amax * max_rcp)
            mult = exp2f_rcp(e8)
        else:
            if np.isinf(amax):
                e8 = 254  # the largest scale, as ceil's saturating encode gives
            elif amax > 0:
                _, exp = np.frexp(np.float64(amax))  # amax = m * 2^exp, m in [0.5, 1)
                e8 = int(np.clip(int(exp) - 1 - emax + 127, 0, 254))
            else:
                e8 = 0
            mult = F32(2.0 ** (127 - e8))
        scales[bi, bj] = e8
        c = sat_cast(blk * mult, dtype, max_value)
        codes[rs, cs] = c
        deq[rs, cs] = decode(c, dtype) * e8m0_value(e8)
    return codes.reshape(np.shape(x)), scales, deq.reshape(np.shape(x))


# ---- NVFP4 ------------------------------------------------------------------------------------

def nvfp4_global_encode_scale(amax):
    """TE compute_global_encode_scaling_factor_FP4: (448 * 6) / amax, at most FLT_MAX; 1 when
    amax is 0 or the scale is 0."""
    amax = F32(amax)
    with np.errstate(divide="ignore", over="ignore"):
        s = F32(2688.0) / amax
    s = min(s, FLT_MAX)
    if amax == 0 or s == 0:
        return F32(1.0)
    return F32(s)


def pack_nibbles(codes):
    """[rows, cols] 4-bit codes -> [rows, ceil(cols/2)] bytes, low nibble first."""
    rows, cols = codes.shape
    if cols % 2:
        codes = np.concatenate([codes, np.zeros((rows, 1), np.uint8)], axis=1)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed, cols):
    out = np.zeros((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2] = packed & 0xF
    out[:, 1::2] = packed >> 4
    return out[:, :cols]


def nvfp4_ref(x, blocks_2d=False):
    """NVFP4 (TE's reference emulation, quantize_nvfp4 in the TE tests):
      S_enc = nvfp4_global_encode_scale(global amax); S_dec = 1 / S_enc
      per block of 16 (or 16x16): s_b = e4m3_satfinite(min(amax_b / 6 * S_enc, FLT_MAX))
      multiplier = min(1 / (decode(s_b) * S_dec), FLT_MAX)
      code = e2m1 RNE (saturating) of x * multiplier
      dequant = decode(code) * (decode(s_b) * S_dec)"""
    x2 = view_2d(x)
    rows, cols = x2.shape
    s_enc = nvfp4_global_encode_scale(np.max(np.abs(x2)))
    s_dec = F32(1.0) / s_enc
    br = 16 if blocks_2d else 1
    scales = np.zeros((-(-rows // br), -(-cols // 16)), np.uint8)
    codes = np.zeros(x2.shape, np.uint8)
    deq = np.zeros(x2.shape, np.float32)
    for bi, bj, rs, cs in blocks(rows, cols, br, 16):
        blk = x2[rs, cs]
        amax = F32(np.max(np.abs(blk)))
        with np.errstate(over="ignore"):
            sb_val = min(amax / E2M1_MAX * s_enc, FLT_MAX)
        sb = int(sat_cast(np.array([sb_val], np.float32), ml_dtypes.float8_e4m3fn, E4M3_MAX)[0])
        sb_dec = decode(np.array([sb], np.uint8), ml_dtypes.float8_e4m3fn)[0]
        with np.errstate(divide="ignore", over="ignore"):
            mult = min(F32(1.0) / (sb_dec * s_dec), FLT_MAX)
            scaled = blk * F32(mult)
        c = scaled.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)  # ml_dtypes saturates to +-6
        scales[bi, bj] = sb
        codes[rs, cs] = c
        deq[rs, cs] = decode(c, ml_dtypes.float4_e2m1fn) * (sb_dec * s_dec)
    packed = pack_nibbles(codes)
    shape = list(np.shape(x)) or [1]
    return (packed.reshape(shape[:-1] + [packed.shape[1]]), scales, s_enc,
            deq.reshape(np.shape(x)))
