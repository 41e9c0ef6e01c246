"""lab/instruments/forget.py natively: every conversation buffer is found through the registry, cleared, and read back.

The tests do not trust the report: they read every CONVERSATION buffer back themselves, add a buffer the engine
does not know about, and break `clear` to prove the check reads the GPU rather than believing the wipe."""

from __future__ import annotations

import asyncio
import random
import struct

import pytest

from lab import gpu
from lab.engine.engine import Engine
from lab.engine.session import Session
from lab.format import gguf
from lab.instruments import forget
from lab.instruments.probes import Probes
from lab.settings import Settings
from lab.text.tokenizer import from_metadata

N_CTX = 128


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return from_metadata(gguf.read_file(smollm2_path).metadata)


@pytest.fixture(scope="module")
def made(device, smollm2_path):
    """An engine and its probes, with every device._create_buffer call recorded while they were built."""
    created = []
    real = device._create_buffer

    def spy(size, label, uniform):
        handle = real(size, label, uniform)
        created.append(handle)
        return handle

    device._create_buffer = spy
    try:
        eng = Engine(device, gguf.read_file(smollm2_path), n_ctx=N_CTX)
        eng.weights.upload_file(smollm2_path)
        pr = Probes(eng)
        pr._build_embedding()
        pr._build_pass()
    finally:
        del device._create_buffer
    yield eng, pr, created
    pr.close()
    eng.close()


def converse(made, tok, panels: bool = False):
    """A conversation: prefill, greedy and sampled decode; with `panels`, also the embedding inspector and an
    inspection with every panel (the lens costs ~20 s on lavapipe), so that every kind of buffer holds data."""
    eng, pr, _ = made
    session = Session(eng, tok)
    prompt = tok.encode("The king of France")
    res = run(session.generate(prompt, Settings(greedy=True), 3))
    run(session.generate(prompt + res.ids, Settings(greedy=False, seed=3), 2))
    if panels:
        run(pr.embedding(prompt[1]))
        run(pr.inspect(prompt, len(prompt), lens=1))
    return session


def all_conversation_words(device) -> int:
    return sum(forget.nonzero_words(device.read_sync(b)) for b in forget.conversation_buffers(device))


def test_nonzero_words():
    rng = random.Random(0)
    words = [rng.choice([0, 0, 1, 0x100, 0x10000, 0x1000000, 0x80000000, rng.getrandbits(32)]) for _ in range(10_001)]
    raw = struct.pack(f"<{len(words)}I", *words)
    assert forget.nonzero_words(raw) == sum(1 for w in words if w)
    assert forget.nonzero_words(b"") == 0
    assert forget.nonzero_words(bytes(4096)) == 0


def test_registry_covers_every_buffer(made, device):
    """Every buffer the engine and the probes made is in the registry with a kind; the scratch, caches and step
    uniform are CONVERSATION, the parameters CONSTANT and the weights WEIGHTS."""
    eng, pr, created = made
    registered = {id(b.handle): b for b in device.buffers}
    assert created and all(id(h) in registered for h in created), "a buffer was made outside the registry"
    assert all(registered[id(h)].kind in gpu.KINDS for h in created)
    for b in device.owned_by(eng) + pr.buffers:
        assert b in device.buffers and b.kind in gpu.KINDS
    conv = set(map(id, forget.conversation_buffers(device)))
    s = eng.scratch
    scratch = [s.step, s.ids, s.x, s.xn, s.qkv, s.att, s.gate_up, s.h, s.last, s.logits,
               s.topk, s.kept, *s.k_cache, *s.v_cache, pr.q_id, pr.q_row, pr.sims, pr.nb, pr.win, pr.lens_step,
               pr.attn_probe, pr.attn, pr.resid, pr.lens_x, pr.lens_xn, pr.lens_logits, pr.lens_top]
    assert all(id(b) in conv for b in scratch)
    weights = [p.buffer for w in eng.weights.matrices.values() for p in w.parts] + list(eng.weights.vectors.values())
    assert all(b.kind == gpu.WEIGHTS for b in weights)
    # everything else the engine made is fixed at load (per-op parameters, the RoPE frequency table): CONSTANT
    rest = [b for b in device.owned_by(eng) if id(b) not in conv and b.kind != gpu.WEIGHTS]
    assert rest and all(b.kind == gpu.CONSTANT for b in rest)
    assert {b.label for b in rest if not b.uniform} <= {"rope.freqs"}


def test_memory_report_counts_the_registry(made, device, smollm2_path):
    """`lab bench`'s GPU memory: the registry's running total is its buffers' sizes, the peak is at least that,
    the weights are the file's tensor bytes once (the stacked QKV and gate/up hold no second copy) and the KV
    cache is 2 x layers x n_ctx x kv width x 4 bytes."""
    from lab.host.bench.native import gpu_memory
    eng, _, _ = made
    assert device.live_bytes == sum(b.size for b in device.buffers) <= device.peak_bytes
    header = gguf.read_file(smollm2_path)
    file_bytes = sum(t.nbytes for t in header.tensors)
    mem = gpu_memory(device, file_bytes, device.owned_by(eng))      # (other tests' buffers share this device)
    cfg = eng.cfg
    assert mem["weights"] == mem["file_weights"] == round(file_bytes / 1e6, 1)
    assert mem["kv_cache"] == round(2 * cfg.n_layer * N_CTX * cfg.n_head_kv * cfg.head_dim * 4 / 1e6, 1)
    assert mem["peak"] >= mem["weights"] + mem["kv_cache"] + mem["scratch_and_other"] - 0.2


