"""Native backend: wgpu-py on whatever the platform offers (Vulkan here: lavapipe, SwiftShader, NVIDIA)."""

from __future__ import annotations

import wgpu

from . import LIMITS, AdapterInfo, Bound, Buffer, Device, Dispatch, GpuError, Kernel, Slice

# wgpu-py spells a few features differently from the WebGPU names the engine uses.
_NATIVE_NAME = {"subgroups": "subgroup"}
_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
# COPY_SRC on uniforms too: Forget reads every conversation buffer back, the step uniform included.
_UNIFORM = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


class NativeDevice(Device):
    def __init__(self, disable: tuple[str, ...] = ()) -> None:
        super().__init__()
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise GpuError("no WebGPU adapter: install a Vulkan driver (Debian: mesa-vulkan-drivers)")
        have = set(adapter.features)
        features = [f for f in ("shader-f16", "subgroups", "timestamp-query")
                    if _NATIVE_NAME.get(f, f) in have and f not in disable]
        # Ask for the adapter's own limits: the defaults (128 MiB bindings) would refuse real embeddings.
        wanted = {k.replace("_", "-"): adapter.limits[k.replace("_", "-")] for k in LIMITS
                  if k.replace("_", "-") in adapter.limits}
        self._device = adapter.request_device_sync(
            required_features=[_NATIVE_NAME.get(f, f) for f in features], required_limits=wanted)
        limits = {k: int(self._device.limits[k.replace("_", "-")]) for k in LIMITS}
        info = adapter.info
        self.info = AdapterInfo(
            backend="native",
            name=f"{info.get('device', '')} ({info.get('backend_type', '')}, {info.get('adapter_type', '')})",
            features=frozenset(features), limits=limits,
            details={"vendor": info.get("vendor", ""), "driver": info.get("description", "")},
            software=info.get("adapter_type", "") == "CPU")
        self._queue = self._device.queue

    def _create_buffer(self, size: int, label: str, uniform: bool):
        return self._device.create_buffer(size=size, usage=_UNIFORM if uniform else _STORAGE, label=label)

    def write(self, buf: Buffer, data, offset: int = 0) -> None:
        self._queue.write_buffer(buf.handle, offset, data)

    def clear(self, buf: Buffer) -> None:
        enc = self._device.create_command_encoder()
        enc.clear_buffer(buf.handle)
        self._queue.submit([enc.finish()])

    def kernel(self, source: str, label: str, entry: str = "main") -> Kernel:
        try:
            module = self._device.create_shader_module(code=source, label=label)
            pipeline = self._device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry}, label=label)
        except Exception as exc:  # wgpu raises on invalid WGSL with the compiler's message
            raise GpuError(f"kernel {label} does not compile: {exc}") from None
        return Kernel(pipeline, label)

    def bind(self, kernel: Kernel, resources: list, label: str = "") -> Bound:
        entries = []
        for i, res in enumerate(resources):
            if isinstance(res, Slice):
                self.check_binding(res.size, f"{label or kernel.label} binding {i} ({res.buffer.label})")
                entries.append({"binding": i, "resource": {"buffer": res.buffer.handle,
                                                            "offset": res.offset, "size": res.size}})
            else:
                if not res.uniform:
                    self.check_binding(res.size, f"{label or kernel.label} binding {i} ({res.label})")
                entries.append({"binding": i, "resource": {"buffer": res.handle, "offset": 0, "size": res.size}})
        group = self._device.create_bind_group(
            layout=kernel.handle.get_bind_group_layout(0), entries=entries, label=label or kernel.label)
        return Bound(group, label or kernel.label)

    def run(self, dispatches: list[Dispatch], writes=()) -> None:
        for buf, offset, data in writes:
            self._queue.write_buffer(buf.handle, offset, data)
        enc = self._device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        for d in dispatches:
            cpass.set_pipeline(d.kernel.handle)
            cpass.set_bind_group(0, d.bound.handle)
            cpass.dispatch_workgroups(*d.groups)
        cpass.end()
        self._queue.submit([enc.finish()])

    async def read(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        return self.read_sync(buf, offset, size)

    def read_sync(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        size = buf.size - offset if size is None else size
        return bytes(self._queue.read_buffer(buf.handle, offset, size))
