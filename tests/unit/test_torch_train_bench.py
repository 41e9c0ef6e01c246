"""scripts/torch_train_bench.py, the PyTorch peer of `lab train`, computes the lab's function: its logits against the
float64 numpy oracle (lab.host.reference.forward), its loss and LoRA gradients against the float64 LoRA oracle
(lab.host.reference.training.LoraLoss and its central differences), its adapter's start against lab.engine.lora's, and
one short training run end to end. Skipped where torch is not installed (the repo's own environment has none: run it
with a venv that has torch, numpy, gguf and pytest, PYTHONPATH at the repo)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from lab.host.models import cache_dir  # noqa: E402
from lab.host.reference.forward import Reference  # noqa: E402
from lab.host.reference.training import LoraLoss  # noqa: E402
from lab.host.synthetic import arch as synthetic_arch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_train_bench", ROOT / "scripts" / "torch_train_bench.py")
tb = importlib.util.module_from_spec(_spec)
sys.modules["torch_train_bench"] = tb
_spec.loader.exec_module(tb)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def llama3() -> Path:
    """The synthetic Llama 3 file: 4 layers of 256, 4 query heads over 2 KV heads of 64, rope_freqs, tied head."""
    return synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")


def _tiny_qwen2(path: Path) -> Path:
    """A qwen2 GGUF made here: Q/K/V biases (large enough to matter), an untied head, NEOX RoPE on 32 of 64 dims with
    linear scaling (freq_scale 1/2), GQA 4:2, a vocabulary of 300 (no tokenizer: the forward needs none)."""
    import gguf
    rng = np.random.default_rng(7)
    n_embd, n_head, n_kv, hd, n_ff, n_vocab, n_layer = 256, 4, 2, 64, 512, 300, 2
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(n_layer)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(32)
    w.add_rope_freq_base(1000000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(2.0)
    w.add_layer_norm_rms_eps(1e-6)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    for il in range(n_layer):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))
        w.add_tensor(b + "attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(b + "attn_q.bias", (0.5 * rng.standard_normal(n_head * hd)).astype(np.float32))
        w.add_tensor(b + "attn_k.weight", mat(n_kv * hd, n_embd))
        w.add_tensor(b + "attn_k.bias", (0.5 * rng.standard_normal(n_kv * hd)).astype(np.float32))
        w.add_tensor(b + "attn_v.weight", mat(n_kv * hd, n_embd))
        w.add_tensor(b + "attn_v.bias", (0.5 * rng.standard_normal(n_kv * hd)).astype(np.float32))
        w.add_tensor(b + "attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(b + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))
        w.add_tensor(b + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(b + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(b + "ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return _tiny_qwen2(tmp_path_factory.mktemp("qwen2") / "tiny-qwen2.gguf")


def _windows(n_vocab: int, n: int, T: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.integers(0, n_vocab, T)] for _ in range(n)]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference relative to the largest magnitude of the oracle's tensor."""
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("which", ["llama3", "qwen2"])
def test_forward_matches_the_float64_oracle(which, request):
    path = request.getfixturevalue(which)
    ref = Reference(path, dtype=np.float64)
    wins = _windows(ref.hp.n_vocab, 2, 24, seed=1)
    want = np.stack([ref.forward(w, keep_dtype=True) for w in wins])          # [2, T, n_vocab] float64
    # measured: float32 1.2e-6 (llama3), 4.3e-7 (qwen2); float64 3.2e-15
    for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-10)):
        m = tb.load_model(path, CPU, dtype)
        got = tb.forward(m, wins).numpy()                                     # both windows in one batch
        assert got.shape == want.shape
        err = _rel(got, want)
        print(f"{which} {dtype}: logits max |diff| / max |logit| = {err:.2e}")
        assert err < tol, (which, dtype, err)
        m.sdpa = True                                                         # the fused attention: the same function
        err = _rel(tb.forward(m, wins).numpy(), want)
        print(f"{which} {dtype} sdpa: {err:.2e}")
        assert err < tol, (which, dtype, "sdpa", err)


