"""Model configs, one frozen dataclass for every architecture, built from GGUF metadata by `from_gguf`;
and the tensor table each config expects, checked against the file before a byte is uploaded.

The values come from `lab.validate.check_config` (type and range of every key); what is checked here
is their consistency with each other and with the tensors, and every message names the keys behind
a number (`tensor blk.0.attn_k.weight has shape [64, 32], expected [64, 16] = [n_embd, n_head_kv *
head_dim] from llama.embedding_length = 64, ...`). `lab.validate.validate` is the entry point that
also checks the tokenizer.

What it does not know: how tensors reach the GPU (lab.engine) or how tokens are made (lab.tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ggml import type_name
from .gguf import Header
from .ops.weights import KERNEL_TYPES, SUPPORTED
from .validate import ModelError, check_config, show

ARCHITECTURES = ("llama", "qwen2", "gemma3")


@dataclass(frozen=True)
class Config:
    arch: str
    n_layer: int            # transformer blocks
    n_embd: int             # residual width
    n_head: int             # query heads
    n_head_kv: int          # key/value heads (grouped-query: n_head / n_head_kv queries share one)
    head_dim: int           # width of one head (key length = value length)
    n_ff: int               # feed-forward inner width
    n_vocab: int            # rows of token_embd
    n_ctx_train: int        # context length the model was trained for
    eps: float              # RMSNorm epsilon
    rope_base: float        # RoPE frequency base (global layers)
    rope_base_local: float  # RoPE base of sliding-window layers (gemma3), else rope_base
    rope_scale: float       # position multiplier (1 / linear scaling factor)
    n_rot: int              # rotated dimensions of each head (<= head_dim)
    rope_neox: bool         # pairs (i, i + n_rot/2) as in NeoX/Qwen/Gemma, else adjacent (2i, 2i+1) as llama GGUFs
    qkv_bias: bool          # biases on Q, K, V (qwen2)
    tied_output: bool       # no output.weight: the head is token_embd
    qk_norm: bool           # per-head RMSNorm on Q and K (gemma3)
    post_norms: bool        # RMSNorm after attention and after the feed-forward as well (gemma3)
    gelu: bool              # GeGLU with tanh GELU (gemma3) instead of SwiGLU
    embd_scale: float       # inp_embd multiplier: sqrt(n_embd) for gemma3, else 1
    attn_scale: float       # multiplier of q.k
    sliding_window: int     # keys a sliding layer sees (0: none)
    sliding: tuple[bool, ...]  # per layer: True when the layer uses the sliding window
    attn_softcap: float     # 0: none
    final_softcap: float    # 0: none

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """2 (K and V) x layers x KV heads x head size x bytes per value."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * bytes_per_value


def from_gguf(header: Header) -> Config:
    md = header.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {show(arch)} (general.architecture); this lab runs "
                         f"{', '.join(ARCHITECTURES)}")
    a = arch + "."
    kv = check_config(md, arch)
    tensors = {t.name: t for t in header.tensors}
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError("tensor token_embd.weight is missing")
    n_embd = kv["embedding_length"]
    if len(emb.shape) != 2 or emb.shape[0] != n_embd:
        raise ModelError(f"tensor token_embd.weight has shape {list(emb.shape)}, expected [{n_embd}, vocabulary] "
                         f"from {a}embedding_length = {n_embd}")
    n_vocab = emb.shape[1]
    if kv.get("vocab_size", n_vocab) != n_vocab:
        raise ModelError(f"{a}vocab_size = {kv['vocab_size']}, but token_embd.weight has {n_vocab} rows")
    # Where each size comes from, for the messages of check_tensors.
    why = {"n_embd": f"{a}embedding_length = {n_embd}", "n_vocab": f"token_embd.weight rows = {n_vocab}"}

    n_head = kv["attention.head_count"]
    why["n_head"] = f"{a}attention.head_count = {n_head}"
    n_head_kv = kv.get("attention.head_count_kv", n_head)
    why["n_head_kv"] = (f"{a}attention.head_count_kv = {n_head_kv}" if "attention.head_count_kv" in kv
                        else f"{a}attention.head_count_kv absent, so {a}attention.head_count = {n_head}")
    if n_head % n_head_kv:
        raise ModelError(f"{a}attention.head_count = {n_head} is not a multiple of "
                         f"{a}attention.head_count_kv = {n_head_kv}")
    if "attention.key_length" in kv:
        head_dim = kv["attention.key_length"]
        why["head_dim"] = f"{a}attention.key_length = {head_dim}"
    else:
        if n_embd % n_head:
            raise ModelError(f"{a}attention.head_count = {n_head} does not divide {a}embedding_length = {n_embd} "
                             f"(and {a}attention.key_length, the head size, is absent)")
        head_dim = n_embd // n_head
        why["head_dim"] = (f"{a}attention.key_length absent, so head size {head_dim} = {a}embedding_length {n_embd} "
                           f"/ {a}attention.head_count {n_head}")
    if kv.get("attention.value_length", head_dim) != head_dim:
        raise ModelError(f"{a}attention.value_length = {kv['attention.value_length']} differs from the key length "
                         f"{head_dim} ({why['head_dim']}): this lab needs them equal")
    n_layer = kv["block_count"]
    why["n_layer"] = f"{a}block_count = {n_layer}"
    if 9 * n_layer > len(tensors):        # checked before anything loops over the layers
        raise ModelError(f"{a}block_count = {n_layer} needs at least {9 * n_layer} tensors (9 a block); the file "
                         f"has {len(tensors)}")
    n_ff = kv["feed_forward_length"]
    why["n_ff"] = f"{a}feed_forward_length = {n_ff}"
    n_rot = kv.get("rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: must be even and at most the head size {head_dim} "
                         f"({why['head_dim']})")
    if arch == "llama" and n_rot != head_dim:   # llama.cpp: "invalid n_rot"
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: a llama model rotates the whole head of {head_dim} "
                         f"({why['head_dim']})")

    # RoPE scaling as llama.cpp reads it: type "linear" when absent; factor from rope.scaling.factor, else
    # the older rope.scale_linear; 0 or absent means 1; type "none" never scales.
    factor_key = next((k for k in ("rope.scaling.factor", "rope.scale_linear") if k in kv), None)
    factor = kv[factor_key] if factor_key else 0.0
    rope_scale = 1.0 if kv.get("rope.scaling.type", "linear") == "none" or factor == 0 else 1.0 / factor
    gemma = arch == "gemma3"
    if gemma and rope_scale != 1.0:
        # llama.cpp scales gemma3's global layers only (rope_freq_scale_train_swa = 1); Config has one scale.
        raise ModelError(f"{a}{factor_key} = {show(factor)}: linear RoPE scaling of gemma3's global layers only "
                         f"is not supported by this lab yet")
    window = kv.get("attention.sliding_window", 0) if gemma else 0
    rope_base = float(kv.get("rope.freq_base", 10000.0))
    cfg = Config(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=kv["context_length"],
        eps=float(kv["attention.layer_norm_rms_epsilon"]),
        rope_base=rope_base,
        # llama.cpp hard-codes 10000 for gemma3's sliding layers (rope_freq_base_train_swa).
        rope_base_local=10000.0 if gemma else rope_base,
        rope_scale=rope_scale,
        n_rot=n_rot,
        rope_neox=arch in ("qwen2", "gemma3"),
        qkv_bias=arch == "qwen2",
        tied_output="output.weight" not in tensors,
        qk_norm=gemma, post_norms=gemma, gelu=gemma,
        embd_scale=math.sqrt(n_embd) if gemma else 1.0,
        attn_scale=1.0 / math.sqrt(head_dim),
        sliding_window=window,
        # llama.cpp's gemma3 pattern: every 6th layer (il % 6 == 5) is global, the rest slide.
        sliding=tuple(gemma and window > 0 and il % 6 < 5 for il in range(n_layer)),
        attn_softcap=float(kv.get("attn_logit_softcapping", 0.0)),
        final_softcap=float(kv.get("final_logit_softcapping", 0.0)),
    )
    check_tensors(cfg, header, why)
    return cfg


