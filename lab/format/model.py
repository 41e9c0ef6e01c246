"""Model configs, one frozen dataclass for every architecture, built from GGUF metadata by `from_gguf`;
and the tensor table each config expects, checked against the file before a byte is uploaded.

The values come from `lab.format.checks.check_config` (type and range of every key); what is checked here
is their consistency with each other and with the tensors, and every message names the keys behind
a number (`tensor blk.0.attn_k.weight has shape [64, 32], expected [64, 16] = [n_embd, n_head_kv *
head_dim] from llama.embedding_length = 64, ...`). `lab.engine.load.validate` is the entry point that
also checks the tokenizer.

Two tables: `stored_tensors` is what the FILE holds (phi3's fused `attn_qkv` and `ffn_up`, llama 3's
`rope_freqs`), checked by `check_tensors`; `expected_tensors` is what the ENGINE reads, where a fused tensor
appears as its row ranges (`tensor_views`: phi3's attn_qkv as attn_q/attn_k/attn_v, its ffn_up as ffn_gate
(the first n_ff rows, as ggml_swiglu splits a fused row) and ffn_up): views of the same file bytes, so the
GPU still holds one copy. `HOST_TENSORS` are the only tensors whose values Python reads (rope_freqs: n_rot/2
floats, read before the plans are built, natively from the path, in the browser with one File.slice).

Hybrids. lfm2: `shortconv` says per layer whether it is a short-convolution block (llama.cpp: head_count_kv[il] == 0,
`hparams.is_recr`) instead of attention; such a layer has no K/V, and its memory is the conv state (l_cache - 1 rows
of B*x, `conv_state_bytes`). qwen35: `delta` says per layer whether it is a gated delta-net layer (linear attention:
a conv over its q, k, v channels, then a recurrent state of ssm_head_dim x ssm_head_dim per value head,
`delta_state_bytes`), the others gated full attention (an output gate per head in the second half of each head's Q
rows: `attn_gate`). `FLAT_TENSORS` (the conv kernels, [channels, l_cache] f32) are read whole by their kernel rather
than through the matmuls, so they are uploaded as one flat f32 buffer. A qwen35 file's multi-token-prediction blocks
(`nextn_predict_layers`, after the model's own) are skipped on purpose and said so (`Config.skipped`).

What it does not know: how tensors reach the GPU (lab.engine) or how tokens are made (lab.text.tokenizer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lab.format.checks import U32_MAX, ModelError, check_config, show
from lab.format.ggml import KERNEL_TYPES, SUPPORTED, type_name
from lab.format.gguf import Header, TensorInfo

ARCHITECTURES = ("llama", "smollm3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "lfm2", "qwen35", "gemma4")
# Architectures a user may well bring, refused by name with the reason (anything else: "unsupported architecture").
REFUSED = {
    "lfm2moe": "LFM2's mixture-of-experts variant (LFM2-8B-A1B): its expert FFN layers (a router and stacked experts "
               "after the dense leading blocks) are not run by this lab; the dense lfm2 models are",
    "qwen35moe": "Qwen3.5's mixture-of-experts sizes (35B-A3B and up): their routed expert FFNs are not run by this lab; "
                 "the dense qwen35 models (0.8B to 27B) are",
}
# Every other mixture-of-experts file (an architecture named *moe, or any with {arch}.expert_count or a router tensor:
# Mixtral is "llama" with experts) and a multimodal projector (llama.cpp's mmproj files are "clip") are refused by these.
MOE = ("a mixture-of-experts model: its routed expert FFNs (a router, ffn_gate_inp, and stacked experts) are not run "
       "by this lab; its dense models are")
PROJECTOR = ("a multimodal projector (mmproj) file: the image / audio encoder that sits beside a language model's GGUF, "
             "not a language model; load the text model's own GGUF (this lab runs text models only)")
NO_ROPE_STEP = {"smollm3": 4}   # llama_model_smollm3::load_arch_hparams: layers 3, 7, ... have no RoPE
# llama_model_rope_type: LLAMA_ROPE_TYPE_NEOX; qwen35's IMROPE rotates text (one position on every axis) as NEOX does
NEOX = ("qwen2", "qwen3", "phi3", "gemma2", "gemma3", "lfm2", "qwen35", "gemma4")
MAX_L_CACHE = 8     # the longest conv a shortconv kernel holds in registers (LFM2 releases: 3; Qwen3.5: 4)
# Tensors (by name within a block) uploaded as one flat f32 buffer that their kernel reads whole (lab.ops.weights).
FLAT_TENSORS = ("shortconv.conv.weight", "ssm_conv1d.weight")
MAX_SSM_HEAD = 256  # qwen35: the widest delta-net head the kernel holds (every release: 128)
GEMMA = ("gemma2", "gemma3", "gemma4")
# gemma4's mixture-of-experts size (26B-A4B): a router (ffn_gate_inp) and stacked experts beside the dense FFN
GEMMA4_MOE = ("gemma4's mixture-of-experts size (26B-A4B): its routed expert FFNs (ffn_gate_inp, ffn_gate_up_exps, "
              "ffn_down_exps beside the dense FFN) are not run by this lab; the dense gemma4 models (E2B, E4B, 31B) are")
# gemma4: tensors a shared-KV layer may hold that llama.cpp loads (TENSOR_NOT_REQUIRED) and never reads
GEMMA4_UNREAD = ("attn_k.weight", "attn_v.weight", "attn_k_norm.weight")
# Tensors whose VALUES Python reads (everything else only has its offsets read): rope_freqs is n_rot/2 f32.
# gemma4's layer_output_scale: one float a block, a constant of the plan (lab.engine.plans) rather than a buffer
HOST_TENSORS = ("rope_freqs.weight", "layer_output_scale.weight")


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
    rope_freqs_full: bool = False       # gemma4: rope_freqs (proportional RoPE) read by the full layers only
    v_is_k: tuple[bool, ...] = ()       # gemma4: per layer True where the file has no attn_v: V is K's projection
                                        # (attention_k_eq_v; llama.cpp: "if v_proj is not present, use k_proj")

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


def from_gguf(header: Header) -> Config:
    """The model's Config from its GGUF header, read as llama.cpp's loader reads it: the architecture, the config
    keys (type and range: lab.format.checks), the sizes and their agreement, RoPE, the architecture's quirks
    (sliding windows, query scale, soft-caps), then the tensor table against all of it (check_tensors)."""
    md = header.metadata
    arch = md.get("general.architecture")
    if isinstance(arch, str) and arch in REFUSED:
        raise ModelError(f"general.architecture = {show(arch)}: {REFUSED[arch]}")
    if arch == "clip" or any(isinstance(k, str) and k.startswith("clip.") for k in md):
        raise ModelError(f"general.architecture = {show(arch)}: {PROJECTOR}")
    router = next((t.name for t in header.tensors if t.name.endswith("ffn_gate_inp.weight")), None)
    experts = md.get(f"{arch}.expert_count") if isinstance(arch, str) else None
    if arch != "gemma4" and (isinstance(arch, str) and arch.replace("-", "").replace("_", "").endswith("moe")
                             or router or experts):
        why_moe = f"tensor {router}" if router else f"{arch}.expert_count = {show(experts)}" if experts \
            else f"general.architecture = {show(arch)}"
        raise ModelError(f"{why_moe}: {MOE} ({', '.join(ARCHITECTURES)})")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {show(arch)} (general.architecture); this lab runs "
                         f"{', '.join(ARCHITECTURES)}")
    tensors = {t.name: t for t in header.tensors}
    if arch == "gemma4":
        moe = next((n for n in tensors if n.endswith("ffn_gate_inp.weight")), None)
        if moe or md.get("gemma4.expert_count"):
            why_moe = f"tensor {moe}" if moe else f"gemma4.expert_count = {show(md['gemma4.expert_count'])}"
            raise ModelError(f"{why_moe}: {GEMMA4_MOE}")
    kv = check_config(md, arch)
    why: dict[str, str] = {}    # Config field -> the keys its size came from, for the messages of check_tensors
    n_embd, n_vocab = _embedding(arch, kv, tensors, why)
    n_layer, mtp = _layers(arch, kv, tensors, why)
    shortconv, l_cache = _shortconv(arch, kv, n_layer, why)
    delta, ssm = _delta(arch, kv, n_layer, mtp, why)
    l_cache = ssm.pop("l_cache", l_cache)
    n_head, n_head_kv, head_dim = _heads(arch, kv, n_embd, why)
    n_ff = kv["feed_forward_length"]
    why["n_ff"] = f"{arch}.feed_forward_length = {show(n_ff)}"
    g4 = _gemma4(kv, n_layer, n_head, head_dim, tensors, why) if arch == "gemma4" else {}
    n_ff = max(n_ff) if isinstance(n_ff, list) else n_ff
    n_rot, rope_scale, rope_base = _rope(arch, kv, head_dim, tensors, why)
    if arch == "qwen35":
        _text_sections(kv, n_rot)
    window, sliding, base_local = _sliding(arch, kv, n_layer, rope_base)
    attn_cap, final_cap = _softcaps(arch, kv, window)
    gemma = arch in GEMMA
    phi3 = arch == "phi3"
    cfg = Config(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_ff=n_ff, n_vocab=n_vocab, n_ctx_train=kv["context_length"],
        eps=float(kv["attention.layer_norm_rms_epsilon"]),
        rope_base=rope_base,
        rope_base_local=base_local,
        rope_scale=rope_scale,
        n_rot=n_rot,
        rope_neox=arch in NEOX,
        qkv_bias=arch == "qwen2",
        # gemma2's head is always token_embd (an output.weight would be a tensor llama.cpp does not read)
        tied_output=arch == "gemma2" or "output.weight" not in tensors,
        qk_norm=arch in ("gemma3", "qwen3", "lfm2", "qwen35", "gemma4"), post_norms=gemma, gelu=gemma,
        embd_scale=math.sqrt(n_embd) if gemma else 1.0,
        attn_scale=1.0 if arch == "gemma4" else _attention_scale(arch, n_layer, n_embd, n_head, head_dim),
        sliding_window=window if any(sliding) else 0,
        sliding=sliding,
        attn_softcap=attn_cap,
        final_softcap=final_cap,
        # llama.cpp loads rope_freqs for llama (and applies it to every layer); any other arch's file with one is
        # refused by check_tensors as a tensor it does not read.
        rope_freqs=arch == "llama" and "rope_freqs.weight" in tensors,
        fused_qkv=phi3, fused_gate_up=phi3,
        no_rope=tuple((il + 1) % NO_ROPE_STEP[arch] == 0 for il in range(n_layer)) if arch in NO_ROPE_STEP else (),
        shortconv=shortconv, l_cache=l_cache,
        output_norm="token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight",
        ffn_norm="post_attention_norm.weight" if arch == "qwen35" else "ffn_norm.weight",
        delta=delta, attn_gate=arch == "qwen35", mtp_layers=mtp, **ssm, **g4,
    )
    check_tensors(cfg, header, why)
    return cfg


# -- from_gguf's steps: each reads its keys, checks them, and records in `why` the keys behind each size ----------

def _embedding(arch: str, kv: dict, tensors: dict[str, TensorInfo], why: dict[str, str]) -> tuple[int, int]:
    """(n_embd, n_vocab): the residual width from the keys, the vocabulary from token_embd's rows."""
    a = arch + "."
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise ModelError("tensor token_embd.weight is missing")
    n_embd = kv["embedding_length"]
    if len(emb.shape) != 2 or emb.shape[0] != n_embd:
        raise ModelError(f"tensor token_embd.weight has shape {list(emb.shape)}, expected [{n_embd}, vocabulary] "
                         f"from {a}embedding_length = {n_embd}")
    n_vocab = emb.shape[1]
    if kv.get("vocab_size", n_vocab) != n_vocab:
        raise ModelError(f"{a}vocab_size = {kv['vocab_size']}, but token_embd.weight has {n_vocab} rows")
    why.update(n_embd=f"{a}embedding_length = {n_embd}", n_vocab=f"token_embd.weight rows = {n_vocab}")
    return n_embd, n_vocab


