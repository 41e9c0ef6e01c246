"""Interventions (lab/instruments/interventions.py, driven through lab/host/experiments.py's Lab) natively on lavapipe: no-op interventions
leave the logits bit-identical, real ones match the numpy reference forward with the same hooks
(lab/host/reference/interventions.py), a patch of every position of the last residual reproduces the clean run
exactly, and the CLI's JSON.

Tolerance: the GPU forward and the numpy reference agree within a few f32 ulps per op (docs/correctness.md): the
logits within LOGIT_TOL = 2e-3 of their largest magnitude. Ablating SmolLM2's head 23.4 on "The capital of France is"
moves the " Paris" logit by about 2 (of 17); the neighbouring head by under 0.3: a wrong head, layer or site fails.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from lab.host import cli
from lab.host.experiments import Lab
from lab.host.reference.forward import Reference
from lab.host.reference.interventions import hooks
from lab.instruments.interventions import Intervention, InterventionError

LOGIT_TOL = 2e-3
PROMPT = "The capital of France is"
PLAIN: dict = {}                 # the reference's logits without interventions, made once


@pytest.fixture(scope="module")
def smol(device, smollm2_path):
    lab = Lab.load(smollm2_path, 64, device=device)
    yield lab, Reference(smollm2_path)
    lab.close()


def _ref(ref, lab, ids, ivs):
    ref.reset()
    ref.hooks = hooks(ivs, lab.exp.runner.head_dim)
    try:
        return ref.forward(ids)[-1].astype(np.float64)
    finally:
        ref.hooks = {}


def _err(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max()


def test_no_op_interventions_are_bit_identical(smol):
    lab, _ = smol
    eng = lab.engine
    ids = lab.encode(PROMPT, bos=False)
    eng.step(ids, 0)
    plain = np.frombuffer(asyncio.run(eng.device.read(eng.scratch.logits, 0, 4 * eng.cfg.n_vocab)), np.float32)
    same = lab.trace(ids, ["l_out-5"])["l_out-5"]
    for ivs in ([], [Intervention("attn", 3, "scale", scale=1.0)],
                [Intervention("mlp", 7, "add", values=(0.0,) * eng.cfg.n_ff)],
                [Intervention("resid", 5, "set", positions=(2, 3), values=tuple(float(v) for v in same[2]))]):
        assert np.array_equal(lab.logits(ids, ivs), plain), ivs


@pytest.mark.parametrize("ivs", [
    [Intervention("attn", 23, "zero", heads=(4,))],
    [Intervention("attn", 10, "scale", heads=(0, 8), scale=-2.0, positions=(1, 4))],
    [Intervention("mlp", 27, "zero", positions=(4, 5))],
    [Intervention("resid", 12, "add", positions=(3, 4), values=tuple(np.linspace(-1, 1, 576)))],
], ids=["head", "heads-scaled", "mlp", "resid-add"])
def test_interventions_match_the_reference(smol, ivs):
    lab, ref = smol
    ids = lab.encode(PROMPT, bos=False)
    got, want = lab.logits(ids, ivs), _ref(ref, lab, ids, ivs)
    assert _err(got, want) <= LOGIT_TOL
    if "plain" not in PLAIN:
        PLAIN["plain"] = _ref(ref, lab, ids, [])
    plain = PLAIN["plain"]
    assert _err(plain, want) > 10 * LOGIT_TOL, "the intervention must change the logits for this test to mean anything"


def test_a_neighbouring_head_is_not_the_head(smol):
    """The test above fails when the op lands on another head: head 23.3's ablation is far from head 23.4's."""
    lab, ref = smol
    ids = lab.encode(PROMPT, bos=False)
    got = lab.logits(ids, [Intervention("attn", 23, "zero", heads=(4,))])
    other = _ref(ref, lab, ids, [Intervention("attn", 23, "zero", heads=(3,))])
    assert _err(got, other) > 10 * LOGIT_TOL


def test_patching_the_last_residual_everywhere_is_the_clean_run(smol):
    lab, _ = smol
    clean, corrupt = lab.encode(PROMPT), lab.encode("The capital of Italy is")
    assert len(clean) == len(corrupt)
    n = lab.engine.cfg.n_layer
    last = lab.trace(clean, [f"l_out-{n - 1}"])[f"l_out-{n - 1}"]
    ivs = [Intervention("resid", n - 1, "set", positions=(p, p + 1),
                        values=tuple(float(v) for v in last[p])) for p in range(len(clean))]
    assert np.array_equal(lab.logits(corrupt, ivs), lab.logits(clean))


def test_refusals(smol):
    lab, _ = smol
    for iv, needle in [(Intervention("mlp", 0, "zero", heads=(1,)), "site 'attn' only"),
                       (Intervention("attn", 30, "zero"), "layers 0 .. 29"),
                       (Intervention("attn", 0, "zero", heads=(9,)), "query heads 0 .. 8"),
                       (Intervention("resid", 0, "set", values=(1.0,)), "needs 576 values")]:
        with pytest.raises(InterventionError, match=needle):
            lab.logits(lab.encode(PROMPT), [iv])
    with pytest.raises(InterventionError, match="two tokens"):
        lab.logits(lab.encode(" Paris", bos=False), [Intervention("mlp", 0, "zero")])
    with pytest.raises(InterventionError, match="same number of tokens"):
        lab.patch(lab.encode(PROMPT), lab.encode("The capital of the United Kingdom is"), 1)


def test_cli_ablate_and_patch_json(smollm2_path, capsys):
    assert cli.main(["ablate", str(smollm2_path), "--prompt", PROMPT, "--target", " Paris", "--layer", "23",
                     "--heads", "3,4", "--ctx", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"target_id", "base_logprob", "rows", "top5_before"} <= set(out) and not out["stopped"]
    assert [(r["layer"], r["head"]) for r in out["rows"]] == [(23, 3), (23, 4)]
    assert out["rows"][1]["delta"] < -1.0 < out["rows"][0]["delta"]      # head 4 moves " Paris"; head 3 barely
    assert cli.main(["patch", str(smollm2_path), "--clean", PROMPT, "--corrupt", "The capital of Italy is",
                     "--target", " Paris", "--layers", "0,29", "--ctx", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"target_id", "foil_id", "clean_diff", "corrupt_diff", "positions", "recovery"} <= set(out)
    assert len(out["recovery"]) == 2 and len(out["recovery"][0]) == len(out["positions"])
    # the last layer's residual at the last position carries the whole answer
    assert out["recovery"][1][-1] == pytest.approx(1.0, abs=1e-3)
    assert out["sanity"]["exact"] and out["sanity"]["diff"] == out["clean_diff"] and out["runs"] == 10
