"""Direct logit attribution (`lab attribute`, and a Python API for notebooks): how much each layer's attention block,
each of its heads, and each MLP block writes onto one token's logit at the last position.

The residual stream is a sum: x_final = embedding + sum over layers of (attention block output + MLP block output).
The final norm is linear once its scale is frozen at the run's own value: norm(x) = x * w / rms(x_final), so each term
v contributes dot(v * w / rms, W_U[target]) to the logit, and the terms sum to the logit itself (the remainder is what
is not linear: gemma2's final soft-cap; float rounding otherwise). The block outputs are read as differences of the
traced residuals (`ffn_inp-L` minus the residual entering layer L; `l_out-L` minus `ffn_inp-L`), so they are exactly
what each block added, post-norms included (gemma3). A head's share is its slice of `kqv_out-L` through its columns
of `attn_output.weight` (the projection has no bias in the architectures the lab runs); where a post-norm follows the
projection (gemma3) it is frozen the same way, at the run's own scale, so the heads still sum to their block.

The traces come from the GPU engine (`Engine.traced`: the prefill plan run op by op) or from the numpy reference
(`Reference.forward(trace=True)`): `from_trace` computes the same numbers from either, which is how the test holds
the GPU's attribution to the reference's. The weights the projection needs (output_norm, the target's row of the
unembedding, attn_output and post_attention_norm) are dequantized by lab/host/reference/weights.py.

What it does not know: the page (a page card needs this without numpy), sampling, sessions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from lab.host.reference.weights import Hparams, Weights


@dataclass
class Row:
    layer: int
    attn: float
    mlp: float
    heads: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"layer": self.layer, "attn": self.attn, "mlp": self.mlp, "heads": self.heads}


@dataclass
class Attribution:
    target_id: int
    logit: float                 # the target's logit at the last position, as the model computed it
    embedding: float             # the token embedding's share
    rows: list[Row]
    remainder: float             # logit - (embedding + every block): the non-linear rest and rounding

    def to_dict(self) -> dict:
        return {"target_id": self.target_id, "logit": self.logit, "embedding": self.embedding,
                "rows": [r.to_dict() for r in self.rows], "remainder": self.remainder}


def _rms_norm_rows(x: np.ndarray, eps: float) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=-1) + eps)


def from_trace(trace: dict[str, np.ndarray], w: Weights, target_id: int) -> Attribution:
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
        rows.append(Row(il, share(attn), share(mlp), [share(h) for h in heads]))
        before = after
    logit = float(last["result_output"][target_id])
    total = share(embd) + sum(r.attn + r.mlp for r in rows)
    return Attribution(target_id, logit, share(embd), rows, logit - total)


async def attribute(engine, w: Weights, ids: list[int], target_id: int) -> Attribution:
    """The attribution of `target_id` after `ids` (from position 0: the engine's KV cache is overwritten), traced on
    the GPU through the engine's prefill plan."""
    if not 1 <= len(ids) <= engine.max_batch:
        raise ValueError(f"a prompt of {len(ids)} tokens: 1 .. {engine.max_batch} (one prefill step)")
    engine.check_ids([target_id], ValueError, "the target: ")
    raw = await engine.traced(ids, 0)
    trace = {name: np.frombuffer(b, np.float32) for name, b in raw.items()}
    widths = {tr.name: tr.width for tr in engine.step_plan(len(ids), 0).trace}
    trace = {name: a.reshape(-1, widths[name]) for name, a in trace.items()}
    return from_trace(trace, w, target_id)


def attribute_sync(engine, w: Weights, ids: list[int], target_id: int) -> Attribution:
    """`attribute` for scripts and notebooks."""
    return asyncio.run(attribute(engine, w, ids, target_id))
