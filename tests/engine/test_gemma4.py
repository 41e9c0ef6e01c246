"""gemma4 natively on the synthetic Gemma 4-shaped F32 file (7 layers: 0, 1, 3, 5 sliding with heads of 64 over 2 KV
heads, 2, 4, 6 full with heads of 128 over 1; 5 and 6 read the caches of 3 and 4; per-layer embeddings; out_scale):
the engine against the numpy reference tensor by tensor in prefill and decode, the caches it keeps (none on the
shared-KV layers) and counts, and the per-layer embedding table read from several bindings.

llama.cpp parity (logits, greedy ids) is tests/engine/test_architectures.py's gemma4 cases."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from lab.engine import budget
from lab.engine.engine import Engine, read_host_values
from lab.engine.load import validate
from lab.format import gguf
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.host.native import open_native
from lab.host.reference import Reference
from lab.instruments import forget
from lab.instruments.probes import Probes
from lab.ops import weights as weights_mod
from tests.engine.hybrids import traced_names_matching_the_reference

N_CTX = 64
REF_TOL = 1e-3          # logits, relative to the reference's largest (tests/engine/test_architectures.py)
TEXT = ("The old lighthouse keeper climbed the stairs every evening, counting the steps: one hundred and twelve. "
        "Nobody knew why he still did it.")

PER_LAYER = "per_layer_token_embd.weight"      # the file's per-layer token embeddings (gemma4)


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


def in_four_parts(path, monkeypatch) -> tuple[Engine, object]:
    """An engine whose per-layer table is cut into 4 parts: a binding of a quarter of it, not a whole number of rows
    (E2B's table at 8 bits is over one 2 GB binding, and alloc_weight splits it in row ranges)."""
    alloc = weights_mod.alloc_weight

    def small(device, name, type, rows, cols, max_binding=None, **kw):
        if name == PER_LAYER:
            max_binding = type.row_bytes(cols) * rows // 4 + 12
        return alloc(device, name, type, rows, cols, max_binding, **kw)
    monkeypatch.setattr(weights_mod, "alloc_weight", small)
    eng, tok = engine(open_native(), path)
    assert len(eng.weights.per_layer_embedding.parts) == 4
    return eng, tok


def test_the_per_layer_table_split_over_bindings(path, monkeypatch):
    """The lookup reads each token's row from the part that holds it: with the table in 4 parts the logits still
    match the reference."""
    eng, tok = in_four_parts(path, monkeypatch)
    try:
        ids = tok.encode(TEXT, add_bos=tok.add_bos)
        eng.step(ids, 0)
        raw = run(eng.device.read(eng.scratch.logits, 0, 4 * len(ids) * eng.cfg.n_vocab))
        got = np.frombuffer(raw, np.float32).reshape(len(ids), -1)
        want = Reference(path).forward(ids)
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= REF_TOL
    finally:
        eng.close()


# q8_0's table with --slow: the row read from a part is the same code path, its dequantization held by get_rows' tests
@pytest.mark.parametrize("mix", ["f32", pytest.param("q8_0", marks=pytest.mark.slow)])
def test_the_embedding_inspector_reads_the_per_layer_row(mix, monkeypatch):
    """The embedding inspector (lab/instruments/probes.py) shows a token's row of per_layer_token_embd as stored:
    read on the GPU from whichever of the table's 4 parts holds it, it is gguf's dequantization of the file's tensor
    exactly (the first and last token of every part), each layer slice's norm is that slice's, the main row is still
    token_embd's; and Forget wipes the buffer the row was read into."""
    path = synthetic_arch.build("gemma4", mix, cache_dir() / "synthetic")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    want = {name: dequantize(tensors[name].data, tensors[name].tensor_type)
            for name in ("token_embd.weight", PER_LAYER)}
    eng, _ = in_four_parts(path, monkeypatch)
    pr = Probes(eng)
    try:
        cfg, table = eng.cfg, eng.weights.per_layer_embedding
        L, P = cfg.n_layer, cfg.n_embd_per_layer
        ids = sorted({i for part in table.parts for i in (part.first_row, part.first_row + part.n_rows - 1)})
        assert len(ids) == 8 and ids[-1] == cfg.n_vocab - 1
        for tid in ids:
            e = run(pr.embedding(tid))
            row = want[PER_LAYER][tid].reshape(L, P)
            np.testing.assert_array_equal(np.frombuffer(e.per_layer, np.float32).reshape(L, P), row,
                                          err_msg=f"token {tid}")
            np.testing.assert_allclose(e.per_layer_norms, np.linalg.norm(row.astype(np.float64), axis=1), rtol=1e-6)
            np.testing.assert_array_equal(np.frombuffer(e.values, np.float32), want["token_embd.weight"][tid])
        assert e.per_layer_table_bytes == tensors[PER_LAYER].n_bytes
        report = run(forget.wipe(eng.device))
        assert report.wiped and pr.q_per_layer in forget.conversation_buffers(eng.device)
        assert eng.device.read_sync(pr.q_per_layer) == bytes(pr.q_per_layer.size)
    finally:
        pr.close()
        eng.close()
