"""The output head fused with the cross-entropy (lab.ops.backward_head: the forward's matmul per slab of the
vocabulary, wgsl/backward_head.wgsl's statistics, merge, loss and dlogits, backward_matmul's dx_back and gemm)
against the float64 oracle (lab/host/reference/grads_head.py on gguf.quants' dequantization); then broken variants
the same check must catch.

Shapes fill no chunk or workgroup evenly: vocabularies of 1000 and 4099 rows (50,257 with --slow), cut into parts of
uneven rows, slabs whose last one is short and ce_stats chunks of 256 (or 100) rows whose last one is short; widths
of 64, 96 and 576 (the 256-element types 256 and 768); 1, 3 and 13 tokens, two rows past the step holding NaN in xn.
Every value is held to its own bound (grads_head.head_bounds: counts of f32 roundings against the magnitudes of
what they round, the logits' error carried through), reported as the fraction of it used; -s prints them.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab import gpu
from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.grads_head import NO_TARGET, head_bounds, head_grad, head_loss
from lab.host.reference.kernels import f32
from lab.ops import Weight, WeightPart
from lab.ops.backward_head import (LOOP_MAX, SLAB_ALIGN, SLAB_FLOATS, STATS_ROWS, free_head_ce, head_back, head_ce,
                                   head_layout)
from lab.ops.backward_head import head_loss as head_loss_ops
from lab.ops.backward_matmul import dx_chunk_rows, dx_chunks
from tests.kernels.quant_rig import random_weight, weight_in_parts

SENTINEL = 7.0
MEASURED: dict[str, dict] = {}     # case -> fractions of the bounds used (the report's numbers)
def _inputs(W: np.ndarray, t: int, spread: float, masked: tuple, rng) -> tuple[np.ndarray, np.ndarray]:
    """xn [t, cols] scaled so the logits' standard deviation is `spread`, and targets with the first and last rows
    of the vocabulary among them and NO_TARGET (or an id past the vocabulary) at the rows `masked`."""
    vocab, cols = W.shape
    x = rng.standard_normal((t, cols))
    x = f32(x * spread / max(np.std(x @ W.T), 1e-30))
    targets = rng.integers(0, vocab, t).astype(np.uint32)
    targets[0] = vocab - 1
    if t > 2:
        targets[2] = 0
    for i, r in enumerate(masked):
        targets[r] = NO_TARGET if i % 2 == 0 else vocab + 5
    return x, targets


def _rows(t: int, n: int, stride: int, offset: int, spare: int, fill: float, values: np.ndarray) -> np.ndarray:
    """A buffer of t + spare token rows of `stride` floats after `offset` floats, `values` [t, n] in the first n of
    each of the first t rows, `fill` everywhere else."""
    buf = np.full(offset + (t + spare) * stride, fill, np.float32)
    buf[offset:].reshape(t + spare, stride)[:t, :n] = values
    return buf


def _dw(dev, vocab: int, cols: int, rng) -> tuple[np.ndarray, list, list]:
    """dW0 [vocab, cols] (small values: dW is added into) in two parts of rows, cut where no slab is."""
    dw0 = f32(rng.standard_normal((vocab, cols)) * 1e-4)
    cut = vocab // 2 + 1
    bufs = [upload(dev, dw0[:cut]), upload(dev, dw0[cut:])]
    return dw0, bufs, [WeightPart(bufs[0], 0, cut), WeightPart(bufs[1], cut, vocab - cut)]


def run_head(env: Env, name: str, vocab: int, cols: int, t: int, *, parts: int = 1, cap: float = 0.0,
             spread: float = 3.0, masked: tuple = (), slab_rows: int | None = None, stats_rows: int = STATS_ROWS,
             dx_rows: int | None = None, accumulate: bool = False, dw: bool = False, rows_total: int = 0,
             at: tuple = (0, 0, 0, 0, 0), spare: int = 2, seed: int = 0) -> tuple[dict, dict]:
    """head_loss then head_back over a random head and inputs for t tokens (max_tokens t + spare: rows past the step
    hold NaN in xn and must not be read, SENTINEL in dxn and must stay); dW (F32 heads) into two parts of rows.
    at = (xn's offset, its extra floats a row, dxn's offset, its extra floats a row, the targets' offset): the fused
    layouts. Returns what the kernels left and what the check needs."""
    dev, rng = env.device, np.random.default_rng(seed)
    raw, W = random_weight(name, vocab, cols, seed)
    w = weight_in_parts(dev, name, raw, cols, parts)
    x, targets = _inputs(W, t, spread, masked, rng)
    mt, xs, ds = t + spare, cols + at[1], cols + at[3]
    dx0 = f32(rng.standard_normal((t, cols)) * 1e-3) if accumulate else np.full((t, cols), SENTINEL, np.float32)
    dx_host = _rows(t, cols, ds, at[2], spare, SENTINEL, dx0)
    xb, dxb = upload(dev, _rows(t, cols, xs, at[0], spare, np.nan, x)), upload(dev, dx_host)
    tb = upload(dev, np.concatenate([np.full(at[4], 3, np.uint32), targets, np.zeros(spare, np.uint32)]))
    ce = head_ce(dev, w, mt, cap=cap, slab_rows=slab_rows, stats_rows=stats_rows, dx_chunk_rows=dx_rows)
    dw0, dwb, dw_parts = _dw(dev, vocab, cols, rng) if dw else (None, [], None)
    lay = dict(x_offset=at[0], x_stride=xs, target_offset=at[4])
    ops = head_loss_ops(dev, env.kernels, ce, xb, tb, ops_step(env), rows_total=rows_total, **lay)
    ops += head_back(dev, env.kernels, ce, xb, tb, dxb, ops_step(env), accumulate=accumulate, dw=dw_parts,
                     dx_offset=at[2], dx_stride=ds, **lay)
    run(env, ops, 0, t)
    dx = read(dev, dxb)
    got = {"loss": read(dev, ce.loss), "nll": read(dev, ce.nll)[:t], "dx": dx[at[2]:].reshape(mt, ds)[:t, :cols].copy(),
           "before": dx_host, "after": dx, "dw": np.concatenate([read(dev, b).reshape(-1, cols) for b in dwb])
           if dw else None}
    got["after"][at[2]:].reshape(mt, ds)[:t, :cols] = got["before"][at[2]:].reshape(mt, ds)[:t, :cols]
    rows = [dx_rows or dx_chunk_rows(s.view, mt) for s in ce.slabs]
    counts = dict(stats_rows=stats_rows, chunks=ce.chunks, dx_rows=min(max(rows), ce.stride),
                  dx_chunks=sum(dx_chunks(s.view, r)[0] for s, r in zip(ce.slabs, rows)) + len(ce.slabs))
    free_head_ce(dev, ce)
    free(dev, xb, tb, dxb, *dwb, *(p.buffer for p in w.parts))
    return got, dict(W=W, x=x, targets=targets, cap=cap, t=t, dx0=dx0 if accumulate else 0.0, dw0=dw0,
                     rows_total=rows_total or None, counts=counts)


def _frac(what: str, got, want, bound) -> float:
    """The largest |got - want| / bound; AssertionError on a non-finite value or past the bound."""
    got = np.asarray(got, np.float64)
    if not np.all(np.isfinite(got)):
        raise AssertionError(f"{what}: non-finite output ({np.sum(~np.isfinite(got))} values)")
    err = np.abs(got - want)
    if np.any(err[bound == 0] != 0):
        raise AssertionError(f"{what}: error {np.max(err[bound == 0]):.3g} exceeds 0 (an exact value)")
    frac = float(np.max(err / np.where(bound > 0, bound, 1.0)))
    if not frac <= 1.0:
        raise AssertionError(f"{what}: error exceeds its bound by {frac:.3g} times")
    return frac


def check_head(env: Env, name: str, vocab: int, cols: int, t: int, **kw) -> dict:
    """run_head, then the loss, each row's nll, dxn and dW against the oracle within grads_head's bounds, the count
    and 1 / N exact, and dxn's rows past the step untouched. Returns the fractions of the bounds used."""
    got, c = run_head(env, name, vocab, cols, t, **kw)
    W, x, tg, cap, rt = c["W"], c["x"], c["targets"], c["cap"], c["rows_total"]
    what = f"head {name} vocab={vocab} cols={cols} t={t} cap={cap}"
    f = head_loss(W, x, tg, cap, rt)
    g = head_grad(W, x, tg, cap, rt)
    b = head_bounds(W, x, tg, cap, rows_total=rt, dx0=c["dx0"], dw0=0.0 if c["dw0"] is None else c["dw0"],
                    **c["counts"])
    out = {"loss": _frac(f"{what} loss", got["loss"][0], f["loss"], np.float64(b["loss"])),
           "nll": _frac(f"{what} nll", got["nll"], f["nll"], b["nll"])}
    out["dx"] = _frac(f"{what} dxn", got["dx"], c["dx0"] + g["dxn"], b["dxn"])
    if not np.array_equal(got["after"], got["before"]):
        raise AssertionError(f"{what}: wrote dxn outside the step's rows and columns")
    if got["dw"] is not None:
        out["dw"] = _frac(f"{what} dW", got["dw"], c["dw0"] + g["dw"], b["dw"])
    # for the report: dxn's error in units of 2^-24 of the sum of its terms' magnitudes, sum |dlogits| |W| + |dx0|
    scale = np.abs(g["dz"]) @ np.abs(W) + np.abs(c["dx0"])
    out["dx_u"] = float(np.max(np.abs(got["dx"] - c["dx0"] - g["dxn"]) / np.maximum(scale, 1e-30)) / 2.0 ** -24)
    out["loss_abs"] = abs(float(got["loss"][0]) - f["loss"])
    if got["loss"][1] != f["mask"].sum() or got["loss"][2] != np.float32(1.0 / f["n"]):
        raise AssertionError(f"{what}: count {got['loss'][1]} or 1/N {got['loss'][2]}: error exceeds 0 (exact: "
                             f"{f['mask'].sum()}, 1/{f['n']})")
    return out


# The default set: (type, vocab, cols, t, keywords). Spreads: the logits' standard deviation.
CASES = {
    "f32-64": ("F32", 1000, 64, 3, dict(masked=(1,), dw=True)),
    "f32-96-parts-cap": ("F32", 4099, 96, 13, dict(parts=3, cap=4.0, spread=5.0, masked=(4, 9), slab_rows=512,
                                                   stats_rows=100, dx_rows=200, dw=True, accumulate=True)),
    "q8_0-576-parts": ("Q8_0", 4099, 576, 13, dict(parts=2, masked=(0, 7, 12), slab_rows=1024)),
    "q8_0-96-t1-cap": ("Q8_0", 1000, 96, 1, dict(cap=4.0, spread=5.0)),
    "q4_k-256-cap": ("Q4_K", 1000, 256, 3, dict(cap=4.0, spread=4.0, masked=(1,))),
    "q6_k-768-parts": ("Q6_K", 4099, 768, 13, dict(parts=2, masked=(5,), rows_total=20, slab_rows=768)),
    "iq4_nl-96": ("IQ4_NL", 1000, 96, 3, dict(masked=(2,))),
    "large-logits": ("Q8_0", 1000, 64, 3, dict(spread=80.0, masked=(1,))),
    # xn and dxn in fused rows (offsets 5 and 2, 3 and 1 floats more a row), the targets one id on (a window's ids)
    "fused-rows": ("Q5_0", 1000, 96, 3, dict(at=(5, 3, 2, 1, 1), accumulate=True, masked=(1,))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_head(env1, case):  # noqa: F811
    name, vocab, cols, t, kw = CASES[case]
    out = check_head(env1, name, vocab, cols, t, seed=len(case), **kw)
    MEASURED[case] = out
    print(f"head {case}: " + ", ".join(f"{k} {out[k]:.2g}" for k in ("loss", "nll", "dx", "dw") if k in out)
          + f" of the bounds; dxn {out['dx_u']:.2g} u of sum |dlogits| |W|, loss off by {out['loss_abs']:.2g}")


@pytest.mark.slow
@pytest.mark.parametrize("name,vocab,cols,kw", [
    ("Q8_0", 50257, 576, dict(parts=3, cap=30.0, spread=20.0, masked=(3,))),       # default slabs: one a part
    ("Q4_K", 50257, 256, dict(slab_rows=4096, masked=(0, 12))),                   # 13 slabs, the last short
    ("F32", 50257, 64, dict(parts=2, slab_rows=8192, dw=True, accumulate=True)),
])
def test_head_large_vocab(env1, name, vocab, cols, kw):  # noqa: F811
    out = check_head(env1, name, vocab, cols, 13, seed=vocab % 97, **kw)
    print(f"head {name} vocab={vocab}: " + ", ".join(f"{k} {v:.2g}" for k, v in out.items()))


def cols_for(name: str) -> int:
    """Three of the type's blocks (768 for the 256-element ones), 96 columns of the 32-element ones, 264 floats."""
    block = BY_NAME[name].block
    return 3 * block if block > 1 else 264


@pytest.mark.slow
@pytest.mark.parametrize("name", qo.TYPES)
def test_head_every_type(env1, name):  # noqa: F811
    out = check_head(env1, name, 1000, cols_for(name), 5, parts=2, cap=4.0 * (qo.TYPES.index(name) % 2),
                     masked=(2,), seed=qo.TYPES.index(name))
    print(f"head {name}: " + ", ".join(f"{k} {v:.2g}" for k, v in out.items()))


def test_no_target_at_all(env1):  # noqa: F811
    """A step whose rows all lack a target: loss, count and 1 / N are 0 and dxn is written as exact zeros."""
    got, _ = run_head(env1, "Q8_0", 1000, 64, 3, masked=(0, 1, 2), seed=5)
    assert np.all(got["loss"] == 0.0) and np.all(got["nll"] == 0.0)
    assert np.all(got["dx"] == 0.0) and np.array_equal(got["after"], got["before"])


def test_bit_reproducible(env1):  # noqa: F811
    """Fixed summation orders: two runs give the same bytes."""
    kw = dict(parts=2, cap=4.0, masked=(3,), slab_rows=512, stats_rows=100, dx_rows=200, seed=4)
    a, _ = run_head(env1, "Q4_0", 1000, 64, 13, **kw)
    b, _ = run_head(env1, "Q4_0", 1000, 64, 13, **kw)
    for key in ("loss", "nll", "dx"):
        assert a[key].tobytes() == b[key].tobytes()


# Broken variants: each must fail the check that the real kernels pass above (old, new, case).
HEAD_BREAKS = [
    # the chunk's max not subtracted: exact algebra, but exp(l) overflows once logits pass ~88
    ("let m = chunk_max(row, r0, r1);", "let m = 0.0;", "large-logits"),
    # one chunk's sum of exps dropped from the merge
    ("s += st.y * exp(st.x - m);", "s += select(st.y * exp(st.x - m), 0.0, k == 1u);", "f32-64"),
    # the merge of the chunks' maxima wrong: each chunk's sum not rescaled to the common max, or rescaled backwards,
    # or the last chunk's max taken for the common one (right algebra, overflows where the chunks' maxima differ)
    ("s += st.y * exp(st.x - m);", "s += st.y;", "iq4_nl-96"),
    ("s += st.y * exp(st.x - m);", "s += st.y * exp(m - st.x);", "q8_0-576-parts"),
    ("m = max(m, m_stats[k * nt + t].x);", "m = m_stats[k * nt + t].x;", "large-logits"),
    # the target's one-hot not subtracted, or tested against the slab's row instead of the vocabulary's id
    ("let d = prob - select(0.0, 1.0, d_p.v0 + r == tgt);", "let d = prob;", "q4_k-256-cap"),
    ("d_p.v0 + r == tgt", "r == tgt", "q8_0-576-parts"),
    # the 1 / N missing
    ("s_out[2] = select(0.0, 1.0 / n, n > 0.0);", "s_out[2] = select(0.0, 1.0, n > 0.0);", "q6_k-768-parts"),
    # rows without a target not masked: their dlogits, their nll, their count (each variant still reads the targets:
    # a binding left unread leaves the pipeline's layout)
    ("if (tgt >= d_p.n_vocab) { d_L[i] = 0.0; return; }", "", "iq4_nl-96"),
    ("select(0.0, lse - m_tl[t],", "select(lse - m_tl[t], lse - m_tl[t],", "f32-64"),
    ("if (s_targets[s_p.t_off + t] < s_p.n_vocab) {", "if (s_targets[s_p.t_off + t] <= 0xFFFFFFFFu) {",
     "q8_0-576-parts"),
    # the soft-cap's derivative missing, or the target's logit taken before the cap
    ("d_L[i] = d * cap_slope(z, d_p.cap) * d_out[2];", "d_L[i] = d * d_out[2];", "q8_0-96-t1-cap"),
    ("tl[t] = capped(L[row + j], p.cap);", "tl[t] = L[row + j];", "f32-96-parts-cap"),
    # a chunk's last row left out of its sum
    ("for (var r = r0; r < r1; r++) { s += ", "for (var r = r0; r + 1u < r1; r++) { s += ", "q6_k-768-parts"),
]


@pytest.mark.parametrize("old,new,case", HEAD_BREAKS)
def test_broken_variants_fail(env1, old, new, case):  # noqa: F811
    name, vocab, cols, t, kw = CASES[case]
    with pytest.raises(AssertionError, match="exceeds|non-finite|outside") as err:
        check_head(patched(env1, "backward_head", old, new), name, vocab, cols, t, seed=len(case), **kw)
    print(f"broken {new[:50]!r} on {case}: {str(err.value)[:160]}")


class _Part:
    """A stand-in for a part's buffer: head_layout reads only its label."""
    label = "head"


def _head(rows: int, cols: int, parts: int = 1, name: str = "Q4_K") -> Weight:
    t, per = BY_NAME[name], -(-rows // parts)
    return Weight("head", t, rows, cols, tuple(WeightPart(_Part(), a, min(per, rows - a)) for a in range(0, rows, per)))


def test_layout():
    """The slabs and scratch sizes: never a [t, n_vocab] logits matrix past one slab's SLAB_FLOATS."""
    gemma = _head(262144, 2560)
    lay = head_layout(gemma, 64)                 # 64 tokens: 4 slabs of 65,536 rows, 16 MiB of logits, not 64 MiB
    assert len(lay.slabs) == 4 and lay.floats["logits"] == 64 * 65536 == SLAB_FLOATS
    assert lay.chunks == 1024 and lay.floats["stats"] == 2 * 1024 * 64
    assert lay.floats["sums"] <= 1 << 22         # dx_back's own bound: ~64 x DX_TARGET floats
    assert len(head_layout(gemma, 1).slabs) == 1 and head_layout(gemma, 1).floats["logits"] == 262144
    assert len(head_layout(gemma, 512).slabs) == 32      # 8,192 rows a slab
    qwen = _head(151936, 1024, parts=3)          # parts of 50,646 rows: slabs restart at each part
    lay = head_layout(qwen, 64, slab_rows=16384)
    assert [s.v0 for s in lay.slabs] == [0, 16384, 32768, 49152, 50646, 67030, 83414, 99798, 101292, 117676, 134060,
                                         150444]
    rb = qwen.row_bytes                          # 576 bytes: a slab's offset in its part is 256 rows of them
    assert all(s.view.parts[0].buffer.offset % 256 == 0 and s.view.parts[0].buffer.offset % rb == 0
               for s in lay.slabs)
    assert lay.stride == 16384 and lay.chunks == 3 * (3 * 64 + 6)     # 1,494 rows: 5 chunks of 256 and one short


def test_layout_refusals():
    w = _head(262144, 256)
    with pytest.raises(ValueError, match="multiples"):
        head_layout(w, 8, slab_rows=1000)                        # a slab's offset would miss the binding alignment
    with pytest.raises(ValueError, match="loop budget"):
        head_layout(w, LOOP_MAX + 1)                            # ce_loss walks the step's rows
    with pytest.raises(gpu.GpuError, match="loop budget"):
        head_layout(w, 8, stats_rows=8)                         # 32,768 chunks: ce_merge walks them twice
    assert head_layout(w, 8, stats_rows=16).chunks == LOOP_MAX // 2
    assert SLAB_ALIGN * BY_NAME["Q8_0"].row_bytes(96) % 256 == 0


def test_refuses_arguments(env1):  # noqa: F811
    dev = env1.device
    raw, _ = random_weight("Q8_0", 300, 32)
    w = weight_in_parts(dev, "Q8_0", raw, 32, 1)
    ce = head_ce(dev, w, 4)
    x, short = upload(dev, np.zeros(4 * 32, np.float32)), upload(dev, np.zeros(3, np.uint32))
    with pytest.raises(ValueError, match="targets"):
        head_loss_ops(dev, env1.kernels, ce, x, short, ops_step(env1))
    ids, dx = upload(dev, np.zeros(4, np.uint32)), upload(dev, np.zeros(4 * 32, np.float32))
    with pytest.raises(ValueError, match="rows"):
        head_back(dev, env1.kernels, ce, x, ids, dx, ops_step(env1), dw=[WeightPart(dx, 0, 4)])
    with pytest.raises(ValueError, match="soft-cap"):
        head_ce(dev, w, 4, cap=-1.0)
    free_head_ce(dev, ce)
    free(dev, x, short, ids, dx, w.parts[0].buffer)


def test_broken_orchestration_fails(env1, monkeypatch):  # noqa: F811
    """head_back's slabs broken in Python: the earlier slabs' logits not recomputed (their dlogits made from the last
    slab's, left in the scratch), and each slab's dxn written over the previous ones' instead of added."""
    import sys

    import lab.ops.backward_head as bh
    name, vocab, cols, t, kw = CASES["q8_0-576-parts"]
    in_back = []
    real_logits, real_back = bh._slab_logits, bh.head_back

    def back(*a, **k):
        in_back.append(True)
        try:
            return real_back(*a, **k)
        finally:
            in_back.clear()
    monkeypatch.setattr(bh, "_slab_logits", lambda *a: [] if in_back else real_logits(*a))
    monkeypatch.setattr(sys.modules[__name__], "head_back", back)
    with pytest.raises(AssertionError, match="exceeds") as err:
        check_head(env1, name, vocab, cols, t, seed=3, **kw)
    print(f"broken: logits not recomputed: {str(err.value)[:120]}")
    monkeypatch.undo()
    real_dx = bh.dx_back
    monkeypatch.setattr(bh, "dx_back", lambda *a, **k: real_dx(*a, **{**k, "accumulate": False}))
    with pytest.raises(AssertionError, match="exceeds") as err:
        check_head(env1, name, vocab, cols, t, seed=3, **kw)
    print(f"broken: slabs' dxn overwritten: {str(err.value)[:120]}")
