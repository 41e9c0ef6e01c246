"""What the engine keeps between the ops of a step and between steps: the activations, the KV cache of the attention
layers, the conv states of lfm2's short-conv and qwen35's delta-net layers, and the delta-net layers' recurrent states
with their snapshots (`Scratch`), and the sizes they are made at (the prefill step's rows, the greedy steps run ahead
of a read-back, the positions a conv state can step back, the snapshots a recurrent state keeps).

    Scratch.alloc(device, cfg, n_ctx, B, ...)   every buffer kind CONVERSATION, each with its shape

lab.engine.budget runs `Scratch.alloc` against a device that only records sizes, so the memory budget and the engine
share one allocation. What it does not know: the weights (lab.ops.weights) or the plans that use these buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab import gpu, ops
from lab.format.model import Config
from lab.ops import attention as attn_ops
from lab.ops import deltanet as deltanet_ops
from lab.ops import matmul as matmul_ops
from lab.ops import shortconv as shortconv_ops
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
# A recurrent state (qwen35's delta-net) cannot step back at all: it is the sum of every token so far. The session asks
# for a snapshot after the last step of each submitted block (lab.engine.session), and a turn that ends inside a block
# resumes from the latest snapshot at or before its end, one block back at most (GreedyAhead has at most the block it
# reads and the one queued after it in flight): three slots cover the block before, the block read and the block
# queued. A snapshot copies every recurrent and conv state of the model (LFM2 has no recurrent state: its conv ring's
# REWIND rows are its snapshot).
SNAPSHOTS = 3


def conv_ring(cfg: Config) -> int:
    """Rows of one layer's conv state: the l_cache - 1 the next token reads, plus REWIND."""
    return cfg.l_cache - 1 + REWIND


def qkv_width(cfg: Config, il: int) -> int:
    """Floats of layer il's projection row: [q | k | v] (qwen35: | gate), in the layer's own sizes (gemma4's differ
    by layer); Q alone on a layer that reads an earlier layer's K/V."""
    q = cfg.q_dim_of(il)
    return q + (2 * cfg.kv_dim_of(il) if cfg.has_kv(il) else 0) + (q if cfg.attn_gate else 0)


def prefill_batch(info) -> int:
    """The prefill step a page load uses on this adapter (lab.gpu.AdapterInfo)."""
    return DEFAULT_BATCH if info.software else GPU_BATCH



