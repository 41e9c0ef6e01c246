"""What the engine keeps between the ops of a step and between steps: the activations, and what the blocks keep of
the conversation (the attention layers' KV caches, the conv layers' conv states, the delta-net layers' recurrent
states with their snapshots): `Scratch`; and the sizes they are made at (the prefill step's rows, the greedy steps
run ahead of a read-back, the positions a conv state can step back, the snapshots a recurrent state keeps).

    Scratch.alloc(device, cfg, blocks, n_ctx, B, ...)   every buffer kind CONVERSATION, each with its shape;
                                                        the blocks' own made by each block (lab.engine.blocks)

lab.engine.budget runs `Scratch.alloc` against a device that only records sizes, so the memory budget and the engine
share one allocation. What it does not know: the weights (lab.ops.weights) or the plans that use these buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as fields_of

from lab import gpu, ops
from lab.format.model import Config
from lab.ops import matmul as matmul_ops
from lab.settings import MAX_CANDIDATES

DEFAULT_BATCH = 64      # prefill chunk: prompts run in steps of at most this many tokens
GPU_BATCH = 512         # the same on a GPU adapter, as the native benchmarks run (a 2,048-token prompt in 4 steps,
                        # not 32); on the H200 page it left the 512-token prefill at 0.39-0.66 of native, within
                        # the 64-token steps' spread (docs/results/2026-12-01-h200-page-run4.md). A CPU adapter
                        # gains nothing from wider steps and pays for the larger scratch
AHEAD = 8               # greedy decode steps submitted before one read-back (lab.engine.session)
# A conv state keeps REWIND rows beyond the l_cache - 1 the next token reads, as a ring indexed by position
# (wgsl/shortconv.wgsl): the greedy steps GreedyAhead submits past a turn's end (up to a block read plus a block queued)
# advance the state past the tokens the session keeps, and the ring lets the next turn step back to them instead of
# recomputing the conversation. 16 rows of n_embd f32: 64 KB a layer at LFM2-1.2B's 2048.
REWIND = 2 * AHEAD
# A recurrent state (a delta-net's) cannot step back at all: it is the sum of every token so far. The session asks
# for a snapshot after the last step of each submitted block (lab.engine.session), and a turn that ends inside a block
# resumes from the latest snapshot at or before its end, one block back at most (GreedyAhead has at most the block it
# reads and the one queued after it in flight): three slots cover the block before, the block read and the block
# queued. A snapshot copies every recurrent and conv state of the model (LFM2 has no recurrent state: its conv ring's
# REWIND rows are its snapshot).
SNAPSHOTS = 3


def conv_ring(cfg: Config) -> int:
    """Rows of one layer's conv state: the l_cache - 1 the next token reads, plus REWIND."""
    return cfg.l_cache - 1 + REWIND


def prefill_batch(info) -> int:
    """The prefill step a page load uses on this adapter (lab.gpu.AdapterInfo)."""
    return DEFAULT_BATCH if info.software else GPU_BATCH



