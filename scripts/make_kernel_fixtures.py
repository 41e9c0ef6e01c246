"""Generate the verification card's kernel fixtures (reference/kernels.json). NOT part of CI.

    .venv/bin/python scripts/make_kernel_fixtures.py

The cases are lab/host/reference/kernel_cases.py's, the ones tests/browser/test_kernels_in_worker.py runs in the worker (same
builders, same seeds, same inputs); their expected outputs come from the float64 references in lab/host/reference
(kernels.py, quant.py, attention.py) and are written with a per-element scale, so that the worker can compare in pure
Python (lab.instruments.verify.kernel_error): error = max |got - want| / scale over the output, held to the case's
tolerance; a scale of 0 means the element must come back bit-identical (selections, the dims RoPE leaves alone).
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.host.reference.kernel_cases import attention_expected, deltanet_expected, make_cases, shortconv_expected
from lab.host.reference import kernels as ref
from lab.host.reference import quant as qo
from lab.host.reference.ops import argmax

OUT = ROOT / "reference" / "kernels.json"

# The trap each family (or type) guards, one line each, as the card shows them.
QUANT_TRAP = {
    "Q4_1": "Q4_1: the per-block minimum added, low nibbles before high ones",
    "Q8_0": "Q8_0: quants read as signed bytes, not unsigned",
    "Q4_K": "Q4_K: 6-bit scales and mins unpacked in the right order from the 12-byte table",
    "Q6_K": "Q6_K: the scale index per 16 values and the 2 high bits from qh",
    "Q5_0": "Q5_0: the fifth bit from qh and the nibble order",
    "Q5_1": "Q5_1: the fifth bit from qh joined as 16, the per-block minimum added",
    "Q5_K": "Q5_K: the fifth bit of sub-block pair j from qh bits 2j and 2j + 1, joined as 16 before the scale",
    "F32": "F32 rows: plain floats through the same reduction (tiling, rows not a multiple of 4)",
    "Q2_K": "Q2_K: 4-bit scale and min per 16 values, 2-bit quants in the right shift order",
    "Q3_K": "Q3_K: the high bit from hmask (set means no -4) and the 6-bit scales' split layout",
    "IQ4_NL": "IQ4_NL: nibbles index the non-linear table, not a linear grid",
    "IQ4_XS": "IQ4_XS: 6-bit sub-block scales (low 4 + high 2 bits) minus 32, the non-linear table",
    "TQ2_0": "TQ2_0: 2-bit fields minus 1 (ternary -1, 0, 1), in Q2_K's shift order",
    "TQ1_0": "TQ1_0: five base-3 digits a byte, most significant first (ggml's multiply-by-3), then qh's four",
    "MXFP4": "MXFP4: 4-bit codes through the E2M1 level table, the E8M0 block scale a power of two",
    "NVFP4": "NVFP4: E2M1 values, a UE4M3 scale per 16 values, the sub-block order",
    "IQ2_XXS": "IQ2_XXS: byte l of a0 picks the grid point, 7-bit sign indices with their parity bit, the top nibble "
               "scale",
    "IQ3_XXS": "IQ3_XXS: two 4-value points a group, in index-byte order; the scale word per 32 values, halved once",
    "IQ2_XS": "IQ2_XS: 9-bit grid index and 7-bit sign index of each u16, a scale nibble per 16 values",
    "IQ2_S": "IQ2_S: grid index bits 8-9 from qh, whole sign bytes (no parity rule), a scale nibble per 16 values",
    "IQ3_S": "IQ3_S: each point's ninth index bit from qh, whole sign bytes, the scale d * (1 + 2 nibble)",
    "IQ1_S": "IQ1_S: 11-bit grid index of -1/0/1 points, the 3-bit scale and the delta's sign from qh",
    "IQ1_M": "IQ1_M: d from four scale nibbles, a 3-bit scale per 16 values, the delta's sign per 8 values",
    "Q1_0": "Q1_0: bit j of the block, least significant first, gives +d (set) or -d",
    "Q2_0": "Q2_0: 2-bit fields in element order minus 1 (-1, 0, 1, 2)",
}
TRAP = {
    "matmul": "prefill tiles: rows (77) and tokens (21) not multiples of the 32-wide tile",
    "get_rows": "embedding lookup: repeated and shuffled ids, dequantized rows, Gemma's sqrt(width) scale",
    "rms_norm": "epsilon inside the square root (a row below eps), large rows, per-head groups (q/k norm)",
    "rope": "the pairing (adjacent, llama-style, vs halves, NeoX-style), positions past 0, partial rotation",
    "attention": "GQA head mapping h / group, the causal mask at the step's own position, the sliding window",
    "softmax": "max subtraction: logits of 100..1000 overflow exp without it",
    "glu": "gate and up not swapped; SiLU vs tanh-GELU",
    "argmax": "ties go to the lowest index, as llama.cpp's greedy sampling",
    "top_k": "ties ordered by index, each element chosen once",
    "shortconv": "Qwen3.5's conv (silu mode): the state ring's rows before pos, src rows at their stride, silu after",
    "deltanet": "the delta rule: decay exp(g), g < 0; beta a sigmoid; q, k L2-normed per head; value head h on key "
                "head h % n_k; the gate after the norm",
}


def f32b(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a, np.float32).tobytes()).decode()


def expected(spec: dict) -> tuple[str, str, np.ndarray, np.ndarray, float, str]:
    """(output name, dtype, want, per-element scale, tolerance, tolerance reason) for one case, from the oracles."""
    op, inp = spec["op"], spec["inputs"]
    t = spec.get("t", 1)
    if op in ("matvec", "matmul"):
        raw = np.frombuffer(inp["w"], np.uint8).reshape(spec["rows"], -1)
        W = qo.dequant(raw, spec["type"]).astype(np.float64)
        X = np.frombuffer(inp["x"], np.float32).reshape(t if op == "matmul" else 1, -1).astype(np.float64)
        return ("y", "f32", X @ W.T, np.abs(X) @ np.abs(W).T, qo.DOT_TOL,
                "of each output's sum |W||x|: f32 accumulation of cols terms")
    if op == "get_rows":
        raw = np.frombuffer(inp["w"], np.uint8).reshape(spec["rows"], -1)
        ids = np.frombuffer(inp["ids"], np.uint32)
        want = spec.get("scale", 1.0) * qo.dequant(raw, spec["type"])[ids].astype(np.float64)
        return ("out", "f32", want, np.full(want.shape, np.abs(want).max()), qo.DEQUANT_TOL,
                "of the largest value: one or two f32 operations on an f16 scale")
    if op == "rms_norm":
        n, g = spec["n"], spec.get("group") or spec["n"]
        x = np.frombuffer(inp["x"], np.float32).reshape(t, n)
        want = ref.rms_norm_ref(x, np.frombuffer(inp["w"], np.float32), spec["eps"], g).reshape(t, -1, g)
        scale = np.broadcast_to(np.abs(want).max(axis=2, keepdims=True), want.shape)
        return "y", "f32", want, scale, ref.NORM_TOL, "of each group's magnitude: f32 sum of squares and rsqrt"
    if op == "rope":
        nh, hd = spec["n_head"], spec["head_dim"]
        nr = spec.get("n_rot") or hd
        x = np.frombuffer(inp["x"], np.float32).reshape(t, nh * hd)
        want = ref.rope_ref(x, spec["pos"], nh, hd, nr, spec["base"], spec.get("freq_scale", 1.0),
                            spec["mode"]).reshape(t, nh, hd)
        scale = np.broadcast_to(np.abs(want[:, :, :nr]).max(axis=2, keepdims=True), want.shape).copy()
        scale[:, :, nr:] = 0.0                        # dims past n_rot come back bit-identical
        want[:, :, nr:] = x.reshape(t, nh, hd)[:, :, nr:]
        tol = ref.rope_tol((spec["pos"] + t) * spec.get("freq_scale", 1.0))
        return "x", "f32", want, scale, tol, "of each head's magnitude: f32 angle pos x freq, sin/cos (+ 1.5e-7 per radian)"
    if op == "attention":
        want, vmax, tol = attention_expected(spec)
        why = "of max |V|: scores rounded relative to their L1 size, 8 eps (L1 + 16)"
        if spec.get("rope"):
            why += ", plus 2 rope_tol of |q| |k| (the rotated q and k)"
        return "out", "f32", want, np.full(want.shape, vmax), tol, why
    if op == "softmax":
        x = np.frombuffer(inp["x"], np.float32).reshape(t, spec["n"])
        s = spec.get("scale", 1.0)
        want = ref.softmax_ref(x, s)
        scale = np.broadcast_to(np.abs(want).max(axis=1, keepdims=True), want.shape)
        return ("y", "f32", want, scale, ref.softmax_tol(float(np.max(np.abs(x * s)))),
                "of each row's largest probability: 3e-6 + 2e-7 max |s x| (rounding through exp)")
    if op == "glu":
        g = np.frombuffer(inp["gate"], np.float32).reshape(t, spec["n"])
        u = np.frombuffer(inp["up"], np.float32).reshape(t, spec["n"])
        want = ref.glu_ref(g, u, spec["act"])
        return ("out", "f32", want, np.full(want.shape, np.abs(want).max()), ref.GLU_TOL,
                "of the largest value: exp / tanh within a few ulp")
    if op == "argmax":
        x = np.frombuffer(inp["x"], np.float32).reshape(spec["rows"], spec["n"])
        want = np.array([argmax(r) for r in x], np.uint32)
        return "out", "u32", want, np.zeros(want.shape), 0.0, "exact: a selection"
    if op == "top_k":
        x = np.frombuffer(inp["x"], np.float32).reshape(spec["rows"], spec["n"])
        pairs = [p for r in x for p in ref.topk_ref(r, spec["k"])]
        want = np.array([[i, np.float32(v).view(np.uint32)] for i, v in pairs], np.uint32)
        return "out", "u32", want, np.zeros(want.shape), 0.0, "exact: a selection (ids and values)"
    if op == "shortconv":
        want, _, tol = shortconv_expected(spec)
        return ("y", "f32", want, np.full(want.shape, np.abs(want).max()), tol,
                "of the largest |y|: l_cache products in tap order, then silu's exp")
    if op == "deltanet":
        want, _, tol = deltanet_expected(spec)
        return ("out", "f32", want, np.full(want.shape, np.abs(want).max()), tol,
                "of the largest |out|: f32 sums of S terms a token, carried by the state; the head's rms norm, silu")
    raise ValueError(op)


def main() -> None:
    cases = []
    for c in make_cases():
        spec = {k: v for k, v in c.spec.items() if v is not None}
        out, dtype, want, scale, tol, why = expected(spec)
        if dtype == "u32":
            want_b64 = base64.b64encode(np.ascontiguousarray(want, np.uint32).tobytes()).decode()
        else:
            want_b64 = f32b(want)
        trap = QUANT_TRAP[spec["type"]] if spec["op"] == "matvec" else TRAP[spec["op"]]
        if spec["op"] in ("matmul", "get_rows"):
            trap = f"{spec['type']}: {trap}"
        cases.append({"name": c.name, "trap": trap, "tolerance": tol, "tolerance_why": why, "output": out,
                      "dtype": dtype, "want": want_b64, "scale": f32b(scale),
                      "spec": {**{k: v for k, v in spec.items() if k != "inputs"},
                               "inputs": {k: base64.b64encode(v).decode() for k, v in spec["inputs"].items()}}})
        # the oracle's own values pass their own check, as stored (f32 rounding of want is far below every tolerance)
        w = np.frombuffer(base64.b64decode(want_b64), np.float32 if dtype == "f32" else np.uint32)
        assert w.size == np.asarray(want).size, c.name
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"generator": "scripts/make_kernel_fixtures.py", "cases": cases}) + "\n")
    print(f"{OUT}: {len(cases)} cases, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
