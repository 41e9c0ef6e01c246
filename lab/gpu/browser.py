"""Browser backend: navigator.gpu through pyodide.ffi, inside the module worker (Pyodide only).

Traps measured here:
- WebGPU descriptors must be plain JS objects: `to_js(d, dict_converter=Object.fromEntries)`; a bare
  `to_js` makes a Map, whose entries WebGPU does not read as descriptor fields.
- Each Python->JS call costs microseconds, so a step's dispatches are encoded by one call into the
  worker's JS helper `labEncode` from a JS array prepared once (`prepare`).
- Shader problems arrive asynchronously: `flush_errors` awaits every new module's compilation info and
  the device's error scope, so they are reported before any weight is uploaded.
- Read-back is copy -> staging (MAP_READ) -> mapAsync; the staging buffer holds conversation data and
  is registered like any other buffer so Forget clears it.
"""

from __future__ import annotations

import js
from pyodide.ffi import create_once_callable, to_js

from lab.gpu import FEATURES, LIMITS, LLVMPIPE_LOOP_BUDGET, AdapterInfo, Buffer, Device, Dispatch, GpuError, Kernel

_STORAGE = 0x0080 | 0x0004 | 0x0008      # STORAGE | COPY_SRC | COPY_DST
_UNIFORM = 0x0040 | 0x0004 | 0x0008      # UNIFORM | COPY_SRC | COPY_DST (Forget reads the step uniform back)
_STAGING = 0x0001 | 0x0008               # MAP_READ | COPY_DST
_MAP_READ = 0x0001


def _null(x) -> bool:
    # JS null crosses as pyodide.ffi.jsnull (a JsNull), not None.
    return x is None or type(x).__name__ == "JsNull"


def _obj(d):
    return to_js(d, dict_converter=js.Object.fromEntries)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


async def open_browser() -> BrowserDevice:
    gpu = getattr(js.navigator, "gpu", None)
    if _null(gpu):
        raise GpuError("this browser has no WebGPU (navigator.gpu is missing): use a recent Chrome, Edge or "
                       "Firefox with WebGPU enabled, over http://localhost or https")
    adapter = await gpu.requestAdapter(_obj({"powerPreference": "high-performance"}))
    if _null(adapter):
        raise GpuError("WebGPU is present but no GPU adapter was granted: enable hardware acceleration in the "
                       "browser settings, or update the GPU driver")
    features = [f for f in FEATURES if adapter.features.has(f)]
    limits = {k: int(getattr(adapter.limits, _camel(k))) for k in LIMITS}
    device = await adapter.requestDevice(_obj({
        "requiredFeatures": features,
        # Ask for the adapter's own limits: the defaults (128 MiB bindings) would refuse real embeddings.
        "requiredLimits": {_camel(k): v for k, v in limits.items()},
    }))
    info = adapter.info
    name = " ".join(str(x) for x in (info.vendor, info.architecture, info.device, info.description) if x)
    # WebGPU exposes no adapter type; the software rasterizers name themselves.
    software = any(w in name.lower() for w in ("swiftshader", "llvmpipe", "lavapipe"))
    return BrowserDevice(device, AdapterInfo("browser", name or "unknown adapter", frozenset(features), limits,
                                             {"vendor": str(info.vendor)}, software=software,
                                             swiftshader="swiftshader" in name.lower(),
                                             int8_matrix=_int8_matrix(adapter, features),
                                             loop_budget=LLVMPIPE_LOOP_BUDGET if "llvmpipe" in name.lower() else 0))


def _int8_matrix(adapter, features: list[str]) -> bool:
    """matmul_i8.wgsl's needs: the subgroup-matrix feature with an int8 16x16x32 configuration, and subgroups of
    exactly 32 (its workgroup is one subgroup, whose 32 lanes each scale one token's 8 rows of a quarter)."""
    if "chromium-experimental-subgroup-matrix" not in features or "subgroups" not in features:
        return False
    info = adapter.info
    if int(getattr(info, "subgroupMinSize", 0) or 0) != 32 or int(getattr(info, "subgroupMaxSize", 0) or 0) != 32:
        return False
    configs = getattr(info, "subgroupMatrixConfigs", None)
    if _null(configs):
        return False
    return any(str(c.componentType) == "i8" and str(c.resultComponentType) == "i32"
               and (int(c.M), int(c.N), int(c.K)) == (16, 16, 32) for c in configs)


