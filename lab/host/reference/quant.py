"""The dequantizing kernels' references (CPython only): random valid tensors of each GGUF type, the independent
dequantization (gguf.quants, the gguf package's numpy code, written apart from our WGSL; for Q1_0 and Q2_0, which
gguf 0.19 cannot dequantize, numpy written here from the block format of ggml-common.h), wgsl/q8_rows.wgsl's
activation quantization, and the tolerances and error measures the matvec, matmul and get_rows checks hold.
tests/unit/test_quant_blocks.py holds this dequantization to llama.cpp's own, on blocks its quantizer wrote.

Nothing here touches a device: tests/kernels (through its Rig) runs the kernels against these, and
lab/host/reference/kernel_cases.py builds the browser worker's and the verification card's cases from them.
"""

from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as GQ

from lab.format import gguf as lab_gguf
from lab.format.ggml import BY_NAME

# The grid types (256-element blocks), in the order they were added.
IQ_TYPES = ("IQ2_XXS", "IQ3_XXS", "IQ2_XS", "IQ2_S", "IQ3_S", "IQ1_S", "IQ1_M")
# The 1- and 2-bit types of consecutive values: the oracle is ours (_OWN_DEQUANT), gguf 0.19 has none.
BIT_TYPES = ("Q1_0", "Q2_0")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
         "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4") + IQ_TYPES + BIT_TYPES
# The types the kernel tests give rows of whole 256-element runs: the 256-element blocks, and Q1_0's 128.
K_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_XS", "TQ1_0", "TQ2_0") + IQ_TYPES + ("Q1_0",)
# gguf 0.19 cannot quantize these: random bytes, with the f16 scale fields (byte offset, range) overwritten
# by finite values of a sane size (random bytes there give NaN, inf and 1e4-sized values): (byte offset,
# low, high, random sign). A scale of either sign is valid, and a sign error in the kernel must show.
RANDOM_BYTES = {
    "Q4_K": ((0, 0.002, 0.05, False), (2, 0.0, 0.05, False)),     # d, dmin
    "Q5_K": ((0, 0.002, 0.05, False), (2, 0.0, 0.05, False)),
    "Q6_K": ((208, 0.0005, 0.01, True),),                         # d; the int8 scales are fine as bytes
    "Q2_K": ((80, 0.002, 0.05, True), (82, 0.0, 0.05, False)),    # d, dmin
    "Q3_K": ((108, 0.0005, 0.01, True),),                         # d
    "IQ4_NL": ((0, 0.0005, 0.01, True),),                         # d
    "IQ4_XS": ((0, 0.0002, 0.005, True),),                        # d (scales_h, scales_l: any bits are valid)
    # gguf 0.19 quantizes the ternary types, but from normal data nearly every trit comes out 0: random bytes
    # use every digit (TQ2_0's field value 3, never written by the quantizer, decodes as 2 in ggml and here).
    "TQ1_0": ((52, 0.002, 0.05, True),),                          # d
    "TQ2_0": ((64, 0.002, 0.05, True),),                          # d
    # gguf 0.19 cannot quantize the grid types: random bytes are valid blocks (any grid index, sign and scale bits),
    # with d sized so that values stay within ~2 (IQ2_XXS: |x| <= d * 15.5 / 4 * 43).
    "IQ2_XXS": ((0, 0.0005, 0.01, True),),                        # d
    "IQ3_XXS": ((0, 0.0005, 0.01, True),),                        # d (|x| <= d * 15.5 / 2 * 62)
    "IQ2_XS": ((0, 0.0005, 0.01, True),),                         # d (|x| <= d * 15.5 / 4 * 43, as IQ2_XXS)
    "IQ2_S": ((0, 0.0005, 0.01, True),),                          # d (the same)
    "IQ3_S": ((0, 0.0005, 0.01, True),),                          # d (|x| <= d * 31 * 15)
    "IQ1_S": ((0, 0.002, 0.05, True),),                           # d (|x| <= d * 15 * 1.125)
    "IQ1_M": (),                                                  # (its d is split over four nibbles: IQ1_M_D)
    # Q1_0 and Q2_0 (gguf 0.19 cannot quantize them either): every bit pattern is a valid block.
    "Q1_0": ((0, 0.002, 0.05, True),),                            # d (x = +-d)
    "Q2_0": ((0, 0.002, 0.05, True),),                            # d (x = -d .. 2d)
    "MXFP4": (),                                                  # (8-bit scale codes: RANDOM_CODES)
    "NVFP4": (),
}
# The 8-bit float scale codes, drawn from [low, high): (byte offset, count, low, high), about the sizes quantized
# weights have (|x| up to ~1.5 and ~5.6). MXFP4's E8M0 e gives 2^(e - 128): 118..125 is 2^-10..2^-3. NVFP4's UE4M3
# codes 0x10..0x37 are 2^-6..1.875 * 2^-2 (times 1/2), normal numbers. The special codes (0, 0x7F, bit 7,
# subnormals) and the extreme exponents have their own test (tests/kernels/test_quant_types.py), where they
# do not hide the other scales of a row.
RANDOM_CODES = {"MXFP4": ((0, 1, 118, 126),), "NVFP4": ((0, 4, 0x10, 0x38),)}
# IQ1_M has no d field: d is the f16 whose nibbles 0..3 are the high nibbles of these bytes (the top nibbles of its
# four little-endian u16 scales at byte 48); random_tensor draws d as the RANDOM_BYTES scales, |x| <= d * 15 * 1.125.
IQ1_M_D = ((49, 51, 53, 55), 0.002, 0.05)


