"""lab/instruments/probes.py through the native device, against the numpy reference (lab/reference): what a real
model's tables show (neighbours in a trained embedding, ties among its unused tokens, ' Paris' in the lens) on SmolLM2,
the inspection pass's mechanics (windows, chunks, the chat left alone, decode untouched) on the small synthetic Llama 3
file (tests/conftest.py `tiny`), whose 4 layers run the same plans in a fraction of the time.

Tolerances. Every probe here reads an f32 activation of the GPU forward pass, which follows the reference within
a few f32 ulps per op (tests/engine/test_reference.py); measured here: attention probabilities 6.5e-6 absolute,
residual norms 4.5e-6 relative, lens probabilities 3.7e-6, cosines 2.4e-7. The bounds below are about 10x those,
and a wrong index (a shifted row, a swapped head, a missed position) misses them by orders of magnitude.
Neighbour order is compared exactly for real words, whose successive cosines differ by 1e-4 or more; for tokens
whose neighbours tie (unused tokens share rows) a valid top-10 under f32 noise is required instead.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from lab.engine.session import Session
from lab.format import gguf
from lab.host.reference.forward import Reference
from lab.instruments import probes
from lab.instruments.probes import Probes
from lab.settings import Settings
from lab.text.tokenizer import from_metadata
from tests.conftest import native_engine

ATTN_TOL = 1e-4          # absolute, probabilities
RESID_RTOL = 5e-5        # relative, L2 norms
LENS_TOL = 5e-5          # absolute, softmax probabilities
COS_TOL = 3e-6           # absolute, cosines
N_CTX = 256


class Probed:
    """A model's tokenizer, engine (prefill steps wider than the probes' chunk, as a GPU page load's 512 >
    probes.CHUNK: the pass must still go in chunks its attention probe holds), probes and reference."""

    def __init__(self, device, path) -> None:
        self.tok = from_metadata(gguf.read_file(path).metadata)
        self.engine = native_engine(device, path, n_ctx=N_CTX, max_batch=probes.CHUNK + 32)
        self.probe = Probes(self.engine)
        self.ref = Reference(path)

    def close(self) -> None:
        self.probe.close()
        self.engine.close()


@pytest.fixture(scope="module")
def smol(device, smollm2_path):
    m = Probed(device, smollm2_path)
    yield m
    m.close()


@pytest.fixture(scope="module")
def small(device, tiny_path):
    m = Probed(device, tiny_path)
    yield m
    m.close()


def run(coro):
    return asyncio.run(coro)


def one_id(tok, text: str) -> int:
    ids = tok.encode(text)
    assert len(ids) == 1, (text, ids)
    return ids[0]


# -- embedding inspector -------------------------------------------------------------------------------------
@pytest.mark.parametrize("word", [" king", " Paris", " apple", " running", "."])
def test_neighbours_match_reference(smol, word):
    probe, ref, tok = smol.probe, smol.ref, smol.tok
    tid = one_id(tok, word)
    e = run(probe.embedding(tid))
    ids, cos = ref.neighbours(tid, probes.NEIGHBOURS)
    assert [i for i, _ in e.neighbours] == [int(i) for i in ids], [tok.piece(i) for i, _ in e.neighbours]
    np.testing.assert_allclose([c for _, c in e.neighbours], cos, atol=COS_TOL)
    table = ref.w.get("token_embd.weight")
    np.testing.assert_array_equal(np.frombuffer(e.values, np.float32), table[tid])    # dequantization is exact
    assert e.norm == pytest.approx(float(np.linalg.norm(table[tid].astype(np.float64))), rel=1e-6)
    assert e.per_layer is None and e.per_layer_norms is None      # no per-layer embeddings in this model


def test_king_neighbours_look_royal(smol):
    probe, tok = smol.probe, smol.tok
    e = run(probe.embedding(one_id(tok, " king")))
    pieces = [tok.piece(i) for i, _ in e.neighbours]
    print("\n' king' neighbours:", [(p, round(c, 4)) for p, (_, c) in zip(pieces, e.neighbours)])
    assert pieces[:4] == [" King", "King", " kings", " queen"]


@pytest.mark.parametrize("tid", [2, 49151, 12345])
def test_neighbours_with_ties_are_a_valid_top_k(smol, tid):
    """Special and unused tokens share near-identical rows: their neighbours tie within f32 noise, so the order
    among ties is free; every listed cosine must be the token's true one and the k-th value must match."""
    probe, ref = smol.probe, smol.ref
    e = run(probe.embedding(tid))
    ids, cos = ref.neighbours(tid, probes.NEIGHBOURS)
    table = ref.w.get("token_embd.weight").astype(np.float64)
    norms = np.linalg.norm(table, axis=1)
    true = table @ table[tid] / (norms * norms[tid])
    got = np.array([c for _, c in e.neighbours])
    assert tid not in [i for i, _ in e.neighbours]
    np.testing.assert_allclose(got, [true[i] for i, _ in e.neighbours], atol=COS_TOL)
    np.testing.assert_allclose(got, cos, atol=COS_TOL)


