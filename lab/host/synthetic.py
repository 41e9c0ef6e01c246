"""Synthetic GGUFs with exactly the tensor names, shapes and quant types of the real models, filled with
random but valid blocks, so benchmarks run on a GPU machine without copying model files there
(CPython only: numpy and gguf-py's writer).

The per-layer type mix is the real files' own (llama.cpp's Q4_K_M gives some layers more bits).
The weights are noise: the output is gibberish, the timing is the real model's.

`write(..., vocab=True)` adds a placeholder vocabulary so llama.cpp (which refuses a file without one) loads
the same file; `lab bench --synthetic` writes it that way too, so both benchmark the same bytes. The tensors are
written one at a time after the header: peak memory is a small multiple of the largest tensor, not the file
(0.78 GB resident for the 4.9 GB llama3.1-8b).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.format.ggml import BY_NAME
from lab.host.reference.quant import RANDOM_CODES, put_iq1_m_d


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
    rope_scaling: tuple | None = None   # llama 3's rope_freqs.weight: (factor, low, high, original context)


def _use_more_bits(il: int, n_layer: int) -> bool:
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def _q4_k_m(n_layer: int, tied: bool) -> dict:
    # llama.cpp's Q4_K_M for a dense llama (src/llama-quant.cpp, llama_tensor_get_type_impl, as vendored in
    # llama-cpp-python 0.3.36): every matrix Q4_K (the ftype's default) except output.weight Q6_K (its rows are
    # whole 256-blocks), token_embd Q6_K when tied (quantized as the output) else Q4_K, and attn_v / ffn_down
    # Q6_K in the layers where use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
    more = tuple(il for il in range(n_layer) if _use_more_bits(il, n_layer))
    types = {r: "Q4_K" for r in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")}
    types.update(attn_v=("Q4_K", "Q6_K", more), ffn_down=("Q4_K", "Q6_K", more))
    if tied:
        types["token_embd"] = "Q6_K"
    else:
        types.update(token_embd="Q4_K", output="Q6_K")
    return types


def _llama3(n_vocab: int, head_dim: int) -> dict:
    return {"general.file_type": 15, "llama.vocab_size": n_vocab, "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.freq_base": 500000.0, "llama.context_length": 131072, "llama.rope.dimension_count": head_dim}


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
    # Llama 3.2 1B (tied head) and Llama 3.1 8B in Q4_K_M, with their rope_scaling as rope_freqs.weight
    "llama3.2-1b": Spec("llama", 16, 2048, 32, 8, 64, 8192, 128256, _q4_k_m(16, tied=True), _llama3(128256, 64),
                        rope_scaling=(32.0, 1.0, 4.0, 8192)),
    "llama3.1-8b": Spec("llama", 32, 4096, 32, 8, 128, 14336, 128256, _q4_k_m(32, tied=False),
                        _llama3(128256, 128), rope_scaling=(8.0, 1.0, 4.0, 8192)),
}

# Byte offsets of the f16 scale fields in each block: set to small finite values so every block is valid.
# MXFP4's and NVFP4's scales are 8-bit codes (none here): drawn from the kernel tests' sane range (RANDOM_CODES, where
# the range is explained), as random codes would reach inf. IQ1_M has no f16 field (none here): its d, spread over
# four nibbles, is written by put_iq1_m_d.
_SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
           "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,),
           "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": (), "IQ2_XXS": (0,), "IQ3_XXS": (0,),
           "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "IQ1_M": (), "Q1_0": (0,), "Q2_0": (0,),
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
    for off, count, lo, hi in RANDOM_CODES.get(type_name, ()):
        raw[:, off:off + count] = rng.integers(lo, hi, (rows * nb, count), dtype=np.uint8)
    if type_name == "IQ1_M":
        put_iq1_m_d(raw, rng.uniform(1e-3, 2e-2, size=rows * nb))
    return raw.reshape(rows, nb * t.nbytes)


def _role_type(spec: Spec, role: str, il: int) -> str:
    t = spec.types[role]
    if isinstance(t, tuple):
        base, more, layers = t
        return more if il in layers else base
    return t


def _add_vocab(w, n_vocab: int) -> None:
    """A placeholder SentencePiece vocabulary of n_vocab tokens (<unk>, <s>, </s>, then t3, t4, ...): enough for
    llama.cpp to load the file; not a tokenizer anyone chats with."""
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [1] * (n_vocab - 3))     # unknown, control, control, then normal
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def tensor_table(spec: Spec) -> list[tuple[str, str, int, int]]:
    """(name, type, rows, cols) of every tensor in file order; 1-D tensors have rows 1."""
    a = spec.arch
    e, q, kv, ff = spec.n_embd, spec.n_head * spec.head_dim, spec.n_head_kv * spec.head_dim, spec.n_ff
    out = [("rope_freqs.weight", "F32", 1, spec.head_dim // 2)] if spec.rope_scaling else []
    out.append(("token_embd.weight", spec.types["token_embd"], spec.n_vocab, e))
    if "output" in spec.types:
        out.append(("output.weight", spec.types["output"], spec.n_vocab, e))
    out.append(("output_norm.weight", "F32", 1, e))
    for il in range(spec.n_layer):
        b = f"blk.{il}."
        for role, rows, cols in (("attn_q", q, e), ("attn_k", kv, e), ("attn_v", kv, e), ("attn_output", e, q),
                                 ("ffn_gate", ff, e), ("ffn_up", ff, e), ("ffn_down", e, ff)):
            out.append((b + role + ".weight", _role_type(spec, role, il), rows, cols))
        norms = ["attn_norm", "ffn_norm"] + (["post_attention_norm", "post_ffw_norm"] if a == "gemma3" else [])
        out += [(b + n + ".weight", "F32", 1, e) for n in norms]
        if a == "qwen2":
            out += [(b + role + ".bias", "F32", 1, n) for role, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv))]
        if a == "gemma3":
            out += [(b + "attn_q_norm.weight", "F32", 1, spec.head_dim), (b + "attn_k_norm.weight", "F32", 1, spec.head_dim)]
    return out


def write(name: str, path: Path, seed: int = 0, vocab: bool = False) -> Path:
    """Write the synthetic file of spec `name`. vocab: add the placeholder vocabulary llama.cpp needs (the page's
    chat cannot use it: `lab bench --backend browser` refuses files without a tokenizer and takes the real header
    instead, lab/host/sameshape.py). The header and tensor table go first, then each tensor's bytes as they are made."""
    import gguf
    spec = SPECS[name]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"synthetic {name}")
    w.add_block_count(spec.n_layer)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    for k, v in spec.extra.items():
        (w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)
    if vocab:
        _add_vocab(w, spec.n_vocab)

    table = tensor_table(spec)
    for tname, type_name, rows, cols in table:
        if type_name == "F32":
            w.add_tensor_info(tname, (rows, cols) if rows > 1 else (cols,), np.dtype(np.float32), 4 * rows * cols)
        else:
            t = BY_NAME[type_name]
            row_bytes = cols // t.block * t.nbytes      # byte shape (rows, row_bytes), as gguf-py takes raw blocks
            w.add_tensor_info(tname, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes,
                              raw_dtype=gguf.GGMLQuantizationType[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for tname, type_name, rows, cols in table:
        if tname == "rope_freqs.weight":
            from lab.host.synthetic_arch import llama3_factors
            factor, low, high, orig = spec.rope_scaling
            base = spec.extra[f"{spec.arch}.rope.freq_base"]
            data = llama3_factors(2 * cols, base, factor, low, high, orig)
        else:
            data = random_blocks(type_name, rows, cols, rng)
        w.write_tensor_data(data)
    w.close()
    return path
