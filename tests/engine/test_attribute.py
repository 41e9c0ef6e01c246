"""Direct logit attribution (lab/host/attribute.py) natively on lavapipe: the GPU's numbers against the same
computation on the numpy reference forward's traces, the bars summing to the logit, the heads to their block, and the
CLI's JSON.

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

from lab.engine.engine import Engine
from lab.format import gguf
from lab.host import attribute, cli
from lab.host.reference.forward import Reference
from lab.host.reference.weights import Weights
from lab.text.tokenizer import from_metadata

TOL = 2e-3
REMAINDER = 1e-4
PROMPT = "The capital of France is"


def _attribution(device, path, target_text):
    header = gguf.read_file(path)
    tok = from_metadata(header.metadata)
    ids = tok.encode(PROMPT, add_bos=tok.add_bos)
    target = cli.target_id(tok, target_text)
    eng = Engine(device, header, n_ctx=64, max_batch=16)
    try:
        eng.weights.upload_file(path)
        w = Weights(path)
        gpu = attribute.attribute_sync(eng, w, ids, target)
    finally:
        eng.close()
    ref = Reference(path)
    ref.forward(ids, trace=True)
    want = attribute.from_trace(ref.trace, w, target)
    return gpu, want


@pytest.mark.parametrize("model,target", [("smollm2_path", " Paris"), ("gemma_path", " Paris")])
def test_gpu_attribution_matches_the_reference(request, device, model, target):
    gpu, want = _attribution(device, request.getfixturevalue(model), target)
    scale = max(1.0, abs(want.logit))
    assert abs(gpu.logit - want.logit) <= TOL * scale
    got = np.array([[r.attn, r.mlp] + r.heads for r in gpu.rows])
    ref = np.array([[r.attn, r.mlp] + r.heads for r in want.rows])
    err = np.abs(got - ref).max() / scale
    assert err <= TOL, f"a share differs from the reference's by {err:.3g} of the logit"
    assert abs(gpu.embedding - want.embedding) <= TOL * scale
    # the bars sum to the logit, and each layer's heads to its attention block
    assert abs(gpu.remainder) <= REMAINDER * scale and abs(want.remainder) <= REMAINDER * scale
    for r in gpu.rows:
        assert abs(sum(r.heads) - r.attn) <= REMAINDER * scale, f"layer {r.layer}: heads do not sum to the block"


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
        cli.target_id(tok, " Parisian capitals")