@dataclass(frozen=True)
class Scratch:
    """Activations, the KV cache and the conv states, allocated once per engine; every buffer is kind CONVERSATION
    (Forget wipes them). B = max_batch rows; decode uses row 0."""
    step: gpu.Buffer            # the per-step uniform: pos, n_tokens, n_ctx (lab.ops.STEP)
    ids: gpu.Buffer             # [B] u32 token ids; greedy's argmax lands in ids[0]
    x: gpu.Buffer               # [B, n_embd] the residual stream
    xn: gpu.Buffer              # [B, n_embd] normed residual
    qkv: gpu.Buffer             # [B, q + 2 kv] the fused projection row [q | k | v]
    att: gpu.Buffer             # [B, q] attention output
    tmp: gpu.Buffer | None      # [B, n_embd] branch output before gemma3's post-norm (None without post-norms)
    gate_up: gpu.Buffer         # [B, 2 n_ff] the fused row [gate | up]
    h: gpu.Buffer               # [B, n_ff] GLU output (prefill; decode folds it into the down projection)
    last: gpu.Buffer            # [n_embd] the last row, the only one prefill's head reads
    logits: gpu.Buffer          # [1 or B, n_vocab]
    topk: gpu.Buffer            # [K] (u32 id, f32 logit) pairs for sampling
    kept: gpu.Buffer            # [AHEAD] u32 ids of greedy steps run ahead of one read-back
    k_cache: tuple[gpu.Buffer | None, ...]   # per layer [n_ctx, n_head_kv * head_dim]; None for a short-conv layer
    v_cache: tuple[gpu.Buffer | None, ...]
    qkv_width: int              # floats per fused qkv row
    # per conv layer [conv_ring rows, conv_channels] the conv input of the latest positions (row q % rows): lfm2's B*x,
    # qwen35's q, k, v; None for an attention layer
    conv_state: tuple[gpu.Buffer | None, ...] = ()
    bcx: gpu.Buffer | None = None   # [B, 3 n_embd] lfm2's in_proj rows [B | C | x] (None without short-conv layers)
    # qwen35: per delta-net layer [ssm_v_heads, d_k, d_v] f32, state[(h d_k + r) d_v + c] (None for other layers)
    recurrent: tuple[gpu.Buffer | None, ...] = ()
    delta_in: gpu.Buffer | None = None      # [B, delta_width] the delta-net in-projection rows [q k v | z | beta | alpha]
    delta_conv: gpu.Buffer | None = None    # [B, conv_channels] silu(conv(q k v)), the recurrence's input
    # SNAPSHOTS copies of (every recurrent state, every conv state) in one buffer each, in layer order (qwen35)
    snapshots: tuple[gpu.Buffer, ...] = ()
    xq: gpu.Buffer | None = None    # [B padded, widest input] int8: prefill's input to the int8 GEMM (int8 engines)
    xd: gpu.Buffer | None = None    # its (d, d * sum q) per block of 32
    # gemma4's per-layer inputs [B, n_layer x n_embd_per_layer] (layer il's slice at il x n_embd_per_layer), and the
    # projection of the scaled embedding that goes into them (None without per-layer embeddings)
    per_layer: gpu.Buffer | None = None
    per_layer_proj: gpu.Buffer | None = None

    @classmethod
    def alloc(cls, dev: gpu.Device, cfg: Config, n_ctx: int, B: int, logits_all: bool,
              int8: bool = False, kv: str = "f32") -> Scratch:
        conv, f32 = gpu.CONVERSATION, 4
        W = max(qkv_width(cfg, il) for il in range(cfg.n_layer))     # the widest projection row of a layer
        A = max(cfg.q_dim, cfg.ssm_inner)       # attention's output, or a delta-net layer's gated-norm output
        rows = B if logits_all else 1
        # a cache per attention layer with K/V of its own (gemma4's shared-KV layers read an earlier layer's)
        attends = {il for il in cfg.attention_layers if cfg.has_kv(il)}
        kv_bytes = [attn_ops.kv_cache_bytes(n_ctx, cfg.n_head_kv_of(il), cfg.head_dim_of(il), kv)
                    for il in range(cfg.n_layer)]
        return cls(
            step=ops.make_step(dev, "step"),
            ids=dev.buffer(4 * B, conv, "ids [B] u32"),
            x=dev.buffer(f32 * B * cfg.n_embd, conv, "x residual [B, n_embd]"),
            xn=dev.buffer(f32 * B * cfg.n_embd, conv, "xn normed [B, n_embd]"),
            qkv=dev.buffer(f32 * B * W, conv, "qkv [B, q + 2 kv]" + (" + gate" if cfg.attn_gate else "")),
            att=dev.buffer(f32 * B * A, conv, "attention out [B, q]"),
            tmp=dev.buffer(f32 * B * cfg.n_embd, conv, "branch out [B, n_embd]") if cfg.post_norms else None,
            gate_up=dev.buffer(f32 * B * 2 * cfg.n_ff, conv, "gate|up [B, 2 n_ff]"),
            h=dev.buffer(f32 * B * cfg.n_ff, conv, "glu out [B, n_ff]"),
            last=dev.buffer(f32 * cfg.n_embd, conv, "last row [n_embd]"),
            logits=dev.buffer(f32 * rows * cfg.n_vocab, conv, f"logits [{rows}, n_vocab]"),
            topk=dev.buffer(8 * MAX_CANDIDATES, conv, "top-k pairs [K] (u32, f32)"),
            kept=dev.buffer(4 * AHEAD, conv, f"decoded ids [{AHEAD}] u32 (greedy steps ahead)"),
            k_cache=tuple(dev.buffer(kv_bytes[il], conv, f"k cache {il} [n_ctx, kv]") if il in attends else None
                          for il in range(cfg.n_layer)),
            v_cache=tuple(dev.buffer(kv_bytes[il], conv, f"v cache {il} [n_ctx, kv]") if il in attends else None
                          for il in range(cfg.n_layer)),
            qkv_width=W, **(cls._int8(dev, cfg, B) if int8 else {}), **(cls._per_layer(dev, cfg, B)), **(cls._conv(dev, cfg, B) if cfg.recurrent else {}))

    @staticmethod
    def _conv(dev: gpu.Device, cfg: Config, B: int) -> dict:
        ring, n, conv = conv_ring(cfg), cfg.conv_channels, gpu.CONVERSATION
        convs = set(cfg.conv_layers)
        out = {"conv_state": tuple(dev.buffer(shortconv_ops.state_bytes(n, ring), conv,
                                              f"conv state {il} [{ring}, {n}]") if il in convs else None
                                   for il in range(cfg.n_layer))}
        if cfg.shortconv:
            out["bcx"] = dev.buffer(4 * B * 3 * cfg.n_embd, conv, "bcx [B, 3 n_embd]")
        if cfg.delta:
            d, hv = cfg.ssm_head_dim, cfg.ssm_v_heads
            state = deltanet_ops.state_bytes(hv, d)
            out["recurrent"] = tuple(dev.buffer(state, conv, f"delta-net state {il} [{hv}, {d}, {d}]")
                                     if cfg.is_delta(il) else None for il in range(cfg.n_layer))
            out["delta_in"] = dev.buffer(4 * B * cfg.delta_width, conv, "delta-net in-projection [B, width]")
            out["delta_conv"] = dev.buffer(4 * B * n, conv, f"delta-net conv out [B, {n}]")
            size = len(cfg.delta_layers) * state + len(convs) * shortconv_ops.state_bytes(n, ring)
            out["snapshots"] = tuple(dev.buffer(size, conv, f"state snapshot {i} (recurrent and conv states)")
                                     for i in range(SNAPSHOTS))
        return out

    @staticmethod
    def _per_layer(dev: gpu.Device, cfg: Config, B: int) -> dict:
        if not cfg.n_embd_per_layer:
            return {}
        n = cfg.n_layer * cfg.n_embd_per_layer
        return {"per_layer": dev.buffer(4 * B * n, gpu.CONVERSATION, f"per-layer inputs [B, {n}]"),
                "per_layer_proj": dev.buffer(4 * B * n, gpu.CONVERSATION, f"per-layer projection [B, {n}]")}

    @staticmethod
    def _int8(dev: gpu.Device, cfg: Config, B: int) -> dict:
        q_bytes, d_bytes = matmul_ops.i8_scratch_bytes(B, max(cfg.n_embd, cfg.q_dim, cfg.n_ff))
        return {"xq": dev.buffer(q_bytes, gpu.CONVERSATION, "prefill input int8 [B, widest]"),
                "xd": dev.buffer(d_bytes, gpu.CONVERSATION, "prefill input scales [B, widest / 32] (d, d sum q)")}
