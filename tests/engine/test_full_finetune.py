"""Full fine-tuning (issue #43 item 4): every weight and norm of an F32 model trained in place, natively.

1. The gradients: every parameter tensor of the synthetic Llama 3 file (its 28 matrices, 9 norms and the tied
   embedding table, which takes the head's gradient and the embedding's) against float64 central differences of the
   same loss (lab.host.gradcheck `check(full=True)`, lab/host/reference/training.py ModelLoss); and three broken steps
   that must fail it (a matrix's dW left out; with --slow the embedding's scatter-add, a norm's gradient).
2. One optimizer step, AdamW (clipped over every tensor's gradient at once; with --slow SGD too), against the float64
   oracle.
3. The written model (lab.instruments.training `model_bytes`): the untrained engine writes its file back byte for
   byte; `lab train --full` writes a model llama.cpp gives the lab's logits for (tests/fixtures/full-ft, made by
   scripts/make_full_ft_fixture.py: llama.cpp's logits of the same run's file).
4. What is refused, with the reason: a quantized file (qwen2's biases, once refused, have their gradient:
   tests/engine/test_full_finetune_qwen2.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys

import numpy as np
import pytest

from lab.engine import backward
from lab.engine.backward import TrainError, untrainable_full
from lab.engine.load import validate
from lab.format import gguf
from lab.host import cli, gradcheck
from lab.host.models import cache_dir
from lab.host.reference import optim as ref_optim
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments.training import Optim, Trainer, model_bytes
from lab.ops import backward_deltanet, backward_shortconv
from tests.conftest import FIXTURES, ROOT

FIX = FIXTURES / "full-ft"
LLAMA_TOL = 2e-3    # as tests/engine/test_lora_engine.py: F32 on both sides, summed in other orders
sys.path.insert(0, str(ROOT / "scripts"))
from make_full_ft_fixture import PROMPT, RUN, TEXT_CHARS, train_args  # noqa: E402


def llama3(mix: str = "f32"):
    return synthetic_arch.build("llama3", mix, cache_dir() / "synthetic")


def _check(device, spec: str = "llama3", **kw) -> dict:
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    engine = gradcheck.open_engine(path, 8, device=device)
    try:
        return gradcheck.check(path, T=8, engine=engine, full=True, **kw)
    finally:
        engine.close()


# Every dense architecture the lab trains in full, by what it adds: llama3 (rope_freqs, the tied head); with --slow (a
# big vocabulary makes the float64 differences 30 s to a minute each) qwen3 (the per-head Q/K norms), gemma3 (Q/K norms,
# post-norms, sliding windows), phi3 (attn_qkv and ffn_up fused in the file, read as views), gemma2 (post-norms,
# soft-capping), smollm3 (layers without RoPE), mistral (GQA 4:1, an untied head), lfm2 (short-conv blocks beside
# attention layers with Q/K norms), qwen35 (gated delta-net layers beside gated attention layers). By default the
# tensors past llama's alone (below).
FULL_SPECS = ["llama3", *(pytest.param(s, marks=pytest.mark.slow)
                          for s in ("qwen3", "gemma3", "phi3", "gemma2", "smollm3", "mistral", "lfm2", "qwen35"))]


@pytest.mark.parametrize("spec", FULL_SPECS)
def test_every_weights_gradient_matches_central_differences(device, spec):
    r = _check(device, spec, batch=2, samples=2)
    worst = sorted(r["tensors"], key=lambda row: -row["worst_rel_err"])[:3]
    print(f"\nfull fine-tuning, {spec} f32: loss {r['loss_gpu']:.6f} vs {r['loss_float64']:.6f}, "
          f"{len(r['tensors'])} tensors, worst {worst}")
    assert r["loss_rel_err"] < 1e-5 and r["ok"], worst
    header = gguf.read_file(synthetic_arch.build(spec, "f32", cache_dir() / "synthetic"))
    assert {row["tensor"] for row in r["tensors"]} == {t.name for t in header.tensors} - {"rope_freqs.weight"}
    assert not r["missing"]


@pytest.mark.parametrize("spec,only,count", [
    ("qwen3", ("_q_norm", "_k_norm"), 8), ("gemma2", ("post_",), 8), ("lfm2", ("shortconv",), 12),
    ("qwen35", ("blk.0.ssm_conv1d", "blk.0.ssm_dt", "blk.0.ssm_a", "blk.0.ssm_norm", "blk.2.attn_q.weight"), 6)])
def test_the_norms_past_llamas_match_central_differences(device, spec, only, count):
    """By default, the tensors llama has not: qwen3's per-head Q/K norms (their dw over the fused row's heads),
    gemma2's post-norms (their dw handed by `branch_back`), lfm2's 4 short-conv blocks (each's conv kernel, its dw
    from lab.ops.backward_shortconv, in_proj and out_proj) and qwen35's delta-net parameters held as vectors (layer 0's
    conv kernel, dt's bias, A ("ssm_a" names ssm_alpha too), the gated norm's weight: lab.ops.backward_deltanet) with a
    gated attention layer's attn_q (its [q | gate] rows read back from their pieces of the engine's row), the central
    differences of those tensors alone (a big vocabulary's float64 forward is slow: the whole checks are in the deep
    set above)."""
    r = _check(device, spec, batch=1, samples=1, only=only)
    names = [row["tensor"] for row in r["tensors"]]
    print(f"\n{spec} f32, {', '.join(only)}: {len(names)} tensors, worst {r['worst_rel_err']:.2e}")
    assert r["ok"] and len(names) == count and all(any(o in n for o in only) for n in names), names


def _dw_left_out_for(kind: str):
    real = backward.backward_matmul.dw_back

    def fake(dev, kernels, dw, *a, **k):
        return [] if kind in dw[0].buffer.label else real(dev, kernels, dw, *a, **k)
    return fake


def _norm_dw_left_out(*a, **k):
    a = list(a)
    a[6] = None                                   # dw: the norm's weight not trained
    return _REAL_NORM_BACK(*a, **k)


_REAL_NORM_BACK = backward.rms_norm_back


SLOW = pytest.mark.slow     # each ~20 s on lavapipe: one trap by default, the others in the deep set


@pytest.mark.parametrize("name,target,fn,tensor", [
    ("ffn_down's dW left out", "lab.engine.backward.backward_matmul.dw_back", _dw_left_out_for("ffn_down"),
     "ffn_down"),
    pytest.param("the embedding's scatter-add left out", "lab.engine.backward.embed_back", lambda *a, **k: [],
                 "token_embd", marks=SLOW),
    pytest.param("the norms' gradients left out", "lab.engine.backward.rms_norm_back", _norm_dw_left_out, "norm",
                 marks=SLOW),
])
def test_broken_steps_fail(device, monkeypatch, name, target, fn, tensor):
    monkeypatch.setattr(target, fn)
    r = _check(device, batch=1, samples=3)
    bad = [row["tensor"] for row in r["tensors"] if row["worst_rel_err"] > r["tolerance"]]
    print(f"\n{name}: {len(bad)} tensors fail, e.g. {bad[:3]}")
    assert not r["ok"] and bad and all(tensor in b for b in bad), bad


def _conv_dw_left_out(*a, **k):
    a = list(a)
    a[6] = None                                   # dw: the conv kernel's gradient not taken
    return _REAL_SHORTCONV_BACK(*a, **k)


_REAL_SHORTCONV_BACK = backward_shortconv.shortconv_back


@SLOW
def test_the_conv_kernels_gradient_left_out_fails(device, monkeypatch):
    monkeypatch.setattr("lab.engine.blocks.shortconv.backward_shortconv.shortconv_back", _conv_dw_left_out)
    r = _check(device, "lfm2", batch=1, samples=1, only=("shortconv.conv",))
    bad = [row["tensor"] for row in r["tensors"] if row["worst_rel_err"] > r["tolerance"]]
    print(f"\nthe conv kernel's dw left out: {len(bad)} of {len(r['tensors'])} tensors fail")
    assert not r["ok"] and len(bad) == 4 and all("shortconv.conv.weight" in b for b in bad), bad


def _delta_params_left_out(*a, **k):
    return _REAL_DELTANET_BACK(*a, **{**k, "dnorm_w": None, "ddt": None, "da": None})


_REAL_DELTANET_BACK = backward_deltanet.deltanet_back


@SLOW
def test_the_delta_nets_parameters_gradients_left_out_fail(device, monkeypatch):
    monkeypatch.setattr("lab.engine.blocks.deltanet.backward_deltanet.deltanet_back", _delta_params_left_out)
    r = _check(device, "qwen35", batch=1, samples=1, only=("ssm_dt", "ssm_a", "ssm_norm"))
    bad = [row["tensor"] for row in r["tensors"] if row["worst_rel_err"] > r["tolerance"]]
    print(f"\nthe delta-net's dt bias, A and norm weight left out: {len(bad)} of {len(r['tensors'])} tensors fail")
    assert not r["ok"] and len(bad) == 12, bad


@pytest.mark.parametrize("kind", ["adamw", pytest.param("sgd", marks=SLOW)])
def test_one_step_is_the_optimizers(device, kind):
    """Every piece's parameters after one step against the float64 oracle's step from the gradients the step left:
    AdamW's clip factor from the global norm over every piece at once."""
    engine = gradcheck.open_engine(llama3(), 8, device=device)
    o = Optim(kind, lr=1e-3, steps=4, weight_decay=0.1 if kind == "adamw" else 0.0, clip=0.5)
    tr = Trainer(engine, T=8, optim=o, full=True)
    try:
        dev = engine.device
        win = [[int(i) for i in np.random.default_rng(4).integers(0, engine.cfg.n_vocab, 8)]]
        read = lambda b: np.frombuffer(dev.read_sync(b), np.float32).astype(np.float64)     # noqa: E731
        before = [read(p) for p, _, _ in tr.pieces()]
        asyncio.run(tr.step(win))
        grads = [read(g) for _, g, _ in tr.pieces()]
        after = [read(p) for p, _, _ in tr.pieces()]
        lr = ref_optim.schedule([1], lr=o.lr, warmup=0, total=o.steps, min_ratio=o.min_ratio)[0]
        clip = ref_optim.clip_scale(sum(ref_optim.grad_sumsq(g) for g in grads), o.clip)
        worst = 0.0
        for p0, g, got in zip(before, grads, after):
            if kind == "sgd":
                want = ref_optim.sgd_step(p0, g, lr=lr)
            else:
                zero = np.zeros_like(p0)
                want = ref_optim.adamw_step(p0, g, zero, zero, lr=lr, t=1, clip=clip, weight_decay=0.1)[0]
            moved = np.abs(want - p0).max()
            if moved > 0:
                worst = max(worst, float(np.abs(got - want).max() / moved))
        print(f"\n{kind}: {len(grads)} pieces, worst error {worst:.2e} of a step's size (clip factor {clip:.4f})")
        assert worst < 1e-3, worst
        assert kind == "sgd" or clip < 1.0          # the clip was reached: the global norm over all pieces counts
    finally:
        tr.close()
        engine.close()


