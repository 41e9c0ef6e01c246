"""The engine on a tiny synthetic llama whose matrices use Q2_K, Q3_K, IQ4_NL and IQ4_XS (and no other
quantized type), run natively and held to the numpy reference (lab/host/reference, which dequantizes with
gguf.quants, independent of wgsl/quant.wgsl) tensor by tensor, logits included.

The file is written here with gguf.GGUFWriter: random but valid blocks (tests/kernels/quant_oracle), shapes
that are whole 256-element super-blocks (n_embd 256, n_ff 512, 4 heads of 64, GQA 2 KV heads), two layers
with different type mixes, so the stacked QKV / gate-up weights split into runs of different types, as
llama.cpp's Q*_K_M mixes make them. The prefill has 37 tokens (the GEMM's 32-token tile plus a partial one);
two decode steps continue from its cache (matvec). TRACE_TOL is test_engine's (float32 summation order,
measured ~2e-5 on the real models): a wrong scale, bit or table entry in one type is O(1) in the first
tensor that reads it, and bisect names that tensor. Three more models, written the same way, hold the later types:
the ternary and 4-bit float types, the grid types, and Q1_0 with Q2_0.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import check_trace, gpu_trace

from lab.engine.engine import Engine
from lab.format import gguf as lab_gguf
from lab.format.ggml import BY_NAME, KERNEL_TYPES
from lab.format.model import ModelError, check_tensors, from_gguf
from lab.host.reference import Reference
from lab.host.reference import quant as qo

N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_VOCAB, N_LAYER = 256, 4, 2, 64, 512, 320, 2
# role -> type in layer 0, layer 1 (the brief's mix: attn_v Q3_K, ffn_down Q2_K, attn_q IQ4_XS, token_embd IQ4_NL)
MIX = {
    "attn_q": ("IQ4_XS", "Q3_K"), "attn_k": ("Q3_K", "IQ4_NL"), "attn_v": ("Q3_K", "Q2_K"),
    "attn_output": ("IQ4_NL", "IQ4_XS"), "ffn_gate": ("Q2_K", "IQ4_XS"), "ffn_up": ("IQ4_XS", "IQ4_XS"),
    "ffn_down": ("Q2_K", "Q3_K"),
}
TOP = {"token_embd": "IQ4_NL", "output": "Q3_K"}
NEW_TYPES = {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"}


def write_model(path, types=None, seed: int = 0, oracle_f32: bool = False):
    """A 2-layer llama GGUF; `types` overrides MIX/TOP entries: {tensor name: type}. oracle_f32: the tensors of the
    types gguf-py cannot dequantize (qo.BIT_TYPES) written as F32, the oracle's dequantization of the same blocks, so
    that the numpy reference (which reads through gguf-py) runs on the very values the kernels must produce."""
    import gguf
    types = types or {}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("synthetic new quants")
    w.add_block_count(N_LAYER)
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    rng = np.random.default_rng(seed)
    n = [0]

    def tensor(name: str, type_name: str, rows: int, cols: int) -> None:
        type_name = types.get(name, type_name)
        n[0] += 1
        if type_name == "F32":
            data = (1.0 + 0.2 * rng.standard_normal((rows, cols))).astype(np.float32)
            w.add_tensor(name, data if rows > 1 else data.reshape(cols))
            return
        if type_name in KERNEL_TYPES:
            raw = qo.random_tensor(type_name, rows, cols, seed=seed * 1000 + n[0])
        else:                       # a type to be refused: only its size matters
            raw = np.zeros((rows, qo.row_bytes(type_name, cols)), np.uint8)
        if oracle_f32 and type_name in qo.BIT_TYPES:
            w.add_tensor(name, qo.dequant(raw, type_name))
        elif type_name in gguf.GGMLQuantizationType.__members__:
            w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[type_name])
        else:                       # a type gguf 0.19 does not know (Q2_0): the blocks with ggml's id and shape
            w.add_tensor(name, raw.view(np.int8), raw_shape=(rows, cols), raw_dtype=BY_NAME[type_name].id)

    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    tensor("token_embd.weight", TOP["token_embd"], N_VOCAB, N_EMBD)
    tensor("output.weight", TOP["output"], N_VOCAB, N_EMBD)
    tensor("output_norm.weight", "F32", 1, N_EMBD)
    shapes = {"attn_q": (q, N_EMBD), "attn_k": (kv, N_EMBD), "attn_v": (kv, N_EMBD), "attn_output": (N_EMBD, q),
              "ffn_gate": (N_FF, N_EMBD), "ffn_up": (N_FF, N_EMBD), "ffn_down": (N_EMBD, N_FF)}
    for il in range(N_LAYER):
        for role, (rows, cols) in shapes.items():
            tensor(f"blk.{il}.{role}.weight", MIX[role][il], rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            tensor(f"blk.{il}.{norm}.weight", "F32", 1, N_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory, device):
    path = write_model(tmp_path_factory.mktemp("newq") / "newq.gguf")
    header = lab_gguf.read_file(path)
    eng = Engine(device, header, n_ctx=64, logits_all=True)
    eng.weights.upload_file(path)
    ref = Reference(path)
    yield header, eng, ref
    eng.close()
    ref.w.drop()


def test_file_uses_exactly_the_new_types(model):
    header, eng, _ = model
    quantized = {t.type.name for t in header.tensors if t.type.name != "F32"}
    assert quantized == NEW_TYPES
    # stacked projections of different types stay separate runs (layer 0's qkv: IQ4_XS, then Q3_K + Q3_K)
    assert [w.type.name for w, _ in eng.weights.stacked["blk.0.qkv"]] == ["IQ4_XS", "Q3_K"]


def test_prefill_and_decode_match_reference(model):
    _, eng, ref = model
    ids = np.random.default_rng(7).integers(0, N_VOCAB, 39).tolist()
    ref.forward(ids[:37], trace=True)
    g = gpu_trace(eng, ids[:37], 0)
    assert g["result_output"].shape == (37, N_VOCAB)
    worst = [check_trace(ref, g, "prefill of 37 tokens")]
    logits_ref = np.asarray(ref.trace["result_output"], np.float64).reshape(37, -1)
    diffs = [np.max(np.abs(g["result_output"] - logits_ref))]
    assert (g["result_output"].argmax(1) == logits_ref.argmax(1)).all()
    for pos in (37, 38):
        ref.forward(ids[pos:pos + 1], start_pos=pos, trace=True)
        g = gpu_trace(eng, ids[pos:pos + 1], pos)
        worst.append(check_trace(ref, g, f"decode at position {pos}"))
        lr = np.asarray(ref.trace["result_output"], np.float64).reshape(-1)
        diffs.append(np.max(np.abs(g["result_output"].reshape(-1) - lr)))
        assert g["result_output"].argmax() == lr.argmax()
    # decode ran the K types' and IQ4_XS's own loops (lab/ops/matmul.py MATVEC_LOOPS)
    labels = {tok for k in eng.kernels._cache.values() for tok in k.label.split()}
    assert {"LOOP=matvec_q2_k.wgsl", "LOOP=matvec_q3_k.wgsl", "LOOP=matvec_iq4_xs.wgsl"} <= labels
    print(f"\nnew quants: worst relative trace error prefill {worst[0]:.2e}, decode {max(worst[1:]):.2e}; "
          f"max |logit diff| {max(diffs):.2e} (logits up to {np.max(np.abs(logits_ref)):.2f})")


def test_decode_with_the_glu_apart(model, device, tmp_path, monkeypatch):
    """Wide FFNs (8B-class) decode with the GLU as its own op before ffn_down (plans.GLU_APART); no real model
    here is that wide, so the threshold is lowered for this tiny one, and decode is held to the reference."""
    from lab.engine import plans
    header, _, ref = model
    monkeypatch.setattr(plans, "GLU_APART", N_FF)
    eng = Engine(device, header, n_ctx=64)
    try:
        eng.weights.upload_file(write_model(tmp_path / "newq.gguf"))     # the same bytes as the fixture's
        assert [op for op in eng.decode.ops if op.kernel.label.startswith("glu:")], "no GLU op in the decode plan"
        ids = np.random.default_rng(8).integers(0, N_VOCAB, 6).tolist()
        ref.forward(ids[:5], trace=True)
        eng.step(ids[:5], 0)
        ref.forward(ids[5:], start_pos=5, trace=True)
        g = gpu_trace(eng, ids[5:], 5)
        check_trace(ref, g, "decode at position 5, GLU apart")
    finally:
        eng.close()


# A second model whose every matrix is TQ1_0, TQ2_0, MXFP4 or NVFP4 (the embedding MXFP4 through get_rows), each in
# several roles, so layer 0's stacked QKV is three runs of different types.
TERNARY_FP4 = {"token_embd.weight": "MXFP4", "output.weight": "NVFP4"}
for _il, _types in enumerate((("TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "TQ2_0", "NVFP4", "TQ1_0"),
                              ("NVFP4", "NVFP4", "TQ1_0", "MXFP4", "TQ1_0", "MXFP4", "TQ2_0"))):
    for _role, _t in zip(MIX, _types):
        TERNARY_FP4[f"blk.{_il}.{_role}.weight"] = _t


def _prefill_then_decode(eng, ref, seed: int, what: str) -> None:
    """37 random ids as one prefill (GEMM, a partial tile), then a decode step (matvec) at 37, each traced and held to
    the reference; the decode's top token must be the reference's."""
    ids = np.random.default_rng(seed).integers(0, N_VOCAB, 38).tolist()
    ref.forward(ids[:37], trace=True)
    worst = [check_trace(ref, gpu_trace(eng, ids[:37], 0), "prefill of 37 tokens")]
    ref.forward(ids[37:], start_pos=37, trace=True)
    g = gpu_trace(eng, ids[37:], 37)
    worst.append(check_trace(ref, g, "decode at position 37"))
    assert g["result_output"].reshape(-1).argmax() == np.asarray(ref.trace["result_output"]).reshape(-1).argmax()
    print(f"\n{what}: worst relative trace error prefill {worst[0]:.2e}, decode {worst[1]:.2e}")


def test_ternary_and_fp4_prefill_and_decode_match_reference(device, tmp_path):
    """A prefill of 37 tokens (GEMM, a partial tile) and a decode step (matvec), held to the reference as above."""
    path = write_model(tmp_path / "tfp4.gguf", TERNARY_FP4, seed=3)
    header = lab_gguf.read_file(path)
    assert {t.type.name for t in header.tensors if t.type.name != "F32"} == {"TQ1_0", "TQ2_0", "MXFP4", "NVFP4"}
    eng = Engine(device, header, n_ctx=64, logits_all=True)
    ref = Reference(path)
    try:
        eng.weights.upload_file(path)
        assert [w.type.name for w, _ in eng.weights.stacked["blk.0.qkv"]] == ["TQ1_0", "TQ2_0", "MXFP4"]
        _prefill_then_decode(eng, ref, 9, "ternary and fp4")
    finally:
        eng.close()
        ref.w.drop()


# A third model of the grid types (qo.IQ_TYPES, tables from lab/format/iq_grids.py): the types in turn through every
# role, the embedding through get_rows, so each layer's stacked QKV and gate-up mix types when there are several.
def _iq_mix() -> dict:
    types = qo.IQ_TYPES
    out = {"token_embd.weight": types[0], "output.weight": types[-1]}
    for il in range(N_LAYER):
        for k, role in enumerate(MIX):
            out[f"blk.{il}.{role}.weight"] = types[(il * len(MIX) + k) % len(types)]
    return out


def test_grid_types_prefill_and_decode_match_reference(device, tmp_path):
    """A prefill of 37 tokens (GEMM, a partial tile) and a decode step (matvec), held to the reference as above."""
    path = write_model(tmp_path / "iq.gguf", _iq_mix(), seed=5)
    header = lab_gguf.read_file(path)
    assert {t.type.name for t in header.tensors if t.type.name != "F32"} == set(qo.IQ_TYPES)
    eng = Engine(device, header, n_ctx=64, logits_all=True)
    ref = Reference(path)
    try:
        eng.weights.upload_file(path)
        _prefill_then_decode(eng, ref, 11, f"grid types {qo.IQ_TYPES}")
        # decode ran the grid types' own loop, each binding its grid, one buffer a grid for the whole engine
        loops = [k.label.split() for k in eng.kernels._cache.values() if "LOOP=matvec_iq.wgsl" in k.label.split()]
        assert loops and all(any(tok.startswith("B_GRID=") for tok in lab) for lab in loops)
        grids = [b for b in device.owned_by(eng) if b.label.endswith(" grid")]
        assert sorted(b.label for b in grids) == ["IQ1S grid", "IQ2S grid", "IQ2XS grid", "IQ2XXS grid", "IQ3S grid",
                                                  "IQ3XXS grid"]
    finally:
        eng.close()
        ref.w.drop()
    # this engine's grids (the session's device may hold other engines' while their tests keep them open)
    assert not [b for b in grids if b in device.buffers], "the grids outlived their engine"


# A fourth model of Q1_0 and Q2_0 (gguf 0.19 dequantizes neither): the engine reads the quantized file, the reference its
# twin with those tensors as F32 of the oracle's dequantization (write_model's oracle_f32), the same values.
BITS = {"token_embd.weight": "Q2_0", "output.weight": "Q1_0"}
for _il in range(N_LAYER):
    for _k, _role in enumerate(MIX):
        BITS[f"blk.{_il}.{_role}.weight"] = qo.BIT_TYPES[(_il + _k) % 2]


def test_one_and_two_bit_types_prefill_and_decode_match_reference(device, tmp_path):
    """A prefill of 37 tokens (GEMM, a partial tile) and a decode step (matvec), held to the reference as above."""
    path = write_model(tmp_path / "bits.gguf", BITS, seed=7)
    header = lab_gguf.read_file(path)
    assert {t.type.name for t in header.tensors if t.type.name != "F32"} == set(qo.BIT_TYPES)
    eng = Engine(device, header, n_ctx=64, logits_all=True)
    ref = Reference(write_model(tmp_path / "bits-oracle.gguf", BITS, seed=7, oracle_f32=True))
    try:
        eng.weights.upload_file(path)
        assert [w.type.name for w, _ in eng.weights.stacked["blk.0.qkv"]] == ["Q1_0", "Q2_0", "Q1_0"]
        _prefill_then_decode(eng, ref, 13, "Q1_0 and Q2_0")
    finally:
        eng.close()
        ref.w.drop()


@pytest.mark.parametrize("bad", ["Q8_1", "Q8_K"])
def test_unsupported_type_is_refused_with_the_list(tmp_path, bad):
    """A weight of a type the kernels cannot read is refused by name, with the list of types the lab reads."""
    path = write_model(tmp_path / "bad.gguf", {"blk.1.ffn_up.weight": bad})
    header = lab_gguf.read_file(path)
    with pytest.raises(ModelError) as e:
        check_tensors(from_gguf(header), header)
    msg = str(e.value)
    assert f"blk.1.ffn_up.weight has type {bad}" in msg
    assert all(t in msg for t in KERNEL_TYPES) and NEW_TYPES <= set(KERNEL_TYPES)
    assert lab_gguf.summary(header)["unsupported_types"] == [bad]
