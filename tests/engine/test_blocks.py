"""The engine's blocks (lab.engine.blocks): each layer of every architecture runs the mixer its Config names, every
buffer a block makes is the conversation's (the kind Forget wipes), and the budget's KV and state totals are the
bytes of the fields each block declares. A new block kind, registered in MIXERS alone, is made, counted, built into
both plans and wiped by Forget with no other file knowing it (docs/adding-an-architecture.md, "One with a new kind
of layer")."""

from __future__ import annotations

import numpy as np
import pytest

from lab import gpu
from lab.engine import blocks, budget
from lab.engine.blocks.attention import Attention
from lab.engine.scratch import Scratch
from lab.format import gguf
from lab.format.config import Config
from lab.format.model import from_gguf
from lab.instruments import forget
from lab.ops import elementwise
from tests.conftest import ARCH_SPECS, native_engine
from tests.engine.hybrids import run, synthetic

LIMITS = {"max_buffer_size": 1 << 30, "max_storage_buffer_binding_size": 1 << 30}


def config(spec: str) -> tuple[gguf.Header, Config]:
    header = gguf.read_file(synthetic(spec))
    return header, from_gguf(header)


def field_bytes(s: Scratch, made: blocks.Blocks, fields: str) -> int:
    """Bytes of the buffers in the Scratch fields the blocks declare as `fields` ("kv_fields" or "state_fields")."""
    values = [getattr(s, name) for b in made.all for name in getattr(b, fields)]
    return sum(x.size for v in values for x in (v if isinstance(v, tuple) else (v,)) if x is not None)


@pytest.mark.parametrize("spec", ARCH_SPECS)
def test_each_block_owns_its_layers_and_buffers(spec):
    header, cfg = config(spec)
    made = blocks.for_config(cfg)
    assert [type(m) for m in made.mixers] == [blocks.MIXERS[cfg.mixer(il)] for il in range(cfg.n_layer)]
    assert all(il in m.layers for il, m in enumerate(made.mixers))
    assert sorted(il for b in made.all[:-1 if made.tail else None] if b not in (made.ffn, made.moe)
                  for il in b.layers) == list(range(cfg.n_layer))
    # each layer's feed-forward: the dense block's or, on a routed layer, the experts' (lab.engine.blocks.moe)
    assert sorted(made.ffn.layers + (made.moe.layers if made.moe else ())) == list(range(cfg.n_layer))
    assert all(made.ffn_of(il) is (made.moe if cfg.routed(il) else made.ffn) for il in range(cfg.n_layer))
    dev = budget._Counting(LIMITS)
    s = Scratch.alloc(dev, cfg, made, 96, 8, False)
    assert {b.kind for b in dev.buffers} == {gpu.CONVERSATION}
    counted = budget.count(LIMITS, header, cfg, 96, max_batch=8)
    assert counted.total("kv") == field_bytes(s, made, "kv_fields") == cfg.kv_bytes_per_token() * 96
    assert counted.total("state") == field_bytes(s, made, "state_fields")


class Scaled(Attention):
    """A test-only block kind: attention, then x times one (the output unchanged), with a state buffer of its own."""
    state_fields = ("scaled_state",)

    def alloc(self, dev, n_ctx, B, kv):
        return {**super().alloc(dev, n_ctx, B, kv),
                "scaled_state": dev.buffer(4 * self.cfg.n_embd, gpu.CONVERSATION, "scaled state [n_embd]")}

    def build(self, p, il):
        super().build(p, il)
        p.add(elementwise.scale(p.dev, p.kernels, p.scratch.x, p.scratch.step, self.cfg.n_embd, 1.0),
              f"scaled-{il}", p.scratch.x, self.cfg.n_embd)


def test_a_new_block_kind_is_one_registration(monkeypatch, device, tiny_path):
    """Layer 1 of the tiny file runs the test-only kind: its state is allocated (CONVERSATION) and counted, its op
    runs in prefill and decode under its traced name, Forget wipes its buffer, and the logits are the plain engine's."""
    plain = native_engine(device, tiny_path, n_ctx=64)
    ids = [1, 17, 29, 401]
    try:
        plain.step(ids, 0)
        want = np.frombuffer(run(device.read(plain.scratch.logits, 0, 4 * plain.cfg.n_vocab)), np.float32).copy()
    finally:
        plain.close()
    monkeypatch.setitem(blocks.MIXERS, "scaled", Scaled)
    monkeypatch.setattr(Config, "mixer", lambda cfg, il: "scaled" if il == 1 else "attention")
    eng = native_engine(device, tiny_path, n_ctx=64)
    try:
        made = eng.blocks
        assert type(made.mixers[1]) is Scaled and made.mixers[1].layers == (1,)
        state = [b for b in device.buffers if b.owner is eng and b.label == "scaled state [n_embd]"]
        assert len(state) == 1 and state[0].kind == gpu.CONVERSATION
        assert eng.budget.total("state") == 4 * eng.cfg.n_embd
        for plan in (eng.prefill, eng.decode):
            assert [tr.name for tr in plan.trace].count("scaled-1") == 1
        eng.step(ids, 0)
        got = np.frombuffer(run(device.read(eng.scratch.logits, 0, 4 * eng.cfg.n_vocab)), np.float32)
        np.testing.assert_array_equal(got, want)
        device.write(state[0], b"\x01" * state[0].size)
        report = run(forget.wipe(device))
        assert report.after == 0 and any(w.label == "scaled state [n_embd]" and w.before for w in report.buffers)
    finally:
        eng.close()
