"""A LoRA adapter on the GPU: y = W x + (alpha / r) B (A x) on some of a model's projections (issue #43).

`Lora` holds every adapted matrix's A [r, n_in] and B [n_out, r] (row-major, as llama.cpp's adapter files store
`<name>.lora_a` and `.lora_b`) in one f32 buffer, A then B per target, so the optimizer steps all of them in one
dispatch; `forward` adds a target's term to a projection's output rows with two GEMMs (lab.ops.backward_matmul.gemm),
u = x A^T into a scratch of [tokens, r], then y += scale u B^T. The plans call it after each projection a target
names (lab.engine.plans), prefill and decode alike, so every card computes with the adapter once the engine has one.
Every buffer is kind CONVERSATION: an adapter trained on the user's text is the user's, and Forget wipes it.

What it does not know: files (lab.format.adapter reads and writes them), training (lab.engine.backward).
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass

from lab import gpu
from lab.ops import Op
from lab.ops.backward_matmul import TOK_M, gemm
from lab.ops.weights import Piece, run_pieces

# The projections a LoRA adapts unless told otherwise: every attention and feed-forward matrix (phi3's fused
# attn_qkv and gate|up rows included), the targets the issue names and PEFT's usual "all linear" choice; on lfm2 the
# short-conv blocks' two projections too, the matrices in attention's place on those layers (llama.cpp multiplies both
# through build_lora_mm, so its adapters on them load there; the conv kernel between them is no matrix product, and
# lab.format.adapter refuses a pair on it, as llama.cpp would load it and never apply it); on qwen35's delta-net layers
# the q k v projection (attn_qkv), the output gate's (attn_gate) and ssm_out, the wide ones. Its beta and alpha
# projections (ssm_beta, ssm_alpha: one output a value head, 16 in the releases) are targets when named
# (--lora-targets): llama.cpp multiplies all five through build_lora_mm (src/models/qwen35.cpp), but a rank-8 factor
# on a 16-row matrix is half the matrix, and on the synthetic file's 4 heads no rank past 4 fits.
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "shortconv.in_proj", "shortconv.out_proj",
                   "attn_gate", "ssm_out", "ffn_gate", "ffn_up", "ffn_down")
MAX_RANK = 1024


class LoraError(ValueError):
    """An adapter that cannot be made for this model, in words a user reads."""


@dataclass(frozen=True)
class Target:
    """One adapted matrix: its base weight's name and shape, the rank, and where A and B start (floats)."""
    name: str
    n_in: int
    n_out: int
    rank: int
    a: int
    b: int

    @property
    def floats(self) -> int:
        return self.rank * (self.n_in + self.n_out)


def choose(tensors: dict, n_layer: int, kinds=DEFAULT_TARGETS, rank: int = 8) -> list[tuple]:
    """(name, n_in, n_out, rank) of each layer's matrices of these kinds that the model has, in layer order
    (`tensors`: the file's tensor table, name -> TensorInfo, ggml shape [n_in, n_out]). Refuses a kind no layer has,
    and a rank no matrix can take (LoraError naming the numbers)."""
    if not 1 <= rank <= MAX_RANK:
        raise LoraError(f"LoRA rank {rank}: from 1 to {MAX_RANK}")
    found, out = set(), []
    for il in range(n_layer):
        for kind in kinds:
            name = f"blk.{il}.{kind}.weight"
            t = tensors.get(name)
            if t is None or len(t.shape) != 2:
                continue
            found.add(kind)
            n_in, n_out = int(t.shape[0]), int(t.shape[1])
            if rank > min(n_in, n_out):
                raise LoraError(f"LoRA rank {rank} is larger than {name} ({n_out} x {n_in}) allows "
                                f"(at most {min(n_in, n_out)})")
            out.append((name, n_in, n_out, rank))
    missing = [k for k in kinds if k not in found and k not in DEFAULT_TARGETS]
    if missing or not out:
        have = sorted({n.split(".", 2)[2].removesuffix(".weight") for n, t in tensors.items()
                       if n.startswith("blk.") and len(t.shape) == 2})
        raise LoraError(f"LoRA targets {', '.join(missing or kinds)}: this model's layers have none of them "
                        f"(its projections: {', '.join(have)})")
    return out


def members(run: str, views: dict, starts: dict) -> list[tuple[str, tuple[Piece, ...]]]:
    """(file tensor, its pieces) of each file tensor a projection the engine runs as one weight holds rows of, in
    the order they first appear (lab.ops.weights.run_pieces: `run` is the engine's name for the weight, `views` the
    engine's tensor table, `starts` the file's tensors by byte offset). An adapter names the file's tensors, as
    llama.cpp's do: a target on phi3's attn_qkv covers the rows of all three views, one piece; on qwen35's attn_q,
    whose heads' [q | gate] rows the run holds apart ([q heads | k | v | gate heads]), two pieces a head, each its
    rows of B."""
    out: dict[str, list[Piece]] = {}
    for p in run_pieces(run, views, starts):
        out.setdefault(p.tensor, []).append(p)
    return [(name, tuple(pieces)) for name, pieces in out.items()]


