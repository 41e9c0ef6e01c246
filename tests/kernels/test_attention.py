"""wgsl/attention.wgsl and wgsl/kv.wgsl against a float64 numpy oracle (attention_oracle.py), on the native device.

Every case writes the step's K/V rows from a fused QKV buffer with kv_write, then runs attention over a cache whose
other rows (earlier positions, and the stale rows after the step) hold random values, all in one compute pass.

Tolerance. The output is a convex combination of V rows, so errors are measured against max|V|. An f32 score
s = scale * sum_i q_i k_i is rounded relative to the partial sums, which the L1 size L1 = scale * sum_i |q_i k_i|
bounds: its error is a few eps32 * L1 (the strict worst case, hd * eps32 * L1, is never approached by random signs
and vec4 partial sums). An absolute score error d becomes a relative error d in each probability (softmax has
unit Lipschitz constant in the max norm), hence at most d * max|V| in the output; exp, the online rescaling and
the sum over keys add a few eps32 more. So
    max|out - ref| <= 8 * eps32 * (max L1 + 16) * max|V|
i.e. ~2e-5 * max|V| for ordinary scores (L1 ~ 8) and ~3e-4 * max|V| when scores sit near 250 (L1 ~ 280); the
probabilities get the same bound without max|V|. Measured: 2e-8 .. 1e-7 (ordinary), 1e-5 (scores ~250). Broken
kernels miss by 1.7e-2 .. 1 of max|V| or give NaN/inf: 700x or more outside the bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab import gpu
from lab.gpu import shaders
from lab.gpu.shaders import KernelCache
from lab.host.reference import attention as oracle
from lab.ops import attention as A
from lab.ops import make_step, step_bytes

EPS32 = float(np.finfo(np.float32).eps)


class BrokenKernels(KernelCache):
    """A kernel cache whose attention source has text substitutions applied (each must match exactly)."""

    def __init__(self, device, subs):
        super().__init__(device)
        self.subs = subs

    def get(self, name, entry="main", **consts):
        text = shaders.source(name, **consts)
        if name == "attention":
            for old, new in self.subs:
                assert text.count(old) == 1, f"substitution target {old!r} not found exactly once"
                text = text.replace(old, new)
        return self.device.kernel(text, f"broken {name}:{entry}", entry)


def run_case(device, kernels, *, n_head, n_kv, hd, pos, t, n_ctx=48, mode="auto", window=0, softcap=0.0,
             scale=None, probe=False, big=0.0, seed=0, chunk=None, narrow=False, rows=None, kv="f32"):
    """Run kv_write + attention once; return the GPU results with the oracle's. kv="f16": the caches hold f16
    (tests/kernels/test_kv_f16.py), and the oracle's caches are its f64 ones rounded to f16, as a store rounds."""
    rng = np.random.default_rng(seed)
    width = (n_head + 2 * n_kv) * hd
    k_off, v_off = n_head * hd, (n_head + n_kv) * hd
    kvd = n_kv * hd
    sc = 1.0 / math.sqrt(hd) if scale is None else scale
    src = rng.standard_normal((t, width))
    kc0 = rng.standard_normal((n_ctx, kvd))
    vc0 = rng.standard_normal((n_ctx, kvd))
    if big:
        # Q and K share a direction u, so scale * q.k ~ big (+- a few): large but informative scores.
        u = rng.standard_normal(hd)
        u /= np.linalg.norm(u)
        a = math.sqrt(big / sc)
        for h in range(n_head):
            src[:, h * hd:(h + 1) * hd] += a * u
        for g in range(n_kv):
            src[:, k_off + g * hd:k_off + (g + 1) * hd] += a * u
            kc0[:, g * hd:(g + 1) * hd] += a * u
    src, kc0, vc0 = (x.astype(np.float32) for x in (src, kc0, vc0))
    store = np.float16 if kv == "f16" else np.float32     # the caches' element type, as the GPU holds them
    kc0, vc0 = kc0.astype(store), vc0.astype(store)

    before = set(map(id, device.buffers))
    conv = gpu.CONVERSATION
    b_src = device.buffer(src.nbytes, conv, "t.src")
    b_k = device.buffer(kc0.nbytes, conv, "t.k")
    b_v = device.buffer(vc0.nbytes, conv, "t.v")
    b_out = device.buffer(4 * t * n_head * hd, conv, "t.out")
    assert b_k.size == A.kv_cache_bytes(n_ctx, n_kv, hd, kv)
    step = make_step(device, "t.step")
    b_probe = device.buffer(A.probe_bytes(t, n_head, n_ctx), conv, "t.probe") if probe else None
    try:
        device.write(b_src, src.tobytes())
        device.write(b_k, kc0.tobytes())
        device.write(b_v, vc0.tobytes())
        device.write(b_out, np.full(t * n_head * hd, np.nan, np.float32).tobytes())
        if probe:
            device.write(b_probe, np.full(t * n_head * n_ctx, np.nan, np.float32).tobytes())
        ops = A.kv_write(device, kernels, b_src, b_k, b_v, step, n_kv_head=n_kv, head_dim=hd, src_stride=width,
                         k_offset=k_off, v_offset=v_off, n_ctx=n_ctx, kv=kv)
        ops += A.attention(device, kernels, b_src, b_k, b_v, b_out, step, n_head=n_head, n_kv_head=n_kv,
                           head_dim=hd, q_stride=width, q_offset=0, n_ctx=n_ctx, scale=scale, window=window,
                           softcap=softcap, probe=b_probe, mode=mode,
                           max_tokens=t, chunk=chunk, narrow=narrow, rows=rows, kv=kv)
        device.run([op.at(t) for op in ops], writes=[(step, 0, step_bytes(pos, t, n_ctx))])
        got = np.frombuffer(device.read_sync(b_out), np.float32).reshape(t, n_head * hd)
        got_k = np.frombuffer(device.read_sync(b_k), store).reshape(n_ctx, kvd)
        got_v = np.frombuffer(device.read_sync(b_v), store).reshape(n_ctx, kvd)
        got_p = (np.frombuffer(device.read_sync(b_probe), np.float32).reshape(t, n_head, n_ctx)
                 if probe else None)
    finally:
        for buf in [b for b in device.buffers if id(b) not in before]:
            device.destroy(buf)

    kc, vc = oracle.kv_write(kc0, vc0, src, pos, n_kv_head=n_kv, head_dim=hd, k_offset=k_off, v_offset=v_off)
    if kv == "f16":
        # A store rounds to one of the two nearest f16 values (WGSL leaves which to the adapter): each cached value
        # within one f16 step of the f32 one, then the oracle attends over what the cache holds.
        for got_c, want in ((got_k, kc), (got_v, vc)):
            step16 = np.spacing(np.abs(want.astype(np.float16))).astype(np.float64)
            bad = np.abs(got_c.astype(np.float64) - want.astype(np.float64)) > step16
            assert not bad.any(), f"f16 cache write: {int(bad.sum())} values off by more than one f16 step"
        kc, vc = got_k, got_v
    ref, probs, _ = oracle.attention(src[:, :k_off], kc, vc, pos, n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                                     scale=sc, window=window, softcap=softcap)
    # L1 size of every score sum (for the rounding bound) over all (token, head, key): an upper bound
    q = src[:, :k_off].astype(np.float64).reshape(t, n_head, hd)
    kk = np.abs(kc.astype(np.float64)).reshape(n_ctx, n_kv, hd)
    l1 = max(float((np.abs(q[:, h]) @ kk[:, h // (n_head // n_kv)].T).max()) for h in range(n_head)) * sc
    return dict(got=got, ref=ref, got_k=got_k, got_v=got_v, kc=kc, vc=vc, kc0=kc0, vc0=vc0, got_p=got_p, probs=probs,
                l1=float(l1), hd=hd, vmax=float(np.abs(vc).max()), pos=pos, t=t)


def tolerance(r) -> float:
    return 8 * EPS32 * (r["l1"] + 16)


def out_error(r) -> float:
    """max |out - ref| / max|V|; NaN or inf count as infinitely wrong."""
    d = np.abs(r["got"].astype(np.float64) - r["ref"])
    return math.inf if not np.all(np.isfinite(d)) else float(d.max()) / r["vmax"]


def passes(r) -> bool:
    return out_error(r) <= tolerance(r)


def assert_ok(r):
    np.testing.assert_array_equal(r["got_k"], r["kc"])   # the cache write is a copy: exact
    np.testing.assert_array_equal(r["got_v"], r["vc"])
    err, tol = out_error(r), tolerance(r)
    assert err <= tol, f"out error {err:.3g} * max|V| > tolerance {tol:.3g}"
    if r["got_p"] is not None:
        p = r["got_p"].astype(np.float64)
        assert np.all(np.isfinite(p)), "probe has unwritten or non-finite entries"
        perr = float(np.abs(p - r["probs"]).max())
        assert perr <= tol, f"probe error {perr:.3g} > {tol:.3g}"
        np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=0, atol=tol)
        assert np.all(p[r["probs"] == 0] == 0), "probe non-zero on a masked key"


SMOL = dict(n_head=9, n_kv=3, hd=64)     # GQA group 3 (SmolLM2)
QWEN = dict(n_head=14, n_kv=2, hd=64)    # group 7 (Qwen2.5)
GEMMA = dict(n_head=4, n_kv=1, hd=256)   # group 4, one KV head, head_dim 256 (Gemma 3)
MHA = dict(n_head=4, n_kv=4, hd=64)      # group 1


# --------------------------------------------------------------------------------------------- decode
@pytest.mark.parametrize("pos", [0, 1, 17, 300])
def test_decode_positions(device, kernels, pos):
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=1, n_ctx=320, mode="decode", seed=pos))


@pytest.mark.parametrize("shape,pos", [(QWEN, 17), (GEMMA, 300), (MHA, 40)], ids=["qwen", "gemma", "mha"])
def test_decode_shapes(device, kernels, shape, pos):
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=1, n_ctx=320, mode="decode", seed=1))


