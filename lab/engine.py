"""The GPU forward pass: weights resident, a KV cache, and two prebuilt plans (prefill of t tokens,
decode of one), each run as one compute pass with one submit.

    Config (lab.model)  ->  Engine: Weights (GGUF blocks on the GPU), Scratch (activations, KV cache),
                                    plans (list of Ops, bind groups built once at load)

Per step the CPU writes only the step uniform (position, token count) and, for prefill or a sampled
token, the ids; a greedy step reads back one u32 (the argmax writes the next token id straight into
the ids buffer, so the following decode step needs no write of it).

What it does not know: text (lab.tokenizer), turns and KV reuse (lab.session), files (`uploads`
says which file bytes go where; the native loader below and the browser's JS helper move them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import gpu, ops
from .gguf import Header, TensorInfo
from .model import Config, from_gguf
from .ops import attention as attn_ops
from .ops import elementwise, embed, glu, matmul, norm, rope, sample
from .ops.weights import alloc_weight, concat_placements, placements
from .shaders import KernelCache

DEFAULT_CTX = 2048      # tokens of KV cache made at load: 2 x 30 x 3 x 64 x 4 B x 2048 = 94 MB for SmolLM2
DEFAULT_BATCH = 64      # prefill chunk: prompts run in steps of at most this many tokens
TOP_K = sample.MAX_K    # candidates read back for a sampled token
AHEAD = 8               # greedy decode steps submitted before one read-back (lab.session)


class EngineError(RuntimeError):
    """A request the loaded engine cannot serve (context full, bad token id); the message says what to do."""


@dataclass(frozen=True)
class Upload:
    """One contiguous byte range of the model file and where it goes on the GPU."""
    tensor: str
    file_offset: int
    size: int
    buffer: gpu.Buffer
    buffer_offset: int = 0


@dataclass(frozen=True)
class Traced:
    """An activation recorded under llama.cpp's eval-callback name after op `after` of a plan."""
    name: str
    after: int              # index into the plan's op list
    buffer: gpu.Buffer
    width: int              # floats per token row
    stride: int             # floats between rows
    offset: int = 0         # floats before the first element of row 0
    rows: str = "tokens"    # "tokens" (t rows) or "one" (a single row)


