"""The kernel cases both backends run: numpy-made inputs for one op family each (a lab/instruments/kernelcheck.py
spec: op, parameters, input bytes) with a check of the outputs against the float64 references, for
tests/browser/test_kernels_in_worker.py (the browser worker and the native device) and scripts/make_kernel_fixtures.py
(the verification card's reference/kernels.json: make_cases() only, the forward kernels; make_backward_cases() are the
backward kernels', for the worker test alone) (CPython only).

Inputs are random and non-constant, sizes avoid multiples of the workgroups and tiles, positions are past 0. Every
tolerance is the native test's (tests/kernels), restated with its reason, and holds in the browser as it is. The
cases know nothing of where they run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lab.format.ggml import BY_NAME
from lab.host.reference import attention as attn_ref
from lab.host.reference import grads
from lab.host.reference import grads_attention as ga
from lab.host.reference import grads_head as gh
from lab.host.reference import grads_shortconv
from lab.host.reference import kernels as ref
from lab.host.reference import optim
from lab.host.reference import ops as ref_ops
from lab.host.reference import quant as qo
from lab.host.reference.ops import argmax
from lab.ops import Weight
from lab.ops.backward_head import STATS_ROWS
from lab.ops.backward_matmul import dx_chunk_rows
from lab.ops.optimizer import reduction_depth, state_bytes

EPS32 = float(np.finfo(np.float32).eps)


@dataclass
class Case:
    name: str
    spec: dict                                     # lab/instruments/kernelcheck.py's case: op, parameters, input bytes
    check: Callable[[dict], tuple[float, float]]   # outputs {name: bytes} -> (error, tolerance)


def floats(raw: bytes, shape=None) -> np.ndarray:
    a = np.frombuffer(raw, np.float32)
    return a.reshape(shape) if shape is not None else a


def finite(err: float, got) -> float:
    """A non-finite output is infinitely wrong, whatever the error measure made of it."""
    return err if np.all(np.isfinite(got)) and math.isfinite(err) else math.inf


# ------------------------------------------------------------------------------------------------ cases
# Projections: tolerance DOT_TOL = 1e-5 of each output's own sum |W||x| (f32 accumulation of `cols` terms against
# float64: ~sqrt(cols) * eps32 in practice, cols * eps32 at worst; reference/quant.py says why).
def cols_for(name: str) -> int:
    """K types (and Q1_0's 128-blocks) 768 (96 groups of 8: not a multiple of the 64 threads), 32-blocks 96, 64-blocks
    (NVFP4, Q2_0) 192, floats 264."""
    block = BY_NAME[name].block
    return 768 if name in qo.K_TYPES else 96 if block == 32 else 192 if block == 64 else 264


ROWS = 77                         # not a multiple of 4 (matvec rows per workgroup) or 32 (matmul tile)


def matvec_case(name: str, seed: int) -> Case:
    cols = cols_for(name)
    raw = qo.random_tensor(name, ROWS, cols, seed)
    W = qo.dequant(raw, name)
    x = ref.f32(np.random.default_rng(seed).standard_normal(cols))
    spec = {"op": "matvec", "type": name, "rows": ROWS, "cols": cols, "inputs": {"w": raw.tobytes(), "x": x.tobytes()}}

    def check(out):
        y = floats(out["y"])
        return finite(qo.dot_err(y, W, x), y), qo.DOT_TOL
    return Case(f"matvec_{name}", spec, check)


def matmul_case(name: str, t: int, seed: int) -> Case:
    cols = cols_for(name)
    raw = qo.random_tensor(name, ROWS, cols, seed)
    W = qo.dequant(raw, name)
    X = ref.f32(np.random.default_rng(seed).standard_normal((t, cols)))
    spec = {"op": "matmul", "type": name, "rows": ROWS, "cols": cols, "t": t,
            "inputs": {"w": raw.tobytes(), "x": X.tobytes()}}

    def check(out):
        Y = floats(out["y"], (t, ROWS))
        return finite(qo.dot_err(Y, W, X), Y), qo.DOT_TOL
    return Case(f"matmul_{name}_t{t}", spec, check)


# get_rows: DEQUANT_TOL = 1e-6 of the largest value: one or two f32 operations on an f16 scale and a small integer,
# as gguf.quants does them in float32 (an fma contraction may move the last bit).
def get_rows_case(name: str, scale: float, seed: int) -> Case:
    rows, cols = 40, cols_for(name)
    raw = qo.random_tensor(name, rows, cols, seed)
    ids = np.random.default_rng(seed).permutation(rows)[:7].tolist() + [3, 3, rows - 1]   # shuffled, with repeats
    want = scale * qo.dequant(raw, name)[ids].astype(np.float64)
    spec = {"op": "get_rows", "type": name, "rows": rows, "cols": cols, "t": len(ids), "pos": 5, "scale": scale,
            "inputs": {"w": raw.tobytes(), "ids": np.asarray(ids, np.uint32).tobytes()}}

    def check(out):
        got = floats(out["out"], (len(ids), cols))
        return finite(qo.dequant_err(got, want), got), qo.DEQUANT_TOL
    return Case(f"get_rows_{name}" + ("_scaled" if scale != 1.0 else ""), spec, check)


# RMSNorm: NORM_TOL = 2e-6 of each group's magnitude (f32 sum of squares over n/WG terms then a log2(WG)-step
# reduction, rsqrt and two products; reference/kernels.py says why). Rows of very small (mean square below eps) and
# large magnitude make the eps placement and the sum matter.
def rms_norm_case(t: int, pos: int, n: int, eps: float, group, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    g = n if group is None else group
    x = ref.f32(rng.standard_normal((t, n)) * rng.uniform(0.5, 3.0, (t, 1)))
    x[1] *= 1e-3
    x[2] *= 300.0
    w = ref.f32(rng.uniform(0.2, 2.0, g))
    want = ref.rms_norm_ref(x, w, eps, g).reshape(t, -1, g)
    spec = {"op": "rms_norm", "n": n, "eps": eps, "group": group, "t": t, "pos": pos,
            "inputs": {"x": x.tobytes(), "w": w.tobytes()}}

    def check(out):
        got = floats(out["y"]).reshape(t, -1, g)
        return finite(ref.rel_err(got, want, axis=(2,)), got), ref.NORM_TOL
    return Case(f"rms_norm_n{n}_group{g}", spec, check)


# RoPE: rope_tol(max theta) = 1e-6 + 1.5e-7 * max|theta| of each head's magnitude: theta = f32(pos) * f32(freq)
# carries ~1.5 ulp, which moves an output by |theta| * 1e-7 of the pair's size, plus sin/cos error
# (reference/kernels.py). Dims past n_rot must come back bit-identical.
def rope_case(mode: str, t: int, pos: int, n_head: int, head_dim: int, n_rot=None, base=10000.0, scale=1.0,
              seed=1) -> Case:
    rng = np.random.default_rng(seed)
    nr = head_dim if n_rot is None else n_rot
    x = ref.f32(rng.standard_normal((t, n_head * head_dim)) * rng.uniform(0.5, 4.0, (t, 1)))
    want = ref.rope_ref(x, pos, n_head, head_dim, nr, base, scale, mode).reshape(t, n_head, head_dim)
    spec = {"op": "rope", "mode": mode, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot, "base": base,
            "freq_scale": scale, "t": t, "pos": pos, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = floats(out["x"]).reshape(t, n_head, head_dim)
        if not np.array_equal(got[:, :, nr:], x.reshape(t, n_head, head_dim)[:, :, nr:]):
            return math.inf, 0.0
        return finite(ref.rel_err(got, want, axis=(2,)), got), ref.rope_tol((pos + t) * scale)
    return Case(f"rope_{mode}_pos{pos}_rot{nr}of{head_dim}", spec, check)


# Attention: the output is a convex combination of V rows, so its error is measured against max|V|. A score
# s = scale * q.k is rounded relative to its L1 size (scale * sum |q_i k_i|), a score error d moves each probability
# by d relative, so max|out - ref| <= 8 * eps32 * (max L1 + 16) * max|V| (tests/kernels/test_attention.py).
# With rope (the engine's path: the fused rope op writes the cache), the rotated q and k carry rope_tol of their
# magnitude, which moves a score by that much of scale * |q| |k| (the L2 product, which can pass the L1 sum).
def attention_expected(spec: dict) -> tuple[np.ndarray, float, float]:
    """(want [t, n_head*hd] float64, max|V| of the written V cache, tolerance) of an attention spec, from its inputs:
    src [t, (n_head + 2 n_kv) hd] (rotated first when the spec names a rope mode) written into the caches at pos."""
    n_head, n_kv, hd, t, pos = spec["n_head"], spec["n_kv_head"], spec["head_dim"], spec["t"], spec["pos"]
    n_ctx, rope = spec["n_ctx"], spec.get("rope")
    k_off, v_off = n_head * hd, (n_head + n_kv) * hd
    src = floats(spec["inputs"]["src"], (t, -1))
    kc0, vc0 = floats(spec["inputs"]["k_cache"], (n_ctx, -1)), floats(spec["inputs"]["v_cache"], (n_ctx, -1))
    sc = 1.0 / math.sqrt(hd)
    rot = src if rope is None else ref.rope_ref(src, pos, n_head + n_kv, hd, hd, 10000.0, 1.0, rope)
    kc, vc = attn_ref.kv_write(kc0, vc0, rot, pos, n_kv_head=n_kv, head_dim=hd, k_offset=k_off, v_offset=v_off)
    want, _, _ = attn_ref.attention(rot[:, :k_off], kc, vc, pos, n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                                    scale=sc, window=spec.get("window", 0))
    q = np.abs(rot[:, :k_off].astype(np.float64)).reshape(t, n_head, hd)
    kk = np.abs(kc.astype(np.float64)).reshape(n_ctx, n_kv, hd)
    l1 = max(float((q[:, h] @ kk[:, h // (n_head // n_kv)].T).max()) for h in range(n_head)) * sc
    l2 = float(np.linalg.norm(q, axis=2).max() * np.linalg.norm(kk, axis=2).max()) * sc
    tol = 8 * EPS32 * (l1 + 16) + (0.0 if rope is None else 2 * ref.rope_tol(pos + t) * l2)
    return want, float(np.abs(vc).max()), tol


def attention_case(n_head: int, n_kv: int, hd: int, mode: str, t: int, pos: int, n_ctx: int, window: int = 0,
                   seed: int = 0, rope: str | None = None) -> Case:
    rng = np.random.default_rng(seed)
    width, kvd = (n_head + 2 * n_kv) * hd, n_kv * hd
    src = ref.f32(rng.standard_normal((t, width)))
    kc0, vc0 = ref.f32(rng.standard_normal((n_ctx, kvd))), ref.f32(rng.standard_normal((n_ctx, kvd)))
    spec = {"op": "attention", "n_head": n_head, "n_kv_head": n_kv, "head_dim": hd, "mode": mode, "t": t, "pos": pos,
            "n_ctx": n_ctx, "window": window, "rope": rope,
            "inputs": {"src": src.tobytes(), "k_cache": kc0.tobytes(), "v_cache": vc0.tobytes()}}
    want, vmax, tol = attention_expected(spec)

    def check(out):
        got = floats(out["out"], (t, n_head * hd)).astype(np.float64)
        return finite(float(np.abs(got - want).max()) / vmax, got), tol
    name = (f"attention_{mode}_gqa{n_head // n_kv}_t{t}_pos{pos}" + (f"_window{window}" if window else "")
            + (f"_rope_{rope}" if rope else ""))
    return Case(name, spec, check)


# Softmax: softmax_tol(max|s x|) = 3e-6 + 2e-7 * max|s x| of each row's largest probability: rounding s*x to f32
# becomes the same relative error through exp, plus exp and the n-term sum (reference/kernels.py). Logits of
# 100..1000 overflow exp without the max subtraction.
def softmax_case(t: int, pos: int, n: int, lo: float, hi: float, scale: float, seed: int) -> Case:
    x = ref.f32(np.random.default_rng(seed).uniform(lo, hi, (t, n)))
    want = ref.softmax_ref(x, scale)
    spec = {"op": "softmax", "n": n, "t": t, "pos": pos, "scale": scale, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = floats(out["y"], (t, n))
        return finite(ref.rel_err(got, want, axis=1), got), ref.softmax_tol(float(np.max(np.abs(x * scale))))
    return Case(f"softmax_{lo:g}_{hi:g}_scale{scale:g}", spec, check)


# GLU: GLU_TOL = 3e-6 of the tensor's magnitude: exp in silu within 3 + 2|g| ulp (Vulkan's bound) for |g| <= ~16,
# tanh, the cubic and the products a few ulp more (reference/kernels.py).
def glu_case(act: str, t: int, pos: int, n: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    g, u = ref.f32(rng.standard_normal((t, n)) * 4.0), ref.f32(rng.standard_normal((t, n)) * 2.0)
    want = ref.glu_ref(g, u, act)
    spec = {"op": "glu", "act": act, "n": n, "t": t, "pos": pos, "inputs": {"gate": g.tobytes(), "up": u.tobytes()}}

    def check(out):
        got = floats(out["out"], (t, n))
        return finite(ref.rel_err(got, want), got), ref.GLU_TOL
    return Case(f"glu_{act}", spec, check)


# Argmax and top-k select and copy: indices and values must be exact (the error is the count of wrong places).
def argmax_case(n: int, rows: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    x = ref.f32(rng.standard_normal((rows, n)) * 5.0)
    for r in range(rows):           # the maximum at three places: the lowest index must win
        x[r, np.sort(rng.choice(n, 3, replace=False))] = np.float32(x[r].max() + 1.0)
    want = [argmax(x[r]) for r in range(rows)]
    spec = {"op": "argmax", "n": n, "rows": rows, "inputs": {"x": x.tobytes()}}

    def check(out):
        got = np.frombuffer(out["out"], np.uint32).tolist()
        return float(sum(a != b for a, b in zip(got, want))), 0.0
    return Case(f"argmax_n{n}", spec, check)


def top_k_case(n: int, k: int, rows: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    x = ref.f32(np.round(rng.standard_normal((rows, n)) * 4.0 / 0.5) * 0.5)   # multiples of 0.5: many ties
    want = [ref.topk_ref(x[r], k) for r in range(rows)]
    spec = {"op": "top_k", "n": n, "k": k, "rows": rows, "inputs": {"x": x.tobytes()}}

    def check(out):
        raw = np.frombuffer(out["out"], np.uint32).reshape(rows, k, 2)
        got = [[(int(a), float(np.uint32(b).view(np.float32))) for a, b in raw[r]] for r in range(rows)]
        return float(sum(p != q for r in range(rows) for p, q in zip(got[r], want[r]))), 0.0
    return Case(f"top_k_n{n}_k{k}", spec, check)


# The depthwise causal conv in Qwen3.5's mode (silu of the conv, rows wider than the channels), one step past 0 over a
# state ring: CONV_TOL = 2e-6 of the largest |y| (l_cache products summed in tap order, then silu's exp within a few
# ulp), and the ring rows it writes within the same (they are copies of the input: measured bit-exact).
CONV_TOL = 2e-6


def shortconv_expected(spec: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """(y [t, n], the state ring after the step [ring, n], both float64, and the tolerance) of a silu-mode shortconv
    spec from its inputs, through the reference forward's causal_conv: seq = the ring's l_cache - 1 rows before pos
    (zero before position 0), then the step's x rows (the first n floats of each src row)."""
    n, lc, ring, t, pos = spec["n"], spec["l_cache"], spec["ring"], spec["t"], spec["pos"]
    x = floats(spec["inputs"]["src"], (t, spec["stride"]))[:, :n].astype(np.float64)
    state = floats(spec["inputs"]["state"], (ring, n)).astype(np.float64)
    w = floats(spec["inputs"]["w"], (n, lc)).astype(np.float64)
    before = np.array([state[(pos - b) % ring] if pos >= b else np.zeros(n) for b in range(lc - 1, 0, -1)])
    y = ref_ops.silu(ref_ops.causal_conv(np.concatenate([before, x]), w, t))
    after = state.copy()
    for j in range(max(0, t - ring), t):
        after[(pos + j) % ring] = x[j]
    return y, after, CONV_TOL


def shortconv_case(t: int, pos: int, n: int, stride: int, l_cache: int, ring: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    src = ref.f32(rng.standard_normal((t, stride)))
    state = ref.f32(rng.standard_normal((ring, n)))
    w = ref.f32(rng.standard_normal((n, l_cache)))
    spec = {"op": "shortconv", "mode": "silu", "n": n, "stride": stride, "l_cache": l_cache, "ring": ring, "t": t,
            "pos": pos, "inputs": {"src": src.tobytes(), "w": w.tobytes(), "state": state.tobytes()}}
    want, after, tol = shortconv_expected(spec)

    def check(out):
        y, ring_rows = floats(out["y"], (t, n)), floats(out["state"], (ring, n))
        err = max(float(np.abs(y - want).max()) / float(np.abs(want).max()),
                  float(np.abs(ring_rows - after).max()) / float(np.abs(after).max()))
        return finite(err, y), tol
    return Case(f"shortconv_silu_t{t}_pos{pos}_lc{l_cache}", spec, check)


# Qwen3.5's gated delta-net recurrence, one step past 0 from a given state: DELTA_TOL = 4e-6 of the output's and the
# state's own largest magnitude (sums of S f32 terms per token, the errors carried from token to token by a decay of
# at most 1 and a contracting update, the per-head rms norm and silu's exp: tests/kernels/test_deltanet.py, where the
# measured values sit).
DELTA_TOL = 4e-6


def deltanet_ref(proj: np.ndarray, conv: np.ndarray, dt_bias, ssm_a, norm_w, state: np.ndarray, pos: int, *,
                 n_k: int, n_v: int, S: int, z_offset: int, beta_offset: int, alpha_offset: int,
                 eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(out [t, n_v S], the state after the step [n_v, S, S]) of lab.ops.deltanet's step in float64, from the
    reference ops: q, k L2-normed per key head, beta = sigmoid, g = softplus(alpha + dt_bias) * ssm_a, ggml's
    gated delta rule (value head h on key head h % n_k) from `state` (zeros at position 0), then the gated RMS norm
    rms_norm(o) * norm_w * silu(z)."""
    t, K = len(proj), n_k * S
    proj, conv = proj.astype(np.float64), conv.astype(np.float64)
    q = ref_ops.l2_norm(conv[:, :K].reshape(t, n_k, S), eps)
    k = ref_ops.l2_norm(conv[:, K:2 * K].reshape(t, n_k, S), eps)
    v = conv[:, 2 * K:].reshape(t, n_v, S)
    beta = ref_ops.sigmoid(proj[:, beta_offset:beta_offset + n_v])
    g = ref_ops.softplus(proj[:, alpha_offset:alpha_offset + n_v] + np.asarray(dt_bias, np.float64))
    g = g * np.asarray(ssm_a, np.float64)
    s0 = np.zeros((n_v, S, S)) if pos == 0 else np.asarray(state, np.float64).reshape(n_v, S, S)
    o, s = ref_ops.gated_delta_rule(q, k, v, g, beta, s0)
    z = proj[:, z_offset:z_offset + n_v * S].reshape(t, n_v, S)
    out = ref_ops.rms_norm(o, np.asarray(norm_w, np.float64), eps) * ref_ops.silu(z)
    return out.reshape(t, n_v * S), s


def deltanet_expected(spec: dict) -> tuple[np.ndarray, np.ndarray, float]:
    """(out, state after, tolerance) of a deltanet spec from its inputs."""
    n_k, n_v, S, t = spec["n_k_heads"], spec["n_v_heads"], spec["head_dim"], spec["t"]
    inp = spec["inputs"]
    out, s = deltanet_ref(floats(inp["proj"], (t, spec["proj_stride"])), floats(inp["conv"], (t, -1)),
                          floats(inp["dt_bias"]), floats(inp["ssm_a"]), floats(inp["norm_w"]), floats(inp["state"]),
                          spec["pos"], n_k=n_k, n_v=n_v, S=S, z_offset=spec["z_offset"],
                          beta_offset=spec["beta_offset"], alpha_offset=spec["alpha_offset"], eps=spec["eps"])
    return out, s, DELTA_TOL


def deltanet_case(n_k: int, n_v: int, S: int, t: int, pos: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    conv_width = 2 * n_k * S + n_v * S
    z = conv_width                                      # proj rows [q k v | z | beta | alpha | 3 floats nobody reads]
    stride = z + n_v * S + 2 * n_v + 3
    proj = ref.f32(rng.standard_normal((t, stride)))
    conv = ref.f32(ref_ops.silu(rng.standard_normal((t, conv_width)) * 1.5))
    state = ref.f32(rng.standard_normal((n_v, S, S)) * 0.3)
    spec = {"op": "deltanet", "n_k_heads": n_k, "n_v_heads": n_v, "head_dim": S, "proj_stride": stride,
            "z_offset": z, "beta_offset": z + n_v * S, "alpha_offset": z + n_v * S + n_v, "eps": 1e-6, "t": t,
            "pos": pos, "inputs": {"proj": proj.tobytes(), "conv": conv.tobytes(),
                                   "dt_bias": ref.f32(rng.standard_normal(n_v)).tobytes(),
                                   "ssm_a": ref.f32(-rng.uniform(0.05, 1.0, n_v)).tobytes(),
                                   "norm_w": ref.f32(rng.uniform(0.5, 1.5, S)).tobytes(), "state": state.tobytes()}}
    want, after, tol = deltanet_expected(spec)

    def check(out):
        got, s = floats(out["out"], (t, n_v * S)), floats(out["state"], (n_v, S, S))
        err = max(float(np.abs(got - want).max()) / float(np.abs(want).max()),
                  float(np.abs(s - after).max()) / float(np.abs(after).max()))
        return finite(err, got), tol
    return Case(f"deltanet_k{n_k}_v{n_v}_S{S}_t{t}_pos{pos}", spec, check)


# The int8 tensor-core GEMM (wgsl/matmul_i8.wgsl; adapters with AdapterInfo.int8_matrix), checked in two parts:
# - the quantized input (wgsl/q8_rows.wgsl) against numpy's: d = max|x| / 127 per block of 32 within 2 ulp (the
#   GPU's division), q = round(x * 127 / max|x|) within 1 (a value near .5 may round the other way when the
#   reciprocal differs in its last bit), at most 1% of values off by one;
# - the product against float64 on the GPU's own quantized input: the integer block dot products are exact, then
#   dx * (a0 I0 + a1 I1) + c * (dx * sum q) per block in f32 (reference/quant.py's i8_terms: a per 16 values),
#   so the error is held to I8_TOL of the per-element sum of those terms' magnitudes (a few f32 products and sums
#   a block; Q4_1's and Q4_K's offset terms cancel against the scaled ones, which is why the magnitude is the
#   terms', not the result's).
I8_TOL = 1e-5


def i8_cols(name: str) -> int:
    """160 (5 blocks of 32) for the 32-value types; 768 (3 GGUF blocks) for the 256-value ones."""
    return 768 if BY_NAME[name].block == 256 else 160


def matmul_i8_case(name: str, t: int, seed: int, tile_rows: int) -> Case:
    rows, cols = ROWS, i8_cols(name)
    nb = cols // 32
    raw = qo.random_tensor(name, rows, cols, seed)
    q_w, a, c = qo.i8_terms(raw, name)                          # w = a[half] * q + c per block of 32
    rng = np.random.default_rng(seed)
    X = ref.f32(rng.standard_normal((t, cols)) * rng.uniform(0.1, 5.0, (t, 1)))
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
        Y = floats(out["y"], (t, rows)).astype(np.float64)
        dots = np.einsum("tbhk,rbhk->trbh", xq.reshape(t, nb, 2, 16), q_w.reshape(rows, nb, 2, 16))  # exact
        scaled = dots * (xd[:, None, :, None, 0] * a[None])        # a[half] * dx * I[half]
        offset = xd[:, None, :, 1] * c[None, :, :]                  # c * (dx * sum q)
        want = scaled.sum((2, 3)) + offset.sum(2)
        scale = np.abs(scaled).sum((2, 3)) + np.abs(offset).sum(2)
        err = float(np.max(np.abs(Y - want) / np.maximum(scale, 1e-30)))
        return finite(err, Y), I8_TOL
    return Case(f"matmul_i8_{name}_t{t}_r{tile_rows}", spec, check)


# Both tile heights (16 rows for narrow projections, 32 for wide ones), 77 rows: partial tiles either way; every
# type of lab.ops.matmul.I8_TYPES (the K types at 3 GGUF blocks a row, so a row's blocks cross them).
I8_CASES = {c.name: c for c in [matmul_i8_case("Q4_1", 37, 50, 16), matmul_i8_case("Q4_1", 37, 50, 32),
                                 matmul_i8_case("Q4_0", 37, 51, 16), matmul_i8_case("Q8_0", 37, 52, 32),
                                 matmul_i8_case("Q5_0", 5, 53, 16), matmul_i8_case("Q5_1", 70, 54, 32),
                                 matmul_i8_case("Q4_K", 37, 55, 32), matmul_i8_case("Q5_K", 21, 56, 16),
                                 matmul_i8_case("Q6_K", 37, 57, 32), matmul_i8_case("Q6_K", 5, 58, 16),
                                 matmul_i8_case("Q3_K", 37, 59, 16), matmul_i8_case("IQ4_XS", 37, 60, 32)]}


SMOL = (9, 3, 64)                 # GQA group 3 (SmolLM2)
QWEN = (14, 2, 64)                # group 7 (Qwen2.5)


def make_cases() -> list[Case]:
    cases = [matvec_case(name, seed=i) for i, name in enumerate(("Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0", "F32"))]
    cases += [matvec_case(name, seed=30 + i) for i, name in enumerate(("Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"))]
    cases += [matmul_case(name, t=21, seed=34 + i) for i, name in enumerate(("Q3_K", "IQ4_XS"))]
    cases += [get_rows_case(name, 1.0, seed=36 + i) for i, name in enumerate(("Q2_K", "IQ4_NL"))]
    cases += [matvec_case(name, seed=50 + i) for i, name in enumerate(("TQ2_0", "TQ1_0", "MXFP4", "NVFP4"))]
    cases += [matmul_case(name, t=21, seed=54 + i) for i, name in enumerate(("TQ1_0", "NVFP4"))]
    cases += [get_rows_case(name, 1.0, seed=56 + i) for i, name in enumerate(("TQ2_0", "MXFP4"))]
    cases += [matvec_case(name, seed=60 + i) for i, name in enumerate(("IQ2_XXS", "IQ3_XXS"))]
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
    # the later types, appended so that the earlier cases keep their place and bytes in reference/kernels.json
    later = ("IQ2_XS", "IQ2_S", "IQ3_S", "IQ1_S", "IQ1_M", "Q1_0", "Q2_0")
    cases += [matvec_case(name, seed=70 + i) for i, name in enumerate(later)]
    cases += [matmul_case(name, t=21, seed=77 + i) for i, name in enumerate(("IQ2_S", "IQ1_M", "Q1_0"))]
    cases += [get_rows_case(name, 1.0, seed=80 + i) for i, name in enumerate(("IQ3_S", "IQ1_S", "Q2_0"))]
    # Qwen3.5's delta-net layer: its conv (the silu mode) and its recurrence, a prefill chunk and a decode step
    cases += [shortconv_case(t=5, pos=9, n=200, stride=237, l_cache=4, ring=9, seed=90),
              deltanet_case(n_k=2, n_v=4, S=32, t=5, pos=7, seed=91),
              deltanet_case(n_k=2, n_v=2, S=128, t=1, pos=20, seed=92)]
    # the 5-bit types' matvecs (Q5_K's own loop; Q5_1 through the group loop), each value's fifth bit joined to its
    # nibble before the one conversion
    cases += [matvec_case(name, seed=93 + i) for i, name in enumerate(("Q5_K", "Q5_1"))]
    assert len({c.name for c in cases}) == len(cases)
    return cases


# ------------------------------------------------------------------------------------------------ backward cases
# The backward kernels (issue #43; lab/ops/backward*.py) against the float64 oracles of grads.py, grads_attention.py
# and grads_head.py, each with its native test's tolerance (tests/kernels/test_backward_*.py) and measure. A family
# with several outputs, each held to its own tolerance, reports the worst of error / tolerance (tolerance 1.0).
# They are not in make_cases() (the verification card's selection, reference/kernels.json): make_backward_cases().
def _frac(pairs) -> float:
    """The worst error / tolerance of (error, tolerance) pairs."""
    return max(e / t for e, t in pairs)


# RMSNorm backward: dx within NORM_BACK_DX_TOL = 4e-6 of each group's largest |dx| (r^3 triples the forward's sum of
# squares error, mean(dy w x) adds its mixed-sign sum), dw within NORM_BACK_DW_TOL = 8e-6 of its largest value (a sum
# over the step's tokens and groups, in order, added to its earlier value) (grads.py).
def rms_norm_back_case(t: int, pos: int, n: int, group, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    g = n if group is None else group
    x = ref.f32(rng.standard_normal((t, n)) * rng.uniform(0.5, 3.0, (t, 1)))
    w, dy = ref.f32(rng.uniform(0.2, 2.0, g)), ref.f32(rng.standard_normal((t, n)))
    dw0 = ref.f32(rng.standard_normal(g) * 0.1)
    eps = 1e-5
    dx_want, dw_want = grads.rms_norm_grad(x, w, dy, eps, g)
    spec = {"op": "rms_norm_back", "n": n, "eps": eps, "group": group, "t": t, "pos": pos,
            "inputs": {"x": x.tobytes(), "w": w.tobytes(), "dy": dy.tobytes(), "dw": dw0.tobytes()}}

    def check(out):
        dx, dw = floats(out["dx"]).reshape(t, -1, g), floats(out["dw"])
        e = _frac([(ref.rel_err(dx, dx_want.reshape(t, -1, g), axis=(2,)), grads.NORM_BACK_DX_TOL),
                   (ref.rel_err(dw, dw0 + dw_want), grads.NORM_BACK_DW_TOL)])
        return finite(e, np.concatenate([dx.ravel(), dw])), 1.0
    return Case(f"rms_norm_back_n{n}_group{g}", spec, check)


# GLU backward: GLU_BACK_TOL = 5e-6 of each half's largest value: d up is the forward's act (GLU_TOL) times one
# product, d gate = dh u act'(g) with act' = O(1) through two exps (or tanh and exp) of Vulkan's 3 + 2|g| ulp
# (grads.py).
def glu_back_case(act: str, t: int, pos: int, n: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    gu = ref.f32(np.concatenate([rng.standard_normal((t, n)) * 4.0, rng.standard_normal((t, n)) * 2.0], 1))
    dh = ref.f32(rng.standard_normal((t, n)))
    want = grads.glu_grad(gu, dh, act)
    spec = {"op": "glu_back", "act": act, "n": n, "t": t, "pos": pos,
            "inputs": {"gu": gu.tobytes(), "dh": dh.tobytes()}}

    def check(out):
        got = floats(out["dgu"], (t, 2 * n))
        e = max(ref.rel_err(got[:, :n], want[:, :n]), ref.rel_err(got[:, n:], want[:, n:]))
        return finite(e, got), grads.GLU_BACK_TOL
    return Case(f"glu_back_{act}", spec, check)


# Soft-cap backward: SOFTCAP_BACK_TOL of the tensor's largest |dx|: from x 1.5e-6 (x / cap, exp within ~10 ulp, the
# quotient and products); from y 5e-6 (tanh read back as y / cap carries the forward's few ulp of cap)
# (grads.py).
# Here y is numpy's float32 of the exact value, within that. Arguments from linear to saturated, and +-1e30.
def softcap_back_case(saved_is: str, t: int, pos: int, n: int, cap: float, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    x = ref.f32(rng.standard_normal((t, n)) * 8.0 / 3.0 * cap)
    x[0, :4] = [1e30, -1e30, 0.0, 1e-3]
    dy = ref.f32(rng.standard_normal((t, n)))
    saved = x if saved_is == "x" else ref.f32(cap * np.tanh(x.astype(np.float64) / cap))
    want = grads.softcap_grad(x, dy, cap)
    spec = {"op": "softcap_back", "n": n, "cap": cap, "saved_is": saved_is, "t": t, "pos": pos,
            "inputs": {"grad": dy.tobytes(), "saved": saved.tobytes()}}

    def check(out):
        got = floats(out["grad"], (t, n))
        return finite(ref.rel_err(got, want), got), grads.SOFTCAP_BACK_TOL[saved_is]
    return Case(f"softcap_back_from_{saved_is}", spec, check)


# Embedding backward: EMBED_BACK_TOL = 3e-6 of the seen rows' largest value: per token of an id, one product and one
# add in token order, (2k + 1)(k + 1) roundings for an id seen k times (<= 4 here) (grads.py). Rows never seen must
# come back bit-identical.
def embed_back_case(rows: int, cols: int, scale: float, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    ids = rng.permutation(rows)[:6].tolist() + [3, 3, rows - 1, 3]          # shuffled, one id four times
    t = len(ids)
    de0, dx = ref.f32(rng.standard_normal((rows, cols))), ref.f32(rng.standard_normal((t, cols)))
    want = de0 + grads.embed_grad(ids, dx, rows, scale)
    seen = np.zeros(rows, bool)
    seen[ids] = True
    spec = {"op": "embed_back", "rows": rows, "cols": cols, "scale": scale, "t": t, "pos": 5,
            "inputs": {"table": de0.tobytes(), "ids": np.asarray(ids, np.uint32).tobytes(), "dx": dx.tobytes()}}

    def check(out):
        got = floats(out["table"], (rows, cols))
        if not np.array_equal(got[~seen], de0[~seen]):
            return math.inf, grads.EMBED_BACK_TOL
        return finite(ref.rel_err(got[seen], want[seen]), got), grads.EMBED_BACK_TOL
    return Case(f"embed_back_{rows}x{cols}" + ("_scaled" if scale != 1.0 else ""), spec, check)


# dx through a weight of any type: dx_back_tol(chunk_rows, chunks) of each element's sum |dy| |W| (+ |dx0|): a
# product, the adds within a chunk, the chunks' sum, the add into dx0, the dequantization's 2 ulp (grads.py).
def dx_back_case(name: str, t: int, rows: int, chunk_rows: int, accumulate: bool, seed: int) -> Case:
    cols = cols_for(name)
    raw = qo.random_tensor(name, rows, cols, seed)
    W = qo.dequant(raw, name).astype(np.float64)
    rng = np.random.default_rng(seed)
    dy = ref.f32(rng.standard_normal((t, rows)) * rng.uniform(0.5, 2.0, (t, 1)))
    dx0 = ref.f32(rng.standard_normal((t, cols)) * 3.0) if accumulate else np.zeros((t, cols), np.float32)
    want = dx0 + dy.astype(np.float64) @ W
    scale = np.abs(dx0) + np.abs(dy).astype(np.float64) @ np.abs(W)
    tol = grads.dx_back_tol(min(chunk_rows, rows), -(-rows // chunk_rows))
    inputs = {"w": raw.tobytes(), "dy": dy.tobytes(), **({"dx": dx0.tobytes()} if accumulate else {})}
    spec = {"op": "dx_back", "type": name, "rows": rows, "cols": cols, "t": t, "chunk_rows": chunk_rows,
            "accumulate": accumulate, "inputs": inputs}

    def check(out):
        got = floats(out["dx"], (t, cols))
        return finite(grads.bound_err(got, want, scale), got), tol
    return Case(f"dx_back_{name}_t{t}" + ("_acc" if accumulate else ""), spec, check)


# LoRA backward (five GEMMs), each gradient per element against its terms' magnitudes (lora_grad of the absolute
# values, plus the earlier value it is added to), tolerances the chains' roundings as
# tests/kernels/test_backward_lora.py counts them: dx = du A after du = s dy B: gemm_tol(n_out) + gemm_tol(rank);
# dA: du's chain then t tokens, gemm_tol(n_out) + gemm_tol(t); dB: u = x A^T then t tokens,
# gemm_tol(n_in) + gemm_tol(t) (grads.py).
def lora_back_case(n_in: int, n_out: int, rank: int, t: int, s: float, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    a = ref.f32(rng.standard_normal((rank, n_in)) / np.sqrt(n_in))
    b = ref.f32(rng.standard_normal((n_out, rank)) * 0.5)
    da0, db0 = ref.f32(rng.standard_normal((rank, n_in))), ref.f32(rng.standard_normal((n_out, rank)))
    x, dy = ref.f32(rng.standard_normal((t, n_in))), ref.f32(rng.standard_normal((t, n_out)) * 2.0)
    dx0 = ref.f32(rng.standard_normal((t, n_in)))
    zero = np.zeros((n_out, n_in))
    dx, da, db = grads.lora_grad(zero, a, b, x, dy, s)               # the adapter's part: the base W is dx_back's
    sx, sa, sb = grads.lora_grad(zero, *(np.abs(v).astype(np.float64) for v in (a, b, x, dy)), abs(s))
    want = {"dx": (dx0 + dx, sx + np.abs(dx0), grads.gemm_tol(n_out) + grads.gemm_tol(rank)),
            "da": (da0 + da, sa + np.abs(da0), grads.gemm_tol(n_out) + grads.gemm_tol(t)),
            "db": (db0 + db, sb + np.abs(db0), grads.gemm_tol(n_in) + grads.gemm_tol(t))}
    spec = {"op": "lora_back", "n_in": n_in, "n_out": n_out, "rank": rank, "scale": s, "t": t,
            "inputs": {"a": a.tobytes(), "b": b.tobytes(), "da": da0.tobytes(), "db": db0.tobytes(), "x": x.tobytes(),
                       "dy": dy.tobytes(), "dx": dx0.tobytes()}}

    def check(out):
        got = {k: floats(out[k], want[k][0].shape) for k in want}
        e = _frac([(grads.bound_err(got[k], w, sc), tol) for k, (w, sc, tol) in want.items()])
        return finite(e, np.concatenate([g.ravel() for g in got.values()])), 1.0
    return Case(f"lora_back_{n_out}x{n_in}_r{rank}_t{t}", spec, check)


# A bias's gradient, db += dy^T 1 on the GEMM (bias_back) over a fused row's columns: gemm_tol(t) of each element's
# |db0| + sum |dy| (grads.bias_grad).
def bias_back_case(width: int, stride: int, offset: int, t: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    rows = ref.f32(rng.standard_normal((t, stride)) * rng.uniform(0.5, 4.0, (t, 1)))
    dy = rows[:, offset:offset + width]
    db0 = ref.f32(rng.standard_normal(width))
    want = db0 + grads.bias_grad(dy)
    scale = np.abs(db0) + np.abs(dy).astype(np.float64).sum(axis=0)
    tol = grads.gemm_tol(t)
    spec = {"op": "bias_back", "width": width, "stride": stride, "offset": offset, "t": t, "pos": 3,
            "inputs": {"db": db0.tobytes(), "dy": rows.tobytes(), "one": ref.f32(np.ones(1)).tobytes()}}

    def check(out):
        got = floats(out["db"])
        return finite(grads.bound_err(got, want, scale), got), tol
    return Case(f"bias_back_w{width}_of{stride}_t{t}", spec, check)


# LFM2's short conv backward over a window from position 0 (lab/host/reference/grads_shortconv.py): dbcx within
# dbcx_tol(l_cache) and dw within dw_tol(t) of each element's terms' magnitudes (the oracle on the inputs' absolute
# values, plus |dw0|), counts of f32 roundings; the worst of error / tolerance.
def shortconv_back_case(t: int, n: int, l_cache: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    bcx = ref.f32(rng.standard_normal((t, 3 * n)) * rng.uniform(0.5, 3.0, (1, 3 * n)))
    w, dy = ref.f32(rng.standard_normal((n, l_cache))), ref.f32(rng.standard_normal((t, n)))
    dw0 = ref.f32(rng.standard_normal((n, l_cache)) * 3.0)
    dbcx, dw = grads_shortconv.shortconv_grad(bcx, w, dy)
    sbcx, sdw = grads_shortconv.shortconv_grad(np.abs(bcx), np.abs(w), np.abs(dy))
    want = {"dbcx": (dbcx, sbcx, grads_shortconv.dbcx_tol(l_cache)),
            "dw": (dw0 + dw, sdw + np.abs(dw0), grads_shortconv.dw_tol(t))}
    spec = {"op": "shortconv_back", "t": t, "n": n, "l_cache": l_cache,
            "inputs": {"bcx": bcx.tobytes(), "w": w.tobytes(), "dy": dy.tobytes(), "dw": dw0.tobytes()}}

    def check(out):
        got = {k: floats(out[k], want[k][0].shape) for k in want}
        e = _frac([(grads.bound_err(got[k], v, sc), tol) for k, (v, sc, tol) in want.items()])
        return finite(e, np.concatenate([g.ravel() for g in got.values()])), 1.0
    return Case(f"shortconv_back_t{t}_n{n}_l{l_cache}", spec, check)


# RoPE backward: the rotation by -theta with the forward's own angle arithmetic, so the forward's tolerance
# (rope_back_tol = rope_tol(max |theta|): 1e-6 + 1.5e-7 max |theta| of each head's magnitude) holds for the same
# reasons (grads_attention.py); dims past n_rot come back bit-identical.
def rope_back_case(mode: str, t: int, pos: int, n_head: int, head_dim: int, n_rot=None, factors=None,
                   scale: float = 1.0, seed: int = 1) -> Case:
    rng = np.random.default_rng(seed)
    nr, base = head_dim if n_rot is None else n_rot, 10000.0
    dy = ref.f32(rng.standard_normal((t, n_head * head_dim)) * rng.uniform(0.5, 4.0, (t, 1)))
    heads = dy.reshape(t, n_head, head_dim)
    positions = pos + np.arange(t)
    want = ga.rope_grad(heads, positions, nr, base, mode, scale, factors)
    tol = ga.rope_back_tol(float(np.max(np.abs(ga.rope_angles(positions, nr, base, scale, factors)))))
    spec = {"op": "rope_back", "mode": mode, "n_head": n_head, "head_dim": head_dim, "n_rot": n_rot, "base": base,
            "freq_scale": scale, "factors": None if factors is None else [float(f) for f in factors], "t": t,
            "pos": pos, "inputs": {"grad": dy.tobytes()}}

    def check(out):
        got = floats(out["grad"]).reshape(t, n_head, head_dim)
        if not np.array_equal(got[:, :, nr:], heads[:, :, nr:]):
            return math.inf, tol
        return finite(ref.rel_err(got, want, axis=(2,)), got), tol
    return Case(f"rope_back_{mode}_pos{pos}_rot{nr}of{head_dim}" + ("_factors" if factors is not None else ""),
                spec, check)


# Attention backward: each of dq, dk, dv per element against the magnitudes of its terms, within the counts of f32
# roundings grads_attention.attention_tols derives from the kernels' arithmetic (scores, P recomputed from the row
# statistics, dS, the sums over keys or queries), O given as the oracle's f32 output (o_err 0), as
# tests/kernels/test_backward_attention.py holds them; rows of keys past pos + t come back 0 (never written).
def attention_back_case(t: int, pos: int, nh: int, nkv: int, hd: int, window: int, softcap: float, seed: int,
                        spare: int = 3, tiles: bool | None = None) -> Case:
    rng = np.random.default_rng(seed)
    n_keys, n_ctx, sc = pos + t, pos + t + spare, 1.0 / math.sqrt(hd)
    q, k = ref.f32(rng.standard_normal((t, nh, hd)) * 1.5), ref.f32(rng.standard_normal((n_ctx, nkv, hd)) * 1.5)
    v, do = ref.f32(rng.standard_normal((n_ctx, nkv, hd))), ref.f32(rng.standard_normal((t, nh, hd)))
    kw = dict(n_kv_head=nkv, scale=sc, window=window, softcap=softcap)
    o = ref.f32(ga.attention(q, k[:n_keys], v[:n_keys], pos, **kw))
    want = dict(zip(("dq", "dk", "dv"), ga.attention_grad(q, k[:n_keys], v[:n_keys], do, pos, **kw)))
    tols = ga.attention_tols(q, k[:n_keys], v[:n_keys], do, pos, **kw)
    spec = {"op": "attention_back", "n_head": nh, "n_kv_head": nkv, "head_dim": hd, "n_ctx": n_ctx, "window": window,
            "softcap": softcap, "t": t, "pos": pos, "tiles": tiles,
            "inputs": {"q": q.tobytes(), "k": k.tobytes(), "v": v.tobytes(), "o": o.tobytes(), "do": do.tobytes()}}

    def check(out):
        got = {"dq": floats(out["dq"], (t, nh, hd)), "dk": floats(out["dk"], (n_ctx, nkv, hd)),
               "dv": floats(out["dv"], (n_ctx, nkv, hd))}
        if np.any(got["dk"][n_keys:] != 0) or np.any(got["dv"][n_keys:] != 0):
            return math.inf, 1.0
        e = _frac([(grads.bound_err(got[n][:len(want[n])], want[n], tols[n][0]), tols[n][1]) for n in want])
        return finite(e, np.concatenate([g.ravel() for g in got.values()])), 1.0
    return Case(f"attention_back_gqa{nh // nkv}_t{t}_pos{pos}_hd{hd}" + (f"_window{window}" if window else "")
                + (f"_cap{softcap:g}" if softcap else "") + ("_tiles" if tiles else ""), spec, check)


# The head fused with the cross-entropy (head_loss then head_back): the loss, each row's nll and dxn, each value within
# its own bound of grads_head.head_bounds (counts of f32 roundings against the magnitudes of the logits, the lse, the
# dlogits and dx_back's sums, as tests/kernels/test_backward_head.py holds them); the count and 1 / N exact. One slab
# (the vocabulary is far below SLAB_FLOATS / t rows): ce_stats chunks of STATS_ROWS, dx_back chunks of its default.
def head_ce_case(name: str, vocab: int, cols: int, t: int, cap: float, masked: tuple, spread: float,
                 seed: int) -> Case:
    rng = np.random.default_rng(seed)
    raw = qo.random_tensor(name, vocab, cols, seed)
    W = qo.dequant(raw, name).astype(np.float64)
    x = rng.standard_normal((t, cols))
    x = ref.f32(x * spread / max(np.std(x @ W.T), 1e-30))          # logits of standard deviation `spread`
    targets = rng.integers(0, vocab, t).astype(np.uint32)
    targets[0] = vocab - 1
    for i, r in enumerate(masked):
        targets[r] = gh.NO_TARGET if i % 2 == 0 else vocab + 5
    dx_rows = min(dx_chunk_rows(Weight("head", BY_NAME[name], vocab, cols, ()), t), vocab)
    f, g = gh.head_loss(W, x, targets, cap), gh.head_grad(W, x, targets, cap)
    b = gh.head_bounds(W, x, targets, cap, stats_rows=STATS_ROWS, chunks=-(-vocab // STATS_ROWS), dx_rows=dx_rows,
                       dx_chunks=-(-vocab // dx_rows) + 1)
    spec = {"op": "head_ce", "type": name, "rows": vocab, "cols": cols, "t": t, "cap": cap,
            "inputs": {"w": raw.tobytes(), "xn": x.tobytes(), "targets": targets.tobytes()}}

    def check(out):
        loss, nll, dx = floats(out["loss"]), floats(out["nll"]), floats(out["dxn"], (t, cols))
        if loss[1] != f["mask"].sum() or loss[2] != np.float32(1.0 / f["n"]):
            return math.inf, 1.0
        e = max(_bound_frac(loss[:1], np.float64(f["loss"]), np.float64(b["loss"])),
                _bound_frac(nll, f["nll"], b["nll"]), _bound_frac(dx, g["dxn"], b["dxn"]))
        return finite(e, np.concatenate([loss, nll, dx.ravel()])), 1.0
    return Case(f"head_ce_{name}_v{vocab}_c{cols}_t{t}" + (f"_cap{cap:g}" if cap else ""), spec, check)


def _bound_frac(got, want, bound) -> float:
    """The largest |got - want| / bound, where a bound of 0 (a row without a target) asks for an exact value."""
    err = np.abs(np.asarray(got, np.float64) - want)
    if np.any(err[bound == 0] != 0):
        return math.inf
    return float(np.max(err / np.where(bound > 0, bound, 1.0)))


# The optimizer's step (lab/ops/optimizer.py), one step from a random start at a step number past the bias
# corrections' series, against the float64 oracle (optim.py) with its tolerances: the clip scale (clip_tol), AdamW's
# m, v and p (adamw_tols: scales the same recurrence on |g|, v itself, |p| + lr U), SGD's p (sgd_tol). The clip is
# active (max_norm under the gradients' norm).
def optimizer_case(kind: str, n: int, t: int, seed: int) -> Case:
    rng = np.random.default_rng(seed)
    p, g = ref.f32(rng.standard_normal(n)), ref.f32(rng.standard_normal(n) * 0.3)
    m, v = ref.f32(rng.standard_normal(n) * 0.01), ref.f32(rng.uniform(0.0, 1e-3, n))
    lr, wd, max_norm = float(np.float32(3e-3)), 0.01, 1.0
    spec = {"op": "optimizer", "kind": kind, "n": n, "max_norm": max_norm, "weight_decay": wd,
            "inputs": {"p": p.tobytes(), "g": g.tobytes(), "m": m.tobytes(), "v": v.tobytes(),
                       "state": state_bytes(lr, t)}}

    def check(out):
        got = floats(out["p"])
        if kind == "sgd":
            want = optim.sgd_step(p, g, lr=lr)
            e = grads.bound_err(got, want, np.abs(p) + lr * np.abs(g)) / optim.sgd_tol(1)
            return finite(e, got), 1.0
        clip = optim.clip_scale(optim.grad_sumsq(g), max_norm)
        state = floats(out["state"])
        clip_err = abs(float(state[3]) - clip) / clip
        kw = dict(lr=lr, t=t, clip=clip, weight_decay=wd)
        want_p, want_m, want_v, _ = optim.adamw_step(p, g, m, v, **kw)
        _, big_m, _, big_u = optim.adamw_step(np.abs(p), np.abs(g), np.abs(m), v, **kw)
        tol = optim.adamw_tols(1, optim.clip_tol(reduction_depth(n)))
        e = _frac([(clip_err, optim.clip_tol(reduction_depth(n))),
                   (grads.bound_err(floats(out["m"]), want_m, big_m), tol["m"]),
                   (grads.bound_err(floats(out["v"]), want_v, want_v), tol["v"]),
                   (grads.bound_err(got, want_p, np.abs(p) + lr * big_u), tol["p"])])
        return finite(e, np.concatenate([got, floats(out["m"]), floats(out["v"])])), 1.0
    return Case(f"optimizer_{kind}_n{n}_t{t}", spec, check)


def make_backward_cases() -> list[Case]:
    """Every backward family on shapes that fill no workgroup evenly, positions past 0."""
    cases = [rms_norm_back_case(t=5, pos=7, n=1000, group=None, seed=100),
             rms_norm_back_case(t=3, pos=11, n=6 * 72, group=72, seed=101),
             glu_back_case("swiglu", t=5, pos=7, n=300, seed=102),
             glu_back_case("geglu", t=5, pos=7, n=300, seed=103),
             softcap_back_case("x", t=5, pos=7, n=1000, cap=3.0, seed=104),
             softcap_back_case("y", t=5, pos=7, n=1000, cap=30.0, seed=105),
             embed_back_case(rows=50, cols=200, scale=math.sqrt(640.0), seed=106)]
    cases += [dx_back_case(name, t=13, rows=131, chunk_rows=16, accumulate=i % 2 == 1, seed=107 + i)
              for i, name in enumerate(("F32", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS"))]
    cases += [lora_back_case(n_in=200, n_out=131, rank=5, t=13, s=2.0, seed=112),
              bias_back_case(width=200, stride=237, offset=5, t=37, seed=122),      # a fused row's columns
              shortconv_back_case(t=13, n=200, l_cache=3, seed=123),                # lfm2's conv, from position 0
              rope_back_case("norm", t=5, pos=7, n_head=4, head_dim=64, seed=113),
              rope_back_case("neox", t=3, pos=300, n_head=3, head_dim=80, n_rot=32, seed=114,
                             factors=np.linspace(1.0, 8.0, 16)),                  # llama-3's long-context factors
              attention_back_case(13, 7, 3, 1, 80, 0, 3.0, seed=115),             # GQA 3 over one KV head, the cap
              attention_back_case(37, 11, 6, 2, 64, 16, 5.0, seed=116),           # window, cap, GQA 3, pos > 0
              attention_back_case(70, 30, 6, 2, 64, 20, 3.0, seed=121, tiles=True),  # a GPU's tiles, any adapter
              head_ce_case("Q8_0", 1000, 96, 3, 0.0, (1,), 3.0, seed=117),
              head_ce_case("Q4_K", 1000, 256, 3, 4.0, (1,), 4.0, seed=118),
              optimizer_case("adamw", n=10_007, t=700, seed=119),
              optimizer_case("sgd", n=10_007, t=3, seed=120)]
    assert len({c.name for c in cases}) == len(cases)
    return cases
