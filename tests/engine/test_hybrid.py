"""lfm2, the first hybrid, natively on the synthetic LFM2-shaped F32 file (4 short-conv layers, 2 attention layers):
the engine against the numpy reference tensor by tensor, the conv states across turns (reused where the conversation
extends, recomputed where it was edited), what the engine refuses, the memory it counts, and Forget on the states.

llama.cpp parity (logits, greedy ids) is tests/engine/test_architectures.py's lfm2 cases."""

from __future__ import annotations

import pytest

from lab import gpu
from lab.engine import budget
from lab.engine.engine import EngineError
from lab.engine.scratch import REWIND, conv_ring
from lab.instruments import forget
from lab.settings import Settings
from tests.engine.hybrids import engine_on, greedy_chat, prompt_ids, run, synthetic, traced_names_matching_the_reference

N_CTX = 128


@pytest.fixture(scope="module")
def path():
    return synthetic("lfm2")


@pytest.fixture(scope="module")
def made(path):
    eng, tok = engine_on(path, N_CTX)
    yield eng, tok
    eng.close()


def test_layer_kinds_and_memory(made):
    """Attention layers keep a KV cache and conv layers a conv state of conv_ring rows, nothing else; the budget
    counts both, and the KV bytes per token are the attention layers' only."""
    eng, _ = made
    cfg, s = eng.cfg, eng.scratch
    assert cfg.conv_layers == (0, 1, 3, 4) and cfg.attention_layers == (2, 5) == eng.kv_layers
    assert [il for il, k in enumerate(s.k_cache) if k is not None] == [2, 5]
    assert sorted(eng.state_buffers) == [0, 1, 3, 4]
    assert all(b.kind == gpu.CONVERSATION and b.size == 4 * conv_ring(cfg) * cfg.n_embd
               for b in eng.state_buffers.values())
    assert cfg.kv_bytes_per_token() == 2 * 2 * cfg.n_head_kv * cfg.head_dim * 4
    assert cfg.conv_state_bytes() == 4 * (cfg.l_cache - 1) * cfg.n_embd * 4
    b = budget.count(eng.device.info.limits, eng.header, cfg, N_CTX, logits_all=True)
    assert b.total("kv") == 2 * 2 * N_CTX * cfg.kv_dim * 4
    assert b.total("state") == 4 * conv_ring(cfg) * cfg.n_embd * 4
    card = b.card(cfg)
    assert card["state_bytes"] == b.total("state") and card["conv_state_bytes"] == cfg.conv_state_bytes()


def test_every_traced_tensor_matches_the_reference(made, path):
    """Prefill from 0 and then one decode step, every traced tensor of both against the numpy reference (its own
    conv state carried between the two calls, as the engine's is)."""
    eng, tok = made
    names = traced_names_matching_the_reference(eng, tok, path)
    for il in (0, 1, 3, 4):
        assert {f"shortconv_bcx-{il}", f"shortconv_y-{il}", f"ffn_inp-{il}", f"l_out-{il}"} <= names
    assert {"kqv_out-2", "kqv_out-5", "Qcur_rope-2"} <= names


def test_a_follow_up_turn_reuses_the_states(made):
    """Turn 2 extends turn 1: it runs only its new tokens over the kept states, and its greedy ids are those of the
    whole conversation run from position 0."""
    eng, tok = made
    first = prompt_ids(tok)[:20]
    session, r1 = greedy_chat(eng, tok, first, 8)
    second = first + r1.ids + tok.encode(" And then the light went out.")
    r2 = run(session.generate(second, Settings(greedy=True), 12))
    assert r2.reused == len(first) + len(r1.ids) - 1 and r2.prefilled == len(second) - r2.reused
    _, scratch = greedy_chat(eng, tok, second, 12)
    assert scratch.reused == 0 and r2.ids == scratch.ids


def test_steps_run_past_the_turn_are_stepped_back_over(made):
    """Greedy steps submitted past a turn's end (GreedyAhead's blocks) advance the states; the ring keeps REWIND
    positions, so the next turn still reuses, with the ids of a run from scratch; further back, it recomputes."""
    eng, tok = made
    first = prompt_ids(tok)[:20]
    session, r1 = greedy_chat(eng, tok, first, 6)
    end = len(session.cached)
    for i in range(REWIND - 2):         # as GreedyAhead would: each step feeds the last argmax
        eng.step(None, end + i)
    second = first + r1.ids + tok.encode(" Later,")
    r2 = run(session.generate(second, Settings(greedy=True), 8))
    assert r2.reused == end
    _, scratch = greedy_chat(eng, tok, second, 8)
    assert r2.ids == scratch.ids
    assert eng.can_resume(eng.held[1] - REWIND) and not eng.can_resume(eng.held[1] - REWIND - 1)


def test_an_edited_conversation_recomputes(made):
    """An edit a few tokens in cuts the conversation where no conv state is kept: the turn runs from position 0
    (reused 0), with the ids of a fresh session."""
    eng, tok = made
    first = prompt_ids(tok)[:24]
    session, r1 = greedy_chat(eng, tok, first + tok.encode(" Then"), 16)
    edited = first[:5] + tok.encode(" young") + first[6:]
    r2 = run(session.generate(edited, Settings(greedy=True), 10))
    assert session.cached_prefix(edited) >= 5 and r2.reused == 0 and r2.prefilled == len(edited)
    _, scratch = greedy_chat(eng, tok, edited, 10)
    assert r2.ids == scratch.ids


def test_a_step_the_states_cannot_serve_is_refused(made):
    eng, tok = made
    ids = prompt_ids(tok)
    n = len(ids)
    eng.step(ids, 0)
    assert eng.held == (max(0, n - conv_ring(eng.cfg)), n)
    with pytest.raises(EngineError, match="cannot be cut back"):
        eng.step(ids[:3], 5)
    with pytest.raises(EngineError, match="cannot be cut back"):
        eng.step(ids[:1], n + 1)       # past the last position run: the states miss position n
    eng.step(ids[:1], n)               # where the conversation ends: fine
    eng.step(ids[:2], 0)               # and from 0, always


def test_forget_wipes_the_conv_states_with_proof(made):
    """A conversation leaves every conv state non-zero; Forget clears each and reads it back (checked here again
    from the GPU); a wipe that misses one state is reported as failed, naming it."""
    eng, tok = made
    dev = eng.device
    greedy_chat(eng, tok, prompt_ids(tok), 4)
    states = eng.state_buffers
    assert all(forget.nonzero_words(dev.read_sync(b)) for b in states.values())
    missed = states[3].label
    report = run(forget.wipe(dev, skip=missed))
    rows = {b.label: b for b in report.buffers}
    assert all(rows[b.label].before > 0 for b in states.values())
    assert report.status == "failed" and [b.label for b in report.buffers if b.after] == [missed]
    report = run(forget.wipe(dev))
    assert report.wiped and [b.label for b in report.buffers if b.before] == [missed]
    assert all(dev.read_sync(b) == bytes(b.size) for b in states.values())
    session, again = greedy_chat(eng, tok, prompt_ids(tok), 4)     # the engine runs on from position 0
    assert again.reused == 0 and again.ids
