"""Both backends run the same WGSL: kernel cases made here with numpy run inside the browser worker (Chromium,
SwiftShader WebGPU) and natively (wgpu-py on lavapipe), both through lab/instruments/kernelcheck.py, i.e. through the engine's
own op builders, and both are compared with the same expected values and tolerances as tests/kernels.

Inputs are random and non-constant, sizes avoid multiples of the workgroups and tiles, positions are past 0.
Expected values come from tests/kernels/oracles.py, quant_oracle.py (weights dequantized by gguf.quants) and
attention_oracle.py. Every tolerance below is the native test's, restated with its reason, and holds in the browser
as it is: RoPE computes its own sin/cos (wgsl/rope.wgsl), since SwiftShader's builtins were measured off by up
to 1.9e-4, within the 2^-11 that WGSL allows.

Path: SwiftShader in Chromium offers `subgroups`, so the reduction kernels (matvec, RMSNorm, softmax, argmax,
top-k) run their subgroup path in the browser (`SG_ENABLE=enable subgroups;` in their labels); natively on
lavapipe too. test_reduction_path checks the kernel labels against the adapter's features and prints the path.

One page load serves the module; the cases go to the worker a few per message (`window.labKernelCheck`).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from lab.instruments import kernelcheck
from lab.format.ggml import BY_NAME
from lab.gpu.shaders import KernelCache
from tests.kernels import attention_oracle as attn_ref
from tests.kernels import oracles as ref
from tests.kernels import quant_oracle as qo

BOOT_MS = 120_000
PER_MESSAGE = 6                   # cases per worker message
EPS32 = float(np.finfo(np.float32).eps)
f32 = ref.f32


@dataclass
class Case:
    name: str
    spec: dict                                       # lab/instruments/kernelcheck.py's case: op, parameters, input bytes
    check: Callable[[dict], tuple[float, float]]     # outputs {name: bytes} -> (error, tolerance)


def _floats(raw: bytes, shape=None) -> np.ndarray:
    a = np.frombuffer(raw, np.float32)
    return a.reshape(shape) if shape is not None else a


def _finite(err: float, got) -> float:
    """A non-finite output is infinitely wrong, whatever the error measure made of it."""
    return err if np.all(np.isfinite(got)) and math.isfinite(err) else math.inf


# ------------------------------------------------------------------------------------------------ cases
# Projections: tolerance DOT_TOL = 1e-5 of each output's own sum |W||x| (f32 accumulation of `cols` terms against
# float64: ~sqrt(cols) * eps32 in practice, cols * eps32 at worst; quant_oracle.py says why).
def _cols(name: str) -> int:
    """K types 768 (96 groups of 8: not a multiple of the 64 threads), 32-blocks 96, floats 264."""
    return 768 if name in qo.K_TYPES else 96 if BY_NAME[name].block == 32 else 264


ROWS = 77                         # not a multiple of 4 (matvec rows per workgroup) or 32 (matmul tile)


def matvec_case(name: str, seed: int) -> Case:
    cols = _cols(name)
    raw = qo.random_tensor(name, ROWS, cols, seed)
    W = qo.dequant(raw, name)
    x = f32(np.random.default_rng(seed).standard_normal(cols))
    spec = {"op": "matvec", "type": name, "rows": ROWS, "cols": cols, "inputs": {"w": raw.tobytes(), "x": x.tobytes()}}

    def check(out):
        y = _floats(out["y"])
        return _finite(qo.dot_err(y, W, x), y), qo.DOT_TOL
    return Case(f"matvec_{name}", spec, check)


def matmul_case(name: str, t: int, seed: int) -> Case:
    cols = _cols(name)
    raw = qo.random_tensor(name, ROWS, cols, seed)
    W = qo.dequant(raw, name)
    X = f32(np.random.default_rng(seed).standard_normal((t, cols)))
    spec = {"op": "matmul", "type": name, "rows": ROWS, "cols": cols, "t": t,
            "inputs": {"w": raw.tobytes(), "x": X.tobytes()}}

    def check(out):
        Y = _floats(out["y"], (t, ROWS))
        return _finite(qo.dot_err(Y, W, X), Y), qo.DOT_TOL
    return Case(f"matmul_{name}_t{t}", spec, check)


# get_rows: DEQUANT_TOL = 1e-6 of the largest value: one or two f32 operations on an f16 scale and a small integer,
# as gguf.quants does them in float32 (an fma contraction may move the last bit).
def get_rows_case(name: str, scale: float, seed: int) -> Case:
    rows, cols = 40, _cols(name)
    raw = qo.random_tensor(name, rows, cols, seed)
    ids = np.random.default_rng(seed).permutation(rows)[:7].tolist() + [3, 3, rows - 1]   # shuffled, with repeats
    want = scale * qo.dequant(raw, name)[ids].astype(np.float64)
    spec = {"op": "get_rows", "type": name, "rows": rows, "cols": cols, "t": len(ids), "pos": 5, "scale": scale,
            "inputs": {"w": raw.tobytes(), "ids": np.asarray(ids, np.uint32).tobytes()}}

    def check(out):
        got = _floats(out["out"], (len(ids), cols))
        return _finite(qo.dequant_err(got, want), got), qo.DEQUANT_TOL
    return Case(f"get_rows_{name}" + ("_scaled" if scale != 1.0 else ""), spec, check)


# RMSNorm: NORM_TOL = 2e-6 of each group's magnitude (f32 sum of squares over n/WG terms then a log2(WG)-step
# reduction, rsqrt and two products; oracles.py says why). Rows of very small (mean square below eps) and large
# magnitude make the eps placement and the sum matter.
def rms_norm_case(t: int, pos: int, n: int, eps: float, group, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    g = n if group is None else group
    x = f32(rng.standard_normal((t, n)) * rng.uniform(0.5, 3.0, (t, 1)))
    x[1] *= 1e-3
    x[2] *= 300.0
    w = f32(rng.uniform(0.2, 2.0, g))
    want = ref.rms_norm_ref(x, w, eps, g).reshape(t, -1, g)
    spec = {"op": "rms_norm", "n": n, "eps": eps, "group": group, "t": t, "pos": pos,
            "inputs": {"x": x.tobytes(), "w": w.tobytes()}}

    def check(out):
        got = _floats(out["y"]).reshape(t, -1, g)
        return _finite(ref.rel_err(got, want, axis=(2,)), got), ref.NORM_TOL
    return Case(f"rms_norm_n{n}_group{g}", spec, check)


# RoPE: rope_tol(max theta) = 1e-6 + 1.5e-7 * max|theta| of each head's magnitude: theta = f32(pos) * f32(freq)
# carries ~1.5 ulp, which moves an output by |theta| * 1e-7 of the pair's size, plus sin/cos error (oracles.py).
# Dims past n_rot must come back bit-identical.
def rope_case(mode: str, t: int, pos: int, n_head: int, head_dim: int, n_rot=None, base=10000.0, scale=1.0,
              seed=1) -> Case:
    rng = np.random.default_rng(seed)
    nr = head_dim if n_rot is None else n_rot
    x = f32(rng.standard_normal((t, n_head * head_dim)) * rng.uniform(0.5, 4.0, (t, 1)))
    want = ref.rope_ref(x, pos, n_head, head_dim, nr, base, scale, mode).reshape(t, n_head, head_dim)
    spec = {"op": "rope", "mode": mode, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot, "base": base,
            "freq_scale": scale, "t": t, "pos": pos, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = _floats(out["x"]).reshape(t, n_head, head_dim)
        if not np.array_equal(got[:, :, nr:], x.reshape(t, n_head, head_dim)[:, :, nr:]):
            return math.inf, 0.0
        return _finite(ref.rel_err(got, want, axis=(2,)), got), ref.rope_tol((pos + t) * scale)
    return Case(f"rope_{mode}_pos{pos}_rot{nr}of{head_dim}", spec, check)


# Attention: the output is a convex combination of V rows, so its error is measured against max|V|. A score
# s = scale * q.k is rounded relative to its L1 size (scale * sum |q_i k_i|), a score error d moves each probability
# by d relative, so max|out - ref| <= 8 * eps32 * (max L1 + 16) * max|V| (tests/kernels/test_attention.py).
# With rope (the engine's path: the fused rope op writes the cache), the rotated q and k carry rope_tol of their
# magnitude, which moves a score by that much of scale * |q| |k| (the L2 product, which can pass the L1 sum).
def attention_case(n_head: int, n_kv: int, hd: int, mode: str, t: int, pos: int, n_ctx: int, window: int = 0,
                   seed: int = 0, rope: str | None = None) -> Case:
    rng = np.random.default_rng(seed)
    width, kvd = (n_head + 2 * n_kv) * hd, n_kv * hd
    k_off, v_off = n_head * hd, (n_head + n_kv) * hd
    src = f32(rng.standard_normal((t, width)))
    kc0, vc0 = f32(rng.standard_normal((n_ctx, kvd))), f32(rng.standard_normal((n_ctx, kvd)))
    sc = 1.0 / math.sqrt(hd)
    rot = src if rope is None else ref.rope_ref(src, pos, n_head + n_kv, hd, hd, 10000.0, 1.0, rope)
    kc, vc = attn_ref.kv_write(kc0, vc0, rot, pos, n_kv_head=n_kv, head_dim=hd, k_offset=k_off, v_offset=v_off)
    want, _, _ = attn_ref.attention(rot[:, :k_off], kc, vc, pos, n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                                    scale=sc, window=window)
    q = np.abs(rot[:, :k_off].astype(np.float64)).reshape(t, n_head, hd)
    kk = np.abs(kc.astype(np.float64)).reshape(n_ctx, n_kv, hd)
    l1 = max(float((q[:, h] @ kk[:, h // (n_head // n_kv)].T).max()) for h in range(n_head)) * sc
    l2 = float(np.linalg.norm(q, axis=2).max() * np.linalg.norm(kk, axis=2).max()) * sc
    tol = 8 * EPS32 * (l1 + 16) + (0.0 if rope is None else 2 * ref.rope_tol(pos + t) * l2)
    vmax = float(np.abs(vc).max())
    spec = {"op": "attention", "n_head": n_head, "n_kv_head": n_kv, "head_dim": hd, "mode": mode, "t": t, "pos": pos,
            "n_ctx": n_ctx, "window": window, "rope": rope,
            "inputs": {"src": src.tobytes(), "k_cache": kc0.tobytes(), "v_cache": vc0.tobytes()}}

    def check(out):
        got = _floats(out["out"], (t, n_head * hd)).astype(np.float64)
        return _finite(float(np.abs(got - want).max()) / vmax, got), tol
    name = (f"attention_{mode}_gqa{n_head // n_kv}_t{t}_pos{pos}" + (f"_window{window}" if window else "")
            + (f"_rope_{rope}" if rope else ""))
    return Case(name, spec, check)


# Softmax: softmax_tol(max|s x|) = 3e-6 + 2e-7 * max|s x| of each row's largest probability: rounding s*x to f32
# becomes the same relative error through exp, plus exp and the n-term sum (oracles.py). Logits of 100..1000
# overflow exp without the max subtraction.
def softmax_case(t: int, pos: int, n: int, lo: float, hi: float, scale: float, seed: int) -> Case:
    x = f32(np.random.default_rng(seed).uniform(lo, hi, (t, n)))
    want = ref.softmax_ref(x, scale)
    spec = {"op": "softmax", "n": n, "t": t, "pos": pos, "scale": scale, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = _floats(out["y"], (t, n))
        return _finite(ref.rel_err(got, want, axis=1), got), ref.softmax_tol(float(np.max(np.abs(x * scale))))
    return Case(f"softmax_{lo:g}_{hi:g}_scale{scale:g}", spec, check)


# GLU: GLU_TOL = 3e-6 of the tensor's magnitude: exp in silu within 3 + 2|g| ulp (Vulkan's bound) for |g| <= ~16,
# tanh, the cubic and the products a few ulp more (oracles.py).
def glu_case(act: str, t: int, pos: int, n: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    g, u = f32(rng.standard_normal((t, n)) * 4.0), f32(rng.standard_normal((t, n)) * 2.0)
    want = (ref.silu(g) if act == "swiglu" else ref.gelu_tanh(g)) * u
    spec = {"op": "glu", "act": act, "n": n, "t": t, "pos": pos, "inputs": {"gate": g.tobytes(), "up": u.tobytes()}}

    def check(out):
        got = _floats(out["out"], (t, n))
        return _finite(ref.rel_err(got, want), got), ref.GLU_TOL
    return Case(f"glu_{act}", spec, check)


# Argmax and top-k select and copy: indices and values must be exact (the error is the count of wrong places).
def argmax_case(n: int, rows: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    x = f32(rng.standard_normal((rows, n)) * 5.0)
    for r in range(rows):           # the maximum at three places: the lowest index must win
        x[r, np.sort(rng.choice(n, 3, replace=False))] = np.float32(x[r].max() + 1.0)
    want = [ref.argmax_ref(x[r]) for r in range(rows)]
    spec = {"op": "argmax", "n": n, "rows": rows, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = np.frombuffer(out["out"], np.uint32).tolist()
        return float(sum(a != b for a, b in zip(got, want))), 0.0
    return Case(f"argmax_n{n}", spec, check)


def top_k_case(n: int, k: int, rows: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    x = f32(np.round(rng.standard_normal((rows, n)) * 4.0 / 0.5) * 0.5)   # multiples of 0.5: many ties
    want = [ref.topk_ref(x[r], k) for r in range(rows)]
    spec = {"op": "top_k", "n": n, "k": k, "rows": rows, "inputs": {"x": x.tobytes()}}

    def check(out):
        raw = np.frombuffer(out["out"], np.uint32).reshape(rows, k, 2)
        got = [[(int(a), float(np.uint32(b).view(np.float32))) for a, b in raw[r]] for r in range(rows)]
        return float(sum(p != q for r in range(rows) for p, q in zip(got[r], want[r]))), 0.0
    return Case(f"top_k_n{n}_k{k}", spec, check)


SMOL = (9, 3, 64)                 # GQA group 3 (SmolLM2)
QWEN = (14, 2, 64)                # group 7 (Qwen2.5)


def make_cases() -> list[Case]:
    cases = [matvec_case(name, seed=i) for i, name in enumerate(("Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "F32"))]
    cases += [matvec_case(name, seed=30 + i) for i, name in enumerate(("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"))]
    cases += [matmul_case(name, t=21, seed=34 + i) for i, name in enumerate(("Q3_K", "IQ4_XS"))]
    cases += [get_rows_case(name, 1.0, seed=36 + i) for i, name in enumerate(("Q2_K", "IQ4_NL"))]
    cases += [
        matmul_case("Q4_K", t=21, seed=10),
        get_rows_case("Q8_0", 1.0, seed=11),
        get_rows_case("Q4_K", math.sqrt(640.0), seed=12),        # Gemma scales embeddings by sqrt(width)
        rms_norm_case(t=5, pos=7, n=1000, eps=1e-5, group=None, seed=13),
        rms_norm_case(t=3, pos=11, n=6 * 72, eps=1e-6, group=72, seed=14),   # per head (Gemma's q/k norm)
        rope_case("adjacent", t=5, pos=7, n_head=4, head_dim=64, seed=15),
        rope_case("neox", t=5, pos=7, n_head=4, head_dim=64, seed=16),
        rope_case("neox", t=3, pos=300, n_head=3, head_dim=80, n_rot=32, seed=17),   # partial rotation
        attention_case(*SMOL, "decode", t=1, pos=17, n_ctx=48, seed=18),
        attention_case(*SMOL, "prefill", t=5, pos=11, n_ctx=48, seed=19),
        attention_case(*QWEN, "decode", t=1, pos=20, n_ctx=48, window=4, seed=20),
        attention_case(*SMOL, "prefill", t=7, pos=9, n_ctx=48, window=4, seed=21),
        attention_case(*SMOL, "decode", t=1, pos=17, n_ctx=48, rope="adjacent", seed=40),   # the plans' rope + cache
        attention_case(*QWEN, "prefill", t=5, pos=11, n_ctx=48, rope="neox", seed=41),
        softmax_case(t=5, pos=7, n=1000, lo=100.0, hi=1000.0, scale=1.0, seed=22),
        softmax_case(t=4, pos=7, n=777, lo=-10.0, hi=10.0, scale=0.7, seed=23),
        glu_case("swiglu", t=5, pos=7, n=300, seed=24),
        glu_case("geglu", t=5, pos=7, n=300, seed=25),
        argmax_case(n=50_001, rows=2, seed=26),
        top_k_case(n=9_000, k=40, rows=2, seed=27),
    ]
    assert len({c.name for c in cases}) == len(cases)
    return cases


CASES = {c.name: c for c in make_cases()}


# ------------------------------------------------------------------------------------------------ runs
def _encoded(spec: dict) -> dict:
    """JSON for the page: bytes in base64, and no None (JS null does not come back to Python as None)."""
    return {**{k: v for k, v in spec.items() if v is not None},
            "inputs": {k: base64.b64encode(v).decode() for k, v in spec["inputs"].items()}}


@pytest.fixture(scope="module")
def worker_page(browser, server_url):
    context = browser.new_context()
    page = context.new_page()
    console: list[tuple[str, str]] = []
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: console.append(("error", str(e))))
    page.goto(server_url + "/")
    page.wait_for_selector('[data-testid="gpu-selftest"]:not([data-state="pending"])', timeout=BOOT_MS)
    yield page, console
    context.close()


@pytest.fixture(scope="module")
def in_worker(worker_page) -> dict:
    """name -> {"outputs", "kernels"} from the browser worker, plus "adapter": its summary."""
    page, _ = worker_page
    names = list(CASES)
    results: dict = {}
    for i in range(0, len(names), PER_MESSAGE):
        batch = names[i:i + PER_MESSAGE]
        reply = page.evaluate("cases => window.labKernelCheck(cases)", [_encoded(CASES[n].spec) for n in batch])
        assert reply["buffers"]["after"] == reply["buffers"]["before"], "the worker's checks left buffers behind"
        for name, r in zip(batch, reply["results"]):
            results[name] = {"outputs": {k: base64.b64decode(v) for k, v in r["outputs"].items()},
                             "kernels": r["kernels"]}
        results["adapter"] = reply["adapter"]
    return results


@pytest.fixture(scope="module")
def native(device) -> dict:
    """name -> {"outputs", "kernels"} from the native device, through the same lab/instruments/kernelcheck.py."""
    kernels = KernelCache(device)

    async def run_all():
        return {name: await kernelcheck.run(device, kernels, c.spec) for name, c in CASES.items()}

    # Playwright's sync API keeps an event loop running in this thread: run the native device in another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = len(device.buffers)
        results = pool.submit(asyncio.run, run_all()).result()
    assert len(device.buffers) == before, "kernelcheck left buffers behind"
    return results


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("name", list(CASES))
def test_case(name, in_worker, native):
    case = CASES[name]
    b_err, tol = case.check(in_worker[name]["outputs"])
    n_err, _ = case.check(native[name]["outputs"])
    print(f"{name}: browser {b_err:.3g}, native {n_err:.3g} (tolerance {tol:.3g})", file=sys.stderr)
    assert b_err <= tol, f"{name} in the browser worker: error {b_err:.3g} > tolerance {tol:.3g}"
    assert n_err <= tol, f"{name} natively: error {n_err:.3g} > tolerance {tol:.3g}"
    assert in_worker[name]["kernels"] and len(in_worker[name]["kernels"]) == len(native[name]["kernels"])


def test_reduction_path(in_worker, native, device, worker_page):
    """The reduction kernels were built for the path each adapter's features give: subgroups or the fallback."""
    adapter = in_worker["adapter"]
    paths = {"browser": "subgroups" in adapter["features"], "native": "subgroups" in device.info.features}
    print(f"browser adapter {adapter['name']!r}: {'subgroup' if paths['browser'] else 'fallback'} path; native "
          f"{device.info.name!r}: {'subgroup' if paths['native'] else 'fallback'} path", file=sys.stderr)
    for where, results in (("browser", in_worker), ("native", native)):
        labels = [k for n in CASES for k in results[n]["kernels"]
                  if k.split(":")[0] in ("matvec", "norm", "softmax", "sample")]
        assert len(labels) >= 5
        for label in labels:     # the SG lines are live (switch empty) exactly on the subgroup path
            assert (" SG= " in label) == paths[where], f"{where}: {label}"
            if where == "browser" and paths[where]:
                assert "SG_ENABLE=enable subgroups;" in label, label
    assert [t for k, t in worker_page[1] if k == "error"] == []