def _symbolic_tensors(cfg: Config) -> dict[str, tuple[str, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first) in Config field names."""
    e, q, kv, ff, v = "n_embd", "n_head * head_dim", "n_head_kv * head_dim", "n_ff", "n_vocab"
    shapes = {"token_embd.weight": (e, v), "output_norm.weight": (e,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (e, v)
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        shapes.update({
            b + "attn_norm.weight": (e,), b + "attn_q.weight": (e, q), b + "attn_k.weight": (e, kv),
            b + "attn_v.weight": (e, kv), b + "attn_output.weight": (q, e), b + "ffn_norm.weight": (e,),
            b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff), b + "ffn_down.weight": (ff, e),
        })
        if cfg.qkv_bias:
            shapes.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if cfg.qk_norm:
            shapes.update({b + "attn_q_norm.weight": ("head_dim",), b + "attn_k_norm.weight": ("head_dim",)})
        if cfg.post_norms:
            shapes.update({b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)})
    return shapes


def _size(cfg: Config, dim: str) -> int:
    n = 1
    for f in dim.split(" * "):
        n *= getattr(cfg, f)
    return n


def expected_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first)."""
    return {name: tuple(_size(cfg, d) for d in dims) for name, dims in _symbolic_tensors(cfg).items()}


def check_tensors(cfg: Config, header: Header, why: dict[str, str] | None = None) -> None:
    """Every expected tensor present with its shape and a type we can read; 1-D tensors in F32; no
    other tensor (llama.cpp refuses a file with tensors it does not read, and so does this lab: an
    unread rope_freqs or bias would change the output). why: Config field -> the keys it came from."""
    why = why or {}
    have = {t.name: t for t in header.tensors}
    layers = why.get("n_layer", f"{cfg.n_layer} blocks")
    expected = _symbolic_tensors(cfg)
    for name, dims in expected.items():
        t = have.get(name)
        if t is None:
            raise ModelError(f"tensor {name} is missing (a {cfg.arch} model needs it"
                             f"{f'; {layers}' if name.startswith('blk.') else ''})")
        shape = tuple(_size(cfg, d) for d in dims)
        if tuple(t.shape) != shape:
            fields = dict.fromkeys(f for d in dims for f in d.split(" * "))
            src = "; ".join(why[f] for f in fields if f in why)
            raise ModelError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)} = "
                             f"[{', '.join(dims)}]{f' from {src}' if src else ''}")
        if t.type_id not in SUPPORTED:
            raise ModelError(f"tensor {name} has type {type_name(t.type_id)}, which this lab cannot read yet "
                             f"(it reads {', '.join(KERNEL_TYPES)})")
        if len(shape) == 1 and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; 1-D tensors must be F32")
    for t in header.tensors:
        if t.name not in expected:
            block = t.name.split(".")[1] if t.name.startswith("blk.") else ""
            extra = f" ({layers})" if block.isdigit() and int(block) >= cfg.n_layer else ""
            raise ModelError(f"tensor {t.name} is not one a {cfg.arch} model reads here{extra}: refused rather "
                             f"than ignored")