def _heads(arch: str, kv: dict, n_embd: int, why: dict[str, str]) -> tuple[int, int, int]:
    """(n_head, n_head_kv, head_dim): query heads, key/value heads (a divisor of them) and the head size, which
    is the key length, or n_embd / n_head where the file has none; the value length must equal it."""
    a = arch + "."
    n_head = kv["attention.head_count"]
    why["n_head"] = f"{a}attention.head_count = {n_head}"
    n_head_kv = kv.get("attention.head_count_kv", n_head)
    why["n_head_kv"] = (f"{a}attention.head_count_kv = {show(n_head_kv)}" if "attention.head_count_kv" in kv
                        else f"{a}attention.head_count_kv absent, so {a}attention.head_count = {n_head}")
    if isinstance(n_head_kv, list):     # lfm2: one per layer, 0 for a short-conv layer (checked in _shortconv)
        n_head_kv = max(n_head_kv)
    if n_head % n_head_kv:
        raise ModelError(f"{a}attention.head_count = {n_head} is not a multiple of "
                         f"{a}attention.head_count_kv = {n_head_kv}")
    if "attention.key_length" in kv:
        head_dim = kv["attention.key_length"]
        why["head_dim"] = f"{a}attention.key_length = {head_dim}"
    else:
        if n_embd % n_head:
            raise ModelError(f"{a}attention.head_count = {n_head} does not divide {a}embedding_length = {n_embd} "
                             f"(and {a}attention.key_length, the head size, is absent)")
        head_dim = n_embd // n_head
        why["head_dim"] = (f"{a}attention.key_length absent, so head size {head_dim} = {a}embedding_length {n_embd} "
                           f"/ {a}attention.head_count {n_head}")
    if kv.get("attention.value_length", head_dim) != head_dim:
        raise ModelError(f"{a}attention.value_length = {kv['attention.value_length']} differs from the key length "
                         f"{head_dim} ({why['head_dim']}): this lab needs them equal")
    if arch == "lfm2" and n_head * head_dim != n_embd:
        # llama_model_lfm2::load_arch_tensors: attn_q and attn_output are [n_embd, n_embd]
        raise ModelError(f"{a}attention.head_count = {n_head} x head size {head_dim} ({why['head_dim']}) is not "
                         f"{a}embedding_length = {n_embd}: an lfm2 attention layer projects n_embd to n_embd")
    return n_head, n_head_kv, head_dim


