"""The dequantizing kernels' test rig: `Rig` uploads a weight, dispatches an op list and reads the result back
through the native backend; `mutated_wgsl` breaks a kernel on purpose. The references the results are held to
(random tensors, gguf.quants dequantization, tolerances) are lab/host/reference/quant.py.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from lab import gpu
from lab.format.ggml import BY_NAME
from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.host.reference import quant as qo
from lab.host.reference.quant import f32
from lab.ops import make_step, step_bytes
from lab.ops.embed import get_rows
from lab.ops.matmul import matmul, matvec
from lab.ops.weights import alloc_weight, upload_weight


_weights: dict = {}


def random_weight(name: str, rows: int, cols: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(GGUF bytes, float64 values) of a random rows x cols tensor of the type (quant.py's random_tensor, dequantized
    by gguf), made once a run: the backward tests' weights."""
    key = (name, rows, cols, seed)
    if key not in _weights:
        raw = qo.random_tensor(name, rows, cols, seed)
        _weights[key] = (raw, qo.dequant(raw, name).astype(np.float64))
    return _weights[key]


def weight_in_parts(dev, name: str, raw: np.ndarray, cols: int, parts: int, label: str = "w"):
    """The weight on the device, its rows cut into `parts` binding-sized parts (the last one shorter)."""
    rows = raw.shape[0]
    per = -(-rows // parts)
    limit = per * raw.shape[1] + 3 if parts > 1 else None
    w = alloc_weight(dev, label, BY_NAME[name], rows, cols, max_binding=limit)
    upload_weight(dev, w, raw.tobytes())
    assert len(w.parts) == parts
    return w


class Rig:
    """Destroys on exit every buffer made while it was open (the device is session-wide)."""

    def __init__(self, device, kernels: KernelCache | None = None):
        self.device = device
        self.kernels = kernels or KernelCache(device)

    def __enter__(self):
        self._before = set(map(id, self.device.buffers))
        return self

    def __exit__(self, *exc):
        for b in [b for b in self.device.buffers if id(b) not in self._before]:
            self.device.destroy(b)

    def buffer(self, data: bytes | int, label: str) -> gpu.Buffer:
        size = data if isinstance(data, int) else len(data)
        b = self.device.buffer(size, gpu.CONVERSATION, label)
        if not isinstance(data, int):
            self.device.write(b, data)
        return b

    def weight(self, name: str, raw: np.ndarray, max_binding: int | None = None):
        w = alloc_weight(self.device, "w", BY_NAME[name], raw.shape[0],
                         raw.shape[1] // BY_NAME[name].nbytes * BY_NAME[name].block, max_binding)
        upload_weight(self.device, w, raw.tobytes())
        return w

    def step(self, t: int) -> gpu.Buffer:
        s = make_step(self.device)
        self.device.write(s, step_bytes(0, t, 4096))
        return s

    def run(self, ops, t: int) -> None:
        self.device.run([op.at(t) for op in ops])

    def read(self, buf: gpu.Buffer, n: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(self.device.read_sync(buf, 4 * offset, 4 * n), np.float32).copy()

    # -- one-call runners ------------------------------------------------------------------------
    def get_rows(self, w, ids, scale: float = 1.0) -> np.ndarray:
        t = len(ids)
        idb = self.buffer(np.asarray(ids, np.uint32).tobytes(), "ids")
        out = self.buffer(f32(np.full(t * w.cols, np.nan)), "out")   # NaN: an unwritten value shows
        self.run(get_rows(self.device, self.kernels, w, idb, out, self.step(t), scale=scale), t)
        return self.read(out, t * w.cols).reshape(t, w.cols)

    def matvec(self, w, x, *, y0=None, x_offset=0, y_offset=0, accumulate=False, y_len=None, wg=None) -> np.ndarray:
        xb = self.buffer(f32(np.concatenate([np.full(x_offset, 1e6), x])), "x")
        n = y_len or (y_offset + w.rows)
        yb = self.buffer(f32(np.zeros(n) if y0 is None else y0), "y")
        self.run(matvec(self.device, self.kernels, w, xb, yb, x_offset=x_offset, y_offset=y_offset,
                        accumulate=accumulate, wg=wg), 1)
        return self.read(yb, n)

    def matmul(self, w, X, *, y0=None, accumulate=False, max_tokens=None, lanes=None) -> np.ndarray:
        t = X.shape[0]
        mt = max_tokens or t
        xb = self.buffer(f32(np.concatenate([X.ravel(), np.full((mt - t) * w.cols, 1e6)])), "X")
        yb = self.buffer(f32(np.zeros(mt * w.rows) if y0 is None else y0), "Y")
        self.run(matmul(self.device, self.kernels, w, xb, yb, self.step(t), max_tokens=mt,
                        accumulate=accumulate, lanes=lanes), t)
        return self.read(yb, mt * w.rows).reshape(mt, w.rows)


@contextmanager
def mutated_wgsl(tmp_path: Path, fn: str, old: str, new: str, file: str = "quant.wgsl"):
    """The WGSL folder with `old` replaced by `new` (exactly once) inside `file`'s function `fn`:
    a deliberately broken kernel, to prove the checks catch it. Restores the real folder on exit."""
    real = shaders.wgsl_dir()
    dst = tmp_path / "wgsl"
    shutil.copytree(real, dst)
    src = (real / file).read_text()
    start = src.index(f"\nfn {fn}(")
    end = src.find("\nfn ", start + 1)
    end = len(src) if end < 0 else end
    body = src[start:end]
    assert body.count(old) == 1, f"trap snippet {old!r} not found exactly once in {fn}"
    (dst / file).write_text(src[:start] + body.replace(old, new) + src[end:])
    shaders.set_dir(dst)
    try:
        yield
    finally:
        shaders.set_dir(real)