@dataclass(frozen=True)
class Scratch:
    """The buffers of a step and of the conversation, allocated once per engine; every buffer is kind CONVERSATION
    (Forget wipes them). B = max_batch rows; decode uses row 0. The step's own rows first; then the fields each block
    fills (lab.engine.blocks, each `Block.alloc`), None or () where the model has no such block."""
    step: gpu.Buffer            # the per-step uniform: pos, n_tokens, n_ctx (lab.ops.STEP)
    ids: gpu.Buffer             # [B] u32 token ids; greedy's argmax lands in ids[0]
    x: gpu.Buffer               # [B, n_embd] the residual stream
    xn: gpu.Buffer              # [B, n_embd] normed residual
    att: gpu.Buffer             # [B, q] a mixer's output (attention's, or a delta-net's), its out projection's input
    tmp: gpu.Buffer | None      # [B, n_embd] a branch's output before its post-norm (None without post-norms)
    last: gpu.Buffer            # [n_embd] the last row, the only one prefill's head reads
    logits: gpu.Buffer          # [1 or B, n_vocab]
    topk: gpu.Buffer            # [K] (u32 id, f32 logit) pairs for sampling
    kept: gpu.Buffer            # [AHEAD] u32 ids of greedy steps run ahead of one read-back
    xq: gpu.Buffer | None = None    # [B padded, widest input] int8: prefill's input to the int8 GEMM (int8 engines)
    xd: gpu.Buffer | None = None    # its (d, d * sum q) per block of 32
    # -- attention (blocks.attention)
    qkv: gpu.Buffer | None = None   # [B, qkv_width] the fused projection row [q | k | v] (| gate)
    qkv_width: int = 0              # floats per fused qkv row, the widest layer's
    k_cache: tuple[gpu.Buffer | None, ...] = ()     # per layer [n_ctx, n_head_kv * head_dim]; None where the layer
    v_cache: tuple[gpu.Buffer | None, ...] = ()     # has no cache of its own
    # -- the feed-forward (blocks.feedforward)
    gate_up: gpu.Buffer | None = None   # [B, 2 n_ff] the fused row [gate | up]
    h: gpu.Buffer | None = None         # [B, n_ff] GLU output (prefill; decode folds it into the down projection)
    # -- short conv and delta-net (blocks.shortconv, blocks.deltanet): per conv layer [conv_ring rows, conv_channels],
    # the conv input of the latest positions (row q % rows): a short conv's B*x, a delta-net's q, k, v
    conv_state: tuple[gpu.Buffer | None, ...] = ()
    bcx: gpu.Buffer | None = None   # [B, 3 n_embd] a short conv's in_proj rows [B | C | x]
    # per delta-net layer [ssm_v_heads, d_k, d_v] f32, state[(h d_k + r) d_v + c]
    recurrent: tuple[gpu.Buffer | None, ...] = ()
    delta_in: gpu.Buffer | None = None      # [B, delta_width] the in-projection rows [q k v | z | beta | alpha]
    delta_conv: gpu.Buffer | None = None    # [B, conv_channels] silu(conv(q k v)), the recurrence's input
    snapshots: tuple[gpu.Buffer, ...] = ()  # SNAPSHOTS copies of (every recurrent state, every conv state), in one
                                            # buffer each, in layer order
    # -- the per-layer inputs (blocks.perlayer) [B, n_layer x n_embd_per_layer] (layer il's slice at il x
    # n_embd_per_layer), and the projection of the scaled embedding that goes into them
    per_layer: gpu.Buffer | None = None
    per_layer_proj: gpu.Buffer | None = None
    # the fields of a block kind this list does not name, read as attributes all the same (`__getattr__`): a new
    # block needs no line here
    others: dict = field(default_factory=dict)

    def __getattr__(self, name: str):
        # called only where the normal lookup failed: a field of `others`
        others = self.__dict__.get("others", {})
        if name in others:
            return others[name]
        raise AttributeError(f"Scratch has no field {name!r}")

    @classmethod
    def alloc(cls, dev: gpu.Device, cfg: Config, blocks, n_ctx: int, B: int, logits_all: bool,
              int8: bool = False, kv: str = "f32") -> Scratch:
        """The step's own rows, then each block's fields (`blocks`: lab.engine.blocks.Blocks; each `Block.alloc`)."""
        conv, f32 = gpu.CONVERSATION, 4
        A = max(cfg.q_dim, cfg.ssm_inner)       # a mixer's output: attention's, or a delta-net's gated norm
        rows = B if logits_all else 1
        fields = dict(
            step=ops.make_step(dev, "step"),
            ids=dev.buffer(4 * B, conv, "ids [B] u32"),
            x=dev.buffer(f32 * B * cfg.n_embd, conv, "x residual [B, n_embd]"),
            xn=dev.buffer(f32 * B * cfg.n_embd, conv, "xn normed [B, n_embd]"),
            att=dev.buffer(f32 * B * A, conv, "attention out [B, q]"),
            tmp=dev.buffer(f32 * B * cfg.n_embd, conv, "branch out [B, n_embd]") if cfg.post_norms else None,
            last=dev.buffer(f32 * cfg.n_embd, conv, "last row [n_embd]"),
            logits=dev.buffer(f32 * rows * cfg.n_vocab, conv, f"logits [{rows}, n_vocab]"),
            topk=dev.buffer(8 * MAX_CANDIDATES, conv, "top-k pairs [K] (u32, f32)"),
            kept=dev.buffer(4 * AHEAD, conv, f"decoded ids [{AHEAD}] u32 (greedy steps ahead)"),
            **(cls._int8(dev, cfg, B) if int8 else {}))
        for block in blocks.all:
            for name, value in block.alloc(dev, n_ctx, B, kv).items():
                # per-layer fields two blocks fill (the conv states of two mixers) merge layer by layer
                old = fields.get(name)
                merged = isinstance(old, tuple)
                fields[name] = tuple(b if a is None else a for a, b in zip(old, value)) if merged else value
        named = {f.name for f in fields_of(cls)}
        return cls(**{k: v for k, v in fields.items() if k in named},
                   others={k: v for k, v in fields.items() if k not in named})

    @staticmethod
    def _int8(dev: gpu.Device, cfg: Config, B: int) -> dict:
        q_bytes, d_bytes = matmul_ops.i8_scratch_bytes(B, max(cfg.n_embd, cfg.q_dim, cfg.n_ff))
        return {"xq": dev.buffer(q_bytes, gpu.CONVERSATION, "prefill input int8 [B, widest]"),
                "xd": dev.buffer(d_bytes, gpu.CONVERSATION, "prefill input scales [B, widest / 32] (d, d sum q)")}
