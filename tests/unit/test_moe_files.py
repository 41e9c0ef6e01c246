"""The synthetic mixture-of-experts files (lab.host.synthetic.arch's MOE_SPECS: qwen3moe, a Mixtral-style llama,
lfm2moe) have the layout llama.cpp's loaders create, and the lab reads them as llama.cpp does (docs/moe.md): the
experts' sizes, the routed layers, the gating and the selection bias; a file that says something else of its experts
is refused by name.

The layout is held to constants written here from the llama.cpp that llama-cpp-python 0.3.36 vendors (the one that
made their fixtures), not from lab.host.synthetic.moe, so that a drift of the builder fails here:
- the tensors of each block (src/models/qwen3moe.cpp, llama.cpp, lfm2moe.cpp: load_arch_tensors, create_tensor with no
  TENSOR_NOT_REQUIRED, llama's ffn_gate_exps aside, which the files hold);
- the experts' shapes in ggml order (the same functions): router {n_embd, n_expert}, gate and up
  {n_embd, n_ff_exp, n_expert}, down {n_ff_exp, n_embd, n_expert}, exp_probs_b.bias {n_expert};
- the keys (src/llama-arch.cpp LLM_KV_NAMES; read by llama_model::load_hparams in src/llama-model.cpp and by each
  loader's load_arch_hparams): expert_count, expert_used_count, expert_feed_forward_length (qwen3moe, lfm2moe),
  leading_dense_block_count and expert_gating_func (lfm2moe, whose converter writes 2, sigmoid).
Each file is also the one its llama.cpp fixture was made on (its sha256), so the fixtures that
tests/engine/test_architectures.py holds the engine to cannot drift from the builder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from lab.engine import budget
from lab.engine.load import validate
from lab.format import gguf, model
from lab.format.checks import ModelError
from lab.format.ggml import type_name
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from tests.conftest import FIXTURES, MOE_SPECS

LIMITS = {"max_buffer_size": 1 << 28, "max_storage_buffer_binding_size": 1 << 27}   # WebGPU's defaults

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
# What llama.cpp's graph does with each (build_moe_ffn's arguments: src/models/qwen3moe.cpp, llama.cpp, lfm2.cpp): the
# gating function, and whether the file's exp_probs_b chooses
GRAPH = {"qwen3moe": ("softmax", False), "mixtral": ("softmax", False), "lfm2moe": ("sigmoid", True)}


def test_the_moe_specs_are_the_moe_files():
    assert set(MOE_SPECS) == set(LLAMA_CPP) == set(GRAPH)
    assert not any(synthetic_arch.SPECS[name].not_run for name in MOE_SPECS)


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


@pytest.mark.parametrize("spec", MOE_SPECS)
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


@pytest.mark.parametrize("spec", MOE_SPECS)
def test_the_lab_reads_the_experts(spec, fresh):
    """The Config llama.cpp's loader and graph make of the file: the experts' count, a token's count and width, the
    routed layers (after the dense leading ones), the gating function and the selection bias; a load's one check
    (lab.engine.load.validate) passes."""
    s, (gating, bias) = synthetic_arch.SPECS[spec], GRAPH[spec]
    h = gguf.read_file(fresh(spec))
    cfg = model.from_gguf(h)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp) == (8, 2, 512)
    assert cfg.routed_layers == tuple(il for il in range(s.n_layer) if s.moe.routed(il))
    assert (cfg.gating, cfg.probs_bias) == (gating, bias)
    t = model.expected_tensors(cfg)
    il = cfg.routed_layers[0]
    assert t[f"blk.{il}.ffn_down_exps.weight"] == (512, 256, 8) and f"blk.{il}.ffn_gate.weight" not in t
    validate(h)
    # the memory budget counts every expert: the card's experts' bytes are the file's expert tensors, all resident
    card = budget.count(LIMITS, h, cfg, 128).card(cfg)["experts"]
    held = sum(x.nbytes for x in h.tensors if "_exps." in x.name)
    assert card == {"n_expert": 8, "n_expert_used": 2, "layers": len(cfg.routed_layers), "bytes": held,
                    "bytes_a_token": held // 4}


def _edited(h, md=None, drop=(), shape=None):
    """h with metadata keys set (None: removed), tensors dropped, one tensor's shape changed ((name, shape))."""
    meta = {k: v for k, v in {**h.metadata, **(md or {})}.items() if v is not None}
    tensors = [dataclasses.replace(t, shape=shape[1]) if shape and t.name == shape[0] else t
               for t in h.tensors if t.name not in drop]
    return dataclasses.replace(h, metadata=meta, tensors=tensors)


