"""Weights on the GPU: GGUF blocks copied as they are, split into row ranges that each fit one binding.

A tensor of `rows` x `cols` (GGUF ne1 x ne0) is `rows * row_bytes` bytes, row after row. It is cut
into parts of whole rows, each at most the storage binding limit (greedy: every part but the last
is as full as the limit allows), one buffer per part, each padded to a multiple of 4 bytes.
`placements` is the pure byte-range mapping loaders use (native file reads, browser File.slice).

`ModelWeights` places a whole model: every tensor the config expects, projections that share an input
stacked into one weight, a routed layer's experts as `Experts` (gate and up interleaved per expert where their types
agree, so one dispatch computes an expert's [gate | up] row), and the list of file byte ranges (`Upload`) that fill
them. It never holds
weight bytes: the native loader (`upload_file`) and the browser's `labUpload` (web/worker.js) move them.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass

from lab import gpu
from lab.format.ggml import KERNEL_TYPES, GgmlType
from lab.format.gguf import GGUFError
from lab.format.model import expected_tensors, is_flat
from lab.ops import Experts, Op, Weight, WeightPart, init

UPLOAD_CHUNK = 32 << 20     # bytes a loader reads and writes at a time: host memory holds about one chunk


def dequant_consts(type: GgmlType) -> dict:
    """The WGSL constants DQ and HALF for `type`, or GpuError naming an unsupported one."""
    try:
        fn, half = KERNEL_TYPES[type.name]
    except KeyError:
        raise gpu.GpuError(f"{type.name} weights are not supported by the kernels "
                           f"(supported: {', '.join(KERNEL_TYPES)})") from None
    return {"DQ": fn, "HALF": half}


def check_cols(type: GgmlType, cols: int, name: str) -> None:
    """Rows must be whole blocks, and whole groups of 8 values (float types: cols % 8 == 0)."""
    type.row_bytes(cols)                     # raises on a partial block
    if cols % 8 or cols <= 0:
        raise ValueError(f"{name}: {cols} columns; the kernels need a positive multiple of 8")


def alloc_weight(device: gpu.Device, name: str, type: GgmlType, rows: int, cols: int,
                 max_binding: int | None = None, kind: str = gpu.WEIGHTS, row_group: int = 1) -> Weight:
    """Buffers (zero-filled, of `kind`: WEIGHTS but for a model made from the user's text) for a rows x cols tensor
    of `type`, split to fit `max_binding`; every part but the last a whole number of `row_group` rows (a stack of
    experts: whole experts a part)."""
    dequant_consts(type)
    check_cols(type, cols, name)
    if rows <= 0:
        raise ValueError(f"{name}: {rows} rows")
    limit = device.info.limits["max_storage_buffer_binding_size"] if max_binding is None else max_binding
    limit = min(limit, device.info.limits["max_buffer_size"]) & ~3
    row_bytes = type.row_bytes(cols)
    per_part = limit // row_bytes // row_group * row_group   # whole rows (of whole groups); padding to 4 never
                                                             # passes a 4-aligned limit
    if per_part == 0:
        what = "one row" if row_group == 1 else f"one group of {row_group} rows (an expert)"
        raise gpu.GpuError(f"{name}: {what} is {row_bytes * row_group:,} bytes, over this GPU's storage binding "
                           f"limit ({limit:,} bytes)")
    parts = []
    for i, first in enumerate(range(0, rows, per_part)):
        n = min(per_part, rows - first)
        label = name if rows <= per_part else f"{name}[{i}]"
        parts.append(WeightPart(device.buffer(n * row_bytes, kind, label), first, n))
    return Weight(name, type, rows, cols, tuple(parts))


def placements(weight: Weight) -> list[tuple[WeightPart, int, int]]:
    """(part, byte offset in the tensor's data, byte count) for each part, in order."""
    rb = weight.row_bytes
    return [(part, part.first_row * rb, part.n_rows * rb) for part in weight.parts]


def concat_placements(weight: Weight, sources: list[tuple[str, int]]) -> list[tuple[str, int, WeightPart, int, int]]:
    """For a weight whose rows are several tensors' rows one after another (`sources`: (name, rows) in
    order), the copies that fill it: (tensor, byte offset in that tensor, part, byte offset in the part,
    byte count). A part may take rows from two tensors, a tensor may span two parts."""
    rb = weight.row_bytes
    if sum(n for _, n in sources) != weight.rows:
        raise ValueError(f"{weight.name}: sources have {sum(n for _, n in sources)} rows, the weight {weight.rows}")
    out = []
    start = 0
    for name, n in sources:
        lo, hi = start * rb, (start + n) * rb
        for part, p_off, p_size in placements(weight):
            a, b = max(lo, p_off), min(hi, p_off + p_size)
            if a < b:
                out.append((name, a - lo, part, a - p_off, b - a))
        start += n
    return out


def upload_weight(device: gpu.Device, weight: Weight, data) -> None:
    """Copy the tensor's bytes (rows * row_bytes, GGUF layout) into its parts."""
    view = memoryview(data).cast("B")
    if len(view) != weight.rows * weight.row_bytes:
        raise ValueError(f"{weight.name}: {len(view):,} bytes given, {weight.rows * weight.row_bytes:,} expected")
    for part, offset, nbytes in placements(weight):
        chunk = view[offset:offset + nbytes]
        if nbytes % 4:
            chunk = bytes(chunk) + bytes(4 - nbytes % 4)
        device.write(part.buffer, chunk)


# -- a model's weights --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upload:
    """One contiguous byte range of the model file and where it goes on the GPU."""
    tensor: str
    file_offset: int
    size: int
    buffer: gpu.Buffer
    buffer_offset: int = 0

    def record(self) -> dict:
        """The piece as web/worker.js's labUpload reads it (the buffer as the backend's handle)."""
        return {"fileOffset": self.file_offset, "size": self.size, "buffer": self.buffer.handle,
                "bufferOffset": self.buffer_offset}


@dataclass(frozen=True)
class Piece:
    """Rows of a file tensor inside a weight the engine runs: `rows` rows from the weight's row `row`, the tensor's
    from its row `at`."""
    tensor: str
    row: int
    at: int
    rows: int


def run_pieces(run: str, views: dict, starts: dict[int, str]) -> list[Piece]:
    """The file tensors' rows a weight holds, in its row order (`run`: the weight's name, its views joined with "+"
    as ModelWeights._stack names a stacked run; `views`: the engine's tensor table, lab.format.model.tensor_views;
    `starts`: the file's tensors by their first byte). A view belongs to the file tensor it lies in (the last to
    start at or before it), at the rows its bytes say: phi3's fused attn_qkv is one piece of three views, qwen35's
    attn_q ([q | gate] a head in the file) two pieces a head, apart in the run ([q heads | k | v | gate heads]).
    Rows that follow each other in the weight and in the tensor are one piece."""
    offsets = sorted(starts)
    out: list[Piece] = []
    row = 0
    for name in run.split("+"):
        v = views[name]
        first = offsets[bisect_right(offsets, v.offset) - 1]
        source, at, n = starts[first], (v.offset - first) // v.type.row_bytes(v.shape[0]), int(v.shape[1])
        last = out[-1] if out else None
        if last is not None and last.tensor == source and last.row + last.rows == row and last.at + last.rows == at:
            out[-1] = Piece(source, last.row, last.at, last.rows + n)
        else:
            out.append(Piece(source, row, at, n))
        row += n
    return out


class ModelWeights:
    """Every tensor of the model on the GPU, in GGUF block layout, and the uploads that fill them.

    matrices: 2-D weights by name ("blk.3.attn_output.weight"), each split into binding-sized row ranges.
    vectors:  1-D f32 tensors (norm weights, biases) by name, and the flat ones a kernel reads whole
              (lab.format.model.FLAT_TENSORS: lfm2's conv kernel [n_embd, l_cache]).
    experts:  a routed layer's experts by key, each a list of (Experts, first output column) as stacked's:
              experts["blk.N.gate_up"] (the [gate | up] row of an expert: one Experts of 2 n_ff_exp rows an expert,
              gate's then up's, where their types agree, else one each), experts["blk.N.down"]; the router joins
              stacked as stacked["blk.N.router"], so it takes the normed projection the dense FFN's gate_up takes.
    stacked:  projections that read the same input, run as one matvec/matmul over their rows stacked:
              stacked["blk.N.qkv"] / ["blk.N.gate_up"] = [(weight, first output column), ...] (a short-conv layer's
              in_proj alone as stacked["blk.N.in_proj"], so it takes the same normed projection; a delta-net layer's
              four input projections as stacked["blk.N.delta_in"]: `_mixer`); with qkv biases,
              vectors["blk.N.attn_qkv.bias"] holds the three side by side, as the fused row [q | k | v] needs.
    The stacked rows are the only copy of those tensors (never a second one).
    kind: the buffers' kind: WEIGHTS for a file's, CONVERSATION for a model trained from scratch in the page (made of
    the user's text: Forget wipes it and reads it back; lab/worker/scratch.py) or a file's once the page's full
    fine-tuning trains it (`rekind`)."""

    def __init__(self, device: gpu.Device, cfg, tensors: dict, kind: str = gpu.WEIGHTS) -> None:
        self.device, self.kind = device, kind
        self.tensors = tensors              # name -> gguf.TensorInfo
        self.matrices: dict[str, Weight] = {}
        self.vectors: dict[str, gpu.Buffer] = {}
        self.stacked: dict[str, list[tuple[Weight, int]]] = {}
        self.experts: dict[str, list[tuple[Experts, int]]] = {}
        self.uploads: list[Upload] = []
        fused = set()
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            ffn = ("router", ("ffn_gate_inp.weight",)) if cfg.routed(il) else \
                ("gate_up", ("ffn_gate.weight", "ffn_up.weight"))
            if cfg.routed(il):
                fused.update(self._experts(cfg, il))
            for key, names in (self._mixer(cfg, il), ffn):
                self.stacked[b + key] = self._stack([b + n for n in names])
                fused.update(b + n for n in names)
            if cfg.qkv_bias:
                names = [f"{b}attn_{n}.bias" for n in "qkv"]
                buf = device.buffer(4 * cfg.q_dim + 8 * cfg.kv_dim, kind, b + "attn_qkv.bias")
                self.vectors[b + "attn_qkv.bias"] = buf
                off = 0
                for n in names:
                    t = tensors[n]
                    self.uploads.append(Upload(n, t.offset, t.nbytes, buf, off))
                    off += t.nbytes
                fused.update(names)
        if cfg.v_norm:
            # gemma4 RMS-norms V without a weight: the norm kernel multiplies by one, so a ones vector per head size
            for hd in sorted({cfg.head_dim_of(il) for il in range(cfg.n_layer)}):
                buf = device.buffer(4 * hd, gpu.CONSTANT, f"ones [{hd}] (V's weightless norm)")
                device.write(buf, struct.pack(f"<{hd}f", *([1.0] * hd)))
                self.vectors[f"ones.{hd}"] = buf
        for name, shape in expected_tensors(cfg).items():
            if name in fused:
                continue
            t = tensors[name]
            if len(shape) == 1 or is_flat(name):
                buf = device.buffer(t.nbytes, kind, name)
                self.vectors[name] = buf
                self.uploads.append(Upload(name, t.offset, t.nbytes, buf))
            else:
                w = alloc_weight(device, name, t.type, rows=shape[1], cols=shape[0], kind=kind)
                self.matrices[name] = w
                for part, off, size in placements(w):
                    self.uploads.append(Upload(name, t.offset + off, size, part.buffer))

    @staticmethod
    def _mixer(cfg, il: int) -> tuple[str, tuple[str, ...]]:
        """(stacked key, tensor names within the block) of layer il's input projections, in output-column order:
        lfm2's short-conv in_proj [B | C | x]; qwen35's delta-net in-projection row [q k v | z | beta | alpha]; an
        attention layer's [q | k | v], where qwen35's Q heads come first and their output gates last (each head's
        two halves are views of attn_q: lab.format.model.tensor_views), so the row is [q | k | v | gate]."""
        if cfg.is_conv(il):
            return "in_proj", ("shortconv.in_proj.weight",)
        if cfg.is_delta(il):
            return "delta_in", ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight", "ssm_alpha.weight")
        if not cfg.has_kv(il):  # gemma4's shared-KV layers project Q only (K and V: an earlier layer's cache)
            return "qkv", ("attn_q.weight",)
        if cfg.attn_gate:
            return "qkv", (*(f"attn_q.weight#q{h}" for h in range(cfg.n_head)), "attn_k.weight", "attn_v.weight",
                           *(f"attn_q.weight#g{h}" for h in range(cfg.n_head)))
        return "qkv", ("attn_q.weight", "attn_k.weight", "attn_v.weight")

    def _experts(self, cfg, il: int) -> list[str]:
        """Place layer il's experts (experts["blk.N.gate_up"], ["blk.N.down"]); returns the tensors placed. gate and
        up are interleaved an expert at a time ([gate_e | up_e] rows, so one dispatch makes an expert's [gate | up]
        row) where their types agree and an expert's rows are whole words (each upload then starts on a word and
        never pads into its neighbour); else each is its own Experts, up's columns after gate's."""
        b, ff, n = f"blk.{il}.", cfg.n_ff_exp, cfg.n_expert
        gate, up, down = (self.tensors[b + f"ffn_{k}_exps.weight"] for k in ("gate", "up", "down"))
        if gate.type == up.type and gate.type.row_bytes(cfg.n_embd) * ff % 4 == 0:
            e = self._expert_weight(f"{b}ffn_gate_exps+up_exps", gate.type, n, 2 * ff, cfg.n_embd)
            rb = e.weight.row_bytes
            for x in range(n):
                for k, t in enumerate((gate, up)):
                    row = x * 2 * ff + k * ff
                    part = next(p for p in e.weight.parts if p.first_row <= row < p.first_row + p.n_rows)
                    self.uploads.append(Upload(t.name, t.offset + x * ff * rb, ff * rb, part.buffer,
                                               (row - part.first_row) * rb))
            self.experts[b + "gate_up"] = [(e, 0)]
        else:
            self.experts[b + "gate_up"] = [(self._expert_tensor(t, n, ff, cfg.n_embd), k * ff)
                                           for k, t in enumerate((gate, up))]
        self.experts[b + "down"] = [(self._expert_tensor(down, n, cfg.n_embd, ff), 0)]
        return [gate.name, up.name, down.name]

    def _expert_weight(self, name: str, type, n: int, per: int, cols: int) -> Experts:
        w = alloc_weight(self.device, name, type, rows=n * per, cols=cols, kind=self.kind, row_group=per)
        return Experts(w, n, per)

    def _expert_tensor(self, t, n: int, per: int, cols: int) -> Experts:
        """One stacked expert tensor as it lies in the file (expert after expert), and its uploads."""
        e = self._expert_weight(t.name, t.type, n, per, cols)
        for part, off, size in placements(e.weight):
            self.uploads.append(Upload(t.name, t.offset + off, size, part.buffer))
        return e

    def _stack(self, names: list[str]) -> list[tuple[Weight, int]]:
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
            w = alloc_weight(self.device, name, run[0].type, rows=rows, cols=run[0].shape[0], kind=self.kind)
            self.matrices[name] = w
            for tname, t_off, part, p_off, size in concat_placements(w, [(t.name, t.shape[1]) for t in run]):
                self.uploads.append(Upload(tname, self.tensors[tname].offset + t_off, size, part.buffer, p_off))
            out.append((w, col))
            col += rows
        return out

    @property
    def embedding(self) -> Weight:
        return self.matrices["token_embd.weight"]

    @property
    def per_layer_embedding(self) -> Weight:
        """gemma4's per-layer token embeddings [n_vocab rows of n_layer x width] (read by the step and the inspector)."""
        return self.matrices["per_layer_token_embd.weight"]

    @property
    def head(self) -> Weight:
        """The output projection: its own tensor, or the embedding table when the model ties them."""
        return self.matrices.get("output.weight", self.embedding)

    @property
    def nbytes(self) -> int:
        return sum(u.size for u in self.uploads)

    def in_vectors(self) -> dict[str, tuple[str, int, int]]:
        """{file tensor: (vector, byte offset, bytes)} of the file's tensors held inside a vector of another name (the
        fused Q/K/V biases, "blk.N.attn_qkv.bias"), from their uploads: where a trained model's file and its
        gradients find each of them."""
        names = {id(buf): name for name, buf in self.vectors.items()}
        return {u.tensor: (names[id(u.buffer)], u.buffer_offset, u.size) for u in self.uploads
                if id(u.buffer) in names and names[id(u.buffer)] != u.tensor}

    def buffers(self) -> list[gpu.Buffer]:
        """Every buffer holding the model's values (each once: a stacked run is one weight), of this object's kind."""
        return list({id(u.buffer): u.buffer for u in self.uploads}.values())

    @property
    def matrix_types(self) -> set[str]:
        """The types of its matrices by name ("F32", "Q4_K"): full fine-tuning trains F32 ones only."""
        return {m.type.name for m in self.matrices.values()}

    def rekind(self, kind: str) -> None:
        """Every buffer of the model's values, and this object's kind, now `kind` (lab.gpu Device.rekind): a file's
        weights become CONVERSATION before full fine-tuning moves them with the user's text (lab/worker/training.py)."""
        self.device.rekind(self.buffers(), kind)
        self.kind = kind

    def pieces(self, chunk: int = UPLOAD_CHUNK) -> list[Upload]:
        """The uploads cut into pieces of at most `chunk` bytes, in file order (so a loader reads the file
        front to back). A piece starts at a multiple of `chunk` within its range, so every buffer offset
        stays a multiple of 4 (writeBuffer's rule); only a range's last piece can have a size that is
        not, and the loaders pad it."""
        pieces = [Upload(u.tensor, u.file_offset + s, min(chunk, u.size - s), u.buffer, u.buffer_offset + s)
                  for u in self.uploads for s in range(0, u.size, chunk)]
        return sorted(pieces, key=lambda u: u.file_offset)

    def initialize(self, kernels, seed: int, rule) -> list[Op]:
        """Ops that fill every weight with its first values instead of a file's (a model trained from scratch): tensor
        `name` drawn from N(mean, std^2), (mean, std) = rule(name), by lab.ops.init with key(seed, its index in
        `tensors`), each upload range its own dispatch at the elements it holds (so a stacked or split tensor starts as
        it would whole). F32 tensors only: there is nothing to draw a quantized block from."""
        streams = {name: i for i, name in enumerate(self.tensors)}
        out = []
        for u in self.uploads:
            t = self.tensors[u.tensor]
            if t.type.name != "F32":
                raise ValueError(f"{u.tensor} is {t.type.name}: only F32 weights are drawn")
            mean, std = rule(u.tensor)
            out += init.normal(self.device, kernels, u.buffer, u.size // 4, key=init.key(seed, streams[u.tensor]),
                               first=(u.file_offset - t.offset) // 4, mean=mean, std=std, dst=u.buffer_offset // 4)
        return out

    def upload_file(self, path, chunk: int = UPLOAD_CHUNK) -> int:
        """Native loader: copy every piece from the file (the browser's is labUpload in web/worker.js)."""
        done = 0
        with open(path, "rb") as f:
            for u in self.pieces(chunk):
                f.seek(u.file_offset)
                data = f.read(u.size)
                if len(data) != u.size:
                    raise GGUFError(f"{path}: the file ends inside tensor {u.tensor}: it is truncated")
                if u.size % 4:
                    data += bytes(4 - u.size % 4)
                self.device.write(u.buffer, data, u.buffer_offset)
                done += u.size
        return done
