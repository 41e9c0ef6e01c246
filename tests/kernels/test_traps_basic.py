"""Broken kernels the checks must catch: each trap rewrites the real WGSL by text substitution (`Patched`
refuses a substitution whose text is missing) and requires the corresponding check to fail."""

import pytest
from checks import (
    check_argmax,
    check_fill_zero,
    check_glu,
    check_rms_norm,
    check_rope,
    check_softmax,
    check_topk,
    env,  # noqa: F401  (fixtures)
    env1,  # noqa: F401
    open_env,
    patched,
)

from lab.ops.rows import Rows


def test_softmax_without_max_subtraction(env):  # noqa: F811
    bad = patched(env, "softmax", " - mx)", ")")
    with pytest.raises(AssertionError, match="non-finite|exceeds"):
        check_softmax(bad, t=5, pos=7, n=1000, lo=100.0, hi=1000.0)
    check_softmax(env, t=5, pos=7, n=1000, lo=100.0, hi=1000.0)   # the real kernel passes the same check


@pytest.mark.parametrize("mode,old,new", [
    ("neox", "vec2<u32>(i, i + p.half)", "vec2<u32>(2u * i, 2u * i + 1u)"),
    ("adjacent", "vec2<u32>(2u * i, 2u * i + 1u)", "vec2<u32>(i, i + p.half)"),
])
def test_rope_other_pairing(env1, mode, old, new):  # noqa: F811
    bad = patched(env1, "rope", old, new)
    with pytest.raises(AssertionError, match="exceeds"):
        check_rope(bad, mode, t=5, pos=7, n_head=4, head_dim=64)


def test_rope_position_ignores_step_pos(env1):  # noqa: F811
    bad = patched(env1, "rope", "f32(step.pos + row)", "f32(row)")
    with pytest.raises(AssertionError, match="exceeds"):
        check_rope(bad, "neox", t=5, pos=7, n_head=2, head_dim=32)


def test_rmsnorm_eps_outside_sqrt(env):  # noqa: F811
    bad = patched(env, "norm", "inverseSqrt(ms + p.eps)", "1.0 / (sqrt(ms) + p.eps)")
    with pytest.raises(AssertionError, match="exceeds"):
        check_rms_norm(bad, t=5, pos=7, n=1000, eps=1e-5)


def test_rmsnorm_mean_over_wrong_count(env):  # noqa: F811
    bad = patched(env, "norm", "/ f32(p.group)", "/ f32(p.group + 1u)")
    with pytest.raises(AssertionError, match="exceeds"):
        check_rms_norm(bad, t=3, pos=7, n=6 * 72, eps=1e-6, group=72)


def test_glu_gate_and_up_swapped(env1):  # noqa: F811
    bad = patched(env1, "glu", "silu(gate[i.x]) * up[i.y]", "silu(up[i.y]) * gate[i.x]")
    with pytest.raises(AssertionError, match="exceeds"):
        check_glu(bad, "swiglu", fused=True, t=5, pos=7, n=300)


def test_geglu_tanh_clamped_too_tightly(env1):  # noqa: F811
    bad = patched(env1, "glu", "-10.0, 10.0", "-1.0, 1.0")
    with pytest.raises(AssertionError, match="exceeds"):
        check_glu(bad, "geglu", fused=False, t=5, pos=7, n=300)


def test_argmax_ties_to_highest_index(env):  # noqa: F811
    bad = patched(env, "sample", "a.index < b.index", "a.index > b.index")
    with pytest.raises(AssertionError, match="argmax"):
        check_argmax(bad, n=262_144, rows=Rows.fixed(1), ties=True)


def test_topk_unsorted_when_round_exclusion_dropped(env):  # noqa: F811
    bad = patched(env, "sample", "(q == 0u || better(prev, e))", "(true)")
    with pytest.raises(AssertionError, match="top_k"):
        check_topk(bad, n=9000, k=16)


def test_subgroup_partials_misplaced():
    sg = open_env("subgroups")       # the text is live only on the subgroup path
    bad = patched(sg, "norm", "red[li / sg_size] = s;", "red[li % sg_size] = s;")
    # The misplaced partials leave some slots unwritten: workgroup memory then holds whatever it held,
    # which gives a wrong sum or a NaN depending on the run. Either way the check must fail.
    with pytest.raises(AssertionError, match="non-finite|exceeds"):
        check_rms_norm(bad, t=5, pos=7, n=1000, eps=1e-5)


def test_paths_compile_differently(env):  # noqa: F811
    from lab.gpu import shaders
    from lab.ops.rows import WGSL as ROWS_WGSL
    src = shaders.source("sample", WG=256, EPT=4, **ROWS_WGSL, **shaders.subgroup_consts(env.device))
    live = [ln for ln in src.splitlines() if "subgroupMax(" in ln and not ln.lstrip().startswith("//")]
    assert bool(live) == (env.name == "subgroups")


def test_fill_zero_without_fold(env1):  # noqa: F811
    bad = patched(env1, "elementwise", "return gid.x + gid.y * (nwg.x * WG);", "return gid.x;")
    with pytest.raises(AssertionError, match="non-zero"):
        check_fill_zero(bad, 65535 * 64 + 1000, wg=64)