def layout(shapes: list[tuple]) -> tuple[dict[str, Target], int]:
    """Where each target's A and B lie in the one buffer (A then B, target after target), and the floats in all."""
    targets, at = {}, 0
    for name, n_in, n_out, rank in shapes:
        targets[name] = Target(name, n_in, n_out, rank, at, at + rank * n_in)
        at += rank * (n_in + n_out)
    return targets, at


def initial(targets: dict[str, Target], seed: int) -> bytes:
    """Training's start, as PEFT starts it: A uniform in +-1/sqrt(n_in) (kaiming-uniform with a = sqrt 5), B zero, so
    the adapted model starts as the base model. Seeded: one seed, one start (the bytes of the params buffer)."""
    rng = random.Random(seed)
    out = array("f")
    for t in targets.values():
        bound = 1.0 / math.sqrt(t.n_in)
        out.extend(rng.uniform(-bound, bound) for _ in range(t.rank * t.n_in))
        out.frombytes(bytes(4 * t.rank * t.n_out))
    return out.tobytes()


class Lora:
    """The adapter's parameters on `device` for steps of up to max_tokens rows (made inside the caller's
    `device.owning`); `label` begins its buffers' labels (the retrieval card's tuned embedder's are its own, so that
    Forget's report tells them from the Training card's adapter)."""

    def __init__(self, device: gpu.Device, shapes: list[tuple], alpha: float, max_tokens: int,
                 label: str = "lora") -> None:
        if not (math.isfinite(alpha) and alpha > 0):
            raise LoraError(f"LoRA alpha {alpha}: a positive number")
        self.device = device
        self.alpha = float(alpha)
        self.max_tokens = max_tokens
        self.targets, self.n_params = layout(shapes)
        at = self.n_params
        self.max_rank = max(t.rank for t in self.targets.values())
        conv = gpu.CONVERSATION
        self.params = device.buffer(4 * at, conv, f"{label} A|B [{at}]")
        self.u = device.buffer(4 * max_tokens * self.max_rank, conv, f"{label} u = x A^T [tokens, r]")

    @property
    def shapes(self) -> list[tuple]:
        """(name, n_in, n_out, rank) of each target, in order: another Lora of these shapes has this one's layout."""
        return [(t.name, t.n_in, t.n_out, t.rank) for t in self.targets.values()]

    @classmethod
    def shapes_of(cls, adapter) -> list[tuple]:
        """(name, n_in, n_out, rank) of an adapter file's pairs (lab.format.adapter.Adapter), in its order."""
        return [(p.base, p.n_in, p.n_out, p.rank) for p in adapter.pairs]

    def packed(self, values: dict) -> bytes:
        """The params buffer's bytes from {name: (A as f32 bytes [r, n_in], B as f32 bytes [n_out, r])}, every
        target's."""
        out = bytearray(4 * self.n_params)
        for name, t in self.targets.items():
            a, b = values[name]
            if len(a) != 4 * t.rank * t.n_in or len(b) != 4 * t.n_out * t.rank:
                raise LoraError(f"{name}: A of {len(a)} bytes and B of {len(b)}, not {4 * t.rank * t.n_in} and "
                                f"{4 * t.n_out * t.rank}")
            out[4 * t.a:4 * t.b] = a
            out[4 * t.b:4 * (t.b + t.rank * t.n_out)] = b
        return bytes(out)

    def scale(self, name: str) -> float:
        return self.alpha / self.targets[name].rank

    def initial(self, seed: int) -> bytes:
        return initial(self.targets, seed)

    def forward(self, kernels, name: str, x: gpu.Buffer, y: gpu.Buffer, step: gpu.Buffer, *, x_offset: int = 0,
                x_stride: int | None = None, y_offset: int = 0, y_stride: int | None = None,
                max_tokens: int | None = None, pieces: tuple[Piece, ...] | None = None) -> list[Op]:
        """y[t, y_offset + o] += scale * sum_k B[o, k] sum_c A[k, c] x[t, c] for the step's tokens: the target's term
        added to its projection's output rows (strides default to n_out and n_in). max_tokens: the most rows a step
        runs (default the adapter's; a training window's T where x or y hold T rows). pieces: where B's rows land
        (`members`: B's rows from `at`, at y's columns y_offset + `row`; default all of B from y_offset), one GEMM a
        piece after the one u = x A^T."""
        t = self.targets[name]
        xs = t.n_in if x_stride is None else x_stride
        ys = t.n_out if y_stride is None else y_stride
        T, r, dev = self.max_tokens if max_tokens is None else min(max_tokens, self.max_tokens), t.rank, self.device
        out = [gemm(dev, kernels, (x, x_offset, xs, 1), (self.params, t.a, 1, t.n_in), (self.u, 0, r, 1), step,
                    T, r, t.n_in, tok=TOK_M, label=f"{name}.lora_u")]
        for p in pieces or (Piece(name, 0, 0, t.n_out),):
            out.append(gemm(dev, kernels, (self.u, 0, r, 1), (self.params, t.b + p.at * r, 1, r),
                            (y, y_offset + p.row, ys, 1), step, T, p.rows, r, tok=TOK_M, scale=self.scale(name),
                            accumulate=True, label=f"{name}.lora_y"))
        return out
