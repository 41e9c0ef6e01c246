"""The projection's input gradient dx = W^T dy through a weight of every kernel type, the base read quantized
(wgsl/backward_matmul.wgsl then backward_gemm.wgsl's chunk_sum, via lab.ops.backward_matmul.dx_back), against the
float64 oracle (lab/host/reference/grads.py linear_grad on gguf.quants' dequantization); then broken variants the
same check must catch.

Shapes fill no workgroup evenly: rows of 3 blocks (K types 768 columns, 96 groups of 8 over 64-wide workgroups; the
32-element types 96, 12 groups), 131 or 67 output rows cut into parts of uneven rows and chunks whose last one is
short, 13 tokens (eight-token blocks: the last holds five). The default set is one shape per type; the sweep over token
counts, rows, parts and accumulate is `slow`. Each error is per element against the sum of its terms' magnitudes
(grads.bound_err, grads.dx_back_tol says why); -s prints them.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.grads import bound_err, dx_back_tol, linear_grad
from lab.host.reference.kernels import f32
from lab.ops.backward_matmul import CHUNK_MIN, dx_back, dx_chunk_rows, dx_chunks, dx_scratch_floats
from tests.kernels.quant_rig import random_weight, weight_in_parts

SENTINEL = 7.0
MEASURED: dict[str, float] = {}     # case -> error in units of 2^-24 (the report's numbers)


def cols_for(name: str, blocks: int = 3) -> int:
    """An odd number of the type's blocks (K types and the other 256-element blocks: 768; Q1_0's 128: 384; the
    32-element types: 96; NVFP4's and Q2_0's 64: 192); the float types 264 (8 x 33: no whole 64 or 256)."""
    block = BY_NAME[name].block
    return blocks * block if block > 1 else 264


def _rows(t: int, n: int, stride: int, offset: int, spare: int, fill: float, values: np.ndarray) -> np.ndarray:
    """A buffer of t + spare token rows of `stride` floats after `offset` floats, `values` [t, n] in the first n of
    each of the first t rows, `fill` everywhere else."""
    buf = np.full(offset + (t + spare) * stride, fill, np.float32)
    view = buf[offset:].reshape(t + spare, stride)
    view[:t, :n] = values
    return buf


def run_dx(env: Env, name: str, n_out: int, t: int, *, parts: int = 1, chunk_rows: int | None = None,
           accumulate: bool = False, cols: int | None = None, dy_at: tuple[int, int] = (0, 0),
           dx_at: tuple[int, int] = (0, 0), spare: int = 2, seed: int = 0) -> tuple[np.ndarray, dict]:
    """Runs dx_back over a random weight for t tokens (max_tokens t + spare: tokens past the step hold NaN in dy and
    must not be read, SENTINEL in dx and must stay). dy_at / dx_at: (offset, extra floats a row past the width) of
    the fused layouts. Returns dx's buffer as read back and what the check needs."""
    dev, rng = env.device, np.random.default_rng(seed)
    cols = cols or cols_for(name)
    raw, W = random_weight(name, n_out, cols, seed)
    w = weight_in_parts(dev, name, raw, cols, parts)
    ys, xs = n_out + dy_at[1], cols + dx_at[1]
    dy = f32(rng.standard_normal((t, n_out)) * rng.uniform(0.5, 2.0, (t, 1)))
    dx0 = f32(rng.standard_normal((t, cols)) * 3.0) if accumulate else np.full((t, cols), SENTINEL, np.float32)
    dxb_host = _rows(t, cols, xs, dx_at[0], spare, SENTINEL, dx0)
    mt = t + spare
    rows = chunk_rows or dx_chunk_rows(w, mt)
    dyb = upload(dev, _rows(t, n_out, ys, dy_at[0], spare, np.nan, dy))
    dxb = upload(dev, dxb_host)
    sums = upload(dev, np.full(dx_scratch_floats(w, mt, rows), np.nan, np.float32))
    ops = dx_back(dev, env.kernels, w, dyb, dxb, sums, ops_step(env), max_tokens=mt, accumulate=accumulate,
                  dy_offset=dy_at[0], dy_stride=ys, dx_offset=dx_at[0], dx_stride=xs, chunk_rows=chunk_rows)
    run(env, ops, 0, t)
    got = read(dev, dxb)
    free(dev, dyb, dxb, sums, *(p.buffer for p in w.parts))
    chunks = dx_chunks(w, rows)
    longest = min(rows, max(p.n_rows for p in w.parts))
    return got, dict(W=W, dy=dy, dx0=dx0 if accumulate else 0.0, before=dxb_host, t=t, cols=cols, xs=xs,
                     at=dx_at[0], tol=dx_back_tol(longest, sum(chunks)), chunks=chunks)


