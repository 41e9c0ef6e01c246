"""Training's step on the GPU (lab.engine.backward, lab.instruments.training), natively on synthetic files:

1. the whole model's LoRA gradients against central differences of the same loss in float64 (lab.host.gradcheck:
   the numpy reference with W + (alpha / r) B A), at the entry of each adapter tensor with the largest gradient and a
   random one, every tensor of every layer; the loss itself against the float64 loss;
2. broken variants of the step (RoPE's backward left out, the residual's gradient dropped at a norm, the LoRA
   scale squared; with --slow the Q/K norms' and the post-norms' backward left out) that the same check must catch;
3. the engine's forward with an adapter set (prefill and decode plans) against the reference with the merged weights;
4. the refusals: models whose layers have no backward yet, an f16 KV cache, windows past the engine's steps.

Files: llama 3 (rope_freqs, tied head) in F32 and a Q4_K_M-like mix (the base's dx through quantized blocks),
phi3 (the fused attn_qkv and gate|up tensors as targets), smollm3 (NoPE layers), lfm2 (short-conv blocks, their
in_proj and out_proj adapted, beside attention layers with per-head Q/K norms) and qwen35 (gated delta-net layers, their
five projections adapted, beside gated attention layers whose attn_q holds each head's [q | gate] rows: a window of
two chunks of the recurrence's backward, layer 0's and attn_q's differences alone) by default; with --slow mistral,
qwen3 (per-head Q/K norms), gemma2 (post-norms, soft-caps, GeGLU), gemma3 (post-norms, Q/K norms, sliding windows) and
the whole of lfm2's and qwen35's checks.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lab.engine import backward
from lab.engine.backward import TrainError
from lab.engine.engine import Engine, read_host_values
from lab.engine.load import validate
from lab.engine.lora import Lora, LoraError, choose
from lab.format import gguf
from lab.host import gradcheck
from lab.host.models import cache_dir
from lab.host.reference.training import LoraLoss
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments.training import Trainer, batch_of, windows

FORWARD_TOL = 1e-4      # engine with an adapter vs float64 reference, relative to max |logit|: f32 sums (~1e-6 measured)


def synthetic(spec: str, mix: str = "f32"):
    return synthetic_arch.build(spec, mix, cache_dir() / "synthetic")


def check(device, spec, mix="f32", T=12, **kw) -> dict:
    path = synthetic(spec, mix)
    engine = gradcheck.open_engine(path, T, device=device)
    try:
        return gradcheck.check(path, T=T, engine=engine, **kw)
    finally:
        engine.close()


SLOW = pytest.mark.slow


@pytest.mark.parametrize("spec,mix,batch,samples", [
    ("llama3", "f32", 2, 2), ("llama3", "q4_k_m", 1, 1), ("phi3", "f32", 1, 1), ("smollm3", "f32", 1, 1),
    # short-conv blocks (the conv's backward, in_proj and out_proj adapted), Q/K norms; by default its conv tensors'
    # full fine-tuning check (test_full_finetune.py) and its adapter file (below)
    pytest.param("lfm2", "f32", 1, 1, marks=SLOW),
    # gated delta-net layers (their attn_qkv, attn_gate, ssm_out adapted) and gated attention (attn_q's [q | gate]
    # rows a head, two pieces of B each); by default layer 0's and attn_q's alone (test_qwen35_delta_net_lora below)
    pytest.param("qwen35", "f32", 1, 1, marks=SLOW),
    pytest.param("mistral", "f32", 1, 2, marks=SLOW),
    pytest.param("qwen3", "f32", 1, 1, marks=SLOW),         # per-head Q/K norms (151,936 tokens: slow)
    pytest.param("gemma2", "f32", 1, 1, marks=SLOW),        # post-norms, attention and final soft-caps, GeGLU
    pytest.param("gemma3", "f32", 1, 1, marks=SLOW),        # post-norms, Q/K norms, sliding windows past T = 8
])
def test_gradients_match_central_differences(device, spec, mix, batch, samples):
    r = check(device, spec, mix, batch=batch, samples=samples)
    worst = sorted(r["tensors"], key=lambda row: -row["worst_rel_err"])[:3]
    print(f"{spec} {mix}: loss {r['loss_gpu']:.6f} vs {r['loss_float64']:.6f}, {len(r['tensors'])} tensors, "
          f"worst {worst}")
    assert r["loss_rel_err"] < 1e-5, r["loss_rel_err"]         # f32 sums of ~1e5 terms: ~1e-7 measured
    assert r["ok"], worst
    # every projection kind of the default targets the file has, each layer's: lfm2's short-conv layers have in_proj
    # and out_proj where its attention layers have attn_q .. attn_output
    header = gguf.read_file(r["model"])
    targets = choose({t.name: t for t in header.tensors}, validate(header)[0].n_layer, rank=4)
    kinds = {row["tensor"].split(".", 2)[2].rsplit(".weight", 1)[0] for row in r["tensors"]}
    want = {"phi3": 4, "lfm2": 9, "qwen35": 10}.get(spec, 7)
    assert len(kinds) == want and {row["tensor"] for row in r["tensors"]} == {
        f"{name}.lora_{h}" for name, *_ in targets for h in "ab"}


def _skip_norm(part: str):
    """A Q/K-norm or post-norm backward that passes its gradient through untouched (the norm treated as identity)."""
    real = backward.rms_norm_back

    def fake(dev, kernels, x, w, dy, dx, dw, rs, step, n, eps, **kw):
        if part == "qk" and kw.get("group"):
            return []                                       # dqkv_pre keeps the copied gradient
        if part == "post" and not kw.get("accumulate") and x.label.startswith("train branch"):
            from lab.ops import elementwise
            return elementwise.copy_rows(dev, kernels, dy, dx, step, n)
        return real(dev, kernels, x, w, dy, dx, dw, rs, step, n, eps, **kw)
    return fake


def _no_accumulate(*a, **k):
    return _REAL_NORM_BACK(*a, **{**k, "accumulate": False})


_REAL_NORM_BACK = backward.rms_norm_back


@pytest.mark.parametrize("name,spec,target,fn", [
    ("rope_back left out", "llama3", "lab.engine.blocks.attention.backward_rope.rope_back", lambda *a, **k: []),
    # by default one broken step (the gradient check's power to fail); the others with --slow
    pytest.param("the norm's gradient written over the residual's", "llama3", "lab.engine.backward.rms_norm_back",
                 _no_accumulate, marks=SLOW),
    pytest.param("the LoRA scale squared", "llama3", "lab.engine.lora.Lora.scale",
                 lambda self, n: (self.alpha / self.targets[n].rank) ** 2, marks=SLOW),
    pytest.param("the short conv's backward left out", "lfm2",
                 "lab.engine.blocks.shortconv.backward_shortconv.shortconv_back", lambda *a, **k: [], marks=SLOW),
    pytest.param("the delta-net's backward left out", "qwen35",
                 "lab.engine.blocks.deltanet.backward_deltanet.deltanet_back", lambda *a, **k: [], marks=SLOW),
    pytest.param("the attention gate's backward left out", "qwen35",
                 "lab.engine.blocks.attention.backward.sigmoid_gate_back", lambda *a, **k: [], marks=SLOW),
    pytest.param("the Q/K norms' backward left out", "qwen3", "lab.engine.blocks.attention.backward.rms_norm_back",
                 _skip_norm("qk"), marks=SLOW),
    pytest.param("the post-norms' backward left out", "gemma2", "lab.engine.backward.rms_norm_back",
                 _skip_norm("post"), marks=SLOW),
])
def test_broken_steps_fail(device, monkeypatch, name, spec, target, fn):
    monkeypatch.setattr(target, fn)
    # lfm2: the conv layers' in_proj alone is checked (what the conv's backward feeds), for time; qwen35: attn_qkv
    # (what the recurrence's backward feeds) and attn_q (the gate's rows and the attention's)
    targets = {"lfm2": ("shortconv.in_proj",), "qwen35": ("attn_qkv", "attn_q")}.get(spec)
    r = check(device, spec, samples=1, targets=targets)
    assert not r["ok"], f"{name}: the check passed ({r['worst_rel_err']:.2e})"


def _step_both_ways(device, spec: str, T: int = 12, drop: str | None = None) -> tuple:
    """(loss, gradient bytes) of one step on the same windows, with the forward's rows kept and with each layer's
    forward computed again; `drop`: a kept row not put back (a broken variant)."""
    path = synthetic(spec)
    engine = gradcheck.open_engine(path, T, device=device)
    rng = np.random.default_rng(4)
    wins = [[int(i) for i in rng.integers(0, engine.cfg.n_vocab, T)] for _ in range(2)]
    out = []
    try:
        for keep in (True, False):
            real = backward.Backward._keep
            if drop and keep:
                def broken(self, il, names, back=False):
                    return real(self, il, tuple(n for n in names if not (back and n == drop)), back)
                backward.Backward._keep = broken
            try:
                tr = Trainer(engine, T=T, batch=2, rank=4, seed=2, keep=keep)
            finally:
                backward.Backward._keep = real
            try:
                assert bool(tr.ts.kept) == keep
                device.write(tr.lora.params, gradcheck.random_params(tr.lora, 2))
                loss = asyncio.run(tr.gradients(wins))
                out.append((loss, device.read_sync(tr.ts.grads)))
            finally:
                tr.close()
    finally:
        engine.close()
    return out[0], out[1]


@pytest.mark.parametrize("spec", ["llama3", "lfm2", pytest.param("qwen35", marks=SLOW), pytest.param("gemma2", marks=SLOW),
                                  pytest.param("qwen3", marks=SLOW)])
def test_kept_rows_give_the_recomputed_gradients_bit_for_bit(device, spec):
    """The forward's rows kept aside (lab.engine.backward KEEP_BYTES) and the layers' forward computed again give the
    same loss and the same gradient bytes: the same kernels on the same inputs (gemma2: post-norms, soft-caps, GeGLU;
    qwen3: the Q/K norms recomputed from the kept rows' norm; lfm2: the short-conv layers' bcx and C * conv kept;
    qwen35: the delta-net layers' in-projection row, conv output and gated norm's output, the gated attention's
    output computed again before its gate)."""
    kept, again = _step_both_ways(device, spec)
    assert kept[0] == again[0] and kept[1] == again[1]


@pytest.mark.parametrize("spec,drop", [("llama3", "h"), ("llama3", "mid"), ("llama3", "qkv"),
                                       pytest.param("lfm2", "bcx", marks=SLOW),     # a short-conv layer's kept row
                                       pytest.param("qwen35", "delta_conv", marks=SLOW)])   # a delta-net layer's
def test_a_kept_row_left_out_changes_the_gradients(device, spec, drop):
    kept, again = _step_both_ways(device, spec, drop=drop)
    assert kept[1] != again[1], f"the step without the kept {drop} gave the recomputed gradients"


def test_forward_with_an_adapter_matches_the_merged_reference(device):
    path = synthetic("llama3")
    header = gguf.read_file(path)
    cfg, _ = validate(header)
    eng = Engine(device, header, cfg, n_ctx=32, max_batch=8, logits_all=True,
                 host_values=read_host_values(path, header, cfg))
    try:
        eng.weights.upload_file(path)
        with device.owning(eng):
            lora = Lora(device, choose({t.name: t for t in header.tensors}, cfg.n_layer, rank=4), 8.0,
                        eng.max_batch)
        device.write(lora.params, gradcheck.random_params(lora, 3))
        eng.set_lora(lora)
        ids = [int(i) for i in np.random.default_rng(1).integers(0, cfg.n_vocab, 11)]
        eng.step(ids[:8], 0)
        got = [np.frombuffer(device.read_sync(eng.scratch.logits, 0, 4 * 8 * cfg.n_vocab), np.float32)
               .reshape(8, cfg.n_vocab)]
        for j in range(8, 11):      # decode steps: the fused norm, GLU and RoPE paths with the adapter's terms
            eng.step([ids[j]], j)
            got.append(np.frombuffer(device.read_sync(eng.scratch.logits, 0, 4 * cfg.n_vocab), np.float32)[None])
        params = gradcheck.adapter_arrays(lora, device.read_sync(lora.params))
    finally:
        eng.close()
    want = LoraLoss(path, params, 8.0).ref.forward(ids, keep_dtype=True)
    base = LoraLoss(path, {}, 8.0).ref.forward(ids, keep_dtype=True)
    got = np.concatenate(got)
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    moved = np.max(np.abs(want - base)) / np.max(np.abs(want))
    print(f"adapter forward: err {err:.2e}, the adapter moves logits by {moved:.2e}")
    assert err < FORWARD_TOL and moved > 100 * FORWARD_TOL


def _adapter_round_trip(device, spec: str, tmp_path, reference: bool = True) -> tuple:
    """An adapter of the default targets at rank 4 (random A and B, B off zero) on the synthetic `spec` file, written
    as training writes it and read back by lab.format.adapter onto the engine (lab.host.loading.attach_lora):
    (the file's tensor names, the logits with it before, after the round trip, and the float64 reference's with
    W + (alpha / r) B A from gguf-py's reading of the file, and without: None, None without `reference`), over a
    prefill of 8 and 3 decode steps."""
    path = synthetic(spec)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, 49152, 11)]
    engine = gradcheck.open_engine(path, len(ids), device=device, logits_all=True)

    def logits() -> np.ndarray:             # a prefill of 8, then three decode steps
        V = engine.cfg.n_vocab
        engine.step(ids[:8], 0)
        rows = [np.frombuffer(device.read_sync(engine.scratch.logits, 0, 4 * 8 * V), np.float32).reshape(8, V)]
        for j in range(8, len(ids)):
            engine.step([ids[j]], j)
            rows.append(np.frombuffer(device.read_sync(engine.scratch.logits, 0, 4 * V), np.float32)[None])
        return np.concatenate(rows)

    out = tmp_path / f"{spec}.lora.gguf"
    try:
        tr = Trainer(engine, T=8, rank=4, alpha=8.0, seed=7)
        try:
            device.write(tr.lora.params, gradcheck.random_params(tr.lora, 7))
            adapted = logits()
            out.write_bytes(asyncio.run(tr.adapter_bytes()))
        finally:
            tr.close()
        from lab.host.loading import attach_lora
        attach_lora(engine, str(out))
        again = logits()
    finally:
        engine.close()
    from gguf import GGUFReader
    names = {t.name for t in GGUFReader(str(out)).tensors}
    if not reference:
        return names, adapted, again, None, None
    ref = LoraLoss(path, {}, 8.0).ref
    base = ref.forward(ids, keep_dtype=True)
    from lab.host.reference import lora as ref_lora
    ref_lora.apply(ref, out)
    return names, adapted, again, ref.forward(ids, keep_dtype=True), base


def test_an_lfm2_adapter_file_has_llama_cpps_names_and_its_function(device, tmp_path):
    """An lfm2 adapter of the default targets: its pairs under llama.cpp's tensor names (the short-conv blocks'
    `blk.N.shortconv.in_proj.weight.lora_a` ..., llama.cpp's LLM_TENSOR_SHORTCONV_INPROJ / _OUTPROJ, both multiplied
    through build_lora_mm in src/models/lfm2.cpp), read back onto a fresh engine with the same logits bit for bit
    (prefill and decode), and those logits the float64 reference's with the merged weights. llama.cpp's logits with such an
    adapter: tests/engine/test_lora_engine.py on tests/fixtures/lora-lfm2."""
    names, adapted, again, want, base = _adapter_round_trip(device, "lfm2", tmp_path)
    cfg = validate(gguf.read_file(synthetic("lfm2")))[0]
    conv = [il for il in range(cfg.n_layer) if cfg.is_conv(il)]
    assert conv and {f"blk.{il}.shortconv.{p}.weight.lora_{h}" for il in conv for p in ("in_proj", "out_proj")
                     for h in "ab"} <= names
    assert not any("shortconv.conv" in n for n in names)
    assert np.array_equal(again, adapted)
    err = np.max(np.abs(adapted - want)) / np.max(np.abs(want))
    moved = np.max(np.abs(want - base)) / np.max(np.abs(want))
    print(f"lfm2 adapter: {len(names)} tensors, forward err {err:.2e}, the adapter moves logits by {moved:.2e}")
    assert err < FORWARD_TOL and moved > 100 * FORWARD_TOL


@pytest.mark.parametrize("reference", [False, pytest.param(True, marks=SLOW)])
def test_a_qwen35_adapter_file_has_llama_cpps_names_and_its_function(device, tmp_path, reference):
    """A qwen35 adapter of the default targets: the delta-net layers' pairs under the file's own tensors (attn_qkv,
    attn_gate and ssm_out, which the engine runs stacked into one in-projection row [q k v | z | beta | alpha] or
    alone; llama.cpp multiplies each through build_lora_mm in src/models/qwen35.cpp), none on the conv kernel; the
    attention layers' attn_q whole (each head's [q | gate] rows, which the engine's row holds apart: two pieces of B a
    head). Read back by lab.format.adapter onto the engine with the same logits bit for bit (prefill and decode);
    with --slow those logits against the float64 reference's with the merged weights (its file's reading costs
    seconds; by default the adapter's function in prefill is held by test_qwen35_delta_net_lora's loss)."""
    names, adapted, again, want, base = _adapter_round_trip(device, "qwen35", tmp_path, reference)
    cfg = validate(gguf.read_file(synthetic("qwen35")))[0]
    delta = [il for il in range(cfg.n_layer) if cfg.is_delta(il)]
    attn = [il for il in range(cfg.n_layer) if not cfg.is_delta(il)]
    assert delta and attn
    assert {f"blk.{il}.{p}.weight.lora_{h}" for il in delta for p in ("attn_qkv", "attn_gate", "ssm_out")
            for h in "ab"} <= names
    assert {f"blk.{il}.attn_q.weight.lora_{h}" for il in attn for h in "ab"} <= names
    assert not any(k in n for n in names for k in ("ssm_conv1d", "ssm_beta", "ssm_alpha", "#"))
    assert np.array_equal(again, adapted)
    if not reference:
        return
    err = np.max(np.abs(adapted - want)) / np.max(np.abs(want))
    moved = np.max(np.abs(want - base)) / np.max(np.abs(want))
    print(f"qwen35 adapter: {len(names)} tensors, forward err {err:.2e}, the adapter moves logits by {moved:.2e}")
    assert err < FORWARD_TOL and moved > 100 * FORWARD_TOL


def test_qwen35_delta_net_lora(device):
    """qwen35's gated delta-net layer's five projections adapted (attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out;
    beta's and alpha's named: not default targets) and the gated attention's attn_q, on a window of 20 tokens (two
    chunks of the recurrence's backward: lab.ops.backward_deltanet CHUNK): every gradient of the step taken, the
    central differences of layer 0's attn_qkv (the recurrence's q k v through the conv) and ssm_alpha (the decay's)
    and layer 2's attn_q (the gate's rows, two pieces of B a head) alone; the whole check with --slow (above)."""
    only = ("blk.0.attn_qkv", "blk.0.ssm_alpha", "blk.2.attn_q")
    r = check(device, "qwen35", T=20, samples=1, only=only,
              targets=("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out", "attn_q"))
    names = {row["tensor"] for row in r["tensors"]}
    worst = sorted(r["tensors"], key=lambda row: -row["worst_rel_err"])[:3]
    print(f"qwen35 delta-net LoRA: loss {r['loss_gpu']:.6f} vs {r['loss_float64']:.6f}, {len(names)} tensors, "
          f"worst {worst}")
    assert names == {f"{o}.weight.lora_{h}" for o in only for h in "ab"}
    assert r["loss_rel_err"] < 1e-5 and r["ok"], worst


@pytest.mark.parametrize("spec,words", [("gemma4", "per-layer inputs"), ("mixtral", "routed experts"),
                                        ("lfm2moe", "routed experts")])
def test_models_without_a_backward_are_refused(spec, words):
    cfg, _ = validate(gguf.read_file(synthetic(spec)))
    reason = backward.untrainable(cfg)
    assert words in reason and "lfm2 and qwen35 have one" in reason


def test_the_hybrids_train():
    """lfm2's short-conv layers and qwen35's gated delta-net and gated attention layers have their backward: nothing
    refuses them (the gradients: above)."""
    lfm2, qwen35 = (validate(gguf.read_file(synthetic(s)))[0] for s in ("lfm2", "qwen35"))
    assert any(lfm2.is_conv(il) for il in range(lfm2.n_layer)) and backward.untrainable(lfm2) is None
    assert any(map(qwen35.is_delta, range(qwen35.n_layer))) and qwen35.attn_gate
    assert backward.untrainable(qwen35) is None


def test_refusals(device):
    path = synthetic("llama3")
    header = gguf.read_file(path)
    cfg, _ = validate(header)
    eng = Engine(device, header, cfg, n_ctx=16, max_batch=8, kv="f16",
                 host_values=read_host_values(path, header, cfg))
    try:
        with pytest.raises(TrainError, match="KV cache is f16"):
            Trainer(eng, T=8)
    finally:
        eng.close()
    eng = gradcheck.open_engine(path, 8, device=device)
    try:
        with pytest.raises(TrainError, match="from 2 to 8"):
            Trainer(eng, T=9)
        with pytest.raises(LoraError, match="rank 300 is larger than blk.0.attn_q.weight"):
            Trainer(eng, T=8, rank=300)
        with pytest.raises(LoraError, match="ffn_nothing"):
            Trainer(eng, T=8, targets=("ffn_nothing",))
        tr = Trainer(eng, T=8)
        with pytest.raises(TrainError, match="1 windows of 8 tokens"):
            asyncio.run(tr.gradients([[1] * 7]))
        with pytest.raises(TrainError, match="outside the vocabulary"):
            asyncio.run(tr.gradients([[cfg.n_vocab] * 8]))
        tr.close()
        assert eng.lora is None
    finally:
        eng.close()


def test_windows_and_batches():
    toks = list(range(10))
    assert windows(toks, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert batch_of(windows(toks, 4), 1, 3) == [[4, 5, 6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TrainError, match="3 tokens, fewer than one window of 4"):
        windows([1, 2, 3], 4)
    with pytest.raises(TrainError, match="at least 2"):
        windows(toks, 1)


def test_a_runs_pieces_name_the_files_rows():
    """lab.ops.weights.run_pieces (LoRA's members, the full fine-tune's write-back and gradients): qwen35's gated
    attention row [q heads | k | v | gate heads] holds attn_q's [q | gate] rows a head apart, two pieces a head;
    phi3's fused attn_qkv, three views in the file's order, one piece; a delta-net layer's four tensors one each."""
    from lab.format.model import from_gguf, tensor_views
    from lab.ops.weights import Piece, run_pieces
    for spec in ("qwen35", "phi3"):
        header = gguf.read_file(synthetic(spec))
        cfg = from_gguf(header)
        views = tensor_views(cfg, {t.name: t for t in header.tensors})
        starts = {t.offset: t.name for t in header.tensors}
        if spec == "phi3":
            run = "+".join(f"blk.0.attn_{p}.weight" for p in "qkv")
            assert run_pieces(run, views, starts) == [Piece("blk.0.attn_qkv.weight", 0, 0, cfg.q_dim + 2 * cfg.kv_dim)]
            continue
        b, H, hd, kv = "blk.2.", cfg.n_head, cfg.head_dim, cfg.kv_dim
        run = "+".join([*(f"{b}attn_q.weight#q{h}" for h in range(H)), b + "attn_k.weight", b + "attn_v.weight",
                        *(f"{b}attn_q.weight#g{h}" for h in range(H))])
        q = b + "attn_q.weight"
        assert run_pieces(run, views, starts) == [
            *(Piece(q, h * hd, 2 * h * hd, hd) for h in range(H)), Piece(b + "attn_k.weight", H * hd, 0, kv),
            Piece(b + "attn_v.weight", H * hd + kv, 0, kv),
            *(Piece(q, H * hd + 2 * kv + h * hd, (2 * h + 1) * hd, hd) for h in range(H))]
        run = "+".join(f"blk.0.{n}.weight" for n in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"))
        assert [(p.tensor, p.row, p.at) for p in run_pieces(run, views, starts)] == [
            ("blk.0.attn_qkv.weight", 0, 0), ("blk.0.attn_gate.weight", cfg.conv_channels, 0),
            ("blk.0.ssm_beta.weight", cfg.conv_channels + cfg.ssm_inner, 0),
            ("blk.0.ssm_alpha.weight", cfg.conv_channels + cfg.ssm_inner + cfg.ssm_v_heads, 0)]
