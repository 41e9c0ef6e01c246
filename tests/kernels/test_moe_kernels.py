"""A routed layer's kernels (lab.ops.moe) against their float64 oracles (lab/host/reference/kernels.py): the router's
gating and top-k (`route`, both gating functions, with and without the selection bias, and the tie rule), the
experts' products (`expert_matvec`: the token-row and the GLU-row forms, every type the mixes use and a grid type,
stacks cut over bindings by whole experts, the experts no pair chose filled with NaN so a read of them shows), and the
weighted sum (`combine`), and the experiments' `mute` (one expert left out of the sum, or its share scaled, the other
weights not renormalised: mute then combine against the float64 sum without that expert's terms). Shapes fill no
workgroup evenly: 5 tokens, 37 experts (route), 37 rows an expert, 300 outputs (combine). Broken variants must fail: an
expert other than the chosen one, the weights not renormalised, the bias in the weights, ties to the higher expert, a
part's first expert ignored, the weights or the residual left out of the sum, and for mute the step's position
forgotten, every chosen expert muted, the slot taken for the expert."""

from __future__ import annotations

import numpy as np
import pytest
from checks import env, env1, free, patched, read, upload  # noqa: F401  (fixtures)

from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.kernels import (
    COMBINE_TOL,
    ROUTE_TOL,
    combine_ref,
    expert_matvec_ref,
    mute_ref,
    rel_err,
    route_margin,
    route_ref,
)
from lab.ops import Experts, make_step, step_bytes
from lab.ops.intervene import OPS, PARAMS
from lab.ops.moe import combine, expert_matvec, mute, route
from lab.ops.weights import alloc_weight, upload_weight

T = 5               # tokens of the step
N_EXPERT = 37       # route: not a multiple of anything the kernel groups by
K = 3
PER = 37            # rows of one expert: 9 workgroups of 4 rows and one row over
N_STACK = 5         # experts of a stack
N_OUT = 300         # combine's outputs a token: not a multiple of its 64 threads


def _step(dev, t):
    s = make_step(dev)
    dev.write(s, step_bytes(0, t, 64))
    return s


def run_route(e, logits, gating, k, bias=None):
    dev = e.device
    t = logits.shape[0]
    bufs = [upload(dev, logits.astype(np.float32)), upload(dev, np.zeros(t * k, np.uint32)),
            upload(dev, np.full(t * k, np.nan, np.float32)), _step(dev, t)]
    b = upload(dev, bias.astype(np.float32)) if bias is not None else None
    try:
        ops = route(dev, e.kernels, bufs[0], b, bufs[1], bufs[2], bufs[3], n_expert=logits.shape[1], k=k,
                    gating=gating, max_tokens=t)
        dev.run([op.at(t) for op in ops])
        return read(dev, bufs[1], np.uint32).reshape(t, k), read(dev, bufs[2]).reshape(t, k)
    finally:
        free(dev, *bufs, *([b] if b is not None else []))


def logits_and_bias(seed, gating, biased):
    """Random logits (and a bias of a quarter of the probabilities' spread, as the synthetic lfm2moe file has) whose
    k-th and (k+1)-th selection values are far from a tie."""
    rng = np.random.default_rng(seed)
    while True:
        lg = rng.standard_normal((T, N_EXPERT)) * 2
        bias = rng.standard_normal(N_EXPERT) * 0.05 if biased else None
        if route_margin(lg.astype(np.float32), gating, K, bias) > 1e-4:
            return lg.astype(np.float32), bias


def check_route(e, gating, biased, seed=0):
    lg, bias = logits_and_bias(seed, gating, biased)
    ids, w = run_route(e, lg, gating, K, bias)
    want_ids, want_w = route_ref(lg, gating, K, bias)
    assert (ids == want_ids).all(), f"chosen experts differ:\n{ids}\n{want_ids}"
    err = rel_err(w, want_w)
    assert err <= ROUTE_TOL, f"weights off by {err:.3g}"
    return err


@pytest.mark.parametrize("gating", ["softmax", "sigmoid"])
@pytest.mark.parametrize("biased", [False, True])
def test_route(env1, gating, biased):  # noqa: F811
    err = check_route(env1, gating, biased)
    print(f"route {gating} bias={biased}: weights {err:.3g}")


