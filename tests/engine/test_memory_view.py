"""lab/instruments/memory.py and the hybrid paths of the probes natively (lavapipe).

- The state-norms pass (wgsl/statenorm.wgsl) against numpy on random recurrent states read back, and a pass built for
  the wrong head size, which the same check must catch.
- On the synthetic LFM2 file (4 short-conv layers, 2 attention layers) after a two-turn chat: the conv rows the card
  shows are the B*x rows of those positions as the engine's own trace computes them (`shortconv_bcx-L`: [B | C | x]);
  the KV picture lands on the attention layers' rows; Forget's read-back redraws the states as zero, and a state left
  out of the wipe stays lit and is named; the probes' pass (attention on the attention layers only, residual and lens
  on every layer) leaves the states exactly as they were.
- On the synthetic Qwen3.5 file (layers 0, 1, 3, 4 gated delta-net, 2 and 5 attention) after a two-turn chat: what
  `describe` says; the delta-net norms the card records against numpy on a read-back of every recurrent state, and a
  pass that takes the key heads for the value heads, which must fail; one head's matrix as the GPU holds it; the conv
  rows against the engine's trace of the in-projection's q, k, v; the probes leave the recurrent states too; Forget's
  picture of every recurrent state, conv state and snapshot, with a recurrent state skipped and without; the chat's
  reuse line for a turn resumed from a snapshot (reused < the cached prefix).

Tolerances: the norms pass sums a head's 16,384 squares in f32 (strided partial sums, then a tree): relative error
~sqrt(n) x 2^-24 in practice, bounded by n x 2^-24 = 1e-3; measured ~1e-7. RTOL = 1e-5. The conv rows: TRACE_TOL."""

from __future__ import annotations

import asyncio
from array import array

import numpy as np
import pytest

from lab import gpu
from lab.engine import session as session_mod
from lab.engine.engine import Engine
from lab.engine.load import validate
from lab.engine.scratch import AHEAD, SNAPSHOTS
from lab.engine.session import Session
from lab.format import gguf
from lab.gpu.shaders import KernelCache
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.host.native import open_native
from lab.instruments import forget, memory
from lab.instruments.kvview import AfterPicture, KvView
from lab.instruments.probes import Probes
from lab.settings import Settings

RTOL = 1e-5
TRACE_TOL = 1e-4        # relative to the rows' largest |value|: the ring's last rows came from decode steps, the
                        # trace's from one prefill (another summation order), as tests/engine/test_hybrid.py
N_CTX = 128
TURNS = ("The old lighthouse keeper climbed the stairs every evening.", " Nobody knew why he still did it.")


def run(coro):
    return asyncio.run(coro)


# -- the norms pass, on random states --------------------------------------------------------------------------
@pytest.mark.parametrize("heads, d", [(4, 128), (3, 16)])
def test_state_norms_match_numpy_and_a_wrong_pass_is_caught(heads, d):
    dev = open_native()
    kernels = KernelCache(dev)
    rng = np.random.default_rng(7)
    values = {il: (rng.standard_normal((heads, d, d)) * rng.uniform(0.1, 3.0, (heads, 1, 1))).astype(np.float32)
              for il in (0, 1, 2, 4)}       # non-constant scales per head: a head mixed up with another shows
    owner = object()
    with dev.owning(owner):
        bufs = {il: dev.buffer(v.nbytes, gpu.CONVERSATION, f"state {il}") for il, v in values.items()}
    for il, v in values.items():
        dev.write(bufs[il], v.tobytes())
    want = np.array([[np.sqrt((v[h].astype(np.float64) ** 2).sum()) for h in range(heads)] for v in values.values()])

    def got(n: int) -> np.ndarray:
        p = memory.StateNorms(dev, kernels, bufs, heads, n)
        try:
            raw = run(p.norms())
        finally:
            p.close()
        return np.frombuffer(raw, np.float32).reshape(len(values), heads)

    np.testing.assert_allclose(got(d * d), want, rtol=RTOL)
    with pytest.raises(AssertionError):        # a pass that strides by d_k x (d_v - 1): every head read off
        np.testing.assert_allclose(got(d * (d - 1)), want, rtol=RTOL)
    # the Python norms Forget's picture uses, on the same bytes
    for slot, v in enumerate(values.values()):
        np.testing.assert_allclose(memory.head_norms(v.tobytes(), heads), want[slot], rtol=1e-12)
    dev.free(owner)


