"""The mixtures of experts natively (docs/moe.md), beyond tests/engine/test_architectures.py's parity with llama.cpp:
every traced tensor of a prefill and the decode step after it against the numpy reference (the router's logits and
the chosen weights included), and the experts' stacks cut over several storage bindings (whole experts a part, as a
stack past the 2 GB binding limit is) with the logits unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from lab.host.reference import Reference
from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir
from lab.ops import weights as weights_mod
from tests.conftest import MOE_SPECS
from tests.engine.hybrids import engine_on, prompt_ids, run, traced_names_matching_the_reference

REF_TOL = 1e-3      # engine vs numpy reference, relative to max |ref| (tests/engine/test_architectures.py's)


# qwen3moe's file is held to llama.cpp by default (test_architectures.py); each traced tensor against the reference
# with --slow
@pytest.mark.parametrize("spec", [pytest.param(s, marks=pytest.mark.slow) for s in MOE_SPECS])
def test_every_traced_tensor_matches_the_reference(spec):
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    eng, tok = engine_on(path, 96)
    try:
        names = traced_names_matching_the_reference(eng, tok, path)
        for il in eng.cfg.routed_layers:
            assert {f"ffn_norm-{il}", f"ffn_moe_logits-{il}", f"ffn_moe_weights_norm-{il}", f"l_out-{il}"} <= names
    finally:
        eng.close()


@pytest.mark.parametrize("mix", ["f32", pytest.param("q4_k_m", marks=pytest.mark.slow)])
def test_the_experts_split_over_bindings(mix, monkeypatch):
    """Each stack of 8 experts over 4 bindings (a binding of a third of the stack holds 2 whole experts, not 2.67): a
    part returns at once for a pair whose expert it does not hold, and the logits still match the reference."""
    alloc = weights_mod.alloc_weight

    def small(device, name, type, rows, cols, max_binding=None, kind=weights_mod.gpu.WEIGHTS, row_group=1):
        if "_exps" in name:
            max_binding = type.row_bytes(cols) * rows // 3 + 12
        return alloc(device, name, type, rows, cols, max_binding, kind, row_group)
    monkeypatch.setattr(weights_mod, "alloc_weight", small)
    path = synthetic_arch.build("lfm2moe", mix, cache_dir() / "synthetic")
    eng, tok = engine_on(path, 96)
    try:
        stacks = [e for key, runs in eng.weights.experts.items() for e, _ in runs]
        assert stacks and all([p.n_rows // e.per for p in e.weight.parts] == [2, 2, 2, 2]
                              for e in stacks)
        ids = prompt_ids(tok)
        eng.step(ids, 0)
        raw = run(eng.device.read(eng.scratch.logits, 0, 4 * len(ids) * eng.cfg.n_vocab))
        got = np.frombuffer(raw, np.float32).reshape(len(ids), -1)
        want = Reference(path).forward(ids)
        assert float(np.abs(got - want).max() / np.abs(want).max()) <= REF_TOL
    finally:
        eng.close()