def test_decode_long_context(device, kernels):
    # 2048 keys: 32 chunks of 64 merged by the combine; workgroup memory holds one tile only
    assert_ok(run_case(device, kernels, **SMOL, pos=2047, t=1, n_ctx=2048, mode="decode", seed=2))


# The caches `lab bench --contexts 0,8192,32768 --decode 64` makes (n_ctx = context + 2 x 64 + 18, lab/host/bench/native.py),
# at the default chunk as the H200 splits them: 64 keys (1 tile) x 131 chunks, 192 keys (3 tiles) x 172 chunks. The
# last position leaves the last chunk partly filled (18 keys of 64, 82 of 192); Gemma 3's window of 512 keys is cut
# into 8 chunks of one tile from its first key (the visible keys are chunked, not the cache). About 0.4 s each on
# lavapipe.
LONG = [(QWEN, 8338, 8337, 0), (QWEN, 32914, 32913, 0), (GEMMA, 32914, 32913, 512), (SMOL, 32914, 32900, 0)]


@pytest.mark.parametrize("shape,n_ctx,pos,window", LONG, ids=["qwen8k", "qwen32k", "gemma32k_window", "smol32k"])
def test_decode_long_contexts(device, kernels, shape, n_ctx, pos, window):
    assert -(-n_ctx // A.decode_chunk(n_ctx)) > 100                                       # what this test is for
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=1, n_ctx=n_ctx, mode="decode", window=window, seed=3))


