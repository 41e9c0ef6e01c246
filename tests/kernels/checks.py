"""GPU checks for the basic kernel families (norm, rope, glu, softmax, sample, elementwise) on the native device.

Each `check_*` runs one op family on the device against its float64 reference (lab/host/reference/kernels.py, where
each tolerance sits with its reason) computed from the same f32 inputs, and raises AssertionError when the error
passes the tolerance. tests/kernels/test_*.py call the checks; test_traps_basic.py runs them on deliberately broken
WGSL (`Patched`) and requires them to fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from lab import gpu
from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.host.native import open_native
from lab.host.reference.kernels import (
    GLU_TOL,
    NORM_TOL,
    f32,
    glu_ref,
    rel_err,
    rms_norm_ref,
    rope_ref,
    rope_tol,
    softmax_ref,
    softmax_tol,
    topk_ref,
)
from lab.host.reference.ops import argmax as argmax_ref
from lab.ops import make_step, step_bytes
from lab.ops.rows import ROWS_LAST, ROWS_TOKENS, Rows

# ---------------------------------------------------------------------------------------------- devices


@dataclass
class Env:
    device: gpu.Device
    kernels: KernelCache
    name: str


_DEVICES: dict = {}


def open_env(name: str) -> Env:
    """'subgroups': the device with every feature it has; 'fallback': the same GPU with subgroups disabled."""
    if name not in _DEVICES:
        dev = open_native(disable=("subgroups",) if name == "fallback" else ())
        if name == "subgroups" and "subgroups" not in dev.info.features:
            pytest.skip("this adapter has no subgroups")
        _DEVICES[name] = Env(dev, KernelCache(dev), name)
    return _DEVICES[name]


@pytest.fixture(params=["subgroups", "fallback"], scope="session")
def env(request) -> Env:
    """Both reduction paths: kernels built with subgroup ops and with the shared-memory fallback."""
    return open_env(request.param)


@pytest.fixture(scope="session")
def env1() -> Env:
    """One device, for kernels without reductions."""
    return open_env("subgroups")


class Patched(KernelCache):
    """A kernel cache that compiles wgsl/NAME.wgsl with `old` replaced by `new` (every occurrence): a
    deliberately broken variant. Refuses when `old` is missing, so a trap cannot silently test the real kernel."""

    def __init__(self, device, name: str, old: str, new: str) -> None:
        super().__init__(device)
        self.name, self.old, self.new = name, old, new

    def get(self, name: str, entry: str = "main", **consts):
        if name != self.name:
            return super().get(name, entry, **consts)
        key = ("patched", name, entry, tuple(sorted(consts.items())))
        if key not in self._cache:
            src = shaders.source(name, **consts)
            if self.old not in src:
                raise AssertionError(f"trap text {self.old!r} not found in {name}.wgsl")
            self._cache[key] = self.device.kernel(src.replace(self.old, self.new), f"{name}:{entry} (broken)", entry)
        return self._cache[key]


def patched(env: Env, name: str, old: str, new: str) -> Env:
    return Env(env.device, Patched(env.device, name, old, new), env.name + " broken")


# ---------------------------------------------------------------------------------------------- buffers


def upload(device: gpu.Device, arr: np.ndarray, label: str = "test") -> gpu.Buffer:
    arr = np.ascontiguousarray(arr)
    buf = device.buffer(max(4, arr.nbytes), gpu.CONVERSATION, label)
    device.write(buf, arr.tobytes())
    return buf


def read(device: gpu.Device, buf: gpu.Buffer, dtype=np.float32, count: int | None = None) -> np.ndarray:
    nbytes = buf.size if count is None else count * np.dtype(dtype).itemsize
    return np.frombuffer(device.read_sync(buf, 0, nbytes), dtype=dtype).copy()


def run(env: Env, ops, pos: int, t: int, n_ctx: int = 8192) -> gpu.Buffer:
    """Run ops in one compute pass for a step of t tokens at `pos` (step buffer written with the run)."""
    step = ops_step(env)
    env.device.run([op.at(t) for op in ops], writes=[(step, 0, step_bytes(pos, t, n_ctx))])
    return step


def ops_step(env: Env) -> gpu.Buffer:
    if not hasattr(env.device, "_test_step"):
        env.device._test_step = make_step(env.device, "test.step")
    return env.device._test_step


def free(device: gpu.Device, *bufs) -> None:
    for b in bufs:
        if b in device.buffers:
            device.destroy(b)


def finite(got, what: str) -> np.ndarray:
    """got as an array; AssertionError naming how many of its values are not finite, if any."""
    got = np.asarray(got)
    if not np.all(np.isfinite(got)):
        raise AssertionError(f"{what}: non-finite output ({np.sum(~np.isfinite(got))} values)")
    return got


def within(what: str, got, want, scale, tol: float, scale_is: str = "its scale") -> float:
    """Raises AssertionError unless got is finite and within tol of want per element against scale (the bound's unit:
    `scale_is` names it in the message); the error in units of 2^-24."""
    from lab.host.reference.grads import U32, bound_err
    got = finite(got, what)
    e = bound_err(got, want, scale)
    if not e <= tol:
        raise AssertionError(f"{what}: error {e:.3g} of {scale_is} exceeds {tol:.3g}")
    return e / U32


def assert_close(got, want, tol: float, what: str, axis=None) -> None:
    got = finite(got, what)
    e = rel_err(got, want, axis)
    if not e <= tol:
        raise AssertionError(f"{what}: error {e:.3g} relative to magnitude exceeds {tol:.3g}")


# ---------------------------------------------------------------------------------------------- checks

def check_rms_norm(env: Env, t=5, pos=7, n=1000, eps=1e-5, group=None, inplace=False,
                   n_rows=8, seed=0, fused=None) -> None:
    """fused=(nh, nkv, hd): normalise the Q heads of a fused QKV buffer per head (strided input)."""
    from lab.ops.norm import rms_norm
    rng = np.random.default_rng(seed)
    dev = env.device
    if fused is None:
        g = n if group is None else group
        x = f32(rng.standard_normal((n_rows, n)) * rng.uniform(0.5, 3.0, (n_rows, 1)))
        x[1] *= 1e-3          # a row whose mean square (~1e-6) is below eps: eps placement matters here
        x[2] *= 300.0         # and a large one (residual streams reach hundreds)
        w = f32(rng.uniform(0.2, 2.0, g))
        xb, wb = upload(dev, x), upload(dev, w)
        yb = xb if inplace else upload(dev, np.full_like(x, 7.0))
        ops = rms_norm(dev, env.kernels, xb, wb, yb, ops_step(env), n, eps, group=group)
        run(env, ops, pos, t)
        y = read(dev, yb).reshape(n_rows, n)
        want = rms_norm_ref(x[:t], w, eps, g)
        assert_close(y[:t].reshape(t, -1, g), want.reshape(t, -1, g), NORM_TOL,
                     f"rms_norm n={n} group={g} inplace={inplace}", axis=(2,))
        rest = x[t:] if inplace else np.full_like(x[t:], 7.0)
        if not np.array_equal(y[t:], rest):
            raise AssertionError("rms_norm wrote rows beyond the step's tokens")
        free(dev, xb, wb, yb)
    else:
        nh, nkv, hd = fused
        stride = (nh + 2 * nkv) * hd
        x = f32(rng.standard_normal((n_rows, stride)) * 2.0)
        x[1, : nh * hd] *= 1e-3
        w = f32(rng.uniform(0.2, 2.0, hd))
        xb, wb = upload(dev, x), upload(dev, w)
        # Q heads into a compact buffer, K heads normalised in place in the fused buffer.
        qb = upload(dev, np.zeros((n_rows, nh * hd), np.float32))
        ops = rms_norm(dev, env.kernels, xb, wb, qb, ops_step(env), nh * hd, eps, group=hd, in_stride=stride)
        ops += rms_norm(dev, env.kernels, xb, wb, xb, ops_step(env), nkv * hd, eps, group=hd,
                        in_stride=stride, in_offset=nh * hd)
        run(env, ops, pos, t)
        q = read(dev, qb).reshape(n_rows, nh * hd)
        xo = read(dev, xb).reshape(n_rows, stride)
        wq = rms_norm_ref(x[:t, : nh * hd], w, eps, hd)
        wk = rms_norm_ref(x[:t, nh * hd:(nh + nkv) * hd], w, eps, hd)
        assert_close(q[:t].reshape(t, nh, hd), wq.reshape(t, nh, hd), NORM_TOL, "rms_norm fused Q", axis=(2,))
        assert_close(xo[:t, nh * hd:(nh + nkv) * hd].reshape(t, nkv, hd), wk.reshape(t, nkv, hd), NORM_TOL,
                     "rms_norm fused K in place", axis=(2,))
        if not (np.array_equal(xo[:, : nh * hd], x[:, : nh * hd])
                and np.array_equal(xo[:, (nh + nkv) * hd:], x[:, (nh + nkv) * hd:])
                and np.array_equal(xo[t:], x[t:])):
            raise AssertionError("rms_norm touched Q, V or rows past t in the fused buffer")
        free(dev, xb, wb, qb)


def check_rope(env: Env, mode="neox", t=5, pos=7, n_head=4, head_dim=64, n_rot=None, base=10000.0, scale=1.0,
               factors=None, n_rows=8, seed=1, fused=None, n_ctx=None, kv="f32") -> None:
    """fused=(nh, nkv): rotate the Q and K heads of a fused QKV buffer in one op; V must not move.
    n_ctx (with fused): the op also writes the rotated K and the V of rows pos .. pos+t-1 into caches of n_ctx
    rows (rows past n_ctx dropped); every other cache row must keep its bytes. kv="f16": caches of f16, each written
    value within one f16 step of the row's (WGSL rounds a store to either neighbour)."""
    from lab.ops.rope import rope
    rng = np.random.default_rng(seed)
    dev = env.device
    n_rot = head_dim if n_rot is None else n_rot
    if fused is None:
        nh_rot, stride = n_head, n_head * head_dim
    else:
        nh, nkv = fused
        nh_rot, stride = nh + nkv, (nh + 2 * nkv) * head_dim
    x = f32(rng.standard_normal((n_rows, stride)) * rng.uniform(0.5, 4.0, (n_rows, 1)))
    xb = upload(dev, x)
    cache, caches = None, []
    if n_ctx is not None:
        kvd = nkv * head_dim
        store = np.float16 if kv == "f16" else np.float32
        caches = [rng.standard_normal((n_ctx, kvd)).astype(store) for _ in range(2)]
        bufs = [upload(dev, c) for c in caches]
        cache = (bufs[0], bufs[1], nh, n_ctx)
    ops = rope(dev, env.kernels, xb, ops_step(env), nh_rot, head_dim, n_rot, base, scale, mode,
               row_stride=stride, freq_factors=factors, cache=cache, kv=kv)
    run(env, ops, pos, t)
    y = read(dev, xb).reshape(n_rows, stride)
    want = rope_ref(x[:t], pos, nh_rot, head_dim, n_rot, base, scale, mode, factors=factors)
    ff = 1.0 if factors is None else min(factors)
    tol = rope_tol((pos + t) * scale / ff)
    rot = y[:t, : nh_rot * head_dim].reshape(t, nh_rot, head_dim)
    assert_close(rot, want[:, : nh_rot * head_dim].reshape(t, nh_rot, head_dim), tol,
                 f"rope {mode} pos={pos} n_rot={n_rot}/{head_dim}", axis=(2,))
    # dims past n_rot, V heads and rows past t must be bit-identical
    if not np.array_equal(rot[:, :, n_rot:], x[:t, : nh_rot * head_dim].reshape(t, nh_rot, head_dim)[:, :, n_rot:]):
        raise AssertionError("rope changed dims past n_rot")
    if not (np.array_equal(y[:t, nh_rot * head_dim:], x[:t, nh_rot * head_dim:]) and np.array_equal(y[t:], x[t:])):
        raise AssertionError("rope touched V heads or rows past t")
    if cache is not None:
        # the cache holds exactly what the op left in the row: the rotated K (bit for bit) and the V (f16: rounded)
        rows = [j for j in range(t) if pos + j < n_ctx]
        k_want, v_want = (c.astype(np.float64) for c in caches)
        for j in rows:
            k_want[pos + j] = y[j, nh * head_dim:(nh + nkv) * head_dim]
            v_want[pos + j] = y[j, (nh + nkv) * head_dim:(nh + 2 * nkv) * head_dim]
        for name, buf, w in (("K", cache[0], k_want), ("V", cache[1], v_want)):
            got = read(dev, buf, store).reshape(n_ctx, kvd).astype(np.float64)
            step = np.spacing(np.abs(w.astype(np.float16))).astype(np.float64) if kv == "f16" else 0.0
            bad = np.argwhere(np.abs(got - w) > step)
            if len(bad):
                raise AssertionError(f"rope: {len(bad)} {name} cache values differ, first at (row, col) "
                                     f"{tuple(bad[0])} (rows {pos}..{pos + t - 1} written, n_ctx {n_ctx})")
        free(dev, *cache[:2])
    free(dev, xb)


