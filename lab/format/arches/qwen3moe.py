"""qwen3moe (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head Q/K norms, NeoX RoPE) with every layer's
FFN routed over experts: llama.cpp's src/models/qwen3moe.cpp routes by softmax, the top expert_used_count experts,
their weights renormalised; an expert is expert_feed_forward_length wide, or feed_forward_length / expert_used_count
where the file has no such key (llama_model_qwen3moe::load_arch_tensors)."""

from __future__ import annotations

from lab.format.arches.base import Arch
from lab.format.rules import EXPERT_KEYS

ARCH = Arch("qwen3moe", keys=EXPERT_KEYS, rope_neox=True, qk_norm=True, experts="required",
            expert_width="key_or_split")
