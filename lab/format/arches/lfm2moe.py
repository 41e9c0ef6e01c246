"""lfm2moe (LFM2-8B-A1B): lfm2's graph (short-conv and attention layers, src/models/lfm2.cpp) with the FFN of the
layers from leading_dense_block_count on routed over experts: the file's gating function (its converter writes 2,
sigmoid), exp_probs_b.bias added to the probabilities for the choice only, the chosen weights renormalised.
llama_model_lfm2moe::load_arch_hparams reads expert_feed_forward_length and expert_gating_func (required) and
leading_dense_block_count (optional); every routed layer holds exp_probs_b.bias."""

from __future__ import annotations

from lab.format.arches.lfm2 import make
from lab.format.rules import EXPERT_KEYS

ARCH = make("lfm2moe", keys=EXPERT_KEYS, experts="required", expert_width="key", dense_lead=True, gating_key=True,
            expert_bias=True)
