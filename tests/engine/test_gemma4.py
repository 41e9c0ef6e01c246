"""gemma4 natively on the synthetic Gemma 4-shaped F32 file (7 layers: 0, 1, 3, 5 sliding with heads of 64 over 2 KV
heads, 2, 4, 6 full with heads of 128 over 1; 5 and 6 read the caches of 3 and 4; per-layer embeddings; out_scale):
the engine against the numpy reference tensor by tensor in prefill and decode, the caches it keeps (none on the
shared-KV layers) and counts, and the per-layer embedding table read from several bindings.

llama.cpp parity (logits, greedy ids) is tests/engine/test_architectures.py's gemma4 cases."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lab.engine import budget
from lab.engine.engine import Engine, read_host_values
from lab.engine.load import validate
from lab.format import gguf
from lab.host import synthetic_arch
from lab.host.models import cache_dir
from lab.host.native import open_native
from lab.host.reference import Reference
from lab.ops import weights as weights_mod
from tests.engine.hybrids import traced_names_matching_the_reference

N_CTX = 64
REF_TOL = 1e-3          # logits, relative to the reference's largest (tests/engine/test_architectures.py)
TEXT = ("The old lighthouse keeper climbed the stairs every evening, counting the steps: one hundred and twelve. "
        "Nobody knew why he still did it.")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def path():
    return synthetic_arch.build("gemma4", "f32", cache_dir() / "synthetic")


def engine(device, path, **kw) -> tuple[Engine, object]:
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    eng = Engine(device, header, cfg, n_ctx=N_CTX, logits_all=True, host_values=read_host_values(path, header, cfg),
                 **kw)
    eng.weights.upload_file(path)
    return eng, tok


@pytest.fixture(scope="module")
def made(path):
    eng, tok = engine(open_native(), path)
    yield eng, tok
    eng.close()


def test_caches_only_on_layers_with_their_own_kv(made):
    """Layers 0..4 cache K/V at their own head size and KV heads; 5 and 6 keep none (they attend 3's and 4's); the
    budget counts exactly those caches."""
    eng, _ = made
    cfg, s = eng.cfg, eng.scratch
    assert eng.kv_layers == (0, 1, 2, 3, 4) and s.k_cache[5] is None and s.v_cache[6] is None
    assert [s.k_cache[il].size for il in range(5)] == [4 * N_CTX * n for n in (128, 128, 128, 128, 128)]
    assert eng.out_scale.keys() == set(range(7)) and all(0.6 <= v <= 0.8 for v in eng.out_scale.values())
    assert len(eng.rope_freqs) == 64 and eng.rope_freqs[:16] == [1.0] * 16 and eng.rope_freqs[16] > 1e29
    b = budget.count(eng.device.info.limits, eng.header, cfg, N_CTX, logits_all=True)
    assert b.total("kv") == N_CTX * cfg.kv_bytes_per_token() == sum(s.k_cache[il].size * 2 for il in range(5))


def test_every_traced_tensor_matches_the_reference(made, path):
    """Prefill from 0 past the sliding window, then one decode step: every traced tensor of both against the numpy
    reference (its cache carried between the two calls, as the engine's is)."""
    eng, tok = made
    names = traced_names_matching_the_reference(eng, tok, path)
    assert {"inp_per_layer_selected", "per_layer_proj", "inp_per_layer"} <= names
    for il in range(7):
        assert {f"Qcur_rope-{il}", f"kqv_out-{il}", f"attn_post_norm-{il}", f"pe_in-{il}",
                f"per_layer_embd_out-{il}", f"l_out-{il}"} <= names
    assert {f"Vcur_normed-{il}" for il in range(5)} <= names and "Kcur_rope-5" not in names


def test_the_per_layer_table_split_over_bindings(path, monkeypatch):
    """E2B's per-layer table at 8 bits is over one 2 GB binding: the engine splits it in row ranges (alloc_weight) and
    the lookup reads each token's row from the part that holds it. Here the table is cut into 4 parts (a binding of
    a quarter of it, not a whole number of rows) and the logits still match the reference."""
    alloc = weights_mod.alloc_weight
    made_parts = {}

    def small(device, name, type, rows, cols, max_binding=None):
        if name == "per_layer_token_embd.weight":
            max_binding = type.row_bytes(cols) * rows // 4 + 12
        w = alloc(device, name, type, rows, cols, max_binding)
        made_parts[name] = len(w.parts)
        return w
    monkeypatch.setattr(weights_mod, "alloc_weight", small)
    eng, tok = engine(open_native(), path)
    try:
        assert made_parts["per_layer_token_embd.weight"] == 4
        ids = tok.encode(TEXT, add_bos=tok.add_bos)
        eng.step(ids, 0)
        raw = run(eng.device.read(eng.scratch.logits, 0, 4 * len(ids) * eng.cfg.n_vocab))
        got = np.frombuffer(raw, np.float32).reshape(len(ids), -1)
        want = Reference(path).forward(ids)
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= REF_TOL
    finally:
        eng.close()