# -- the inspection pass -----------------------------------------------------------------------------------------
TEXT = "The quick brown fox jumps over the lazy dog because it wanted to see what was on the other side."


@pytest.fixture(scope="module")
def traced(small):
    ref, tok = small.ref, small.tok
    ids = tok.encode(TEXT)
    ref.forward(ids, trace=True)
    return ids, {k: v.copy() for k, v in ref.trace.items()}


def check_window(r, trace, n_layer: int, n_head: int):
    s, e, w = r.start, r.end, r.width
    att = np.frombuffer(r.attention, np.float32).reshape(n_layer, n_head, w, w + 1)
    for il in range(n_layer):
        p = trace[f"kq_soft_max-{il}"]                     # [n_head, t, n_kv]
        np.testing.assert_allclose(att[il, :, :, 1:], p[:, s:e, s:e], atol=ATTN_TOL, err_msg=f"layer {il}")
        np.testing.assert_allclose(att[il, :, :, 0], p[:, s:e, :s].sum(-1), atol=ATTN_TOL, err_msg=f"layer {il}")
    res = np.frombuffer(r.residual, np.float32).reshape(n_layer + 1, w)
    want = [np.linalg.norm(trace["inp_embd"][s:e], axis=-1)]
    want += [np.linalg.norm(trace[f"l_out-{il}"][s:e], axis=-1) for il in range(n_layer)]
    np.testing.assert_allclose(res, np.stack(want), rtol=RESID_RTOL)


@pytest.mark.parametrize("cached, start", [(0, 0), (0, 5), ("n-1", 4), ("n", 17)],
                         ids=["fresh", "fresh-window", "chat-like", "all-cached-decode-variant"])
def test_attention_and_residual_match_reference(small, traced, cached, start):
    """Positions > 0 throughout; windows that start at 0 and later (the 'earlier' column), chunks through the
    prefill variant and token by token through the decode variant, with the cache full, partial, or empty."""
    engine, probe = small.engine, small.probe
    ids, trace = traced
    n = len(ids)
    cached = {"n-1": n - 1, "n": n}.get(cached, cached)
    if cached:
        engine.step(ids[:cached], 0)                      # the chat's own prefill fills the cache
    r = run(probe.inspect(ids, cached, start, n, lens=0))
    check_window(r, trace, engine.cfg.n_layer, engine.cfg.n_head)


def test_long_window_in_probe_chunks(small):
    """A conversation longer than the probes' chunk and shorter than the engine's prefill step: the pass goes in
    chunks of probes.CHUNK (the attention probe holds that many rows), and the last window matches the reference."""
    engine, probe, ref, tok = small.engine, small.probe, small.ref, small.tok
    ids = tok.encode(" ".join([TEXT] * 4))[:probes.CHUNK + 20]
    assert probe.chunk == probes.CHUNK < len(ids) <= engine.max_batch
    ref.forward(ids, trace=True)
    r = run(probe.inspect(ids, 0, lens=0))
    assert (r.start, r.end) == (len(ids) - probes.WINDOW, len(ids))
    check_window(r, ref.trace, engine.cfg.n_layer, engine.cfg.n_head)


def test_logit_lens_paris(smol):
    engine, probe, ref, tok = smol.engine, smol.probe, smol.ref, smol.tok
    ids = tok.encode("The capital of France is")
    n = len(ids)
    r = run(probe.inspect(ids, 0, lens=n, attention=False, residual=False))
    top, p = ref.logit_lens(ids)
    L = engine.cfg.n_layer
    got_ids = np.array([[r.lens[il][q][0][0] for q in range(n)] for il in range(L)])
    got_p = np.array([[r.lens[il][q][0][1] for q in range(n)] for il in range(L)])
    np.testing.assert_array_equal(got_ids, top)
    np.testing.assert_allclose(got_p, p, atol=LENS_TOL)
    for il in range(L):
        for q in range(n):
            ps = [v for _, v in r.lens[il][q]]
            assert ps == sorted(ps, reverse=True) and len(ps) == probes.LENS_K
    paris = one_id(tok, " Paris")
    assert got_ids[L - 1, n - 1] == paris
    first_top1 = min(il for il in range(L) if got_ids[il, n - 1] == paris)
    first_top5 = min(il for il in range(L) if paris in [i for i, _ in r.lens[il][n - 1]])
    print(f"\n' Paris' at the last position: top-1 from layer {first_top1} (p = {got_p[L - 1, n - 1]:.3f} at the last),"
          f" in the top-5 from layer {first_top5}")


