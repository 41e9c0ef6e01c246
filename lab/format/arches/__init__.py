"""The architectures this lab runs, one module each, and the registry lab.format.model and lab.format.checks read.

Each module (llama, smollm3, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, lfm2, lfm2moe, qwen35, gemma4) makes one `Arch`
(lab.format.arches.base), named `ARCH`: its keys, its Config flags, its tensors and its own reading steps. Adding an
architecture is one module and one line here; nothing outside this package tests an architecture's name.

`REGISTRY`: general.architecture -> Arch, in the order messages list them (`ARCHITECTURES`). `REFUSED`: the names
of variants a user may well bring (their mixture-of-experts sizes), each with the reason, gathered from the modules.

base < the architectures' modules < this registry.
"""

from __future__ import annotations

from lab.format.arches import (gemma2, gemma3, gemma4, lfm2, lfm2moe, llama, phi3, qwen2, qwen3, qwen3moe, qwen35,
                               smollm3)
from lab.format.arches.base import Arch

REGISTRY: dict[str, Arch] = {m.ARCH.name: m.ARCH for m in
                             (llama, smollm3, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, lfm2, lfm2moe, qwen35, gemma4)}
ARCHITECTURES = tuple(REGISTRY)
# Architectures a user may well bring, refused by name with the reason (anything else: "unsupported architecture").
REFUSED: dict[str, str] = {name: why for arch in REGISTRY.values() for name, why in arch.refused_variants.items()}
