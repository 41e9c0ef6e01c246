"""qwen3: llama's blocks with a per-head RMSNorm on Q and K (no biases), rotated by NeoX pairs."""

from __future__ import annotations

from lab.format.arches.base import Arch

ARCH = Arch("qwen3", rope_neox=True, qk_norm=True)
