"""An untrained llama model (issue #44 part 2, a model trained from scratch): its shape, the GGUF header of the model
it makes with a trained vocabulary (every tensor F32, no data yet), and the rule its weights start from. What
`lab train --scratch` loads: the engine is made from this header, its weights drawn on
the GPU (lab.ops.weights ModelWeights.initialize, lab.ops.init), then trained as a full fine-tune is and written whole
(lab.instruments.training model_bytes), a file llama.cpp loads with its own tokenizer.

    shape = Shape(layers=4, width=64, heads=4, ctx=128, ffn=192)   # checked; kv_heads defaults to heads
    shape = preset("nano", ctx=128)                                # lab.settings SCRATCH_PRESETS
    shape.n_params(n_vocab)
    raw = header_bytes(shape, vocab_kvs)        # the header alone: lab.format.gguf.read(raw) gives the model's Header
    init_rule(name, shape)                      # (mean, std) a tensor's elements start from

The model is llama.cpp's plain llama: RMS norms (eps 1e-5), RoPE NORM over the whole head at base 10,000, SwiGLU,
grouped-query attention, the head tied to the token embedding (no output.weight: llama.cpp then reads token_embd,
and the lab's full fine-tune adds both shares into the one table). No biases, no norms past llama's.

What it does not know: the vocabulary (the caller passes its `tokenizer.ggml.*` key-values, lab.text.tokenizer.train
TrainedBPE.kvs) or how the weights are drawn. Standard library only: the page's worker builds the same header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lab.format import gguf as fmt
from lab.format.arches.llama import ARCH as LLAMA
from lab.format.ggml import BY_NAME
from lab.format.writer import gguf_header
from lab.settings import SCRATCH_PRESETS

ARCH = LLAMA.name
NAME = "llm-lab model trained from scratch"
EPS = 1e-5
ROPE_BASE = 10_000.0
STD = 0.02                # GPT-2's: every matrix and the embedding; the residual branch's outputs 0.02 / sqrt(2 L)
MAX_LAYERS = 64
MAX_WIDTH = 8192
MULTIPLE = 32             # widths and the feed-forward's in multiples of 32, as every real release's are
HEAD_DIMS = (8, 256)      # heads in whole vec4s for the attention kernels' tiles (multiples of 8 here), at most 256
MAX_CTX = 8192


@dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    heads: int
    ctx: int                          # the context it trains at: llama.context_length
    ffn: int | None = None            # None: 8/3 of the width, up to a multiple of MULTIPLE
    kv_heads: int | None = None       # None: as many as the query heads

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn is None and isinstance(self.width, int):
            object.__setattr__(self, "ffn", -(-self.width * 8 // 3 // MULTIPLE) * MULTIPLE)
        for k in ("layers", "width", "heads", "ffn", "ctx", "kv_heads"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"a model's {k.replace('_', '-')} must be a whole number of at least 1, not {v!r}")
        if self.layers > MAX_LAYERS:
            raise ValueError(f"{self.layers} layers: at most {MAX_LAYERS}")
        for k in ("width", "ffn"):
            v = getattr(self, k)
            if v % MULTIPLE or v > MAX_WIDTH:
                raise ValueError(f"a {k} of {v}: a multiple of {MULTIPLE} up to {MAX_WIDTH}")
        if self.width % self.heads:
            raise ValueError(f"a width of {self.width} does not split into {self.heads} heads")
        hd = self.width // self.heads
        if hd % 8 or not HEAD_DIMS[0] <= hd <= HEAD_DIMS[1]:
            raise ValueError(f"{self.heads} heads of a width of {self.width} are {hd} wide: a head must be a multiple "
                             f"of 8 from {HEAD_DIMS[0]} to {HEAD_DIMS[1]}")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads do not share {self.kv_heads} key/value heads evenly")
        if self.ctx < 2 or self.ctx > MAX_CTX:
            raise ValueError(f"a context of {self.ctx}: 2 .. {MAX_CTX}")

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def tensors(self, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
        """(name, ggml shape, ne0 first) of every tensor, in the file's order."""
        d, f, kv = self.width, self.ffn, self.kv_heads * self.head_dim
        out = [("token_embd.weight", (d, n_vocab))]
        for il in range(self.layers):
            b = f"blk.{il}."
            out += [(b + "attn_norm.weight", (d,)), (b + "attn_q.weight", (d, d)), (b + "attn_k.weight", (d, kv)),
                    (b + "attn_v.weight", (d, kv)), (b + "attn_output.weight", (d, d)),
                    (b + "ffn_norm.weight", (d,)), (b + "ffn_gate.weight", (d, f)), (b + "ffn_up.weight", (d, f)),
                    (b + "ffn_down.weight", (f, d))]
        return out + [("output_norm.weight", (d,))]

    def n_params(self, n_vocab: int) -> int:
        return sum(math.prod(s) for _, s in self.tensors(n_vocab))


