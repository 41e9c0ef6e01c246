"""The memory budget (lab/engine/budget.py) on the three real models' headers: what they need at a few contexts, the
largest context that fits when a smaller one would help, and the refusals, with their numbers.

The pinned byte counts were measured with the planner and checked here against independent formulas: the KV cache
is 2 (K, V) x layers x context x KV heads x head size x 4 B, and the weights are the tensors' own bytes (each
buffer padded to 4), so a budget that forgets a part, or counts one twice, fails."""

from __future__ import annotations

import pytest

from lab.engine import budget
from lab.format import gguf
from lab.format.model import expected_tensors, from_gguf
from lab.settings import DEFAULT_CTX, context_for

WEBGPU_DEFAULT = {"max_buffer_size": 1 << 28, "max_storage_buffer_binding_size": 1 << 27}   # the spec's defaults
# name -> (weight bytes, activation bytes at the default batch), measured by the budget
PINNED = {"smollm2": (96_576_768, 2_067_504), "qwen2.5": (485_452_288, 5_330_736), "gemma3": (246_587_904, 3_771_696)}


@pytest.fixture(scope="module")
def headers(smollm2_path, qwen_path, gemma_path):
    return {"smollm2": gguf.read_file(smollm2_path), "qwen2.5": gguf.read_file(qwen_path),
            "gemma3": gguf.read_file(gemma_path)}


def count(limits, h, n_ctx=None, **kw) -> budget.Budget:
    """The budget of header `h` at `n_ctx` (by default the context a load makes)."""
    cfg = from_gguf(h)
    return budget.count(limits, h, cfg, context_for(cfg.n_ctx_train) if n_ctx is None else n_ctx, **kw)


@pytest.mark.parametrize("name", list(PINNED))
@pytest.mark.parametrize("n_ctx", [2, 2048, 8192])
def test_real_models_needs(headers, name, n_ctx):
    h = headers[name]
    cfg = from_gguf(h)
    p = budget.count(WEBGPU_DEFAULT, h, cfg, n_ctx)
    assert p.fits, p.problems
    kv = 2 * cfg.n_layer * n_ctx * cfg.n_head_kv * cfg.head_dim * 4
    assert p.total("kv") == kv == cfg.kv_bytes_per_token() * n_ctx
    assert sum(n.kv for n in p.needs) == 2 * cfg.n_layer           # one K and one V buffer per layer
    own = sum(t.nbytes for t in h.tensors if t.name in expected_tensors(cfg))
    weights = [n for n in p.needs if n.kind == "weights"]
    assert 0 <= p.total("weights") - own < 4 * len(weights)          # every tensor once, each buffer padded to 4
    assert (p.total("weights"), p.total("scratch")) == PINNED[name]
    # the weights are split to fit a binding: no buffer is over the limit, and the big tables are in parts
    assert max(n.size for n in p.needs) <= WEBGPU_DEFAULT["max_storage_buffer_binding_size"]


def test_default_context_is_the_engines_bounded_by_the_models(headers):
    for h in headers.values():
        assert count(WEBGPU_DEFAULT, h).n_ctx == DEFAULT_CTX
    cfg = from_gguf(headers["smollm2"])
    assert context_for(cfg.n_ctx_train, None) == DEFAULT_CTX
    assert context_for(cfg.n_ctx_train, 1 << 20) == cfg.n_ctx_train == 8192     # bounded by the model's own
    assert context_for(cfg.n_ctx_train, 1) == 2