def check_dx(env: Env, name: str, n_out: int, t: int, **kw) -> float:
    """run_dx, then dx against dx0 + dy W (float64) per element within dx_back_tol of its terms' magnitudes, and
    every float outside the step's [t, cols] slots as it was. Returns the error in units of 2^-24; raises
    AssertionError past the tolerance."""
    got, c = run_dx(env, name, n_out, t, **kw)
    t, cols, xs, at = c["t"], c["cols"], c["xs"], c["at"]
    view = got[at:].reshape(-1, xs)[:t, :cols]
    dx, _ = linear_grad(c["W"], np.zeros((t, cols)), c["dy"])
    want = c["dx0"] + dx
    scale = np.abs(c["dx0"]) + np.abs(c["dy"]).astype(np.float64) @ np.abs(c["W"])
    what = f"dx_back {name} rows={n_out} cols={cols} t={t} chunks={c['chunks']}"
    if not np.all(np.isfinite(view)):
        raise AssertionError(f"{what}: non-finite output ({np.sum(~np.isfinite(view))} values)")
    e = bound_err(view, want, scale)
    if not e <= c["tol"]:
        raise AssertionError(f"{what}: error {e:.3g} of its terms' magnitudes exceeds {c['tol']:.3g}")
    outside = np.ones(got.shape, bool)
    outside[at:].reshape(-1, xs)[:t, :cols] = False
    if not np.array_equal(got[outside], c["before"][outside]):
        raise AssertionError(f"{what}: wrote outside the step's rows and columns")
    return e / 2.0 ** -24


def _case(name: str) -> dict:
    """The default case of a type: 131 rows in 3 parts (44, 44, 43), chunks of 16 rows (3, 3, 3: the last of each
    short), 13 tokens; every other type adds into dx."""
    return dict(n_out=131, t=13, parts=3, chunk_rows=16, accumulate=qo.TYPES.index(name) % 2 == 1)


@pytest.mark.parametrize("name", qo.TYPES)
def test_dx_back(env1, name):  # noqa: F811
    kw = _case(name)
    e = check_dx(env1, name, seed=qo.TYPES.index(name), **kw)
    MEASURED[name] = e
    print(f"dx_back {name}: {e:.2f} u (tolerance {dx_back_tol(16, 9) / 2.0 ** -24:.0f} u)")


@pytest.mark.slow
@pytest.mark.parametrize("name", qo.TYPES)
@pytest.mark.parametrize("t,n_out,parts,chunk_rows,accumulate", [
    (1, 67, 1, None, False),        # one token (a block of one), one part, the default chunking (one chunk)
    (3, 67, 2, 5, True),            # 34 + 33 rows, chunks of 5 (7 + 7), added into dx
    (13, 131, 1, 64, False),        # 64 + 64 + 3
    (13, 131, 3, None, True),       # three parts, one chunk each by default
    (64, 67, 1, 16, True),          # the step's largest token count here: 8 full blocks
    (5, 1000, 2, None, True),       # the default chunking past CHUNK_MIN: parts of 500 rows, chunks of 256 + 244
])
def test_dx_back_sweep(env1, name, t, n_out, parts, chunk_rows, accumulate):  # noqa: F811
    e = check_dx(env1, name, n_out, t, parts=parts, chunk_rows=chunk_rows, accumulate=accumulate, seed=t + n_out)
    print(f"dx_back {name} t={t} rows={n_out} parts={parts} chunk_rows={chunk_rows} acc={accumulate}: {e:.2f} u")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in qo.TYPES if BY_NAME[n].block == 32])
def test_dx_back_wider_rows(env1, name):  # noqa: F811
    """21 blocks of 32 (672 columns, 84 groups: one full 64-wide workgroup and 20 of the next)."""
    check_dx(env1, name, 67, 3, cols=32 * 21, chunk_rows=8, accumulate=True, seed=21)


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "F16"])
def test_fused_layouts(env1, name):  # noqa: F811
    """dy read from a fused row (offset 5, 9 more floats a token) and dx written into one (offset 3, 11 more):
    the QKV and gate|up rows' gradients. Floats between and around the rows must keep their bytes."""
    check_dx(env1, name, 67, 3, parts=2, chunk_rows=16, dy_at=(5, 9), dx_at=(3, 11), accumulate=True, seed=3)


