"""qwen35 (Qwen3.5's gated delta-net hybrid) natively on the synthetic Qwen3.5-shaped F32 file (layers 0, 1, 3, 4
gated delta-net, 2 and 5 gated attention): the engine against the numpy reference tensor by tensor, the recurrent
states across turns (a snapshot per greedy block, a follow-up turn resuming from the latest one at or before its
cached prefix), what the engine refuses, the memory it counts, and Forget on every state and snapshot.

llama.cpp parity (logits, greedy ids) is tests/engine/test_architectures.py's qwen35 cases; the kernels' own tests are
tests/kernels/test_deltanet.py and test_shortconv.py."""

from __future__ import annotations

import pytest

from lab import gpu
from lab.engine import budget
from lab.engine import session as session_mod
from lab.engine.engine import EngineError
from lab.engine.scratch import AHEAD, SNAPSHOTS, conv_ring
from lab.engine.session import Session
from lab.instruments import forget
from lab.settings import Settings
from tests.engine.hybrids import engine_on, greedy_chat, prompt_ids, run, synthetic, traced_names_matching_the_reference

N_CTX = 160


@pytest.fixture(scope="module")
def path():
    return synthetic("qwen35")


@pytest.fixture(scope="module")
def made(path):
    eng, tok = engine_on(path, N_CTX)
    yield eng, tok
    eng.close()


def test_layer_kinds_and_memory(made):
    """Attention layers keep a KV cache; delta-net layers a conv state of conv_ring rows of q, k, v and a recurrent
    state per value head, flat in the context; the budget counts all of it, snapshots included."""
    eng, _ = made
    cfg, s = eng.cfg, eng.scratch
    assert cfg.delta_layers == (0, 1, 3, 4) == cfg.conv_layers and cfg.attention_layers == (2, 5) == eng.kv_layers
    assert [il for il, k in enumerate(s.k_cache) if k is not None] == [2, 5]
    d, hv = cfg.ssm_head_dim, cfg.ssm_v_heads
    assert cfg.conv_channels == 2 * cfg.ssm_k_heads * d + hv * d
    assert sorted(eng.recurrent_buffers) == sorted(eng.state_buffers) == [0, 1, 3, 4]
    assert all(b.kind == gpu.CONVERSATION and b.size == 4 * hv * d * d for b in eng.recurrent_buffers.values())
    assert all(b.size == 4 * conv_ring(cfg) * cfg.conv_channels for b in eng.state_buffers.values())
    assert cfg.kv_bytes_per_token() == 2 * 2 * cfg.n_head_kv * cfg.head_dim * 4
    assert cfg.delta_state_bytes() == 4 * hv * d * d * 4
    assert cfg.conv_state_bytes() == 4 * (cfg.l_cache - 1) * cfg.conv_channels * 4
    live = sum(b.size for b in (*eng.recurrent_buffers.values(), *eng.state_buffers.values()))
    assert len(s.snapshots) == SNAPSHOTS and all(b.size == live and b.kind == gpu.CONVERSATION for b in s.snapshots)
    b = budget.count(eng.device.info.limits, eng.header, cfg, N_CTX, logits_all=True)
    assert b.total("kv") == 2 * 2 * N_CTX * cfg.kv_dim * 4
    assert b.total("state") == sum(x.size for x in (*eng.recurrent_buffers.values(), *eng.state_buffers.values(),
                                                    *s.snapshots))
    card = b.card(cfg)
    assert card["delta_state_bytes"] == cfg.delta_state_bytes() and card["skipped"] == []


def test_every_traced_tensor_matches_the_reference(made, path):
    """Prefill from 0 and then one decode step, every traced tensor of both against the numpy reference (its own
    states carried between the two calls, as the engine's are)."""
    eng, tok = made
    names = traced_names_matching_the_reference(eng, tok, path)
    for il in (0, 1, 3, 4):
        assert {f"linear_attn_qkv_mixed-{il}", f"conv_output_silu-{il}", f"final_output-{il}", f"ffn_inp-{il}",
                f"l_out-{il}"} <= names
    assert {"kqv_out-2", "attn_gated-2", "attn_gated-5", "Qcur_rope-5"} <= names


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