def preset(name: str, ctx: int) -> Shape:
    if name not in SCRATCH_PRESETS:
        raise ValueError(f"no preset {name!r}: one of {', '.join(SCRATCH_PRESETS)}")
    layers, width, heads, ffn = SCRATCH_PRESETS[name]
    return Shape(layers=layers, width=width, heads=heads, ffn=ffn, ctx=ctx)


def init_rule(name: str, shape: Shape) -> tuple[float, float]:
    """(mean, std) of a tensor's first values: norms 1; the matrices writing into the residual stream (attn_output,
    ffn_down) N(0, (0.02 / sqrt(2 L))^2), so the stream's variance does not grow with depth (GPT-2's rule); every other
    matrix and the embedding N(0, 0.02^2)."""
    if name.endswith("norm.weight"):
        return 1.0, 0.0
    if name.endswith(("attn_output.weight", "ffn_down.weight")):
        return 0.0, STD / math.sqrt(2 * shape.layers)
    return 0.0, STD


def _vocab_size(vocab_kvs: list[tuple[str, int, object]]) -> int:
    for key, vtype, value in vocab_kvs:
        if key == "tokenizer.ggml.tokens" and vtype == fmt.ARRAY:
            return len(value[1])
    raise ValueError("the vocabulary's key-values hold no tokenizer.ggml.tokens")


def header_bytes(shape: Shape, vocab_kvs: list[tuple[str, int, object]]) -> bytes:
    """The GGUF header of the untrained model: llama's hyperparameters for `shape`, the vocabulary's key-values, and
    the tensor table (every tensor F32), without the data. lab.format.gguf.read reads it as the model's header;
    model_bytes writes the trained file from it."""
    n_vocab = _vocab_size(vocab_kvs)
    a = ARCH + "."
    kvs = [("general.architecture", fmt.STRING, ARCH), ("general.name", fmt.STRING, NAME),
           ("general.file_type", fmt.UINT32, 0),                                           # LLAMA_FTYPE_ALL_F32
           (a + "context_length", fmt.UINT32, shape.ctx), (a + "embedding_length", fmt.UINT32, shape.width),
           (a + "block_count", fmt.UINT32, shape.layers), (a + "feed_forward_length", fmt.UINT32, shape.ffn),
           (a + "rope.dimension_count", fmt.UINT32, shape.head_dim),
           (a + "attention.head_count", fmt.UINT32, shape.heads),
           (a + "attention.head_count_kv", fmt.UINT32, shape.kv_heads),
           (a + "attention.layer_norm_rms_epsilon", fmt.FLOAT32, EPS), (a + "rope.freq_base", fmt.FLOAT32, ROPE_BASE),
           (a + "vocab_size", fmt.UINT32, n_vocab), *vocab_kvs]
    f32 = BY_NAME["F32"].id
    return gguf_header(kvs, [(name, dims, f32, 4 * math.prod(dims)) for name, dims in shape.tensors(n_vocab)])