def test_default_chunking():
    """The default rows a chunk: DX_TARGET invocations where the rows allow, within CHUNK_MIN .. CHUNK_MAX."""
    from lab.ops import Weight, WeightPart
    q4k = BY_NAME["Q4_K"]

    def w(rows, cols):
        return Weight("w", q4k, rows, cols, (WeightPart(None, 0, rows),))
    assert dx_chunk_rows(w(14336, 4096), 1) == 256            # 512 groups x 1 token block: 56 chunks of 256 rows
    assert dx_chunk_rows(w(151936, 896), 64) == 2082          # a vocabulary's rows: 73 chunks, 112 x 8 each
    assert dx_chunk_rows(w(151936, 256), 1) == CHUNK_MIN      # a narrow input and long rows: more chunks
    assert dx_chunk_rows(w(1 << 20, 4096), 64) == 4096        # never past CHUNK_MAX (lavapipe's loop budget)
    assert dx_chunk_rows(w(67, 96), 3) == CHUNK_MIN            # a small weight: one chunk


@pytest.mark.parametrize("name", ["Q6_K", "IQ3_S"])
def test_default_chunking_runs(env1, name):  # noqa: F811
    """A weight long enough for several default chunks: 600 rows, chunk_rows 256 at 1 token, over two parts."""
    check_dx(env1, name, 600, 1, parts=2, seed=6)


def test_bit_reproducible(env1):  # noqa: F811
    """Fixed summation order: two runs give the same bytes."""
    a, _ = run_dx(env1, "Q5_K", 131, 13, parts=3, chunk_rows=16, accumulate=True, seed=4)
    b, _ = run_dx(env1, "Q5_K", 131, 13, parts=3, chunk_rows=16, accumulate=True, seed=4)
    assert a.tobytes() == b.tobytes()


def test_refuses_shared_buffers(env1):  # noqa: F811
    dev = env1.device
    raw, _ = random_weight("Q8_0", 8, 32)
    w = weight_in_parts(dev, "Q8_0", raw, 32, 1)
    b = upload(dev, np.zeros(4096, np.float32))
    other = upload(dev, np.zeros(4096, np.float32))
    with pytest.raises(ValueError, match="three buffers"):
        dx_back(dev, env1.kernels, w, b, b, other, ops_step(env1), max_tokens=4)
    small = upload(dev, np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="sums"):
        dx_back(dev, env1.kernels, w, b, other, small, ops_step(env1), max_tokens=4)
    free(dev, b, other, small, w.parts[0].buffer)


# Broken variants: each must fail the check that the real kernels pass above (file, old, new, type, case).
DX_BREAKS = [
    # dy read at the part's own row, its first row dropped: parts after the first take the first part's dy
    ("backward_matmul", "let d = dy_at(t0, q, p.first_row + r);", "let d = dy_at(t0, q, r);", "Q4_K", {}),
    # the chunk's last row skipped
    ("backward_matmul", "for (var r = r0; r < r1; r++)", "for (var r = r0; r + 1u < r1; r++)", "Q8_0", {}),
    # every token of the invocation's block given the first token's dy
    ("backward_matmul", "min(t0 + q, step.n_tokens - 1u)", "min(t0, step.n_tokens - 1u)", "Q5_0", {}),
    # the block's last token's sums not stored
    ("backward_matmul", "for (var q = 0u; q < TQ; q++) { put(", "for (var q = 1u; q < TQ; q++) { put(", "Q8_0", {}),
    # the hi half's columns at e + 4 (right only where HALF = 4): a K type's group spans 64 columns
    ("backward_matmul", "sums[o + HALF] = hi.x;", "sums[o + 4u] = hi.x;", "Q6_K", {}),
    # a block's scale skipped: Q4_0's d (lo half), Q4_K's sub-block scale, IQ4_XS's 6-bit scale
    ("backward_matmul", "d * (nib_lo(q) - 8.0)", "(nib_lo(q) - 8.0)", "Q4_0", {}),
    ("backward_matmul", "dm.x * s.x * nib_lo(q)", "dm.x * nib_lo(q)", "Q4_K", {}),
    ("backward_matmul", "let dl = unpack2x16float(dsh).x * (f32(ls) - 32.0);", "let dl = unpack2x16float(dsh).x;",
     "IQ4_XS", {}),
    # the partial sums read with chunk and token transposed ([t][k] for [k][t])
    ("backward_gemm", "sums[(k * nt + t) * q.cols + c]", "sums[(t * q.chunks + k) * q.cols + c]", "Q4_1", {}),
    # the last chunk of the sum left out
    ("backward_gemm", "for (var k = 0u; k < q.chunks; k++)", "for (var k = 1u; k < q.chunks; k++)", "Q5_1", {}),
    # accumulate ignored: dx overwritten
    ("backward_gemm", "if (q.acc != 0u) { s += dx[o]; }", "", "F16", {"accumulate": True}),
]


@pytest.mark.parametrize("file,old,new,name,extra", DX_BREAKS)
def test_broken_variants_fail(env1, file, old, new, name, extra):  # noqa: F811
    kw = {**_case(name), **extra}
    with pytest.raises(AssertionError, match="exceeds|non-finite|outside"):
        check_dx(patched(env1, file, old, new), name, seed=11, **kw)
