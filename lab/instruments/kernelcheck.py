"""One kernel family, run on given input bytes through the engine's own op builders, outputs returned as bytes.

This is how a test shows that both backends run the same WGSL to the same numbers: it makes a case (an op family,
its shape, input bytes) and the expected values with numpy in CPython, runs the case here natively and inside the
browser worker (message "kernel-check"), and compares both with the expected values.

What it does not know: expected values, tolerances, numpy (it runs in Pyodide too). It makes its own buffers,
step uniform and weights, frees every one of them, and touches nothing an engine or a conversation owns (in the
browser its reads pass through the device's read-back staging buffer, which the worker clears afterwards).

A case is a dict: "op" (a key of BUILDERS), the op's parameters (below), "inputs" {name: bytes} (f32 or u32
little-endian arrays; "w" is a weight's raw GGUF bytes), and for every op "t" (tokens in the step, default 1),
"pos" (position of its first token, default 0), "n_ctx" (default 4096).
"""

from __future__ import annotations

from lab import gpu
from lab.format.ggml import BY_NAME
from lab.ops import make_step, step_bytes
from lab.ops.attention import attention, kv_write
from lab.ops.deltanet import deltanet
from lab.ops.embed import get_rows
from lab.ops.glu import glu
from lab.ops.matmul import i8_scratch_bytes, matmul, matmul_i8, matvec
from lab.ops.norm import rms_norm
from lab.ops.rope import rope
from lab.ops.rows import Rows
from lab.ops.sample import argmax, top_k
from lab.ops.shortconv import shortconv
from lab.ops.softmax import softmax
from lab.ops.weights import alloc_weight, upload_weight


class _Case:
    """The buffers of one case: inputs uploaded on first use, outputs (zero-filled) recorded for read-back."""

    def __init__(self, device: gpu.Device, case: dict) -> None:
        self.device, self.case = device, case
        self.inputs: dict[str, gpu.Buffer] = {}
        self.outputs: dict[str, tuple[gpu.Buffer, int]] = {}   # name -> (buffer, bytes to read)

    def __getitem__(self, key):
        return self.case[key]

    def input(self, name: str) -> gpu.Buffer:
        if name not in self.inputs:
            data = self.case["inputs"][name]
            self.inputs[name] = buf = self.device.buffer(len(data), gpu.CONVERSATION, f"check.{name}")
            self.device.write(buf, data)
        return self.inputs[name]

    def output(self, name: str, nbytes: int) -> gpu.Buffer:
        buf = self.device.buffer(nbytes, gpu.CONVERSATION, f"check.{name}")
        self.outputs[name] = (buf, nbytes)
        return buf

    def read_back(self, name: str, nbytes: int) -> None:
        """An in-place op's result is its input buffer."""
        self.outputs[name] = (self.inputs[name], nbytes)

    def weight(self):
        """Parameters type, rows, cols; input "w": rows * row_bytes of GGUF blocks."""
        w = alloc_weight(self.device, "check.w", BY_NAME[self["type"]], self["rows"], self["cols"])
        upload_weight(self.device, w, self.case["inputs"]["w"])
        return w


# -- one builder per family: (device, kernels, step, case) -> ops; each names its outputs ----------------------------

def _matvec(dev, kernels, step, c: _Case):
    """w, x [cols] -> y [rows] (decode projection)."""
    return matvec(dev, kernels, c.weight(), c.input("x"), c.output("y", 4 * c["rows"]))


def _matmul(dev, kernels, step, c: _Case):
    """w, x [t, cols] -> y [t, rows] (prefill projection)."""
    return matmul(dev, kernels, c.weight(), c.input("x"), c.output("y", 4 * c["t"] * c["rows"]), step,
                  max_tokens=c["t"])