# -- the synthetic LFM2 file -------------------------------------------------------------------------------------
def two_turns(arch: str):
    """An engine on a device of its own (Forget's registry holds only its buffers) after a two-turn greedy chat."""
    path = synthetic_arch.build(arch, "f32", cache_dir() / "synthetic")
    device = open_native()
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    eng = Engine(device, header, cfg, n_ctx=N_CTX)
    eng.weights.upload_file(path)
    session = Session(eng, tok)
    ids = []
    for i, text in enumerate(TURNS):
        ids += tok.encode(text, add_bos=tok.add_bos and i == 0)
        res = run(session.generate(ids, Settings(greedy=True), 5))
        ids += res.ids
    assert res.reused > 0           # the second turn continued from the states the first left
    return eng, tok, session


@pytest.fixture(scope="module")
def chat():
    made = two_turns("lfm2")
    yield made
    made[0].close()


def states(eng) -> dict[str, bytes]:
    """Every conv and recurrent state's bytes, by label."""
    return {b.label: eng.device.read_sync(b) for b in (*eng.state_buffers.values(), *eng.recurrent_buffers.values())}


def test_describe_says_each_layers_kind_and_the_bytes(chat):
    eng, _, _ = chat
    cfg = eng.cfg
    d = memory.describe(eng)
    assert d["layers"] == ["conv", "conv", "attention", "conv", "conv", "attention"]
    assert d["kv"]["layers"] == [2, 5] and d["delta"] is None
    c = d["conv"]
    assert c["layers"] == [0, 1, 3, 4] and c["rows"] == cfg.l_cache - 1 == 2 and c["channels"] == cfg.n_embd
    assert c["bytes"] == len(c["layers"]) * c["rows"] * c["channels"] * 4
    assert d["kv"]["bytes_per_token"] == 2 * 2 * cfg.n_head_kv * cfg.head_dim * 4


def test_conv_rows_are_the_traced_b_times_x_of_those_positions(chat):
    """The card's rows against an independent computation: the engine's trace of the in-projection [B | C | x] over
    the whole conversation from position 0, B * x at the positions the next token reads. A read one row off (the
    ring indexed by position + 1) must fail the same comparison."""
    eng, _, session = chat
    pos = len(session.cached)
    view = memory.MemoryView(eng)
    got = run(view.conv_rows(pos))
    assert got["start"] == pos - 2 and got["end"] == pos and got["layers"] == [0, 1, 3, 4]
    E = eng.cfg.n_embd
    rows = np.frombuffer(got["values"], np.float32).reshape(4, 2, E)
    kept = {il: eng.device.read_sync(b) for il, b in eng.state_buffers.items()}
    shifted = [memory.ring_rows(kept[il], view.ring, pos - 1, pos + 1) for il in got["layers"]]
    names = [f"shortconv_bcx-{il}" for il in got["layers"]]
    traced = run(eng.traced(list(session.cached), 0, names))        # from 0: the states end where they were
    for i, name in enumerate(names):
        bcx = np.frombuffer(traced[name], np.float32).reshape(pos, 3 * E)
        want = bcx[pos - 2:pos, :E] * bcx[pos - 2:pos, 2 * E:]
        assert np.abs(want).max() > 0
        tol = TRACE_TOL * np.abs(want).max()
        np.testing.assert_allclose(rows[i], want, rtol=0, atol=tol)
        with pytest.raises(AssertionError):
            np.testing.assert_allclose(np.frombuffer(shifted[i], np.float32).reshape(2, E), want, rtol=0, atol=tol)
    assert run(view.conv_rows(0)) is None
    view.close()


