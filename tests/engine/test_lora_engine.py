"""A LoRA adapter on the GPU engine, against llama.cpp and against the optimizer's oracle:

1. the committed adapter (tests/fixtures/lora, made by llama.cpp's own loader: tests/unit/test_lora_reference.py says
   how) attached with `lab.host.cli.run.attach_lora`, the engine's logits against llama.cpp's with and without it,
   prefill and decode; and an adapter trained in the page's Training card on SmolLM2 (tests/fixtures/lora-page,
   scripts/make_page_lora_fixture.py), which llama.cpp loaded over an F32 copy of the model, on the real Q4_1 file;
2. an adapter trained here, written as a GGUF (Trainer.adapter_bytes), read back by lab.format.adapter and by gguf-py
   with the same values, and attached again to give the trained logits;
3. the optimizer wired into the step: after one step the parameters are the float64 oracle's AdamW (or SGD) step from
   the gradients the step left (lab/host/reference/optim.py), and a step's lr follows the schedule.
"""

from __future__ import annotations

import asyncio
import hashlib
import json

import numpy as np
import pytest

from lab.host import gradcheck
from lab.host.loading import attach_lora
from lab.host.models import cache_dir
from lab.host.reference import lora as ref_lora
from lab.host.reference import optim as ref_optim
from lab.host.synthetic import arch as synthetic_arch
from lab.engine.lora import DEFAULT_TARGETS
from lab.instruments.training import Optim, Trainer
from tests.conftest import FIXTURES

FIX = FIXTURES / "lora"
PAGE_FIX = FIXTURES / "lora-page"
LLAMA_TOL = 2e-3    # engine vs llama.cpp on the F32 file with an F32 KV cache: both f32, summed in other orders
                    # (tests/engine/test_architectures.py measured ~1e-5 relative; logits here reach ~20)


def _llama3(device, n_ctx=16, max_batch=12, logits_all=True, fix=FIX):
    meta = json.loads((fix / "meta.json").read_text())
    path = synthetic_arch.build(meta["spec"], meta["mix"], cache_dir() / "synthetic")
    return gradcheck.open_engine(path, n_ctx, device=device, max_batch=max_batch, logits_all=logits_all), path


def _logits(engine, ids) -> np.ndarray:
    """Logits of every position: a prefill of all but the last three, then three decode steps (rows of each)."""
    V, dev, n = engine.cfg.n_vocab, engine.device, len(ids) - 3
    engine.step(ids[:n], 0)
    rows = [np.frombuffer(dev.read_sync(engine.scratch.logits, 0, 4 * n * V), np.float32).reshape(n, V)]
    for j in range(n, len(ids)):
        engine.step([ids[j]], j)
        rows.append(np.frombuffer(dev.read_sync(engine.scratch.logits, 0, 4 * V), np.float32)[None])
    return np.concatenate(rows)


# lora: the synthetic Llama 3; lora-lfm2: the synthetic LFM2, the short conv's in_proj and out_proj adapted too;
# lora-qwen35: the synthetic Qwen3.5, the delta-net's attn_qkv, attn_gate, ssm_out and the gated attention's attn_q
# (its heads' [q | gate] rows apart in the lab's run) among them (scripts/make_lora_fixtures.py --spec lfm2 / qwen35)
@pytest.mark.parametrize("fix", [FIX, FIXTURES / "lora-lfm2", FIXTURES / "lora-qwen35"],
                         ids=["llama3", "lfm2", "qwen35"])
def test_the_committed_adapter_gives_llama_cpp_logits(device, fix):
    with np.load(fix / "logits.npz") as z:
        golden = {k: z[k] for k in z.files}
    ids = [int(i) for i in golden["ids"]]
    engine, _ = _llama3(device, fix=fix)
    try:
        without = _logits(engine, ids)[:, golden["cols"]]
        attach_lora(engine, str(fix / "adapter.gguf"))
        with_adapter = _logits(engine, ids)[:, golden["cols"]]
    finally:
        engine.close()
    e0 = np.abs(without - golden["without"]).max()
    e1 = np.abs(with_adapter - golden["with_adapter"]).max()
    print(f"vs llama.cpp: without {e0:.2e}, with the adapter {e1:.2e}")
    assert e0 < LLAMA_TOL and e1 < LLAMA_TOL
    assert np.abs(golden["with_adapter"] - golden["without"]).max() > 1000 * LLAMA_TOL