# ------------------------------------------------------------------------------------------------ tensor cores
# The int8 GEMM (wgsl/matmul_i8.wgsl) runs only where the adapter has Chromium's int8 subgroup matrices
# (AdapterInfo.int8_matrix: the H200 page, not SwiftShader or the native backend), so these cases run in the worker
# alone. Each is checked in two parts:
# - the quantized input (wgsl/q8_rows.wgsl) against numpy's: d = max|x| / 127 per block of 32 within 2 ulp (the
#   GPU's division), q = round(x * 127 / max|x|) within 1 (a value near .5 may round the other way when the
#   reciprocal differs in its last bit), at most 1% of values off by one;
# - the product against float64 on the GPU's own quantized input: the integer block dot products are exact, then
#   a * dx * I + c * (dx * sum q) per block in f32, so the error is held to I8_TOL of the per-element sum of those
#   terms' magnitudes (2 * nb f32 products and sums; Q4_1's offset term cancels against the scaled one, which is
#   why the magnitude is the terms', not the result's).
I8_TOL = 1e-5
I8_COLS = 160                    # 5 blocks of 32


def _blocks(raw: np.ndarray, name: str, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (row, block): a and c of w = a * q + c, read from the GGUF bytes (f16 d at byte 0, m at byte 2)."""
    bb = BY_NAME[name].nbytes
    blk = raw.reshape(rows, cols // 32, bb)
    d = blk[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    if name in ("Q4_1", "Q5_1"):
        return d, blk[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return d, {"Q4_0": -8.0, "Q5_0": -16.0, "Q8_0": 0.0}[name] * d


def matmul_i8_case(name: str, t: int, seed: int, tile_rows: int) -> Case:
    rows, cols, nb = ROWS, I8_COLS, I8_COLS // 32
    raw = qo.random_tensor(name, rows, cols, seed)
    W = qo.dequant(raw, name).astype(np.float64)
    a, c = _blocks(raw, name, rows, cols)
    q_w = np.rint((W.reshape(rows, nb, 32) - c[..., None]) / a[..., None])        # the integers behind W
    rng = np.random.default_rng(seed)
    X = f32(rng.standard_normal((t, cols)) * rng.uniform(0.1, 5.0, (t, 1)))
    X[1, :32] = 0.0                                   # a zero block: d = 0, q = 0
    X[2, 40] = 300.0                                  # an outlier that flattens the rest of its block
    spec = {"op": "matmul_i8", "type": name, "rows": rows, "cols": cols, "t": t, "tile_rows": tile_rows,
            "inputs": {"w": raw.tobytes(), "x": X.tobytes()}}

    def check(out):
        xq = np.frombuffer(out["xq"], np.int8).reshape(t, nb, 32).astype(np.float64)
        xd = np.frombuffer(out["xd"], np.float32).reshape(t, nb, 2).astype(np.float64)
        q_np, d_np = qo.q8_blocks(X)
        off = np.abs(xq - q_np)
        bad_d = np.abs(xd[..., 0] - d_np) > 2 * EPS32 * np.abs(d_np)
        if off.max() > 1 or off.mean() > 0.01 or bad_d.any():
            return math.inf, I8_TOL
        if not np.allclose(xd[..., 1], xd[..., 0] * xq.sum(2), rtol=1e-6, atol=0):
            return math.inf, I8_TOL
        Y = _floats(out["y"], (t, rows)).astype(np.float64)
        dots = np.einsum("tbk,rbk->trb", xq, q_w)                         # integer block products
        scaled = dots * (xd[:, None, :, 0] * a[None, :, :])                  # a * dx * I
        offset = xd[:, None, :, 1] * c[None, :, :]                          # c * (dx * sum q)
        want = (scaled + offset).sum(2)
        scale = (np.abs(scaled) + np.abs(offset)).sum(2)
        err = float(np.max(np.abs(Y - want) / np.maximum(scale, 1e-30)))
        return _finite(err, Y), I8_TOL
    return Case(f"matmul_i8_{name}_t{t}_r{tile_rows}", spec, check)


# Both tile heights (16 rows for narrow projections, 32 for wide ones), 77 rows: partial tiles either way.
I8_CASES = {c.name: c for c in [matmul_i8_case("Q4_1", 37, 50, 16), matmul_i8_case("Q4_1", 37, 50, 32),
                                 matmul_i8_case("Q4_0", 37, 51, 16), matmul_i8_case("Q8_0", 37, 52, 32),
                                 matmul_i8_case("Q5_0", 5, 53, 16), matmul_i8_case("Q5_1", 70, 54, 32)]}


@pytest.fixture(scope="module")
def i8_in_worker(worker_page, in_worker) -> dict:
    if not in_worker["adapter"].get("int8_matrix"):
        pytest.skip(f"{in_worker['adapter']['name']}: no int8 subgroup matrices (the H200 page has them)")
    page, _ = worker_page
    reply = page.evaluate("cases => window.labKernelCheck(cases)", [_encoded(c.spec) for c in I8_CASES.values()])
    assert reply["buffers"]["after"] == reply["buffers"]["before"], "the worker's checks left buffers behind"
    return {name: {k: base64.b64decode(v) for k, v in r["outputs"].items()}
            for name, r in zip(I8_CASES, reply["results"])}


@pytest.mark.parametrize("name", list(I8_CASES))
def test_int8_matrix_case(name, i8_in_worker):
    err, tol = I8_CASES[name].check(i8_in_worker[name])
    print(f"{name}: browser {err:.3g} (tolerance {tol:.3g})", file=sys.stderr)
    assert err <= tol, f"{name} in the browser worker: error {err:.3g} > tolerance {tol:.3g}"