def test_kv_picture_lands_on_the_attention_layers(chat):
    eng, _, session = chat
    used = len(session.cached)
    kv = KvView(eng)
    norms = np.frombuffer(run(kv.norms(0, used)), np.float32).reshape(used, eng.cfg.n_layer, 2)
    kv.close()
    assert (norms[:, [2, 5]] > 0).all() and (norms[:, [0, 1, 3, 4]] == 0).all()
    for j, il in enumerate(eng.kv_layers):
        k = np.frombuffer(eng.device.read_sync(eng.kv_buffers[j][0]), np.float32).reshape(N_CTX, -1)[:used]
        np.testing.assert_allclose(norms[:, il, 0], np.sqrt((k.astype(np.float64) ** 2).sum(1)), rtol=RTOL)


def test_probes_leave_the_states_as_they_were(chat):
    """An inspection of the conversation reruns the conv layers from position 0: the states are copied aside and put
    back, so they read back bit for bit as before (the next turn starts from exactly what the chat left), and the
    engine's account of the positions they hold is unchanged."""
    probes_leave_the_states(*chat)


def probes_leave_the_states(eng, tok, session):
    ids = list(session.cached)
    before, held = states(eng), eng.held
    pr = Probes(eng)
    r = run(pr.inspect(ids + [ids[-1]], len(ids), attention=True, residual=True, lens=2))
    pr.close()
    assert states(eng) == before and eng.held == held
    L, H, w = eng.cfg.n_layer, eng.cfg.n_head, r.width
    att = np.frombuffer(r.attention, np.float32).reshape(L, H, w, w + 1)
    assert (att[[0, 1, 3, 4]] == 0).all()
    np.testing.assert_allclose(att[[2, 5]].sum(-1), 1.0, rtol=1e-5)     # each query's row of probabilities
    res = np.frombuffer(r.residual, np.float32).reshape(L + 1, w)
    assert (res > 0).all() and len(r.lens) == L and all(len(cells) == 2 for cells in r.lens)
    with pytest.raises(ValueError, match="no attention"):
        run(Probes(eng).rope_inputs(ids, len(ids), 3, 0))


def test_forget_redraws_the_states_as_zero_from_its_read_back(chat):
    """StateAfter's picture is made from the bytes Forget read back: zero rows when the wipe worked; with one state
    left out of the wipe (Forget's test hook) its rows are the state's own bytes, the ring's lit rows are counted,
    and the buffer is named."""
    eng, _, session = chat
    pos = len(session.cached)
    span = memory.conv_span(eng, pos)
    kept = {il: eng.device.read_sync(b) for il, b in eng.state_buffers.items()}
    label = eng.state_buffers[3].label
    seen = memory.StateAfter(eng, span, None)
    report = run(forget.wipe(eng.device, on_after=seen, skip=label))
    assert report.status == "failed"
    p = seen.picture()
    assert p["checked"] == 4 and p["lit"] == [label] and p["after"] > 0
    rows = np.frombuffer(p["conv"]["values"], np.float32).reshape(4, 2, -1)
    want = np.frombuffer(memory.ring_rows(kept[3], memory.conv_ring(eng.cfg), *span), np.float32).reshape(2, -1)
    np.testing.assert_array_equal(rows[2], want)
    assert (rows[[0, 1, 3]] == 0).all() and p["conv"]["lit_rows"][2] > 0 == p["conv"]["lit_rows"][0]
    # the KV picture and the states from one wipe, as the worker collects them
    kv, seen = AfterPicture(eng), memory.StateAfter(eng, span, None)
    report = run(forget.wipe(eng.device, on_after=lambda *read: [c(*read) for c in (kv, seen)]))
    p = seen.picture()
    assert report.status == "wiped" and p["after"] == 0 and p["before"] > 0 and p["lit"] == []
    assert not any(array("f", p["conv"]["values"])) and p["conv"]["lit_rows"] == [0, 0, 0, 0]
    assert kv.checked == 4 and kv.after == 0


# -- the synthetic Qwen3.5 file ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def qchat():
    made = two_turns("qwen35")
    yield made
    made[0].close()


def recurrent(eng) -> np.ndarray:
    """Every delta-net layer's recurrent state read back raw: f32 [n_delta, H, d_k, d_v]."""
    d, H = eng.cfg.ssm_head_dim, eng.cfg.ssm_v_heads
    return np.stack([np.frombuffer(eng.device.read_sync(b), np.float32).reshape(H, d, d)
                     for b in eng.recurrent_buffers.values()])