def test_route_ties_go_to_the_lower_expert(env1):  # noqa: F811
    """Equal values at the k-th place: the lower expert is chosen (ggml's CPU top_k keeps the earlier of two equals),
    and the order within the chosen is descending value, then ascending index."""
    lg = np.zeros((2, 8), np.float32)
    lg[0] = [0.5, 1.0, 1.0, 0.2, 1.0, -1.0, 1.0, 0.0]      # four equal at the top: 1, 2, 4 chosen, 6 not
    lg[1] = [0.0, 0.3, 0.3, 2.0, 0.3, 0.3, -5.0, 0.3]      # 3 first, then the two lowest of five equal
    for gating in ("softmax", "sigmoid"):
        ids, _ = run_route(env1, lg, gating, 3)
        want, _ = route_ref(lg, gating, 3)
        assert ids.tolist() == want.tolist() == [[1, 2, 4], [3, 1, 2]]


def test_route_refuses_what_it_cannot_run(env1):  # noqa: F811
    b = upload(env1.device, np.zeros(64, np.float32))
    try:
        with pytest.raises(ValueError, match="gating 'relu'"):
            route(env1.device, env1.kernels, b, None, b, b, b, n_expert=8, k=2, gating="relu", max_tokens=1)
        with pytest.raises(ValueError, match="9 experts a token of 8"):
            route(env1.device, env1.kernels, b, None, b, b, b, n_expert=8, k=9, gating="softmax", max_tokens=1)
    finally:
        free(env1.device, b)


# -- the experts' products ---------------------------------------------------------------------------------------
# type -> columns of an expert's row: five K blocks, three blocks of 32 (IQ4_NL 96; F32 and Q8_0 alike); a grid type
COLS = {"F32": 96, "F16": 96, "Q8_0": 96, "Q4_0": 96, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q3_K": 256,
        "Q2_K": 256, "IQ4_NL": 96, "IQ4_XS": 256, "IQ2_XXS": 256}


def chosen_ids(seed, pairs=T * K):
    """Each pair's expert, some experts never chosen (3 of 5 in use)."""
    rng = np.random.default_rng(seed)
    return rng.choice([0, 2, 3], size=pairs).astype(np.uint32)