def _layers(arch: str, kv: dict, tensors: dict[str, TensorInfo], why: dict[str, str]) -> tuple[int, int]:
    """(n_layer, mtp): the blocks run, refused when the file cannot hold that many (checked before anything loops over
    them), and qwen35's trailing multi-token-prediction blocks (llama.cpp: n_layer() = block_count -
    nextn_predict_layers), which this lab skips."""
    a = arch + "."
    n_all = kv["block_count"]
    mtp = kv.get("nextn_predict_layers", 0)
    if mtp >= n_all:
        raise ModelError(f"{a}nextn_predict_layers = {mtp}: the file's {a}block_count = {n_all} leaves no block to run")
    n_layer = n_all - mtp
    why["n_layer"] = f"{a}block_count = {n_all}" + (f" - {a}nextn_predict_layers = {mtp}" if mtp else "")
    # phi3 fuses q/k/v into one tensor and gate/up into another; an lfm2 conv block has 8 (norm, conv, in, out, FFN)
    per_block = 6 if arch == "phi3" else 8 if arch == "lfm2" else 11 if arch == "qwen35" else 9
    if per_block * n_layer > len(tensors):
        raise ModelError(f"{a}block_count = {n_all} needs at least {per_block * n_layer} tensors ({per_block} a "
                         f"block); the file has {len(tensors)}")
    return n_layer, mtp


