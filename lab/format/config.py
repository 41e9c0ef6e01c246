"""`Config`: one frozen dataclass for every architecture, what the engine needs to know of a model, every field with
its meaning (and, where it is per layer, the method that gives one layer's value).

lab.format.model builds it from a GGUF header (`from_gguf`) with the steps of the model's architecture
(lab.format.arches), and lists the tensors it expects.

Hybrids. lfm2: `shortconv` says per layer whether it is a short-convolution block (llama.cpp: head_count_kv[il] == 0,
`hparams.is_recr`) instead of attention; such a layer has no K/V, and its memory is the conv state (l_cache - 1 rows
of B*x, `conv_state_bytes`). qwen35: `delta` says per layer whether it is a gated delta-net layer (linear attention:
a conv over its q, k, v channels, then a recurrent state of ssm_head_dim x ssm_head_dim per value head,
`delta_state_bytes`), the others gated full attention (an output gate per head in the second half of each head's Q
rows: `attn_gate`). Mixtures of experts (Mixtral-style llama, qwen3moe, lfm2moe): on a routed layer (`routed`) the FFN is a router
(n_expert logits of the normed x), a gating function (`gating`) and the top n_expert_used experts, each an FFN of
n_ff_exp, their outputs summed with the chosen probabilities renormalised to 1; `probs_bias` adds a per-expert bias to
the probabilities for the choice only. A qwen35 file's multi-token-prediction blocks (`nextn_predict_layers`, after the model's own) are
skipped on purpose and said so (`Config.skipped`).

What it does not know: GGUF (lab.format.gguf), the keys a value came from (lab.format.model), tensors.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    arch: str
    n_layer: int            # transformer blocks
    n_embd: int             # residual width
    n_head: int             # query heads
    n_head_kv: int          # key/value heads (grouped-query: n_head / n_head_kv queries share one)
    head_dim: int           # width of one head (key length = value length)
    n_ff: int               # feed-forward inner width
    n_vocab: int            # rows of token_embd
    n_ctx_train: int        # context length the model was trained for
    eps: float              # RMSNorm epsilon
    rope_base: float        # RoPE frequency base (global layers)
    rope_base_local: float  # RoPE base of sliding-window layers (gemma3), else rope_base
    rope_scale: float       # position multiplier (1 / linear scaling factor)
    n_rot: int              # rotated dimensions of each head (<= head_dim)
    rope_neox: bool         # pairs (i, i + n_rot/2) as in NeoX/Qwen/Gemma, else adjacent (2i, 2i+1) as llama GGUFs
    qkv_bias: bool          # biases on Q, K, V (qwen2)
    tied_output: bool       # no output.weight: the head is token_embd
    qk_norm: bool           # per-head RMSNorm on Q and K (gemma3)
    post_norms: bool        # RMSNorm after attention and after the feed-forward as well (gemma3)
    gelu: bool              # GeGLU with tanh GELU (gemma3) instead of SwiGLU
    embd_scale: float       # inp_embd multiplier: sqrt(n_embd) for gemma3, else 1
    attn_scale: float       # multiplier of q.k
    sliding_window: int     # keys a sliding layer sees (0: none)
    sliding: tuple[bool, ...]  # per layer: True when the layer uses the sliding window
    attn_softcap: float     # 0: none; else scores become c * tanh(s / c) (gemma2)
    final_softcap: float    # 0: none; else logits become c * tanh(l / c) (gemma2)
    rope_freqs: bool = False        # rope_freqs.weight [n_rot/2] f32 (llama 3): theta_i / factor_i on every layer
    fused_qkv: bool = False         # attn_qkv.weight [n_embd, q + 2 kv] instead of attn_q/k/v (phi3)
    fused_gate_up: bool = False     # ffn_up.weight [n_embd, 2 n_ff] = [gate | up] rows, no ffn_gate (phi3)
    no_rope: tuple[bool, ...] = ()  # per layer: True where Q and K are not rotated (smollm3's NoPE layers); () none
    shortconv: tuple[bool, ...] = ()    # per layer: True for lfm2's short-conv blocks (no attention, no KV); () none
    l_cache: int = 0                    # taps of the depthwise causal conv (its state: the last l_cache - 1 rows): lfm2's
                                        # shortconv.l_cache, qwen35's ssm.conv_kernel
    output_norm: str = "output_norm.weight"     # the final norm's tensor (lfm2 stores it as token_embd_norm.weight)
    ffn_norm: str = "ffn_norm.weight"   # the feed-forward's input norm, within a block (qwen35: post_attention_norm)
    delta: tuple[bool, ...] = ()        # per layer: True for qwen35's gated delta-net layers; () none
    ssm_k_heads: int = 0                # qwen35: delta-net key heads (ssm.group_count)
    ssm_v_heads: int = 0                # qwen35: delta-net value heads (ssm.time_step_rank), a multiple of the key heads
    ssm_head_dim: int = 0               # qwen35: d_k = d_v of a delta-net head (ssm.state_size)
    attn_gate: bool = False             # qwen35: each head's Q rows are [q | gate], attention out *= sigmoid(gate)
    mtp_layers: int = 0                 # qwen35: multi-token-prediction blocks after the n_layer run here (skipped)
    # gemma4: head_dim / n_head_kv / n_ff are the LARGEST over the layers (what scratch is sized by); per layer:
    head_dim_swa: int = 0               # gemma4: sliding layers' head size (attention.key_length_swa); 0: head_dim
    n_rot_swa: int = 0                  # gemma4: sliding layers' rotated dims (rope.dimension_count_swa)
    kv_heads: tuple[int, ...] = ()      # per layer KV heads (attention.head_count_kv as an array); () every layer's
    ff_widths: tuple[int, ...] = ()     # per layer FFN width (feed_forward_length as an array); () every layer's
    kv_from_start: int = -1             # gemma4: layers il >= this read an earlier layer's K/V (kv_source); -1: none
    n_embd_per_layer: int = 0           # gemma4: one layer's slice of per_layer_token_embd [n_layer x this, n_vocab]
    v_norm: bool = False                # gemma4: V RMS-normed per head without a weight
    out_scale: bool = False             # gemma4: blk.N.layer_output_scale [1] multiplies each block's output
    block_tail: bool = False            # gemma4: each block ends with its per-layer input (and output scale)
    rope_freqs_full: bool = False       # gemma4: rope_freqs (proportional RoPE) read by the full layers only
    v_is_k: tuple[bool, ...] = ()       # gemma4: per layer True where the file has no attn_v: V is K's projection
                                        # (attention_k_eq_v; llama.cpp: "if v_proj is not present, use k_proj")
    # mixtures of experts: the routed layers' FFN (lab.format.arches.base.read_experts)
    n_expert: int = 0                   # experts of a routed layer (expert_count); 0: every FFN is dense
    n_expert_used: int = 0              # experts each token is routed to (expert_used_count)
    n_ff_exp: int = 0                   # an expert's hidden width
    n_dense_lead: int = 0               # the first layers keep a dense FFN of n_ff (leading_dense_block_count)
    gating: str = ""                    # "softmax" or "sigmoid": the router's probabilities from its logits
    probs_bias: bool = False            # blk.N.exp_probs_b.bias [n_expert] added to the probabilities for the choice

    def head_dim_of(self, il: int) -> int:
        """Layer il's head size (key = value length): gemma4's sliding layers have their own."""
        return self.head_dim_swa if self.head_dim_swa and self.sliding[il] else self.head_dim

    def n_head_kv_of(self, il: int) -> int:
        return self.kv_heads[il] if self.kv_heads else self.n_head_kv

    def n_ff_of(self, il: int) -> int:
        return self.ff_widths[il] if self.ff_widths else self.n_ff

    def n_rot_of(self, il: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.sliding[il] else self.n_rot

    def q_dim_of(self, il: int) -> int:
        return self.n_head * self.head_dim_of(il)

    def kv_dim_of(self, il: int) -> int:
        return self.n_head_kv_of(il) * self.head_dim_of(il)

    def routed(self, il: int) -> bool:
        """Whether layer il's FFN is routed experts (llama.cpp: il >= n_layer_dense_lead where the model has experts)."""
        return self.n_expert > 0 and il >= self.n_dense_lead

    @property
    def routed_layers(self) -> tuple[int, ...]:
        return tuple(il for il in range(self.n_layer) if self.routed(il))

    def has_kv(self, il: int) -> bool:
        """Whether layer il projects and caches its own K/V (llama_hparams::has_kv)."""
        return self.kv_from_start < 0 or il < self.kv_from_start

    def kv_source(self, il: int) -> int:
        """The layer whose cache layer il attends: itself, or for gemma4's shared-KV layers (il >= kv_from_start)
        the last layer with a cache of the same kind (llama.cpp's layer_reuse_cb: kv_from_start - 2 for a sliding
        layer, kv_from_start - 1 for a full one; from_gguf checks that those are of that kind)."""
        if self.has_kv(il):
            return il
        return self.kv_from_start - (2 if self.sliding[il] else 1)

    def rotates(self, il: int) -> bool:
        """Whether layer il rotates Q and K (every layer but smollm3's NoPE ones)."""
        return not (self.no_rope and self.no_rope[il])

    def is_conv(self, il: int) -> bool:
        """Whether layer il is a short-conv block (lfm2) rather than attention."""
        return bool(self.shortconv and self.shortconv[il])

    def is_delta(self, il: int) -> bool:
        """Whether layer il is a gated delta-net layer (qwen35) rather than attention."""
        return bool(self.delta and self.delta[il])

    def mixer(self, il: int) -> str:
        """The kind of block in layer il where attention sits in a plain decoder (lab.engine.blocks.MIXERS):
        "shortconv", "deltanet" or "attention"."""
        return "shortconv" if self.is_conv(il) else "deltanet" if self.is_delta(il) else "attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with attention (and a KV cache): every layer but the short-conv and delta-net ones."""
        return tuple(il for il in range(self.n_layer) if not (self.is_conv(il) or self.is_delta(il)))

    @property
    def conv_layers(self) -> tuple[int, ...]:
        """The layers with a conv state: lfm2's short-conv blocks and qwen35's delta-net layers."""
        return tuple(il for il in range(self.n_layer) if self.is_conv(il) or self.is_delta(il))

    @property
    def delta_layers(self) -> tuple[int, ...]:
        """qwen35's gated delta-net layers (each with a recurrent state, besides its conv state)."""
        return tuple(il for il in range(self.n_layer) if self.is_delta(il))

    @property
    def recurrent(self) -> bool:
        """Whether the model keeps anything besides a KV cache between tokens (conv or delta-net states)."""
        return bool(self.conv_layers)

    @property
    def conv_channels(self) -> int:
        """Channels of a conv state row: lfm2's B*x (n_embd); qwen35's q, k and v (2 key dims + the value dim)."""
        if self.delta:
            return 2 * self.ssm_k_heads * self.ssm_head_dim + self.ssm_inner
        return self.n_embd

    @property
    def ssm_inner(self) -> int:
        """qwen35: the delta-net's value width, value heads x head size (ssm.inner_size)."""
        return self.ssm_v_heads * self.ssm_head_dim

    @property
    def delta_width(self) -> int:
        """qwen35: floats of a delta-net layer's fused in-projection row [q k v | z | beta | alpha]."""
        return self.conv_channels + self.ssm_inner + 2 * self.ssm_v_heads

    @property
    def skipped(self) -> list[str]:
        """What the file holds that this lab leaves out on purpose, one sentence each (the model card shows them)."""
        if self.kv_from_start >= 0 and self.kv_from_start < self.n_layer:
            return [f"layers {self.kv_from_start}..{self.n_layer - 1} have no K/V of their own (attention.shared_kv_layers):"
                    f" each reads the cache of layer {self.kv_from_start - 2} (sliding) or {self.kv_from_start - 1} "
                    f"(full); K/V projections such a layer holds are never read, as in llama.cpp, and not uploaded"]
        if not self.mtp_layers:
            return []
        first = self.n_layer
        blocks = ", ".join(f"blk.{il}" for il in range(first, first + self.mtp_layers))
        return [f"{self.mtp_layers} multi-token-prediction block{'s' if self.mtp_layers > 1 else ''} ({blocks}): "
                f"llama.cpp runs it only to draft tokens for speculative decoding; this lab decodes one token at a "
                f"time, so its tensors are not uploaded"]

    @property
    def rope_pairs(self) -> int:
        return self.n_rot // 2

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Floats in one cached K or V row: n_head_kv x head_dim."""
        return self.n_head_kv * self.head_dim

    def kv_bytes_per_token(self, bytes_per_value: int = 4) -> int:
        """2 (K and V) x attention layers x KV heads x head size x bytes per value (short-conv layers keep none)."""
        if self.kv_heads or self.head_dim_swa or self.kv_from_start >= 0:   # gemma4: per-layer sizes, shared tail
            return 2 * sum(self.kv_dim_of(il) for il in self.attention_layers if self.has_kv(il)) * bytes_per_value
        return 2 * len(self.attention_layers) * self.n_head_kv * self.head_dim * bytes_per_value

    def conv_state_bytes(self, bytes_per_value: int = 4) -> int:
        """What the conv layers keep, whatever the context: conv layers x (l_cache - 1) rows x channels x bytes per
        value (the inputs the next token's conv still reads: lfm2's B*x, qwen35's q, k, v)."""
        return len(self.conv_layers) * (self.l_cache - 1) * self.conv_channels * bytes_per_value

    def delta_state_bytes(self, bytes_per_value: int = 4) -> int:
        """What qwen35's delta-net layers keep, whatever the context: layers x value heads x d_k x d_v x bytes."""
        return len(self.delta_layers) * self.ssm_v_heads * self.ssm_head_dim ** 2 * bytes_per_value

