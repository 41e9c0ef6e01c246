"""Causal attention backward (wgsl/backward_attention.wgsl via lab.ops.backward_attention.attention_back) against
the float64 oracle (lab/host/reference/grads_attention.py attention_grad): GQA groups 1 and 3, a sliding window,
the logit soft-cap, pos 0 and later (keys before the step), heads of 64, 80 and 96, token counts of 1, 3, 13 and 37
(no 64-wide workgroup of query rows or key rows filled evenly); Q, K and V compact or read from a fused [q | k | v]
row and an f32 cache, the gradients written into a fused [dq | dk | dv] row; the O the backward takes from the oracle
(rounded to f32) or from the forward kernel itself (attention.wgsl). Then bit-reproducibility and broken variants the
same check must catch.

Errors are per element against the sum of the magnitudes of each gradient's terms, the tolerances counts of f32
roundings (grads_attention.attention_tols says where each comes from); -s prints both in units of u = 2^-24.
Key rows past the step hold random values (a kernel that reads them with a wrong mask gets finite, wrong results),
query rows past the step NaN (no kernel may read them); gradient rows past what the step writes must keep their bytes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from checks import Env, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.host.reference import grads_attention as ga
from lab.host.reference.grads import U32, bound_err
from lab.host.reference.kernels import f32
from lab.ops import attention as fwd
from lab.ops.backward_attention import (LOOP_LIMIT, attention_back, loop_iterations, stats_bytes, tile_iterations,
                                       tile_sub)

SENTINEL = 7.0
EPS32 = 2.0 ** -23


def _inputs(rng, t: int, n_ctx: int, nh: int, nkv: int, hd: int, size: float = 1.5) -> dict:
    """q, do [t, nh, hd]; k, v [n_ctx, nkv, hd], f32. Q and K at `size` 1.5: scores of a few units, where a cap of 3
    to 5 curves (its derivative from ~1 down to ~0.1)."""
    return dict(q=f32(rng.standard_normal((t, nh, hd)) * size), k=f32(rng.standard_normal((n_ctx, nkv, hd)) * size),
                v=f32(rng.standard_normal((n_ctx, nkv, hd))), do=f32(rng.standard_normal((t, nh, hd))))


def _padded(a: np.ndarray, rows: int, fill: float) -> np.ndarray:
    """a's rows flattened to [len(a), width], then `rows` rows of `fill`."""
    a = a.reshape(a.shape[0], -1)
    return np.concatenate([a, np.full((rows, a.shape[1]), fill, np.float32)])


