"""get_rows (embedding lookup) and, through it, every type's dequantization against gguf.quants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab.format.ggml import BY_NAME
from lab.host.reference import quant as qo
from lab.host.reference.quant import DEQUANT_TOL
from lab.ops.embed import get_rows
from tests.kernels.quant_rig import Rig


def cols_for(name: str) -> int:
    block = BY_NAME[name].block
    return 2 * 256 if name in qo.K_TYPES else 96 if block == 32 else 128 if block == 64 else 136


@pytest.mark.parametrize("name", qo.TYPES)
def test_dequant_matches_gguf(device, kernels, name):
    """Every row of a random tensor, looked up in shuffled order with repeats, equals gguf's dequantization."""
    rows = 40
    raw = qo.random_tensor(name, rows, cols_for(name), seed=5)
    ref = qo.dequant(raw, name)
    ids = np.random.default_rng(1).permutation(rows).tolist() + [3, 3, 0, rows - 1]
    with Rig(device, kernels) as r:
        got = r.get_rows(r.weight(name, raw), ids)
    assert np.all(np.isfinite(got))
    assert qo.dequant_err(got, ref[ids]) <= DEQUANT_TOL


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_scale(device, kernels, name):
    raw = qo.random_tensor(name, 12, cols_for(name), seed=6)
    ref = qo.dequant(raw, name)
    s = math.sqrt(640.0)                       # Gemma scales embeddings by sqrt(width)
    with Rig(device, kernels) as r:
        got = r.get_rows(r.weight(name, raw), [7, 2, 11], scale=s)
    assert qo.dequant_err(got, s * ref[[7, 2, 11]].astype(np.float64)) <= DEQUANT_TOL


def test_split_table(device, kernels):
    """A table over three uneven bindings: each part fills exactly the tokens whose ids it holds."""
    name, rows = "Q5_0", 70
    raw = qo.random_tensor(name, rows, 96, seed=7)
    rb = raw.shape[1]
    ids = [69, 0, 29, 30, 31, 59, 60, 5, 69]
    with Rig(device, kernels) as r:
        whole = r.weight(name, raw)
        split = r.weight(name, raw, max_binding=30 * rb + 2)
        assert [(p.first_row, p.n_rows) for p in split.parts] == [(0, 30), (30, 30), (60, 10)]
        got = r.get_rows(split, ids)
        np.testing.assert_array_equal(got, r.get_rows(whole, ids))
    assert qo.dequant_err(got, qo.dequant(raw, name)[ids]) <= DEQUANT_TOL


def test_only_step_tokens_are_written(device, kernels):
    name = "Q4_1"
    raw = qo.random_tensor(name, 10, 64, seed=8)
    ref = qo.dequant(raw, name)
    with Rig(device, kernels) as r:
        w = r.weight(name, raw)
        ids = r.buffer(np.array([4, 5, 6, 7], np.uint32).tobytes(), "ids")
        out = r.buffer(qo.f32(np.full(4 * 64, np.nan)), "out")
        r.run(get_rows(device, r.kernels, w, ids, out, r.step(2)), 2)
        got = r.read(out, 4 * 64).reshape(4, 64)
    assert qo.dequant_err(got[:2], ref[[4, 5]]) <= DEQUANT_TOL
    assert np.all(np.isnan(got[2:]))


def test_real_token_embd(device, kernels, smollm2_path):
    """SmolLM2's Q8_0 embedding table (49,152 x 576), whole and split over three bindings."""
    name, data = qo.real_tensors(smollm2_path)["token_embd.weight"]
    assert name == "Q8_0"
    raw = np.ascontiguousarray(data)
    ids = [0, 1, 2, 100, 12345, 20000, 32767, 32768, 49151, 1]
    ref = qo.dequant(raw[ids], "Q8_0")
    with Rig(device, kernels) as r:
        whole = r.weight("Q8_0", raw)
        got = r.get_rows(whole, ids)
        split = r.weight("Q8_0", raw, max_binding=raw.shape[1] * 20000)
        assert len(split.parts) == 3
        got_split = r.get_rows(split, ids)
    assert qo.dequant_err(got, ref) <= DEQUANT_TOL
    np.testing.assert_array_equal(got_split, got)