def check_softmax(env: Env, t=5, pos=7, n=1000, lo=-3.0, hi=3.0, scale=1.0, rows=Rows.per_token(), inplace=False,
                  n_rows=8, seed=2) -> None:
    from lab.ops.softmax import softmax
    rng = np.random.default_rng(seed)
    dev = env.device
    x = f32(rng.uniform(lo, hi, (n_rows, n)))
    xb = upload(dev, x)
    yb = xb if inplace else upload(dev, np.full_like(x, 7.0))
    ops = softmax(dev, env.kernels, xb, yb, ops_step(env), n, rows=rows, scale=scale)
    run(env, ops, pos, t)
    y = read(dev, yb).reshape(n_rows, n)
    if rows.mode == ROWS_TOKENS:
        src, dst = list(range(min(t, rows.count))), list(range(min(t, rows.count)))
    elif rows.mode == ROWS_LAST:
        src, dst = [t - 1], [t - 1] if inplace else [0]
    else:
        src, dst = list(range(rows.count)), list(range(rows.count))
    want = softmax_ref(x[src], scale)
    assert_close(y[dst], want, softmax_tol(float(np.max(np.abs(x[src] * scale)))),
                 f"softmax n={n} rows={rows} scale={scale} range=({lo},{hi})", axis=1)
    untouched = [r for r in range(n_rows) if r not in dst]
    base = x if inplace else np.full_like(x, 7.0)
    if not np.array_equal(y[untouched], base[untouched]):
        raise AssertionError("softmax wrote rows it was not given")
    free(dev, xb, yb)


