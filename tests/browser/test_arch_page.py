"""One new architecture held to llama.cpp in the page itself (headless Chromium, SwiftShader WebGPU): the synthetic
Llama 3 file (lab.host.synthetic.arch "llama3", F32: rope_freqs read from the file by the worker's one File.slice,
SmolLM2's vocabulary under the llama-bpe pre-tokenizer) is loaded through the file input, and its greedy continuation
of the fixture's prompt, run through the worker's engine (the `labGreedyIds` test hook: the prefill and decode steps
the chat runs, without a template), must be llama.cpp's id for id up to the first step where llama.cpp's own top-2
gap is a near-tie; and the logits at prompt positions 1, 5, 9, 16, 24 (each the last row of a prefill of the
prompt's first p + 1 ids, `labLastLogits`) must be llama.cpp's within F32_TOL over its top 64 and 64 fixed ids, with
the same top-1 (tests/engine/test_architectures.py holds the same file natively, with the tolerance's reason). The
other 2026 architectures likewise, and Gemma 4's per-layer embedding in the embedding inspector.

One page serves the module, the cards' page (tests/browser/conftest.py `card_page`): each test picks its file in it (a
second pick replaces the model, as a user's would). The
48-token runs and two-turn chats of tests/engine/test_long_parity.py run in the page with --slow; by default the
two-turn chat is held natively (test_long_parity.py) and a hybrid's second turn in the page by test_hybrid_page.py."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from tests.browser.conftest import take
from tests.conftest import LONG_SPECS
from tests.browser.test_layout import check_png, download, shot
from tests.conftest import FIXTURES

NEAR_TIE = 0.01          # as tests/engine/test_architectures.py: F32 on both sides, summation order apart
F32_TOL = 2e-2           # as tests/engine/test_architectures.py (measured 2.1e-5 natively on this file)


@pytest.fixture(scope="module")
def arch_lab(card_page):
    return take(card_page, synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic"))


def _load(lab, spec: str):
    """Pick the synthetic F32 file of `spec` in the module's page (unless it is the one loaded) and wait for it."""
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    loaded = lab.page.evaluate("name => !document.querySelector('[data-testid=prompt]').disabled && document."
                               "querySelector('[data-testid=model-info]').textContent.includes(name)", path.name)
    if not loaded:
        lab.pick(path)
        lab.wait_loaded(path.name)
    return path


def _held_to_llama_cpp(page, spec: str, positions=None) -> None:
    """The page's greedy ids and logits of the fixture's prompt against llama.cpp's (`positions`: a subset)."""
    fx = json.loads((FIXTURES / "arch" / f"{spec}-f32.json").read_text())
    want, gaps = fx["greedy"], fx["top2_gap"]
    got = page.evaluate("([ids, n]) => window.labGreedyIds(ids, n).then((m) => m.ids)", [fx["prompt_ids"], len(want)])
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if gaps[i] < NEAR_TIE:
            break
        assert g == w, f"greedy step {i}: {g} != llama.cpp's {w} (gap {gaps[i]})"
    worst = 0.0
    for p in fx["positions"]:
        if positions is not None and p["pos"] not in positions:
            continue
        m = page.evaluate("(ids) => window.labLastLogits(ids).then((m) => m.logits)", fx["prompt_ids"][:p["pos"] + 1])
        row = np.frombuffer(base64.b64decode(m), np.float32)
        ids = p["top_ids"] + fx["sample_ids"]
        diff = float(np.abs(row[ids] - np.array(p["top_logits"] + p["sample_logits"])).max())
        worst = max(worst, diff)
        assert diff <= F32_TOL, f"position {p['pos']}: max |logit diff| {diff:.3g} > {F32_TOL}"
        if p["top_logits"][0] - p["top_logits"][1] >= NEAR_TIE:
            assert int(np.argmax(row)) == p["top_ids"][0], f"position {p['pos']}: top-1 differs"
    print(f"\n{spec}-f32 in the page: max |logit diff| vs llama.cpp {worst:.3g}")


def test_llama3_in_the_page_is_llama_cpps(arch_lab):
    lab = arch_lab
    page = lab.page
    _load(lab, "llama3")
    _held_to_llama_cpp(page, "llama3")
    # `lab bench --backend browser --profile` on this adapter: the worker times its steps by timestamp queries
    # (web/worker.js labTimePass). As natively (tests/engine/test_profile.py): the families partition the
    # step's dispatches, and every pass took GPU time.
    for t, pos, warm_ms in ((8, 0, 0), (1, 12, 50)):
        m = page.evaluate("([t, pos, w]) => window.labProfile(t, pos, true, 1, w)", [t, pos, warm_ms])
        whole, fams = m["rows"][0], m["rows"][1:]
        assert whole["family"] == "whole step" and sum(r["dispatches"] for r in fams) == whole["dispatches"] > 0
        assert all(r["gpu_us"] > 0 for r in m["rows"]), m["rows"]
    assert lab.errors() == [] and lab.foreign_requests() == []