def test_qwen35_describe_says_each_layers_kind_and_the_bytes(qchat):
    eng, _, _ = qchat
    cfg = eng.cfg
    d = memory.describe(eng)
    assert d["layers"] == ["delta", "delta", "attention", "delta", "delta", "attention"]
    assert d["kv"]["layers"] == [2, 5] and d["kv"]["bytes_per_token"] == 2 * 2 * 1 * 64 * 4
    c, m, s = d["conv"], d["delta"], d["snapshots"]
    assert c["layers"] == m["layers"] == [0, 1, 3, 4]
    # the conv runs over q, k (2 key heads of 64 each) and v (4 value heads of 64): 512 channels, l_cache 4
    assert c["rows"] == 3 and c["channels"] == 2 * 2 * 64 + 4 * 64 == 512 and c["bytes"] == 4 * 3 * 512 * 4
    assert (m["heads"], m["d_k"], m["d_v"]) == (4, 64, 64) and m["bytes"] == 4 * 4 * 64 * 64 * 4
    ring = memory.conv_ring(cfg)
    assert s["count"] == SNAPSHOTS and s["ring_bytes"] == 4 * ring * 512 * 4
    assert s["bytes"] == m["bytes"] + s["ring_bytes"] == eng.scratch.snapshots[0].size


def test_qwen35_delta_norms_match_numpy_and_a_wrong_pass_is_caught(qchat):
    """The norms the card records, computed on the GPU, against numpy on the states read back raw; a pass built with
    the key heads for the value heads (2 heads of twice the floats: each norm mixes two heads) fails the same check.
    The head the card draws is the GPU's bytes of that head."""
    eng, _, _ = qchat
    cfg = eng.cfg
    S = recurrent(eng)
    want = np.sqrt((S.astype(np.float64) ** 2).sum((2, 3)))
    assert (want > 0).all() and np.ptp(want) > 0
    view = memory.MemoryView(eng)
    got = np.frombuffer(run(view.delta_norms()), np.float32).reshape(4, cfg.ssm_v_heads)
    np.testing.assert_allclose(got, want, rtol=RTOL)
    head = np.frombuffer(run(view.delta_head(3, 2)), np.float32).reshape(64, 64)
    np.testing.assert_array_equal(head, S[2, 2])          # layer 3 is the third delta-net layer
    with pytest.raises(ValueError, match="no delta-net state at layer 2"):
        run(view.delta_head(2, 0))
    view.close()
    d = cfg.ssm_head_dim
    wrong = memory.StateNorms(eng.device, eng.kernels, eng.recurrent_buffers, cfg.ssm_k_heads, 2 * d * d)
    bad = np.frombuffer(run(wrong.norms()), np.float32).reshape(4, cfg.ssm_k_heads)
    wrong.close()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(bad, want[:, :cfg.ssm_k_heads], rtol=RTOL)


def test_qwen35_conv_rows_are_the_traced_q_k_v_of_those_positions(qchat):
    """A delta-net layer's conv ring holds the in-projection's q, k, v rows (before the conv): the card's rows against
    the engine's trace of them over the conversation from position 0."""
    eng, _, session = qchat
    pos = len(session.cached)
    view = memory.MemoryView(eng)
    got = run(view.conv_rows(pos))
    view.close()
    C = eng.cfg.conv_channels
    assert (got["start"], got["end"], got["layers"]) == (pos - 3, pos, [0, 1, 3, 4])
    rows = np.frombuffer(got["values"], np.float32).reshape(4, 3, C)
    names = [f"linear_attn_qkv_mixed-{il}" for il in got["layers"]]
    traced = run(eng.traced(list(session.cached), 0, names))
    for i, name in enumerate(names):
        want = np.frombuffer(traced[name], np.float32).reshape(pos, C)[pos - 3:]
        np.testing.assert_allclose(rows[i], want, rtol=0, atol=TRACE_TOL * np.abs(want).max())


def test_qwen35_probes_leave_the_recurrent_states_as_they_were(qchat):
    probes_leave_the_states(*qchat)


