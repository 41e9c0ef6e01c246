"""Synthetic GGUFs (for benchmarks on machines without the model files) have exactly the real models'
tensor names, shapes and types, valid blocks, and the same config; the benchmark runs on them."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from lab.format import gguf, model
from lab.host import models
from lab.host.bench import native as bench
from lab.host.synthetic import releases as synthetic


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_same_tensors_and_config_as_the_real_file(name, tmp_path):
    path = synthetic.write(name, tmp_path / f"{name}.gguf")
    syn, real = gguf.read_file(path), gguf.read_file(models.path(name))
    assert {t.name: (t.shape, t.type_id) for t in syn.tensors} == {t.name: (t.shape, t.type_id) for t in real.tensors}
    assert model.from_gguf(syn) == model.from_gguf(real)
    # every block decodes to finite values (the f16 scales were made valid)
    r = GGUFReader(path)
    for t in r.tensors[:12]:
        assert np.isfinite(dequantize(t.data, t.tensor_type)).all(), t.name


@pytest.mark.parametrize("name", ["smollm2", "qwen2.5", "gemma3"])
def test_a_writer_starts_from_the_registry(name):
    """lab.format.model.config_of_keys, where both synthetic builders start (lab.host.synthetic.layout): from a real
    file's keys alone, the table of a file that holds every optional tensor is the real file's plus the optional ones
    it leaves out (SmolLM2 and Gemma 3 tie the head; neither has rope_freqs)."""
    real = gguf.read_file(models.path(name))
    have = {t.name: t.shape for t in real.tensors}
    table = model.stored_tensors(model.config_of_keys(real.metadata, model.from_gguf(real).n_vocab))
    assert {n: s for n, s in table.items() if n in have} == have
    assert set(table) - set(have) <= set(model.OPTIONAL_TENSORS)


def test_bench_kernels_runs(device):
    rows = bench.bench_kernels(shapes=[("Q4_1", 64, 256), ("Q6_K", 32, 512), ("IQ2_XXS", 32, 512)], repeat=2,
                               tokens=4)
    # one row per type and shape, a grid type's too
    assert [(r["type"], r["rows"], r["cols"]) for r in rows] == [("Q4_1", 64, 256), ("Q6_K", 32, 512),
                                                                ("IQ2_XXS", 32, 512)]
    assert all(r["matvec_us"] > 0 and math.isfinite(r["matmul_gflop_s"]) for r in rows)


def test_bench_kernels_workgroup_sizes(device, capsys):
    """--wg: a row per workgroup size asked, each timed with it; --types with --shapes: any shape, not only the
    table's; a shape that splits a block, or a size not a power of two, is refused with one line."""
    from lab.host.cli import main
    assert main(["bench", "kernels", "--types", "Q6_K,Q4_1", "--shapes", "16x512", "--wg", "4,32", "--repeat", "2",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["type"], r["rows"], r["cols"], r["wg"]) for r in rows] == [
        ("Q6_K", 16, 512, 4), ("Q6_K", 16, 512, 32), ("Q4_1", 16, 512, 4), ("Q4_1", 16, 512, 32)]
    assert all(r["matvec_us"] > 0 for r in rows)
    assert main(["bench", "kernels", "--types", "Q6_K", "--shapes", "16x500"]) == 2
    assert "a row must hold whole blocks: Q6_K 16x500" in capsys.readouterr().err
    assert main(["bench", "kernels", "--types", "Q6_K", "--wg", "48"]) == 2
    assert "--wg 48: powers of two from 1 to 256" in capsys.readouterr().err


@pytest.mark.parametrize("name,n_layer,tied,more", [
    ("llama3.2-1b", 16, True, (0, 1, 4, 7, 10, 13, 14, 15)),
    ("llama3.1-8b", 32, False, (0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31))])