@pytest.mark.parametrize("spec,edit,match", [
    ("qwen3moe", {"md": {"qwen3moe.expert_used_count": 9}}, r"qwen3moe.expert_used_count = 9 is more than "
                                                            r"qwen3moe.expert_count = 8"),
    ("qwen3moe", {"md": {"qwen3moe.expert_used_count": None}}, r"qwen3moe.expert_used_count is missing"),
    ("qwen3moe", {"md": {"qwen3moe.expert_count": 0}}, r"tensor blk.0.ffn_gate_inp.weight: a mixture-of-experts "
                                                       r"router, but qwen3moe.expert_count is absent or 0"),
    ("qwen3moe", {"md": {"qwen3moe.expert_count": 2000}}, r"qwen3moe.expert_count = 2000: must be at most 1024"),
    ("qwen3moe", {"md": {"qwen3moe.expert_used_count": 0}}, r"qwen3moe.expert_used_count = 0: must be in 1..64"),
    ("qwen3moe", {"md": {"qwen3moe.expert_gating_func": 2}}, r"qwen3moe.expert_gating_func = 2: llama.cpp's "
                                                             r"qwen3moe graph routes by softmax"),
    ("qwen3moe", {"md": {"qwen3moe.expert_shared_count": 1}}, r"qwen3moe.expert_shared_count = 1: shared experts"),
    ("qwen3moe", {"md": {"qwen3moe.expert_weights_scale": 2.5}}, r"qwen3moe.expert_weights_scale = 2.5"),
    ("qwen3moe", {"md": {"qwen3moe.leading_dense_block_count": 1}}, r"qwen3moe.leading_dense_block_count = 1: "
                                                                    r"llama.cpp routes every layer"),
    # without expert_feed_forward_length, llama.cpp's qwen3moe experts are feed_forward_length / expert_used_count
    # wide: 1024 / 2 = 512, the file's, so the file still loads; with 4 a token they would be 256
    ("qwen3moe", {"md": {"qwen3moe.expert_feed_forward_length": None, "qwen3moe.expert_used_count": 4}},
     r"tensor blk.0.ffn_gate_exps.weight has shape \[256, 512, 8\], expected \[256, 256, 8\] = "
     r"\[n_embd, n_ff_exp, n_expert\] from .*feed_forward_length 1024 / qwen3moe.expert_used_count 4"),
    ("mixtral", {"md": {"llama.expert_feed_forward_length": 256}}, r"llama.expert_feed_forward_length = 256: a llama "
                                                                   r"model's experts are llama.feed_forward_length"),
    ("mixtral", {"drop": ("blk.1.ffn_up_exps.weight",)}, r"tensor blk.1.ffn_up_exps.weight is missing"),
    ("mixtral", {"shape": ("blk.2.ffn_down_exps.weight", (512, 256, 4))},
     r"tensor blk.2.ffn_down_exps.weight has shape \[512, 256, 4\], expected \[512, 256, 8\] = "
     r"\[n_ff_exp, n_embd, n_expert\]"),
    ("lfm2moe", {"md": {"lfm2moe.expert_gating_func": None}}, r"lfm2moe.expert_gating_func is missing"),
    ("lfm2moe", {"md": {"lfm2moe.expert_gating_func": 3}}, r"lfm2moe.expert_gating_func = 3: must be 1 \(softmax\)"),
    ("lfm2moe", {"md": {"lfm2moe.expert_feed_forward_length": None}}, r"lfm2moe.expert_feed_forward_length is "
                                                                      r"missing"),
    ("lfm2moe", {"md": {"lfm2moe.leading_dense_block_count": 7}}, r"lfm2moe.leading_dense_block_count = 7 is more "
                                                                  r"than lfm2moe.block_count = 6"),
    ("lfm2moe", {"drop": ("blk.3.exp_probs_b.bias",)}, r"tensor blk.3.exp_probs_b.bias is missing"),
    # one dense layer fewer: layer 1 then routes, and its dense FFN is refused where experts are missing
    ("lfm2moe", {"md": {"lfm2moe.leading_dense_block_count": 1}}, r"tensor blk.1.ffn_gate_inp.weight is missing"),
])
def test_what_the_lab_refuses_of_experts(spec, edit, match, fresh):
    """Every key of the experts checked for its range and against the others and the tensors; each message names the
    key or tensor."""
    h = _edited(gguf.read_file(fresh(spec)), **edit)
    with pytest.raises(ModelError, match=match):
        model.from_gguf(h)


@pytest.mark.parametrize("spec", MOE_SPECS)
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


@pytest.mark.parametrize("spec", MOE_SPECS)
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
