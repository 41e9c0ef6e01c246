"""A model's `Config` from its GGUF header (`from_gguf`), and the tensor table that config expects, checked against
the file before a byte is uploaded.

`from_gguf` looks the file's architecture up in lab.format.arches and runs the steps every architecture shares (the
embedding, the blocks, the heads, RoPE) with the architecture's own at their place (lfm2's short-conv layers,
qwen35's delta-net layers, gemma4's per-layer sizes, the sliding windows and soft-caps); the architecture's module
also fixes its Config flags and says which tensors its blocks hold.

The values come from `lab.format.checks.check_config` (type and range of every key); what is checked here
is their consistency with each other and with the tensors, and every message names the keys behind
a number (`tensor blk.0.attn_k.weight has shape [64, 32], expected [64, 16] = [n_embd, n_head_kv *
head_dim] from llama.embedding_length = 64, ...`). `lab.engine.load.validate` is the entry point that
also checks the tokenizer.

Two tables: `stored_tensors` is what the FILE holds (phi3's fused `attn_qkv` and `ffn_up`, llama 3's
`rope_freqs`), checked by `check_tensors`; `expected_tensors` is what the ENGINE reads, where a fused tensor
appears as its row ranges (`tensor_views`: phi3's attn_qkv as attn_q/attn_k/attn_v, its ffn_up as ffn_gate
(the first n_ff rows, as ggml_swiglu splits a fused row) and ffn_up): views of the same file bytes, so the
GPU still holds one copy. `HOST_TENSORS` are the only tensors whose values Python reads (rope_freqs: n_rot/2
floats, read before the plans are built, natively from the path, in the browser with one File.slice).
`FLAT_TENSORS` (the conv kernels, [channels, l_cache] f32: each architecture's `flat_tensors`) are read whole by their
kernel rather than through the matmuls, so they are uploaded as one flat f32 buffer.

What it does not know: how tensors reach the GPU (lab.engine) or how tokens are made (lab.text.tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import replace

from lab.format.arches import ARCHITECTURES, REFUSED, REGISTRY
from lab.format.arches.base import Arch, read_experts
from lab.format.checks import check_config
from lab.format.config import Config
from lab.format.ggml import KERNEL_TYPES, SUPPORTED, type_name
from lab.format.gguf import Header, TensorInfo
from lab.format.rules import ModelError, show

# A mixture-of-experts file of an architecture whose experts this lab does not run (an architecture named *moe, or any
# with {arch}.expert_count or a router tensor, where its Arch has no `experts`) and a multimodal projector (llama.cpp's
# mmproj files are "clip") are refused by these.
MOE = ("a mixture-of-experts model: its routed expert FFNs (a router, ffn_gate_inp, and stacked experts) are not run "
       "by this lab for this architecture; the experts it runs are those of "
       + ", ".join(a.name for a in REGISTRY.values() if a.experts))
PROJECTOR = ("a multimodal projector (mmproj) file: the image / audio encoder that sits beside a language model's GGUF, "
             "not a language model; load the text model's own GGUF (this lab runs text models only)")
# Tensors (by name within a block) uploaded as one flat f32 buffer that their kernel reads whole (lab.ops.weights).
FLAT_TENSORS = tuple(name for arch in REGISTRY.values() for name in arch.flat_tensors)
# Tensors whose VALUES Python reads (everything else only has its offsets read): rope_freqs is n_rot/2 f32.
# gemma4's layer_output_scale: one float a block, a constant of the plan (lab.engine.plans) rather than a buffer
HOST_TENSORS = ("rope_freqs.weight", "layer_output_scale.weight")
# Tensors a file may hold or not, each read as a Config flag (the head: else tied to token_embd; rope_freqs); a block's
# are its architecture's (Arch.optional_tensors).
OPTIONAL_TENSORS = ("output.weight", "rope_freqs.weight")


def from_gguf(header: Header) -> Config:
    """The model's Config from its GGUF header, read as llama.cpp's loader reads it: the architecture, the config
    keys (type and range: lab.format.checks), the sizes and their agreement, RoPE, the architecture's quirks
    (sliding windows, query scale, soft-caps), then the tensor table against all of it (check_tensors)."""
    cfg, why = _config(header, whole_table=True)
    check_tensors(cfg, header, why)
    return cfg


def config_of_keys(metadata: dict, n_vocab: int) -> Config:
    """The Config of a file with these keys that holds token_embd of n_vocab rows and every optional tensor
    (OPTIONAL_TENSORS, and in each block its architecture's optional_tensors), for a writer that makes a file from its
    keys (lab.host.synthetic) and has no tensor table yet: stored_tensors(config) is that file's table, of which the
    writer leaves out the optional tensors its file does not hold; from_gguf then reads the header it writes. No
    tensor is checked here (there is no table to check)."""
    arch = _architecture(Header(3, metadata, [], 32, 0, 0, None))
    kv = check_config(metadata, arch.name)
    optional = [*OPTIONAL_TENSORS, *(f"blk.{il}.{name}" for il in range(kv["block_count"])
                                     for name in arch.optional_tensors)]
    tensors = [TensorInfo("token_embd.weight", (kv["embedding_length"], n_vocab), 0, 0, 0)]
    tensors += [TensorInfo(name, (1,), 0, 0, 0) for name in optional]
    return _config(Header(3, metadata, tensors, 32, 0, 0, None), whole_table=False)[0]


def _config(header: Header, whole_table: bool) -> tuple[Config, dict[str, str]]:
    """from_gguf's reading but the tensor table's check: the Config, and for each field the keys behind it (why).
    whole_table: the header has the file's whole tensor table (block_count is checked against its length)."""
    arch = _architecture(header)
    tensors = {t.name: t for t in header.tensors}
    kv = check_config(header.metadata, arch.name)
    why: dict[str, str] = {}    # Config field -> the keys its size came from, for the messages of check_tensors
    n_embd, n_vocab = _embedding(arch, kv, tensors, why)
    n_layer, mtp = _layers(arch, kv, tensors if whole_table else None, why)
    kinds = arch.layer_kinds(kv, n_layer, mtp, why) if arch.layer_kinds else {}    # lfm2, qwen35: which layer is what
    n_head, n_head_kv, head_dim = _heads(arch, kv, n_embd, why)
    n_ff = kv["feed_forward_length"]
    why["n_ff"] = f"{arch.name}.feed_forward_length = {show(n_ff)}"
    sizes = arch.layer_sizes(kv, n_layer, n_head, tensors, why) if arch.layer_sizes else {}    # gemma4: per layer
    experts = read_experts(arch, kv, n_layer, n_ff, why) if arch.experts else {}     # the routed layers' FFN
    n_rot, rope_scale, rope_base = _rope(arch, kv, head_dim, tensors, why)
    if arch.check_rope:
        arch.check_rope(kv, n_rot)
    window, sliding, base_local = arch.sliding(kv, n_layer, rope_base)
    attn_cap, final_cap = arch.softcaps(kv, window)
    cfg = Config(
        arch=arch.name, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=max(n_ff) if isinstance(n_ff, list) else n_ff, n_vocab=n_vocab, n_ctx_train=kv["context_length"],
        eps=float(kv["attention.layer_norm_rms_epsilon"]),
        rope_base=rope_base,
        rope_base_local=base_local,
        rope_scale=rope_scale,
        n_rot=n_rot,
        attn_scale=_attention_scale(arch, n_layer, n_embd, n_head, head_dim),
        sliding_window=window if any(sliding) else 0,
        sliding=sliding,
        attn_softcap=attn_cap,
        final_softcap=final_cap,
        mtp_layers=mtp, **_flags(arch, tensors, n_layer, n_embd), **kinds, **sizes, **experts,
    )
    return cfg, why


def _architecture(header: Header) -> Arch:
    """The file's architecture, or a ModelError that says what the file is instead: a variant refused by name
    (REFUSED), a multimodal projector, a mixture-of-experts model (by its name, a router tensor or expert_count; an
    architecture with a reason of its own gives that one), or an architecture this lab does not run."""
    md = header.metadata
    name = md.get("general.architecture")
    if isinstance(name, str) and name in REFUSED:
        raise ModelError(f"general.architecture = {show(name)}: {REFUSED[name]}")
    if name == "clip" or any(isinstance(k, str) and k.startswith("clip.") for k in md):
        raise ModelError(f"general.architecture = {show(name)}: {PROJECTOR}")
    arch = REGISTRY.get(name) if isinstance(name, str) else None
    router = next((t.name for t in header.tensors if t.name.endswith("ffn_gate_inp.weight")), None)
    experts = md.get(f"{name}.expert_count") if isinstance(name, str) else None
    why_moe = f"tensor {router}" if router else f"{name}.expert_count = {show(experts)}" if experts \
        else f"general.architecture = {show(name)}"
    if (arch is None or not (arch.moe_refusal or arch.experts)) and (isinstance(name, str) and name.replace("-", "").replace(
            "_", "").endswith("moe") or router or experts):
        raise ModelError(f"{why_moe}: {MOE} ({', '.join(ARCHITECTURES)})")
    if arch is None:
        raise ModelError(f"unsupported architecture {show(name)} (general.architecture); this lab runs "
                         f"{', '.join(ARCHITECTURES)}")
    if arch.moe_refusal and (router or experts):
        raise ModelError(f"{why_moe}: {arch.moe_refusal}")
    if arch.experts and router and not experts:
        raise ModelError(f"tensor {router}: a mixture-of-experts router, but {name}.expert_count is absent or 0")
    return arch


def _flags(arch: Arch, tensors: dict[str, TensorInfo], n_layer: int, n_embd: int) -> dict:
    """The Config fields the architecture fixes, some by a rule of its own on the file (the tied head, rope_freqs,
    the unrotated layers, the embedding scale)."""
    step = arch.no_rope_step
    return dict(
        rope_neox=arch.rope_neox, qkv_bias=arch.qkv_bias,
        tied_output=arch.tied_always or "output.weight" not in tensors,
        qk_norm=arch.qk_norm, post_norms=arch.post_norms, gelu=arch.gelu,
        embd_scale=math.sqrt(n_embd) if arch.embd_scale else 1.0,
        rope_freqs=arch.rope_freqs and "rope_freqs.weight" in tensors,
        fused_qkv=arch.fused, fused_gate_up=arch.fused,
        no_rope=tuple((il + 1) % step == 0 for il in range(n_layer)) if step else (),
        output_norm=arch.output_norm, ffn_norm=arch.ffn_norm, attn_gate=arch.attn_gate,
    )


# -- from_gguf's steps: each reads its keys, checks them, and records in `why` the keys behind each size ----------

def _embedding(arch: Arch, kv: dict, tensors: dict[str, TensorInfo], why: dict[str, str]) -> tuple[int, int]:
    """(n_embd, n_vocab): the residual width from the keys, the vocabulary from token_embd's rows."""
    a = arch.name + "."
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
    why.update(n_embd=f"{a}embedding_length = {n_embd}", n_vocab=f"token_embd.weight rows = {n_vocab}")
    return n_embd, n_vocab


def _heads(arch: Arch, kv: dict, n_embd: int, why: dict[str, str]) -> tuple[int, int, int]:
    """(n_head, n_head_kv, head_dim): query heads, key/value heads (a divisor of them) and the head size, which
    is the key length, or n_embd / n_head where the file has none; the value length must equal it. Then the
    architecture's own checks of them (check_heads)."""
    a = arch.name + "."
    n_head = kv["attention.head_count"]
    why["n_head"] = f"{a}attention.head_count = {n_head}"
    n_head_kv = kv.get("attention.head_count_kv", n_head)
    why["n_head_kv"] = (f"{a}attention.head_count_kv = {show(n_head_kv)}" if "attention.head_count_kv" in kv
                        else f"{a}attention.head_count_kv absent, so {a}attention.head_count = {n_head}")
    if isinstance(n_head_kv, list):     # one per layer (lfm2: 0 for a short-conv layer, checked by its layer_kinds)
        n_head_kv = max(n_head_kv)
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
    if arch.check_heads:
        arch.check_heads(kv, n_embd, n_head, head_dim, why)
    return n_head, n_head_kv, head_dim


def _layers(arch: Arch, kv: dict, tensors: dict[str, TensorInfo] | None, why: dict[str, str]) -> tuple[int, int]:
    """(n_layer, mtp): the blocks run, refused when the file cannot hold that many (at least the architecture's
    per_block tensors each: checked before anything loops over them; not where `tensors` is None, a writer's keys
    without a table), and trailing multi-token-prediction blocks (qwen35's nextn_predict_layers; llama.cpp: n_layer()
    = block_count - nextn_predict_layers), which this lab skips."""
    a = arch.name + "."
    n_all = kv["block_count"]
    mtp = kv.get("nextn_predict_layers", 0)
    if mtp >= n_all:
        raise ModelError(f"{a}nextn_predict_layers = {mtp}: the file's {a}block_count = {n_all} leaves no block to run")
    n_layer = n_all - mtp
    why["n_layer"] = f"{a}block_count = {n_all}" + (f" - {a}nextn_predict_layers = {mtp}" if mtp else "")
    per_block = arch.per_block
    if tensors is not None and per_block * n_layer > len(tensors):
        raise ModelError(f"{a}block_count = {n_all} needs at least {per_block * n_layer} tensors ({per_block} a "
                         f"block); the file has {len(tensors)}")
    return n_layer, mtp


def _rope(arch: Arch, kv: dict, head_dim: int, tensors: dict[str, TensorInfo],
          why: dict[str, str]) -> tuple[int, float, float]:
    """(n_rot, rope_scale, rope_base): the rotated dimensions of a head, the position multiplier and the
    frequency base, refusing what this lab does not rotate as llama.cpp would."""
    a = arch.name + "."
    n_rot = kv.get("rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: must be even and at most the head size {head_dim} "
                         f"({why['head_dim']})")
    if arch.whole_head_rope and n_rot != head_dim:
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: a {arch.name} model rotates the whole head of {head_dim} "
                         f"({why['head_dim']})")
    # RoPE scaling as llama.cpp reads it: type "linear" when absent; factor from rope.scaling.factor, else
    # the older rope.scale_linear; 0 or absent means 1; type "none" never scales. yarn and longrope are
    # refused by name in lab.format.rules.
    factor_key = next((k for k in ("rope.scaling.factor", "rope.scale_linear") if k in kv), None)
    factor = kv[factor_key] if factor_key else 0.0
    rope_scale = 1.0 if kv.get("rope.scaling.type", "linear") == "none" or factor == 0 else 1.0 / factor
    if arch.rope_scaling_refused and rope_scale != 1.0:
        raise ModelError(f"{a}{factor_key} = {show(factor)}: {arch.rope_scaling_refused}")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in tensors:
            # llama.cpp picks long or short by the context asked for, with YaRN-like attention scaling (LongRoPE).
            raise ModelError(f"tensor {name}: long-context RoPE factors (LongRoPE, Phi-3 128k) are not supported "
                             f"by this lab")
    return n_rot, rope_scale, float(kv.get("rope.freq_base", 10000.0))