def test_whole_long_context(device, kernels):
    # a CPU adapter's decode at 32k keys: one workgroup per head block walks all 515 tiles (lab.engine: whole_keys)
    assert_ok(run_case(device, kernels, **QWEN, pos=32913, t=1, n_ctx=32914, mode="whole", seed=3))


# ------------------------------------------------------------------------------- decode in one dispatch
@pytest.mark.parametrize("shape,pos", [(SMOL, 0), (SMOL, 63), (SMOL, 64), (SMOL, 150), (QWEN, 127), (GEMMA, 300),
                                       (MHA, 40)], ids=["smol0", "smol63", "smol64", "smol150", "qwen127",
                                                        "gemma300", "mha40"])
def test_whole(device, kernels, shape, pos):
    """decode_whole: one workgroup per head block walks every visible key (one tile, a tile's edge, several tiles)."""
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=1, n_ctx=320, mode="whole", seed=pos))


@pytest.mark.parametrize("t,pos,window,softcap", [(1, 100, 16, 0.0), (1, 90, 0, 30.0), (3, 70, 0, 0.0)])
def test_whole_window_softcap_tokens(device, kernels, t, pos, window, softcap):
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=t, n_ctx=160, mode="whole", window=window,
                       softcap=softcap, big=30.0 if softcap else 0.0, seed=t + pos))


def test_whole_refuses_a_probe(device, kernels):
    with pytest.raises(ValueError, match="no probe"):
        A.attention(device, kernels, None, None, None, None, None, n_head=9, n_kv_head=3, head_dim=64, q_stride=960,
                    q_offset=0, n_ctx=0, probe=object(), mode="whole")


# --------------------------------------------------------------------------------------------- prefill
@pytest.mark.parametrize("shape", [SMOL, QWEN, GEMMA, MHA], ids=["smol", "qwen", "gemma", "mha"])
@pytest.mark.parametrize("t,pos", [(7, 0), (5, 11)])
def test_prefill(device, kernels, shape, t, pos):
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=t, mode="prefill", seed=3 + pos))


