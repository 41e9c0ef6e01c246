"""The Router card's worker side natively (lab/worker/routing.py over lab/instruments/routing.py and the experiments'
"expert" site), driven as the page drives it, on the synthetic qwen3moe F32 file (4 routed layers of 8 experts, 2 a
token), with a conversation of 35 tokens: the fixture's 27-token prompt and 8 greedy tokens, so that the reading and
the ablation run in two steps of the engine's 32 (Page's max_batch).

- The choices the card shows are the engine's own, read back: equal to llama.cpp's at every prompt position of every
  layer (the fixture's `router`), and to the numpy reference's over the whole conversation (the experts id for id,
  their weights within TRACE_TOL), the entropy the reference's distribution's, the load the count of the choices.
- The chat goes on as if nothing ran: its KV rows read back bit-identical after the reading and the ablation.
- An expert ablated through the expert site: the logits after the conversation are the reference's with the same
  expert's weight zeroed (not renormalised) within TRACE_TOL of their magnitude, while the reference that renormalises
  the others lies outside it, as does the plain run; its greedy continuation is the reference's; a no-op (scale 1)
  leaves the logits bit-identical.
- Forget wipes the router's rows and the ablation's buffers with the rest, read back (before > 0, after 0).
- A dense model has no router: both messages are refused by name, and the "loaded" message says so."""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest

from lab.host.models import cache_dir
from lab.host.reference import Reference
from lab.host.reference.interventions import hooks
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments import routing as routing_reading
from lab.instruments.interventions import Intervention, InterventionError
from lab.settings import Settings
from lab.worker import routing
from lab.worker.experiments import bench
from tests.conftest import FIXTURES, MOE_SPECS
from tests.engine.cardkit import Page
from tests.engine.hybrids import TRACE_TOL, engine_on, prompt_ids
from tests.unit.workerkit import router_over_standins

GENERATED = 8           # greedy tokens after the fixture's prompt: 35 in all, two steps of Page's 32
ROUTER_ROWS = ("router logits [B, n_expert]", "chosen experts [B, k] u32", "expert weights [B, k]")


@pytest.fixture(scope="module")
def path():
    return synthetic_arch.build("qwen3moe", "f32", cache_dir() / "synthetic")


@pytest.fixture(scope="module")
def fixture():
    return json.loads((FIXTURES / "arch" / "qwen3moe-f32.json").read_text())


@pytest.fixture(scope="module")
def page(device, path, fixture):
    p = Page(device, path=path)
    lo = p.w.state.loaded
    prompt = fixture["prompt_ids"]
    res = asyncio.run(lo.session.generate(prompt, Settings(greedy=True), GENERATED))
    lo.context[:] = prompt + res.ids            # as the chat handler keeps it: the prompt, then each token
    assert len(lo.context) == len(prompt) + GENERATED > p.engine.max_batch
    yield p
    p.close()


@pytest.fixture(scope="module")
def ref(path):
    """One reference for the module (its load is most of its cost): each use sets its hooks and starts at 0."""
    return Reference(path)


@pytest.fixture(scope="module")
def ref_trace(ref, page):
    ref.hooks = {}
    ref.forward(page.w.state.loaded.context, trace=True)
    return dict(ref.trace)


def kv_rows(page) -> list[bytes]:
    """The chat's cached K/V rows (the positions its session holds; the rows after them are free for any run)."""
    eng = page.engine
    n = eng.kv_value_bytes * len(page.w.state.loaded.session.cached) * eng.cfg.kv_dim
    assert n > 0
    return [asyncio.run(eng.device.read(b, 0, n)) for pair in eng.kv_buffers for b in pair]


