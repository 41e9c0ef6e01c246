"""The projections' f32 gradients on the generic GEMM (wgsl/backward_gemm.wgsl via lab.ops.backward_matmul): an F32
weight's dW += dy^T x (dw_back, full fine-tuning; the gradient split into parts as the weight is), and a LoRA
adapter's dA, dB and input gradient (lora_back) on top of a quantized base's dx (dx_back): the whole backward of
y = W x + s B (A x) against the float64 oracle (lab/host/reference/grads.py lora_grad, linear_grad); then broken
variants the same checks must catch.

Every kernel of the GEMM runs each check (`kind`: gemm, one invocation an output; gemm_split, K over 16 lanes and a
tree, the one a GPU takes for long K; gemm_tiles, 64 x 64 outputs a workgroup over K in chunks of 16, the one a GPU
takes for a dW; a CPU adapter would otherwise run neither of the last two). Shapes fill no 8 x 8, 4 x 4 or 64 x 64
tile evenly: rank 5, 67, 131 or 200 output rows, 96, 136, 264 or 768 inputs, 13 tokens (3 for the part split, 37
for three chunks of K with a short last one). Errors are per element against the sum of the terms' magnitudes
through the whole chain (the oracle run on the inputs' absolute values), tolerances the chain's count of roundings
(grads.gemm_tol, dx_back_tol); -s prints them in units of 2^-24.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload, within  # noqa: F401  (env1: fixture)

from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.grads import U32, dx_back_tol, gemm_tol, linear_grad, lora_grad
from lab.host.reference.kernels import f32
from lab.ops.backward_matmul import KINDS, dw_back, dx_back, dx_chunks, dx_scratch_floats, lora_back
from lab.ops.weights import alloc_weight, upload_weight

SENTINEL = 7.0


def within_terms(what, got, want, scale, tol):
    """`within`, the scale the sum of the terms' magnitudes."""
    return within(what, got, want, scale, tol, "its terms' magnitudes")