@pytest.mark.parametrize("shape", [SMOL, QWEN, GEMMA, MHA], ids=["smol", "qwen", "gemma", "mha"])
@pytest.mark.parametrize("t,pos", [(7, 0), (5, 11)])
def test_prefill_narrow_tiles(device, kernels, shape, t, pos):
    """The GPU's prefill tiles (4 query rows a workgroup): t * group rows not a multiple of 4, a window, a probe."""
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=t, mode="prefill", seed=3 + pos, narrow=True))
    r = run_case(device, kernels, **shape, pos=pos, t=t, mode="prefill", window=4, probe=True, seed=5, narrow=True)
    assert_ok(r)
    seen = np.minimum(4, pos + np.arange(t) + 1)             # keys in the window, fewer near the start
    assert np.all((r["probs"] > 0).sum(axis=-1) == seen[:, None])


def need_subgroups(device):
    if "subgroups" not in device.info.features:
        pytest.skip("prefill_rows needs subgroups")


@pytest.mark.parametrize("shape", [SMOL, QWEN, GEMMA, MHA], ids=["smol", "qwen", "gemma", "mha"])
@pytest.mark.parametrize("t,pos", [(7, 0), (5, 11), (40, 3)])
def test_prefill_rows(device, kernels, shape, t, pos):
    """Four lanes a query row (16 rows a workgroup, so t * group rows end mid-workgroup), tiles of 8-32 keys."""
    need_subgroups(device)
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=t, mode="prefill", seed=3 + pos, rows=True))


def test_prefill_rows_options(device, kernels):
    """The window, the soft-cap, scores near 250 and a long context through prefill_rows."""
    need_subgroups(device)
    assert_ok(run_case(device, kernels, **SMOL, pos=9, t=7, window=4, mode="prefill", seed=8, rows=True))
    assert_ok(run_case(device, kernels, **QWEN, pos=11, t=5, softcap=50.0, big=60.0, mode="prefill", seed=9,
                       rows=True))
    assert_ok(run_case(device, kernels, **SMOL, pos=9, t=7, big=250.0, mode="prefill", seed=10, rows=True))
    assert_ok(run_case(device, kernels, **GEMMA, pos=11, t=5, scale=0.2, mode="prefill", seed=11, rows=True))
    assert_ok(run_case(device, kernels, **QWEN, pos=2040, t=8, n_ctx=2048, mode="prefill", seed=4, rows=True))


def test_prefill_rows_is_the_gpus_choice(device, kernels):
    """Narrow tiles, no probe, subgroups: prefill_rows; a probe keeps prefill (its probabilities pass)."""
    buf = device.buffer(4 * 64 * 64, gpu.CONVERSATION, "t.any")
    step = make_step(device, "t.step")
    try:
        def entry(**kw):
            ops = A.attention(device, kernels, buf, buf, buf, buf, step, n_head=4, n_kv_head=2, head_dim=64,
                              q_stride=256, q_offset=0, n_ctx=16, mode="prefill", **kw)
            return ops[0].kernel.label.split(" ")[0]
        want = "attention:prefill_rows" if "subgroups" in device.info.features else "attention:prefill"
        assert entry(narrow=True) == want
        assert entry(narrow=False) == "attention:prefill"
        assert entry(narrow=True, probe=buf) == "attention:prefill"
        with pytest.raises(ValueError, match="prefill_rows"):
            entry(rows=True, probe=buf)
    finally:
        device.destroy(buf)
        device.destroy(step)


def test_prefill_long_context(device, kernels):
    assert_ok(run_case(device, kernels, **QWEN, pos=2040, t=8, n_ctx=2048, mode="prefill", seed=4))


@pytest.mark.parametrize("rows,pos", [(True, 24512), (False, 8128)], ids=["rows_24k", "narrow_8k"])
def test_prefill_gpu_tiles_long_context(device, kernels, rows, pos):
    # the last 64-token step of a bench prompt on a GPU (prefill_rows on the H200; the narrow tiles without
    # subgroups) at long contexts, as far as lavapipe's loop budget lets a workgroup walk keys (test_loop_budget.py:
    # prefill_rows is cut past about 27,600 keys here, the narrow tiles past about 25,000); 5 s and 2 s on lavapipe
    if rows:
        need_subgroups(device)
    assert_ok(run_case(device, kernels, **QWEN, pos=pos, t=64, n_ctx=pos + 64 + 18, mode="prefill", narrow=True,
                       rows=rows, seed=5))


def test_entries_any_t(device, kernels):
    # decode with several tokens and prefill with one are still correct
    assert_ok(run_case(device, kernels, **SMOL, pos=11, t=5, mode="decode", seed=5))
    assert_ok(run_case(device, kernels, **GEMMA, pos=17, t=1, mode="prefill", seed=6))


@pytest.mark.parametrize("t,pos", [(1, 20), (6, 3)])
def test_auto_mode(device, kernels, t, pos):
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=t, mode="auto", seed=7))