def _shortconv(arch: str, kv: dict, n_layer: int, why: dict[str, str]) -> tuple[tuple[bool, ...], int]:
    """(shortconv, l_cache) for lfm2, as llama_model_lfm2::load_arch_hparams reads them: a layer is a short-conv
    block where attention.head_count_kv (an array, one per layer; a scalar means every layer) is 0; l_cache is
    shortconv.l_cache, the conv's taps. Other architectures: ((), 0)."""
    if arch != "lfm2":
        return (), 0
    a = arch + "."
    per_layer = kv.get("attention.head_count_kv", kv["attention.head_count"])
    if not isinstance(per_layer, list):
        per_layer = [per_layer] * n_layer
    if len(per_layer) != n_layer:
        raise ModelError(f"{a}attention.head_count_kv has {len(per_layer)} items, but {a}block_count = {n_layer}: "
                         f"an lfm2 file gives one per layer (0 for a short-conv layer)")
    heads = sorted(set(per_layer) - {0})
    if not heads:
        raise ModelError(f"{a}attention.head_count_kv = {show(per_layer)}: every layer is a short-conv layer; this "
                         f"lab runs lfm2 models with at least one attention layer")
    if len(heads) > 1:
        raise ModelError(f"{a}attention.head_count_kv = {show(per_layer)}: attention layers with different KV head "
                         f"counts ({', '.join(map(str, heads))}) are not supported by this lab")
    l_cache = kv["shortconv.l_cache"]
    if not 2 <= l_cache <= MAX_L_CACHE:
        # llama.cpp: GGML_ASSERT(n_shortconv_l_cache > 1); the kernel keeps the window in registers
        raise ModelError(f"{a}shortconv.l_cache = {l_cache}: must be in 2..{MAX_L_CACHE} (the conv's taps; every "
                         f"LFM2 release has 3)")
    if kv.get("attention.sliding_window", 0):
        raise ModelError(f"{a}attention.sliding_window = {kv['attention.sliding_window']}: lfm2 with sliding-window "
                         f"attention layers (llama.cpp's iswa graph) is not supported by this lab")
    if kv.get("attention.causal", True) is not True:
        raise ModelError(f"{a}attention.causal = {show(kv['attention.causal'])}: bidirectional lfm2 (the embedding and "
                         f"ColBERT models) is not a chat model; this lab runs causal lfm2 only")
    why["l_cache"] = f"{a}shortconv.l_cache = {l_cache}"
    why["n_head_kv"] = f"{a}attention.head_count_kv = {show(per_layer)}"
    return tuple(h == 0 for h in per_layer), l_cache


