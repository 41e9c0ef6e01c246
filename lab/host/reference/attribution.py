"""Direct logit attribution's oracle: the numbers lab/instruments/experiments.py `Experiments.attribute` computes on
the GPU, computed in float64 from the numpy reference forward's traces (`Reference.forward(trace=True)`), with the
weights dequantized by lab/host/reference/weights.py (tests/engine/test_attribute.py holds the one to the other).

The residual stream is a sum: x_final = embedding + sum over layers of (attention block output + MLP block output).
The final norm is linear once its scale is frozen at the run's own value: norm(x) = x * w / rms(x_final), so each term
v contributes dot(v * w / rms, W_U[target]) to the logit, and the terms sum to the logit itself. The block outputs are
differences of the traced residuals; a head's share is its slice of `kqv_out-L` through its columns of
`attn_output.weight`, frozen through gemma3's post-norm at the run's scale.
"""

from __future__ import annotations

import numpy as np

from lab.host.reference.weights import Hparams, Weights


def _rms_norm_rows(x: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=-1) + eps)


def from_trace(trace: dict[str, np.ndarray], w: Weights, target_id: int) -> dict:
    """The attribution at the last row of each traced tensor (name -> [rows, width] float arrays, llama.cpp's
    eval-callback names; `result_output` may hold one row, the last)."""
    hp = Hparams.from_weights(w)
    f64 = np.float64
    last = {name: np.asarray(a, f64).reshape(-1, np.asarray(a).shape[-1])[-1] for name, a in trace.items()}
    x_final = last[f"l_out-{hp.n_layer - 1}"]
    out_name = "output.weight" if "output.weight" in w else "token_embd.weight"
    u = w.rows(out_name, [target_id])[0].astype(f64)
    proj = np.asarray(w.get("output_norm.weight"), f64) * u / _rms_norm_rows(x_final, hp.eps)

    def share(v: np.ndarray) -> float:
        return float(v @ proj)

    embd = last["inp_scaled"] if "inp_scaled" in last else last["inp_embd"]
    rows, before = [], embd
    hd = hp.head_dim
    for il in range(hp.n_layer):
        mid, after = last[f"ffn_inp-{il}"], last[f"l_out-{il}"]
        attn, mlp = mid - before, after - mid
        o = last[f"kqv_out-{il}"]
        wo = np.asarray(w.get(f"blk.{il}.attn_output.weight"), f64)          # (n_embd, n_head * hd)
        heads = [wo[:, h * hd:(h + 1) * hd] @ o[h * hd:(h + 1) * hd] for h in range(hp.n_head)]
        if hp.post_norms:       # the block added norm(o_proj): frozen at the run's scale, a head's share is linear
            proj_all = sum(heads)
            scale = np.asarray(w.get(f"blk.{il}.post_attention_norm.weight"), f64) / _rms_norm_rows(proj_all, hp.eps)
            heads = [h * scale for h in heads]
        rows.append({"layer": il, "attn": share(attn), "mlp": share(mlp), "heads": [share(h) for h in heads]})
        before = after
    logit = float(last["result_output"][target_id])
    total = share(embd) + sum(r["attn"] + r["mlp"] for r in rows)
    return {"target_id": target_id, "logit": logit, "embedding": share(embd), "rows": rows, "remainder": logit - total}