# --------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("mode,t,pos", [("decode", 1, 20), ("prefill", 7, 9)])
def test_window(device, kernels, mode, t, pos):
    r = run_case(device, kernels, **SMOL, pos=pos, t=t, window=4, mode=mode, probe=True, seed=8)
    assert_ok(r)
    # each query sees exactly its 4 latest keys (itself included), and that changes the result
    assert np.all((r["probs"] > 0).sum(axis=-1) == 4)
    full = run_case(device, kernels, **SMOL, pos=pos, t=t, mode=mode, seed=8)
    assert np.abs(full["ref"] - r["ref"]).max() > 100 * tolerance(r) * r["vmax"]


@pytest.mark.parametrize("mode,t,pos", [("decode", 1, 30), ("prefill", 5, 11)])
def test_softcap(device, kernels, mode, t, pos):
    # raw scores ~ 60 +- 10 .. 400: the cap 50 changes them (and saturates at 400 without NaN)
    for big in (60.0, 400.0):
        r = run_case(device, kernels, **QWEN, pos=pos, t=t, softcap=50.0, big=big, mode=mode, probe=True, seed=9)
        assert_ok(r)
    r = run_case(device, kernels, **QWEN, pos=pos, t=t, softcap=50.0, big=60.0, mode=mode, seed=9)
    uncapped = run_case(device, kernels, **QWEN, pos=pos, t=t, big=60.0, mode=mode, seed=9)
    assert np.abs(uncapped["ref"] - r["ref"]).max() > 100 * tolerance(r) * r["vmax"]


@pytest.mark.parametrize("mode,t,pos", [("decode", 1, 40), ("prefill", 7, 9)])
def test_large_scores(device, kernels, mode, t, pos):
    # scale * q.k ~ 250: exp of a raw score overflows f32; the max subtraction keeps it finite
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=t, big=250.0, mode=mode, probe=True, seed=10))


def test_custom_scale_gemma(device, kernels):
    # Gemma's own scale (query_pre_attn_scalar) differs from 1/sqrt(head_dim); any scale is honoured
    for mode, t in (("decode", 1), ("prefill", 5)):
        assert_ok(run_case(device, kernels, **GEMMA, pos=11, t=t, scale=0.2, mode=mode, probe=True, seed=11))


@pytest.mark.parametrize("mode,t,pos", [("decode", 1, 17), ("prefill", 7, 0), ("prefill", 5, 11)])
def test_probe(device, kernels, mode, t, pos):
    r = run_case(device, kernels, **SMOL, pos=pos, t=t, mode=mode, probe=True, seed=12)
    assert_ok(r)
    # layout [t, n_head, n_ctx]: token j's row is non-zero exactly on keys 0 .. pos + j
    p = r["got_p"]
    for j in range(t):
        assert np.all(p[j, :, :pos + j + 1] > 0) and np.all(p[j, :, pos + j + 1:] == 0)


def _bind_resources(device, entry, probe):
    """Buffers of the right kinds for an entry's bindings, in order (uniforms for step and params)."""
    names = [r for r in A.ENTRY_RESOURCES[entry] if r != "probe" or probe]
    return [make_step(device) if r == "step" else device.uniform(bytes(48), "p") if r == "params"
            else device.buffer(64, gpu.CONVERSATION, r) for r in names]


@pytest.mark.parametrize("probe", [False, True])
def test_entry_bindings(device, kernels, probe):
    # each entry's layout holds exactly the resources ENTRY_RESOURCES lists (bound as 0, 1, ..): one more fails.
    # Without a probe, no live line of the source mentions the probe buffer.
    if not probe:
        text = shaders.source("attention", **A._consts(64, 3, 3, False, "decode_split"))
        live = [ln for ln in text.splitlines() if not ln.lstrip().startswith("//")]
        assert not [ln for ln in live if "probe[" in ln or "> probe" in ln]
    before = set(map(id, device.buffers))
    try:
        for entry in ["decode_split", "decode_combine", "prefill"] + (["decode_probs"] if probe else ["decode_whole"]):
            k = kernels.get("attention", entry, **A._consts(64, 3, 3, probe, entry))
            res = _bind_resources(device, entry, probe)
            device.bind(k, res)
            with pytest.raises(Exception):
                device.bind(k, res + [device.buffer(64, gpu.CONVERSATION, "extra")])
    finally:
        for buf in [b for b in device.buffers if id(b) not in before]:
            device.destroy(buf)