def test_rope_is_the_oracles(llama3):
    """Each mode, with and without a partial rotation and frequency factors, against ops.rope in float64."""
    from lab.host.reference import ops
    m = tb.load_model(llama3, CPU, torch.float64)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 3, 64))
    for mode in ("norm", "neox"):
        for n_rot in (64, 32):
            m.hp.n_rot, m._rope = n_rot, {}
            factors = m.hp.rope_factors if n_rot == 64 else None
            m.hp.rope_factors = factors
            cos, sin = tb.rope_tables(m, 9)
            got = tb.rope(torch.from_numpy(x)[None], cos, sin, n_rot, mode)[0].numpy()
            want = ops.rope(x, np.arange(9), n_rot, m.hp.rope_base, mode, m.hp.rope_scale, factors)
            assert np.max(np.abs(got - want)) < 1e-12, (mode, n_rot)


def test_adapter_starts_as_the_labs(llama3):
    """add_lora's A (and zero B) are the values lab.engine.lora.Lora.initial(seed) writes for the same targets."""
    from lab.engine.lora import DEFAULT_TARGETS, Lora, choose
    from lab.host.loading import read_model

    class NoDevice:
        def buffer(self, *args):
            return None

    header, cfg, _ = read_model(str(llama3))
    lab = Lora(NoDevice(), choose({t.name: t for t in header.tensors}, cfg.n_layer, DEFAULT_TARGETS, 4), 8.0, 16)
    want = np.frombuffer(lab.initial(5), np.float32)
    m = tb.load_model(llama3, CPU)
    pairs = tb.add_lora(m, 4, 8.0, seed=5)
    assert list(pairs) == list(lab.targets)
    got = np.concatenate([np.concatenate([a.detach().numpy().ravel(), b.detach().numpy().ravel()])
                          for a, b in pairs.values()])
    assert np.array_equal(got, want)
    assert m.scale == 2.0 and sum(p.numel() for p in m.params()) == lab.n_params


def test_loss_and_lora_gradients_match_the_float64_oracle(llama3):
    """A random nonzero B (so that every A has a gradient too): the loss against LoraLoss's, and the gradients of the
    largest entries of A and B in a few matrices against its float64 central differences."""
    rank, alpha = 4, 8.0
    m64 = tb.load_model(llama3, CPU, torch.float64)
    tb.add_lora(m64, rank, alpha, seed=0)
    rng = np.random.default_rng(11)
    pairs = {n: (a.detach().numpy().copy(), 0.05 * rng.standard_normal(tuple(b.shape)))
             for n, (a, b) in m64.lora.items()}
    tb.set_lora(m64, pairs, alpha)
    m32 = tb.load_model(llama3, CPU, torch.float32)
    tb.set_lora(m32, pairs, alpha)
    oracle = LoraLoss(llama3, pairs, alpha)
    wins = _windows(m64.hp.n_vocab, 2, 12, seed=2)

    want = oracle.loss(wins)
    loss64, g64 = tb.loss_and_grads(m64, wins)
    loss32, g32 = tb.loss_and_grads(m32, wins)
    print(f"loss: oracle {want:.12f}, torch float64 {loss64:.12f} ({abs(loss64 - want) / want:.1e}), "
          f"float32 {loss32:.8f} ({abs(loss32 - want) / want:.1e})")
    assert abs(loss64 - want) / want < 1e-12      # measured 0
    assert abs(loss32 - want) / want < 1e-6       # measured 1.3e-7

    worst64 = worst32 = 0.0
    for name, which in (("blk.0.attn_q.weight", "A"), ("blk.0.attn_v.weight", "B"), ("blk.1.attn_k.weight", "A"),
                        ("blk.2.ffn_down.weight", "B"), ("blk.3.attn_output.weight", "A"),
                        ("blk.3.ffn_gate.weight", "B")):
        k = 0 if which == "A" else 1
        g = g64[name][k]
        idx = np.unravel_index(int(np.argmax(np.abs(g))), g.shape)
        fd = oracle.central(wins, name, which, idx, 1e-5)
        e64 = abs(g[idx] - fd) / abs(fd)
        # float32: relative to the tensor's largest gradient (a float32 sum's rounding is of its terms' size)
        e32 = abs(g32[name][k][idx] - fd) / np.max(np.abs(g))
        worst64, worst32 = max(worst64, e64), max(worst32, e32)
        print(f"{name} {which}{idx}: central {fd:+.10e}, torch float64 {g[idx]:+.10e} ({e64:.1e}), "
              f"float32 {g32[name][k][idx]:+.8e} ({e32:.1e})")
        # the whole tensor, float32 against float64 torch
        whole = _rel(g32[name][k], g)
        print(f"    the whole d{which}, float32 against float64: {whole:.1e}")
        assert whole < 1e-4, name
    assert worst64 < 1e-6, worst64       # measured <= 2.6e-9 (the central differences' own error)
    assert worst32 < 1e-4, worst32       # measured <= 1.4e-6


