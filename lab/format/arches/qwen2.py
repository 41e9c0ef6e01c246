"""qwen2: llama's blocks with biases on Q, K and V, rotated by NeoX pairs."""

from __future__ import annotations

from lab.format.arches.base import Arch

ARCH = Arch("qwen2", rope_neox=True, qkv_bias=True)