SWEEP = [  # (shape, mode, t, pos, n_ctx, window, softcap, probe): options mixed, blocks and tiles at their edges
    (GEMMA, "prefill", 9, 30, 64, 4, 0.0, True),       # Gemma: window, several row blocks of BQ=4
    (GEMMA, "decode", 1, 511, 512, 6, 30.0, True),     # last row of the cache, window and cap together
    (QWEN, "prefill", 3, 44, 48, 0, 0.0, False),       # step ends at the cache's last row
    (QWEN, "decode", 2, 255, 320, 0, 0.0, True),       # 2 tokens: 4 chunks of 256 keys, 5 of 257 (one key in the 5th)
    (SMOL, "prefill", 16, 31, 64, 33, 0.0, True),      # window wider than the block's key span
    (MHA, "prefill", 33, 0, 40, 0, 20.0, True),        # 33 rows in 3 blocks, keys over 2 tiles of BK
]


@pytest.mark.parametrize("case", range(len(SWEEP)))
def test_sweep(device, kernels, case):
    shape, mode, t, pos, n_ctx, window, softcap, probe = SWEEP[case]
    assert_ok(run_case(device, kernels, **shape, pos=pos, t=t, n_ctx=n_ctx, mode=mode, window=window,
                       softcap=softcap, probe=probe, big=30.0 if softcap else 0.0, seed=20 + case))


def test_auto_grids(device, kernels):
    # auto mode: the decode ops (split, combine) then prefill, complementary grids; the idle ones dispatch (0, 0, 0)
    conv = gpu.CONVERSATION
    before = set(map(id, device.buffers))
    try:
        q, k, v, o = (device.buffer(4 * 128 * 640, conv, n) for n in "qkvo")
        ops = A.attention(device, kernels, q, k, v, o, make_step(device), n_head=14, n_kv_head=2, head_dim=64,
                          q_stride=18 * 64, q_offset=0, n_ctx=640)
        assert [op.kernel.label.split(" ")[0] for op in ops] == [
            "attention:decode_split", "attention:decode_combine", "attention:prefill"]
        # 640 keys in 10 chunks of 64; Qwen's 7 query heads of a KV head share a workgroup
        assert ops[0].grid(1) == (10, 2, 1) and ops[1].grid(1) == (14, 1, 1) and ops[2].grid(1) == (0, 0, 0)
        assert ops[0].grid(5) == ops[1].grid(5) == (0, 0, 0) and ops[2].grid(5) == (-(-5 * 7 // 16), 2, 1)
        # the scratch is conversation data, sized for n_ctx: 14 heads x (1 + 10 chunks x (1 + 16)) vec4s
        scratch = [b for b in device.buffers if id(b) not in before and "scratch" in b.label]
        assert len(scratch) == 1 and scratch[0].kind == conv and scratch[0].size == 16 * 14 * (1 + 10 * 17)
        # decode's scratch holds max_tokens (1) tokens: a longer forced-decode step is refused, not corrupted
        dec = A.attention(device, kernels, q, k, v, o, make_step(device), n_head=14, n_kv_head=2, head_dim=64,
                          q_stride=18 * 64, q_offset=0, n_ctx=640, mode="decode")
        with pytest.raises(ValueError):
            dec[0].at(2)
    finally:
        for buf in [b for b in device.buffers if id(b) not in before]:
            device.destroy(buf)


def test_decode_chunking():
    # default chunk: multiples of TK, at most MAX_CHUNKS chunks; HPW: a divisor of the group within 16 KiB
    assert A.decode_chunk(48) == 64 and A.decode_chunk(2048) == 64 and A.decode_chunk(16385) == 128
    assert -(-32768 // A.decode_chunk(32768)) <= A.MAX_CHUNKS
    assert A.heads_per_workgroup(64, 3) == 3 and A.heads_per_workgroup(64, 7) == 7
    assert A.heads_per_workgroup(256, 4) == 4 and A.heads_per_workgroup(64, 16) == 8
    for hd, g in ((64, 3), (64, 7), (256, 4), (64, 16), (128, 8), (256, 8)):
        assert A.workgroup_bytes(hd, A.heads_per_workgroup(hd, g))["decode_split"] <= 16384


# --------------------------------------------------------------------------------------------- split-K chunks
BIG_GROUP = dict(n_head=16, n_kv=1, hd=64)   # group 16: two head blocks of 8 per KV head


# A step's visible keys are cut into at most n_chunks = ceil(n_ctx / chunk) chunks of whole tiles of TK (64) keys,
# counted from its first visible key (wgsl/attention.wgsl q_chunk).
@pytest.mark.parametrize("pos", [63, 64, 127, 128, 191, 639])
def test_chunk_edges(device, kernels, pos):
    # up to 10 chunks of one tile: the keys fill one (63), spill one key into a second (64), fill two (127), spill
    # into a third (128), fill three (191), fill all ten (639)
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=1, n_ctx=640, mode="decode", chunk=64, probe=True,
                       seed=30 + pos % 200))


@pytest.mark.parametrize("pos", [63, 64, 127, 128])
def test_default_chunk_edges(device, kernels, pos):
    # the default chunk (64 keys for this cache) at its edges
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=1, n_ctx=320, mode="decode", seed=40 + pos))