def put_iq1_m_d(blocks: np.ndarray, d: np.ndarray) -> None:
    """Write the f16 values d (one a block) into IQ1_M blocks (uint8, (n, 56)), leaving every other bit alone."""
    bits = np.asarray(d, np.float16).view(np.uint16)
    for k, off in enumerate(IQ1_M_D[0]):
        blocks[:, off] = (blocks[:, off] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4).astype(np.uint8)


def row_bytes(name: str, cols: int) -> int:
    return BY_NAME[name].row_bytes(cols)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def random_tensor(name: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A rows x cols tensor of type `name` as GGUF bytes, uint8 array of shape (rows, row_bytes)."""
    rng = np.random.default_rng(seed)
    if name not in RANDOM_BYTES:
        # Values with a per-row offset and spread, so Q4_1/Q5_1 minimums and all nibbles get used.
        f = (rng.standard_normal((rows, cols)) * rng.uniform(0.2, 2.0, (rows, 1))
             + rng.uniform(-0.5, 0.5, (rows, 1))).astype(np.float32)
        if name == "F32":
            return f.view(np.uint8).reshape(rows, -1)
        q = quants.quantize(f, GQ[name])
        return np.ascontiguousarray(q).view(np.uint8).reshape(rows, -1)
    t = BY_NAME[name]
    nb = rows * cols // t.block
    raw = rng.integers(0, 256, (nb, t.nbytes), dtype=np.uint8)
    for off, lo, hi, signed in RANDOM_BYTES[name]:
        v = rng.uniform(lo, hi, nb)
        if signed:
            v *= rng.choice([-1, 1], nb)
        raw[:, off:off + 2] = _f16_bytes(v)
    for off, count, lo, hi in RANDOM_CODES.get(name, ()):
        raw[:, off:off + count] = rng.integers(lo, hi, (nb, count), dtype=np.uint8)
    if name == "IQ1_M":
        _, lo, hi = IQ1_M_D
        put_iq1_m_d(raw, rng.uniform(lo, hi, nb) * rng.choice([-1, 1], nb))
    return raw.reshape(rows, -1)


def _f16_at(blocks: np.ndarray, off: int) -> np.ndarray:
    """The f16 field at byte `off` of each block, as float32, shape (n, 1)."""
    return np.ascontiguousarray(blocks[:, off:off + 2]).view(np.float16).astype(np.float32)


def _dequant_q1_0(blocks: np.ndarray) -> np.ndarray:
    """Q1_0 (ggml-common.h block_q1_0: d f16, qs[16]; dequantize_row_q1_0): element j of the 128 is bit j % 8 of
    qs[j / 8], +d where set, -d where clear."""
    d = _f16_at(blocks, 0)
    bits = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="little")
    return np.where(bits == 1, d, -d)


def _dequant_q2_0(blocks: np.ndarray) -> np.ndarray:
    """Q2_0 (block_q2_0: d f16, qs[16]; dequantize_row_q2_0): element j of the 64 is the 2-bit field q at bits
    2(j % 4) of qs[j / 4], x = (q - 1) * d (an exact product in float32)."""
    d = _f16_at(blocks, 0)
    q = (blocks[:, 2:18, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3
    return (q.reshape(len(blocks), 64).astype(np.float32) - 1) * d


_OWN_DEQUANT = {"Q1_0": _dequant_q1_0, "Q2_0": _dequant_q2_0}


def dequant(raw: np.ndarray, name: str) -> np.ndarray:
    """Independent dequantization (gguf.quants, or ours for BIT_TYPES) to float32, shape (rows, cols)."""
    raw = np.ascontiguousarray(raw)
    if name in _OWN_DEQUANT:
        t = BY_NAME[name]
        return _OWN_DEQUANT[name](raw.reshape(-1, t.nbytes)).reshape(raw.shape[0], -1)
    return quants.dequantize(raw, GQ[name]).reshape(raw.shape[0], -1)


def i8_terms(raw: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integers behind a tensor as wgsl/matmul_i8.wgsl multiplies them: per row and block of 32,
    w = a[half] * q + c (half = which 16 values; both halves share a but for Q6_K and Q3_K, scaled per 16).
    Returns q [rows, nb, 32] (float64 integers), a [rows, nb, 2], c [rows, nb]; scales read from the GGUF bytes
    here, the integers from gguf.quants' dequantization, which they must rebuild (else this raises)."""
    raw = np.ascontiguousarray(raw)
    rows = raw.shape[0]
    t = BY_NAME[name]
    blk = raw.reshape(rows, -1, t.nbytes)
    f16 = lambda off: blk[..., off:off + 2].copy().view(np.float16)[..., 0].astype(np.float64)
    sub = t.block // 32                                            # blocks of 32 per GGUF block
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = f16(0)
        a = np.repeat(d[..., None], 2, -1)
        c = f16(2) if name in ("Q4_1", "Q5_1") else {"Q4_0": -8.0, "Q5_0": -16.0, "Q8_0": 0.0}[name] * d
    elif name in ("Q4_K", "Q5_K"):
        sc, mn = quants.Q4_K.get_scale_min(blk[..., 4:16].reshape(-1, 12))
        sc, mn = sc.reshape(rows, -1, 8), mn.reshape(rows, -1, 8)
        a = np.repeat((f16(0)[..., None] * sc)[..., None], 2, -1)
        c = -f16(2)[..., None] * mn
    elif name == "Q6_K":
        sc = blk[..., 192:208].copy().view(np.int8).astype(np.float64).reshape(rows, -1, 8, 2)
        a, c = f16(208)[..., None, None] * sc, np.zeros(sc.shape[:-1])
    elif name == "Q3_K":
        b = blk[..., 96:108].astype(np.int64)
        s16 = np.arange(16)
        low = np.where(s16 < 8, b[..., s16 % 8] & 15, b[..., s16 % 8] >> 4)
        high = (b[..., 8 + s16 % 4] >> (2 * (s16 // 4))) & 3
        sc = (low | (high << 4)).astype(np.float64) - 32.0
        a, c = (f16(108)[..., None] * sc).reshape(rows, -1, 8, 2), np.zeros(blk.shape[:2] + (8,))
    elif name == "IQ4_XS":
        sh = blk[..., 2:4].copy().view(np.uint16)[..., 0].astype(np.int64)
        sl = blk[..., 4:8].astype(np.int64)
        ib = np.arange(8)
        ls = ((sl[..., ib // 2] >> (4 * (ib % 2))) & 15) | (((sh[..., None] >> (2 * ib)) & 3) << 4)
        a = np.repeat((f16(0)[..., None] * (ls - 32.0))[..., None], 2, -1)
        c = np.zeros(blk.shape[:2] + (8,))
    else:
        raise ValueError(f"{name}: no int8 terms")
    a, c = a.reshape(rows, -1, 2), c.reshape(rows, -1)
    nb = a.shape[1]
    assert nb == blk.shape[1] * sub
    W = dequant(raw, name).astype(np.float64).reshape(rows, nb, 2, 16)
    safe = np.where(a == 0, 1.0, a)
    q = np.where(a[..., None] == 0, 0.0, np.rint((W - c[..., None, None]) / safe[..., None]))
    rebuilt = a[..., None] * q + c[..., None, None]
    if not np.allclose(rebuilt, W, rtol=1e-6, atol=1e-6 * float(np.abs(W).max())):
        raise AssertionError(f"{name}: the scales read here do not rebuild gguf's values")
    return q.reshape(rows, nb, 32), a, c


def q8_blocks(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of X quantized per block of 32 as wgsl/q8_rows.wgsl does it, in float32: (q [t, nb, 32] as float64
    integers, d [t, nb] float32) with d = max|x| / 127 and q = round(x * (127 / max|x|)), zero for a zero block."""
    xb = np.asarray(X, np.float32).reshape(X.shape[0], -1, 32)
    amax = np.abs(xb).max(2)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return np.rint(xb * inv[..., None]).astype(np.float64), (amax / np.float32(127)).astype(np.float32)


def f32(a) -> bytes:
    """The float32 bytes of `a`: a kernel input buffer's contents."""
    return np.ascontiguousarray(a, dtype=np.float32).tobytes()


# -- tolerances ------------------------------------------------------------------------------------
# Dequantized values: one or two f32 operations on an f16 scale and a small integer, the same
# operations gguf.quants does in float32; contraction into fma may move the last bit.
# TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0 and Q2_0 are one exact product each (an f16 or a 4-bit-significand scale times
# an integer of at most 4 bits, or a power of two times one), and the grid types' few products are exact too (an
# f16 times a sub-block factor of at most 6 bits times a grid value of at most 6, or IQ1's 1.125 etc.): no rounding,
# so the tests hold them to equality, and DEQUANT_TOL only for the GEMM/matvec sums below.
DEQUANT_TOL = 1e-6
# Products: f32 accumulation of `cols` terms, compared with float64. The error bound is
# cols * eps32 * sum_c |W[r,c] x[c]| in the worst case (4.6e-5 for 768 terms) and about
# sqrt(cols) * eps32 (1.7e-6 for 768) in practice; 1e-5 of sum |W||x| sits between, while a wrong
# scale, nibble or bit moves a result by a large fraction of it.
DOT_TOL = 1e-5


def dequant_err(got: np.ndarray, ref: np.ndarray) -> float:
    """Largest error relative to the largest reference magnitude."""
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


def dot_err(got: np.ndarray, W: np.ndarray, X: np.ndarray) -> float:
    """Largest |got - X W^T| per element, relative to that element's sum |W||x| (X: (t, cols) or (cols,))."""
    W = W.astype(np.float64)
    X = np.atleast_2d(X).astype(np.float64)
    ref = X @ W.T
    scale = np.abs(X) @ np.abs(W).T
    return float(np.max(np.abs(np.atleast_2d(got) - ref) / np.maximum(scale, 1e-30)))


def real_tensors(path) -> dict:
    """name -> (type name, raw uint8 array (rows, row_bytes), a view of a read-only memory map) of a GGUF file: real
    weights for the kernels and the dequantization above.
    The tensor table comes from lab.format.gguf (header only, fast); the bytes are the file's own."""
    header = lab_gguf.read_file(path)
    mm = np.memmap(path, np.uint8, mode="r")
    out = {}
    for t in header.tensors:
        rows = t.n_elements // t.shape[0]
        out[t.name] = (t.type.name, mm[t.offset:t.offset + t.nbytes].reshape(rows, -1))
    return out
