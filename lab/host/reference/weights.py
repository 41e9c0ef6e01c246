"""GGUF weights and hyperparameters for the numpy reference (CPython only).

Every tensor is dequantized with `gguf.quants.dequantize` -- gguf-py's own numpy decoders, written
independently of our WGSL kernels -- from a memory-mapped `gguf.GGUFReader`, once, on first use,
and cached as float32 (or the dtype asked for).

Layout: a GGUF tensor of ggml shape [ne0, ne1] (ne0 contiguous) comes back as a numpy array of
shape (ne1, ne0). For a linear layer ne0 is the input width, so `W` is (out, in) and `y = x @ W.T`;
the token embedding is (n_vocab, n_embd), one row per token.

Hyperparameters follow llama.cpp's loaders (src/llama-model.cpp and src/models/<arch>.cpp):
see `Hparams.from_weights` for where each value comes from and what defaults llama.cpp applies
when a key is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# llama.cpp `llama_model_rope_type()`: llama (and its relatives) use "NORM" RoPE, rotating pairs of
# adjacent values (x[2i], x[2i+1]); qwen2 and the gemma family use "NEOX", rotating (x[i], x[i+n_rot/2]).
# The llama GGUF converter permutes the rows of Q and K from HF's half-split layout into the
# interleaved one, which is why adjacent pairing is right for a llama GGUF.
ROPE_TYPE = {"llama": "norm", "smollm3": "norm", "qwen2": "neox", "qwen3": "neox", "qwen3moe": "neox", "phi3": "neox",
             "gemma2": "neox", "gemma3": "neox", "lfm2": "neox", "lfm2moe": "neox", "qwen35": "neox", "gemma4": "neox"}     # qwen35: IMROPE, NEOX's rotation for text
SUPPORTED_ARCHS = tuple(ROPE_TYPE)


class Weights:
    """Lazy, cached, dequantized view of one GGUF file."""

    def __init__(self, path: str | Path, dtype=np.float32):
        self.path = Path(path)
        self.reader = GGUFReader(self.path)           # memory-mapped
        self.dtype = np.dtype(dtype)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._cache: dict[str, np.ndarray] = {}

    # -- metadata -------------------------------------------------------------------------------
    def meta(self, key: str, default=None):
        f = self.reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    def keys(self) -> list[str]:
        return list(self.reader.fields)

    # -- tensors --------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """numpy shape of the dequantized tensor (ggml's ne reversed)."""
        return tuple(int(n) for n in reversed(self.tensors[name].shape))

    def get(self, name: str) -> np.ndarray:
        """The tensor dequantized to `self.dtype`, cached; read-only."""
        a = self._cache.get(name)
        if a is None:
            t = self.tensors[name]
            a = dequantize(t.data, t.tensor_type)
            a = np.ascontiguousarray(a.reshape(self.shape(name)), dtype=self.dtype)
            a.flags.writeable = False
            self._cache[name] = a
        return a

    def rows(self, name: str, idx) -> np.ndarray:
        """Rows `idx` of a 2-D tensor (e.g. token embeddings), dequantizing only those rows unless
        the whole tensor is already cached."""
        a = self._cache.get(name)
        idx = np.asarray(idx, dtype=np.int64)
        if a is not None:
            return a[idx]
        t = self.tensors[name]
        raw = np.asarray(t.data)
        out = dequantize(raw[idx], t.tensor_type)
        return np.asarray(out, dtype=self.dtype).reshape(len(idx), self.shape(name)[1])

    def maybe(self, name: str) -> np.ndarray | None:
        return self.get(name) if name in self.tensors else None

    def drop(self, name: str | None = None) -> None:
        """Forget a cached tensor (or all of them)."""
        if name is None:
            self._cache.clear()
        else:
            self._cache.pop(name, None)


@dataclass
class Hparams:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int                 # key length (n_embd_head_k)
    head_dim_v: int               # value length (n_embd_head_v)
    n_ff: int
    n_vocab: int
    eps: float                    # RMSNorm epsilon
    n_rot: int                    # rotated dims per head (rope.dimension_count)
    rope_type: str                # "norm" (adjacent pairs) or "neox" (halves)
    rope_base: float              # rope.freq_base (global layers)
    rope_base_swa: float          # RoPE base of sliding-window layers
    attn_scale: float             # multiplies q.k
    embed_scale: float = 1.0      # multiplies the looked-up embedding (gemma: sqrt(n_embd))
    n_swa: int = 0                # sliding window size, 0 = none
    swa_layers: list[bool] = field(default_factory=list)
    final_softcap: float = 0.0    # final logit softcapping, 0 = none
    attn_softcap: float = 0.0     # attention score softcapping c*tanh(s/c) (gemma2), 0 = none
    rope_scale: float = 1.0       # freq_scale: 1 / linear scaling factor (theta multiplied by it)
    rope_factors: np.ndarray | None = None   # rope_freqs.weight [n_rot/2] (llama 3): theta_i / factor_i
    qk_norm: bool = False         # per-head RMSNorm on Q and K before RoPE (gemma3)
    post_norms: bool = False      # post-attention and post-FFN norms (gemma3)
    ffn_act: str = "silu"         # "silu" (SwiGLU) or "gelu" (GeGLU, tanh approximation)
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    no_rope_step: int = 0         # smollm3: layer il has no RoPE when (il + 1) % step == 0 (0: every layer rotates)
    conv_layers: list[bool] = field(default_factory=list)   # lfm2: True where the layer is a short-conv block
    l_cache: int = 0              # lfm2: the short conv's taps
    output_norm: str = "output_norm.weight"
    ffn_norm: str = "ffn_norm.weight"
    delta_layers: list[bool] = field(default_factory=list)  # qwen35: True where the layer is a gated delta-net
    ssm_k_heads: int = 0          # qwen35: ssm.group_count
    ssm_v_heads: int = 0          # qwen35: ssm.time_step_rank
    ssm_head_dim: int = 0         # qwen35: ssm.state_size (d_k = d_v)
    attn_gate: bool = False       # qwen35: attn_q rows [q | gate] per head, the output times sigmoid(gate)
    # gemma4: per-layer attention shapes (sliding layers have their own head size and rotated dims), the layers from
    # kv_from_start on reading an earlier layer's K/V, and the per-layer token embeddings
    head_dim_swa: int = 0         # gemma4: attention.key_length_swa (= value_length_swa)
    n_rot_swa: int = 0            # gemma4: rope.dimension_count_swa
    kv_heads: list[int] = field(default_factory=list)   # per layer KV heads where the file gives an array
    ff_layers: list[int] = field(default_factory=list)  # per layer FFN widths where the file gives an array
    kv_from_start: int = -1       # gemma4: layers il >= this have no K/V of their own (-1: every layer has)
    n_embd_per_layer: int = 0     # gemma4: width of one layer's slice of the per-layer token embedding
    v_norm: bool = False          # gemma4: V RMS-normed per head, without a weight
    # mixtures of experts (llama with expert_count, qwen3moe, lfm2moe): build_moe_ffn in src/llama-graph.cpp
    n_expert: int = 0             # expert_count (0: dense)
    n_expert_used: int = 0        # expert_used_count
    n_dense_lead: int = 0         # lfm2moe: leading_dense_block_count (the first layers dense)
    gating: str = "softmax"       # lfm2moe: expert_gating_func 2 is sigmoid; qwen3moe's and llama's graphs fix softmax

    def routed(self, il: int) -> bool:
        return self.n_expert > 0 and il >= self.n_dense_lead

    def is_conv(self, il: int) -> bool:
        return bool(self.conv_layers and self.conv_layers[il])

    def is_delta(self, il: int) -> bool:
        return bool(self.delta_layers and self.delta_layers[il])

    def rotates(self, il: int) -> bool:
        return not (self.no_rope_step and (il + 1) % self.no_rope_step == 0)

    def is_swa(self, il: int) -> bool:
        return bool(self.swa_layers and self.swa_layers[il])

    def rope_base_for(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) else self.rope_base

    def head_dim_of(self, il: int) -> int:
        """Layer il's head size: gemma4's sliding layers have their own (key_length_swa)."""
        return self.head_dim_swa if self.head_dim_swa and self.is_swa(il) else self.head_dim

    def n_rot_of(self, il: int) -> int:
        return self.n_rot_swa if self.n_rot_swa and self.is_swa(il) else self.n_rot

    def n_head_kv_of(self, il: int) -> int:
        return self.kv_heads[il] if self.kv_heads else self.n_head_kv

    def kv_source(self, il: int) -> int:
        """The layer whose cached K/V layer il attends (llama.cpp's layer_reuse_cb for gemma3n / gemma4): itself,
        or from kv_from_start on the last layer with a cache of the same kind (kv_from_start - 2 for a sliding
        layer, kv_from_start - 1 for a full one)."""
        if self.kv_from_start < 0 or il < self.kv_from_start:
            return il
        return self.kv_from_start - (2 if self.is_swa(il) else 1)

    @classmethod
    def from_weights(cls, w: Weights) -> Hparams:
        arch = w.meta("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise NotImplementedError(f"reference: architecture {arch!r} is not supported "
                                      f"({', '.join(SUPPORTED_ARCHS)})")

        def k(name, default=None, required=True):
            v = w.meta(f"{arch}.{name}", default)
            if v is None and required:
                raise KeyError(f"{w.path.name}: metadata {arch}.{name} is missing")
            return v

        n_embd = int(k("embedding_length"))
        n_head = int(k("attention.head_count"))
        n_head_kv = k("attention.head_count_kv", n_head)
        per_layer_kv = [int(n) for n in n_head_kv] if isinstance(n_head_kv, list) else None
        n_head_kv = max(per_layer_kv) if per_layer_kv else int(n_head_kv)
        n_ff = k("feed_forward_length")
        ff_layers = [int(n) for n in n_ff] if isinstance(n_ff, list) else []
        head_dim = int(k("attention.key_length", n_embd // n_head))
        head_dim_v = int(k("attention.value_length", head_dim))
        n_rot = int(k("rope.dimension_count", head_dim))
        # qwen35 files may end with multi-token-prediction blocks: llama.cpp's n_layer() leaves them out of the graph
        n_layer = int(k("block_count")) - int(k("nextn_predict_layers", 0, required=False) or 0)
        n_vocab = w.shape("token_embd.weight")[0]
        # llama_model::load_hparams: scaling type "linear" when absent; freq_scale = 1/factor (factor from
        # rope.scaling.factor, else rope.scale_linear; 0 means 1); llama_context: type "none" forces 1.
        scaling = k("rope.scaling.type", "linear", required=False)
        if scaling not in ("none", "linear"):
            raise NotImplementedError(f"reference: RoPE scaling {scaling!r} is not implemented")
        if "rope_factors_long.weight" in w or "rope_factors_short.weight" in w:
            raise NotImplementedError("reference: LongRoPE factors (rope_factors_long/short) are not implemented")
        factor = k("rope.scaling.factor", None, required=False)
        if factor is None:
            factor = k("rope.scale_linear", 0.0, required=False)
        rope_scale = 1.0 if scaling == "none" or not factor else 1.0 / float(factor)
        rope_base = float(k("rope.freq_base", 10000.0))
        hp = cls(
            arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
            head_dim=head_dim, head_dim_v=head_dim_v, n_ff=max(ff_layers) if ff_layers else int(n_ff),
            n_vocab=n_vocab,
            eps=float(k("attention.layer_norm_rms_epsilon")), n_rot=n_rot, rope_type=ROPE_TYPE[arch],
            rope_base=rope_base, rope_base_swa=rope_base,
            # llama / qwen2 graphs: kq_scale = 1/sqrt(n_embd_head)
            attn_scale=1.0 / float(np.sqrt(head_dim)),
            bos_id=w.meta("tokenizer.ggml.bos_token_id"), eos_id=w.meta("tokenizer.ggml.eos_token_id"),
            add_bos=bool(w.meta("tokenizer.ggml.add_bos_token", False)),
            rope_scale=rope_scale,
        )
        if arch == "llama" and "rope_freqs.weight" in w:
            # src/models/llama.cpp: get_rope_factors(il) returns layers[il].rope_freqs, the one tensor
            # (TENSOR_DUPLICATED for il > 0), passed to ggml_rope_ext of Q and K on every layer.
            hp.rope_factors = np.asarray(w.get("rope_freqs.weight"), dtype=np.float64)
        if arch == "smollm3":
            # llama_model_smollm3::load_arch_hparams: n_no_rope_layer_step = 4, fixed (no key); src/models/smollm3.cpp
            # rotates Q and K only where (il + 1) % 4 != 0, the rest is llama's graph
            hp.no_rope_step = 4
        if arch in ("qwen3", "qwen3moe"):
            hp.qk_norm = True            # src/models/qwen3.cpp, qwen3moe.cpp: attn_q_norm / attn_k_norm per head, before RoPE
        if arch in ("llama", "qwen3moe", "lfm2moe"):
            # build_moe_ffn's arguments: llama's MoE branch (a layer with ffn_gate_inp) and qwen3moe route every layer
            # by softmax; lfm2moe (src/models/lfm2.cpp) the layers from leading_dense_block_count on, by the file's
            # gating function, with exp_probs_b; norm_w true in all three, no expert weight scale
            hp.n_expert = int(k("expert_count", 0, required=False) or 0)
            hp.n_expert_used = int(k("expert_used_count", 0, required=False) or 0)
            if arch == "lfm2moe":
                hp.n_dense_lead = int(k("leading_dense_block_count", 0, required=False) or 0)
                hp.gating = "sigmoid" if int(k("expert_gating_func")) == 2 else "softmax"
        if arch in ("lfm2", "lfm2moe"):
            # llama_model_lfm2::load_arch_hparams: a layer is recurrent (a short-conv block) where head_count_kv[il]
            # is 0 (get_key_or_arr: a scalar is every layer's); l_cache from shortconv.l_cache. src/models/lfm2.cpp:
            # per-head q/k norms before NEOX RoPE, kq_scale 1/sqrt(head size), the final norm stored as token_embd_norm
            hp.conv_layers = [n == 0 for n in (per_layer_kv or [n_head_kv] * n_layer)]
            hp.l_cache = int(k("shortconv.l_cache"))
            hp.qk_norm = True
            hp.output_norm = "token_embd_norm.weight"
        if arch == "qwen35":
            # llama_model_qwen35::load_arch_hparams + src/models/qwen35.cpp: recurrent (gated delta-net) layers from
            # attention.recurrent_layers, else every layer but each full_attention_interval-th (default 4); the
            # ssm.* sizes; attention layers: Q rows [q | gate] per head, q/k norms, IMROPE (for text, every axis at
            # the token's position: NEOX over rope.dimension_count dims), the output times sigmoid(gate); the FFN
            # norm is post_attention_norm
            per_layer = k("attention.recurrent_layers", None, required=False)
            if per_layer is not None:
                hp.delta_layers = [bool(x) for x in per_layer[:n_layer]]
            else:
                interval = int(k("full_attention_interval", 4, required=False))
                hp.delta_layers = [(il + 1) % interval != 0 for il in range(n_layer)]
            hp.l_cache = int(k("ssm.conv_kernel"))
            hp.ssm_k_heads, hp.ssm_v_heads = int(k("ssm.group_count")), int(k("ssm.time_step_rank"))
            hp.ssm_head_dim = int(k("ssm.state_size"))
            hp.qk_norm = True
            hp.attn_gate = True
            hp.ffn_norm = "post_attention_norm.weight"
        if arch == "gemma2":
            # src/models/gemma2.cpp + llama_model_gemma2::load_arch_hparams: window 4096 unless the key says,
            # pattern 2 (even layers slide), SWA base defaults to the global one, soft-caps 50 / 30 by
            # default (llama_hparams), tanh-capped scores and logits; Q scaled by 1/sqrt(head size)
            # (1/sqrt(n_embd/n_head) for the 46-layer 27B); embeddings times sqrt(n_embd); post-norms; GeGLU.
            hp.n_swa = int(k("attention.sliding_window", 4096, required=False))
            p = int(k("attention.sliding_window_pattern", 2, required=False))
            hp.swa_layers = [p == 0 or (il % p < p - 1) for il in range(n_layer)]
            hp.rope_base_swa = float(k("rope.freq_base_swa", rope_base, required=False))
            hp.attn_softcap = float(k("attn_logit_softcapping", 50.0, required=False))
            hp.final_softcap = float(k("final_logit_softcapping", 30.0, required=False))
            hp.attn_scale = (1.0 / float(np.sqrt(n_embd // n_head))) if n_layer == 46 else 1.0 / float(np.sqrt(head_dim))
            hp.embed_scale = float(np.sqrt(np.float32(n_embd)))
            hp.post_norms = True
            hp.ffn_act = "gelu"
        if arch == "gemma3":
            # llama.cpp llama_model_gemma3::load_arch_hparams + src/models/gemma3.cpp:
            #  - sliding window only if gemma3.attention.sliding_window is present and > 0; then the
            #    pattern period is attention.sliding_window_pattern (default 6): layer il is SWA iff
            #    il % 6 < 5 (llama_hparams::set_swa_pattern, dense_first=false) -> 5, 11, 17 global;
            #  - SWA layers use rope.freq_base_swa (default rope_freq_base_train_swa = 10000);
            #  - f_attention_scale = 1/sqrt(n_embd_head_k), except the 27B (62 layers):
            #    1/sqrt(n_embd/n_head); Q is scaled by it and build_attn gets kq_scale 1.0;
            #  - input embedding scaled by sqrt(n_embd) (ggml_scale(inpL, sqrtf(n_embd)));
            #  - final logit softcapping only in the non-SWA graph (template iswa=false), when the
            #    key is present.
            hp.n_swa = int(k("attention.sliding_window", 0, required=False) or 0)
            if hp.n_swa > 0:
                period = k("attention.sliding_window_pattern", 6, required=False)
                if isinstance(period, list):     # per-layer array form: true = SWA layer
                    hp.swa_layers = [bool(x) for x in period]
                else:
                    p = int(period)
                    hp.swa_layers = [p == 0 or (il % p < p - 1) for il in range(n_layer)]
                hp.rope_base_swa = float(k("rope.freq_base_swa", 10000.0, required=False))
            else:
                hp.final_softcap = float(k("final_logit_softcapping", 0.0, required=False) or 0.0)
            hp.attn_scale = (1.0 / float(np.sqrt(n_embd / n_head))) if n_layer == 62 else 1.0 / float(np.sqrt(head_dim))
            hp.embed_scale = float(np.sqrt(np.float32(n_embd)))
            hp.qk_norm = True
            hp.post_norms = True
            hp.ffn_act = "gelu"
        if arch == "gemma4":
            # llama_model_gemma4::load_arch_hparams + src/models/gemma4.cpp: sliding layers from the pattern ARRAY,
            # with their own head size (key_length_swa), rotated dims (rope.dimension_count_swa) and base
            # (rope.freq_base_swa); full layers' proportional RoPE through rope_freqs (the full layers only); the
            # layers from n_layer - shared_kv_layers on read an earlier layer's K/V (kv_source); per-layer KV heads and
            # FFN widths from arrays; Q/K norms with weights, V RMS-normed without one; attention scale 1;
            # embeddings times sqrt(n_embd); post-norms; GeGLU; per-layer token embeddings (forward._per_layer_inputs);
            # final logit soft-cap where the key is present.
            hp.swa_layers = [bool(x) for x in k("attention.sliding_window_pattern")]
            hp.n_swa = int(k("attention.sliding_window"))
            hp.head_dim_swa = int(k("attention.key_length_swa"))
            hp.n_rot_swa = int(k("rope.dimension_count_swa", hp.head_dim_swa, required=False))
            hp.rope_base_swa = float(k("rope.freq_base_swa", 10000.0, required=False))   # llama_hparams' default
            hp.kv_heads = per_layer_kv or []
            hp.ff_layers = ff_layers
            hp.kv_from_start = n_layer - int(k("attention.shared_kv_layers", 0, required=False))
            hp.n_embd_per_layer = int(k("embedding_length_per_layer_input", 0, required=False))
            hp.final_softcap = float(k("final_logit_softcapping", 0.0, required=False) or 0.0)
            hp.attn_scale = 1.0
            hp.embed_scale = float(np.sqrt(np.float32(n_embd)))
            hp.qk_norm = True
            hp.v_norm = True
            hp.post_norms = True
            hp.ffn_act = "gelu"
            if "rope_freqs.weight" in w:
                hp.rope_factors = np.asarray(w.get("rope_freqs.weight"), dtype=np.float64)
        return hp
