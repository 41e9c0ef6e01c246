"""Embedding backward (wgsl/backward_embed.wgsl via lab.ops.backward.embed_back) against the float64 oracle
(lab/host/reference/grads.py): repeated ids, a table over several bindings, a scale, widths that fill no workgroup
evenly; bit-exact against numpy's float32 sum in token order where the scale is 1 (the order is the kernel's
promise); then broken variants the same check must catch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from checks import Env, assert_close, env1, free, ops_step, patched, read, run, upload  # noqa: F401  (env1: fixture)

from lab.host.reference.grads import EMBED_BACK_TOL, embed_grad
from lab.host.reference.kernels import f32, rel_err
from lab.ops import WeightPart
from lab.ops.backward import embed_back

VOCAB = 50
SPLIT = ((0, 20), (20, 20), (40, 10))          # three bindings of uneven rows, as a large table is bound
# 13 tokens: 20 four times (the first row of the second part), 19 and 49 twice, 0 and 39 (part edges) once each
IDS_13 = [20, 19, 3, 20, 49, 0, 20, 39, 19, 40, 49, 20, 7]


def _run(env: Env, de0: np.ndarray, ids: list[int], dx: np.ndarray, t: int, split, scale: float,
         x_offset: int) -> np.ndarray:
    """The table after one embed_back over the step's t tokens, starting from de0, as one array."""
    dev, cols = env.device, de0.shape[1]
    parts = [WeightPart(upload(dev, de0[a:a + k], f"dE[{a}:{a + k}]"), a, k) for a, k in split]
    idb = upload(dev, np.array(ids, np.uint32))
    dxb = upload(dev, np.concatenate([np.full(x_offset, np.nan, np.float32), dx.reshape(-1)]))
    run(env, embed_back(dev, env.kernels, parts, cols, idb, dxb, ops_step(env), scale=scale, x_offset=x_offset), 0, t)
    got = np.concatenate([read(dev, p.buffer).reshape(p.n_rows, cols) for p in parts])
    free(dev, idb, dxb, *(p.buffer for p in parts))
    return got


def check_embed_back(env: Env, ids: list[int], t: int, cols: int, split=SPLIT, scale: float = 1.0,
                     x_offset: int = 0, seed: int = 0) -> float:
    """dE += scale * dx scattered by the first t of `ids` (one more id and row past the step: never added), from a
    table of random values (an earlier micro-batch's sum). Rows of ids not seen must keep their bytes. Returns the
    error; raises AssertionError past the tolerance."""
    rng = np.random.default_rng(seed)
    de0 = f32(rng.standard_normal((VOCAB, cols)))
    dx = f32(rng.standard_normal((len(ids), cols)) * 2.0)
    got = _run(env, de0, ids, dx, t, split, scale, x_offset)
    want = de0 + embed_grad(ids[:t], dx[:t], VOCAB, scale)
    seen = sorted(set(ids[:t]))
    unseen = [r for r in range(VOCAB) if r not in seen]
    what = f"embed_back t={t} cols={cols} parts={len(split)} scale={scale:.3g}"
    if not np.array_equal(got[unseen], de0[unseen]):
        raise AssertionError(f"{what}: changed rows of ids not in the step")
    assert_close(got[seen], want[seen], EMBED_BACK_TOL, what)
    return rel_err(got[seen], want[seen])


@pytest.mark.parametrize("t,cols,split", [
    (1, 67, SPLIT), (3, 257, SPLIT), (13, 1000, SPLIT),    # widths past 64-wide workgroups: 3, 1, 40 columns over
    (13, 67, ((0, VOCAB),)),                               # the table in one binding
])
def test_embed_back(env1, t, cols, split):  # noqa: F811
    ids = IDS_13[:t] + [33]                                # 33: the row past the step, never added
    e = check_embed_back(env1, ids, t, cols, split, scale=math.sqrt(cols), seed=t * 1000 + cols)
    print(f"embed_back t={t} cols={cols} parts={len(split)}: {e:.2e}")


def test_offset_input(env1):  # noqa: F811
    check_embed_back(env1, IDS_13 + [33], 13, 257, scale=0.5, x_offset=5, seed=1)


def check_token_order(env: Env, split) -> None:
    """Scale 1: every element is a chain of correctly rounded f32 adds in token order, so the table must equal
    numpy's float32 adds in that order bit for bit (the repeated ids' sums included), and a second run the same
    bytes. Raises AssertionError otherwise."""
    rng = np.random.default_rng(2)
    cols = 257
    de0 = f32(rng.standard_normal((VOCAB, cols)))
    dx = f32(rng.standard_normal((len(IDS_13), cols)) * 3.0)
    want = de0.copy()
    for i, r in enumerate(IDS_13):
        want[r] = want[r] + dx[i]                          # float32 + float32: one rounding, as the kernel's add
    got = _run(env, de0, IDS_13, dx, len(IDS_13), split, 1.0, 0)
    if not np.array_equal(got, want):
        raise AssertionError(f"{np.sum(got != want)} values differ from the float32 sum in token order")
    if not np.array_equal(_run(env, de0, IDS_13, dx, len(IDS_13), split, 1.0, 0), got):
        raise AssertionError("a second run gave other bytes")


@pytest.mark.parametrize("split", [SPLIT, ((0, VOCAB),)])
def test_token_order_bit_exact(env1, split):  # noqa: F811
    check_token_order(env1, split)


def test_other_order_is_caught(env1):  # noqa: F811
    """The bit-exact check has teeth: the same sums taken from the last token back differ in the last bits."""
    bad = patched(env1, "backward_embed", "for (var i = 0u; i < step.n_tokens; i++) {",
                  "for (var k = 0u; k < step.n_tokens; k++) { let i = step.n_tokens - 1u - k;")
    with pytest.raises(AssertionError, match="differ from the float32 sum in token order"):
        check_token_order(bad, SPLIT)


# Broken variants: each must fail the check that the real kernel passes above.
@pytest.mark.parametrize("old,new", [
    ("dE[o] = dE[o] + p.scale", "dE[o] = p.scale"),                        # overwritten: repeated ids keep the last
    ("p.scale * dx[", "dx["),                                             # the forward's scale not applied
    ("i < step.n_tokens; i++", "i + 1u < step.n_tokens; i++"),            # the step's last token dropped
])
def test_broken_variants_fail(env1, old, new):  # noqa: F811
    with pytest.raises(AssertionError, match="exceeds|changed rows"):
        check_embed_back(patched(env1, "backward_embed", old, new), IDS_13 + [33], 13, 257, scale=math.sqrt(257),
                         seed=5)
