"""The tensors of a synthetic file: their names and shapes are the registry's (lab.format: the tensor table a model of
the spec's keys holds, the one the engine checks real files against), their order the synthetic files' own.

    cfg, shapes = registry(arch, keys, n_vocab, tied=True, rope_scaling=False)
    for name, shape in in_order(cfg, shapes, head, block_order): ...

`registry` reads the Config the keys describe (lab.format.model.config_of_keys: a file that holds every optional
tensor), leaves out the optional tensors the spec's file does not hold (the head where it is tied, rope_freqs where
nothing needs it, V where a layer reads K in its place), and reads that table back with from_gguf, so a spec whose file
the lab would refuse fails here. `in_order` sorts it in file order by the ranks of `head` (the tensors outside blocks)
and `block_order` (a block's).

What it does not know: the architectures (every rule here is keyed on a Config flag or a tensor's name), the tensors'
values or types (lab.host.synthetic.arch, .releases).
"""

from __future__ import annotations

from collections.abc import Callable

from lab.format import model
from lab.format.config import Config
from lab.format.gguf import Header, TensorInfo

Shape = tuple[int, ...]     # GGUF order: ne0 (the contiguous row) first

# The file order. The registry lists a model's tensors in an order of its own; the synthetic files were first written
# in another, which their bytes keep (each tensor's offset follows it, and releases draws every tensor from one random
# stream in that order), so it is kept here as ranks. A block holds some of _BEFORE, then its attention's, then some of
# _AFTER; a name missing from the ranks is an error (a tensor new to the registry needs its place here).
_BEFORE = ("attn_norm.weight",
           # a short-conv block (in place of attention)
           "shortconv.conv.weight", "shortconv.in_proj.weight", "shortconv.out_proj.weight",
           # fused Q/K/V, and a gated delta-net layer (in place of attention) after it
           "attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_beta.weight",
           "ssm_alpha.weight", "ssm_norm.weight", "ssm_out.weight",
           "attn_q.weight", "attn_k.weight", "attn_v.weight",
           # qwen2's biases on Q, K and V (no synthetic spec of SPECS has them: tests build one, lab.host.synthetic.arch
           # `build_spec`)
           "attn_q.bias", "attn_k.bias", "attn_v.bias")
_PLAIN = ("attn_q_norm.weight", "attn_k_norm.weight", "attn_output.weight")
# gated attention (Config.attn_gate) has its Q/K norms after the output projection
_GATED = ("attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight")
# where later layers read earlier layers' K/V (kv_from_start), K's norm goes with K and V, the part a sharing layer
# lacks, and Q's norm after them
_SHARED_KV = ("attn_k_norm.weight", "attn_q_norm.weight", "attn_output.weight")
_AFTER = ("post_attention_norm.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
          "post_ffw_norm.weight", "inp_gate.weight", "proj.weight", "post_norm.weight", "layer_output_scale.weight")


def head(cfg: Config) -> tuple[str, ...]:
    """The tensors outside blocks in file order (the final norm by its name in the Config)."""
    return ("token_embd.weight", "output.weight", cfg.output_norm, "per_layer_token_embd.weight",
            "per_layer_model_proj.weight", "per_layer_proj_norm.weight", "rope_freqs.weight")


def block_order(cfg: Config, il: int, plain: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Layer il's tensors (their names after "blk.N.") in file order. plain: the order of a plain attention layer (one
    neither gated nor sharing K/V, and not a short-conv block), where a file has its own."""
    attention = _GATED if cfg.attn_gate else _SHARED_KV if cfg.kv_from_start >= 0 else _PLAIN
    if plain is not None and attention is _PLAIN and not cfg.is_conv(il):
        return plain
    return _BEFORE + attention + _AFTER


def in_order(cfg: Config, shapes: dict[str, Shape], head_order: Callable[[Config], tuple[str, ...]],
             block: Callable[[Config, int], tuple[str, ...]]) -> list[tuple[str, Shape]]:
    """shapes' tensors in file order: those outside blocks as head_order ranks them, then block by block as `block`
    ranks each block's."""
    first = head_order(cfg)

    def rank(name: str) -> tuple[int, int]:
        il, rest, order = -1, name, first
        if name.startswith("blk."):
            number, _, rest = name.removeprefix("blk.").partition(".")
            il = int(number)
            order = block(cfg, il)
        if rest not in order:
            raise ValueError(f"tensor {name} has no place in the synthetic files' order (lab.host.synthetic.layout)")
        return il, order.index(rest)

    return [(name, shapes[name]) for name in sorted(shapes, key=rank)]


def registry(arch: str, keys: dict, n_vocab: int, tied: bool, rope_scaling: bool,
             v_is_k: bool = False) -> tuple[Config, dict[str, Shape]]:
    """The Config of a file of architecture `arch` with metadata `keys` (beyond general.*) and token_embd of n_vocab
    rows, and its tensors (name -> GGUF shape) as the registry lists them. The file leaves out the head where `tied`,
    rope_freqs unless `rope_scaling` or its full layers need it (rope_freqs_full), and attn_v on full layers where
    `v_is_k`; the table left is read back by from_gguf (a spec the lab would refuse fails here)."""
    metadata = {"general.architecture": arch, **keys}
    every = model.config_of_keys(metadata, n_vocab)
    left_out = {"output.weight"} if tied else set()
    if not (rope_scaling or every.rope_freqs_full):
        left_out.add("rope_freqs.weight")
    if v_is_k:
        left_out.update(f"blk.{il}.attn_v.weight" for il in range(every.n_layer) if not every.sliding[il])
    shapes = {name: shape for name, shape in model.stored_tensors(every).items() if name not in left_out}
    header = Header(3, metadata, [TensorInfo(name, shape, 0, 0, 0) for name, shape in shapes.items()], 32, 0, 0, None)
    return model.from_gguf(header), shapes


def size_keys(spec) -> dict:
    """The "{arch}." keys of a spec's sizes (either builder's spec: arch, n_layer, n_embd, n_ff or ff_per_layer,
    n_head, n_head_kv or kv_per_layer), in the order the files write them first."""
    a = spec.arch
    return {f"{a}.block_count": spec.n_layer, f"{a}.embedding_length": spec.n_embd,
            f"{a}.feed_forward_length": list(spec.ff_per_layer) if spec.ff_per_layer else spec.n_ff,
            f"{a}.attention.head_count": spec.n_head,
            f"{a}.attention.head_count_kv": list(spec.kv_per_layer) if spec.kv_per_layer else spec.n_head_kv}


def put(w, keys: dict) -> None:
    """Write metadata `keys` with gguf-py's writer `w`: a list as an array, a float as float32, an int as uint32."""
    for k, v in keys.items():
        if isinstance(v, list):
            w.add_array(k, v)
        else:
            (w.add_float32 if isinstance(v, float) else w.add_uint32)(k, v)
