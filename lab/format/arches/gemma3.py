"""gemma3: gemma2's blocks with per-head Q/K norms; sliding windows (five layers in six) only where the file gives
one, the final soft-cap only without them, no attention soft-cap."""

from __future__ import annotations

from lab.format.arches.base import Arch, swa_pattern
from lab.format.rules import ATTN_SOFTCAP, FINAL_SOFTCAP, FREQ_BASE_SWA, SLIDING_PATTERN, SLIDING_WINDOW


def _sliding(kv: dict, n_layer: int, rope_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(window, sliding, rope_base_local) as llama.cpp's gemma3 loader sets them: only when the key is present and > 0,
    pattern 6; the sliding layers' base defaults to 10000 (rope_freq_base_train_swa)."""
    window = kv.get("attention.sliding_window", 0)
    period = kv.get("attention.sliding_window_pattern", 6)
    return window, swa_pattern(window, period, n_layer), float(kv.get("rope.freq_base_swa", 10000.0))


def _softcaps(kv: dict, window: int) -> tuple[float, float]:
    """(attention cap, final cap): the final cap only where the key is present and the model has no sliding window
    (llama.cpp's non-SWA graph)."""
    return 0.0, 0.0 if window > 0 else float(kv.get("final_logit_softcapping", 0.0))


ARCH = Arch(
    "gemma3",
    keys={"attention.sliding_window": SLIDING_WINDOW, "attention.sliding_window_pattern": SLIDING_PATTERN,
          "rope.freq_base_swa": FREQ_BASE_SWA, "attn_logit_softcapping": ATTN_SOFTCAP,
          "final_logit_softcapping": FINAL_SOFTCAP},
    rope_neox=True, qk_norm=True, post_norms=True, gelu=True, embd_scale=True,
    big_attn_scale_layers=62,   # Gemma 3 27B
    # llama.cpp scales gemma3's global layers only (rope_freq_scale_train_swa = 1); Config has one scale.
    rope_scaling_refused="linear RoPE scaling of gemma3's global layers only is not supported by this lab yet",
    sliding=_sliding, softcaps=_softcaps,
)
