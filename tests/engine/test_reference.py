"""The numpy reference forward pass (lab/reference), checked against llama.cpp.

Two kinds of llama.cpp evidence, neither needing llama_cpp at test time:

1. GOLDEN_F32 below: llama.cpp (llama-cpp-python 0.3.36, CPU) run on each model rewritten as an
   all-F32 GGUF (every tensor dequantized by gguf-py, metadata unchanged), with an F32 KV cache and
   flash attention off. Then llama.cpp does no rounding of its own: its matmuls are f32 x f32, so
   it computes the same function as the reference. Measured max |logit diff| over the top-5 at all
   positions: smollm2 6e-5, qwen2.5 5e-5 (the 4-decimal rounding of the constants), gemma3 7.5e-3
   (llama.cpp's CPU GELU is a float16 lookup table: verified op-level, GeGLU matches to 8e-7 once
   emulated). Tolerances: 1e-3 (llama, qwen2) and 0.05 (gemma3). At that level the test catches an
   RMSNorm epsilon off by 10x (0.09) or a RoPE base off by 1% (0.01).

2. tests/fixtures/<model>.json (scripts/make_fixtures.py): llama.cpp on the quantized file, as a
   user runs it. There llama.cpp quantizes activations before every matmul (Q8_0 / Q8_1 / Q8_K
   blocks), keeps the KV cache in float16 and uses the GELU table; the network amplifies that
   noise, so the logits differ by up to a few tenths (see TOL). Emulating llama.cpp's rounding
   reproduces each op to 1e-7 given llama.cpp's own inputs, but not the whole pass: a 1e-7
   difference flips a rounding somewhere and the chain decorrelates, so emulation buys nothing end
   to end. The tolerances are the measured worst case (over every prompt position and, teacher-
   forced, every generated step of the 6 fixture prompts) with margin. Measured max / mean top-5
   |diff| and the largest llama.cpp top-2 gap at a top-1 disagreement: smollm2 1.11 / 0.19 / 0.33,
   qwen2.5 0.34 / 0.07 / 0.13, gemma3 3.14 / 0.27 / 0.39 (gemma3's worst are chat-template
   positions whose logits are all near -12). What they still catch (measured): swapped RoPE
   pairing (max 21-26), missing qwen2 biases (35), gemma3 without the sqrt(n_embd) embedding scale
   (120) or with +1 on its norm weights (64), the 27B attention scale (11.6), 1e6 as the RoPE base
   of sliding-window layers (15), doubling smollm2's RoPE base (2.3, and a top-1 flip at gap 0.83).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.host.reference import Hparams, Reference
from lab.host.reference.bisect import bisect, rel_error
from lab.host.reference.ops import rms_norm, rope, softmax
from tests.conftest import FIXTURES, smollm2_unless_slow

PATH_FIXTURE = {"smollm2": "smollm2_path", "qwen2.5": "qwen_path", "gemma3": "gemma_path"}

# (max |top-5 logit diff|, mean of the per-position means, top-2 gap under which llama.cpp's
# top-1 may lose to another token in the reference, and then by no more than this much)
TOL = {"smollm2": (2.0, 0.4, 0.75), "qwen2.5": (0.75, 0.15, 0.3), "gemma3": (5.0, 0.6, 0.8)}

# llama.cpp on the F32 GGUFs (see the module doc): prompt ids, top-5 (ids, logits) at every
# position, 8 greedy tokens.
GOLDEN_F32 = {
    "smollm2": dict(
        tol=1e-3,
        ids=[504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 533, 216],
        greedy=[33, 41, 41, 41, 28, 260, 216, 33],
        top5=[
            ([29, 28, 198, 79, 506], [27.3534, 25.5656, 25.0673, 24.9148, 24.6983]),
            ([970, 284, 29, 381, 3564], [26.1422, 26.0813, 25.9206, 25.0176, 24.9475]),
            ([16438, 5670, 48355, 25870, 8455], [11.1534, 10.2388, 9.8389, 9.4595, 8.8343]),
            ([351, 284, 28, 365, 3365], [18.1553, 15.7146, 15.4877, 15.1683, 15.0078]),
            ([690, 614, 767, 24769, 1130], [23.0743, 15.3127, 15.0725, 15.0519, 15.0336]),
            ([253, 260, 6354, 23790, 13549], [20.372, 17.788, 16.8258, 15.1431, 13.0286]),
            ([4411, 18906, 23790, 14553, 4463], [9.3128, 8.6648, 8.5142, 8.2201, 7.5957]),
            ([2767, 16438, 4626, 8180, 23790], [14.68, 10.5024, 10.223, 10.143, 9.7311]),
            ([198, 30, 28, 365, 18], [26.3829, 25.9409, 24.98, 24.3221, 24.3023]),
            ([198, 378, 669, 216, 533], [21.3155, 19.1675, 19.1561, 18.885, 18.4121]),
            ([451, 550, 260, 253, 338], [17.9453, 17.7716, 17.6228, 16.8743, 16.7784]),
            ([33, 34, 35, 37, 36], [29.2976, 28.8394, 26.3646, 25.9603, 25.539]),
        ]),
    "qwen2.5": dict(
        tol=1e-3,
        ids=[785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 758, 220],
        greedy=[16, 15, 4420, 11, 279, 38835, 34208, 220],
        top5=[
            ([1990, 495, 1429, 12433, 1290], [10.7553, 10.6441, 10.5947, 10.2331, 9.9761]),
            ([13876, 10471, 64461, 38835, 6303], [23.8745, 17.0573, 15.4557, 13.5614, 13.1267]),
            ([38835, 13282, 15011, 5562, 47314], [22.4028, 15.1905, 14.8715, 14.3261, 12.8732]),
            ([34208, 26005, 7784, 502, 10613], [21.19, 16.4477, 14.6868, 14.4025, 12.8561]),
            ([916, 3941, 279, 1918, 38835], [23.1859, 13.3788, 12.7906, 12.7603, 12.6044]),
            ([279, 264, 15678, 1657, 894], [18.03, 16.0301, 13.048, 11.9566, 11.6796]),
            ([15678, 24650, 49013, 27950, 64436], [22.3849, 14.5462, 14.0148, 13.4475, 13.1942]),
            ([5562, 12590, 18457, 8251, 294], [21.7871, 15.6229, 14.4902, 13.2909, 12.4425]),
            ([13, 382, 624, 2217, 7110], [15.2209, 15.1989, 13.5505, 13.0324, 11.8116]),
            ([576, 758, 2585, 4710, 3555], [11.8765, 11.5742, 11.0823, 10.9965, 10.9453]),
            ([419, 279, 264, 6364, 892], [14.3439, 13.1943, 12.5575, 11.959, 11.8373]),
            ([16, 17, 20, 18, 19], [18.1503, 17.5748, 16.7014, 16.5093, 16.059]),
        ]),
    "gemma3": dict(
        tol=0.05,
        ids=[2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761, 799],
        greedy=[506, 1345, 236764, 506, 4799, 563, 506, 886],
        top5=[
            ([184, 198, 255999, 185, 818], [14.5224, 14.3648, 14.2024, 14.0832, 14.0753]),
            ([236743, 1171, 861, 5708, 2269], [20.3007, 18.6494, 18.0365, 17.7687, 17.6666]),
            ([3890, 532, 236772, 6608, 501], [15.1208, 14.4262, 13.396, 12.8695, 12.6662]),
            ([37423, 236789, 43277, 236858, 13923], [23.0227, 20.5365, 20.4965, 20.1335, 19.5648]),
            ([38167, 815, 4038, 600, 32694], [23.4061, 21.7607, 21.6709, 21.1707, 21.1642]),
            ([1024, 1131, 573, 855, 531], [26.5287, 23.258, 22.5245, 21.7032, 21.6219]),
            ([506, 496, 255999, 531, 236743], [24.1165, 18.8892, 18.839, 18.4835, 17.5844]),
            ([31770, 1171, 2604, 236743, 5268], [22.1453, 19.8498, 19.2116, 18.9269, 18.5761]),
            ([4799, 8858, 11149, 11866, 12414], [22.8089, 18.9506, 18.4065, 18.1404, 17.9146]),
            ([236761, 236764, 532, 255999, 236888], [22.2058, 21.1609, 20.712, 20.4911, 19.9456]),
            ([108, 669, 107, 255999, 138], [23.6719, 22.7017, 22.3683, 21.9514, 21.3902]),
            ([506, 672, 496, 1707, 1032], [22.7238, 22.1247, 21.423, 20.9175, 20.5924]),
        ]),
}

# gemma3 past its 512-token sliding window: BOS + "Once upon a time, ... there lived" repeated to
# 600 tokens. llama.cpp F32 top-5 at the last three positions and 4 greedy tokens. Without the
# window the reference is off by 11 logits here; with the 1e6 RoPE base on local layers, by 15+.
GEMMA_LONG_BODY = [14946, 3324, 496, 990, 236764, 528, 496, 1944, 9744, 684, 506, 5442, 236764, 993, 11742]
GEMMA_LONG_TOP5 = [
    ([236764, 1031, 108, 236761, 236793], [26.7233, 17.8678, 17.6012, 17.3359, 16.8542]),
    ([993, 13534, 901, 108, 2085], [31.3555, 25.535, 23.5474, 22.0255, 21.6278]),
    ([11742, 3892, 51505, 8390, 691], [30.1908, 25.7009, 22.497, 21.7897, 20.6936]),
]
GEMMA_LONG_GREEDY = [11742, 14946, 3324, 496]


@pytest.fixture(scope="module", params=list(PATH_FIXTURE))
def ref(request) -> Reference:
    """One model at a time (module-scoped and parametrized: pytest finishes one model's tests
    before loading the next, so at most one set of dequantized weights is alive)."""
    r = Reference(request.getfixturevalue(PATH_FIXTURE[request.param]))
    r.name = request.param
    yield r
    r.w.drop()


def _fixture(name: str):
    f = FIXTURES / f"{name}.json"
    if not f.exists():
        pytest.skip(f"{f.name} is missing: run scripts/make_fixtures.py with llama-cpp-python")
    return json.loads(f.read_text())


# -- the building blocks, no model --------------------------------------------------------------

def test_rope_pairs_and_relative_positions():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 8)).astype(np.float64)
    for mode, pair in (("norm", (0, 1)), ("neox", (0, 4))):
        y = rope(np.repeat(x, 3, 0), np.array([0, 1, 5]), 8, 10000.0, mode)
        assert np.allclose(y[0], x[0])                                  # position 0: identity
        assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))
        a, b = x[0, 0, pair[0]], x[0, 0, pair[1]]                       # dims 0 and its partner turn by 1 rad at pos 1
        assert np.allclose([y[1, 0, pair[0]], y[1, 0, pair[1]]],
                           [a * np.cos(1) - b * np.sin(1), a * np.sin(1) + b * np.cos(1)])
        # q.k depends only on the distance
        q, k = rng.standard_normal((2, 1, 1, 8))
        d1 = rope(q, np.array([7]), 8, 100.0, mode)[0, 0] @ rope(k, np.array([3]), 8, 100.0, mode)[0, 0]
        d2 = rope(q, np.array([14]), 8, 100.0, mode)[0, 0] @ rope(k, np.array([10]), 8, 100.0, mode)[0, 0]
        assert np.isclose(d1, d2)
    # partial rotation leaves the tail alone
    y = rope(x, np.array([3]), 4, 10000.0, "neox")
    assert np.array_equal(y[..., 4:], x[..., 4:])


def test_rms_norm_and_softmax():
    x = np.array([[3.0, -4.0]], np.float32)
    assert np.allclose(rms_norm(x, np.array([1.0, 2.0], np.float32), 0.0), [[3 / np.sqrt(12.5), -8 / np.sqrt(12.5)]])
    p = softmax(np.array([[0.0, -np.inf, np.log(3.0)]]))
    assert np.allclose(p, [[0.25, 0.0, 0.75]])


def test_bisect_finds_the_first_divergence():
    ref_t = {"a": np.ones(4), "b": np.arange(4.0), "c": np.full(4, 10.0)}
    gpu = {"a": np.ones(4) * 1.001, "b": np.arange(4.0) + [0, 0, 0.5, 0], "c": np.full(4, 20.0)}
    assert bisect(ref_t, gpu, ["a", "b", "c"], tol=1e-2) == ("b", pytest.approx(0.5 / 3))
    assert bisect(ref_t, gpu, ["a", "c"], tol=1e-2)[0] == "c"
    assert bisect(ref_t, {"a": np.ones(4)}, ["a", "b", "c"], tol=1e-6) is None   # missing names skipped
    assert rel_error(np.ones(4), np.ones(5)) == float("inf")
    assert rel_error(np.ones(4), np.array([1, 1, np.nan, 1])) == float("inf")
    assert rel_error(np.ones((2, 3)), np.ones(6)) == 0.0                            # same size, reshaped


# -- per model ------------------------------------------------------------------------------------

def test_hparams(ref):
    hp: Hparams = ref.hp
    expect = {
        "smollm2": dict(arch="llama", rope_type="norm", n_layer=30, head_dim=64, attn_scale=1 / 8,
                        rope_base=1e5, tied=True),
        "qwen2.5": dict(arch="qwen2", rope_type="neox", n_layer=24, head_dim=64, attn_scale=1 / 8,
                        rope_base=1e6, tied=False),
        "gemma3": dict(arch="gemma3", rope_type="neox", n_layer=18, head_dim=256, attn_scale=1 / 16,
                       rope_base=1e6, tied=True),
    }[ref.name]
    assert (hp.arch, hp.rope_type, hp.n_layer, hp.head_dim) == (expect["arch"], expect["rope_type"],
                                                                 expect["n_layer"], expect["head_dim"])
    assert hp.attn_scale == pytest.approx(expect["attn_scale"])
    assert hp.rope_base == expect["rope_base"]
    assert (ref.output_name == "token_embd.weight") == expect["tied"]
    if ref.name == "gemma3":
        # llama.cpp: set_swa_pattern(6) -> every 6th layer (5, 11, 17) global, local base 10000
        assert [il for il in range(hp.n_layer) if not hp.is_swa(il)] == [5, 11, 17]
        assert (hp.n_swa, hp.rope_base_swa, hp.rope_base_for(0), hp.rope_base_for(5)) == (512, 1e4, 1e4, 1e6)
        assert hp.embed_scale == pytest.approx(np.sqrt(640))
        assert hp.final_softcap == 0.0 and hp.qk_norm and hp.post_norms and hp.ffn_act == "gelu"
        # is_masked_swa (STANDARD): key p_k is hidden from query p_q when p_q - p_k >= 512
        m = ref._mask(0, np.array([511, 512, 600]), 601)
        assert m[0, 0] and not m[1, 0] and m[1, 1] and not m[2, 88] and m[2, 89] and m[2].sum() == 512
        assert ref._mask(5, np.array([600]), 601).all()                  # global layer: every past key
    else:
        assert hp.swa_layers == [] and hp.embed_scale == 1.0 and hp.ffn_act == "silu"


def test_golden_f32_llama_cpp(ref):
    g = GOLDEN_F32[ref.name]
    logits = ref.forward(g["ids"])
    assert logits.shape == (len(g["ids"]), ref.hp.n_vocab) and logits.dtype == np.float32
    worst = 0.0
    for i, (ids5, l5) in enumerate(g["top5"]):
        worst = max(worst, float(np.max(np.abs(logits[i][ids5] - np.array(l5)))))
        if l5[0] - l5[1] > 10 * g["tol"]:
            assert int(np.argmax(logits[i])) == ids5[0], f"position {i}"
    assert worst < g["tol"], f"{ref.name}: max |logit - llama.cpp F32| = {worst}"
    assert ref.greedy(g["ids"], 8) == g["greedy"]


def test_gemma3_sliding_window_golden(ref):
    if ref.name != "gemma3":
        pytest.skip("gemma3 only")
    ids = [2] + (GEMMA_LONG_BODY * 40)[:599]
    ref.forward(ids[:-3], all_logits=False)
    logits = ref.forward(ids[-3:], start_pos=len(ids) - 3)
    worst = max(float(np.max(np.abs(logits[i][a] - np.array(b)))) for i, (a, b) in enumerate(GEMMA_LONG_TOP5))
    assert worst < 0.05, worst
    assert ref.greedy(ids, 4) == GEMMA_LONG_GREEDY


def test_trace_names_shapes_and_cache(ref):
    hp = ref.hp
    ids = GOLDEN_F32[ref.name]["ids"][:7]
    full = ref.forward(ids, trace=True)
    tr, order = ref.trace, ref.trace_order
    assert order[0] == "inp_embd" and order[-2:] == ["result_norm", "result_output"]
    assert len(order) == len(set(order)) == len(tr)
    t, L = len(ids), hp.n_layer - 1
    shapes = {
        "inp_embd": (t, hp.n_embd), f"attn_norm-{L}": (t, hp.n_embd), f"Qcur-{L}": (t, hp.n_head * hp.head_dim),
        f"Kcur-{L}": (t, hp.n_head_kv * hp.head_dim), f"Vcur-{L}": (t, hp.n_head_kv * hp.head_dim_v),
        f"Qcur_rope-{L}": (t, hp.n_head, hp.head_dim), f"Kcur_rope-{L}": (t, hp.n_head_kv, hp.head_dim),
        f"kq_soft_max-{L}": (hp.n_head, t, t), f"kqv_out-{L}": (t, hp.n_head * hp.head_dim_v),
        f"attn_out-{L}": (t, hp.n_embd), f"ffn_inp-{L}": (t, hp.n_embd), f"ffn_norm-{L}": (t, hp.n_embd),
        f"ffn_out-{L}": (t, hp.n_embd), f"l_out-{L}": (t, hp.n_embd), "result_norm": (t, hp.n_embd),
        "result_output": (t, hp.n_vocab),
    }
    if ref.name == "gemma3":
        shapes.update({"inp_scaled": (t, hp.n_embd), f"Qcur_normed-{L}": (t, hp.n_head, hp.head_dim),
                       f"attn_post_norm-{L}": (t, hp.n_embd), f"ffn_post_norm-{L}": (t, hp.n_embd)})
    for name, shape in shapes.items():
        assert tr[name].shape == shape, name
    p = tr["kq_soft_max-0"]
    assert np.allclose(p.sum(-1), 1.0, atol=1e-5) and np.all(np.triu(p, 1) == 0)       # causal
    assert np.array_equal(tr["result_output"], full)

    # KV cache: prefix then continuation == one prefill; a shorter start_pos rewrites the tail
    ref.forward(ids[:4])
    tail = ref.forward(ids[4:], start_pos=4)
    assert np.allclose(tail, full[4:], atol=1e-3 * np.abs(full).max())
    again = ref.forward(ids[2:], start_pos=2)
    assert np.allclose(again, full[2:], atol=1e-3 * np.abs(full).max())
    with pytest.raises(ValueError):
        ref.forward(ids, start_pos=ref.n_past + 1)
    last = ref.forward(ids, all_logits=False)
    assert last.shape == (1, hp.n_vocab) and np.allclose(last[0], full[-1], atol=1e-3 * np.abs(full).max())


def test_logit_lens_and_neighbours(ref, request):
    smollm2_unless_slow(ref.name, request, "the reference's lens and neighbours, the same code for every model")
    ids = GOLDEN_F32[ref.name]["ids"][:6]
    top, prob = ref.logit_lens(ids)
    assert top.shape == prob.shape == (ref.hp.n_layer, len(ids))
    assert np.array_equal(top[-1], np.argmax(ref.trace["result_output"], axis=-1))   # last layer = the model
    assert np.all((prob > 0) & (prob <= 1))
    tok = ids[-1]
    nb, sim = ref.neighbours(tok, k=5)
    assert len(nb) == 5 and tok not in nb and np.all(np.diff(sim) <= 0) and np.all(sim <= 1.0 + 1e-5)
    e = ref.w.get("token_embd.weight")
    cos = e[nb[0]] @ e[tok] / (np.linalg.norm(e[nb[0]]) * np.linalg.norm(e[tok]))
    assert sim[0] == pytest.approx(cos, rel=1e-4)
    nb2, sim2 = ref.neighbours(tok, k=3, include_self=True)
    assert nb2[0] == tok and sim2[0] == pytest.approx(1.0, abs=1e-5)


# -- against llama.cpp on the quantized file (tests/fixtures/<model>.json) ------------------------

def test_llama_cpp_fixture_logits(ref, request):
    """Teacher-forced over prompt + llama.cpp's greedy continuation: at every prompt position and
    every generated step, the reference's logits for llama.cpp's top-5 are within TOL, and its
    top-1 agrees except where llama.cpp's own top-2 gap is small."""
    smollm2_unless_slow(ref.name, request, "a quantized-reference check; the F32 golden values run by default")
    fx = _fixture(ref.name)
    t_max, t_mean, gap_tol = TOL[ref.name]
    worst, means = 0.0, []
    for p in fx["prompts"]:
        pid, gen = p["prompt_ids"], p["ids"]
        logits = ref.forward(pid + gen[:-1])
        n = len(pid)
        rows = [(i, p["top5"][i]) for i in range(n)] + [(n - 1 + j, p["gen_top5"][j]) for j in range(1, len(gen))]
        for i, t5 in rows:
            ids5, l5 = np.array(t5["ids"]), np.array(t5["logits"])
            d = np.abs(logits[i][ids5] - l5)
            worst = max(worst, float(d.max()))
            means.append(float(d.mean()))
            if int(np.argmax(logits[i])) != ids5[0]:
                gap = l5[0] - l5[1]
                short = float(logits[i].max() - logits[i][ids5[0]])
                assert gap < gap_tol and short < gap_tol, (
                    f"{p['prompt'][:30]!r} position {i}: llama.cpp top-1 {ids5[0]} (gap {gap:.3f}), "
                    f"reference top-1 {int(np.argmax(logits[i]))} ahead by {short:.3f}")
    assert worst < t_max, f"{ref.name}: max top-5 |logit diff| {worst:.3f}"
    assert np.mean(means) < t_mean, f"{ref.name}: mean top-5 |logit diff| {np.mean(means):.3f}"


def test_llama_cpp_fixture_greedy(ref, request):
    """Free-running greedy decoding (through the KV cache) equals llama.cpp's continuation up to
    its first near-tie (top-2 gap below TOL's gap)."""
    smollm2_unless_slow(ref.name, request, "a quantized-reference check; the F32 golden values run by default")
    fx = _fixture(ref.name)
    gap_tol = TOL[ref.name][2]
    compared = 0
    for p in fx["prompts"]:
        gaps = p["top2_gap"]
        k = next((j for j, g in enumerate(gaps) if g < gap_tol), len(gaps))
        if k == 0:
            continue
        assert ref.greedy(p["prompt_ids"], k) == p["ids"][:k], p["prompt"][:40]
        compared += k
    assert compared > 0
