"""Retrieval tuned on the user's files (issue #44 part 3, lab/instruments/contrastive.py), natively on the small
synthetic Llama 3 (tests/conftest.py `tiny`):

- the GPU's LoRA gradients of the whole contrastive chain (each window forward to its final norm, summed, L2-
  normalised, the symmetric InfoNCE over the batch, back through the normalisation to every pooled row and through
  the model) against float64 central differences (lab/host/reference/contrastive.py), with windows of mixed lengths,
  with and without a BOS before each;
- the host's loss and gradient (plain Python, as the page's worker runs it) against numpy's, and the
  normalisation's gradient against central differences;
- the pairs each stage makes, and what is refused;
- a few steps on one batch lower its loss, and the embeddings the trainer pools are the index's
  (lab/instruments/retrieval.py), so what is trained is what the retrieval card searches with.
"""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import numpy as np
import pytest

from lab.engine.backward import TrainError
from lab.host import gradcheck
from lab.host.loading import open_engine
from lab.host.reference.contrastive import info_nce as info_nce64
from lab.instruments import contrastive
from lab.instruments.retrieval import Index
from lab.instruments.training import Optim
from tests.conftest import tiny

# Tolerance: gradcheck.TOL (1e-3: f32 sums over ~1e3 terms, an order of magnitude of margin); measured 1.5e-6.
SITES = ("blk.0.attn_q", "blk.2.attn_v", "blk.3.ffn_down")


@pytest.mark.parametrize("bos", [None, pytest.param(1, marks=pytest.mark.slow)])   # BOS: --slow
def test_the_gradients_of_the_whole_chain_against_float64(bos):
    tok = None if bos is None else SimpleNamespace(add_bos=True, bos_id=bos)
    r = gradcheck.check_contrastive(tiny("f32"), only=SITES, tokenizer=tok, seed=3 if bos else 0)
    assert r["ok"], r
    assert r["loss_rel_err"] < 1e-5 and len(r["tensors"]) == 2 * len(SITES)
    print({t["tensor"]: f"{t['worst_rel_err']:.1e}" for t in r["tensors"]})


def test_the_host_loss_and_gradients_against_numpy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 7))
    b = a + 0.5 * rng.normal(size=(5, 7))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    loss, ga, gb = contrastive.info_nce(a.tolist(), b.tolist(), 0.05)
    assert loss == pytest.approx(info_nce64(a, b, 0.05), rel=1e-12)
    h = 1e-6
    for which, g in ((a, ga), (b, gb)):
        for i, k in ((0, 0), (3, 5), (4, 2)):
            which[i, k] += h
            up = info_nce64(a, b, 0.05)
            which[i, k] -= 2 * h
            down = info_nce64(a, b, 0.05)
            which[i, k] += h
            assert g[i][k] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-8)
    p = rng.normal(size=7) * 3
    e, norm = contrastive.normalized(p.tolist())
    g = rng.normal(size=7)
    dp = contrastive.normalize_back(e, norm, g.tolist())
    for k in range(7):
        q = p.copy()
        q[k] += h
        up = float(g @ (q / np.linalg.norm(q)))
        q[k] -= 2 * h
        down = float(g @ (q / np.linalg.norm(q)))
        assert dp[k] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-9)


def test_the_pairs_of_each_stage():
    wins = contrastive.windows([list(range(100)), list(range(100, 170))], 32)
    assert wins == [list(range(0, 32)), list(range(32, 64)), list(range(64, 96)), list(range(100, 132)),
                    list(range(132, 164))]
    rng = random.Random(0)
    for a, b in contrastive.pairs_of("crops", wins, 4, rng):
        home = [w for w in wins if a[0] in w]
        assert len(home) == 1 and set(a) <= set(home[0]) and set(b) <= set(home[0])
        assert min(len(a), len(b)) >= 16 and a == home[0][home[0].index(a[0]):][:len(a)]
    pairs = contrastive.pairs_of("query", wins, 5, rng)
    assert sorted(p[1][0] for p in pairs) == [0, 32, 64, 100, 132]      # every window once
    for q, passage in pairs:
        assert len(q) == contrastive.QUERY and passage[passage.index(q[0]):][:len(q)] == q
    with pytest.raises(TrainError, match="stage 'both'"):
        contrastive.pairs_of("both", wins, 2, rng)
    with pytest.raises(TrainError, match="5 windows for 6 pairs"):
        contrastive.pairs_of("query", wins, 6, rng)


@pytest.fixture(scope="module")
def opened():
    _header, tok, engine, _t = open_engine(tiny("f32"), 80, max_batch=80)
    yield engine, tok
    engine.close()


def test_steps_lower_the_loss_and_pool_as_the_index_does(opened):
    engine, tok = opened
    rng = random.Random(1)
    seqs = [[rng.randrange(1000, 9000) for _ in range(20)] for _ in range(4)]
    c = contrastive.Contrastive(engine, tok, T=64, pairs=3, rank=4, optim=Optim("adamw", lr=5e-3, steps=6))
    try:
        emb = asyncio.run(c.embeddings(seqs))
        index = Index(engine, tok, window=20, stride=20)
        try:
            index.prepare([("a", tok.decode(seqs[0]))])
            asyncio.run(index.build())
            got = np.frombuffer(asyncio.run(index.embed_queries(seqs)), np.float32).reshape(4, -1)
        finally:
            index.drop()
        assert np.abs(got - np.array([e for e, _ in emb])).max() < 1e-5
        batch = [(s[:10], s[10:]) for s in seqs[:3]]          # each window's two halves: no token in common
        losses = [asyncio.run(c.step(batch)) for _ in range(6)]
        print(losses)
        assert losses[0] > 0.5 and losses[-1] < 0.5 * losses[0], losses
        with pytest.raises(TrainError, match="a step takes 3 pairs"):
            asyncio.run(c.step(batch[:1]))
        with pytest.raises(TrainError, match="a window of 65 tokens: 1 to 64"):
            asyncio.run(c.embeddings([list(range(65))]))
    finally:
        c.close()
    assert engine.lora is None and not engine.device.owned_by(c) and not engine.device.owned_by(c.trainer)
    with pytest.raises(TrainError, match="1 pairs a step"):
        contrastive.Contrastive(engine, tok, T=64, pairs=1)
