"""The synthetic mixture-of-experts files (lab.host.synthetic.arch's NOT_RUN_SPECS: qwen3moe, a Mixtral-style llama,
lfm2moe) have the layout llama.cpp's loaders create, and the lab refuses them by name until the engine runs them
(issue #48).

The layout is held to constants written here from the llama.cpp that llama-cpp-python 0.3.36 vendors (the one that
made their fixtures), not from lab.host.synthetic.moe, so that a drift of the builder fails here:
- the tensors of each block (src/models/qwen3moe.cpp, llama.cpp, lfm2moe.cpp: load_arch_tensors, create_tensor with no
  TENSOR_NOT_REQUIRED, llama's ffn_gate_exps aside, which the files hold);
- the experts' shapes in ggml order (the same functions): router {n_embd, n_expert}, gate and up
  {n_embd, n_ff_exp, n_expert}, down {n_ff_exp, n_embd, n_expert}, exp_probs_b.bias {n_expert};
- the keys (src/llama-arch.cpp LLM_KV_NAMES; read by llama_model::load_hparams in src/llama-model.cpp and by each
  loader's load_arch_hparams): expert_count, expert_used_count, expert_feed_forward_length (qwen3moe, lfm2moe),
  leading_dense_block_count and expert_gating_func (lfm2moe, whose converter writes 2, sigmoid).
Each file is also the one its llama.cpp fixture was made on (its sha256), so the fixtures, skipped by
tests/engine/test_architectures.py until the engine runs these files, cannot drift from the builder meanwhile.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from lab.engine.load import validate
from lab.format import gguf, model
from lab.format.checks import ModelError
from lab.format.ggml import type_name
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from tests.conftest import FIXTURES, NOT_RUN_SPECS

ATTENTION = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"}
QK_NORMS = {"attn_q_norm.weight", "attn_k_norm.weight"}
SHORTCONV = {"attn_norm.weight", "shortconv.conv.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight"}
DENSE_FFN = {"ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}
ROUTED_FFN = {"ffn_norm.weight", "ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_down_exps.weight",
              "ffn_up_exps.weight"}
# (general.architecture, the tensors outside blocks, the keys sizing the experts, each block's tensors by layer)
LLAMA_CPP = {
    "qwen3moe": ("qwen3moe", {"token_embd.weight", "output_norm.weight", "output.weight"},
                 ("expert_count", "expert_used_count", "expert_feed_forward_length"),
                 lambda il: ATTENTION | QK_NORMS | ROUTED_FFN),
    "mixtral": ("llama", {"token_embd.weight", "output_norm.weight", "output.weight"},
                ("expert_count", "expert_used_count"),
                lambda il: ATTENTION | ROUTED_FFN),
    # layers 2 and 5 attend (head_count_kv 2), the others are short-conv blocks; the first 2 are dense
    "lfm2moe": ("lfm2moe", {"token_embd.weight", "token_embd_norm.weight"},
                ("expert_count", "expert_used_count", "expert_feed_forward_length", "leading_dense_block_count",
                 "expert_gating_func"),
                lambda il: (ATTENTION | QK_NORMS if il in (2, 5) else SHORTCONV)
                | (DENSE_FFN if il < 2 else ROUTED_FFN | {"exp_probs_b.bias"})),
}
# The refusal each file meets (lab.format.model's reasons): by its router for an architecture with no reason of its
# own, by its name for one refused by name (lab.format.arches: lfm2's refused_variants)
REFUSAL = {
    "qwen3moe": r"^tensor blk\.0\.ffn_gate_inp\.weight: a mixture-of-experts model: its routed expert FFNs",
    "mixtral": r"^tensor blk\.0\.ffn_gate_inp\.weight: a mixture-of-experts model: its routed expert FFNs",
    "lfm2moe": r"^general\.architecture = 'lfm2moe': LFM2's mixture-of-experts variant \(LFM2-8B-A1B\)",
}


def test_the_refused_specs_are_the_moe_files():
    assert set(NOT_RUN_SPECS) == set(LLAMA_CPP) == set(REFUSAL)
    assert all(synthetic_arch.SPECS[name].moe and "#48" in synthetic_arch.SPECS[name].not_run for name in NOT_RUN_SPECS)


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """spec -> its F32 file as the builder makes it now (not the cached one: a drift of the builder must show here),
    made once for the module (4-6 s a file)."""
    made = {}

    def path(spec: str):
        if spec not in made:
            made[spec] = synthetic_arch.build(spec, "f32", tmp_path_factory.mktemp(spec), force=True)
        return made[spec]
    return path


@pytest.mark.parametrize("spec", NOT_RUN_SPECS)
def test_the_layout_is_llama_cpps(spec, fresh):
    arch, outside, moe_keys, block = LLAMA_CPP[spec]
    s = synthetic_arch.SPECS[spec]
    h = gguf.read_file(fresh(spec))
    md, shapes = h.metadata, {t.name: t.shape for t in h.tensors}
    assert md["general.architecture"] == arch
    # the experts' keys, and nothing of an expert that llama.cpp would read beyond them
    a = arch + "."
    want = {"expert_count": s.moe.n_expert, "expert_used_count": s.moe.n_expert_used,
            "expert_feed_forward_length": s.moe.n_ff_exp, "leading_dense_block_count": s.moe.n_dense_lead,
            "expert_gating_func": s.moe.gating}
    assert {k: md[a + k] for k in moe_keys} == {k: want[k] for k in moe_keys}
    assert {k.removeprefix(a) for k in md if "expert" in k or "dense_block" in k} == set(moe_keys)
    n_layer, n_embd, n_expert = md[a + "block_count"], md[a + "embedding_length"], md[a + "expert_count"]
    n_ff_exp = md.get(a + "expert_feed_forward_length", md[a + "feed_forward_length"])   # llama: n_ff
    assert n_expert == 8 and md[a + "expert_used_count"] == 2 and n_ff_exp == 512 != n_embd
    # every tensor llama.cpp's loader creates, and no other
    names = {n for n in shapes if not n.startswith("blk.")}
    assert names == outside
    for il in range(n_layer):
        assert {n.split(".", 2)[2] for n in shapes if n.startswith(f"blk.{il}.")} == block(il), il
    # the experts' shapes, ggml order
    routed = [il for il in range(n_layer) if f"blk.{il}.ffn_gate_inp.weight" in shapes]
    assert routed == [il for il in range(n_layer) if il >= md.get(a + "leading_dense_block_count", 0)]
    for il in routed:
        b = f"blk.{il}."
        assert shapes[b + "ffn_gate_inp.weight"] == (n_embd, n_expert)
        assert shapes[b + "ffn_gate_exps.weight"] == shapes[b + "ffn_up_exps.weight"] == (n_embd, n_ff_exp, n_expert)
        assert shapes[b + "ffn_down_exps.weight"] == (n_ff_exp, n_embd, n_expert)
        if b + "exp_probs_b.bias" in shapes:
            assert shapes[b + "exp_probs_b.bias"] == (n_expert,)


@pytest.mark.parametrize("spec", NOT_RUN_SPECS)
def test_the_lab_refuses_the_file_by_its_experts(spec, fresh):
    h = gguf.read_file(fresh(spec))
    with pytest.raises(ModelError, match=REFUSAL[spec]) as e:
        model.from_gguf(h)
    assert "mixture-of-experts" in str(e.value)
    with pytest.raises(ModelError, match=REFUSAL[spec]):
        validate(h)                                 # a load's one check (lab.engine.load) says the same


@pytest.mark.parametrize("spec", NOT_RUN_SPECS)
def test_the_quantized_mix_keeps_the_router_f32(spec):
    """llama.cpp's quantizer never quantizes ffn_gate_inp (tensor_allows_quantization in src/llama-quant.cpp) and gives
    an expert tensor its dense counterpart's category (tensor_get_category: "ffn_down" in ffn_down_exps): in the
    Q4_K_M-like mix (lab.host.synthetic.arch.MIXES) the router stays F32, gate and up experts are Q4_K as ffn_gate and
    ffn_up, down experts Q6_K on the first and last layers as ffn_down, Q4_K between. On the cached file the fixture
    was made on (its sha256)."""
    path = synthetic_arch.build(spec, "q4_k_m", cache_dir() / "synthetic")
    assert sha256(path) == json.loads((FIXTURES / "arch" / f"{spec}-q4_k_m.json").read_text())["meta"]["file_sha256"]
    h = gguf.read_file(path)
    types = {t.name: type_name(t.type_id) for t in h.tensors}
    n_layer = h.metadata[h.metadata["general.architecture"] + ".block_count"]
    routed = sorted(int(n.split(".")[1]) for n in types if n.endswith("ffn_gate_inp.weight"))
    for il in routed:
        b = f"blk.{il}."
        assert types[b + "ffn_gate_inp.weight"] == "F32"
        assert types[b + "ffn_gate_exps.weight"] == types[b + "ffn_up_exps.weight"] == "Q4_K"
        assert types[b + "ffn_down_exps.weight"] == ("Q6_K" if il in (0, n_layer - 1) else "Q4_K")


@pytest.mark.parametrize("spec", NOT_RUN_SPECS)
def test_the_f32_file_is_its_fixtures(spec, fresh):
    """The builder still makes the file llama.cpp's fixture was made on, and the fixture holds the router's choices
    for every routed layer and prompt position."""
    fx = json.loads((FIXTURES / "arch" / f"{spec}-f32.json").read_text())
    assert sha256(fresh(spec)) == fx["meta"]["file_sha256"], "the synthetic builder no longer makes the fixture's file"
    r, s = fx["router"], synthetic_arch.SPECS[spec]
    assert r["layers"] == [il for il in range(s.n_layer) if s.moe.routed(il)]
    t = len(fx["prompt_ids"])
    for experts, weights, margin in zip(r["experts"], r["weights"], r["margin"]):
        assert len(experts) == len(weights) == len(margin) == t
        assert all(len(set(e)) == s.moe.n_expert_used and all(0 <= x < s.moe.n_expert for x in e) for e in experts)
        assert all(abs(sum(w) - 1) < 1e-4 for w in weights) and min(margin) > 0