def _forward_o(env: Env, x: dict, pos: int, t: int, n_ctx: int, hd: int, sc: float, window: int, softcap: float):
    """The forward kernel's O (attention.wgsl prefill) of the same inputs, and its error bound: test_attention.py's
    8 eps32 (L1 + 16) max|V|, L1 the largest score's terms' magnitude."""
    dev, (_, nh, _), nkv = env.device, x["q"].shape, x["k"].shape[1]
    qb, kb, vb = upload(dev, x["q"]), upload(dev, x["k"]), upload(dev, x["v"])
    ob = upload(dev, np.full((t, nh * hd), np.nan, np.float32))
    ops = fwd.attention(dev, env.kernels, qb, kb, vb, ob, ops_step(env), n_head=nh, n_kv_head=nkv, head_dim=hd,
                        q_stride=nh * hd, q_offset=0, n_ctx=n_ctx, scale=sc, window=window, softcap=softcap,
                        mode="prefill", max_tokens=t)
    run(env, ops, pos, t, n_ctx)
    o = read(dev, ob).reshape(t, nh, hd)
    free(dev, qb, kb, vb, ob)
    q64, k64 = np.abs(x["q"].astype(np.float64)), np.abs(x["k"][:pos + t].astype(np.float64))
    l1 = max(float(np.max(q64[:, h] @ k64[:, h // (nh // nkv)].T)) for h in range(nh)) * sc
    return o, 8 * EPS32 * (l1 + 16) * float(np.max(np.abs(x["v"][:pos + t])))


def _buffers(env: Env, x: dict, o: np.ndarray, t: int, n_ctx: int, fused: bool) -> dict:
    """The device's buffers: compact rows (q, o, do and dq with two rows past the step; k, v, dk, dv n_ctx rows and
    one more), or fused: q in a [q | k | v] row and dq, dk, dv in one [dq | dk | dv] gradient buffer."""
    dev, (_, nh, hd), nkv = env.device, x["q"].shape, x["k"].shape[1]
    b = dict(k=upload(dev, x["k"]), v=upload(dev, x["v"]), o=upload(dev, _padded(o, 2, np.nan)),
             do=upload(dev, _padded(x["do"], 2, np.nan)), stats=upload(dev, np.full(stats_bytes(t, nh) // 4, np.nan,
                                                                                        np.float32)))
    if not fused:
        b.update(q=upload(dev, _padded(x["q"], 2, np.nan)), dq=upload(dev, np.full((t + 2, nh * hd), SENTINEL,
                                                                                   np.float32)),
                 dk=upload(dev, np.full((n_ctx + 1, nkv * hd), SENTINEL, np.float32)),
                 dv=upload(dev, np.full((n_ctx + 1, nkv * hd), SENTINEL, np.float32)))
        return b
    width = (nh + 2 * nkv) * hd
    src = np.concatenate([x["q"].reshape(t, -1), np.full((t, 2 * nkv * hd), np.nan, np.float32)], axis=1)
    b["src"] = upload(dev, _padded(src, 2, np.nan))
    b["grad"] = upload(dev, np.full((n_ctx + 1, width), SENTINEL, np.float32))
    b.update(q=(b["src"], 0, width), dq=(b["grad"], 0, width), dk=(b["grad"], nh * hd, width),
             dv=(b["grad"], (nh + nkv) * hd, width))
    return b


def _read_grads(env: Env, b: dict, t: int, n_ctx: int, nh: int, nkv: int, hd: int, fused: bool) -> dict:
    """dq [t + 2, nh * hd], dk and dv [n_ctx + 1, nkv * hd] as the buffers hold them (rows past the step included)."""
    if not fused:
        return {n: read(env.device, b[n]).reshape(-1, (nh if n == "dq" else nkv) * hd) for n in ("dq", "dk", "dv")}
    g = read(env.device, b["grad"]).reshape(n_ctx + 1, -1)
    return dict(dq=g[:t + 2, :nh * hd], dk=g[:, nh * hd:(nh + nkv) * hd], dv=g[:, (nh + nkv) * hd:])


def check_attention_back(env: Env, t: int, pos: int, nh: int, nkv: int, hd: int, window: int = 0,
                         softcap: float = 0.0, fused: bool = False, forward_o: bool = False, spare: int = 3,
                         size: float = 1.5, seed: int = 0, lanes: int | None = None,
                         tiles: bool | None = None) -> dict:
    """attention_back for a step of t queries at pos over pos + t keys (`spare` more rows of keys past them), with
    `lanes` lanes a row (None: the adapter's default, one on a CPU adapter) or the tiles (`tiles`; None: the adapter's
    default, the lanes on a CPU adapter). Returns
    each gradient's (error, tolerance) in units of u; raises AssertionError past a tolerance or when a row past the
    step changed. Also returns the raw gradients (reproducibility)."""
    rng = np.random.default_rng(seed)
    n_keys, n_ctx, sc = pos + t, pos + t + spare, 1.0 / math.sqrt(hd)
    x = _inputs(rng, t, n_ctx, nh, nkv, hd, size)
    kw = dict(n_kv_head=nkv, scale=sc, window=window, softcap=softcap)
    o, o_err = (_forward_o(env, x, pos, t, n_ctx, hd, sc, window, softcap) if forward_o else
                (f32(ga.attention(x["q"], x["k"][:n_keys], x["v"][:n_keys], pos, **kw)), 0.0))
    b = _buffers(env, x, o, t, n_ctx, fused)
    run(env, attention_back(env.device, env.kernels, b["q"], b["k"], b["v"], b["o"], b["do"], b["dq"], b["dk"],
                            b["dv"], b["stats"], ops_step(env), n_head=nh, n_kv_head=nkv, head_dim=hd, n_ctx=n_ctx,
                            max_tokens=t, scale=sc, window=window, softcap=softcap, lanes=lanes, tiles=tiles),
        pos, t, n_ctx)
    got = _read_grads(env, b, t, n_ctx, nh, nkv, hd, fused)
    free(env.device, *(v if not isinstance(v, tuple) else v[0] for v in b.values()))
    what = (f"attention_back t={t} pos={pos} {nh}/{nkv} hd={hd} W={window} cap={softcap} fused={fused} "
            f"lanes={lanes} tiles={tiles}")
    want = dict(zip(("dq", "dk", "dv"), ga.attention_grad(x["q"], x["k"][:n_keys], x["v"][:n_keys], x["do"], pos,
                                                            **kw)))
    tols = ga.attention_tols(x["q"], x["k"][:n_keys], x["v"][:n_keys], x["do"], pos, o_err=o_err, **kw)
    out = {"raw": got}
    for name, rows in (("dq", t), ("dk", n_keys), ("dv", n_keys)):
        g = got[name][:rows].reshape(want[name].shape)
        if not np.all(np.isfinite(g)):
            raise AssertionError(f"{what} {name}: non-finite output ({np.sum(~np.isfinite(g))} values)")
        scale, tol = tols[name]
        e = bound_err(g, want[name], scale)
        if not e <= tol:
            raise AssertionError(f"{what} {name}: error {e / U32:.3g} u of its terms' magnitudes exceeds "
                                 f"{tol / U32:.0f} u")
        if not np.all(got[name][rows:] == SENTINEL):
            raise AssertionError(f"{what} {name}: wrote rows past the step's")
        out[name] = (e / U32, tol / U32)
    return out


def _report(what: str, r: dict) -> None:
    print(what + ": " + ", ".join(f"{n} {r[n][0]:.2f} u (tol {r[n][1]:.0f} u)" for n in ("dq", "dk", "dv")))


CASES = [  # t, pos, n_head, n_kv_head, head_dim, window, softcap
    (1, 0, 3, 1, 64, 0, 0.0),          # one query, one key; GQA 3
    (3, 5, 6, 2, 96, 0, 0.0),          # keys before the step, GQA 3
    (13, 0, 4, 4, 64, 5, 0.0),         # window of 5: early keys leave the window
    (13, 7, 3, 1, 80, 0, 3.0),         # the cap, GQA 3 over one KV head
    (37, 11, 6, 2, 64, 16, 5.0),       # window, cap, GQA 3, pos > 0: keys 0 .. 11 seen only by the first queries
    (37, 0, 2, 2, 96, 0, 0.0),         # plain causal, 37 x 2 rows
]


# The broken variants' shapes (heads of 32: each variant compiles its three kernels, ~1 s a variant on lavapipe at 32,
# ~3 s at 64); the real kernels pass them in test_bit_reproducible.
GQA_CAP = (13, 7, 6, 2, 32, 0, 3.0)
WINDOW = (13, 7, 6, 2, 32, 5, 0.0)


@pytest.mark.parametrize("t,pos,nh,nkv,hd,window,softcap", CASES)
def test_attention_back(env1, t, pos, nh, nkv, hd, window, softcap):  # noqa: F811
    r = check_attention_back(env1, t, pos, nh, nkv, hd, window, softcap, seed=t * 100 + pos)
    _report(f"attention_back t={t} pos={pos} {nh}/{nkv} hd={hd} W={window} cap={softcap}", r)


def test_fused_rows(env1):  # noqa: F811
    """Q read from a fused [q | k | v] row, dq, dk and dv written into one [dq | dk | dv] gradient buffer (the training
    step's layout at pos 0, what rope_back and the QKV projection's dx_back take next)."""
    _report("attention_back fused t=13 6/2 hd=80 W=7 cap=4",
            check_attention_back(env1, 13, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5))


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (6, 4.0)])
def test_o_from_the_forward_kernel(env1, window, softcap):  # noqa: F811
    """O as the forward kernel leaves it (attention.wgsl's prefill), its error bound (test_attention.py's) added to
    D's: the backward agrees with the forward the training step runs."""
    _report(f"attention_back O from attention.wgsl W={window} cap={softcap}",
            check_attention_back(env1, 13, 4, 6, 2, 64, window, softcap, forward_o=True, seed=6))


def test_saturated_cap(env1):  # noqa: F811
    """Raw scores of tens against a cap of 2: many past the forward's clamp (|raw / c| >= 15), where the kernel's
    derivative is 0, the others far out on the cap's shoulder (derivatives down to ~1e-9), whose relative error is the
    raw score's absolute error (d-term dots of terms in the hundreds) over c / 2: the largest errors measured, inside
    the counts' eps_c."""
    _report("attention_back saturated cap t=13 pos=3 6/2 hd=64 cap=2",
            check_attention_back(env1, 13, 3, 6, 2, 64, 0, 2.0, size=6.0, seed=12))


@pytest.mark.parametrize("case", [GQA_CAP, WINDOW], ids=["gqa_cap", "window"])
def test_bit_reproducible(env1, case):  # noqa: F811
    """Two runs, the same bytes (every sum in a fixed order); at the broken variants' shapes, which the real kernels
    pass."""
    a = check_attention_back(env1, *case, seed=11)
    b = check_attention_back(env1, *case, seed=11)
    _report(f"attention_back {case}", a)
    assert all(a["raw"][n].tobytes() == b["raw"][n].tobytes() for n in ("dq", "dk", "dv"))


def test_arguments(env1):  # noqa: F811
    dev = env1.device
    buf = upload(dev, np.zeros(4096, np.float32))
    other = [upload(dev, np.zeros(4096, np.float32)) for _ in range(4)]
    args = dict(n_head=4, n_kv_head=2, head_dim=8, n_ctx=16, max_tokens=8)
    bad = [dict(n_head=3), dict(head_dim=6), dict(max_tokens=17), dict(n_ctx=1000)]
    for kw in bad:
        with pytest.raises(ValueError):
            attention_back(dev, env1.kernels, buf, buf, buf, buf, buf, *other[:3], other[3], None, **{**args, **kw})
    with pytest.raises(ValueError):                              # dq bound over q
        attention_back(dev, env1.kernels, buf, other[0], other[0], other[0], other[0], buf, other[1], other[1],
                       other[2], None, **args)
    free(dev, buf, *other)


def test_near_the_loop_limit(env1):  # noqa: F811
    """622 keys at heads of 64: by the builder's count (every fixed-length vec4 loop counted, as if never unrolled)
    attn_stats' and attn_dq's invocations loop ~30,500 times, just inside LOOP_LIMIT, and lavapipe computes them
    whole. The count is conservative here: LLVM unrolls those inner loops, and with the check lifted lavapipe first
    cut the walk over keys between 32,802 keys (whole) and 66,000 (cut) at heads of 64."""
    assert 30_000 < loop_iterations(64, 622, 2) <= LOOP_LIMIT
    _report("attention_back t=2 pos=620 2/1 hd=64",
            check_attention_back(env1, 2, 620, 2, 1, 64, spare=0, size=1.0, seed=13))


def test_loop_budget_refused(env1):  # noqa: F811
    """On lavapipe (a loop budget) a shape whose invocations would loop past 32,767 iterations is refused."""
    if not env1.device.info.loop_budget:
        pytest.skip("this adapter has no loop budget")
    dev = env1.device
    bufs = [upload(dev, np.zeros(4, np.float32)) for _ in range(9)]
    with pytest.raises(Exception, match="loop iterations"):
        attention_back(dev, env1.kernels, *bufs[:5], *[(b, 0, 64) for b in bufs[5:8]], bufs[8], None, n_head=1,
                       n_kv_head=1, head_dim=64, n_ctx=1000, max_tokens=1)
    free(dev, *bufs)


SWEEP = [(t, pos, nh, nkv, hd, window, softcap)
         for t, pos in ((1, 40), (3, 0), (13, 19), (37, 5), (70, 0))
         for nh, nkv, hd in ((4, 4, 64), (6, 2, 96), (8, 2, 128))
         for window, softcap in ((0, 0.0), (9, 0.0), (0, 30.0), (9, 4.0))]


@pytest.mark.slow
@pytest.mark.parametrize("t,pos,nh,nkv,hd,window,softcap", SWEEP)
def test_attention_back_sweep(env1, t, pos, nh, nkv, hd, window, softcap):  # noqa: F811
    """Every combination of token counts and positions, head shapes (GQA 1, 3, 4; heads of 64, 96, 128), window and
    cap (gemma2's 50 is ~linear at these scores; 30 and 4 curve less and more)."""
    r = check_attention_back(env1, t, pos, nh, nkv, hd, window, softcap, seed=t + pos + hd)
    _report(f"sweep t={t} pos={pos} {nh}/{nkv} hd={hd} W={window} cap={softcap}", r)


# Broken variants: each must fail the check that the real kernels pass above (the case: t, pos, nh, nkv, hd, W, cap).
BROKEN = [
    ("causal mask off by one", "return qpos + 1u; }", "return qpos + 2u; }", GQA_CAP),
    ("dK/dV: a key's own query left out", "max(key, step.pos) - step.pos", "max(key + 1u, step.pos) - step.pos",
     GQA_CAP),
    ("the window ignored (dQ, stats)", "P.window > 0u && qpos + 1u > P.window", "false", WINDOW),
    ("the window ignored (dK/dV)", "if (P.window > 0u) { e = min(e, key + P.window); }", "", WINDOW),
    ("D_i omitted", "- st.z)", ")", GQA_CAP),
    ("the last (query, head) term left out of dK/dV", "(max(query_end(key), first) - first) * P.group",
     "(max(query_end(key), first) - first) * P.group - 1u", GQA_CAP),
    ("the wrong KV head", "return h / P.group;", "return h % P.n_kv_head;", GQA_CAP),
    ("the cap's derivative missing", "select(0.0, 4.0 * e / ((1.0 + e) * (1.0 + e)), abs(w) < 15.0)", "1.0",
     GQA_CAP),
    ("the scale missing from dQ", "let g = acc[c] * P.scale;", "let g = acc[c];", GQA_CAP),
    ("the scale missing from dK", "let a = gk[c] * P.scale;", "let a = gk[c];", GQA_CAP),
    ("P not normalised (1 / l dropped)", "exp(s - st.x) * st.y", "exp(s - st.x)", GQA_CAP),
    ("the online sum not rescaled at a new max", "l = l * exp(m - s) + 1.0;", "l = l + 1.0;", GQA_CAP),
]


@pytest.mark.parametrize("what,old,new,case", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_variants_fail(env1, what, old, new, case):  # noqa: F811
    """At one lane a row on every adapter (a GPU's default of 64 lanes holds one key a lane here, where a walk's own
    rescale never runs: LANE_BROKEN traps the lanes)."""
    with pytest.raises(AssertionError, match="exceeds|non-finite") as info:
        check_attention_back(patched(env1, "backward_attention", old, new), *case, seed=11, lanes=1)
    print(f"broken attention_back, {what}: {str(info.value).splitlines()[0]}")


def test_broken_fused_dv_fails(env1):  # noqa: F811
    """The fused gradient row's dV (written through dK's binding, DV=dk) put at dK's offset: the check catches it."""
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_attention_back(patched(env1, "backward_attention", "let vo = P.dv_off", "let vo = P.dk_off"),
                             13, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5)


# -- lanes: a row's walk cut across lanes (a GPU's default), forced here on any adapter --------------------------------

LANE_CASES = [  # (t, pos, nh, nkv, hd, window, softcap), lanes
    ((37, 11, 6, 2, 64, 16, 5.0), 4),    # window, cap, GQA 3: rows of 1 .. 16 keys over 4 lanes
    ((37, 0, 2, 2, 96, 0, 0.0), 32),     # the longest row 37 keys: most lanes hold one or two
    ((3, 5, 6, 2, 96, 0, 0.0), 16),      # rows of 6 .. 8 keys: most lanes hold none (m = -inf merged)
    ((13, 7, 3, 1, 80, 0, 3.0), 64),     # 64 lanes at heads of 80: 20 KB of lanes, refused where 16 KB is the limit
]


@pytest.mark.parametrize("case,lanes", LANE_CASES, ids=[f"lanes{c[1]}" for c in LANE_CASES])
def test_lanes(env1, case, lanes):  # noqa: F811
    if lanes * 4 * case[4] > env1.device.info.limits["max_compute_workgroup_storage_size"]:
        with pytest.raises(ValueError, match="workgroup memory"):
            check_attention_back(env1, *case, seed=7, lanes=lanes)
        return
    _report(f"attention_back {case} lanes={lanes}", check_attention_back(env1, *case, seed=7, lanes=lanes))


def test_lanes_fused_and_reproducible(env1):  # noqa: F811
    a = check_attention_back(env1, 13, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5, lanes=8)
    b = check_attention_back(env1, 13, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5, lanes=8)
    assert all(a["raw"][n].tobytes() == b["raw"][n].tobytes() for n in ("dq", "dk", "dv"))


LANE_BROKEN = [
    ("the tree's first level dropped", "for (var h = LANES / 2u;", "for (var h = LANES / 4u;"),
    ("the lanes' sums not rescaled to the larger max", "a.y * exp(a.x - mm) + b.y * exp(b.x - mm)", "a.y + b.y"),
    ("a lane's keys skipped", "key += LANES)", "key += LANES + 1u)"),
    ("a lane's terms skipped", "n += LANES)", "n += LANES + 1u)"),
    ("lane 0 reads its own sum, not the row's", "let first = (li - lane) * HD4;", "let first = li * HD4 + HD4;"),
    ("a lane's online sum not rescaled at a new max", "l = l * exp(m - s) + 1.0;", "l = l + 1.0;"),
]


@pytest.mark.parametrize("what,old,new", LANE_BROKEN, ids=[b[0] for b in LANE_BROKEN])
def test_broken_lanes_fail(env1, what, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite"):
        check_attention_back(patched(env1, "backward_attention", old, new), *GQA_CAP, seed=11, lanes=4)


# -- tiles: a GPU's default (attn_dq_tiles, attn_dkv_tiles), forced here on any adapter --------------------------------

TILE_CASES = CASES + [  # more than one tile of 64 query rows and of 32 keys, heads of 16 .. 256
    (70, 30, 6, 2, 64, 0, 3.0),        # 2 query tiles, 4 key tiles, cap, GQA 3
    (100, 0, 4, 4, 128, 40, 0.0),      # a window of 40 across tiles: key tiles no query of a tile sees
    (20, 20, 3, 1, 256, 0, 0.0),       # heads of 256 (gemma 3): sub-chunks of 4 rows; 2 key tiles (lavapipe's loops)
    (45, 90, 2, 1, 16, 9, 0.0),        # heads of 16, keys before the step: whole key tiles nobody sees
]
TILE_GQA = (70, 30, 6, 2, 32, 0, 3.0)
TILE_WINDOW = (70, 30, 6, 2, 32, 20, 0.0)


@pytest.mark.parametrize("t,pos,nh,nkv,hd,window,softcap", TILE_CASES)
def test_tiles(env1, t, pos, nh, nkv, hd, window, softcap):  # noqa: F811
    r = check_attention_back(env1, t, pos, nh, nkv, hd, window, softcap, seed=t * 100 + pos, tiles=True)
    _report(f"attention_back tiles t={t} pos={pos} {nh}/{nkv} hd={hd} W={window} cap={softcap}", r)


def test_tiles_fused_forward_o_and_reproducible(env1):  # noqa: F811
    """The training step's layout (a fused gradient row, fused Q) and O from the forward kernel; two runs, the same
    bytes."""
    a = check_attention_back(env1, 70, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5, tiles=True)
    b = check_attention_back(env1, 70, 0, 6, 2, 80, 7, 4.0, fused=True, seed=5, tiles=True)
    assert all(a["raw"][n].tobytes() == b["raw"][n].tobytes() for n in ("dq", "dk", "dv"))
    _report("attention_back tiles O from attention.wgsl",
            check_attention_back(env1, 40, 4, 6, 2, 64, 6, 4.0, forward_o=True, seed=6, tiles=True))


def test_tiles_refused_where_they_cannot_run(env1):  # noqa: F811
    dev = env1.device
    bufs = [upload(dev, np.zeros(4096, np.float32)) for _ in range(9)]
    for hd in (72, 512):                 # not a multiple of 16; past the registers' TILE_HD_MAX
        with pytest.raises(ValueError, match="tiles need"):
            attention_back(dev, env1.kernels, *bufs[:5], *bufs[5:8], bufs[8], None, n_head=1, n_kv_head=1,
                           head_dim=hd, n_ctx=2, max_tokens=1, tiles=True)
    if dev.info.loop_budget:
        assert tile_iterations(64, 2000, 64, 1, 2000, 64) > LOOP_LIMIT
        big = [upload(dev, np.zeros(2000 * 64, np.float32)) for _ in range(9)]
        with pytest.raises(Exception, match="loop iterations"):
            attention_back(dev, env1.kernels, *big[:8], big[8], None, n_head=1, n_kv_head=1, head_dim=64,
                           n_ctx=2000, max_tokens=1, tiles=True)
        free(dev, *big)
    free(dev, *bufs)
    assert [tile_sub(hd) for hd in (16, 64, 96, 128, 256)] == [32, 16, 16, 8, 4]


TILE_BROKEN = [
    ("the row merge's first level dropped", "for (var w = 8u; w > 0u;", "for (var w = 4u; w > 0u;", TILE_GQA),
    ("the row merge not rescaled", "sp[i + 1u] * exp(sp[i] - mm) + sp[i + 2u * w + 1u] * exp(sp[i + 2u * w] - mm)",
     "sp[i + 1u] + sp[i + 2u * w + 1u]", TILE_GQA),
    ("an online sum not rescaled at a new max", "l[a] = l[a] * exp(m[a] - x) + 1.0;", "l[a] = l[a] + 1.0;",
     TILE_GQA),
    ("a chunk's last float dropped", "for (var dd = 0u; dd < DC; dd++)", "for (var dd = 0u; dd < DC - 1u; dd++)",
     TILE_GQA),
    ("dQ: a sub-chunk's last key dropped", "for (var kk = 0u; kk < SUB; kk++)",
     "for (var kk = 0u; kk < SUB - 1u; kk++)", TILE_GQA),
    ("dK, dV: a sub-chunk's last row dropped", "for (var rr = 0u; rr < SUB; rr++)",
     "for (var rr = 0u; rr < SUB - 1u; rr++)", TILE_GQA),
    ("dK, dV: the group's last head left out", "hg < P.group; hg++", "hg + 1u < P.group; hg++", TILE_GQA),
    ("dQ: the scale missing", "acc[a][c] * P.scale", "acc[a][c]", TILE_GQA),
    ("D omitted", "(dov_ - st.z)", "dov_", TILE_GQA),
    ("dV summed over Q, not dO", "rows_product(li, j0, h, true, &gv);", "rows_product(li, j0, h, false, &gv);",
     TILE_GQA),
    ("dQ: the first key of a tile's range skipped", "let lo = key_begin(step.pos + j0);",
     "let lo = key_begin(step.pos + j0) + 1u;", TILE_GQA),
    ("dK, dV: a key tile's queries ended at its first key's", "let jhi = query_end(min(k0 + BK, kend) - 1u);",
     "let jhi = query_end(k0);", TILE_WINDOW),
    ("dK, dV: rows past the step read (NaN here)", "if (j < step.n_tokens) {\n                if (from_do)",
     "if (true) {\n                if (from_do)", TILE_WINDOW),
]


@pytest.mark.parametrize("what,old,new,case", TILE_BROKEN, ids=[b[0] for b in TILE_BROKEN])
def test_broken_tiles_fail(env1, what, old, new, case):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|non-finite") as info:
        check_attention_back(patched(env1, "backward_attention", old, new), *case, seed=11, tiles=True)
    print(f"broken attention_back tiles, {what}: {str(info.value).splitlines()[0]}")