def _attention_scale(arch: Arch, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The query scale (f_attention_scale): 1/sqrt(head size), except the 27B gemmas (big_attn_scale_layers: 46 / 62
    layers), which use 1/sqrt(n_embd / n_head); llama.cpp decides by layer count and ignores query_pre_attn_scalar.
    1 where the architecture leaves q.k unscaled (unit_attn_scale)."""
    if arch.unit_attn_scale:
        return 1.0
    big = n_layer == arch.big_attn_scale_layers
    return 1.0 / math.sqrt(n_embd // n_head if big else head_dim)


# -- the tensor table --------------------------------------------------------------------------------------------

def _symbolic_tensors(cfg: Config, stored: bool = False) -> dict[str, tuple[str, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first) in Config field names.
    stored=True: as the file holds them (fused tensors whole, rope_freqs included); else as the engine reads
    them (fused tensors as their row views, see tensor_views; rope_freqs read by the host, not uploaded).
    A block's tensors but attn_norm are its architecture's (Arch.block_tensors)."""
    e, v = "n_embd", "n_vocab"
    shapes = {"token_embd.weight": (e, v), cfg.output_norm: (e,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (e, v)
    if stored and cfg.rope_freqs:
        shapes["rope_freqs.weight"] = ("rope_pairs",)
    if stored and cfg.rope_freqs_full:      # gemma4: [head_dim / 2] of the full layers
        shapes["rope_freqs.weight"] = ("rope_pairs",)
    if cfg.n_embd_per_layer:                # gemma4's per-layer token embeddings, their projection and its norm
        shapes.update({"per_layer_token_embd.weight": ("n_embd_per_layer * n_layer", v),
                       "per_layer_model_proj.weight": (e, "n_embd_per_layer * n_layer"),
                       "per_layer_proj_norm.weight": ("n_embd_per_layer",)})
    block = REGISTRY[cfg.arch].block_tensors
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        shapes[b + "attn_norm.weight"] = (e,)
        shapes.update(block(cfg, b, il, stored))
    return shapes


def stored_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the file must hold, with its GGUF shape (ne0 first)."""
    return {name: tuple(_size(cfg, d) for d in dims) for name, dims in _symbolic_tensors(cfg, True).items()}


def tensor_views(cfg: Config, tensors: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The file's tensors as the engine reads them: phi3's fused attn_qkv as three row ranges (attn_q, attn_k,
    attn_v) and its ffn_up [gate | up] as ffn_gate (rows 0..n_ff-1, the half ggml_swiglu puts through SiLU) and
    ffn_up (rows n_ff..2 n_ff-1). A view is the same file bytes (rows are contiguous), so the engine stacks
    them back into one weight without a second copy."""
    out = dict(tensors)

    def split(name: str, parts: list[tuple[str, int]]) -> None:
        t = out.pop(name)
        row_bytes = t.type.row_bytes(t.shape[0])
        first = 0
        for part, rows in parts:
            out[part] = replace(t, name=part, shape=(t.shape[0], rows), offset=t.offset + first * row_bytes,
                                nbytes=rows * row_bytes)
            first += rows

    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        if cfg.v_is_k and cfg.v_is_k[il]:     # gemma4 without attn_v: V's rows are K's (the same file bytes)
            out[b + "attn_v.weight"] = replace(out[b + "attn_k.weight"], name=b + "attn_v.weight")
        if cfg.attn_gate and not cfg.is_delta(il):   # qwen35: each head's rows [q | gate], as two views a head
            split(b + "attn_q.weight", [(f"{b}attn_q.weight#{part}{h}", cfg.head_dim)
                                        for h in range(cfg.n_head) for part in "qg"])
        if cfg.fused_qkv:
            split(b + "attn_qkv.weight", [(b + "attn_q.weight", cfg.q_dim), (b + "attn_k.weight", cfg.kv_dim),
                                          (b + "attn_v.weight", cfg.kv_dim)])
        if cfg.fused_gate_up:
            split(b + "ffn_up.weight", [(b + "ffn_gate.weight", cfg.n_ff), (b + "ffn_up.weight", cfg.n_ff)])
    return out


def host_tensors(cfg: Config, header: Header) -> list[TensorInfo]:
    """The tensors whose values the host must read and hand to the engine (HOST_TENSORS the model uses)."""
    def used(name: str) -> bool:
        if name == "rope_freqs.weight":
            return cfg.rope_freqs or cfg.rope_freqs_full
        return cfg.out_scale and name.startswith("blk.") and name.split(".", 2)[2] == "layer_output_scale.weight"
    return [t for t in header.tensors if used(t.name)]


def _size(cfg: Config, dim: str) -> int:
    if dim == "qkv_rows":
        return cfg.q_dim + 2 * cfg.kv_dim
    if dim == "gate_up_rows":
        return 2 * cfg.n_ff
    if dim == "bcx_rows":       # lfm2's in_proj: [B | C | x], n_embd rows each
        return 3 * cfg.n_embd
    if dim == "q_gate_rows":    # qwen35's attn_q: [q | gate] per head
        return 2 * cfg.q_dim
    if dim == "one":
        return 1
    n = 1
    for f in dim.split(" * "):
        name, _, il = f.partition("@")      # "head_dim@3": layer 3's own (gemma4)
        n *= getattr(cfg, f"{name}_of")(int(il)) if il else getattr(cfg, name)
    return n


def is_flat(name: str) -> bool:
    """Whether tensor `name` is uploaded as one flat f32 buffer its kernel reads whole (FLAT_TENSORS)."""
    return name.startswith("blk.") and name.split(".", 2)[2] in FLAT_TENSORS


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
    expected = _symbolic_tensors(cfg, stored=True)
    for name, dims in expected.items():
        t = have.get(name)
        if t is None:
            raise ModelError(f"tensor {name} is missing (a {cfg.arch} model needs it"
                             f"{f'; {layers}' if name.startswith('blk.') else ''})")
        shape = tuple(_size(cfg, d) for d in dims)
        if tuple(t.shape) != shape:
            fields = dict.fromkeys(f.partition("@")[0] for d in dims for f in d.split(" * "))
            src = "; ".join(why[f] for f in fields if f in why)
            raise ModelError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)} = "
                             f"[{', '.join(dims)}]{f' from {src}' if src else ''}")
        if t.type_id not in SUPPORTED:
            raise ModelError(f"tensor {name} has type {type_name(t.type_id)}, which this lab cannot read yet "
                             f"(it reads {', '.join(KERNEL_TYPES)})")
        if len(shape) == 1 and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; 1-D tensors must be F32")
        if is_flat(name) and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; the short-conv kernel reads it as F32")
    for t in header.tensors:
        if t.name not in expected:
            block = t.name.split(".")[1] if t.name.startswith("blk.") else ""
            if cfg.mtp_layers and block.isdigit() and cfg.n_layer <= int(block) < cfg.n_layer + cfg.mtp_layers:
                continue    # a multi-token-prediction block: skipped on purpose (Config.skipped says so)
            if (cfg.kv_from_start >= 0 and block.isdigit() and cfg.kv_from_start <= int(block) < cfg.n_layer
                    and t.name.split(".", 2)[2] in REGISTRY[cfg.arch].shared_kv_unread):
                continue    # a shared-KV layer's own K/V weights: llama.cpp loads and never reads them (skipped)
            extra = f" ({layers})" if block.isdigit() and int(block) >= cfg.n_layer else ""
            raise ModelError(f"tensor {t.name} is not one a {cfg.arch} model reads here{extra}: refused rather "
                             f"than ignored")
