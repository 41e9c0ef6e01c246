"""llama (llama.cpp's llama loader): the plain decoder the others vary. Adjacent-pair RoPE (NORM) over the whole
head, SwiGLU, separate Q, K and V. Llama 3's rope_scaling comes as a tensor, rope_freqs.weight.

Sliding windows: llama.cpp's llama loader never reads attention.sliding_window (Mistral-style files run with full
causal attention there, and here), so this module does not read it either.

Mixtral-style files are llama files with experts (expert_count > 0): every layer's FFN is then a router and stacked
experts of feed_forward_length, routed by softmax over the top expert_used_count, weights renormalised (the MoE
branch of src/models/llama.cpp).
"""

from __future__ import annotations

from lab.format.arches.base import Arch
from lab.format.rules import EXPERT_KEYS

ARCH = Arch(
    "llama",
    # llama.cpp loads rope_freqs for llama (and applies it to every layer); any other architecture's file with one is
    # refused by check_tensors as a tensor it does not read
    rope_freqs=True,
    whole_head_rope=True,       # llama.cpp: "invalid n_rot" / GGML_ASSERT
    keys=EXPERT_KEYS, experts="optional", expert_width="n_ff",
)