def test_logit_lens_of_one_position_after_a_chat(small):
    """The page's cheapest lens: one position, the last token of a chat, whose predecessors sit in the cache. Only
    that position runs (no window is recomputed for a lens alone), and its head goes through the matvec rather than
    a 16-row matmul tile; every layer's top-5 as the reference has it."""
    engine, probe, ref, tok = small.engine, small.probe, small.ref, small.tok
    ids = tok.encode("The capital of France is")
    n = len(ids)
    engine.step(ids[:n - 1], 0)
    r = run(probe.inspect(ids, n - 1, lens=1, attention=False, residual=False))
    top, p = ref.logit_lens(ids)
    L = engine.cfg.n_layer
    assert r.lens_start == n - 1 and [len(layer) for layer in r.lens] == [1] * L
    np.testing.assert_array_equal([r.lens[il][0][0][0] for il in range(L)], top[:, n - 1])
    np.testing.assert_allclose([r.lens[il][0][0][1] for il in range(L)], p[:, n - 1], atol=LENS_TOL)
    head = engine.weights.head
    assert (r.lens_macs, r.lens_bytes) == (L * head.rows * head.cols, L * head.rows * head.row_bytes)


def test_inspection_leaves_the_chat_alone(small):
    """Two identical two-turn chats, one with an inspection between the turns: the KV rows the session holds are
    bit for bit the same after the inspection, the decode plan is the same object, and the second turn's greedy
    output is the same."""
    engine, probe, tok = small.engine, small.probe, small.tok
    prompt = tok.encode("Once upon a time")

    def chat(inspect: bool) -> list[int]:
        session = Session(engine, tok)
        first = run(session.generate(prompt, Settings(greedy=True), 6))
        context = prompt + first.ids
        if inspect:
            held = len(session.cached)
            rows = 4 * held * engine.cfg.kv_dim
            kv = [engine.device.read_sync(b, 0, rows) for kv_pair in engine.kv_buffers for b in kv_pair]
            plan = engine.prepared(1)
            run(probe.inspect(context, held, lens=2))
            assert [engine.device.read_sync(b, 0, rows) for kv_pair in engine.kv_buffers for b in kv_pair] == kv
            assert engine.prepared(1) is plan
        return run(session.generate(context + tok.encode(" there"), Settings(greedy=True), 6)).ids

    assert chat(inspect=True) == chat(inspect=False)


def test_decode_is_untouched_by_panels(small):
    """Decode runs the same plan, dispatch for dispatch, whether or not the probes exist (their variants are separate
    op lists); the speed is printed for the report, not asserted (this machine is shared: +-30% between runs)."""
    engine, probe, tok = small.engine, small.probe, small.tok
    prompt = tok.encode("The history of the printing press")

    def decode_tok_s():
        session = Session(engine, tok)
        return run(session.generate(prompt, Settings(greedy=True), 12)).decode_tok_s

    plan, dispatches = engine.prepared(1), engine.dispatches_per_step(1)
    closed = decode_tok_s()
    t0 = time.perf_counter()
    run(probe.inspect(prompt, 0))
    inspect_s = time.perf_counter() - t0
    opened = decode_tok_s()
    assert engine.prepared(1) is plan and engine.dispatches_per_step(1) == dispatches
    assert not any(op in engine.decode.ops for op in list(probe._gather.values()) + probe._copy + probe._norm)
    print(f"\ndecode tok/s: panels closed {closed:.2f}, after an inspection (probe plans built) {opened:.2f}; "
          f"attention + residual inspection of {len(prompt)} positions {inspect_s:.2f} s")


@pytest.mark.parametrize("batched", [True, False], ids=["prefill", "decode"])
def test_probe_variant_is_the_engine_plan_plus_probes(small, batched):
    """The probe variant is the engine's own op list up to the last layer, with each layer's attention (one op or a
    split-K run) replaced whole by its probe twin, and only the probe ops added."""
    engine, probe, tok = small.engine, small.probe, small.tok
    run(probe.inspect(tok.encode("a b"), 0, lens=0))         # builds the pass
    base = engine.plan_for(batched).ops
    plan = probe._variant(probes.Variant(batched, write_kv=True, attention=True, lens=True, residual=True))
    sites = probe._sites[batched]
    probed = list(sites.probed.values())
    extra = set(map(id, list(probe._gather.values()) + probe._copy + probe._norm + [op for p in probed for op in p]))
    ours = [op for op in plan if id(op) not in extra]
    engine_attn = [op for op in base if op.kernel.label.startswith("attention:")]
    assert all(op in base for op in ours)
    assert not any(op in ours for op in engine_attn)
    assert len(ours) + len(engine_attn) == max(sites.l_out) + 1
    assert sum(op.kernel.label.startswith("attention:") for op in plan) == sum(map(len, probed))


def test_requests_are_checked(small):
    probe, tok = small.probe, small.tok
    ids = tok.encode("a b c")
    with pytest.raises(ValueError):
        run(probe.embedding(10 ** 6))
    with pytest.raises(ValueError):
        run(probe.inspect(ids, 0, 2, 2))
    with pytest.raises(ValueError):
        run(probe.inspect(ids, 0, lens=probes.LENS_POSITIONS + 1))
    with pytest.raises(ValueError):
        run(probe.inspect(ids * 20, 0, 0, probes.WINDOW + 1))