@pytest.mark.parametrize("pos,window", [(200, 100), (300, 64), (300, 65), (400, 300), (130, 4), (639, 600)],
                         ids=["span2", "exactly_one", "one_past", "span5", "inside_one", "all_ten"])
def test_window_chunks(device, kernels, pos, window):
    # windows chunked from their first key (n_ctx 640, up to 10 chunks of one tile): two chunks (keys 101..200),
    # exactly one tile (237..300), one key into a second chunk (236..300), five chunks (101..400), 4 keys, and 600
    # keys in ten chunks, the last partly filled
    r = run_case(device, kernels, **SMOL, pos=pos, t=1, n_ctx=640, mode="decode", chunk=64, window=window,
                 probe=True, seed=50 + pos % 100)
    assert_ok(r)
    assert np.all((r["probs"] > 0).sum(axis=-1) == window)


@pytest.mark.parametrize("chunk,pos", [(128, 200), (100, 299), (1, 319), (320, 319)],
                         ids=["two_tiles", "two_tiles_ragged", "more_chunks_than_tiles", "one_chunk"])
def test_chunk_sizes(device, kernels, chunk, pos):
    # n_ctx 320: 3 chunks (201 keys in 2 of 2 tiles each: online softmax inside a chunk), 4 chunks (300 keys in 3 of
    # 2 tiles, the last partly filled), 320 chunks (5 of one tile, the rest exit at once), one chunk (no split)
    assert_ok(run_case(device, kernels, **SMOL, pos=pos, t=1, n_ctx=320, mode="decode", chunk=chunk, probe=True,
                       seed=60))


@pytest.mark.parametrize("shape", [QWEN, GEMMA, MHA, BIG_GROUP], ids=["qwen", "gemma", "mha", "group16"])
def test_chunks_shapes(device, kernels, shape):
    # every GQA shape over several chunks (a window of 200 keys: 4 chunks of a tile), window, cap and probe together;
    # group 16 splits a KV head's heads
    assert_ok(run_case(device, kernels, **shape, pos=300, t=1, n_ctx=384, mode="decode", chunk=64, window=200,
                       softcap=30.0, big=30.0, probe=True, seed=70))


def test_chunks_several_tokens(device, kernels):
    # a forced decode step of 3 tokens over chunks: per-token scratch rows, each token's own chunks (its window of
    # 150 keys from its own first key: 3 chunks of a tile)
    assert_ok(run_case(device, kernels, **QWEN, pos=250, t=3, n_ctx=320, mode="decode", chunk=64, window=150,
                       probe=True, seed=71))


def test_scratch_reused_across_steps(device, kernels):
    # one plan, several steps: a step never reads chunk records a longer (or differently windowed) earlier step left
    n_head, n_kv, hd, n_ctx = 9, 3, 64, 640
    rng = np.random.default_rng(72)
    conv = gpu.CONVERSATION
    kc = rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float32)
    vc = rng.standard_normal((n_ctx, n_kv * hd)).astype(np.float32)
    before = set(map(id, device.buffers))
    try:
        b_q = device.buffer(4 * n_head * hd, conv, "q")
        b_k, b_v = device.buffer(kc.nbytes, conv, "k"), device.buffer(vc.nbytes, conv, "v")
        b_o = device.buffer(4 * n_head * hd, conv, "o")
        step = make_step(device)
        device.write(b_k, kc.tobytes())
        device.write(b_v, vc.tobytes())
        for window in (0, 130):
            ops = A.attention(device, kernels, b_q, b_k, b_v, b_o, step, n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                              q_stride=n_head * hd, q_offset=0, n_ctx=n_ctx, window=window, mode="decode", chunk=64)
            for pos in (600, 100, 330, 170, 470):     # 10, 2, 6, 3, 8 chunks (window 130: 3 each, but 2 at 100)
                q = rng.standard_normal((1, n_head * hd)).astype(np.float32)
                device.write(b_q, q.tobytes())
                device.run([op.at(1) for op in ops], writes=[(step, 0, step_bytes(pos, 1, n_ctx))])
                got = np.frombuffer(device.read_sync(b_o), np.float32).reshape(1, -1)
                ref, _, _ = oracle.attention(q, kc, vc, pos, n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                                             scale=1 / math.sqrt(hd), window=window)
                err = float(np.abs(got - ref).max()) / float(np.abs(vc).max())
                assert err <= 8 * EPS32 * 64, f"window {window} pos {pos}: error {err:.3g}"
    finally:
        for buf in [b for b in device.buffers if id(b) not in before]:
            device.destroy(buf)