def test_smollm3_in_the_page_and_its_layers_without_rope(arch_lab):
    """SmolLM3's every 4th layer has no RoPE (layers 3 and 7 of the 8-layer synthetic file): the page matches
    llama.cpp (prefill positions past the first NoPE layer's reach, and greedy decode), and says which layers have no
    position signal: the attention panel's layer list and note, and the RoPE demo, which has no pairing to show there
    and says so instead of fetching."""
    lab = arch_lab
    page = lab.page
    _load(lab, "smollm3")
    _held_to_llama_cpp(page, "smollm3", positions={5, 24})
    page.fill('[data-testid="max-tokens"]', "2")
    page.fill('[data-testid="prompt"]', "Hello there")
    page.click('[data-testid="send"]')
    page.wait_for_function("document.querySelector('[data-testid=timings]').textContent.length > 0",
                           timeout=300_000)
    lab.open_panel("attention")
    lab.wait_in_card("attention", "[data-testid=attention-cell]", 300_000)
    options = page.eval_on_selector_all("[data-testid=attention-layer] option", "os => os.map(o => o.textContent)")
    assert [i for i, o in enumerate(options) if o.endswith("(no RoPE)")] == [3, 7]
    page.select_option("[data-testid=attention-layer]", "3")
    note = page.wait_for_selector("[data-testid=attention-no-rope]", timeout=60_000).inner_text()
    assert "Layer 3 has no rotary position embedding" in note and "every 4th layer" in note
    page.select_option("[data-testid=attention-layer]", "2")
    page.wait_for_function("document.querySelector('#attention-body p').textContent.startsWith('layer 2,')")
    assert page.query_selector("[data-testid=attention-no-rope]") is None
    page.locator("#rope").evaluate("e => e.scrollIntoView({block: 'nearest'})")
    page.select_option('[data-testid="rope-layer"]', "7")
    page.wait_for_function("document.querySelector('[data-testid=rope-fetch]').disabled")
    assert "Layer 7 has no RoPE" in page.inner_text("#rope-real")
    page.select_option('[data-testid="rope-layer"]', "6")
    page.wait_for_function("!document.querySelector('[data-testid=rope-fetch]').disabled")
    assert lab.errors() == [] and lab.foreign_requests() == []


# qwen35 with --slow: by default the verification card holds the same file in the page to llama.cpp's exact logits and
# 16 greedy ids (tests/browser/test_verify_page.py test_card_on_a_hybrid); the MoE files with --slow: by default the
# Router card runs qwen3moe in the page, every routed layer's choices and weights against the numpy reference
# (tests/browser/test_router_page.py)
@pytest.mark.parametrize("spec", [pytest.param("qwen35", marks=pytest.mark.slow), "gemma4",
                                  pytest.param("qwen3moe", marks=pytest.mark.slow),
                                  pytest.param("mixtral", marks=pytest.mark.slow),
                                  pytest.param("lfm2moe", marks=pytest.mark.slow)])
def test_a_2026_architecture_in_the_page_is_llama_cpps(arch_lab, spec):
    """The page's worker runs as natively, greedy ids and logits against llama.cpp: Qwen3.5's gated delta-net layers
    (conv and recurrent state, one dispatch each for the whole prefill chunk) and gated attention layers; Gemma 4's
    sliding and full layers with heads of their own size, the shared-KV tail attending earlier layers' caches, the
    per-layer embeddings, layer_output_scale (read with rope_freqs from the file by the worker's slices); the mixtures
    of experts' router, top-k and the chosen experts' products (wgsl/moe.wgsl and matvec's EXPERT variant through
    Tint: qwen3moe, the Mixtral-style llama and lfm2moe's sigmoid gating, with --slow)."""
    lab = arch_lab
    _load(lab, spec)
    _held_to_llama_cpp(lab.page, spec, positions={1, 16, 24})
    assert lab.errors() == [] and lab.foreign_requests() == []


