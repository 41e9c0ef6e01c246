"""Native backend: wgpu-py on whatever the platform offers (Vulkan here: lavapipe, SwiftShader, NVIDIA)."""

from __future__ import annotations

import os

import wgpu

try:    # wgpu-py's cffi handle to wgpu-native: encoding through it skips ~8 us of Python per dispatch
    from wgpu.backends.wgpu_native import _api as _wgpu_api
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi
    from wgpu.backends.wgpu_native._ffi import lib as _lib
except ImportError:  # pragma: no cover - another wgpu-py layout: the public API still works
    _lib = _ffi = _wgpu_api = None

from lab.gpu import FEATURES, LIMITS, LLVMPIPE_LOOP_BUDGET, AdapterInfo, Buffer, Device, Dispatch, GpuError, Kernel

# wgpu-py spells a few features differently from the WebGPU names the engine uses.
_NATIVE_NAME = {"subgroups": "subgroup"}
_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
# COPY_SRC on uniforms too: Forget reads every conversation buffer back, the step uniform included.
_UNIFORM = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_STAGING_READ = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST


class NativeDevice(Device):
    def __init__(self, disable: tuple[str, ...] = (), checks: bool | None = None) -> None:
        super().__init__()
        # naga guards every index and wgpu bounds every loop in the code they emit: on the H200 that
        # held our GEMMs to 3.1 TFLOP/s where the same WGSL runs at 7.5 without them (Dawn/Tint in the
        # page emits faster code with its checks on). The kernels index within their bindings by
        # construction, which the oracle tests hold on every shape class; LAB_SHADER_CHECKS=1 puts the
        # checks back (for a kernel under suspicion). The page keeps Dawn's, which no page can drop.
        self.shader_checks = os.environ.get("LAB_SHADER_CHECKS") == "1" if checks is None else checks
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise GpuError("no WebGPU adapter: install a Vulkan driver (Debian: mesa-vulkan-drivers)")
        have = set(adapter.features)
        features = [f for f in FEATURES if _NATIVE_NAME.get(f, f) in have and f not in disable]
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
            software=info.get("adapter_type", "") == "CPU",
            loop_budget=LLVMPIPE_LOOP_BUDGET if "llvmpipe" in str(info.get("device", "")).lower() else 0)
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
            module = self._module(source, label)
            pipeline = self._device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry}, label=label)
        except Exception as exc:  # wgpu raises on invalid WGSL with the compiler's message
            raise GpuError(f"kernel {label} does not compile: {exc}") from None
        return Kernel(pipeline, label)

    def _module(self, source: str, label: str):
        """A shader module without naga's runtime checks unless `shader_checks` (see __init__)."""
        if _wgpu_api is None or self.shader_checks:
            return self._device.create_shader_module(code=source, label=label)
        api = _wgpu_api
        wgsl = api.new_struct_p("WGPUShaderSourceWGSL *", code=api.to_c_string_view(source))
        wgsl[0].chain.next = _ffi.NULL
        wgsl[0].chain.sType = _lib.WGPUSType_ShaderSourceWGSL
        desc = api.new_struct_p("WGPUShaderModuleDescriptor *",
                                nextInChain=_ffi.cast("WGPUChainedStruct *", wgsl),
                                label=api.to_c_string_view(label))
        handle = api.libf.wgpuDeviceCreateShaderModuleTrusted(
            self._device._internal, desc, _lib.WGPUShaderRuntimeChecks_None)
        if handle == _ffi.NULL:
            raise GpuError(f"kernel {label}: shader module creation failed")
        return api.GPUShaderModule(label, handle, self._device)

    def _bind_group(self, kernel: Kernel, entries, label: str):
        return self._device.create_bind_group(
            layout=kernel.handle.get_bind_group_layout(0), label=label,
            entries=[{"binding": i, "resource": {"buffer": h, "offset": off, "size": size}}
                     for i, h, off, size in entries])

    def prepare(self, dispatches: list[Dispatch]) -> RawPlan | list[Dispatch]:
        return RawPlan(dispatches) if _lib is not None else list(dispatches)

    def _pass(self, dispatches, writes, **pass_args):
        """Apply the writes, then a command encoder with one compute pass of `dispatches`, ended."""
        for buf, offset, data in writes:
            self._queue.write_buffer(buf.handle, offset, data)
        enc = self._device.create_command_encoder()
        cpass = enc.begin_compute_pass(**pass_args)
        if isinstance(dispatches, RawPlan):
            dispatches.encode(cpass._internal)
        else:
            for d in dispatches:
                cpass.set_pipeline(d.kernel.handle)
                cpass.set_bind_group(0, d.bound.handle)
                cpass.dispatch_workgroups(*d.groups)
        cpass.end()         # through wgpu-py: an invalid pass raises here or at finish, with the message
        return enc

    def run(self, dispatches, writes=(), copies=()) -> None:
        enc = self._pass(dispatches, writes)
        for src, src_off, dst, dst_off, size in copies:
            enc.copy_buffer_to_buffer(src.handle, src_off, dst.handle, dst_off, size)
        self._queue.submit([enc.finish()])

    async def time_pass(self, dispatches, writes=()) -> float:
        if "timestamp-query" not in self.info.features:
            raise GpuError("this adapter has no timestamp queries")
        if not hasattr(self, "_timer"):
            qs = self._device.create_query_set(type="timestamp", count=2)
            out = self._device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            self._timer = (qs, out)
        qs, out = self._timer
        enc = self._pass(dispatches, writes, timestamp_writes={
            "query_set": qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        enc.resolve_query_set(qs, 0, 2, out, 0)
        self._queue.submit([enc.finish()])
        t0, t1 = memoryview(self._queue.read_buffer(out, 0, 16)).cast("Q")
        return (t1 - t0) * 1e-9

    def _create_staging(self, size: int):
        return self._device.create_buffer(size=size, usage=_STAGING_READ, label="readback")

    def read(self, buf: Buffer, offset: int = 0, size: int | None = None):
        size = buf.size - offset if size is None else size
        if buf is not self._staging:
            staging = self._staging_for(size)
            enc = self._device.create_command_encoder()
            enc.copy_buffer_to_buffer(buf.handle, offset, staging.handle, 0, size)
            self._queue.submit([enc.finish()])
            buf, offset = staging, 0
        # Asked now (Device.read): wgpu-py's poll thread starts waiting for the queue as it stands, so work the
        # caller submits before the await (the next greedy block) runs while this read completes.
        mapping = buf.handle.map_async(wgpu.MapMode.READ, offset, size)
        return self._mapped(buf, mapping, offset, size)

    @staticmethod
    async def _mapped(buf: Buffer, mapping, offset: int, size: int) -> bytes:
        mapping.sync_wait()
        return _take_mapped(buf, offset, size)

    def read_sync(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """`read` at once, through wgpu-py's own staging buffer (benchmarks, tests); the read-back buffer itself
        (MAP_READ, no COPY_SRC) is mapped."""
        size = buf.size - offset if size is None else size
        if buf is self._staging:
            buf.handle.map_sync(wgpu.MapMode.READ, offset, size)
            return _take_mapped(buf, offset, size)
        return bytes(self._queue.read_buffer(buf.handle, offset, size))


def _take_mapped(buf: Buffer, offset: int, size: int) -> bytes:
    """The mapped range's bytes, then the buffer unmapped (whatever happens), for the next copy into it."""
    try:
        return bytes(buf.handle.read_mapped(offset, size))
    finally:
        buf.handle.unmap()


class RawPlan:
    """A prepared step: wgpu-native handles extracted once, encoded with direct C calls.

    wgpu-py's per-call wrappers (argument checks, a fresh offsets array per set_bind_group, error
    plumbing) cost ~9 us per dispatch on this machine's CPU, which made native decode CPU-bound
    (426 dispatches: 3.8 ms of encoding per token). The raw calls take well under 1 us. Validation
    still happens in wgpu-native and is reported when the pass ends. The pipeline is set only when
    it changes. Holds the Dispatch list so the handles outlive the plan."""

    def __init__(self, dispatches: list[Dispatch]) -> None:
        self.dispatches = list(dispatches)
        self._calls = []
        last = None
        for d in self.dispatches:
            pipe = d.kernel.handle._internal
            self._calls.append((None if pipe == last else pipe, d.bound.handle._internal, *d.groups))
            last = pipe

    def __len__(self) -> int:
        return len(self.dispatches)

    def __iter__(self):
        return iter(self.dispatches)

    def encode(self, cpass) -> None:
        set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
        set_group = _lib.wgpuComputePassEncoderSetBindGroup
        dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
        null = _ffi.NULL
        for pipe, group, x, y, z in self._calls:
            if pipe is not None:
                set_pipeline(cpass, pipe)
            set_group(cpass, 0, group, 0, null)
            dispatch(cpass, x, y, z)


def open_native(disable: tuple[str, ...] = (), checks: bool | None = None) -> NativeDevice:
    """The wgpu-py device (CPython only). `disable` drops features, so fallbacks stay testable;
    `checks` keeps naga's runtime checks in the shaders (default: LAB_SHADER_CHECKS=1)."""
    return NativeDevice(disable=disable, checks=checks)