def test_qwen35_forget_redraws_states_and_snapshots_as_zero_from_its_read_back(qchat):
    """Every recurrent state, conv state and snapshot is non-zero after the chat. With one recurrent state left out of
    the wipe, the picture keeps that layer's norms and (picked) head as its own bytes and names it, every other state
    and snapshot read back zero; a real wipe reads back zero everywhere."""
    eng, _, session = qchat
    dev = eng.device
    assert all(forget.nonzero_words(dev.read_sync(b)) for b in eng.scratch.snapshots)
    span = memory.conv_span(eng, len(session.cached))
    S = recurrent(eng)
    label = eng.recurrent_buffers[3].label
    seen = memory.StateAfter(eng, span, (3, 2))
    assert run(forget.wipe(dev, on_after=seen, skip=label)).status == "failed"
    p = seen.picture()
    assert p["checked"] == 4 + 4 + SNAPSHOTS and p["lit"] == [label] and p["snaps"] == [0] * SNAPSHOTS
    norms = np.frombuffer(p["delta"]["norms"], np.float32).reshape(4, 4)
    np.testing.assert_allclose(norms[2], np.sqrt((S[2].astype(np.float64) ** 2).sum((1, 2))), rtol=1e-6)
    assert (norms[[0, 1, 3]] == 0).all()
    assert p["delta"]["head"]["layer"] == 3 and p["delta"]["head"]["values"] == S[2, 2].tobytes()
    assert not any(array("f", p["conv"]["values"])) and p["conv"]["lit_rows"] == [0, 0, 0, 0]
    seen = memory.StateAfter(eng, span, (0, 1))
    report = run(forget.wipe(dev, on_after=seen))
    p = seen.picture()
    assert report.status == "wiped" and p["after"] == 0 and p["before"] > 0 and p["lit"] == []
    assert p["snaps"] == [0] * SNAPSHOTS and not any(array("f", p["delta"]["norms"]))
    assert p["delta"]["head"]["values"] == bytes(4 * 64 * 64)
    assert all(dev.read_sync(b) == bytes(b.size) for b in
               (*eng.recurrent_buffers.values(), *eng.state_buffers.values(), *eng.scratch.snapshots))


def test_qwen35_reuse_note_for_a_turn_resumed_from_a_snapshot(monkeypatch):
    """With every step counted fast, greedy blocks run past the turn's end (tests/engine/test_qwen35.py): the next
    turn resumes from a snapshot before its cached prefix and runs the rest again, and the chat's line says so, with
    the positions; an edit near the start recomputes and says why. The values are those the worker passes."""
    monkeypatch.setattr(session_mod, "FAST_STEP_S", 1e9)
    eng, tok, session = two_turns("qwen35")
    try:
        first = tok.encode(TURNS[0], add_bos=tok.add_bos)
        session.reset()
        seen = []
        r1 = run(session.generate(first, Settings(greedy=True), 40, on_token=lambda i, _: seen.append(i),
                                  should_stop=lambda: len(seen) >= AHEAD + 3))
        second = first + r1.ids + tok.encode(TURNS[1])
        cached, live = min(session.cached_prefix(second), len(second) - 1), eng.held[1]
        r2 = run(session.generate(second, Settings(greedy=True), 4))
        assert 0 < r2.reused < cached < live
        span = (f"position {r2.reused}" if cached - r2.reused == 1 else f"positions {r2.reused}..{cached - 1}")
        assert memory.reuse_note(eng.cfg, r2.reused, cached, live) == (
            f"the K/V rows of those tokens, and the conv and delta-net states from the snapshot the engine kept after "
            f"position {r2.reused - 1}; {span}, which the KV cache held, ran again: a recurrent state cannot be "
            f"stepped back")
        edited = second[:3] + tok.encode(" young") + second[4:]
        cached, live = min(session.cached_prefix(edited), len(edited) - 1), eng.held[1]
        r3 = run(session.generate(edited, Settings(greedy=True), 2))
        assert r3.reused == 0 and cached >= 3
        assert memory.reuse_note(eng.cfg, 0, cached, live) == (
            f"the conv and delta-net states cannot be cut back to position {cached} like the KV cache, and no copy "
            f"of them stands at or before it, so the whole prompt ran from position 0")
    finally:
        eng.close()
