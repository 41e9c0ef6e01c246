"""gemma2: GeGLU blocks with post-norms, the embeddings scaled by sqrt(n_embd), the head always token_embd, NeoX
RoPE; a sliding window on every other layer and tanh soft-caps on the attention scores and the logits."""

from __future__ import annotations

from lab.format.arches.base import Arch, swa_pattern
from lab.format.rules import ATTN_SOFTCAP, FINAL_SOFTCAP, FREQ_BASE_SWA, SLIDING_PATTERN, SLIDING_WINDOW


def _sliding(kv: dict, n_layer: int, rope_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(window, sliding, rope_base_local) as llama.cpp's gemma2 loader sets them: always on, 4096 unless the key says
    otherwise, every other layer (pattern 2: even layers slide); the sliding layers' base defaults to the global one."""
    window = kv.get("attention.sliding_window", 4096)
    period = kv.get("attention.sliding_window_pattern", 2)
    return window, swa_pattern(window, period, n_layer), float(kv.get("rope.freq_base_swa", rope_base))


def _softcaps(kv: dict, window: int) -> tuple[float, float]:
    """(attention cap, final cap): gemma2 always caps (llama_hparams defaults 50 / 30 when the keys are absent)."""
    return float(kv.get("attn_logit_softcapping", 50.0)), float(kv.get("final_logit_softcapping", 30.0))


ARCH = Arch(
    "gemma2",
    keys={"attention.sliding_window": SLIDING_WINDOW, "attention.sliding_window_pattern": SLIDING_PATTERN,
          "rope.freq_base_swa": FREQ_BASE_SWA, "attn_logit_softcapping": ATTN_SOFTCAP,
          "final_logit_softcapping": FINAL_SOFTCAP},
    rope_neox=True, post_norms=True, gelu=True, embd_scale=True,
    tied_always=True,   # an output.weight would be a tensor llama.cpp does not read
    big_attn_scale_layers=46,   # Gemma 2 27B
    sliding=_sliding, softcaps=_softcaps,
)
