"""smollm3 (llama_model_smollm3): llama's layout, with every fourth layer unrotated (NoPE).

The NoPE step is no key: llama_model_smollm3::load_arch_hparams fixes it at 4 (layers 3, 7, ... have no RoPE).
"""

from __future__ import annotations

from lab.format.arches.base import Arch

ARCH = Arch("smollm3", whole_head_rope=True, no_rope_step=4)