def stack(dev, name, raw, per, cols, parts):
    """The stack on the device as Experts, cut into `parts` bindings of whole experts."""
    t = BY_NAME[name]
    rb = t.row_bytes(cols)
    n = raw.shape[0] // per
    limit = None if parts == 1 else -(-n // parts) * per * rb + 3
    w = alloc_weight(dev, name, t, n * per, cols, max_binding=limit, row_group=per)
    upload_weight(dev, w, raw.tobytes())
    assert len(w.parts) == parts and all(p.n_rows % per == 0 for p in w.parts)
    return Experts(w, n, per)


def run_experts(e, name, parts, glu, seed=0, poison=False):
    """(got [pairs, PER], want [pairs, PER], error) of one expert matvec over T tokens x K slots."""
    dev, cols = e.device, COLS[name]
    raw = qo.random_tensor(name, N_STACK * PER, cols, seed)
    W = qo.dequant(raw, name).astype(np.float64).reshape(N_STACK, PER, cols)
    ids = chosen_ids(seed)
    if poison:      # the experts no pair chose: NaN, so that reading them shows (F32 only: raw values)
        raw = raw.copy().view(np.float32)
        for x in set(range(N_STACK)) - set(ids.tolist()):
            raw[x * PER:(x + 1) * PER] = np.nan
        raw = raw.view(np.uint8)
    rng = np.random.default_rng(seed + 1)
    x_div = 1 if glu else K
    x = rng.standard_normal(((T * K) // x_div, (2 if glu else 1) * cols)).astype(np.float32)
    exp = stack(dev, name, raw, PER, cols, parts)
    xb, yb, ib = upload(dev, x), upload(dev, np.full(T * K * PER, np.nan, np.float32)), upload(dev, ids)
    s = _step(dev, T)
    try:
        ops = expert_matvec(dev, e.kernels, exp, xb, yb, ib, k=K, max_tokens=T, x_stride=x.shape[1], x_div=x_div,
                            y_stride=PER, glu=glu)
        assert len(ops) == parts
        dev.run([op.at(T) for op in ops])
        got = read(dev, yb).reshape(T * K, PER)
    finally:
        free(dev, xb, yb, ib, s, *(p.buffer for p in exp.weight.parts))
    want = expert_matvec_ref(W, x, ids, x_div, glu)
    rows = np.repeat(x, x_div, axis=0) if not glu else x
    if glu:
        rows = (rows[:, :cols] / (1 + np.exp(-rows[:, :cols].astype(np.float64)))) * rows[:, cols:]
    scale = np.array([np.abs(W[i]) @ np.abs(r[:cols]) for i, r in zip(ids, rows.astype(np.float64))])
    err = float(np.max(np.abs(got - want) / np.maximum(scale, 1e-30)))
    return got, want, err


@pytest.mark.parametrize("name", list(COLS))
@pytest.mark.parametrize("glu", [None, "swiglu"])
def test_expert_matvec(env1, name, glu):  # noqa: F811
    """Every pair's row from its own expert, the stack in 3 bindings of whole experts (2, 2, 1)."""
    got, want, err = run_experts(env1, name, 3, glu)
    assert err <= qo.DOT_TOL, f"{name}: {err:.3g}"
    print(f"{name} experts glu={glu}: max rel (to sum |W||x|) {err:.3g}")


@pytest.mark.parametrize("parts", [1, 2])
def test_expert_matvec_both_reductions(env, parts):  # noqa: F811
    _, _, err = run_experts(env, "Q4_K", parts, "swiglu")
    assert err <= qo.DOT_TOL


def test_only_the_chosen_experts_are_read(env1):  # noqa: F811
    """The experts no pair chose are NaN: a kernel that read any of them would carry it into the output."""
    got, want, err = run_experts(env1, "F32", 2, None, poison=True)
    assert np.isfinite(got).all() and err <= qo.DOT_TOL


# -- the weighted sum ----------------------------------------------------------------------------------------------
def check_combine(e, seed=0):
    dev = e.device
    rng = np.random.default_rng(seed)
    down = rng.standard_normal((T * K, N_OUT)).astype(np.float32)
    w = rng.random((T, K)).astype(np.float32)
    y0 = rng.standard_normal((T, N_OUT)).astype(np.float32)
    bufs = [upload(dev, down), upload(dev, w), upload(dev, y0), _step(dev, T)]
    try:
        dev.run([op.at(T) for op in combine(dev, e.kernels, bufs[0], bufs[1], bufs[2], bufs[3], n=N_OUT, k=K,
                                            max_tokens=T)])
        got = read(dev, bufs[2]).reshape(T, N_OUT)
    finally:
        free(dev, *bufs)
    err = rel_err(got, combine_ref(down, w, y0))
    assert err <= COMBINE_TOL, f"combine off by {err:.3g}"
    return err


def test_combine(env1):  # noqa: F811
    print(f"combine: {check_combine(env1):.3g}")


# -- an expert left out of the sum (mute, then combine) --------------------------------------------------------------
MUTED = 2               # the expert muted, chosen by every token at a slot that moves with the token
MUTE_POS = 3            # the step's first position: a kernel that forgot step.pos would mute other rows
MUTE_RANGE = (4, 7)     # positions 4 .. 6: rows 1 .. 3 of the 5 (rows 0 and 4 chose the expert too, outside)


def mute_case(seed=0):
    """ids [T, K] of 6 experts, each row distinct, MUTED at slot t % K of row t; down, w, y0 random."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((T, K), np.uint32)
    for t in range(T):
        row = [e for e in rng.permutation(6) if e != MUTED][:K]
        row[t % K] = MUTED
        ids[t] = row
    return (ids, rng.standard_normal((T * K, N_OUT)).astype(np.float32), rng.random((T, K)).astype(np.float32),
            rng.standard_normal((T, N_OUT)).astype(np.float32))


def check_mute(e, op="zero", scale=0.0, seed=0):
    dev = e.device
    ids, down, w, y0 = mute_case(seed)
    bufs = [upload(dev, ids), upload(dev, w), upload(dev, down), upload(dev, y0), make_step(dev)]
    params = dev.uniform(PARAMS.pack(K, MUTED, MUTED + 1, *MUTE_RANGE, OPS[op], 0, scale), "test mute")
    try:
        op_list = [mute(dev, e.kernels, bufs[0], bufs[1], bufs[4], params, k=K, max_tokens=T)]
        op_list += combine(dev, e.kernels, bufs[2], bufs[1], bufs[3], bufs[4], n=N_OUT, k=K, max_tokens=T)
        dev.run([o.at(T) for o in op_list], writes=[(bufs[4], 0, step_bytes(MUTE_POS, T, 64))])
        got_w, got = read(dev, bufs[1]).reshape(T, K), read(dev, bufs[3]).reshape(T, N_OUT)
    finally:
        free(dev, *bufs, params)
    want_w = mute_ref(ids, w, MUTED, *MUTE_RANGE, pos=MUTE_POS, scale=0.0 if op == "zero" else scale)
    assert np.array_equal(got_w, want_w.astype(np.float32)), f"weights:\n{got_w}\n{want_w}"
    err = rel_err(got, combine_ref(down, want_w, y0))
    assert err <= COMBINE_TOL, f"mute + combine off by {err:.3g}"
    return want_w


@pytest.mark.parametrize("op, scale", [("zero", 0.0), ("scale", 0.375)])
def test_mute_leaves_the_expert_out_and_the_others_as_they_were(env1, op, scale):  # noqa: F811
    w = check_mute(env1, op, scale)
    ids, _, w0, _ = mute_case()
    hit = ids == MUTED
    inside = np.arange(MUTE_POS, MUTE_POS + T)[:, None]
    inside = (inside >= MUTE_RANGE[0]) & (inside < MUTE_RANGE[1])
    assert (hit & inside).sum() == 3 and (hit & ~inside).sum() == 2      # the case holds both kinds of rows
    assert np.array_equal(w[~(hit & inside)], w0[~(hit & inside)])     # every other weight as route left it


# -- broken variants: each must fail --------------------------------------------------------------------------------
ROUTE_TRAPS = {
    "the smallest chosen (a wrong expert)": ("v > best_v", "v < best_v"),
    "weights not renormalised": ("w[t * p.k + s] = w[t * p.k + s] / total;", "w[t * p.k + s] = w[t * p.k + s];"),
    "the bias in the weights": ("let pr = prob(base, best, mx, inv);", "let pr = sel(base, best, mx, inv);"),
}


@pytest.mark.parametrize("trap", list(ROUTE_TRAPS))
def test_route_traps(env1, trap):  # noqa: F811
    broken = patched(env1, "moe", *ROUTE_TRAPS[trap])
    with pytest.raises(AssertionError):
        check_route(broken, "sigmoid", True)


def test_route_tie_trap(env1):  # noqa: F811
    broken = patched(env1, "moe", "v > best_v", "v >= best_v")     # the higher of equal values
    with pytest.raises(AssertionError):
        test_route_ties_go_to_the_lower_expert(broken)


EXPERT_TRAPS = {
    "the first pair's expert for every pair": ("chosen = ids[pair];", "chosen = ids[0u];"),
    "a part's first expert ignored": ("w_base = (e - ep.first) * p.n_rows * p.row_bytes;",
                                      "w_base = e * p.n_rows * p.row_bytes;"),
}


@pytest.mark.parametrize("trap", list(EXPERT_TRAPS))
def test_expert_traps(env1, trap):  # noqa: F811
    broken = patched(env1, "matvec", *EXPERT_TRAPS[trap])
    got, want, err = run_experts(broken, "Q8_0", 3, None)
    assert not err <= qo.DOT_TOL


COMBINE_TRAPS = {
    "the weights left out": ("acc += wc[q] * down[q * c.n + i];", "acc += (wc[q] * 0.0 + 1.0) * down[q * c.n + i];"),
    "the residual left out": ("acc = y[o] + acc;", "acc = acc;"),
}


@pytest.mark.parametrize("trap", list(COMBINE_TRAPS))
def test_combine_traps(env1, trap):  # noqa: F811
    with pytest.raises(AssertionError):
        check_combine(patched(env1, "moe", *COMBINE_TRAPS[trap]))


MUTE_TRAPS = {
    "the step's position forgotten": ("let pos = step.pos + q / m.k;", "let pos = q / m.k;"),
    # (each keeps reading idm: a binding the shader no longer uses leaves its layout, and the bind group is refused)
    "every chosen expert muted": ("idm[q] != m.expert", "(idm[q] & 0u) != 0u"),
    "the slot taken for the expert": ("idm[q] != m.expert", "idm[q] * 0u + q % m.k != m.expert"),
}


@pytest.mark.parametrize("trap", list(MUTE_TRAPS))
def test_mute_traps(env1, trap):  # noqa: F811
    with pytest.raises(AssertionError):
        check_mute(patched(env1, "moe", *MUTE_TRAPS[trap]))