def test_an_adapter_trained_in_the_page_gives_llama_cpps_logits(device, smollm2_path):
    """The page trained it on the real SmolLM2 Q4_1 file; llama.cpp applied it to the F32 copy of the same weights
    (the lab reads the Q4_1 blocks to those values). Every position of the prompt, one prefill."""
    meta = json.loads((PAGE_FIX / "meta.json").read_text())
    assert hashlib.sha256((PAGE_FIX / "adapter.gguf").read_bytes()).hexdigest() == meta["adapter_sha256"]
    with np.load(PAGE_FIX / "logits.npz") as z:
        golden = {k: z[k] for k in z.files}
    ids = [int(i) for i in golden["ids"]]
    engine = gradcheck.open_engine(smollm2_path, len(ids), device=device, logits_all=True)
    V = engine.cfg.n_vocab
    try:
        rows = []
        for adapter in (None, PAGE_FIX / "adapter.gguf"):
            if adapter is not None:
                attach_lora(engine, str(adapter))
            engine.step(ids, 0)
            raw = device.read_sync(engine.scratch.logits, 0, 4 * len(ids) * V)
            rows.append(np.frombuffer(raw, np.float32).reshape(len(ids), V)[:, golden["cols"]])
    finally:
        engine.close()
    e0 = np.abs(rows[0] - golden["without"]).max()
    e1 = np.abs(rows[1] - golden["with_adapter"]).max()
    print(f"the page's SmolLM2 adapter vs llama.cpp: without {e0:.2e}, with it {e1:.2e} (its effect "
          f"{meta['effect_max_abs']})")
    assert e0 < LLAMA_TOL and e1 < LLAMA_TOL
    assert np.abs(golden["with_adapter"] - golden["without"]).max() > 100 * LLAMA_TOL


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_one_step_is_the_optimizers(device, kind):
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    o = Optim(kind, lr=3e-3, steps=10, warmup=2, weight_decay=0.1 if kind == "adamw" else 0.0, clip=0.5)
    tr = Trainer(engine, T=8, rank=4, optim=o, seed=5)
    try:
        dev = engine.device
        dev.write(tr.lora.params, gradcheck.random_params(tr.lora, 5))
        win = [[int(i) for i in np.random.default_rng(2).integers(0, engine.cfg.n_vocab, 8)]]
        for step in (1, 2):
            p0 = np.frombuffer(dev.read_sync(tr.lora.params), np.float32).astype(np.float64)
            m0 = np.frombuffer(dev.read_sync(tr.moments[0][0]), np.float32).astype(np.float64) if kind == "adamw" else None
            v0 = np.frombuffer(dev.read_sync(tr.moments[0][1]), np.float32).astype(np.float64) if kind == "adamw" else None
            asyncio.run(tr.step(win))
            g = np.frombuffer(dev.read_sync(tr.grads), np.float32).astype(np.float64)
            got = np.frombuffer(dev.read_sync(tr.lora.params), np.float32)
            lr = ref_optim.schedule([step], lr=3e-3, warmup=2, total=10, min_ratio=o.min_ratio)[0]
            if kind == "sgd":
                want = ref_optim.sgd_step(p0, g, lr=lr)
            else:
                clip = ref_optim.clip_scale(ref_optim.grad_sumsq(g), 0.5)
                want = ref_optim.adamw_step(p0, g, m0, v0, lr=lr, t=step, clip=clip, weight_decay=0.1)[0]
            err = np.abs(got - want).max() / np.abs(want - p0).max()
            assert err < 1e-3, (kind, step, err)    # of the step's own size: f32 parameters, one step's roundings
    finally:
        tr.close()
        engine.close()


def test_a_trained_adapter_file_round_trips(device, tmp_path):
    engine, path = _llama3(device, 8, 8)
    tr = Trainer(engine, T=8, rank=4, alpha=6.0, optim=Optim("adamw", lr=1e-2, steps=3), seed=1)
    win = [[int(i) for i in np.random.default_rng(3).integers(0, engine.cfg.n_vocab, 8)]]
    try:
        for _ in range(3):
            asyncio.run(tr.step(win))
        trained = _logits(engine, win[0])
        out = tmp_path / "trained.lora.gguf"
        out.write_bytes(asyncio.run(tr.adapter_bytes()))
        params = gradcheck.adapter_arrays(tr.lora, engine.device.read_sync(tr.lora.params))
    finally:
        tr.close()
    try:
        base = _logits(engine, win[0])
        attach_lora(engine, str(out))
        again = _logits(engine, win[0])
    finally:
        engine.close()
    alpha, pairs = ref_lora.load(out)        # gguf-py's reading of our file
    assert alpha == 6.0 and set(pairs) == set(params)
    for name, (a, b) in pairs.items():
        assert np.array_equal(a, params[name][0]) and np.array_equal(b, params[name][1])
    assert np.array_equal(again, trained)    # the same adapter, the same plans: the same bits
    assert np.abs(trained - base).max() > 1e-3      # three steps of lr 1e-2 moved B off zero


