"""Direct logit attribution (lab/instruments/experiments.py `Experiments.attribute`: traces and per-head projections on
the GPU, the rest in pure Python) natively on lavapipe, against the float64 oracle on the numpy reference forward's
traces (lab/host/reference/attribution.py), the bars summing to the logit, the heads to their block, and the CLI's
JSON.

Tolerances. The GPU forward and the numpy reference agree within a few f32 ulps per op (docs/correctness.md); a share
is a dot product of a block's output with the projected unembedding row, so each agrees within ~1e-4 of the logit's
magnitude: TOL = 2e-3 x max(1, |logit|). Shares of the wrong layer or block differ by 1e-2 and more (layer 23's
attention gives +3.3 of SmolLM2's 17.4 " Paris" logit, its neighbours under 0.3). The remainder is float rounding on
these architectures (no final soft-cap): REMAINDER = 1e-4 x max(1, |logit|).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.format import gguf
from lab.host import cli
from lab.host.experiments import Lab
from lab.host.reference.attribution import from_trace
from lab.host.reference.forward import Reference
from lab.text.tokenizer import from_metadata
from lab.text.tokens import token_id

TOL = 2e-3
REMAINDER = 1e-4
PROMPT = "The capital of France is"


def _attribution(device, path, target_text):
    lab = Lab.load(path, 64, device=device)
    try:
        ids = lab.encode(PROMPT)
        target = lab.token(target_text)
        gpu = lab.attribute(ids, target)
    finally:
        lab.close()
    ref = Reference(path)
    ref.forward(ids, trace=True)
    want = from_trace(ref.trace, ref.w, target)        # the forward's own dequantized weights: read once
    return gpu, want


def _shares(a: dict) -> np.ndarray:
    return np.array([[r["attn"], r["mlp"]] + r["heads"] for r in a["rows"]])


# gemma3's (its post-norms frozen at the run's scale) with --slow: 29 s of the default run
@pytest.mark.parametrize("model,target", [("smollm2_path", " Paris"),
                                          pytest.param("gemma_path", " Paris", marks=pytest.mark.slow)])
def test_gpu_attribution_matches_the_reference(request, device, model, target):
    gpu, want = _attribution(device, request.getfixturevalue(model), target)
    scale = max(1.0, abs(want["logit"]))
    assert abs(gpu["logit"] - want["logit"]) <= TOL * scale
    err = np.abs(_shares(gpu) - _shares(want)).max() / scale
    assert err <= TOL, f"a share differs from the reference's by {err:.3g} of the logit"
    assert abs(gpu["embedding"] - want["embedding"]) <= TOL * scale
    # the bars sum to the logit, and each layer's heads to its attention block
    assert abs(gpu["remainder"]) <= REMAINDER * scale and abs(want["remainder"]) <= REMAINDER * scale
    for r in gpu["rows"]:
        assert abs(sum(r["heads"]) - r["attn"]) <= REMAINDER * scale, f"layer {r['layer']}: heads != the block"


def test_cli_json_and_targets(smollm2_path, capsys):
    assert cli.main(["attribute", str(smollm2_path), "--prompt", PROMPT, "--target", " Paris", "--ctx", "64",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"target_id", "logit", "embedding", "rows", "remainder"}
    assert set(out["rows"][0]) == {"layer", "attn", "mlp", "heads"} and len(out["rows"]) == 30
    assert len(out["rows"][0]["heads"]) == 9
    assert cli.main(["attribute", str(smollm2_path), "--prompt", PROMPT, "--target", f"#{out['target_id']}",
                     "--ctx", "64", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["logit"] == out["logit"]
    tok = from_metadata(gguf.read_file(smollm2_path).metadata)
    with pytest.raises(ValueError, match="not one"):
        token_id(tok, " Parisian capitals")
    for bad, needle in [("#x", "takes a number"), (f"#{tok.vocab_size}", "ids 0 .."), ("", "empty")]:
        with pytest.raises(ValueError, match=needle):
            token_id(tok, bad)