@pytest.mark.slow   # 3 x 48 ids and two turns per file on SwiftShader: natively by default (test_long_parity.py)
@pytest.mark.parametrize("spec", LONG_SPECS)
def test_48_tokens_and_two_turns_in_the_page(arch_lab, spec):
    """As tests/engine/test_long_parity.py, in the page's worker: 48 greedy ids after each of three prompts, and a
    two-turn chat through the worker's Session whose second turn reuses what the first left and is still llama.cpp's."""
    from tests.engine.test_long_parity import compared, fixture
    fx = fixture(spec)
    lab = arch_lab
    page = lab.page
    _load(lab, spec)
    long = 0
    for p in fx["prompts"]:
        got = page.evaluate("([ids, n]) => window.labGreedyIds(ids, n).then((m) => m.ids)",
                            [p["prompt_ids"], len(p["greedy"])])
        n = compared(got, p["greedy"], p["top2_gap"])
        long += n >= 40
        assert got[:n] == p["greedy"][:n], (spec, p["text"])
    assert long >= 2, spec
    chat = fx["chat"]
    turn = "([ids, n]) => window.labGreedyIds(ids, n, true)"
    t1 = page.evaluate(turn, [chat["turn1_ids"], len(chat["turn1_greedy"])])
    assert t1["ids"] == chat["turn1_greedy"] and t1["reused"] == 0, t1
    t2 = page.evaluate(turn, [chat["turn2_ids"], len(chat["turn2_greedy"])])
    n = compared(t2["ids"], chat["turn2_greedy"], chat["turn2_gaps"])
    assert t2["reused"] >= len(chat["turn1_ids"]) and n >= 40 and t2["ids"][:n] == chat["turn2_greedy"][:n], t2


def test_gemma4_per_layer_embedding_in_the_inspector(arch_lab):
    """The embedding inspector on a Gemma 4 file shows the token's row of per_layer_token_embd beside the main one:
    n_layer rows of the per-layer width, every cell the file's value (read on the GPU by the worker's probes,
    tests/engine/test_gemma4.py holds it natively for a table in several bindings), each slice's norm, the note on
    where it enters the model, and why there are no neighbours over that table; the card's JSON export holds the
    same. The card is saved as docs/screenshots/embedding-per-layer.png (LAB_DOC_SHOTS=1)."""
    path = synthetic_arch.build("gemma4", "f32", cache_dir() / "synthetic")
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    table = dequantize(tensors["per_layer_token_embd.weight"].data, tensors["per_layer_token_embd.weight"].tensor_type)
    main = dequantize(tensors["token_embd.weight"].data, tensors["token_embd.weight"].tensor_type)
    n_layer, width = 7, 32
    lab = arch_lab
    page = lab.page
    _load(lab, "gemma4")
    lab.send("The lighthouse keeper", max_tokens=2)
    ids = lab.ids()
    pos = 2
    page.click(f'[data-testid=token][data-index="{pos}"]')
    lab.open_panel("embedding")
    page.wait_for_selector("[data-testid=per-layer-row]", timeout=300_000)
    tid = ids[pos]
    assert page.inner_text("[data-testid=embedding-id]") == str(tid)
    grid = lab.cells("embedding-per-layer", ["layers", "width"])
    assert grid == [{"layers": str(n_layer), "width": str(width)}]
    rows = page.evaluate("[...document.querySelectorAll('[data-testid=per-layer-row]')]"
                         ".map(r => [...r.children].map(c => Number(c.dataset.value)))")
    want = table[tid].reshape(n_layer, width)
    assert len(rows) == n_layer and all(len(r) == width for r in rows)
    np.testing.assert_array_equal(np.array(rows, np.float32), want)            # every value, exactly
    norms = lab.cells("per-layer-norm", ["layer", "value"])
    want_norms = np.linalg.norm(want.astype(np.float64), axis=1)
    np.testing.assert_allclose([float(n["value"]) for n in norms], want_norms, rtol=1e-6)
    assert page.locator("[data-testid=per-layer-norm]").all_inner_texts() == [f"{n:.3f}" for n in want_norms]
    note = page.inner_text("[data-testid=embedding-per-layer-note]")
    assert "per_layer_token_embd (7 × 32 values)" in note and "before the ×√32 scale" in note
    assert "Layer i's per-layer input" in note and "after its feed-forward" in note
    no_nb = page.inner_text("[data-testid=per-layer-no-neighbours]")
    ratio = tensors["per_layer_token_embd.weight"].n_bytes / tensors["token_embd.weight"].n_bytes   # 224 / 256
    assert f"{ratio:.1f}× the main table" in no_nb, no_nb
    shown_main = page.evaluate("[...document.querySelectorAll('[data-testid=embedding-values] [data-dim]')]"
                               ".map(e => Number(e.dataset.value))")
    np.testing.assert_array_equal(np.array(shown_main, np.float32), main[tid])
    d = json.loads(download(lab, "embedding", "json")[1])
    assert d["per_layer"]["n_layer"] == n_layer and d["per_layer"]["width"] == width
    np.testing.assert_array_equal(np.array(d["per_layer"]["values"], np.float32), want)
    assert d["per_layer"]["norms"] == [float(n["value"]) for n in norms]
    name, png = download(lab, "embedding", "png")                 # the picture adds the per-layer rows
    w, h = check_png(png)
    assert name == "llm-lab-embedding.png" and h > 7 * 12
    shot(lab, "embedding-per-layer", "embedding")
    assert lab.errors() == [] and lab.foreign_requests() == []