class Engine:
    def __init__(self, device: gpu.Device, header: Header, cfg: Config | None = None, *,
                 n_ctx: int = DEFAULT_CTX, max_batch: int = DEFAULT_BATCH, logits_all: bool = False,
                 probe_attention: bool = False) -> None:
        self.device = device
        self.header = header
        self.cfg = cfg = cfg or from_gguf(header)
        if n_ctx < 2 or max_batch < 1:
            raise EngineError(f"context {n_ctx} and batch {max_batch} must be positive")
        self.n_ctx = n_ctx
        self.max_batch = max_batch
        self.logits_all = logits_all
        self.kernels = KernelCache(device)
        before = set(map(id, device.buffers))
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in header.tensors}
        self.uploads: list[Upload] = []
        self._alloc_weights()
        self._alloc_scratch(probe_attention)
        self._tails: dict[bool, dict[bool, list[ops.Op]]] = {}
        self.prefill_ops, self.prefill_trace = self._build(batched=True)
        self.decode_ops, self.decode_trace = self._build(batched=False)
        self._plans: dict[tuple[str, int, bool], object] = {}
        self.buffers = [b for b in device.buffers if id(b) not in before]   # what `close` frees

    def close(self) -> None:
        """Free every buffer this engine made (weights, activations, caches, parameters)."""
        for b in self.buffers:
            if b in self.device.buffers:
                self.device.destroy(b)
        self.buffers = []
        self._plans.clear()

    # -- weights ----------------------------------------------------------------------------------------
    def _alloc_weights(self) -> None:
        cfg = self.cfg
        self.w: dict[str, ops.Weight] = {}     # 2-D matrices, GGUF block layout
        self.v: dict[str, gpu.Buffer] = {}     # 1-D f32 vectors (norm weights, biases)
        # Projections that read the same input run as one matvec/matmul over their rows stacked:
        # proj["blk.N.qkv"] / ["blk.N.gate_up"] = [(weight, first output column), ...]
        self.proj: dict[str, list[tuple[ops.Weight, int]]] = {}
        from .model import expected_tensors
        shapes = expected_tensors(cfg)
        fused = set()
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            for key, names in (("qkv", ("attn_q", "attn_k", "attn_v")), ("gate_up", ("ffn_gate", "ffn_up"))):
                self.proj[b + key] = self._stack([f"{b}{n}.weight" for n in names])
                fused.update(f"{b}{n}.weight" for n in names)
            if cfg.qkv_bias:      # the three biases side by side, as the fused row [q | k | v] needs them
                names = [f"{b}attn_{n}.bias" for n in "qkv"]
                buf = self.device.buffer(4 * self.cfg.q_dim + 8 * self.cfg.kv_dim, gpu.WEIGHTS, b + "attn_qkv.bias")
                self.v[b + "attn_qkv.bias"] = buf
                off = 0
                for n in names:
                    t = self.tensors[n]
                    self.uploads.append(Upload(n, t.offset, t.nbytes, buf, off))
                    off += t.nbytes
                fused.update(names)
        for name, shape in shapes.items():
            if name in fused:
                continue
            t = self.tensors[name]
            if len(shape) == 1:
                buf = self.device.buffer(t.nbytes, gpu.WEIGHTS, name)
                self.v[name] = buf
                self.uploads.append(Upload(name, t.offset, t.nbytes, buf))
            else:
                w = alloc_weight(self.device, name, t.type, rows=shape[1], cols=shape[0])
                self.w[name] = w
                for part, off, size in placements(w):
                    self.uploads.append(Upload(name, t.offset + off, size, part.buffer))

    def _stack(self, names: list[str]) -> list[tuple[ops.Weight, int]]:
        """Runs of consecutive tensors of one type, each run allocated as one weight of stacked rows.
        A tensor joins a run only if its byte size is a multiple of 4, so every upload into the stacked
        buffer starts at a 4-byte offset (writeBuffer's rule) and no padding spills into a neighbour."""
        runs: list[list] = []
        for n in names:
            t = self.tensors[n]
            if runs and runs[-1][0].type == t.type and t.nbytes % 4 == 0 and runs[-1][-1].nbytes % 4 == 0:
                runs[-1].append(t)
            else:
                runs.append([t])
        out, col = [], 0
        for run in runs:
            rows = sum(t.shape[1] for t in run)
            name = "+".join(t.name for t in run)
            w = alloc_weight(self.device, name, run[0].type, rows=rows, cols=run[0].shape[0])
            self.w[name] = w
            for tname, t_off, part, p_off, size in concat_placements(w, [(t.name, t.shape[1]) for t in run]):
                self.uploads.append(Upload(tname, self.tensors[tname].offset + t_off, size, part.buffer, p_off))
            out.append((w, col))
            col += rows
        return out

    @property
    def weight_bytes(self) -> int:
        return sum(u.size for u in self.uploads)

    def upload_pieces(self, chunk: int = 32 << 20) -> list[Upload]:
        """The uploads cut into pieces of at most `chunk` bytes, in file order (so a loader reads the file
        front to back). A piece starts at a multiple of `chunk` within its range, so every buffer offset
        stays a multiple of 4 (writeBuffer's rule); only a range's last piece can have a size that is
        not, and the loaders pad it."""
        pieces = [Upload(u.tensor, u.file_offset + s, min(chunk, u.size - s), u.buffer, u.buffer_offset + s)
                  for u in self.uploads for s in range(0, u.size, chunk)]
        return sorted(pieces, key=lambda u: u.file_offset)

    def upload_file(self, path, chunk: int = 32 << 20) -> int:
        """Native loader: copy every piece from the file (the browser's is labUpload in web/worker.js)."""
        done = 0
        with open(path, "rb") as f:
            for u in self.upload_pieces(chunk):
                f.seek(u.file_offset)
                data = f.read(u.size)
                if len(data) != u.size:
                    raise EngineError(f"{path}: the file ends inside tensor {u.tensor}: it is truncated")
                if u.size % 4:
                    data += bytes(4 - u.size % 4)
                self.device.write(u.buffer, data, u.buffer_offset)
                done += u.size
        return done

    # -- activations and KV cache ----------------------------------------------------------------------
    def _alloc_scratch(self, probe_attention: bool) -> None:
        cfg, dev, B = self.cfg, self.device, self.max_batch
        conv = gpu.CONVERSATION
        f32 = 4
        self.qkv_width = cfg.q_dim + 2 * cfg.kv_dim
        self.step_buf = ops.make_step(dev, "step")
        self.ids = dev.buffer(4 * B, conv, "ids [B] u32")
        self.x = dev.buffer(f32 * B * cfg.n_embd, conv, "x residual [B, n_embd]")
        self.xn = dev.buffer(f32 * B * cfg.n_embd, conv, "xn normed [B, n_embd]")
        self.qkv = dev.buffer(f32 * B * self.qkv_width, conv, "qkv [B, q + 2 kv]")
        self.att = dev.buffer(f32 * B * cfg.q_dim, conv, "attention out [B, q]")
        self.tmp = dev.buffer(f32 * B * cfg.n_embd, conv, "branch out [B, n_embd]") if cfg.post_norms else None
        self.gate_up = dev.buffer(f32 * B * 2 * cfg.n_ff, conv, "gate|up [B, 2 n_ff]")
        self.h = dev.buffer(f32 * B * cfg.n_ff, conv, "glu out [B, n_ff]")
        self.last = dev.buffer(f32 * cfg.n_embd, conv, "last row [n_embd]")
        rows = B if self.logits_all else 1
        self.logits = dev.buffer(f32 * rows * cfg.n_vocab, conv, f"logits [{rows}, n_vocab]")
        self.topk = dev.buffer(8 * TOP_K, conv, "top-k pairs [K] (u32, f32)")
        self.kept = dev.buffer(4 * AHEAD, conv, f"decoded ids [{AHEAD}] u32 (greedy steps ahead)")
        kv_bytes = attn_ops.kv_cache_bytes(self.n_ctx, cfg.n_head_kv, cfg.head_dim)
        self.k_cache = [dev.buffer(kv_bytes, conv, f"k cache {il} [n_ctx, kv]") for il in range(cfg.n_layer)]
        self.v_cache = [dev.buffer(kv_bytes, conv, f"v cache {il} [n_ctx, kv]") for il in range(cfg.n_layer)]
        self.probe = None
        if probe_attention:
            self.probe = [dev.buffer(attn_ops.probe_bytes(B, cfg.n_head, self.n_ctx), conv,
                                     f"attention probe {il} [B, n_head, n_ctx]") for il in range(cfg.n_layer)]

    # -- plans ------------------------------------------------------------------------------------------
    def _mm(self, name: str, x: gpu.Buffer, y: gpu.Buffer, batched: bool, *, y_offset: int = 0,
            y_stride: int | None = None, accumulate: bool = False, **fused) -> list[ops.Op]:
        """Projection by weight `name`. Decode (matvec) takes the fused options of matmul.matvec."""
        w = self.w[name]
        if batched:
            return matmul.matmul(self.device, self.kernels, w, x, y, self.step_buf, max_tokens=self.max_batch,
                                 accumulate=accumulate, y_offset=y_offset, y_stride=y_stride)
        return matmul.matvec(self.device, self.kernels, w, x, y, self.step_buf, y_offset=y_offset,
                             accumulate=accumulate, **fused)

    def _normed_proj(self, key: str, norm_w: str, y: gpu.Buffer, width: int, batched: bool,
                     bias: str | None = None) -> list[list[ops.Op]]:
        """RMSNorm of x, then the stacked projections proj[key] into rows of `width` floats of y (plus a
        bias over the whole row). Prefill: a norm op, matmuls, a bias op. Decode: the norm and the bias
        run inside each matvec (the first one stores xn). Returns op lists; the first leaves xn written."""
        cfg, dev, kc, step = self.cfg, self.device, self.kernels, self.step_buf
        if batched:
            out = [norm.rms_norm(dev, kc, self.x, self.v[norm_w], self.xn, step, cfg.n_embd, cfg.eps)]
            out += [self._mm(w.name, self.xn, y, True, y_offset=col, y_stride=width) for w, col in self.proj[key]]
            if bias:
                out.append(elementwise.add_bias(dev, kc, y, self.v[bias], step, width, stride=width, offset=0))
            return out
        return [self._mm(w.name, self.x, y, False, y_offset=col, norm=(self.v[norm_w], cfg.eps), xn=self.xn,
                         write_xn=i == 0, **({"bias": self.v[bias], "bias_offset": col} if bias else {}))
                for i, (w, col) in enumerate(self.proj[key])]

    def _build(self, batched: bool) -> tuple[list[ops.Op], list[Traced]]:
        cfg, dev, kc, step = self.cfg, self.device, self.kernels, self.step_buf
        E, Q, KV, W = cfg.n_embd, cfg.q_dim, cfg.kv_dim, self.qkv_width
        plan: list[ops.Op] = []
        trace: list[Traced] = []

        def add(op_list, name=None, buf=None, width=0, stride=None, offset=0, rows="tokens"):
            plan.extend(op_list)
            if name:
                trace.append(Traced(name, len(plan) - 1, buf, width, stride or width, offset, rows))

        def add_normed(op_lists, name):
            add(op_lists[0], name, self.xn, E)
            for o in op_lists[1:]:
                add(o)

        act = "geglu" if cfg.gelu else "swiglu"
        # inp_embd: token rows, scaled by sqrt(n_embd) for gemma3
        add(embed.get_rows(dev, kc, self.w["token_embd.weight"], self.ids, self.x, step, scale=cfg.embd_scale),
            "inp_embd" if cfg.embd_scale == 1.0 else "inp_scaled", self.x, E)
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            # attention block: x -> norm -> q, k, v (fused row [q | k | v], bias) -> rope -> cache -> attention
            add_normed(self._normed_proj(b + "qkv", b + "attn_norm.weight", self.qkv, W, batched,
                                         b + "attn_qkv.bias" if cfg.qkv_bias else None), f"attn_norm-{il}")
            if cfg.qk_norm:     # per head over the adjacent Q and K heads, each part with its own weight
                add(norm.rms_norm(dev, kc, self.qkv, self.v[b + "attn_q_norm.weight"], self.qkv, step, Q + KV, cfg.eps,
                                  group=cfg.head_dim, in_stride=W, in_offset=0, w2=self.v[b + "attn_k_norm.weight"],
                                  split=cfg.n_head))
            base = cfg.rope_base_local if cfg.sliding[il] else cfg.rope_base
            # Q heads then K heads are adjacent in the fused row: one rope op rotates both.
            add(rope.rope(dev, kc, self.qkv, step, cfg.n_head + cfg.n_head_kv, cfg.head_dim, cfg.n_rot, base,
                          cfg.rope_scale, mode="neox" if cfg.rope_neox else "adjacent", row_stride=W, col_offset=0),
                f"Qcur_rope-{il}", self.qkv, Q, W, 0)
            trace.append(Traced(f"Kcur_rope-{il}", len(plan) - 1, self.qkv, KV, W, Q))
            trace.append(Traced(f"Vcur-{il}", len(plan) - 1, self.qkv, KV, W, Q + KV))
            add(attn_ops.kv_write(dev, kc, self.qkv, self.k_cache[il], self.v_cache[il], step,
                                  n_kv_head=cfg.n_head_kv, head_dim=cfg.head_dim, src_stride=W, k_offset=Q,
                                  v_offset=Q + KV, n_ctx=self.n_ctx))
            add(self.attention_op(il, batched, self.probe[il] if self.probe else None), f"kqv_out-{il}", self.att, Q)
            # output projection; the residual add is folded into it unless gemma3's post-norm sits between
            if cfg.post_norms:
                add(self._mm(b + "attn_output.weight", self.att, self.tmp, batched))
                add(norm.rms_norm(dev, kc, self.tmp, self.v[b + "post_attention_norm.weight"], self.tmp, step, E,
                                  cfg.eps, residual=self.x), f"attn_post_norm-{il}", self.tmp, E)
                trace.append(Traced(f"ffn_inp-{il}", len(plan) - 1, self.x, E, E))
            else:
                add(self._mm(b + "attn_output.weight", self.att, self.x, batched, accumulate=True),
                    f"ffn_inp-{il}", self.x, E)
            # feed-forward: norm -> gate|up (fused row) -> (silu|gelu)(gate) * up -> down (+ residual);
            # decode folds the GLU into the down projection's input
            add_normed(self._normed_proj(b + "gate_up", b + "ffn_norm.weight", self.gate_up, 2 * cfg.n_ff, batched),
                       f"ffn_norm-{il}")
            down_in, down_opts = self.gate_up, {"glu": act}
            if batched:
                add(glu.glu(dev, kc, self.gate_up, None, self.h, step, cfg.n_ff, act=act))
                down_in, down_opts = self.h, {}
            if cfg.post_norms:
                add(self._mm(b + "ffn_down.weight", down_in, self.tmp, batched, **down_opts),
                    f"ffn_out-{il}", self.tmp, E)
                add(norm.rms_norm(dev, kc, self.tmp, self.v[b + "post_ffw_norm.weight"], self.tmp, step, E,
                                  cfg.eps, residual=self.x), f"ffn_post_norm-{il}", self.tmp, E)
                trace.append(Traced(f"l_out-{il}", len(plan) - 1, self.x, E, E))
            else:
                add(self._mm(b + "ffn_down.weight", down_in, self.x, batched, accumulate=True, **down_opts),
                    f"l_out-{il}", self.x, E)
        # output: final norm, then the head on the last row only (or every row for logits_all). The head
        # keeps its own norm op: folded in, each of its n_vocab / 4 workgroups would re-read x.
        add(norm.rms_norm(dev, kc, self.x, self.v["output_norm.weight"], self.xn, step, E, cfg.eps),
            "result_norm", self.xn, E)
        head = self.w.get("output.weight", self.w["token_embd.weight"])
        if self.logits_all and batched:
            add(matmul.matmul(dev, kc, head, self.xn, self.logits, step, max_tokens=self.max_batch),
                "result_output", self.logits, cfg.n_vocab)
            rows = "last"
        else:
            last = self.xn
            if batched:     # decode's one row is already the last
                add(elementwise.last_row(dev, kc, self.xn, self.last, step, E))
                last = self.last
            add(matmul.matvec(dev, kc, head, last, self.logits, step), "result_output", self.logits,
                cfg.n_vocab, rows="one")
            rows = 1
        if cfg.final_softcap:
            raise EngineError("final logit soft-capping is not implemented")
        # The tail picks the next token: greedy's argmax lands in ids[0], ready to be the next decode step's
        # input; sampling reads back the top-k candidates instead (the top-k pass costs 13% of a decode
        # step on lavapipe, so greedy plans leave it out).
        self._tails[batched] = {
            False: sample.argmax(dev, kc, self.logits, self.ids, step, cfg.n_vocab, rows=rows),
            True: sample.top_k(dev, kc, self.logits, self.topk, step, cfg.n_vocab, TOP_K, rows=rows)}
        return plan, trace

    def attention_op(self, il: int, batched: bool, probe: gpu.Buffer | None = None) -> list[ops.Op]:
        """Layer il's attention over the cache, as the plans run it; lab.probes builds it again with a `probe`
        buffer (attention probabilities), so the probe variant can never drift from the plans' own."""
        cfg = self.cfg
        return attn_ops.attention(self.device, self.kernels, self.qkv, self.k_cache[il], self.v_cache[il], self.att,
                                  self.step_buf, n_head=cfg.n_head, n_kv_head=cfg.n_head_kv, head_dim=cfg.head_dim,
                                  q_stride=self.qkv_width, q_offset=0, n_ctx=self.n_ctx, scale=cfg.attn_scale,
                                  window=cfg.sliding_window if cfg.sliding[il] else 0, softcap=cfg.attn_softcap,
                                  probe=probe, mode="prefill" if batched else "decode",
                                  # split-K decode and narrow prefill tiles feed a GPU's many cores; a CPU
                                  # adapter pays per workgroup, so there the keys stay in one chunk and the
                                  # tiles wide (measured on lavapipe: narrow tiles made prefill attention 4x slower)
                                  chunk=self.n_ctx if self.device.info.software else None,
                                  narrow=not self.device.info.software)

    def ops_for(self, t: int, sampled: bool = False) -> list[ops.Op]:
        batched = t > 1
        return (self.prefill_ops if batched else self.decode_ops) + self._tails[batched][sampled]

    def plan(self, t: int, sampled: bool = False):
        """The prepared dispatch list for a step of t tokens (prefill for t > 1), cached per (t, sampled)."""
        key = ("decode" if t == 1 else "prefill", t, sampled)
        p = self._plans.get(key)
        if p is None:
            p = self.device.prepare([d for d in (op.at(t) for op in self.ops_for(t, sampled)) if all(d.groups)])
            if len(self._plans) > 32:
                self._plans.pop(next(iter(k for k in self._plans if k[0] == "prefill")))
            self._plans[key] = p
        return p

    # -- steps ------------------------------------------------------------------------------------------
    def _check(self, ids, pos: int) -> None:
        t = len(ids)
        if not 1 <= t <= self.max_batch:
            raise EngineError(f"a step takes 1 to {self.max_batch} tokens, not {t}")
        if pos + t > self.n_ctx:
            raise EngineError(f"the conversation would reach {pos + t} tokens, past the context of {self.n_ctx} "
                              f"made at load: start a new chat, or load with a larger context")
        bad = [i for i in ids if not 0 <= i < self.cfg.n_vocab]
        if bad:
            raise EngineError(f"token id {bad[0]} is outside the vocabulary of {self.cfg.n_vocab}")

    def step(self, ids: list[int] | None, pos: int, t: int | None = None, sampled: bool = False,
             keep: int | None = None) -> None:
        """Submit one step of t tokens at `pos`. ids=None reuses ids[0] (the previous greedy argmax).
        sampled=True ends the step with top-k (read with `top_k`) instead of argmax (read with `argmax`).
        keep=i also copies the argmax to slot i of `kept`, so that several greedy steps can run before
        one read-back (`kept_ids`): each overwrites ids[0]."""
        t = len(ids) if ids is not None else (t or 1)
        self._check(ids if ids is not None else [0] * t, pos)
        writes = [(self.step_buf, 0, ops.step_bytes(pos, t, self.n_ctx))]
        if ids is not None:
            writes.append((self.ids, 0, struct.pack(f"<{t}I", *ids)))
        copies = ()
        if keep is not None:
            if sampled or not 0 <= keep < AHEAD:
                raise EngineError(f"keep={keep}: greedy steps only, slots 0..{AHEAD - 1}")
            copies = [(self.ids, 0, self.kept, 4 * keep, 4)]
        self.device.run(self.plan(t, sampled), writes, copies)

    async def kept_ids(self, n: int) -> list[int]:
        return list(struct.unpack(f"<{n}I", await self.device.read(self.kept, 0, 4 * n)))

    async def argmax(self) -> int:
        return struct.unpack("<I", await self.device.read(self.ids, 0, 4))[0]

    async def top_k(self) -> list[tuple[int, float]]:
        raw = await self.device.read(self.topk, 0, 8 * TOP_K)
        pairs = [sample.PAIR.unpack_from(raw, 8 * i) for i in range(TOP_K)]
        return [(i, v) for i, v in pairs if i != sample.NONE]

    async def logits(self, rows: int = 1) -> list[float]:
        raw = await self.device.read(self.logits, 0, 4 * rows * self.cfg.n_vocab)
        return list(struct.unpack(f"<{rows * self.cfg.n_vocab}f", raw))

    async def traced(self, ids: list[int], pos: int) -> dict[str, bytes]:
        """Run one step op by op and read every traced activation: {name: raw f32 bytes, [rows, width]}."""
        t = len(ids)
        self._check(ids, pos)
        op_list, trace = self.ops_for(t), (self.decode_trace if t == 1 else self.prefill_trace)
        out: dict[str, bytes] = {}
        done = 0
        writes = [(self.step_buf, 0, ops.step_bytes(pos, t, self.n_ctx)), (self.ids, 0, struct.pack(f"<{t}I", *ids))]
        for tr in sorted(trace, key=lambda r: r.after):
            if tr.after >= done:
                seg = [d for d in (op.at(t) for op in op_list[done:tr.after + 1]) if all(d.groups)]
                self.device.run(seg, writes)
                writes, done = [], tr.after + 1
            rows = 1 if tr.rows == "one" else t
            raw = await self.device.read(tr.buffer, 4 * tr.offset, 4 * ((rows - 1) * tr.stride + tr.width))
            out[tr.name] = b"".join(raw[4 * r * tr.stride: 4 * (r * tr.stride + tr.width)] for r in range(rows))
        if done < len(op_list):
            self.device.run([d for d in (op.at(t) for op in op_list[done:]) if all(d.groups)], writes)
        return out

    def dispatches_per_step(self, t: int, sampled: bool = False) -> int:
        return sum(1 for op in self.ops_for(t, sampled) if all(op.at(t).groups))