def test_forget_wipes_and_reads_back(made, device, tok):
    eng, _, _ = made
    session = converse(made, tok, panels=True)
    assert all_conversation_words(device) > 0
    assert all(forget.nonzero_words(device.read_sync(b)) for b in (made[1].lens_top, made[1].attn, made[1].nb))
    report = run(forget.wipe(device))
    session.reset()
    assert report.before > 0 and report.after == 0 and report.wiped and report.status == "wiped"
    assert len(report.buffers) == len(forget.conversation_buffers(device))
    assert all_conversation_words(device) == 0                     # checked again here, not taken from the report
    d = report.to_dict()
    assert d["buffers"] == len(report.buffers) and d["before"] == report.before and d["after"] == 0
    print(f"\nForget natively: {d['buffers']} buffers, {d['bytes'] / 1e6:.1f} MB, {d['before']} non-zero words "
          f"before, {d['after']} after, {d['ms']:.0f} ms")


def test_nothing_to_wipe_claims_nothing(made, device, tok):
    converse(made, tok)
    run(forget.wipe(device))
    again = run(forget.wipe(device))
    assert again.before == 0 and again.after == 0
    assert not again.wiped and again.status == "nothing"


def test_an_extra_conversation_buffer_is_wiped(made, device, tok):
    """A conversation buffer nobody told Forget about (made after the engine) is found by its kind and wiped."""
    converse(made, tok)
    extra = device.buffer(4096, gpu.CONVERSATION, "test.extra")
    try:
        device.write(extra, struct.pack("<1024I", *range(1, 1025)))
        report = run(forget.wipe(device))
        row = [c for c in report.buffers if c.label == "test.extra"]
        assert row and row[0].before == 1024 and row[0].after == 0
        assert device.read_sync(extra) == bytes(4096)
    finally:
        device.destroy(extra)


def test_a_wipe_that_does_not_clear_is_reported(made, device, tok, monkeypatch):
    """With clear() broken, the read-back catches it: the report says failed and never claims a wipe."""
    converse(made, tok)
    monkeypatch.setattr(device, "clear", lambda buf: None)
    report = run(forget.wipe(device))
    monkeypatch.undo()
    # every buffer keeps what it held, but the read-back buffer, which holds whatever was read through it last
    kept = [c for c in report.buffers if c.label != "readback"]
    assert report.after > 0 and all(c.after == c.before for c in kept) and len(kept) == len(report.buffers) - 1
    assert not report.wiped and report.status == "failed"
    run(forget.wipe(device))


def test_the_engine_works_after_forget(made, device, tok):
    """Forget leaves weights and parameters alone: the same prompt gives the same greedy tokens afterwards."""
    eng, _, _ = made
    prompt = tok.encode("Water boils at")
    first = run(Session(eng, tok).generate(prompt, Settings(greedy=True), 4)).ids
    run(forget.wipe(device))
    assert run(Session(eng, tok).generate(prompt, Settings(greedy=True), 4)).ids == first


def test_text_caches_are_dropped(tok):
    tok.encode("a secret word: xylophone")
    assert any("xylophone" in k for k in tok._cache)
    assert tok.drop_caches() > 0
    assert not tok._cache
    assert tok.drop_caches() == 0


def test_the_skip_hook_refuses_a_label_it_cannot_find(made, device):
    """The tests' skip hook names the buffer left uncleared: a label that matches none is an error, not a clean
    wipe (a stale label once made a deliberately incomplete wipe read as complete)."""
    with pytest.raises(ValueError, match="no conversation buffer is labelled 'conv state 9 \\[18, n_embd\\]'"):
        asyncio.run(forget.wipe(device, skip="conv state 9 [18, n_embd]"))


def test_a_new_chat_leaves_the_users_files_and_wipes_the_rest(made, device, tok):
    """New chat's wipe (`leave`: the retrieval index, a trained adapter's parameters) leaves those buffers as they are,
    outside the report, and clears and reads back every other conversation buffer as Forget does."""
    converse(made, tok)
    files = device.buffer(4096, gpu.CONVERSATION, "test.user file")
    try:
        device.write(files, struct.pack("<1024I", *range(1, 1025)))
        report = run(forget.wipe(device, leave=[files]))
        assert "test.user file" not in {c.label for c in report.buffers}
        assert report.wiped and report.after == 0 and len(report.buffers) > 2
        assert device.read_sync(files) == struct.pack("<1024I", *range(1, 1025))
        assert all_conversation_words(device) == 1024        # the file's words, and nothing else
    finally:
        device.destroy(files)