def _delta(arch: str, kv: dict, n_layer: int, mtp: int, why: dict[str, str]) -> tuple[tuple[bool, ...], dict]:
    """(delta, sizes) for qwen35, as llama_model_qwen35::load_arch_hparams reads them: a layer is a gated delta-net
    layer where attention.recurrent_layers says so (one bool per block, the MTP blocks included and false), else
    where (il + 1) % full_attention_interval != 0 (default 4); the conv taps, key and value heads and head size from
    the ssm.* keys. Other architectures: ((), {})."""
    if arch != "qwen35":
        return (), {}
    a = arch + "."
    if "attention.recurrent_layers" in kv:
        per_layer = kv["attention.recurrent_layers"]
        if len(per_layer) != n_layer + mtp:
            raise ModelError(f"{a}attention.recurrent_layers has {len(per_layer)} items, but {a}block_count = "
                             f"{n_layer + mtp}: one per block")
        if any(per_layer[n_layer:]):
            raise ModelError(f"{a}attention.recurrent_layers = {show(per_layer)}: a multi-token-prediction block "
                             f"(after layer {n_layer - 1}) must not be recurrent")
        delta = tuple(per_layer[:n_layer])
        why["delta"] = f"{a}attention.recurrent_layers = {show(per_layer)}"
    else:
        interval = kv.get("full_attention_interval", 4)
        delta = tuple((il + 1) % interval != 0 for il in range(n_layer))
        why["delta"] = f"{a}full_attention_interval = {interval}"
    if all(delta):
        raise ModelError(f"every layer is a delta-net layer ({why['delta']}); this lab runs qwen35 models with at "
                         f"least one attention layer")
    taps, inner, d, v_heads, k_heads = (kv[f"ssm.{k}"] for k in
                                        ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count"))
    if not 2 <= taps <= MAX_L_CACHE:
        raise ModelError(f"{a}ssm.conv_kernel = {taps}: must be in 2..{MAX_L_CACHE} (the conv's taps; every Qwen3.5 "
                         f"release has 4)")
    if v_heads % k_heads:
        raise ModelError(f"{a}ssm.time_step_rank = {v_heads} (value heads) is not a multiple of {a}ssm.group_count = "
                         f"{k_heads} (key heads)")
    if inner != v_heads * d:
        raise ModelError(f"{a}ssm.inner_size = {inner} is not {a}ssm.time_step_rank = {v_heads} x {a}ssm.state_size "
                         f"= {d}: the value width must be the value heads times the head size")
    if d % 16 or d > MAX_SSM_HEAD:
        raise ModelError(f"{a}ssm.state_size = {d}: the delta-net kernel takes head sizes that are multiples of 16 up "
                         f"to {MAX_SSM_HEAD} (every release: 128)")
    why.update(l_cache=f"{a}ssm.conv_kernel = {taps}", ssm_inner=f"{a}ssm.inner_size = {inner}",
               ssm_head_dim=f"{a}ssm.state_size = {d}", ssm_v_heads=f"{a}ssm.time_step_rank = {v_heads}",
               ssm_k_heads=f"{a}ssm.group_count = {k_heads}")
    return delta, {"l_cache": taps, "ssm_k_heads": k_heads, "ssm_v_heads": v_heads, "ssm_head_dim": d}


def _text_sections(kv: dict, n_rot: int) -> None:
    """qwen35 rotates with IMROPE (ggml_rope_multi): rotary pair i takes the position of the axis its sector says
    (sector = i % sum(sections): t where sector % 3 == 0 and sector < 3 s_t, h where % 3 == 1 and < 3 s_h, w where
    % 3 == 2 and < 3 s_w, else the 4th axis, 0 for text). For text, t = h = w = the token's position, so the
    rotation is NEOX's exactly when every pair falls on t, h or w; a pair on the 4th axis would not rotate at all,
    which this lab refuses rather than mimics."""
    key = "qwen35.rope.dimension_sections"
    sections = kv["rope.dimension_sections"]
    if len(sections) < 4 or any(not 0 <= s <= U32_MAX for s in sections) or sum(sections[:4]) == 0:
        raise ModelError(f"{key} = {show(sections)}: four section sizes expected (llama.cpp reads 4)")
    t, h, w, _e = sections[:4]
    total = sum(sections[:4])
    for i in range(n_rot // 2):
        sector = i % total
        axis = sector % 3
        if not ((axis == 0 and sector < 3 * t) or (axis == 1 and sector < 3 * h) or (axis == 2 and sector < 3 * w)):
            raise ModelError(f"{key} = {show(sections)}: rotary pair {i} of {n_rot // 2} falls on the fourth axis, "
                             f"which text leaves at position 0; this lab rotates text when every pair takes the "
                             f"token's position (Qwen3.5 releases: [11, 11, 10, 0] over 64 rotated dims)")


def _rope(arch: str, kv: dict, head_dim: int, tensors: dict[str, TensorInfo],
          why: dict[str, str]) -> tuple[int, float, float]:
    """(n_rot, rope_scale, rope_base): the rotated dimensions of a head, the position multiplier and the
    frequency base, refusing what this lab does not rotate as llama.cpp would."""
    a = arch + "."
    n_rot = kv.get("rope.dimension_count", head_dim)
    if n_rot % 2 or n_rot > head_dim:
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: must be even and at most the head size {head_dim} "
                         f"({why['head_dim']})")
    if arch in ("llama", "smollm3") and n_rot != head_dim:   # llama.cpp: "invalid n_rot" / GGML_ASSERT
        raise ModelError(f"{a}rope.dimension_count = {n_rot}: a {arch} model rotates the whole head of {head_dim} "
                         f"({why['head_dim']})")
    # RoPE scaling as llama.cpp reads it: type "linear" when absent; factor from rope.scaling.factor, else
    # the older rope.scale_linear; 0 or absent means 1; type "none" never scales. yarn and longrope are
    # refused by name in lab.format.checks.
    factor_key = next((k for k in ("rope.scaling.factor", "rope.scale_linear") if k in kv), None)
    factor = kv[factor_key] if factor_key else 0.0
    rope_scale = 1.0 if kv.get("rope.scaling.type", "linear") == "none" or factor == 0 else 1.0 / factor
    if arch == "gemma3" and rope_scale != 1.0:
        # llama.cpp scales gemma3's global layers only (rope_freq_scale_train_swa = 1); Config has one scale.
        raise ModelError(f"{a}{factor_key} = {show(factor)}: linear RoPE scaling of gemma3's global layers only "
                         f"is not supported by this lab yet")
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in tensors:
            # llama.cpp picks long or short by the context asked for, with YaRN-like attention scaling (LongRoPE).
            raise ModelError(f"tensor {name}: long-context RoPE factors (LongRoPE, Phi-3 128k) are not supported "
                             f"by this lab")
    return n_rot, rope_scale, float(kv.get("rope.freq_base", 10000.0))


def _sliding(arch: str, kv: dict, n_layer: int, rope_base: float) -> tuple[int, tuple[bool, ...], float]:
    """(window, sliding, rope_base_local): the keys a sliding layer sees (0: none), which layers slide, and
    their RoPE base."""
    # Sliding windows, as each llama.cpp loader sets them. llama: the key is never read (full causal attention:
    # llama.cpp runs Mistral-style files without a window, and so does this lab). phi3: read, then switched off
    # ("Phi SWA is currently disabled"). gemma2: always on, 4096 unless the key says otherwise, every other
    # layer (pattern 2: even layers slide). gemma3: only when the key is present and > 0, pattern 6.
    if arch == "gemma2":
        window = kv.get("attention.sliding_window", 4096)
        period = kv.get("attention.sliding_window_pattern", 2)
    elif arch == "gemma3":
        window = kv.get("attention.sliding_window", 0)
        period = kv.get("attention.sliding_window_pattern", 6)
    elif arch == "gemma4":      # the pattern is a per-layer array (checked in _gemma4); base_swa defaults to 10000
        pattern = kv["attention.sliding_window_pattern"]
        return kv["attention.sliding_window"], tuple(pattern), float(kv.get("rope.freq_base_swa", 10000.0))
    else:
        window, period = 0, 1
    # llama_hparams::set_swa_pattern(n, dense_first=false): layer il slides iff n == 0 or il % n < n - 1.
    sliding = tuple(window > 0 and (period == 0 or il % period < period - 1) for il in range(n_layer))
    # Sliding layers' RoPE base: gemma2 defaults to the global base, gemma3 to 10000 (rope_freq_base_train_swa).
    base_local = float(kv.get("rope.freq_base_swa", rope_base if arch == "gemma2" else 10000.0)) if arch in GEMMA \
        else rope_base
    return window, sliding, base_local


def _gemma4(kv: dict, n_layer: int, n_head: int, head_dim: int, tensors: dict[str, TensorInfo],
            why: dict[str, str]) -> dict:
    """gemma4's Config fields as llama_model_gemma4::load_arch_hparams reads them, each refused by name where this
    lab (or llama.cpp) cannot run it: the per-layer sliding array, the sliding layers' head size and rotated dims,
    per-layer KV heads and FFN widths, the shared-KV tail (whose last two own layers must be a sliding then a full
    one: llama.cpp's layer_reuse_cb reads them by kind), the per-layer embedding width, out_scale, and the full
    layers' rope_freqs."""
    a = "gemma4."
    pattern = kv["attention.sliding_window_pattern"]
    if len(pattern) != n_layer:
        raise ModelError(f"{a}attention.sliding_window_pattern has {len(pattern)} items, but {why['n_layer']}")
    hd_swa = kv["attention.key_length_swa"]
    if kv["attention.value_length_swa"] != hd_swa:
        raise ModelError(f"{a}attention.value_length_swa = {kv['attention.value_length_swa']} differs from "
                         f"{a}attention.key_length_swa = {hd_swa}: Gemma 4 needs them equal (llama.cpp refuses too)")
    n_rot_swa = kv.get("rope.dimension_count_swa", hd_swa)
    if n_rot_swa % 2 or n_rot_swa > hd_swa:
        raise ModelError(f"{a}rope.dimension_count_swa = {n_rot_swa}: must be even and at most {a}"
                         f"attention.key_length_swa = {hd_swa}")
    per_layer = {}
    for key in ("attention.head_count_kv", "feed_forward_length"):
        v = kv.get(key, n_head)
        if isinstance(v, list):
            if len(v) != n_layer:
                raise ModelError(f"{a}{key} has {len(v)} items, but {why['n_layer']}")
            if 0 in v:
                raise ModelError(f"{a}{key} = {show(v)}: every gemma4 layer attends and has an FFN (no 0)")
            per_layer[key] = tuple(v)
    heads = per_layer.get("attention.head_count_kv", ())
    bad = next((n for n in heads if n_head % n), None)
    if bad:
        raise ModelError(f"{a}attention.head_count = {n_head} is not a multiple of {a}attention.head_count_kv item {bad}")
    shared = kv.get("attention.shared_kv_layers", 0)
    kv_from = n_layer - shared if shared else -1
    if shared:
        # llama.cpp asserts n_layer_kv_from_start >= 2 and reads kv_from - 2 for a sliding layer, kv_from - 1 for a full
        # one; a file where those are not of that kind would attend a cache of another head size
        if kv_from < 2 or not pattern[kv_from - 2] or pattern[kv_from - 1]:
            raise ModelError(f"{a}attention.shared_kv_layers = {shared}: layers {kv_from}.. would read the K/V of "
                             f"layers {kv_from - 2} (must slide) and {kv_from - 1} (must be full), which "
                             f"{a}attention.sliding_window_pattern does not give")
    if not all(pattern) and "rope_freqs.weight" not in tensors:
        raise ModelError("tensor rope_freqs.weight is missing (a gemma4 model's full layers need it: proportional RoPE)")
    why.update(head_dim_swa=f"{a}attention.key_length_swa = {hd_swa}", n_embd_per_layer=(
        f"{a}embedding_length_per_layer_input = {kv['embedding_length_per_layer_input']}"))
    return dict(head_dim_swa=hd_swa, n_rot_swa=n_rot_swa, kv_heads=heads,
                ff_widths=per_layer.get("feed_forward_length", ()), kv_from_start=kv_from,
                n_embd_per_layer=kv["embedding_length_per_layer_input"], v_norm=True,
                out_scale="blk.0.layer_output_scale.weight" in tensors,
                v_is_k=tuple(f"blk.{il}.attn_v.weight" not in tensors and (kv_from < 0 or il < kv_from)
                             for il in range(n_layer)),
                rope_freqs_full="rope_freqs.weight" in tensors)


def _attention_scale(arch: str, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """The query scale (f_attention_scale): 1/sqrt(head size), except the 27B gemmas (46 / 62 layers), which
    use 1/sqrt(n_embd / n_head); llama.cpp decides by layer count and ignores query_pre_attn_scalar."""
    big_gemma = (arch, n_layer) in (("gemma2", 46), ("gemma3", 62))
    return 1.0 / math.sqrt(n_embd // n_head if big_gemma else head_dim)


def _softcaps(arch: str, kv: dict, window: int) -> tuple[float, float]:
    """(attention cap, final cap), 0 for none: gemma2 always caps (llama_hparams defaults 50 / 30 when the keys
    are absent); gemma3's final cap only where the key is present and the model has no sliding window (its
    non-SWA graph)."""
    if arch == "gemma2":
        return float(kv.get("attn_logit_softcapping", 50.0)), float(kv.get("final_logit_softcapping", 30.0))
    if arch == "gemma3":
        return 0.0, 0.0 if window > 0 else float(kv.get("final_logit_softcapping", 0.0))
    if arch == "gemma4":        # the final cap only, where the key is present (the sliding graph applies it too)
        return 0.0, float(kv.get("final_logit_softcapping", 0.0))
    return 0.0, 0.0


def _symbolic_tensors(cfg: Config, stored: bool = False) -> dict[str, tuple[str, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first) in Config field names.
    stored=True: as the file holds them (fused tensors whole, rope_freqs included); else as the engine reads
    them (fused tensors as their row views, see tensor_views; rope_freqs read by the host, not uploaded)."""
    e, q, kv, ff, v = "n_embd", "n_head * head_dim", "n_head_kv * head_dim", "n_ff", "n_vocab"
    shapes = {"token_embd.weight": (e, v), cfg.output_norm: (e,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (e, v)
    if stored and cfg.rope_freqs:
        shapes["rope_freqs.weight"] = ("rope_pairs",)
    if stored and cfg.rope_freqs_full:      # gemma4: [head_dim / 2] of the full layers
        shapes["rope_freqs.weight"] = ("rope_pairs",)
    if cfg.n_embd_per_layer:                # gemma4's per-layer token embeddings, their projection and its norm
        shapes.update({"per_layer_token_embd.weight": ("n_embd_per_layer * n_layer", v),
                       "per_layer_model_proj.weight": (e, "n_embd_per_layer * n_layer"),
                       "per_layer_proj_norm.weight": ("n_embd_per_layer",)})
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        shapes[b + "attn_norm.weight"] = (e,)
        if cfg.arch == "qwen35":
            shapes.update(_qwen35_block(cfg, b, il, stored))
            continue
        if cfg.arch == "gemma4":
            shapes.update(_gemma4_block(cfg, b, il, stored))
            continue
        if cfg.is_conv(il):     # lfm2's short-conv block in place of attention (llama_model_lfm2::load_arch_tensors)
            shapes.update({b + "shortconv.conv.weight": ("l_cache", e), b + "shortconv.in_proj.weight": (e, "bcx_rows"),
                           b + "shortconv.out_proj.weight": (e, e), b + "ffn_norm.weight": (e,),
                           b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff), b + "ffn_down.weight": (ff, e)})
            continue
        if stored and cfg.fused_qkv:
            shapes[b + "attn_qkv.weight"] = (e, "qkv_rows")
        else:
            shapes.update({b + "attn_q.weight": (e, q), b + "attn_k.weight": (e, kv), b + "attn_v.weight": (e, kv)})
        shapes.update({b + "attn_output.weight": (q, e), b + "ffn_norm.weight": (e,)})
        if stored and cfg.fused_gate_up:
            shapes[b + "ffn_up.weight"] = (e, "gate_up_rows")
        else:
            shapes.update({b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff)})
        shapes[b + "ffn_down.weight"] = (ff, e)
        if cfg.qkv_bias:
            shapes.update({b + "attn_q.bias": (q,), b + "attn_k.bias": (kv,), b + "attn_v.bias": (kv,)})
        if cfg.qk_norm:
            shapes.update({b + "attn_q_norm.weight": ("head_dim",), b + "attn_k_norm.weight": ("head_dim",)})
        if cfg.post_norms:
            shapes.update({b + "post_attention_norm.weight": (e,), b + "post_ffw_norm.weight": (e,)})
    return shapes


def _qwen35_block(cfg: Config, b: str, il: int, stored: bool) -> dict[str, tuple[str, ...]]:
    """A qwen35 block's tensors but attn_norm (llama_model_qwen35::load_block_trunk): a gated delta-net layer (the
    fused in-projection of q, k, v, the output gate z, beta and alpha, the conv kernel, dt's bias, A (stored as
    -exp(A_log)), the gated norm and the out-projection) or a gated attention layer (Q rows [q | gate] per head, stored
    as one tensor; the engine reads each head's two halves as views: tensor_views); post_attention_norm (the FFN's
    input norm) and the FFN in both."""
    e, kv, ff = "n_embd", "n_head_kv * head_dim", "n_ff"
    out: dict[str, tuple[str, ...]] = {}
    if cfg.is_delta(il):
        out.update({b + "attn_qkv.weight": (e, "conv_channels"), b + "attn_gate.weight": (e, "ssm_inner"),
                    b + "ssm_conv1d.weight": ("l_cache", "conv_channels"), b + "ssm_dt.bias": ("ssm_v_heads",),
                    b + "ssm_a": ("ssm_v_heads",), b + "ssm_beta.weight": (e, "ssm_v_heads"),
                    b + "ssm_alpha.weight": (e, "ssm_v_heads"), b + "ssm_norm.weight": ("ssm_head_dim",),
                    b + "ssm_out.weight": ("ssm_inner", e)})
    else:
        if stored:
            out[b + "attn_q.weight"] = (e, "q_gate_rows")
        else:
            for h in range(cfg.n_head):
                out.update({f"{b}attn_q.weight#q{h}": (e, "head_dim"), f"{b}attn_q.weight#g{h}": (e, "head_dim")})
        out.update({b + "attn_k.weight": (e, kv), b + "attn_v.weight": (e, kv),
                    b + "attn_output.weight": ("n_head * head_dim", e),
                    b + "attn_q_norm.weight": ("head_dim",), b + "attn_k_norm.weight": ("head_dim",)})
    out.update({b + "post_attention_norm.weight": (e,), b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff),
                b + "ffn_down.weight": (ff, e)})
    return out


def _gemma4_block(cfg: Config, b: str, il: int, stored: bool) -> dict[str, tuple[str, ...]]:
    """A gemma4 block's tensors but attn_norm (llama_model_gemma4::load_arch_tensors), each size the layer's own
    ("head_dim@3": head_dim_of(3)): Q with its norm; K, V and K's norm on layers with their own K/V; the output, the
    post-attention norm, the GeGLU FFN and its norms; the per-layer embedding's gate, projection and norm; out_scale."""
    e, hd, q = "n_embd", f"head_dim@{il}", f"n_head * head_dim@{il}"
    kv, ff = f"n_head_kv@{il} * head_dim@{il}", f"n_ff@{il}"
    out = {b + "attn_q.weight": (e, q), b + "attn_q_norm.weight": (hd,)}
    if cfg.has_kv(il):
        out.update({b + "attn_k.weight": (e, kv), b + "attn_k_norm.weight": (hd,)})
        if not (stored and cfg.v_is_k[il]):     # V = K: the engine reads attn_k's rows again as attn_v (tensor_views)
            out[b + "attn_v.weight"] = (e, kv)
    out.update({b + "attn_output.weight": (q, e), b + "post_attention_norm.weight": (e,), b + "ffn_norm.weight": (e,),
                b + "ffn_gate.weight": (e, ff), b + "ffn_up.weight": (e, ff), b + "ffn_down.weight": (ff, e),
                b + "post_ffw_norm.weight": (e,)})
    if cfg.n_embd_per_layer:
        out.update({b + "inp_gate.weight": (e, "n_embd_per_layer"), b + "proj.weight": ("n_embd_per_layer", e),
                    b + "post_norm.weight": (e,)})
    if cfg.out_scale and stored:    # read by the host (HOST_TENSORS), not uploaded
        out[b + "layer_output_scale.weight"] = ("one",)
    return out


def stored_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the file must hold, with its GGUF shape (ne0 first)."""
    return {name: tuple(_size(cfg, d) for d in dims) for name, dims in _symbolic_tensors(cfg, True).items()}


def tensor_views(cfg: Config, tensors: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """The file's tensors as the engine reads them: phi3's fused attn_qkv as three row ranges (attn_q, attn_k,
    attn_v) and its ffn_up [gate | up] as ffn_gate (rows 0..n_ff-1, the half ggml_swiglu puts through SiLU) and
    ffn_up (rows n_ff..2 n_ff-1). A view is the same file bytes (rows are contiguous), so the engine stacks
    them back into one weight without a second copy."""
    out = dict(tensors)

    def split(name: str, parts: list[tuple[str, int]]) -> None:
        t = out.pop(name)
        row_bytes = t.type.row_bytes(t.shape[0])
        first = 0
        for part, rows in parts:
            out[part] = replace(t, name=part, shape=(t.shape[0], rows), offset=t.offset + first * row_bytes,
                                nbytes=rows * row_bytes)
            first += rows

    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        if cfg.v_is_k and cfg.v_is_k[il]:     # gemma4 without attn_v: V's rows are K's (the same file bytes)
            out[b + "attn_v.weight"] = replace(out[b + "attn_k.weight"], name=b + "attn_v.weight")
        if cfg.attn_gate and not cfg.is_delta(il):   # qwen35: each head's rows [q | gate], as two views a head
            split(b + "attn_q.weight", [(f"{b}attn_q.weight#{part}{h}", cfg.head_dim)
                                        for h in range(cfg.n_head) for part in "qg"])
        if cfg.fused_qkv:
            split(b + "attn_qkv.weight", [(b + "attn_q.weight", cfg.q_dim), (b + "attn_k.weight", cfg.kv_dim),
                                          (b + "attn_v.weight", cfg.kv_dim)])
        if cfg.fused_gate_up:
            split(b + "ffn_up.weight", [(b + "ffn_gate.weight", cfg.n_ff), (b + "ffn_up.weight", cfg.n_ff)])
    return out


def host_tensors(cfg: Config, header: Header) -> list[TensorInfo]:
    """The tensors whose values the host must read and hand to the engine (HOST_TENSORS the model uses)."""
    def used(name: str) -> bool:
        if name == "rope_freqs.weight":
            return cfg.rope_freqs or cfg.rope_freqs_full
        return cfg.out_scale and name.startswith("blk.") and name.split(".", 2)[2] == "layer_output_scale.weight"
    return [t for t in header.tensors if used(t.name)]


def _size(cfg: Config, dim: str) -> int:
    if dim == "qkv_rows":
        return cfg.q_dim + 2 * cfg.kv_dim
    if dim == "gate_up_rows":
        return 2 * cfg.n_ff
    if dim == "bcx_rows":       # lfm2's in_proj: [B | C | x], n_embd rows each
        return 3 * cfg.n_embd
    if dim == "q_gate_rows":    # qwen35's attn_q: [q | gate] per head
        return 2 * cfg.q_dim
    if dim == "one":
        return 1
    n = 1
    for f in dim.split(" * "):
        name, _, il = f.partition("@")      # "head_dim@3": layer 3's own (gemma4)
        n *= getattr(cfg, f"{name}_of")(int(il)) if il else getattr(cfg, name)
    return n


def is_flat(name: str) -> bool:
    """Whether tensor `name` is uploaded as one flat f32 buffer its kernel reads whole (FLAT_TENSORS)."""
    return name.startswith("blk.") and name.split(".", 2)[2] in FLAT_TENSORS


def expected_tensors(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its GGUF shape (ne0 first)."""
    return {name: tuple(_size(cfg, d) for d in dims) for name, dims in _symbolic_tensors(cfg).items()}


def check_tensors(cfg: Config, header: Header, why: dict[str, str] | None = None) -> None:
    """Every expected tensor present with its shape and a type we can read; 1-D tensors in F32; no
    other tensor (llama.cpp refuses a file with tensors it does not read, and so does this lab: an
    unread rope_freqs or bias would change the output). why: Config field -> the keys it came from."""
    why = why or {}
    have = {t.name: t for t in header.tensors}
    layers = why.get("n_layer", f"{cfg.n_layer} blocks")
    expected = _symbolic_tensors(cfg, stored=True)
    for name, dims in expected.items():
        t = have.get(name)
        if t is None:
            raise ModelError(f"tensor {name} is missing (a {cfg.arch} model needs it"
                             f"{f'; {layers}' if name.startswith('blk.') else ''})")
        shape = tuple(_size(cfg, d) for d in dims)
        if tuple(t.shape) != shape:
            fields = dict.fromkeys(f.partition("@")[0] for d in dims for f in d.split(" * "))
            src = "; ".join(why[f] for f in fields if f in why)
            raise ModelError(f"tensor {name} has shape {list(t.shape)}, expected {list(shape)} = "
                             f"[{', '.join(dims)}]{f' from {src}' if src else ''}")
        if t.type_id not in SUPPORTED:
            raise ModelError(f"tensor {name} has type {type_name(t.type_id)}, which this lab cannot read yet "
                             f"(it reads {', '.join(KERNEL_TYPES)})")
        if len(shape) == 1 and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; 1-D tensors must be F32")
        if is_flat(name) and t.type.name != "F32":
            raise ModelError(f"tensor {name} is {t.type.name}; the short-conv kernel reads it as F32")
    for t in header.tensors:
        if t.name not in expected:
            block = t.name.split(".")[1] if t.name.startswith("blk.") else ""
            if cfg.mtp_layers and block.isdigit() and cfg.n_layer <= int(block) < cfg.n_layer + cfg.mtp_layers:
                continue    # a multi-token-prediction block: skipped on purpose (Config.skipped says so)
            if (cfg.kv_from_start >= 0 and block.isdigit() and cfg.kv_from_start <= int(block) < cfg.n_layer
                    and t.name.split(".", 2)[2] in GEMMA4_UNREAD):
                continue    # a shared-KV layer's own K/V weights: llama.cpp loads and never reads them (skipped)
            extra = f" ({layers})" if block.isdigit() and int(block) >= cfg.n_layer else ""
            raise ModelError(f"tensor {t.name} is not one a {cfg.arch} model reads here{extra}: refused rather "
                             f"than ignored")
