"""The same-shape synthetic files of lab.host.synthetic.releases (`lab bench --synthetic NAME`) for the 2026 releases: SmolLM3-3B,
LFM2-350M and 1.2B, Qwen3.5-0.8B and 2B, Gemma 4 E2B and E4B.

1. Every tensor's type is llama-quantize's: lab.host.synthetic.q4_k_m_types against what llama-quantize --dry-run
   Q4_K_M wrote for each spec's F32 copy (tests/fixtures/mixed/sameshape-q4_k_m.json, scripts/make_mixed_fixtures.py),
   the real sizes and the small variants.
2. Every real-size header is one the lab accepts (from_gguf runs as the header is written, before any data) and says
   what the release's config says: layers, widths, the layer kinds (SmolLM3's NoPE layers, LFM2's attention layers,
   Qwen3.5's full-attention layers, Gemma 4's full layers and its shared-KV tail).
3. Per architecture, a small variant (few layers, n_embd 256, 512 tokens), built by the same code, loads natively
   (lavapipe) and runs a prefill and decode steps to finite logits. --slow: the real-size files, one prefill and one
   decode step each.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from lab.engine.engine import Engine, read_host_values
from lab.format import gguf
from lab.format.model import from_gguf
from lab.host.synthetic import releases as synthetic
from tests.conftest import FIXTURES

NEW = ("smollm3", "lfm2-350m", "lfm2-1.2b", "qwen3.5-0.8b", "qwen3.5-2b", "gemma4-e2b", "gemma4-e4b")
LLAMA_QUANTIZE = json.loads((FIXTURES / "mixed" / "sameshape-q4_k_m.json").read_text())


@pytest.mark.parametrize("name", sorted(LLAMA_QUANTIZE))
def test_types_are_llama_quantizes(name):
    got = {tname: t for tname, t, _, _ in synthetic.tensor_table(synthetic.spec(name))}
    want = LLAMA_QUANTIZE[name]
    assert got.keys() == want.keys()
    wrong = {n: (got[n], want[n]) for n in want if got[n] != want[n]}
    assert not wrong, f"{name}: {len(wrong)} types differ from llama-quantize's, e.g. {list(wrong.items())[:4]}"


# What each release's config.json says (the sources: lab/host/synthetic/releases.py), as the lab's Config reads it:
# (n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, tied, the layers of the other kind)
RELEASES = {
    "smollm3": (36, 2048, 11008, 16, 4, 128, 128256, True, tuple(range(3, 36, 4))),     # no RoPE
    "lfm2-350m": (16, 1024, 4608, 16, 8, 64, 65536, True, (2, 5, 8, 10, 12, 14)),       # attention
    "lfm2-1.2b": (16, 2048, 8192, 32, 8, 64, 65536, True, (2, 5, 8, 10, 12, 14)),       # attention
    "qwen3.5-0.8b": (24, 1024, 3584, 8, 2, 256, 248320, True, tuple(range(3, 24, 4))),  # full attention
    "qwen3.5-2b": (24, 2048, 6144, 8, 2, 256, 248320, True, tuple(range(3, 24, 4))),    # full attention
    "gemma4-e2b": (35, 1536, 12288, 8, 1, 512, 262144, True, tuple(range(4, 35, 5))),   # full (n_ff: the widest)
    "gemma4-e4b": (42, 2560, 10240, 8, 2, 512, 262144, True, tuple(range(5, 42, 6))),   # full attention
}


@pytest.mark.parametrize("name", NEW)
def test_real_size_header_is_the_release(name, tmp_path):
    cfg = from_gguf(synthetic.header(synthetic.spec(name), tmp_path / "h.gguf"))
    other = tuple(il for il in range(cfg.n_layer) if not cfg.rotates(il)) if cfg.arch == "smollm3" \
        else tuple(il for il in range(cfg.n_layer) if not cfg.sliding[il]) if cfg.arch == "gemma4" \
        else cfg.attention_layers
    got = (cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_vocab, cfg.tied_output,
           other)
    assert got == RELEASES[name]
    if cfg.arch == "qwen35":
        assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_head_dim, cfg.l_cache, cfg.n_rot) == (16, 16, 128, 4, 64)
    if cfg.arch == "lfm2":
        assert cfg.l_cache == 3
    if cfg.arch == "gemma4":     # sliding heads of 256, the shared tail, per-layer inputs of 256, E2B's wide FFNs
        shared = {"gemma4-e2b": 20, "gemma4-e4b": 18}[name]
        assert (cfg.head_dim_of(0), cfg.kv_from_start, cfg.n_embd_per_layer) == (256, cfg.n_layer - shared, 256)
        widths = [6144, 12288] if name == "gemma4-e2b" else [10240, 10240]
        assert [cfg.n_ff_of(il) for il in (0, cfg.n_layer - 1)] == widths


def prefill_and_decode(device, path, prompt: list[int], decode: int) -> np.ndarray:
    """Logits [n_vocab] after a prefill of `prompt` and `decode` greedy decode steps, natively."""
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    engine = Engine(device, header, cfg, n_ctx=len(prompt) + decode + 1,
                    host_values=read_host_values(path, header, cfg))
    try:
        engine.weights.upload_file(path)
        engine.step(prompt, 0)
        for i in range(decode):
            next_id = asyncio.run(engine.argmax())
            assert 0 <= next_id < cfg.n_vocab
            engine.step(None, len(prompt) + i)       # ids[0] already holds the argmax
        raw = asyncio.run(device.read(engine.scratch.logits, 0, 4 * cfg.n_vocab))
        return np.frombuffer(raw, np.float32)
    finally:
        engine.close()


@pytest.mark.parametrize("name", sorted(synthetic.SMALL))
def test_small_variant_runs(device, name):
    logits = prefill_and_decode(device, synthetic.cached(name), [1, 7, 300, 42, 511, 3], decode=3)
    assert np.isfinite(logits).all() and logits.std() > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_real_size_file_runs(device, name):
    logits = prefill_and_decode(device, synthetic.cached(name), [1, 1000, 20000, 300], decode=1)
    assert np.isfinite(logits).all() and logits.std() > 0


def test_bench_takes_every_spec_and_names_them_when_refusing(capsys):
    """`lab bench --synthetic` reads its names from SPECS (one home): an unknown name is refused with the list."""
    from lab.host import cli
    assert cli.main(["bench", "--synthetic", "qwen3.5-9b"]) == 2
    err = capsys.readouterr().err
    assert "'qwen3.5-9b' is not one of" in err and all(name in err for name in (*synthetic.SPECS, *NEW))
