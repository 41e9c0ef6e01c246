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

The backward families (issue #43) take their gradients' earlier values as inputs where the op adds into them (dw,
dE, dA, dB, an accumulated dx) and read those buffers back; their scratch (RMSNorm's 1 / rms, dx_back's partial sums,
attention's row statistics, the fused head's slabs) is made here and freed with the rest, never read back.
"""

from __future__ import annotations

from lab import gpu
from lab.format.ggml import BY_NAME
from lab.ops import WeightPart, make_step, optimizer, step_bytes
from lab.ops.attention import attention, kv_write
from lab.ops.backward import embed_back, glu_back, rms_norm_back, softcap_back
from lab.ops.backward_attention import attention_back, stats_bytes
from lab.ops.backward_head import head_back, head_ce, head_loss
from lab.ops.backward_matmul import bias_back, dx_back, dx_scratch_floats, lora_back
from lab.ops.backward_rope import rope_back
from lab.ops.backward_shortconv import shortconv_back
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

    def scratch(self, nbytes: int, name: str = "scratch") -> gpu.Buffer:
        """A buffer the op needs but the case does not check (freed with the case's others)."""
        return self.device.buffer(nbytes, gpu.CONVERSATION, f"check.{name}")

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


# -- the backward families (lab/ops/backward*.py): gradients added into are inputs read back --------------------------

def _rms_norm_back(dev, kernels, step, c: _Case):
    """x, dy [t, n], w [group], dw [group] (its earlier value) -> dx [t, n], dw += the step's sum."""
    t, n = c["t"], c["n"]
    group = c.case.get("group") or n
    ops = rms_norm_back(dev, kernels, c.input("x"), c.input("w"), c.input("dy"), c.output("dx", 4 * t * n),
                        c.input("dw"), c.scratch(4 * t * (n // group), "rs"), step, n, c["eps"], group=group)
    c.read_back("dw", 4 * group)
    return ops


def _glu_back(dev, kernels, step, c: _Case):
    """gu [t, 2n] = [gate | up], dh [t, n] -> dgu [t, 2n] = [d gate | d up]."""
    return glu_back(dev, kernels, c.input("gu"), c.input("dh"), c.output("dgu", 8 * c["t"] * c["n"]), step, c["n"],
                    c["act"])


def _softcap_back(dev, kernels, step, c: _Case):
    """grad [t, n] *= 1 - tanh(x / cap)^2 in place, from saved [t, n] = the forward's x or y (saved_is)."""
    ops = softcap_back(dev, kernels, c.input("grad"), c.input("saved"), step, c["n"], c["cap"],
                       saved_is=c.case.get("saved_is", "x"))
    c.read_back("grad", 4 * c["t"] * c["n"])
    return ops


def _embed_back(dev, kernels, step, c: _Case):
    """table [rows, cols] (dE's earlier value), ids [t] u32, dx [t, cols] -> table[ids] += scale * dx, in place."""
    table = WeightPart(c.input("table"), 0, c["rows"])
    ops = embed_back(dev, kernels, [table], c["cols"], c.input("ids"), c.input("dx"), step,
                     scale=c.case.get("scale", 1.0))
    c.read_back("table", 4 * c["rows"] * c["cols"])
    return ops


def _dx_back(dev, kernels, step, c: _Case):
    """w [rows, cols] of any type, dy [t, rows] -> dx [t, cols] = dy W (written; with "accumulate", input dx added
    into), over chunks of chunk_rows rows (default: dx_back's own)."""
    t, w, acc, rows = c["t"], c.weight(), bool(c.case.get("accumulate")), c.case.get("chunk_rows")
    dx = c.input("dx") if acc else c.output("dx", 4 * t * c["cols"])
    sums = c.scratch(4 * dx_scratch_floats(w, t, rows), "sums")
    ops = dx_back(dev, kernels, w, c.input("dy"), dx, sums, step, max_tokens=t, accumulate=acc, chunk_rows=rows)
    if acc:
        c.read_back("dx", 4 * t * c["cols"])
    return ops


def _lora_back(dev, kernels, step, c: _Case):
    """a [rank, n_in], b [n_out, rank], their gradients da, db, x [t, n_in], dy [t, n_out], dx [t, n_in] (earlier
    values: all three are added into, and read back)."""
    t, n_in, n_out, r = c["t"], c["n_in"], c["n_out"], c["rank"]
    ops = lora_back(dev, kernels, (c.input("a"), c.input("b")), (c.input("da"), c.input("db")),
                    (c.scratch(4 * t * r, "u"), c.scratch(4 * t * r, "du")), c.input("x"), c.input("dy"),
                    c.input("dx"), step, n_in=n_in, n_out=n_out, rank=r, scale=c["scale"], max_tokens=t)
    for name, floats in (("da", r * n_in), ("db", n_out * r), ("dx", t * n_in)):
        c.read_back(name, 4 * floats)
    return ops


def _bias_back(dev, kernels, step, c: _Case):
    """db [width] (an earlier value, added into and read back), dy [t, stride] with the columns from `offset`, one
    [1] = 1.0 -> db += the columns' sums over the t rows."""
    ops = bias_back(dev, kernels, c.input("db"), c.input("one"), c.input("dy"), step, width=c["width"],
                    max_tokens=c["t"], dy_offset=c["offset"], dy_stride=c["stride"])
    c.read_back("db", 4 * c["width"])
    return ops


def _shortconv_back(dev, kernels, step, c: _Case):
    """bcx [t, 3n] (in_proj's rows [B | C | x]), w [n, l_cache], dy [t, n], dw [n, l_cache] (an earlier value, added
    into and read back) -> dbcx [t, 3n] = [dB | dC | dx], dw += the window's sum (a window from position 0)."""
    t, n, lc = c["t"], c["n"], c["l_cache"]
    ops = shortconv_back(dev, kernels, c.input("bcx"), c.input("w"), c.input("dy"), c.output("dbcx", 12 * t * n),
                         c.input("dw"), step, n=n, l_cache=lc, max_tokens=t)
    c.read_back("dw", 4 * n * lc)
    return ops


def _rope_back(dev, kernels, step, c: _Case):
    """grad [t, n_head * head_dim] (dy of the rotated rows) turned into dx in place; "factors": the frequency
    factors (n_rot / 2 floats) or none."""
    ops = rope_back(dev, kernels, c.input("grad"), step, c["n_head"], c["head_dim"], c.case.get("n_rot"), c["base"],
                    c.case.get("freq_scale", 1.0), c["mode"], freq_factors=c.case.get("factors"))
    c.read_back("grad", 4 * c["t"] * c["n_head"] * c["head_dim"])
    return ops


def _attention_back(dev, kernels, step, c: _Case):
    """q, o, do [t, n_head * hd], k, v [n_ctx, n_kv * hd] -> dq [t, n_head * hd], dk, dv [n_ctx, n_kv * hd] (rows
    past pos + t come back 0) for queries at pos .. pos + t - 1 over keys 0 .. pos + t - 1."""
    t, nh, nkv, hd, n_ctx = c["t"], c["n_head"], c["n_kv_head"], c["head_dim"], c["n_ctx"]
    q, k, v, o, do = (c.input(name) for name in ("q", "k", "v", "o", "do"))
    dq, dk, dv = c.output("dq", 4 * t * nh * hd), c.output("dk", 4 * n_ctx * nkv * hd), \
        c.output("dv", 4 * n_ctx * nkv * hd)
    return attention_back(dev, kernels, q, k, v, o, do, dq, dk, dv, c.scratch(stats_bytes(t, nh), "stats"), step,
                          n_head=nh, n_kv_head=nkv, head_dim=hd, n_ctx=n_ctx, max_tokens=t,
                          window=c.case.get("window", 0), softcap=c.case.get("softcap", 0.0),
                          tiles=c.case.get("tiles"))


def _head_ce(dev, kernels, step, c: _Case):
    """w [rows = n_vocab, cols] of any type, xn [t, cols], targets [t] u32 (>= rows: no target) -> loss (mean,
    count, 1 / N, sum), nll [t] and dxn [t, cols]: head_loss then head_back, one slab, with the final soft-cap
    "cap" (0: none). The HeadCE scratch is the case's (freed with it)."""
    t = c["t"]
    ce = head_ce(dev, c.weight(), t, cap=c.case.get("cap", 0.0))
    xn, targets = c.input("xn"), c.input("targets")
    ops = head_loss(dev, kernels, ce, xn, targets, step)
    ops += head_back(dev, kernels, ce, xn, targets, c.output("dxn", 4 * t * c["cols"]), step)
    c.outputs["loss"], c.outputs["nll"] = (ce.loss, 16), (ce.nll, 4 * t)
    return ops


def _optimizer(dev, kernels, step, c: _Case):
    """p, g, m, v [n], state (lr, t, sumsq, clip) -> one step of "kind": AdamW after the gradients' norm and clip
    (max_norm), or SGD; p, m, v and the state are read back."""
    n, p, g, state = c["n"], c.input("p"), c.input("g"), c.input("state")
    if c["kind"] == "sgd":
        ops = optimizer.sgd(dev, kernels, p, g, state, n)
    else:
        scratch = c.scratch(4 * optimizer.grad_norm_scratch_floats(n), "norm partials")
        ops = optimizer.grad_norm(dev, kernels, g, n, state, scratch, max_norm=c["max_norm"])
        ops += optimizer.adamw(dev, kernels, p, g, c.input("m"), c.input("v"), state, n,
                               weight_decay=c["weight_decay"])
        for name in ("m", "v"):
            c.read_back(name, 4 * n)
        c.read_back("state", 16)
    c.read_back("p", 4 * n)
    return ops


BUILDERS = {"matvec": _matvec, "matmul": _matmul, "matmul_i8": _matmul_i8, "get_rows": _get_rows,
            "rms_norm": _rms_norm, "rope": _rope, "attention": _attention, "softmax": _softmax, "glu": _glu,
            "argmax": _argmax, "top_k": _top_k, "shortconv": _shortconv, "deltanet": _deltanet,
            "rms_norm_back": _rms_norm_back, "glu_back": _glu_back, "softcap_back": _softcap_back,
            "embed_back": _embed_back, "dx_back": _dx_back, "lora_back": _lora_back, "bias_back": _bias_back,
            "shortconv_back": _shortconv_back, "rope_back": _rope_back,
            "attention_back": _attention_back, "head_ce": _head_ce, "optimizer": _optimizer}


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
