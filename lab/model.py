"""Model configs, one frozen dataclass for every architecture, built from GGUF metadata by `from_gguf`;
and the tensor table each config expects, checked against the file before a byte is uploaded.

What it does not know: how tensors reach the GPU (lab.engine) or how tokens are made (lab.tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ggml import SUPPORTED, type_name
from .gguf import Header

ARCHITECTURES = ("llama", "qwen2", "gemma3")


class ModelError(ValueError):
    """The file is a valid GGUF but not a model this engine can run; the message names the key or tensor."""


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


def _get(md: dict, key: str, kind=int, default=None):
    if key not in md:
        if default is not None:
            return default
        raise ModelError(f"metadata key {key} is missing")
    v = md[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ModelError(f"metadata key {key} should be an integer, not {v!r}")
    if kind is float and not isinstance(v, (int, float)):
        raise ModelError(f"metadata key {key} should be a number, not {v!r}")
    return kind(v)


def from_gguf(header: Header) -> Config:
    md = header.metadata
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {arch!r} (general.architecture); this lab runs "
                         f"{', '.join(ARCHITECTURES)}")
    a = arch + "."
    tensors = {t.name: t for t in header.tensors}
    if "token_embd.weight" not in tensors:
        raise ModelError("tensor token_embd.weight is missing")
    n_embd = _get(md, a + "embedding_length")
    n_head = _get(md, a + "attention.head_count")
    n_head_kv = _get(md, a + "attention.head_count_kv", default=n_head)
    if n_head <= 0 or n_head_kv <= 0 or n_head % n_head_kv:
        raise ModelError(f"{a}attention.head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    head_dim = _get(md, a + "attention.key_length", default=n_embd // n_head)
    n_layer = _get(md, a + "block_count")
    gemma = arch == "gemma3"
    window = _get(md, a + "attention.sliding_window", default=0) if gemma else 0
    rope_scale = 1.0
    if md.get(a + "rope.scaling.type") == "linear":
        rope_scale = 1.0 / _get(md, a + "rope.scaling.factor", float)
    cfg = Config(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=_get(md, a + "feed_forward_length"),
        n_vocab=tensors["token_embd.weight"].shape[1],
        n_ctx_train=_get(md, a + "context_length"),
        eps=_get(md, a + "attention.layer_norm_rms_epsilon", float),
        rope_base=_get(md, a + "rope.freq_base", float, default=10000.0),
        # llama.cpp hard-codes 10000 for gemma3's sliding layers (rope_freq_base_train_swa).
        rope_base_local=10000.0 if gemma else _get(md, a + "rope.freq_base", float, default=10000.0),
        rope_scale=rope_scale,
        n_rot=_get(md, a + "rope.dimension_count", default=head_dim),
        rope_neox=arch in ("qwen2", "gemma3"),
        qkv_bias=arch == "qwen2",
        tied_output="output.weight" not in tensors,
        qk_norm=gemma, post_norms=gemma, gelu=gemma,
        embd_scale=math.sqrt(n_embd) if gemma else 1.0,
        attn_scale=1.0 / math.sqrt(head_dim),
        sliding_window=window,
        # llama.cpp's gemma3 pattern: every 6th layer (il % 6 == 5) is global, the rest slide.
        sliding=tuple(gemma and window > 0 and il % 6 < 5 for il in range(n_layer)),
        attn_softcap=_get(md, a + "attn_logit_softcapping", float, default=0.0) if gemma else 0.0,
        final_softcap=_get(md, a + "final_logit_softcapping", float, default=0.0) if gemma else 0.0,
    )
    if cfg.n_rot > head_dim or cfg.n_rot % 2:
        raise ModelError(f"{a}rope.dimension_count {cfg.n_rot} does not fit a head of {head_dim}")
    check_tensors(cfg, header)
    return cfg


def expected_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first)."""
    e, q, kv, ff = cfg.n_embd, cfg.q_dim, cfg.kv_dim, cfg.n_ff
    shapes = {"token_embd.weight": (e, cfg.n_vocab), "output_norm.weight": (e,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (e, cfg.n_vocab)
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
            shapes.update({b + "attn_q_norm.weight": (cfg.head_dim,), b + "attn_k_norm.weight": (cfg.head_dim,)})
        if cfg.post_norms:
            shapes.update({b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)})
    return shapes


def check_tensors(cfg: Config, header: Header) -> None:
    """Every expected tensor present with its shape and a type we can read; 1-D tensors in F32."""
    have = {t.name: t for t in header.tensors}
    for name, shape in expected_tensors(cfg).items():
        t = have.get(name)
        if t is None:
            raise ModelError(f"tensor {name} is missing (a {cfg.arch} model needs it)")
        if tuple(t.shape) != shape:
            raise ModelError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)} for this {cfg.arch} config")
        if t.type_id not in SUPPORTED:
            raise ModelError(f"tensor {name} has type {type_name(t.type_id)}, which this lab cannot read yet")
        if len(shape) == 1 and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; 1-D tensors must be F32")