def test_the_card_shows_the_engines_choices(page, fixture, ref_trace):
    lo = page.w.state.loaded
    before = kv_rows(page)
    (m,) = page.send(routing.run, seq=3)
    assert kv_rows(page) == before                      # the chat's cache set aside and put back
    cfg, t = page.engine.cfg, len(lo.context)
    L, k, E = len(cfg.routed_layers), cfg.n_expert_used, cfg.n_expert
    assert (m["type"], m["seq"], m["layers"], m["n_expert"], m["k"], m["gating"]) == \
        ("router", 3, [0, 1, 2, 3], 8, 2, "softmax")
    assert m["tokens"] == [lo.tokenizer.piece(i) for i in lo.context]
    experts = np.frombuffer(m["experts"], np.float32).reshape(L, t, k)
    assert np.array_equal(experts, np.round(experts)) and experts.min() >= 0 and experts.max() < E
    experts = experts.astype(np.int64)
    weights = np.frombuffer(m["weights"], np.float32).reshape(L, t, k)
    entropy = np.frombuffer(m["entropy"], np.float32).reshape(L, t)
    router = fixture["router"]
    n = len(fixture["prompt_ids"])
    worst = [0.0, 0.0]
    for i, il in enumerate(m["layers"]):
        # llama.cpp's choices at every prompt position (its order within the k: slot 0 the larger)
        assert experts[i, :n].tolist() == router["experts"][router["layers"].index(il)], f"layer {il}"
        # the reference's over the whole conversation: ids exact, weights and entropy within TRACE_TOL
        assert np.array_equal(experts[i], ref_trace[f"ffn_moe_topk-{il}"]), f"layer {il}"
        assert np.abs(weights[i] - ref_trace[f"ffn_moe_weights_norm-{il}"]).max() <= TRACE_TOL
        p = np.asarray(ref_trace[f"ffn_moe_probs-{il}"], np.float64)
        want = -(p * np.log2(p)).sum(axis=1)
        assert np.abs(entropy[i] - want).max() <= TRACE_TOL * math.log2(E), f"layer {il}"
        worst = [max(worst[0], float(np.abs(weights[i] - ref_trace[f"ffn_moe_weights_norm-{il}"]).max())),
                 max(worst[1], float(np.abs(entropy[i] - want).max()))]
        assert m["load"][i] == np.bincount(experts[i].ravel(), minlength=E).tolist()
        assert sum(m["load"][i]) == t * k and abs(sum(m["share"][i]) - t) <= 1e-3
        assert abs(m["mean_entropy"][i] - float(entropy[i].mean())) <= 1e-5
    print(f"\nrouting of {t} tokens read in {m['seconds']:.2f} s: the experts the reference's, weights within "
          f"{worst[0]:.2g}, entropies within {worst[1]:.2g} bits; mean entropy "
          f"{[round(h, 3) for h in m['mean_entropy']]} bits of {math.log2(E):.0f}")


def routing_reading_ids(page, layer: int) -> list[int]:
    lo = page.w.state.loaded
    exp = bench(lo)

    async def go():
        async with exp.kept(lo.session):
            return await routing_reading.read(lo.engine, list(lo.context))
    r = asyncio.run(go())
    return r.experts[r.layers.index(layer)]


def test_an_expert_ablated_is_the_reference_without_it(page, ref):
    lo = page.w.state.loaded
    ctx, layer = list(lo.context), 1
    chosen = routing_reading_ids(page, layer)
    expert = max(range(page.engine.cfg.n_expert), key=chosen.count)    # the busiest expert: its loss shows
    iv = Intervention("expert", layer, "zero", experts=(expert,))
    exp = bench(lo)
    before = kv_rows(page)

    async def logits(ivs):
        async with exp.kept(lo.session):
            raw, _, _ = await exp.continuation(ctx, ivs, 0)
        return np.frombuffer(raw, np.float32)
    got, plain = asyncio.run(logits([iv])), asyncio.run(logits([]))
    assert np.array_equal(asyncio.run(logits([Intervention("expert", layer, "scale", experts=(expert,))])), plain)
    ref.hooks = _renormalising(layer, expert)
    renormalised = ref.forward(ctx)[-1]
    ref.hooks = hooks([iv], page.engine.cfg.head_dim)
    want = ref.forward(ctx)[-1]
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err <= TRACE_TOL, f"ablated logits vs the reference's without the expert: {err:.3g}"
    # the test tells the site apart: the plain run, and the others renormalised, both lie far outside
    moved = float(np.abs(plain - want).max() / np.abs(want).max())
    other = float(np.abs(got - renormalised).max() / np.abs(want).max())
    assert moved > 100 * TRACE_TOL and other > 100 * TRACE_TOL, (moved, other)
    print(f"\nexpert {expert} of layer {layer} ({chosen.count(expert)} of {len(chosen)} picks) ablated: logits "
          f"within {err:.2g} of the reference's (relative to max |logit|); the plain run {moved:.3g} away, the "
          f"renormalised reference {other:.3g}")
    # through the card's message: the next token's top 5 and the greedy continuation, as the reference's
    (m,) = page.send(routing.ablate, layer=layer, expert=expert, max_new=4, seq=9)
    assert kv_rows(page) == before
    assert (m["type"], m["seq"], m["layer"], m["expert"], m["tokens"]) == ("router-ablation", 9, layer, expert, 35)
    lse = float(np.log(np.exp(want.astype(np.float64) - want.max()).sum()) + want.max())
    for tid, lp in m["top5_after"]:
        assert abs(lp - (want[tid] - lse)) <= TRACE_TOL * np.abs(want).max()
    assert m["greedy_after"] == ref.greedy(ctx, len(m["greedy_after"]))
    ref.hooks = {}
    assert m["greedy_before"] == ref.greedy(ctx, len(m["greedy_before"]))
    assert m["kl_bits"] > 0 and set(m["pieces"]) >= {str(i) for i, _ in m["top5_after"]}
    print(f"greedy before {m['greedy_before']}, after {m['greedy_after']}, KL {m['kl_bits']:.3g} bits")


