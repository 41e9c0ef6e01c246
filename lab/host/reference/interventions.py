"""The numpy side of lab/instruments/interventions.py: the same `Intervention`s as hooks on the reference forward
(`Reference.hooks`, name -> fn), so a GPU run with interventions can be held to the reference with the same ones.

Positions are absolute: the reference runs from position 0, so row j is position j.

The expert site takes two hooks a layer: one on `ffn_moe_topk-L` keeps the step's chosen experts (returned as they
are), one on `ffn_moe_weights_norm-L` zeroes or scales the named experts' weights where a token chose them, the other
weights left as they are (not renormalised), which the reference's weighted sum then takes.
"""

from __future__ import annotations

import numpy as np

from lab.instruments.interventions import EVERY, Intervention

GLU = {"silu": "ffn_swiglu", "gelu": "ffn_geglu"}


def hooks(ivs: list[Intervention], head_dim: int, ffn_act: str = "silu") -> dict:
    """name -> fn(x) applying every intervention on that traced point, in the order given."""
    prefix = {"attn": "kqv_out", "mlp": GLU[ffn_act], "resid": "l_out"}
    by_name: dict[str, list[Intervention]] = {}
    experts: dict[int, list[Intervention]] = {}
    for iv in ivs:
        if iv.site == "expert":
            experts.setdefault(iv.layer, []).append(iv)
        else:
            by_name.setdefault(f"{prefix[iv.site]}-{iv.layer}", []).append(iv)

    def make(group):
        def apply(x):
            x = np.array(x, copy=True)
            flat = x.reshape(x.shape[0], -1)
            for iv in group:
                r0, r1 = iv.positions or EVERY
                rows = slice(min(r0, len(flat)), min(r1, len(flat)))
                cols = ([np.arange(h * head_dim, (h + 1) * head_dim) for h in iv.heads] if iv.heads is not None
                        else [np.arange(flat.shape[1])])
                k = 0
                for c in cols:
                    vals = None if iv.values is None else np.asarray(iv.values[k:k + len(c)], flat.dtype)
                    k += len(c)
                    block = flat[rows][:, c]
                    if iv.op == "zero":
                        block = np.zeros_like(block)
                    elif iv.op == "set":
                        block = np.broadcast_to(vals, block.shape)
                    elif iv.op == "add":
                        block = block + vals
                    else:
                        block = block * flat.dtype.type(iv.scale)
                    flat[rows, c[0]:c[-1] + 1] = block
            return flat.reshape(x.shape)
        return apply
    out = {name: make(group) for name, group in by_name.items()}
    for layer, group in experts.items():
        out.update(_expert_hooks(layer, group))
    return out


def _expert_hooks(layer: int, group: list[Intervention]) -> dict:
    """The chosen experts of layer `layer` kept as the step routes them, then the named experts' weights changed."""
    chosen = {}

    def keep(ids):
        chosen["ids"] = np.asarray(ids)
        return ids

    def weigh(w):
        w = np.array(w, copy=True)
        row = np.arange(w.shape[0])[:, None]
        for iv in group:
            r0, r1 = iv.positions or EVERY
            for e in iv.experts:
                hit = (chosen["ids"] == e) & (row >= r0) & (row < r1)
                w[hit] = 0 if iv.op == "zero" else w[hit] * w.dtype.type(iv.scale)
        return w
    return {f"ffn_moe_topk-{layer}": keep, f"ffn_moe_weights_norm-{layer}": weigh}