def test_llama3_q4_k_m_mix(name, n_layer, tied, more):
    """llama.cpp's Q4_K_M for a dense llama (src/llama-quant.cpp): Q4_K, with Q6_K for the head (the tied
    embedding when the head is tied) and for attn_v / ffn_down in use_more_bits layers. The layer lists here
    are read off llama.cpp's rule by hand, not computed the way synthetic.py computes them."""
    spec = synthetic.SPECS[name]
    table = {n: (t, r, c) for n, t, r, c in synthetic.tensor_table(spec)}
    assert spec.n_layer == n_layer
    assert table["token_embd.weight"][0] == ("Q6_K" if tied else "Q4_K")
    assert ("output.weight" in table) is not tied and (tied or table["output.weight"][0] == "Q6_K")
    for il in range(n_layer):
        want = "Q6_K" if il in more else "Q4_K"
        assert table[f"blk.{il}.attn_v.weight"][0] == table[f"blk.{il}.ffn_down.weight"][0] == want, il
        assert {table[f"blk.{il}.{r}.weight"][0] for r in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} \
            == {"Q4_K"}
    e, ff = spec.n_embd, spec.n_ff
    assert table["blk.0.ffn_down.weight"][1:] == (e, ff) and table["blk.0.attn_k.weight"][1:] == (8 * spec.head_dim, e)
    assert table["rope_freqs.weight"] == ("F32", 1, spec.head_dim // 2)


def test_placeholder_vocabulary_chats(tmp_path):
    """The synthetic files' placeholder vocabulary (add_vocab) is one the page can chat with: the lab's tokenizer
    turns any text into byte tokens (and spaces into "▁") and back, and the chat takes ChatML by its two markers (`lab bench --backend
    browser` on a same-shape 2026 file)."""
    from lab.engine.load import validate
    from lab.text import chat
    v = validate(synthetic.header(synthetic.spec("gemma4-small"), tmp_path / "h.gguf", vocab=True))
    text = "héllo, wörld ✓"
    ids = v.tokenizer.encode(text)
    # SentencePiece's dummy prefix: a space before the text
    assert v.tokenizer.decode(ids) == " " + text and all(3 <= i < 259 or i == 261 for i in ids)
    assert chat.builtin_format(v.tokenizer, {}) == "chatml"


def test_bench_skips_contexts_past_the_model(tmp_path, monkeypatch, capsys):
    """`lab bench --contexts` past the model's own context (its context_length) is skipped with a line on stderr, as
    scripts/device_llamacpp.sh skips llama-bench's depths past it; one at the limit runs. The small smollm3 told
    that its context is 32 tokens (its file says 65,536: a 65,537-token prefill on lavapipe would take minutes)."""
    path = synthetic.write("smollm3-small", tmp_path / "s.gguf")
    monkeypatch.setattr(bench, "from_gguf", lambda h: dataclasses.replace(model.from_gguf(h), n_ctx_train=32))
    assert bench.within_model((0, 2048, 8192, 32768), 8192) == ((0, 2048, 8192), (32768,))
    res = bench.bench_model(path, prompts=(4,), contexts=(0, 32, 40, 1000), decode_tokens=2)
    assert sorted(res["decode"]) == [0, 32] and res["skipped_contexts"] == [40, 1000]
    assert res["n_ctx"] == 32 + 2 * 2 + 18 and res["n_ctx_train"] == 32      # the cache holds the kept contexts only
    assert res["gpu_memory_mb"]["kv_cache"] > 0
    err = capsys.readouterr().err
    assert "context 40 skipped: past the model's own context of 32 tokens" in err and "context 1,000 skipped" in err


@pytest.mark.parametrize("name", ["lfm2-small", "qwen35-small"])
def test_the_native_bench_of_a_hybrid_runs(device, name):
    """`lab bench` and `lab bench --profile` natively on a hybrid (issue #45, whose page bench stopped at its profile's
    decode): every step the bench runs continues from where the conv and delta-net states stand (the prefill's chunks,
    each context's chat from 0, the one-by-one decode after it), and a profile's step at a position past 0 is primed
    at 0 (lab.instruments.profile.prime) after a warm-up that left the states at max_batch (32: qwen35's recurrent
    state cannot step back to 20; lfm2's conv ring of 18 rows still could, and tests/engine/test_profile.py holds
    it)."""
    path = synthetic.cached(name)
    res = bench.bench_model(path, prompts=(4, 40), contexts=(0, 20), decode_tokens=2, max_batch=32, warm_gpu_s=0.01)
    assert sorted(res["prefill"]) == [4, 40] and sorted(res["decode"]) == [0, 20]
    assert all(d["tok_s"] > 0 for d in res["decode"].values())
    if "timestamp-query" not in device.info.features:
        pytest.skip("this adapter has no timestamp queries")
    rows = bench.profile_step(path, t=1, context=20, max_batch=32, warm_gpu_s=0.01)
    assert rows[0]["family"] == "whole step" and all(r["gpu_us"] > 0 for r in rows)