def _renormalising(layer: int, expert: int) -> dict:
    """A reference hook that drops the expert and renormalises the others to sum to 1: what the site is not."""
    chosen = {}

    def keep(ids):
        chosen["ids"] = np.asarray(ids)
        return ids

    def weigh(w):
        w = np.where(chosen["ids"] == expert, 0, w)
        return w / w.sum(axis=1, keepdims=True)
    return {f"ffn_moe_topk-{layer}": keep, f"ffn_moe_weights_norm-{layer}": weigh}


def test_the_expert_site_refuses_what_it_cannot_run(page):
    runner = bench(page.w.state.loaded).runner
    for iv, says in [(Intervention("expert", 1, "set", experts=(0,)), "takes zero or scale"),
                     (Intervention("expert", 1, experts=(8,)), "experts 0 .. 7"),
                     (Intervention("expert", 1), "experts name"),
                     (Intervention("resid", 1, experts=(0,)), "experts name"),
                     (Intervention("expert", 1, heads=(0,), experts=(0,)), "site 'attn' only")]:
        with pytest.raises(InterventionError, match=says):
            runner.check([iv])
    with pytest.raises(InterventionError, match="whole numbers"):
        page.send(routing.ablate, layer="one", expert=0, seq=1)


def test_forget_wipes_the_router_rows_and_the_runs(page, monkeypatch):
    page.send(routing.ablate, layer=2, expert=0, max_new=1, seq=11)
    labels = {b.label for b in bench(page.w.state.loaded).buffers()}
    with router_over_standins(monkeypatch) as router:
        asyncio.run(router._forget({}, page.w))
    (forget,) = [m for m in page.posted if m["type"] == "forget"]
    items = {i["label"]: i for i in forget["report"]["items"]}
    assert forget["report"]["status"] == "wiped"
    for label in ROUTER_ROWS:
        assert items[label]["before"] > 0 and items[label]["after"] == 0, label
    ours = [i for k, i in items.items() if k in labels]
    assert ours and all(i["after"] == 0 for i in ours) and any(i["before"] > 0 for i in ours)
    with pytest.raises(InterventionError, match="chat first"):
        page.send(routing.run, seq=12)


def test_a_dense_model_has_no_router(device):
    p = Page(device)             # the synthetic Llama 3
    try:
        assert routing_reading.describe(p.engine) is None
        p.w.state.loaded.context[:] = [1, 2, 3]
        for handler in (routing.run, routing.ablate):
            with pytest.raises(InterventionError, match="this model has no router"):
                p.send(handler, layer=0, expert=0, seq=1)
        with pytest.raises(InterventionError, match="the expert site is a mixture of experts' only"):
            bench(p.w.state.loaded).runner.check([Intervention("expert", 0, experts=(0,))])
    finally:
        p.close()


@pytest.mark.slow
@pytest.mark.parametrize("spec", MOE_SPECS)
def test_the_reading_is_what_the_chats_own_steps_chose(spec):
    """The card reads the conversation again in prefill steps of max_batch tokens; the chat ran its prompt in one step
    and each generated token in a decode step of its own (another kernel for the router's logits): the choices agree
    on every token of a 27-token prompt and 40 greedy tokens, every routed layer, each of the three files."""
    eng, tok = engine_on(synthetic_arch.build(spec, "f32", cache_dir() / "synthetic"), 256)
    try:
        cfg, k = eng.cfg, eng.cfg.n_expert_used
        names = [f"ffn_moe_topk-{il}" for il in cfg.routed_layers]
        ids = prompt_ids(tok)
        seq, step = list(ids), ids
        chat = {n: [] for n in names}
        for _ in range(41):                 # the prompt, then 40 tokens a step each, as the chat runs them
            raw = asyncio.run(eng.traced(step, len(seq) - len(step), names + ["result_output"]))
            for n in names:
                chat[n] += np.frombuffer(raw[n], np.uint32).reshape(-1, k).tolist()
            step = [int(np.argmax(np.frombuffer(raw["result_output"], np.float32)[-cfg.n_vocab:]))]
            seq += step
        seq = seq[:-1]                      # the last token chosen was never run
        r = asyncio.run(routing_reading.read(eng, seq))
        for i, il in enumerate(r.layers):
            got = np.asarray(r.experts[i]).reshape(-1, k)
            assert [sorted(x) for x in got.tolist()] == [sorted(x) for x in chat[f"ffn_moe_topk-{il}"]], il
    finally:
        eng.close()