def test_greedy_blocks_past_the_turn_resume_from_a_snapshot(made, monkeypatch):
    """With every step counted fast, the turn's greedy steps run in blocks of AHEAD, the block after queued before
    the read: the recurrent states end past the turn. The next turn resumes from the latest snapshot at or before
    its cached prefix (a block's end, at most a block back), runs the rest, and its greedy ids are those of a run
    from scratch; without the snapshots it would recompute everything (or, resumed from the live states, be wrong)."""
    monkeypatch.setattr(session_mod, "FAST_STEP_S", 1e9)
    eng, tok = made
    first = prompt_ids(tok)[:16]
    session, seen = Session(eng, tok), []
    # a stop request after the 11th token (as the page's Stop): the blocks queued by then have run on
    r1 = run(session.generate(first, Settings(greedy=True), 40, on_token=lambda i, _: seen.append(i),
                              should_stop=lambda: len(seen) >= AHEAD + 3))
    end = len(session.cached)
    assert r1.stop == "stopped" and len(r1.ids) == AHEAD + 3
    assert eng.held[1] > end, "the blocks should have run past the turn's end"
    second = first + r1.ids + tok.encode(" Later,")
    n = session.cached_prefix(second)
    r2 = run(session.generate(second, Settings(greedy=True), 8))
    assert n - AHEAD <= r2.reused <= n and r2.reused > len(first)
    _, scratch = greedy_chat(eng, tok, second, 8)
    assert scratch.reused == 0 and r2.ids == scratch.ids


def test_an_edited_conversation_recomputes(made):
    """An edit a few tokens in cuts the conversation before any snapshot: the turn runs from position 0 (reused 0),
    with the ids of a fresh session; the snapshots of the old continuation are dropped."""
    eng, tok = made
    first = prompt_ids(tok)[:24]
    session, r1 = greedy_chat(eng, tok, first + tok.encode(" Then"), 10)
    edited = first[:5] + tok.encode(" young") + first[6:]
    r2 = run(session.generate(edited, Settings(greedy=True), 10))
    assert session.cached_prefix(edited) >= 5 and r2.reused == 0 and r2.prefilled == len(edited)
    assert all(s is None or s[1] <= len(edited) + 10 for s in eng.snaps)
    _, scratch = greedy_chat(eng, tok, edited, 10)
    assert r2.ids == scratch.ids


def test_a_step_the_states_cannot_serve_is_refused(made):
    eng, tok = made
    ids = prompt_ids(tok)
    n = len(ids)
    eng.step(ids, 0)
    assert eng.held[1] == n and not any(eng.snaps)
    with pytest.raises(EngineError, match="cannot be cut back"):
        eng.step(ids[:3], 5)
    with pytest.raises(EngineError, match="cannot be cut back"):
        eng.step(ids[:1], n - 1)       # one back: a KV cache could, a recurrent state cannot
    with pytest.raises(EngineError, match="cannot be cut back"):
        eng.step(ids[:1], n + 1)
    eng.step(ids[:1], n, snapshot=True)
    eng.step(ids[:1], n + 1)
    assert eng.resume_point(n + 5) == n + 2 and eng.resume_point(n + 1) == n + 1 and eng.resume_point(n) == 0
    eng.step(ids[:1], n + 1)            # from the snapshot: restored, and the live states follow it
    assert eng.held[1] == n + 2
    eng.step(ids[:2], 0)               # and from 0, always
    assert not any(eng.snaps)


def test_forget_wipes_every_state_and_snapshot_with_proof(made, monkeypatch):
    """A conversation leaves every recurrent state, conv state and snapshot non-zero; Forget clears each and reads it
    back (checked here again from the GPU); a wipe that misses one is reported as failed, naming it."""
    monkeypatch.setattr(session_mod, "FAST_STEP_S", 1e9)
    eng, tok = made
    dev = eng.device
    greedy_chat(eng, tok, prompt_ids(tok), 2 * AHEAD + 2)
    kept = [*eng.recurrent_buffers.values(), *eng.state_buffers.values(), *eng.scratch.snapshots]
    assert all(forget.nonzero_words(dev.read_sync(b)) for b in kept)
    missed = eng.recurrent_buffers[3].label
    report = run(forget.wipe(dev, skip=missed))
    rows = {b.label: b for b in report.buffers}
    assert all(rows[b.label].before > 0 for b in kept)
    assert report.status == "failed" and [b.label for b in report.buffers if b.after] == [missed]
    report = run(forget.wipe(dev))
    assert report.wiped
    assert all(dev.read_sync(b) == bytes(b.size) for b in kept)
    session, again = greedy_chat(eng, tok, prompt_ids(tok), 4)     # the engine runs on from position 0
    assert again.reused == 0 and again.ids