def test_the_held_out_loss_is_the_steps(device):
    """Trainer.loss (forward and loss alone) gives the loss the step's gradients are taken at, and changes nothing."""
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    tr = Trainer(engine, T=8, batch=2, rank=4, seed=2)
    try:
        engine.device.write(tr.lora.params, gradcheck.random_params(tr.lora, 2))
        rng = np.random.default_rng(4)
        wins = [[int(i) for i in rng.integers(0, engine.cfg.n_vocab, 8)] for _ in range(2)]
        held = asyncio.run(tr.loss(wins))
        before = engine.device.read_sync(tr.lora.params)
        assert asyncio.run(tr.loss(wins)) == held and engine.device.read_sync(tr.lora.params) == before
        assert asyncio.run(tr.gradients(wins)) == held      # the same ops up to the loss: the same bits
    finally:
        tr.close()
        engine.close()


def test_memory_by_kind_counts_every_buffer(device):
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    tr = Trainer(engine, T=8, rank=4, seed=2)
    try:
        mem = tr.memory()
        n = tr.lora.n_params
        assert mem["adapter"] == mem["gradients"] == 4 * n and mem["optimizer"] >= 8 * n
        assert sum(mem.values()) == sum(b.size for b in device.owned_by(tr)) and mem["activations"] > 0
    finally:
        tr.close()
        engine.close()


def test_forget_wipes_every_training_buffer(device):
    """After a training step, each of the Trainer's buffers (the adapter, its gradients, AdamW's moments, the saved
    activations, the tokens) holds something; Forget's wipe finds them by kind and every one reads back as zeros."""
    from lab.instruments import forget
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    tr = Trainer(engine, T=8, rank=4, seed=2)
    try:
        engine.device.write(tr.lora.params, gradcheck.random_params(tr.lora, 2))
        asyncio.run(tr.step([[int(i) for i in np.random.default_rng(5).integers(0, engine.cfg.n_vocab, 8)]]))
        mine = device.owned_by(tr)
        held = {b.label for b in mine if forget.nonzero_words(device.read_sync(b))}
        for must in ("lora A|B", "lora gradients", "adamw m", "adamw v", "train layer input", "train targets"):
            assert any(label.startswith(must) for label in held), (must, sorted(held))
        # every buffer of the training is the conversation's, but the constants (shapes, offsets, RoPE's tables)
        assert {b.kind for b in mine} == {"conversation", "constant"}
        report = asyncio.run(forget.wipe(device))
        assert report.wiped
        assert all(forget.nonzero_words(device.read_sync(b)) == 0 for b in mine if b.kind == "conversation")
    finally:
        tr.close()
        engine.close()


def test_a_run_past_the_gpus_limits_is_refused_before_anything_is_made(device, monkeypatch):
    """The training's buffers are counted before any is made (lab.instruments.training.check_fits): a binding limit
    just under the rank-64 adapter's parameters (4 MiB here, its largest buffer) refuses the run, naming the buffer and
    the rank that fits; nothing is left allocated and the engine keeps no adapter."""
    from lab.engine.backward import TrainError
    from lab.instruments.training import needs
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    try:
        sizes = needs(engine, 8, 64, DEFAULT_TARGETS)
        params = next(v for k, v in sizes if k.startswith("lora A|B"))
        assert params == max(v for _, v in sizes)
        before = len(device.buffers)
        monkeypatch.setitem(device.info.limits, "max_storage_buffer_binding_size", params - 4)
        with pytest.raises(TrainError, match=r"rank 64 and context 8 does not fit .*lora A\|B.*rank 32 at context 8"):
            Trainer(engine, T=8, rank=64)
        assert len(device.buffers) == before and engine.lora is None
    finally:
        monkeypatch.undo()
        engine.close()


def test_an_adapter_on_a_tensor_the_lab_does_not_adapt_is_refused(device):
    """A pair on the head (here the tied token_embd.weight; an untied output.weight alike) would be loaded and never
    applied: Engine.set_lora refuses it, naming the tensor, and the engine keeps running without an adapter."""
    from lab.engine.engine import EngineError
    from lab.engine.lora import Lora
    engine, _ = _llama3(device, 8, 8, logits_all=False)
    try:
        E = engine.cfg.n_embd
        with device.owning(engine):
            lora = Lora(device, [("blk.0.attn_q.weight", E, E, 2), ("token_embd.weight", E, engine.cfg.n_vocab, 2)],
                        4.0, engine.max_batch)
        with pytest.raises(EngineError, match="adapts token_embd.weight: the lab adapts the layers' projections"):
            engine.set_lora(lora)
        assert engine.lora is None
    finally:
        engine.close()