class BrowserDevice(Device):
    def __init__(self, device, info: AdapterInfo) -> None:
        super().__init__()
        self._device = device
        self._queue = device.queue
        self.info = info
        self._pending: list[tuple[str, object]] = []   # (label, shader module) not yet checked
        device.pushErrorScope("validation")

    def _create_buffer(self, size: int, label: str, uniform: bool):
        return self._device.createBuffer(_obj({"size": size, "usage": _UNIFORM if uniform else _STORAGE,
                                               "label": label}))

    def write(self, buf: Buffer, data, offset: int = 0) -> None:
        # bytes from Python cross as a Uint8Array copy; a JS ArrayBuffer (File.slice) crosses untouched.
        src = data if hasattr(data, "byteLength") else to_js(bytes(data))
        self._queue.writeBuffer(buf.handle, offset, src)

    def clear(self, buf: Buffer) -> None:
        enc = self._device.createCommandEncoder()
        enc.clearBuffer(buf.handle)
        self._queue.submit(to_js([enc.finish()]))

    def kernel(self, source: str, label: str, entry: str = "main") -> Kernel:
        module = self._device.createShaderModule(_obj({"code": source, "label": label}))
        self._pending.append((label, module))
        pipeline = self._device.createComputePipeline(_obj({
            "layout": "auto", "compute": {"module": module, "entryPoint": entry}, "label": label}))
        return Kernel(pipeline, label)

    async def flush_errors(self) -> None:
        """Raise the first shader or validation problem since the last call, naming the kernel."""
        pending, self._pending = self._pending, []
        for label, module in pending:
            info = await module.getCompilationInfo()
            errors = [m for m in info.messages if m.type == "error"]
            if errors:
                m = errors[0]
                self.forget_compiled()
                raise GpuError(f"kernel {label} does not compile: line {m.lineNum}: {m.message}")
        err = await self._device.popErrorScope()
        self._device.pushErrorScope("validation")
        if not _null(err):
            self.forget_compiled()
            raise GpuError(f"WebGPU validation error: {err.message}")

    def _bind_group(self, kernel: Kernel, entries, label: str):
        return self._device.createBindGroup(_obj({
            "layout": kernel.handle.getBindGroupLayout(0), "label": label,
            "entries": [{"binding": i, "resource": {"buffer": h, "offset": off, "size": size}}
                        for i, h, off, size in entries]}))

    def on_lost(self, callback) -> None:
        def lost(info):
            callback(str(getattr(info, "message", "") or getattr(info, "reason", "") or "no reason given"))
        self._device.lost.then(create_once_callable(lost))

    def prepare(self, dispatches: list[Dispatch]):
        """A JS array [pipeline, group, x, y, z, ...] built once, encoded later by one JS call."""
        flat = []
        for d in dispatches:
            flat += [d.kernel.handle, d.bound.handle, *d.groups]
        return to_js(flat)

    def _flat(self, dispatches, writes):
        """The JS arrays labEncode and labTimePass read: the flat dispatch list (as `prepare` makes it, unless it
        is one already) and the writes [buffer, offset, Uint8Array, ...], or None."""
        flat = dispatches if hasattr(dispatches, "length") else self.prepare(dispatches)
        w = None
        if writes:
            w = []
            for buf, offset, data in writes:
                w += [buf.handle, offset, to_js(bytes(data))]
            w = to_js(w)
        return flat, w

    def run(self, dispatches, writes=(), copies=()) -> None:
        flat, w = self._flat(dispatches, writes)
        c = to_js([x for src, so, dst, do, n in copies for x in (src.handle, so, dst.handle, do, n)]) if copies else None
        js.labEncode(self._device, flat, w, c)

    async def time_pass(self, dispatches, writes=()) -> float:
        if "timestamp-query" not in self.info.features:
            raise GpuError("this adapter has no timestamp queries")
        return float(await js.labTimePass(self._device, *self._flat(dispatches, writes))) * 1e-9

    def _create_staging(self, size: int):
        return self._device.createBuffer(_obj({"size": size, "usage": _STAGING, "label": "readback"}))

    def read(self, buf: Buffer, offset: int = 0, size: int | None = None):
        size = buf.size - offset if size is None else size
        if buf is self._staging:
            return self._mapped(buf, buf.handle.mapAsync(_MAP_READ, offset, size), offset, size)
        staging = self._staging_for(size)
        enc = self._device.createCommandEncoder()
        enc.copyBufferToBuffer(buf.handle, offset, staging.handle, 0, size)
        self._queue.submit(to_js([enc.finish()]))
        # Asked now, not at the await: Dawn's map waits for everything submitted before the mapAsync call, so a
        # map asked after the caller's next submits would wait for those too.
        return self._mapped(staging, staging.handle.mapAsync(_MAP_READ, 0, size), 0, size)

    async def _mapped(self, buf: Buffer, mapping, offset: int, size: int) -> bytes:
        await mapping
        try:
            return js.Uint8Array.new(buf.handle.getMappedRange(offset, size)).to_bytes()
        finally:
            buf.handle.unmap()