@pytest.mark.parametrize("spec", ["llama3", "qwen3", "phi3", "lfm2", "qwen35",
                                  pytest.param("gemma3", marks=pytest.mark.slow)])
def test_the_untrained_model_is_written_back_byte_for_byte(device, spec):
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    engine = gradcheck.open_engine(path, 8, device=device)
    try:
        raw = asyncio.run(model_bytes(engine))
    finally:
        engine.close()
    assert raw == path.read_bytes()


def test_a_fine_tuned_model_gives_llama_cpps_logits(device, tmp_path, capsys):
    """`lab train --full` with the fixture's run; the lab on the file it wrote against llama.cpp on the fixture
    script's (the same run); and the run moved the model (its logits against the untrained file's)."""
    meta = json.loads((FIX / "meta.json").read_text())
    assert {k: meta[k] for k in RUN} == RUN and meta["prompt"] == PROMPT
    with np.load(FIX / "logits.npz") as z:
        golden = {k: z[k] for k in z.files}
    data, out = tmp_path / "text.txt", tmp_path / "trained.gguf"
    data.write_text((FIXTURES / "constitution.txt").read_text()[:TEXT_CHARS])
    assert cli.main(train_args(llama3(), data, out)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mode"] == "full" and out.stat().st_size == meta["written_bytes"]
    np.testing.assert_allclose(report["losses"], meta["losses"], rtol=1e-4)
    ids = [int(i) for i in golden["ids"]]
    engine = gradcheck.open_engine(out, len(ids), device=device, logits_all=True)
    try:
        engine.step(ids, 0)
        V = engine.cfg.n_vocab
        got = np.frombuffer(device.read_sync(engine.scratch.logits, 0, 4 * len(ids) * V), np.float32)
        got = got.reshape(len(ids), V)[:, golden["cols"]]
    finally:
        engine.close()
    err = float(np.abs(got - golden["logits"]).max())
    print(f"\nthe fine-tuned model in the lab vs llama.cpp: {err:.2e} (training moved the logits by "
          f"{meta['effect_max_abs']})")
    assert err < LLAMA_TOL
    assert np.abs(golden["logits"] - golden["untrained"]).max() > 100 * LLAMA_TOL


def test_refusals(device):
    cfg = validate(gguf.read_file(llama3()))[0]
    assert untrainable_full(cfg, {"F32"}) is None
    assert "Q4_K" in untrainable_full(cfg, {"F32", "Q4_K"}) and "LoRA" in untrainable_full(cfg, {"Q4_K"})
    # qwen2's one difference, its Q/K/V biases, trains since their gradient is built (test_full_finetune_qwen2.py)
    assert untrainable_full(dataclasses.replace(cfg, arch="qwen2", qkv_bias=True), {"F32"}) is None
    engine = gradcheck.open_engine(llama3("q4_k_m"), 8, device=device)
    try:
        with pytest.raises(TrainError, match="full fine-tuning trains the weights themselves in f32"):
            Trainer(engine, T=8, full=True)
    finally:
        engine.close()


def test_lab_f32_copy_makes_a_quantized_model_trainable_in_full(device, tmp_path, capsys):
    """`lab f32-copy`: the Q4_K_M file's every tensor dequantized; the lab's logits on the copy are the quantized
    file's (the engine dequantizes the same blocks to the same values), and full fine-tuning takes the copy."""
    src, out = llama3("q4_k_m"), tmp_path / "copy.gguf"
    assert cli.main(["f32-copy", str(src), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == out.stat().st_size
    header = gguf.read_file(out)
    assert {t.type.name for t in header.tensors} == {"F32"} and header.metadata["general.file_type"] == 0
    ids = [1, 504, 701, 282, 260, 1797]
    rows = []
    for path in (src, out):
        engine = gradcheck.open_engine(path, len(ids), device=device, logits_all=True)
        try:
            engine.step(ids, 0)
            rows.append(np.frombuffer(device.read_sync(engine.scratch.logits, 0, 4 * len(ids) * engine.cfg.n_vocab),
                                      np.float32))
            if path == out:
                Trainer(engine, T=4, full=True).close()
        finally:
            engine.close()
    assert np.abs(rows[0] - rows[1]).max() < 1e-4 * np.abs(rows[0]).max()
    assert cli.main(["f32-copy", str(out), "--out", str(out)]) == 2
    assert "is the model itself" in capsys.readouterr().err
