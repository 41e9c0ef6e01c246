"""phi3: one fused attn_qkv tensor and one ffn_up of [gate | up] rows per block, rotated by NeoX pairs.

Its attention.sliding_window is read, then switched off as llama.cpp does ("Phi SWA is currently disabled"): full
causal attention. LongRoPE's factors (Phi-3 128k) are refused by lab.format.model with every other file's.
"""

from __future__ import annotations

from lab.format.arches.base import Arch
from lab.format.rules import SLIDING_WINDOW

ARCH = Arch(
    "phi3",
    keys={"attention.sliding_window": SLIDING_WINDOW},
    rope_neox=True,
    fused=True,
    per_block=6,    # q/k/v fused into one tensor and gate/up into another
)
