"""The four experiments on Qwen2.5 and Gemma 3 (the real files; SmolLM2 is tests/engine/test_experiments.py's and
test_interventions.py's), natively, behind --slow (each model's runs take a minute or two on lavapipe): attribution's
bars sum to the logit and a layer's heads to its block, the last-layer check of patching is exact, an ablated head
changes the target's log-probability, and steering at scale 0 is the plain reply."""

from __future__ import annotations

import pytest

from lab.host.experiments import Lab

PROMPT, CORRUPT, TARGET = "The capital of France is", "The capital of Italy is", " Paris"


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen_path", "gemma_path"])
def test_the_four_experiments(request, device, model):
    lab = Lab.load(request.getfixturevalue(model), 64, device=device)
    try:
        ids, target = lab.encode(PROMPT), lab.token(TARGET)
        att = lab.attribute(ids, target)
        scale = max(1.0, abs(att["logit"]))
        assert abs(att["remainder"]) <= 1e-4 * scale
        for r in att["rows"]:
            assert abs(sum(r["heads"]) - r["attn"]) <= 1e-4 * scale
        last = lab.engine.cfg.n_layer - 1
        out = lab.ablate(ids, target, layers=[last], heads=[0, 1])
        assert len(out["rows"]) == 2 and any(abs(r["delta"]) > 1e-4 for r in out["rows"])
        corrupt = lab.encode(CORRUPT)
        assert len(corrupt) == len(ids)
        patched = lab.patch(ids, corrupt, target, layers=[0, last])
        assert patched["sanity"]["exact"] and patched["recovery"][1][-1] == pytest.approx(1.0, abs=1e-3)
        vec = lab.steering_vector([lab.encode("I love this")], [lab.encode("I hate this")], last // 2)
        assert lab.steer(ids, vec, last // 2, 0.0, 3).ids == lab.generate(ids, 3).ids
    finally:
        lab.close()