def check_glu(env: Env, act="swiglu", fused=False, t=5, pos=7, n=300, amp=4.0, n_rows=8, seed=3) -> None:
    from lab.ops.glu import glu
    rng = np.random.default_rng(seed)
    dev = env.device
    g = f32(rng.standard_normal((n_rows, n)) * amp)
    u = f32(rng.standard_normal((n_rows, n)) * 2.0)
    if fused:
        gb, ub = upload(dev, np.concatenate([g, u], axis=1)), None
    else:
        gb, ub = upload(dev, g), upload(dev, u)
    ob = upload(dev, np.full((n_rows, n), 7.0, np.float32))
    ops = glu(dev, env.kernels, gb, ub, ob, ops_step(env), n, act)
    run(env, ops, pos, t)
    out = read(dev, ob).reshape(n_rows, n)
    assert_close(out[:t], glu_ref(g[:t], u[:t], act), GLU_TOL, f"{act} fused={fused} amp={amp}")
    if not np.all(out[t:] == 7.0):
        raise AssertionError(f"{act} wrote rows past t")
    free(dev, *(b for b in (gb, ub, ob) if b is not None))


def check_argmax(env: Env, n=262_144, rows=Rows.fixed(1), t=1, pos=7, ties=True, special=False, seed=4) -> None:
    from lab.ops.sample import argmax
    rng = np.random.default_rng(seed)
    dev = env.device
    n_rows = 4
    x = f32(rng.standard_normal((n_rows, n)) * 5.0)
    for r in range(n_rows):
        if ties:   # the maximum at three places; the lowest must win
            places = np.sort(rng.choice(n, 3, replace=False))
            x[r, places] = np.float32(x[r].max() + 1.0)
        if special:
            x[r, rng.choice(n, n // 10, replace=False)] = np.nan
            x[r, rng.choice(n, n // 10, replace=False)] = -np.inf
            x[r, rng.choice(n, 3, replace=False)] = np.inf     # above every finite value: must still lose
    xb = upload(dev, x)
    ob = upload(dev, np.full(n_rows, 12345, np.uint32))
    ops = argmax(dev, env.kernels, xb, ob, ops_step(env), n, rows=rows)
    run(env, ops, pos, t)
    got = read(dev, ob, np.uint32)
    if rows.mode == ROWS_LAST:
        want, m = [argmax_ref(x[t - 1])], 1
    elif rows.mode == ROWS_TOKENS:
        m = min(t, rows.count)
        want = [argmax_ref(x[r]) for r in range(m)]
    else:
        m = rows.count
        want = [argmax_ref(x[r]) for r in range(m)]
    if list(got[:m]) != want:
        raise AssertionError(f"argmax n={n} rows={rows}: got {list(got[:m])}, want {want}")
    if not np.all(got[m:] == 12345):
        raise AssertionError("argmax wrote past its rows")
    free(dev, xb, ob)


def check_topk(env: Env, n=262_144, k=40, rows=Rows.fixed(1), t=1, pos=7, quantize=None, special=False,
               seed=5) -> None:
    """quantize=q rounds logits to multiples of q so many values tie (order by index must hold)."""
    from lab.ops.sample import top_k
    rng = np.random.default_rng(seed)
    dev = env.device
    n_rows = 3
    x = rng.standard_normal((n_rows, n)) * 4.0
    if quantize:
        x = np.round(x / quantize) * quantize
    x = f32(x)
    if special:
        x[:, rng.choice(n, n // 3, replace=False)] = np.nan
        x[:, rng.choice(n, n // 3, replace=False)] = -np.inf
        x[:, rng.choice(n, 2, replace=False)] = np.inf
    xb = upload(dev, x)
    ob = device_pairs(dev, n_rows * k)
    ops = top_k(dev, env.kernels, xb, ob, ops_step(env), n, k, rows=rows)
    run(env, ops, pos, t)
    raw = read(dev, ob, np.uint32).reshape(n_rows, k, 2)
    if rows.mode == ROWS_LAST:
        src = [t - 1]
    elif rows.mode == ROWS_TOKENS:
        src = list(range(min(t, rows.count)))
    else:
        src = list(range(rows.count))
    for r, s in enumerate(src):
        got = [(int(a), float(np.uint32(b).view(np.float32))) for a, b in raw[r]]
        want = topk_ref(x[s], k)
        if got != want:
            bad = next(q for q in range(k) if got[q] != want[q])
            raise AssertionError(f"top_k n={n} k={k} row {s}: place {bad} got {got[bad]}, want {want[bad]}")
    if not np.all(raw[len(src):] == 0xDEADBEEF):
        raise AssertionError("top_k wrote past its rows")
    free(dev, xb, ob)


def device_pairs(dev, count):
    return upload(dev, np.full(count * 2, 0xDEADBEEF, np.uint32))


# Elementwise add / mul / scale: one IEEE f32 operation per element, correctly rounded on Vulkan as in numpy:
# results must equal numpy's float32 results bit for bit.
def check_elementwise(env: Env, op="add", where="out", t=5, pos=7, n=1000, n_rows=8, seed=6) -> None:
    import elementwise_ops as ew
    rng = np.random.default_rng(seed)
    dev = env.device
    a = f32(rng.standard_normal((n_rows, n)) * 3.0)
    b = f32(rng.standard_normal((n_rows, n)) * 3.0)
    ab, bb = upload(dev, a), upload(dev, b)
    step = ops_step(env)
    if op == "scale":
        s = np.float32(0.7071)
        ops, target, want, before = ew.scale(dev, env.kernels, ab, step, n, float(s)), ab, a * s, a
    else:
        ob = {"a": ab, "b": bb}.get(where) or upload(dev, np.full_like(a, 7.0))
        fn = ew.add if op == "add" else ew.mul
        ops, target = fn(dev, env.kernels, ab, bb, ob, step, n), ob
        want = a + b if op == "add" else a * b
        before = {"a": a, "b": b}.get(where, np.full_like(a, 7.0))
    run(env, ops, pos, t)
    got = read(dev, target).reshape(n_rows, n)
    if not np.array_equal(got[:t], want[:t]):
        raise AssertionError(f"{op} ({where}): {np.sum(got[:t] != want[:t])} elements differ from numpy f32")
    if not np.array_equal(got[t:], before[t:]):
        raise AssertionError(f"{op} ({where}) wrote rows past t")
    free(dev, ab, bb, target)


def check_fill_zero(env: Env, n_words: int, extra: int = 37, wg: int = 256) -> list:
    """Fill n_words of a buffer holding n_words + extra non-zero words; returns the ops' grids."""
    from elementwise_ops import fill_zero
    dev = env.device
    buf = upload(dev, np.full(n_words + extra, 0xA5A5A5A5, np.uint32))
    ops = fill_zero(dev, env.kernels, buf, n_words, wg=wg)
    run(env, ops, 0, 1)
    got = read(dev, buf, np.uint32)
    free(dev, buf)
    if np.any(got[:n_words] != 0):
        raise AssertionError(f"fill_zero left {np.count_nonzero(got[:n_words])} of {n_words} words non-zero")
    if np.any(got[n_words:] != 0xA5A5A5A5):
        raise AssertionError("fill_zero wrote past n_words")
    return [op.grid(1) for op in ops]