def _tokens(rng, t: int, n: int, spare: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(values [t, n], the buffer's t + spare rows: NaN past the step, which no kernel may read)."""
    v = f32(rng.standard_normal((t, n)) * scale)
    return v, np.concatenate([v, np.full((spare, n), np.nan, np.float32)])


# -- dW of an F32 weight -------------------------------------------------------------------------------------------

def check_dw(env: Env, n_out: int, n_in: int, t: int, parts: int, seed: int = 0, kind: str = "gemm") -> float:
    """dw_back for t tokens (two more rows of NaN past the step) into a gradient already holding an earlier
    micro-batch's sum, cut into `parts` as alloc_weight cuts an F32 weight of the shape."""
    dev, rng = env.device, np.random.default_rng(seed)
    x, xb_host = _tokens(rng, t, n_in, 2)
    dy, dyb_host = _tokens(rng, t, n_out, 2, 2.0)
    dw0 = f32(rng.standard_normal((n_out, n_in)) * 3.0)
    per = -(-n_out // parts)
    dw = alloc_weight(dev, "dW", BY_NAME["F32"], n_out, n_in, max_binding=per * n_in * 4 + 3 if parts > 1 else None)
    assert len(dw.parts) == parts
    upload_weight(dev, dw, dw0.tobytes())
    xb, dyb = upload(dev, xb_host), upload(dev, dyb_host)
    run(env, dw_back(dev, env.kernels, dw.parts, n_in, xb, dyb, ops_step(env), max_tokens=t + 2, kind=kind), 0, t)
    got = np.concatenate([read(dev, p.buffer).reshape(p.n_rows, n_in) for p in dw.parts])
    free(dev, xb, dyb, *(p.buffer for p in dw.parts))
    _, want = linear_grad(np.zeros((n_out, n_in)), x, dy)
    scale = np.abs(dw0) + np.abs(dy).T.astype(np.float64) @ np.abs(x)
    return within_terms(f"dw_back {n_out}x{n_in} t={t} parts={parts} kind={kind}", got, dw0 + want, scale,
                        gemm_tol(t))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_out,n_in,t,parts", [(67, 264, 13, 1), (131, 96, 3, 3), (67, 264, 1, 2), (200, 136, 37, 2)])
def test_dw_back(env1, n_out, n_in, t, parts, kind):  # noqa: F811
    e = check_dw(env1, n_out, n_in, t, parts, seed=n_out + t, kind=kind)
    print(f"dw_back {n_out}x{n_in} t={t} parts={parts} kind={kind}: {e:.2f} u "
          f"(tolerance {gemm_tol(t) / U32:.0f} u)")


# -- LoRA on a quantized base --------------------------------------------------------------------------------------

def _lora_inputs(rng, n_out: int, n_in: int, rank: int) -> dict:
    """The adapter (A, B), its gradients' earlier values (dA0, dB0), in f32."""
    return dict(A=f32(rng.standard_normal((rank, n_in)) / np.sqrt(n_in)),
                B=f32(rng.standard_normal((n_out, rank)) * 0.5),
                dA0=f32(rng.standard_normal((rank, n_in))), dB0=f32(rng.standard_normal((n_out, rank))))


def run_projection_back(env: Env, name: str, n_out: int, n_in: int, rank: int, t: int, s: float,
                        seed: int = 0, kind: str = "gemm") -> dict:
    """dx_back through the quantized base (dx written), then lora_back (dA, dB added into, dx added into): the
    whole backward of y = W x + s B (A x) for t tokens. Returns the results read back and the inputs."""
    dev, rng = env.device, np.random.default_rng(seed)
    raw = qo.random_tensor(name, n_out, n_in, seed)
    c = dict(W=qo.dequant(raw, name).astype(np.float64), **_lora_inputs(rng, n_out, n_in, rank))
    c["x"], xb_host = _tokens(rng, t, n_in, 2)
    c["dy"], dyb_host = _tokens(rng, t, n_out, 2, 2.0)
    mt = t + 2
    w = alloc_weight(dev, "w", BY_NAME[name], n_out, n_in)
    upload_weight(dev, w, raw.tobytes())
    bufs = {k: upload(dev, v) for k, v in dict(x=xb_host, dy=dyb_host, A=c["A"], B=c["B"], dA=c["dA0"],
                                                 dB=c["dB0"], dx=np.full((mt, n_in), SENTINEL, np.float32),
                                                 u=np.full(mt * rank, np.nan, np.float32),
                                                 du=np.full(mt * rank, np.nan, np.float32),
                                                 sums=np.full(dx_scratch_floats(w, mt, 16), np.nan,
                                                              np.float32)).items()}
    ops = dx_back(dev, env.kernels, w, bufs["dy"], bufs["dx"], bufs["sums"], ops_step(env), max_tokens=mt,
                  chunk_rows=16)
    ops += lora_back(dev, env.kernels, (bufs["A"], bufs["B"]), (bufs["dA"], bufs["dB"]), (bufs["u"], bufs["du"]),
                     bufs["x"], bufs["dy"], bufs["dx"], ops_step(env), n_in=n_in, n_out=n_out, rank=rank, scale=s,
                     max_tokens=mt, kind=kind)
    run(env, ops, 0, t)
    c.update(dx=read(dev, bufs["dx"]).reshape(mt, n_in), dA=read(dev, bufs["dA"]).reshape(rank, n_in),
             dB=read(dev, bufs["dB"]).reshape(n_out, rank), chunks=dx_chunks(w, 16))
    free(dev, *bufs.values(), *(p.buffer for p in w.parts))
    return c


def check_projection_back(env: Env, name: str, n_out: int, n_in: int, rank: int, t: int, s: float,
                          seed: int = 0, kind: str = "gemm") -> dict[str, float]:
    """run_projection_back against lora_grad: dx (base and adapter), dA0 + dA, dB0 + dB, each per element within its
    chain's roundings (below); dx's rows past the step untouched. Returns the errors in units of 2^-24."""
    c = run_projection_back(env, name, n_out, n_in, rank, t, s, seed, kind)
    dx, da, db = lora_grad(c["W"], c["A"], c["B"], c["x"], c["dy"], s)
    absolute = [np.abs(c[k]).astype(np.float64) for k in ("W", "A", "B", "x", "dy")]
    sx, sa, sb = lora_grad(*absolute, abs(s))
    # dx: the base's chain (dx_back_tol) or the adapter's, du = s dy B (n_out products) then du A (rank), whichever
    # is longer; dA: du's chain then the sum over t tokens; dB: u = x A^T (n_in products) then t tokens.
    longest = min(16, n_out)
    tol_dx = max(dx_back_tol(longest, sum(c["chunks"])), gemm_tol(n_out) + gemm_tol(rank))
    what = f"projection_back {name} {n_out}x{n_in} rank={rank} t={t} s={s} kind={kind}"
    out = {"dx": within_terms(what + " dx", c["dx"][:t], dx, sx, tol_dx),
           "dA": within_terms(what + " dA", c["dA"], c["dA0"] + da, sa + np.abs(c["dA0"]),
                              gemm_tol(n_out) + gemm_tol(t)),
           "dB": within_terms(what + " dB", c["dB"], c["dB0"] + db, sb + np.abs(c["dB0"]),
                              gemm_tol(n_in) + gemm_tol(t))}
    if not np.all(c["dx"][t:] == SENTINEL):
        raise AssertionError(f"{what}: wrote dx rows past the step's tokens")
    return out


@pytest.mark.parametrize("name,n_out,n_in,rank,t,s", [
    ("Q4_K", 131, 768, 5, 13, 2.0),       # a K type's 96 groups, rank 5 of an 8 x 8 tile, scale alpha / r = 2
    ("Q8_0", 67, 96, 5, 3, 0.75),
    ("F16", 67, 264, 8, 1, 0.5),          # one token: the M = t GEMMs one row of tiles
])
@pytest.mark.parametrize("kind", KINDS)
def test_projection_back(env1, name, n_out, n_in, rank, t, s, kind):  # noqa: F811
    e = check_projection_back(env1, name, n_out, n_in, rank, t, s, seed=rank + t, kind=kind)
    print(f"projection_back {name} rank={rank} t={t} kind={kind}: "
          + ", ".join(f"{k} {v:.2f} u" for k, v in e.items()))


@pytest.mark.parametrize("kind", KINDS)
def test_lora_back_in_pieces(env1, kind):  # noqa: F811
    """lora_back(pieces=...): B's rows lying apart in dy's row, as qwen35's attn_q's do in the engine's fused row
    (each head's q rows first, its gate rows after the other tensors'; lab.engine.lora.members), against lora_grad on
    dy's columns gathered back into B's order; the columns between them must not count."""
    dev, rng = env1.device, np.random.default_rng(21)
    hd, rank, n_in, t, s, other = 12, 5, 72, 7, 1.5, 20
    n_out, width, mt = 4 * hd, 4 * hd + other, t + 2
    # the file's rows [q0 g0 q1 g1], the row's columns [q0 q1 | other | g0 g1]: (dy's column, B's row, rows)
    pieces = [(0, 0, hd), (hd, 2 * hd, hd), (2 * hd + other, hd, hd), (3 * hd + other, 3 * hd, hd)]
    c = _lora_inputs(rng, n_out, n_in, rank)
    x, xb = _tokens(rng, t, n_in, 2)
    dy, dyb = _tokens(rng, t, width, 2, 2.0)
    dx0 = f32(rng.standard_normal((mt, n_in)))
    bufs = {k: upload(dev, v) for k, v in dict(x=xb, dy=dyb, A=c["A"], B=c["B"], dA=c["dA0"], dB=c["dB0"], dx=dx0,
                                                 u=np.full(mt * rank, np.nan, np.float32),
                                                 du=np.full(mt * rank, np.nan, np.float32)).items()}
    run(env1, lora_back(dev, env1.kernels, (bufs["A"], bufs["B"]), (bufs["dA"], bufs["dB"]), (bufs["u"], bufs["du"]),
                        bufs["x"], bufs["dy"], bufs["dx"], ops_step(env1), n_in=n_in, n_out=n_out, rank=rank,
                        scale=s, max_tokens=mt, dy_stride=width, kind=kind, pieces=pieces), 0, t)
    got = {k: read(dev, bufs[k]) for k in ("dx", "dA", "dB")}
    free(dev, *bufs.values())
    gathered = np.zeros((t, n_out))
    for col, at, n in pieces:
        gathered[:, at:at + n] = dy[:, col:col + n]
    zero = np.zeros((n_out, n_in))
    dx, da, db = lora_grad(zero, c["A"], c["B"], x, gathered, s)
    sx, sa, sb = lora_grad(zero, np.abs(c["A"]), np.abs(c["B"]), np.abs(x), np.abs(gathered), abs(s))
    what = f"lora_back in pieces kind={kind}"
    within_terms(what + " dx", got["dx"].reshape(mt, n_in)[:t], dx0[:t] + dx, sx + np.abs(dx0[:t]),
                 gemm_tol(n_out) + gemm_tol(rank))
    within_terms(what + " dA", got["dA"].reshape(rank, n_in), c["dA0"] + da, sa + np.abs(c["dA0"]),
                 gemm_tol(n_out) + gemm_tol(t))
    within_terms(what + " dB", got["dB"].reshape(n_out, rank), c["dB0"] + db, sb + np.abs(c["dB0"]),
                 gemm_tol(n_in) + gemm_tol(t))


@pytest.mark.parametrize("kind", KINDS)
def test_lora_bit_reproducible(env1, kind):  # noqa: F811
    a = run_projection_back(env1, "Q5_K", 131, 768, 5, 13, 2.0, seed=3, kind=kind)
    b = run_projection_back(env1, "Q5_K", 131, 768, 5, 13, 2.0, seed=3, kind=kind)
    assert all(a[k].tobytes() == b[k].tobytes() for k in ("dx", "dA", "dB"))


# Broken variants of the GEMM: each must fail the checks above.
GEMM_BREAKS = [
    ("var v = p.scale * s;", "var v = s;"),                                     # the LoRA scale s missing
    ("i * p.a_si + k * p.a_sk", "i * p.a_sk + k * p.a_si"),                     # A's index transposed
    ("if (p.acc != 0u) { v += C[o]; }", ""),                                    # overwritten, not added into
    ("for (var k = 0u; k < kn; k++)", "for (var k = 0u; k + 1u < kn; k++)"),   # the last term (token) dropped
    ("(p.tok & b) != 0u", "(p.tok & b) > 7u"),                                  # the step's token count ignored
]


@pytest.mark.parametrize("old,new", GEMM_BREAKS)
def test_broken_lora_fails(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite|past the step"):
        check_projection_back(patched(env1, "backward_gemm", old, new), "Q4_K", 131, 768, 5, 13, 2.0, seed=5)


@pytest.mark.parametrize("old,new", GEMM_BREAKS[1:])
def test_broken_dw_fails(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_dw(patched(env1, "backward_gemm", old, new), 131, 96, 3, 3, seed=5)


# Broken variants of gemm_tiles: each must fail the dW check on the tiles kernel (three chunks of K, two parts), and
# the scale's the LoRA check (a dW's scale is 1).
TILE_BREAKS = [
    ("let kend = min(BK, kn - k0);", "let kend = min(BK - 1u, kn - k0);"),      # a chunk's last term dropped
    ("let ka = k0 + e / BM;", "let ka = e / BM;"),                               # every chunk reads A's first
    ("let tj = (li % 16u) * 4u;", "let tj = (li % 16u) * 3u;"),                   # columns of the tile lost
    ("if (p.acc != 0u) { v += C[o]; }\n                C[o] = v;", "C[o] = v;"),    # overwritten, not added into
]


@pytest.mark.parametrize("old,new", TILE_BREAKS)
def test_broken_tiles_fail(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_dw(patched(env1, "backward_gemm", old, new), 200, 136, 37, 2, seed=5, kind="tiles")


def test_broken_tiles_scale_fails(env1):  # noqa: F811
    broken = patched(env1, "backward_gemm", "var v = p.scale * sum[r * 4u + c];", "var v = sum[r * 4u + c];")
    with pytest.raises(AssertionError, match="exceeds|non-finite|past the step"):
        check_projection_back(broken, "Q4_K", 131, 768, 5, 13, 2.0, seed=5, kind="tiles")


# Broken variants of gemm_split: each must fail the same checks on the split kernel.
SPLIT_BREAKS = [
    ("var v = p.scale * red[li];", "var v = red[li];"),                          # the LoRA scale s missing
    ("if (p.acc != 0u) { v += C[c]; }", ""),                                    # overwritten, not added into
    ("var h = KS / 2u", "var h = KS / 4u"),                                     # the tree's first level dropped
    ("k += KS", "k += KS + 1u"),                                                # a lane's terms skipped
    ("i * p.a_si + k * p.a_sk", "i * p.a_sk + k * p.a_si"),                     # A's index transposed
]


@pytest.mark.parametrize("old,new", SPLIT_BREAKS)
def test_broken_split_fails(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite|past the step"):
        check_projection_back(patched(env1, "backward_gemm", old, new), "Q4_K", 131, 768, 5, 13, 2.0, seed=5,
                              kind="split")
