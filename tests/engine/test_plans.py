"""Which op rotates Q and K in each plan (lab/engine/plans.py): decode's QKV projection where no q/k norm sits in
between, adjacent pairs or NeoX's (phi3) (its epilogue rotates and writes the cache: one dispatch fewer a layer), the
rope op everywhere else. The parity tests hold the numbers; this holds that the fused path is the one they ran.
Qwen3's and Gemma 3's synthetic files (q/k norms, 150-260k-row vocabularies: a 0.2-0.3 GB file each to write) run with
--slow; by default Qwen3.5's and Gemma 4's (q/k norms too, SmolLM2's vocabulary) hold the unfused case, on the layers
that write a cache of their own."""

from __future__ import annotations

import pytest

from lab.engine.engine import Engine, read_host_values
from lab.format import gguf
from lab.format.model import from_gguf
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.ops import KV_WRITE


@pytest.mark.parametrize("arch,fused", [("llama3", True), ("mistral", True), ("phi3", True), ("qwen35", False),
                                       ("gemma4", False), pytest.param("qwen3", False, marks=pytest.mark.slow),
                                       pytest.param("gemma3", False, marks=pytest.mark.slow)])
def test_decode_rotates_in_the_qkv_projection_where_it_can(device, arch, fused):
    path = synthetic_arch.build(arch, "f32", cache_dir() / "synthetic")
    header = gguf.read_file(path)
    cfg = from_gguf(header)
    eng = Engine(device, header, cfg, n_ctx=32, max_batch=8, host_values=read_host_values(path, header, cfg))
    try:
        decode, prefill = eng.plan_for(False), eng.plan_for(True)
        for il in eng.kv_layers:
            op = decode.ops[decode.at(f"Qcur_rope-{il}")]
            assert op.role == KV_WRITE and op.without_kv is not None
            assert op.kernel.label.split(":")[0] == ("matvec" if fused else "rope")
            assert prefill.ops[prefill.at(f"Qcur_rope-{il}")].kernel.label.split(":")[0] == "rope"
        rope_ops = sum(o.kernel.label.startswith("rope") for o in decode.ops)
        attending = sum(1 for tr in decode.trace if tr.name.startswith("Qcur_rope-"))
        assert rope_ops == (0 if fused else attending) and attending >= len(eng.kv_layers) > 0
    finally:
        eng.close()


def test_the_epilogue_counts_its_storage_buffers():
    """qkv_rope falls back to the rope op where the fused matvec would bind more than the adapter allows (8 by
    WebGPU's default): a K loop reads W twice, a bias and the caches add theirs."""
    from lab.ops.matmul import matvec_storage
    assert matvec_storage("Q8_0", norm=True, bias=False, rope=True) == 7      # W, x, y, norm w, xn, k, v
    assert matvec_storage("Q4_K", norm=True, bias=False, rope=True) == 8      # and W's vec4 view
    assert matvec_storage("Q4_K", norm=True, bias=True, rope=True) == 9
    assert matvec_storage("Q4_K", norm=True, bias=False, rope=True, x4=False) == 7   # the group loop: one view
    assert matvec_storage("IQ4_XS", norm=True, bias=False, rope=True) == 8    # W's vec2 view
    assert matvec_storage("Q3_K", norm=True, bias=False, rope=True) == 7      # Q2_K's and Q3_K's loops: W alone
    assert matvec_storage("IQ2_S", norm=True, bias=False, rope=True) == 8     # the grid loop's grid
    assert matvec_storage("IQ2_S", norm=True, bias=True, rope=True) == 9
    assert matvec_storage("IQ2_S", norm=True, bias=True, rope=True, x4=False) == 8   # the group loop: no grid binding