def test_split_tables_are_in_binding_sized_parts(headers):
    """qwen2.5's output table (151936 x 896 Q8_0, 144.6 MB) is over a 128 MiB binding: two parts, whole rows."""
    p = count(WEBGPU_DEFAULT, headers["qwen2.5"], n_ctx=2048)
    parts = [n for n in p.needs if n.label.startswith("output.weight[")]
    t = next(t for t in headers["qwen2.5"].tensors if t.name == "output.weight")
    assert len(parts) == 2 and sum(n.size for n in parts) == t.nbytes
    assert parts[0].size <= 1 << 27 and parts[0].size % (t.nbytes // 151936) == 0


def test_suggests_the_largest_context_that_fits(headers):
    """A 4 MiB binding limit: SmolLM2's K cache per layer is 8192 x 3 x 64 x 4 B = 6 MiB at 8192 tokens, over it;
    4 MiB / 768 B per token = 5461 tokens is the largest that fits."""
    limits = {"max_buffer_size": 1 << 30, "max_storage_buffer_binding_size": 4 << 20}
    h = headers["smollm2"]
    p = count(limits, h, n_ctx=8192)
    assert not p.fits and p.suggestion == 5461
    assert "'k cache 0 [n_ctx, kv]' needs 6,291,456 bytes" in p.problems[0]
    assert "maxStorageBufferBindingSize of 4,194,304 bytes" in p.problems[0]
    assert len(p.problems) == 2 * 30                                 # every layer's K and V
    assert count(limits, h, n_ctx=5461).fits and not count(limits, h, n_ctx=5462).fits
    msg = p.message()
    assert "A context of 5,461 tokens would fit" in msg and "(and 57 more)" in msg
    with pytest.raises(budget.BudgetError, match="5,461 tokens would fit"):
        budget.check(p)


def test_max_buffer_size_is_named_when_it_is_the_smaller_limit(headers):
    limits = {"max_buffer_size": 4 << 20, "max_storage_buffer_binding_size": 1 << 27}
    p = count(limits, headers["gemma3"], n_ctx=8192)        # gemma3: 1 x 256 x 4 B = 1 KiB per token
    assert not p.fits and p.suggestion == 4096
    assert "over the adapter's maxBufferSize of 4,194,304 bytes" in p.problems[0]
    # weights were split by the smaller of the two limits, so only the caches are over
    assert all("cache" in x for x in p.problems)


def test_refuses_weights_no_context_can_save(headers):
    """A binding smaller than one row of the embedding table: no split and no context helps; the row is named."""
    limits = {"max_buffer_size": 1 << 30, "max_storage_buffer_binding_size": 512}
    p = count(limits, headers["smollm2"], n_ctx=2048)
    assert not p.fits and p.suggestion is None
    assert "one row is 612 bytes, over this GPU's storage binding limit (512 bytes)" in p.problems[0]
    assert "No context makes it fit" in p.message()


def test_context_outside_the_models_own_is_refused_on_the_page_path(headers):
    past = count(WEBGPU_DEFAULT, headers["smollm2"], n_ctx=8193)
    with pytest.raises(budget.BudgetError, match="outside 2..8,192"):
        budget.check(past)
    assert budget.check(past, bounded=False).n_ctx == 8193


def test_the_model_cards_summary(headers):
    s = count(WEBGPU_DEFAULT, headers["smollm2"], 4096).card(from_gguf(headers["smollm2"]))
    assert s["n_ctx"] == 4096 and s["fits"] and s["default_ctx"] == 2048 and s["n_ctx_train"] == 8192
    assert s["kv_bytes"] == 4096 * s["kv_bytes_per_token"] == 4096 * 46080
    assert s["message"] is None and s["largest"]["label"] == "token_embd.weight"


def test_page_load_prefills_in_wide_steps_on_a_gpu(headers):
    """A GPU adapter's page load prefills 512 tokens a step (a CPU adapter 64), and the card's budget counts the
    wider step's activations."""
    from lab.engine.scratch import DEFAULT_BATCH, GPU_BATCH, prefill_batch
    from lab.gpu import AdapterInfo
    gpu_info = AdapterInfo("browser", "nvidia", frozenset(), dict(WEBGPU_DEFAULT))
    cpu_info = AdapterInfo("browser", "swiftshader", frozenset(), dict(WEBGPU_DEFAULT), software=True)
    assert (prefill_batch(gpu_info), prefill_batch(cpu_info)) == (GPU_BATCH, DEFAULT_BATCH) == (512, 64)
    h = headers["smollm2"]
    wide = count(WEBGPU_DEFAULT, h, max_batch=GPU_BATCH)
    narrow = count(WEBGPU_DEFAULT, h, max_batch=DEFAULT_BATCH)
    assert wide.fits and wide.total("scratch") > narrow.total("scratch") and wide.total("kv") == narrow.total("kv")
    card = wide.card(from_gguf(h))
    plain = narrow.card(from_gguf(h))
    assert card["fits"] and card["scratch_bytes"] == wide.total("scratch") > plain["scratch_bytes"]


def test_engine_refuses_before_making_a_buffer(device, headers, monkeypatch):
    """The native engine counts the same budget first: a refusal leaves the device's registry as it was."""
    from lab.engine.engine import Engine
    monkeypatch.setitem(device.info.limits, "max_storage_buffer_binding_size", 4 << 20)
    before = len(device.buffers)
    with pytest.raises(budget.BudgetError, match="'k cache 0 \\[n_ctx, kv\\]' needs 6,291,456 bytes"):
        Engine(device, headers["smollm2"], n_ctx=8192)
    assert len(device.buffers) == before


def test_engine_takes_the_loads_budget_and_counts_no_other(device, headers, monkeypatch):
    """A load counts once: an Engine handed the budget counts none of its own, and refuses one counted for another
    context (it would check the wrong buffers)."""
    from lab.engine.engine import Engine, EngineError
    h = headers["smollm2"]
    cfg = from_gguf(h)
    counted = budget.count(device.info.limits, h, cfg, 64, max_batch=8)
    with pytest.raises(EngineError, match="counted for"):
        Engine(device, h, cfg, n_ctx=128, max_batch=8, counted=counted)

    def no_recount(*a, **k):
        raise AssertionError("the engine counted the budget again")
    monkeypatch.setattr(budget, "count", no_recount)
    eng = Engine(device, h, cfg, n_ctx=64, max_batch=8, counted=counted)
    try:
        assert eng.budget is counted
    finally:
        eng.close()


def test_says_when_the_f16_cache_would_fit(headers):
    """SmolLM2 at 8,192 tokens with a 4 MiB binding limit: each layer's f32 K cache is 6 MiB, over it; in f16 3 MiB,
    within it. The message says so beside the smaller context; the f16 count fits with no such line."""
    limits = {"max_buffer_size": 1 << 30, "max_storage_buffer_binding_size": 4 << 20}
    h = headers["smollm2"]
    p = count(limits, h, n_ctx=8192)
    assert not p.fits and p.f16_fits and p.card(from_gguf(h))["f16_fits"]
    msg = p.message()
    assert "With the KV cache in f16 (half its memory) this context fits" in msg
    assert "A context of 5,461 tokens would fit with the f32 cache" in msg
    f16 = count(limits, h, n_ctx=8192, kv="f16")
    assert f16.fits and not f16.f16_fits and f16.total("kv") * 2 == p.total("kv")
    # past what even f16 allows (16 MiB a layer's K at 32,768 tokens in f16 > 4 MiB): no f16 line
    big = count(limits, h, n_ctx=32768)
    assert not big.f16_fits and "in f16" not in big.message()
