"""Synthetic GGUFs with exactly the tensor names, shapes and quant types of the real models, filled with
random but valid blocks, so benchmarks run on a GPU machine without copying model files there
(CPython only: numpy and gguf-py's writer).

The per-layer type mix is the real files' own (llama.cpp's Q4_K_M gives some layers more bits).
The weights are noise: the output is gibberish, the timing is the real model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ggml import BY_NAME


@dataclass(frozen=True)
class Spec:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    types: dict          # role -> type name, or (type, other type, layers with the other)
    extra: dict          # metadata beyond the shapes


_QWEN_MORE_BITS = (0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21)
_GEMMA_MORE_BITS = (0, 1, 4, 7, 10, 13, 15, 16, 17)
SPECS = {
    "smollm2": Spec("llama", 30, 576, 9, 3, 64, 1536, 49152, {
        "token_embd": "Q8_0", **{r: "Q4_1" for r in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                      "ffn_up", "ffn_down")}},
        {"llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 100000.0, "llama.context_length": 8192, "llama.rope.dimension_count": 64}),
    "qwen2.5": Spec("qwen2", 24, 896, 14, 2, 64, 4864, 151936, {
        "token_embd": "Q5_0", "output": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q5_0",
        "attn_v": ("Q5_0", "Q8_0", _QWEN_MORE_BITS), "attn_output": "Q5_0", "ffn_gate": "Q5_0", "ffn_up": "Q5_0",
        "ffn_down": ("Q4_K", "Q6_K", _QWEN_MORE_BITS)},
        {"qwen2.attention.layer_norm_rms_epsilon": 1e-6, "qwen2.rope.freq_base": 1000000.0, "qwen2.context_length": 32768}),
    "gemma3": Spec("gemma3", 18, 640, 4, 1, 256, 2048, 262144, {
        "token_embd": "Q8_0", "attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": ("Q5_0", "Q8_0", _GEMMA_MORE_BITS),
        "attn_output": "Q4_K", "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": ("Q4_K", "Q6_K", _GEMMA_MORE_BITS)},
        {"gemma3.attention.layer_norm_rms_epsilon": 1e-6, "gemma3.rope.freq_base": 1000000.0, "gemma3.context_length": 32768, "gemma3.attention.sliding_window": 512,
         "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256}),
}

# Byte offsets of the f16 scale fields in each block: set to small finite values so every block is valid.
_SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
           "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,),
           "F16": None, "F32": None}


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw bytes (uint8, rows x row_bytes) of valid blocks: random quants, f16 scales in [1e-3, 2e-2)."""
    t = BY_NAME[type_name]
    if type_name == "F32":
        return rng.standard_normal((rows, cols), dtype=np.float32)
    nb = cols // t.block
    raw = rng.integers(0, 256, size=(rows * nb, t.nbytes), dtype=np.uint8)
    for off in _SCALES[type_name]:
        scale = rng.uniform(1e-3, 2e-2, size=rows * nb).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, nb * t.nbytes)


def _role_type(spec: Spec, role: str, il: int) -> str:
    t = spec.types[role]
    if isinstance(t, tuple):
        base, more, layers = t
        return more if il in layers else base
    return t


def write(name: str, path: Path, seed: int = 0) -> Path:
    import gguf
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    a = spec.arch
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(f"synthetic {name}")
    w.add_block_count(spec.n_layer)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    for k, v in spec.extra.items():
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)

    def tensor(tname: str, type_name: str, rows: int, cols: int) -> None:
        data = random_blocks(type_name, rows, cols, rng)
        qt = gguf.GGMLQuantizationType[type_name]
        if type_name == "F32":
            w.add_tensor(tname, data.reshape(rows, cols) if rows > 1 else data.reshape(cols))
        else:
            w.add_tensor(tname, data, raw_dtype=qt)   # byte shape (rows, row_bytes)

    e, q, kv, ff = spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim, spec.n_ff
    tensor("token_embd.weight", spec.types["token_embd"], spec.n_vocab, e)
    if "output" in spec.types:
        tensor("output.weight", spec.types["output"], spec.n_vocab, e)
    tensor("output_norm.weight", "F32", 1, e)
    for il in range(spec.n_layer):
        b = f"blk.{il}."
        for role, rows, cols in (("attn_q", q, e), ("attn_k", kv, e), ("attn_v", kv, e), ("attn_output", e, q),
                                 ("ffn_gate", ff, e), ("ffn_up", ff, e), ("ffn_down", e, ff)):
            tensor(b + role + ".weight", _role_type(spec, role, il), rows, cols)
        norms = ["attn_norm", "ffn_norm"] + (["post_attention_norm", "post_ffw_norm"] if a == "gemma3" else [])
        for n in norms:
            tensor(b + n + ".weight", "F32", 1, e)
        if a == "qwen2":
            for role, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                tensor(b + role + ".bias", "F32", 1, n)
        if a == "gemma3":
            tensor(b + "attn_q_norm.weight", "F32", 1, spec.head_dim)
            tensor(b + "attn_k_norm.weight", "F32", 1, spec.head_dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
