"""The device layer: the only place that talks to WebGPU.

Engine code is written once against `Device` and runs on two backends with the same WGSL:
`native` (wgpu-py: Vulkan, Metal, D3D12, lavapipe) and `browser` (navigator.gpu through
pyodide.ffi, inside the worker). The surface is small on purpose: buffers, writes, kernels,
bind groups, one compute pass per `run`, asynchronous reads.

What it does not know: models, tokens, quant formats. It knows buffer *kinds* so that Forget
can find every buffer holding conversation-derived data without a hand-made list.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import contextmanager
from dataclasses import dataclass, field

# Buffer kinds. Every buffer the engine creates carries one.
WEIGHTS = "weights"            # model parameters, uploaded once from the file
CONSTANT = "constant"          # shapes and other per-dispatch parameters fixed at load time
CONVERSATION = "conversation"  # anything derived from user text: KV, activations, logits, probes, staging
KINDS = (WEIGHTS, CONSTANT, CONVERSATION)

# Features the engine may use, under their WebGPU names.
FEATURES = ("shader-f16", "subgroups", "timestamp-query", "chromium-experimental-subgroup-matrix")

# Limits the engine reads, under snake_case names (wgpu-py spells them with dashes, the browser in camelCase).
LIMITS = (
    "max_storage_buffer_binding_size",
    "max_buffer_size",
    "max_compute_workgroup_storage_size",
    "max_compute_invocations_per_workgroup",
    "max_compute_workgroup_size_x",
    "max_compute_workgroups_per_dimension",
    "max_storage_buffers_per_shader_stage",
    "min_storage_buffer_offset_alignment",
    "min_uniform_buffer_offset_alignment",
)


class GpuError(RuntimeError):
    """A problem the user can act on: no adapter, a shader that does not compile, a size over a limit."""


@dataclass(eq=False)
class Buffer:
    handle: object          # GPUBuffer of the backend
    size: int               # bytes
    kind: str               # one of KINDS
    label: str
    uniform: bool = False   # a uniform buffer (read-only parameters) rather than storage
    owner: object = None    # who made it (an Engine, its Probes, a kernel check): `Device.free(owner)` frees it


@dataclass(frozen=True)
class Slice:
    """A byte range of a buffer bound in place of the whole (offset aligned to min_storage_buffer_offset_alignment)."""
    buffer: Buffer
    offset: int
    size: int


@dataclass(eq=False)
class Kernel:
    handle: object          # GPUComputePipeline
    label: str


@dataclass(eq=False)
class Bound:
    handle: object          # GPUBindGroup
    label: str


@dataclass(frozen=True)
class Dispatch:
    kernel: Kernel
    bound: Bound
    groups: tuple[int, int, int]


LLVMPIPE_LOOP_BUDGET = 65_535     # gallivm's LP_MAX_TGSI_LOOP_ITERATIONS (AdapterInfo.loop_budget)
SWIFTSHADER_WG = 4      # one SIMD group of SwiftShader (AdapterInfo.swiftshader)
LLVMPIPE_WG = 8         # one SIMD group of llvmpipe (lavapipe) on AVX2: 8 f32 lanes (AdapterInfo.software)


@dataclass
class AdapterInfo:
    backend: str                      # "native" or "browser"
    name: str                         # adapter description as the platform reports it
    features: frozenset[str]
    limits: dict[str, int]
    details: dict = field(default_factory=dict)
    software: bool = False            # a CPU implementation (lavapipe, SwiftShader): more workgroups cost, not help
    # SwiftShader runs a workgroup as 4-wide SIMD groups switched at every barrier, so a kernel pays per thread of a
    # workgroup: workgroups of SWIFTSHADER_WG for the matvecs and norms, no barrier in its matmul (lab.ops.matmul).
    # Lavapipe does not pay so.
    swiftshader: bool = False
    # Chromium's subgroup matrices with int8 x int8 -> int32 at 16x16x32 and 32-wide subgroups: the prefill GEMM
    # on the tensor cores (wgsl/matmul_i8.wgsl). The browser only; set where the adapter lists that configuration.
    int8_matrix: bool = False
    # Mesa's llvmpipe (lavapipe) ends a shader invocation's loops after this many iterations, counted over all its
    # loops, silently (tests/kernels/test_loop_budget.py); 0: no such budget. The engine bounds attention's keys by it.
    loop_budget: int = 0

    def summary(self) -> dict:
        return {"backend": self.backend, "name": self.name, "features": sorted(self.features),
                "limits": dict(self.limits), "software": self.software, "swiftshader": self.swiftshader,
                "int8_matrix": self.int8_matrix, "loop_budget": self.loop_budget, **self.details}


class Device:
    """Backend-neutral base: the registry of buffers (each with a kind and an owner) and what every backend
    shares. Backends implement the hooks below; engine code never reaches past this surface."""

    info: AdapterInfo

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []   # every live buffer, in creation order (Forget walks this)
        self.live_bytes = 0               # their sizes' sum, and its highest value so far (`lab bench` reports it)
        self.peak_bytes = 0
        self._owner: object = None
        self._staging: Buffer | None = None   # the buffer `read` copies through (MAP_READ), grown as reads need
        self._compiled: dict[tuple[str, str], Kernel] = {}   # (WGSL source, entry) -> its pipeline: `compiled`

    @property
    def handle(self):
        """The backend's own device object (GPUDevice in the browser), for JS helpers that take it."""
        return self._device

    # -- buffers ---------------------------------------------------------------------------
    @contextmanager
    def owning(self, owner: object):
        """Buffers made inside the block belong to `owner`, so that `free(owner)` releases exactly them."""
        outer, self._owner = self._owner, owner
        try:
            yield
        finally:
            self._owner = outer

    @property
    def current_owner(self) -> object:
        """The owner of the buffers made now (`owning`'s; None outside it)."""
        return self._owner

    def _register(self, size: int, kind: str, label: str, uniform: bool) -> Buffer:
        if kind not in KINDS:
            raise ValueError(f"unknown buffer kind {kind!r} for {label}")
        buf = Buffer(self._create_buffer(size, label, uniform=uniform), size, kind, label, uniform, self._owner)
        self.buffers.append(buf)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return buf

    def buffer(self, size: int, kind: str, label: str) -> Buffer:
        """A storage buffer of at least `size` bytes (rounded up to 4), zero-filled by WebGPU."""
        size = max(4, (size + 3) & ~3)
        if size > self.info.limits["max_buffer_size"]:
            raise GpuError(f"{label}: {size:,} bytes exceed this GPU's max buffer size "
                           f"({self.info.limits['max_buffer_size']:,} bytes)")
        return self._register(size, kind, label, uniform=False)

    def uniform(self, data: bytes, label: str, kind: str = CONSTANT) -> Buffer:
        """A uniform buffer holding `data` (padded to 16 bytes): per-dispatch parameters fixed at load (CONSTANT),
        or values rewritten per step or request, such as positions (CONVERSATION, so Forget wipes them)."""
        size = max(16, (len(data) + 15) & ~15)
        buf = self._register(size, kind, label, uniform=True)
        self.write(buf, bytes(data) + bytes(size - len(data)))
        return buf

    def rekind(self, buffers: list[Buffer], kind: str) -> None:
        """Give live buffers of this device another kind: a file's weights that full fine-tuning is about to move
        with the user's text become CONVERSATION (lab/worker/training.py), so Forget finds them by kind, wipes them
        and reads them back, and `destroy` zeroes them. One way only: a CONVERSATION buffer stays one, since it may
        already hold the user's data, and any other kind would hide it from Forget. Checked whole before any buffer
        changes."""
        if kind not in KINDS:
            raise ValueError(f"unknown buffer kind {kind!r}")
        live = {id(b) for b in self.buffers}
        for b in buffers:
            if id(b) not in live:
                raise ValueError(f"{b.label}: not a live buffer of this device")
            if b.kind == CONVERSATION and kind != CONVERSATION:
                raise ValueError(f"{b.label}: a CONVERSATION buffer stays one (it may hold the user's data)")
        for b in buffers:
            b.kind = kind

    def owned_by(self, owner: object) -> list[Buffer]:
        return [b for b in self.buffers if b.owner is owner]

    def free(self, owner: object) -> None:
        """Destroy every buffer `owner` made (conversation buffers are zeroed first, see `destroy`)."""
        for b in self.owned_by(owner):
            self.destroy(b)

    def destroy(self, buf: Buffer) -> None:
        if buf.kind == CONVERSATION:
            self.clear(buf)         # zeroed before its memory goes back to the driver (a reload, a grown staging)
        self.buffers.remove(buf)
        self.live_bytes -= buf.size
        if buf is self._staging:
            self._staging = None
        buf.handle.destroy()

    def _staging_for(self, size: int) -> Buffer:
        """The read-back buffer, at least `size` bytes: kind CONVERSATION (it holds whatever was read last), no
        owner (the device's own); a larger read replaces it, zeroed first."""
        if self._staging is None or self._staging.size < size:
            if self._staging is not None:
                self.destroy(self._staging)
            size = max(size, 1 << 16)
            self._staging = Buffer(self._create_staging(size), size, CONVERSATION, "readback")
            self.buffers.append(self._staging)
            self.live_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return self._staging

    def check_binding(self, size: int, label: str) -> None:
        limit = self.info.limits["max_storage_buffer_binding_size"]
        if size > limit:
            raise GpuError(f"{label}: a binding of {size:,} bytes exceeds this GPU's storage binding limit "
                           f"({limit:,} bytes); bind it in row ranges")

    # -- bind groups ---------------------------------------------------------------------------
    def bind(self, kernel: Kernel, resources: list, label: str = "") -> Bound:
        """A bind group of `resources` (Buffers or Slices) at bindings 0, 1, ...; every storage binding is checked
        against the adapter's limit first, so an oversize one is named instead of failing validation later."""
        label = label or kernel.label
        entries = []     # (binding, buffer handle, offset, size)
        for i, res in enumerate(resources):
            buf = res.buffer if isinstance(res, Slice) else res
            if not buf.uniform:
                self.check_binding(res.size, f"{label} binding {i} ({buf.label})")
            entries.append((i, buf.handle, res.offset if isinstance(res, Slice) else 0, res.size))
        return Bound(self._bind_group(kernel, entries, label), label)

    def on_lost(self, callback) -> None:
        """Call `callback(reason: str)` once if the device is lost (driver reset, sleep, a crash elsewhere).
        Natively a lost device raises on the next call instead; only the browser reports it as an event."""

    # -- backend hooks -----------------------------------------------------------------------
    def _create_buffer(self, size: int, label: str, uniform: bool):  # pragma: no cover - abstract
        raise NotImplementedError

    def write(self, buf: Buffer, data, offset: int = 0) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def clear(self, buf: Buffer) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def kernel(self, source: str, label: str, entry: str = "main") -> Kernel:  # pragma: no cover
        """A new pipeline of `source`'s `entry`, compiled now (the backend's hook; shaders.KernelCache goes through
        `compiled`)."""
        raise NotImplementedError

    def compiled(self, source: str, label: str, entry: str = "main") -> Kernel:
        """The pipeline of `source`'s `entry`, compiled once for the device: every engine, probe pass and kernel check
        on it shares the pipelines of the same source text. A second load (the same file again, a new context or KV
        type, another model with the same kernels) compiles only what is new; on SwiftShader a small model's load
        spent 4-5 s of its 5 on its pipelines. A source that failed to compile is never kept (`forget_compiled`)."""
        key = (source, entry)
        k = self._compiled.get(key)
        if k is None:
            k = self._compiled[key] = self.kernel(source, label, entry)
        return k

    def forget_compiled(self) -> None:
        """Drop every kept pipeline (the browser backend, when a compile or validation error surfaces: the next load
        compiles afresh and reports it again)."""
        self._compiled.clear()

    def _bind_group(self, kernel: Kernel, entries: list[tuple[int, object, int, int]], label: str):
        raise NotImplementedError  # pragma: no cover - abstract

    def prepare(self, dispatches: list[Dispatch]):
        """A step's dispatch list in the backend's own form, built once and passed to `run` every step."""
        return list(dispatches)

    def run(self, dispatches, writes=(), copies=()) -> None:  # pragma: no cover - abstract
        """Apply `writes` [(buffer, offset, bytes)], then encode all dispatches (a list or a `prepare`d
        plan) in one compute pass, then `copies` [(src, src_offset, dst, dst_offset, size)] (byte
        counts and offsets multiples of 4), and submit once."""
        raise NotImplementedError

    def staging(self, size: int) -> list[Buffer]:
        """The registered buffers `read` copies through (kind CONVERSATION: they hold whatever was read last),
        grown now to take `size` bytes in one read, so that no later read replaces them. `read` maps these
        directly. Forget sizes them before it walks the registry, reads them first and clears them last.
        (`read_sync`, natively, goes through wgpu-py's own staging buffer, made and dropped inside each call.)"""
        return [self._staging_for(size)]

    def _create_staging(self, size: int):  # pragma: no cover - abstract
        """A MAP_READ | COPY_DST buffer of `size` bytes (the backend's handle)."""
        raise NotImplementedError

    async def flush_errors(self) -> None:
        """Raise the first shader or validation problem not yet reported (the browser reports late)."""

    async def time_pass(self, dispatches, writes=()) -> float:  # pragma: no cover - abstract
        """Seconds the GPU spent in one pass of `dispatches` after `writes`, by timestamp queries (benchmarks
        only; GpuError without the `timestamp-query` feature). Asynchronous because the browser's read-back is."""
        raise NotImplementedError

    def read(self, buf: Buffer, offset: int = 0, size: int | None = None) -> Awaitable[bytes]:  # pragma: no cover
        """The bytes of `buf[offset:offset + size]`, awaited. The read is ordered where it is called, not where it
        is awaited: work submitted in between does not change what it returns, so a caller may queue more work
        first (lab.engine.session queues the next greedy block before it waits for this one's ids). One read in flight
        at a time: await it before the next."""
        raise NotImplementedError