def test_refuses_other_architectures(tmp_path):
    import gguf
    p = tmp_path / "gemma2.gguf"
    w = gguf.GGUFWriter(str(p), "gemma2")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(tb.Refused, match="'gemma2' is not run here"):
        tb.load_model(p, CPU)


def test_main_trains_and_reports(llama3, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    rc = tb.main([str(llama3), "--data", str(text), "--ctx", "16", "--batch", "2", "--rank", "4", "--alpha", "8",
                  "--steps", "4", "--warmup-steps", "1", "--lr", "1e-2", "--seed", "0", "--device", "cpu"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["peer"] == "torch-eager" and out["device"] == "cpu" and out["T"] == 16 and out["batch"] == 2
    assert len(out["losses"]) == 4 and all(np.isfinite(out["losses"]))
    assert out["tokens_per_s"] > 0 and out["step_ms"] > 0 and out["peak_mem_bytes"] > 0
    assert out["params"] == 4 * 4 * sum(n_in + n_out for n_in, n_out in
                                        [(256, 256), (256, 128), (256, 128), (256, 256), (256, 512), (256, 512),
                                         (512, 256)])
    # step 1's loss is the base model's (B starts at zero) on windows 0 and 1, as the oracle gives it
    from lab.host.loading import read_model
    from lab.instruments.training import batch_of, windows
    _, _, tok = read_model(str(llama3))
    wins = windows(tok.encode(text.read_text(encoding="utf-8")), 16)
    base = LoraLoss(llama3, {}, 8.0).loss(batch_of(wins, 0, 2))
    assert abs(out["losses"][0] - base) / base < 1e-6
    assert out["losses"][-1] < out["losses"][0]


def test_full_gradients_match_the_float64_oracle(llama3):
    """--full: every tensor a parameter; the largest gradient entry of a matrix, a norm and the tied embedding table
    (the head's share and the embedding's together) against lab.host.reference.training.ModelLoss's central
    differences, in float64."""
    from lab.host.reference.training import ModelLoss
    m64 = tb.load_model(llama3, CPU, torch.float64)
    tb.make_full(m64)
    assert len(m64.params()) == len(m64.w) and all(p.requires_grad for p in m64.params())
    wins = _windows(m64.hp.n_vocab, 1, 8, seed=3)
    ids = torch.tensor(wins, dtype=torch.long)
    loss = tb.loss_of(m64, ids)
    loss.backward()
    oracle = ModelLoss(llama3)
    want = oracle.loss(wins)
    assert abs(loss.item() - want) / want < 1e-12
    worst = 0.0
    for name in ("blk.1.ffn_down.weight", "blk.2.attn_norm.weight", "output_norm.weight", "token_embd.weight"):
        g = m64.w[name].grad.numpy()
        idx = np.unravel_index(int(np.argmax(np.abs(g))), g.shape)
        fd = oracle.central(wins, name, idx, 1e-5)
        worst = max(worst, abs(g[idx] - fd) / abs(fd))
        print(f"{name}{idx}: central {fd:+.10e}, torch {g[idx]:+.10e}")
    assert worst < 1e-6, worst


def test_full_refuses_biases(tmp_path):
    m = tb.load_model(_tiny_qwen2(tmp_path / "q.gguf"), CPU)
    with pytest.raises(tb.Refused, match="--full: qwen2 is refused"):
        tb.make_full(m)