# --------------------------------------------------------------------------------------------- broken kernels
GQA_MOD = [("return h / GROUP;", "return h % N_KV;"), ("return kvh * GROUP + hg;", "return hg * N_KV + kvh;")]
NO_MAX = [("return max(m_old, tile_max);", "return 0.0;")]
NEXT = [("fn key_end(qpos: u32) -> u32 { return qpos + 1u; }", "fn key_end(qpos: u32) -> u32 { return qpos + 2u; }")]
NOT_SELF = [("fn key_end(qpos: u32) -> u32 { return qpos + 1u; }", "fn key_end(qpos: u32) -> u32 { return qpos; }")]
BROKEN = {"gqa_mod": GQA_MOD, "no_max": NO_MAX, "next_token": NEXT, "not_self": NOT_SELF}
# split-K only: the combine adds the chunks' sums without rescaling them to the common max; it skips the last
# (partly filled) chunk; a chunk keeps only its last tile's V sum (no online rescaling across tiles)
NO_RESCALE = [("l += r.y * exp(r.x - mx);", "l += r.y;"),
              ("v += scratch[rc + 1u + d4] * exp(scratch[rc].x - mx);", "v += scratch[rc + 1u + d4];")]
LAST_CHUNK = [("return (key_hi(qpos) - key_begin(qpos) + ch - 1u) / ch;",
               "return (key_hi(qpos) - key_begin(qpos)) / ch;")]
TILE_RESET = [("acc[a * HPW + hh] *= alpha[hh];", "acc[a * HPW + hh] *= 0.0;")]
# the whole decode writes the unnormalised V sum
NO_NORM = [("d_vsum(hh, i % HD4) / ml[hh].y;", "d_vsum(hh, i % HD4);")]
BROKEN_SPLIT = {"no_rescale": NO_RESCALE, "last_chunk": LAST_CHUNK, "tile_reset": TILE_RESET, "no_norm": NO_NORM}

CASES = {  # trap cases: decode in one chunk and over several (4 chunks of one tile, the last with 9 keys; tiles of
    # TK in chunks of 128; a 32k cache's 172 chunks, the last partly filled), prefill
    "decode": dict(mode="decode", t=1, pos=17),
    "decode_chunks": dict(mode="decode", t=1, pos=200, n_ctx=256, chunk=64),
    "decode_tiles": dict(mode="decode", t=1, pos=150, n_ctx=192, chunk=128),
    "decode_long": dict(mode="decode", t=1, pos=32900, n_ctx=32914),
    "whole_tiles": dict(mode="whole", t=1, pos=150, n_ctx=192),
    "prefill_0": dict(mode="prefill", t=7, pos=0),
    "prefill_11": dict(mode="prefill", t=5, pos=11),
}


def _trap(device, subs, case, big):
    """The real kernel passes the case; returns the broken variant's run of it."""
    case = dict(**SMOL, **CASES[case], big=big, seed=13)
    assert passes(run_case(device, KernelCache(device), **case)), "the real kernel must pass this case"
    return run_case(device, BrokenKernels(device, subs), **case)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_variants_fail(device, name, case):
    r = _trap(device, BROKEN[name], case, 250.0 if name == "no_max" else 0.0)
    assert not passes(r), f"broken variant {name} passed: error {out_error(r):.3g} <= {tolerance(r):.3g}"


@pytest.mark.parametrize("name,case", [("no_rescale", "decode_chunks"), ("no_rescale", "decode_tiles"),
                                       ("no_rescale", "decode_long"), ("last_chunk", "decode_chunks"),
                                       ("last_chunk", "decode_tiles"), ("last_chunk", "decode_long"),
                                       ("tile_reset", "decode_tiles"), ("tile_reset", "decode_long"),
                                       ("tile_reset", "whole_tiles"),
                                       ("no_norm", "whole_tiles")])
def test_broken_split_fails(device, name, case):
    r = _trap(device, BROKEN_SPLIT[name], case, 0.0)
    assert not passes(r), f"broken variant {name} passed: error {out_error(r):.3g} <= {tolerance(r):.3g}"


def test_no_max_needs_large_scores(device):
    # Without max subtraction the online softmax is still right for small scores: only the large case catches it
    for case in ("decode", "decode_chunks"):
        r = run_case(device, BrokenKernels(device, NO_MAX), **SMOL, **CASES[case], seed=13)
        assert passes(r)