def _matmul_i8(dev, kernels, step, c: _Case):
    """w, x [t, cols] -> y [t, rows] on the tensor cores, the input quantized to 8 bits (int8_matrix adapters);
    also returns the quantized input: xq [t, cols] int8, xd [t, cols / 32] (d, d * sum q)."""
    t, cols = c["t"], c["cols"]
    q_bytes, d_bytes = i8_scratch_bytes(t, cols)
    xq, xd = c.output("xq", q_bytes), c.output("xd", d_bytes)
    c.outputs["xq"], c.outputs["xd"] = (xq, t * cols), (xd, t * (cols // 32) * 8)
    return matmul_i8(dev, kernels, c.weight(), c.input("x"), c.output("y", 4 * t * c["rows"]), step, xq, xd,
                     max_tokens=t, tile_rows=c.case.get("tile_rows"))


def _get_rows(dev, kernels, step, c: _Case):
    """w, ids [t] u32 -> out [t, cols] = scale * W[ids]."""
    return get_rows(dev, kernels, c.weight(), c.input("ids"), c.output("out", 4 * c["t"] * c["cols"]), step,
                    scale=c.case.get("scale", 1.0))


def _rms_norm(dev, kernels, step, c: _Case):
    """x [t, n], w [group] -> y [t, n]."""
    return rms_norm(dev, kernels, c.input("x"), c.input("w"), c.output("y", 4 * c["t"] * c["n"]), step, c["n"],
                    c["eps"], group=c.case.get("group"))


def _rope(dev, kernels, step, c: _Case):
    """x [t, n_head * head_dim] rotated in place at positions pos .. pos + t - 1."""
    ops = rope(dev, kernels, c.input("x"), step, c["n_head"], c["head_dim"], c.case.get("n_rot"),
               c["base"], c.case.get("freq_scale", 1.0), c["mode"])
    c.read_back("x", 4 * c["t"] * c["n_head"] * c["head_dim"])
    return ops


def _attention(dev, kernels, step, c: _Case):
    """src [t, (n_head + 2 n_kv) * hd] (fused Q|K|V rows), k_cache and v_cache [n_ctx, n_kv * hd]: the step's K/V
    rows are written into the caches, then out [t, n_head * hd] = attention over keys 0 .. pos + t - 1.
    With "rope" (a mode, base 10000): the Q and K heads are first rotated and the caches written by the plans' own
    op (rope with the cache write), as the engine runs a layer."""
    nh, nkv, hd, n_ctx = c["n_head"], c["n_kv_head"], c["head_dim"], c["n_ctx"]
    width = (nh + 2 * nkv) * hd
    src = c.input("src")
    kc, vc = c.input("k_cache"), c.input("v_cache")
    if c.case.get("rope"):
        ops = rope(dev, kernels, src, step, nh + nkv, hd, mode=c["rope"], row_stride=width, cache=(kc, vc, nh, n_ctx))
    else:
        ops = kv_write(dev, kernels, src, kc, vc, step, n_kv_head=nkv, head_dim=hd, src_stride=width,
                       k_offset=nh * hd, v_offset=(nh + nkv) * hd, n_ctx=n_ctx)
    return ops + attention(dev, kernels, src, kc, vc, c.output("out", 4 * c["t"] * nh * hd), step, n_head=nh,
                           n_kv_head=nkv, head_dim=hd, q_stride=width, q_offset=0, n_ctx=n_ctx,
                           window=c.case.get("window", 0), mode=c.case.get("mode", "auto"), max_tokens=c["t"])


def _softmax(dev, kernels, step, c: _Case):
    """x [t, n] -> y [t, n] = softmax(scale * x) per row."""
    return softmax(dev, kernels, c.input("x"), c.output("y", 4 * c["t"] * c["n"]), step, c["n"],
                   scale=c.case.get("scale", 1.0))


def _glu(dev, kernels, step, c: _Case):
    """gate, up [t, n] -> out [t, n] = act(gate) * up."""
    return glu(dev, kernels, c.input("gate"), c.input("up"), c.output("out", 4 * c["t"] * c["n"]), step, c["n"],
               c["act"])


def _argmax(dev, kernels, step, c: _Case):
    """x [rows, n] -> out [rows] u32."""
    return argmax(dev, kernels, c.input("x"), c.output("out", 4 * c["rows"]), step, c["n"], rows=Rows.fixed(c["rows"]))


def _top_k(dev, kernels, step, c: _Case):
    """x [rows, n] -> out [rows, k] (index u32, value f32) pairs."""
    return top_k(dev, kernels, c.input("x"), c.output("out", 8 * c["rows"] * c["k"]), step, c["n"], c["k"],
                 rows=Rows.fixed(c["rows"]))


def _shortconv(dev, kernels, step, c: _Case):
    """src [t, stride], w [n, l_cache], state [ring, n] -> y [t, n] = the conv in the case's mode ("gated" or "silu"),
    and the state ring rewritten in place (read back as "state")."""
    n, ring = c["n"], c["ring"]
    ops = shortconv(dev, kernels, c.input("src"), c.input("w"), c.input("state"), c.output("y", 4 * c["t"] * n), step,
                    n=n, l_cache=c["l_cache"], ring=ring, mode=c.case.get("mode", "gated"), stride=c.case.get("stride"))
    c.read_back("state", 4 * ring * n)
    return ops


def _deltanet(dev, kernels, step, c: _Case):
    """proj [t, proj_stride], conv [t, 2K + n_v S], dt_bias and ssm_a [n_v], norm_w [S], state [n_v, S, S] ->
    out [t, n_v S], and the state rewritten in place (read back as "state")."""
    nv, S = c["n_v_heads"], c["head_dim"]
    ops = deltanet(dev, kernels, c.input("proj"), c.input("conv"), c.input("dt_bias"), c.input("ssm_a"),
                   c.input("norm_w"), c.input("state"), c.output("out", 4 * c["t"] * nv * S), step,
                   n_k_heads=c["n_k_heads"], n_v_heads=nv, head_dim=S, proj_stride=c["proj_stride"],
                   z_offset=c["z_offset"], beta_offset=c["beta_offset"], alpha_offset=c["alpha_offset"], eps=c["eps"])
    c.read_back("state", 4 * nv * S * S)
    return ops


BUILDERS = {"matvec": _matvec, "matmul": _matmul, "matmul_i8": _matmul_i8, "get_rows": _get_rows,
            "rms_norm": _rms_norm, "rope": _rope, "attention": _attention, "softmax": _softmax, "glu": _glu,
            "argmax": _argmax, "top_k": _top_k, "shortconv": _shortconv, "deltanet": _deltanet}


async def run(device: gpu.Device, kernels, case: dict) -> dict:
    """Build the case's ops, write its inputs, run one step, read the outputs back.
    Returns {"outputs": {name: bytes}, "kernels": [pipeline labels]} (labels name the variant, SG path included)."""
    if case["op"] not in BUILDERS:
        raise ValueError(f"kernel check: unknown op {case['op']!r} ({', '.join(BUILDERS)})")
    t, pos, n_ctx = int(case.get("t", 1)), int(case.get("pos", 0)), int(case.get("n_ctx", 4096))
    owner = object()     # this case's buffers; the read-back staging buffer (browser) is the device's own: kept
    try:
        with device.owning(owner):
            c = _Case(device, case)
            step = make_step(device, "check.step")
            ops = BUILDERS[case["op"]](device, kernels, step, c)
        await device.flush_errors()          # a shader that does not compile is named here, not read as zeros
        device.run([op.at(t) for op in ops], writes=[(step, 0, step_bytes(pos, t, n_ctx))])
        outputs = {name: await device.read(buf, 0, n) for name, (buf, n) in c.outputs.items()}
        await device.flush_errors()
        return {"outputs": outputs, "kernels": sorted({op.kernel.label for op in ops})}
    finally:
        device.free(owner)
