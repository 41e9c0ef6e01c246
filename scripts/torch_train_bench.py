r"""The peer of `lab train`: PyTorch eager training the same LoRA adapter on the same GGUF model, the same windows in
the same order, with the same loss and optimizer, so that the lab's training speed has a like-for-like baseline on the
lent GPU (docs/training.md). Written from lab/host/reference (forward.py and ops.py, the numpy oracle that follows
llama.cpp op for op), not from transformers: the function computed is the lab's, which
tests/unit/test_torch_train_bench.py holds to the float64 oracle (logits, loss, LoRA gradients).

The model: a GGUF of the dense llama family -- `llama` (Llama 2/3, with Llama 3's rope_freqs; SmolLM2, Mistral) and
`qwen2` (Q/K/V biases) -- every tensor dequantized by gguf-py (as lab.host.reference.weights does) to float32 torch
tensors on the GPU (cuda when there is one, else the CPU), frozen. Other architectures are refused. The forward in
plain torch ops: embedding rows; per layer RMSNorm * attn_norm, Q/K/V projections (+ bias), RoPE as llama.cpp applies
it (llama: adjacent pairs, "NORM", on the GGUF's permuted Q/K rows; qwen2: NEOX halves; theta_i = pos * base^(-2i/n_rot)
* freq_scale / rope_freqs[i]; angles in float64), grouped-query causal attention (Q K^T * 1/sqrt(head_dim), -inf above
the diagonal, softmax, P V: plain matmuls, or torch's scaled_dot_product_attention with --sdpa), Wo (+ bias), residual,
RMSNorm * ffn_norm, SwiGLU (silu(gate) * up, down), residual; the final RMSNorm and the head (output.weight, or
token_embd when tied).

The adapter (lab.engine.lora's): on attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up and ffn_down of every layer,
A [r, n_in] and B [n_out, r] as torch parameters (float32), y = x W^T (+ b) + (alpha / r) (x A^T) B^T; A uniform in
+-1/sqrt(n_in) and B zero, drawn exactly as lab.engine.lora.Lora.initial(seed) draws them (random.Random(seed), layer
by layer, in that order), so that both start from the same adapter.

The training (lab.instruments.training's): the text tokenized as `lab train` does (lab.host.loading.read_model's
tokenizer, no BOS), windows of T at stride T (training.windows), step s taking B windows from s * B, wrapping
(training.batch_of), all B in one batched forward; loss = mean over windows and positions t < T-1 of -log p(w[t+1]);
torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8, weight decay 0) after clip_grad_norm_(1.0), the learning rate of step
s + 1 the lab's schedule (lab.ops.optimizer.schedule: no warm-up, a cosine from lr to lr / 10 at the last step, as
`lab train` runs by default; --lr-schedule constant for a flat lr).

Prints one JSON line: {"peer": "torch-eager", "device", "model", "arch", "dtype", "attention", "T", "batch", "rank",
"alpha", "steps", "warmup_steps", "losses", "tokens_per_s", "step_ms", "params", "peak_mem_bytes", ...}. tokens_per_s
counts B * T tokens a step (as `lab train` does) over the steps after the first --warmup-steps, timed between
torch.cuda.synchronize() calls; tokens_per_s_all over every step, the warm-up ones included (as `lab train --json`
reports its own tokens_per_s); each step reads its loss back (as the lab's step does). peak_mem_bytes: CUDA's
max_memory_allocated (weights included), or the process's peak RSS on the CPU.

Importable (the test does): load_model(path, device, dtype) -> Model; add_lora(model, rank, alpha, seed) -> {name: (A,
B)}; forward(model, ids [B, T]) -> logits [B, T, n_vocab]; loss_of(model, ids) -> the scalar loss; loss_and_grads(model,
windows) -> (loss, {name: (dA, dB)}); train(model, windows, ...) -> the report.

On the lent GPU (Python 3.12, numpy, torch and CUDA there, no network; gguf-py from the repo's git-ignored .whl/ folder,
which scripts/device_bench_prepare.sh fills here, installed as scripts/device_bench.sh does): run with carry=[".whl"]
and timeout_s=600 this command, exactly (valid bash as it stands, newlines included):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && cat README.md docs/*.md > /tmp/train.txt &&
    for m in llama3.2-1b qwen2.5; do
      M=$(python3 -c "from lab.host.synthetic import releases; print(releases.cached('$m'))") &&
      python3 scripts/torch_train_bench.py "$M" --data /tmp/train.txt --ctx 512 --batch 1 --rank 8 --alpha 16 \
        --steps 12 --warmup-steps 2 --lr 1e-3 --seed 0 | tee -a "$OUT/torch_train.jsonl"
    done

(--sdpa: torch's fused attention; --tf32: TensorFloat-32 matmuls; --batch 4 etc. for other shapes). The lab's side of
the same work, in the same call (carry=[".gl", ".whl"] and device_bench.sh's Vulkan set-up first):
    python3 -m lab.host.cli train "$M" --data /tmp/train.txt --ctx 512 --batch 1 --lora-rank 8 --lora-alpha 16 \
      --steps 12 --lr 1e-3 --seed 0 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# lab.engine.lora.DEFAULT_TARGETS less phi3's fused attn_qkv and lfm2's short-conv projections (this family has none),
# in its order: the init's order
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
ARCHS = ("llama", "qwen2")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Refused(ValueError):
    """A model this peer does not run, in words a user reads."""


@dataclass
class Model:
    """A loaded model: hyperparameters (lab.host.reference.weights.Hparams), the frozen tensors by GGUF name (W as
    (out, in)), the RoPE tables, and the adapter once add_lora has made one."""
    path: Path
    hp: object
    w: dict[str, torch.Tensor]
    device: torch.device
    dtype: torch.dtype
    lora: dict[str, tuple[torch.nn.Parameter, torch.nn.Parameter]] = field(default_factory=dict)
    full: bool = False      # every tensor of w a parameter (make_full): `lab train --full`'s peer
    scale: float = 1.0
    sdpa: bool = False
    _rope: dict = field(default_factory=dict)

    @property
    def head(self) -> torch.Tensor:
        return self.w["output.weight"] if "output.weight" in self.w else self.w["token_embd.weight"]

    def params(self) -> list[torch.nn.Parameter]:
        if self.full:
            return list(self.w.values())
        return [p for pair in self.lora.values() for p in pair]


def _refuse_features(hp) -> None:
    if hp.arch not in ARCHS:
        raise Refused(f"torch_train_bench: architecture {hp.arch!r} is not run here (the dense llama family only: "
                      f"{', '.join(ARCHS)})")
    checks = (("Q/K norms", hp.qk_norm), ("post-norms", hp.post_norms), ("sliding-window layers", hp.n_swa),
              ("soft-capping", hp.final_softcap or hp.attn_softcap), ("an embedding scale", hp.embed_scale != 1.0),
              ("GeGLU", hp.ffn_act != "silu"), ("NoPE layers", hp.no_rope_step),
              ("a value length unlike the key's", hp.head_dim_v != hp.head_dim))
    odd = [name for name, on in checks if on]
    if odd:
        raise Refused(f"torch_train_bench: this {hp.arch} file has {', '.join(odd)}, which this peer does not "
                      "implement")


def load_model(path, device=None, dtype=torch.float32, threads: int | None = None) -> Model:
    """Every tensor of the GGUF at `path` dequantized by gguf-py (in float32, as lab.host.reference.weights does) and
    put on `device` (default: cuda when available, else cpu) as `dtype`, frozen. Refuses (Refused) an architecture
    other than llama and qwen2, and a llama-family file with features this forward does not have."""
    from gguf.quants import dequantize

    from lab.host.reference.weights import Hparams, Weights
    if isinstance(dtype, str):
        dtype = DTYPES[dtype]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    src = Weights(path)
    hp = Hparams.from_weights(src) if src.meta("general.architecture") in ARCHS else None
    if hp is None:
        raise Refused(f"torch_train_bench: architecture {src.meta('general.architecture')!r} is not run here "
                      f"(the dense llama family only: {', '.join(ARCHS)})")
    _refuse_features(hp)
    for il in range(hp.n_layer):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
            if f"blk.{il}.{kind}.weight" not in src:
                raise Refused(f"torch_train_bench: blk.{il}.{kind}.weight is missing (a fused layout is not run here)")

    def one(name: str) -> tuple[str, torch.Tensor]:
        t = src.tensors[name]
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(src.shape(name))
        a = np.ascontiguousarray(a)
        if not a.flags.writeable:       # an F32 tensor: a view of the read-only memory map
            a = a.copy()
        return name, torch.from_numpy(a).to(device=device, dtype=dtype)

    names = [n for n in src.tensors if n != "rope_freqs.weight"]      # hp.rope_factors holds those (float64)
    with ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1)) as ex:
        w = dict(ex.map(one, names))
    for t in w.values():
        t.requires_grad_(False)
    return Model(Path(path), hp, w, device, dtype)


def make_full(model: Model) -> None:
    """Full fine-tuning, as `lab train --full` takes it: every tensor the forward reads a parameter (the matrices, the
    norms, the embedding table, which a tied head shares: its gradient takes both shares). llama files only: qwen2,
    whose Q/K/V biases `lab train --full` trains too, is not compared here yet."""
    if model.hp.arch != "llama":
        raise Refused(f"torch_train_bench --full: {model.hp.arch} is refused (this peer compares llama-family files "
                      f"alone in full)")
    model.w = {n: torch.nn.Parameter(t) for n, t in model.w.items()}
    model.full = True


def add_lora(model: Model, rank: int, alpha: float | None = None, seed: int = 0, targets=TARGETS,
             param_dtype: torch.dtype | None = None) -> dict:
    """The adapter on every layer's `targets`: A [rank, n_in] uniform in +-1/sqrt(n_in), B [n_out, rank] zero, drawn as
    lab.engine.lora.Lora.initial(seed) draws them (float32 values); scale alpha / rank (alpha None: 2 * rank, `lab
    train`'s default; 0: scale 1, as llama.cpp's get_scale). Parameters in float32 (float64 for a float64 model)."""
    hp = model.hp
    if alpha is None:
        alpha = 2.0 * rank
    pd = param_dtype or (torch.float64 if model.dtype == torch.float64 else torch.float32)
    rng = random.Random(seed)
    model.lora = {}
    for il in range(hp.n_layer):
        for kind in targets:
            name = f"blk.{il}.{kind}.weight"
            n_out, n_in = model.w[name].shape
            if not 1 <= rank <= min(n_in, n_out):
                raise Refused(f"LoRA rank {rank}: from 1 to {min(n_in, n_out)} for {name}")
            bound = 1.0 / math.sqrt(n_in)
            a = np.array([rng.uniform(-bound, bound) for _ in range(rank * n_in)], dtype=np.float32)
            A = torch.nn.Parameter(torch.from_numpy(a.reshape(rank, n_in)).to(model.device, pd))
            B = torch.nn.Parameter(torch.zeros(n_out, rank, device=model.device, dtype=pd))
            model.lora[name] = (A, B)
    model.scale = alpha / rank if alpha else 1.0
    return model.lora


def set_lora(model: Model, pairs: dict, alpha: float) -> None:
    """The adapter from given values {name: (A [r, n_in], B [n_out, r])} (numpy or torch): the tests' random B."""
    pd = torch.float64 if model.dtype == torch.float64 else torch.float32
    model.lora = {n: (torch.nn.Parameter(torch.as_tensor(np.asarray(a), dtype=pd, device=model.device).clone()),
                      torch.nn.Parameter(torch.as_tensor(np.asarray(b), dtype=pd, device=model.device).clone()))
                  for n, (a, b) in pairs.items()}
    rank = next(iter(pairs.values()))[1].shape[1]
    model.scale = alpha / rank if alpha else 1.0


# -- the forward ---------------------------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """ggml_rms_norm over the last axis times the stored weight (ops.rms_norm); the mean square in float32 at least."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * w


def rope_tables(model: Model, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, n_rot/2] of ops.rope: theta = pos * freq_scale * base^(-2i/n_rot) / factors[i], in float64,
    cast to the model's dtype; cached per T."""
    got = model._rope.get(T)
    if got is None:
        hp = model.hp
        half = hp.n_rot // 2
        inv = hp.rope_scale * hp.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / hp.n_rot)
        if hp.rope_factors is not None:
            inv = inv / np.asarray(hp.rope_factors, dtype=np.float64)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        got = tuple(torch.from_numpy(f(ang)).to(model.device, model.dtype)[:, None, :] for f in (np.cos, np.sin))
        model._rope[T] = got
    return got


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, mode: str) -> torch.Tensor:
    """ggml_rope_ext on x [B, T, heads, hd]: the first n_rot dims of each head rotated, the rest kept. "norm": pairs
    (x[2i], x[2i+1]) (llama's, on the GGUF's permuted rows); "neox": pairs (x[i], x[i + n_rot/2])."""
    hd = x.shape[-1]
    rot, rest = (x, None) if n_rot == hd else (x[..., :n_rot], x[..., n_rot:])
    if mode == "norm":
        pairs = rot.unflatten(-1, (n_rot // 2, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    elif mode == "neox":
        x0, x1 = rot[..., :n_rot // 2], rot[..., n_rot // 2:]
        out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    else:
        raise ValueError(f"rope mode {mode!r}")
    return out if rest is None else torch.cat((out, rest), dim=-1)


def linear(model: Model, x: torch.Tensor, il: int, kind: str) -> torch.Tensor:
    """x W^T (+ b) (+ scale (x A^T) B^T where the adapter has this matrix)."""
    name = f"blk.{il}.{kind}.weight"
    y = F.linear(x, model.w[name], model.w.get(f"blk.{il}.{kind}.bias"))
    pair = model.lora.get(name)
    if pair is not None:
        a, b = pair
        y = y + model.scale * F.linear(F.linear(x, a.to(x.dtype)), b.to(x.dtype))
    return y


def attention(model: Model, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention: q [B, n_head, T, hd], k and v [B, n_kv, T, hd] -> [B, n_head, T, hd]; query
    head h reads KV head h // (n_head / n_kv) (ggml_mul_mat's broadcast). Plain matmuls and softmax (the query heads
    of one KV head stacked as rows, so no K/V copy), or SDPA when model.sdpa."""
    hp = model.hp
    B, H, T, hd = q.shape
    n_kv = k.shape[1]
    rep = H // n_kv
    if model.sdpa:
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hp.attn_scale, enable_gqa=rep > 1)
        except TypeError:     # a torch without enable_gqa
            if rep > 1:
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hp.attn_scale)
    qg = q.reshape(B, n_kv, rep * T, hd)
    kq = torch.matmul(qg, k.transpose(-1, -2)) * hp.attn_scale                 # [B, n_kv, rep * T, T]
    above = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    kq = kq.view(B, n_kv, rep, T, T).masked_fill(above, float("-inf"))
    p = torch.softmax(kq, dim=-1, dtype=torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else None)
    o = torch.matmul(p.to(v.dtype).view(B, n_kv, rep * T, T), v)                # [B, n_kv, rep * T, hd]
    return o.view(B, H, T, hd)


def hidden(model: Model, ids: torch.Tensor) -> torch.Tensor:
    """The last layer's output [B, T, n_embd] for token ids [B, T] from position 0 (each row its own sequence)."""
    hp, w = model.hp, model.w
    if ids.dim() == 1:
        ids = ids[None]
    B, T = ids.shape
    cos, sin = rope_tables(model, T)
    x = F.embedding(ids, w["token_embd.weight"])
    for il in range(hp.n_layer):
        cur = rms_norm(x, w[f"blk.{il}.attn_norm.weight"], hp.eps)
        q = linear(model, cur, il, "attn_q").view(B, T, hp.n_head, hp.head_dim)
        k = linear(model, cur, il, "attn_k").view(B, T, hp.n_head_kv, hp.head_dim)
        v = linear(model, cur, il, "attn_v").view(B, T, hp.n_head_kv, hp.head_dim_v)
        q = rope(q, cos, sin, hp.n_rot, hp.rope_type)
        k = rope(k, cos, sin, hp.n_rot, hp.rope_type)
        o = attention(model, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        o = o.transpose(1, 2).reshape(B, T, hp.n_head * hp.head_dim_v)
        x = x + linear(model, o, il, "attn_output")
        cur = rms_norm(x, w[f"blk.{il}.ffn_norm.weight"], hp.eps)
        glu = F.silu(linear(model, cur, il, "ffn_gate")) * linear(model, cur, il, "ffn_up")
        x = x + linear(model, glu, il, "ffn_down")
    return x


def logits_of(model: Model, x: torch.Tensor) -> torch.Tensor:
    """The final RMSNorm and the head (output.weight, or token_embd.weight when tied)."""
    return F.linear(rms_norm(x, model.w[model.hp.output_norm], model.hp.eps), model.head)


def forward(model: Model, ids) -> torch.Tensor:
    """Logits [B, T, n_vocab] (in the model's dtype) of token ids [B, T] (or [T]: [1, T, n_vocab])."""
    ids = torch.as_tensor(ids, dtype=torch.long, device=model.device)
    return logits_of(model, hidden(model, ids))


def loss_of(model: Model, ids) -> torch.Tensor:
    """The mean over windows and positions t < T-1 of -log p(w[t+1] | w[..t]) (the head on those positions only);
    the cross-entropy in float32 at least."""
    ids = torch.as_tensor(ids, dtype=torch.long, device=model.device)
    if ids.dim() == 1:
        ids = ids[None]
    logits = logits_of(model, hidden(model, ids)[:, :-1])
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def loss_and_grads(model: Model, windows) -> tuple[float, dict]:
    """(loss, {name: (dA, dB)}) of these windows (a list of equal-length token lists) at the adapter as it is: the
    gradients of the loss, as numpy arrays in the parameters' dtype; the parameters' .grad is left cleared."""
    for p in model.params():
        p.grad = None
    loss = loss_of(model, windows)
    loss.backward()
    grads = {n: (a.grad.detach().cpu().numpy().copy(), b.grad.detach().cpu().numpy().copy())
             for n, (a, b) in model.lora.items()}
    for p in model.params():
        p.grad = None
    return float(loss.item()), grads


# -- the training --------------------------------------------------------------------------------------------------

def lab_schedule(step: int, lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """lab.ops.optimizer.schedule (step 1-based): linear warm-up, then a half cosine to lr * min_ratio at `total`."""
    from lab.ops.optimizer import schedule
    return schedule(step, lr=lr, warmup=warmup, total=total, min_ratio=min_ratio)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model: Model, wins, *, steps: int, batch: int, lr: float = 1e-3, warmup_steps: int = 2, clip: float = 1.0,
          schedule: str = "lab", lr_warmup: int = 0) -> dict:
    """`steps` AdamW steps over the windows (step s: training.batch_of(wins, s, batch)); the report's losses, timing
    (the steps after the first warmup_steps) and peak memory."""
    from lab.instruments.training import batch_of
    if not 0 <= warmup_steps < steps:
        raise ValueError(f"--warmup-steps {warmup_steps}: from 0 to steps - 1 ({steps - 1})")
    params = model.params()
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    T = len(wins[0])
    losses: list[float] = []
    if model.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(model.device)
    t_all = t0 = time.perf_counter()
    for s in range(steps):
        if s == warmup_steps:
            sync(model.device)
            t0 = time.perf_counter()
        ids = torch.tensor(batch_of(wins, s, batch), dtype=torch.long, device=model.device)
        rate = lab_schedule(s + 1, lr, lr_warmup, steps) if schedule == "lab" else lr
        for g in opt.param_groups:
            g["lr"] = rate
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, ids)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(float(loss.item()))
    sync(model.device)
    end = time.perf_counter()
    seconds = end - t0
    timed = steps - warmup_steps
    if model.device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(model.device))
    else:
        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return {"losses": losses, "tokens_per_s": timed * batch * T / seconds, "step_ms": 1000.0 * seconds / timed,
            "seconds_timed": seconds, "tokens_per_s_all": steps * batch * T / (end - t_all), "peak_mem_bytes": peak}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a GGUF of the llama family (llama, qwen2)")
    ap.add_argument("--data", required=True, help="a UTF-8 text file, tokenized as `lab train` does (no BOS)")
    ap.add_argument("--ctx", type=int, default=128, help="tokens a window holds (T)")
    ap.add_argument("--batch", type=int, default=1, help="windows a step (B)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=None, help="default: twice the rank (`lab train`'s)")
    ap.add_argument("--steps", type=int, default=12, help="steps in all, the warm-up ones included")
    ap.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of the timing")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lr-schedule", choices=("lab", "constant"), default="lab",
                    help="lab: `lab train`'s cosine to lr/10 at the last step (default); constant: lr throughout")
    ap.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_'s max norm (0: none)")
    ap.add_argument("--seed", type=int, default=0, help="the adapter's start (as lab.engine.lora draws it)")
    ap.add_argument("--sdpa", action="store_true", help="torch's scaled_dot_product_attention, not plain matmuls")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="the weights and activations")
    ap.add_argument("--tf32", action="store_true", help="allow TensorFloat-32 matmuls (float32 on CUDA)")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--full", action="store_true", help="full fine-tuning: every weight trained (`lab train --full`'s "
                                                        "peer; the model should be an F32 file, as the lab's must be)")
    ap.add_argument("--held-out", type=float, default=0.0, metavar="SHARE",
                    help="train on the windows `lab train --held-out SHARE` trains on (its last share left out)")
    args = ap.parse_args(argv)

    from lab.host.loading import read_model
    from lab.instruments.training import split
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)
    _, _, tok = read_model(args.model)
    with open(args.data, encoding="utf-8") as f:
        wins = split(tok.encode(f.read()), args.ctx, args.held_out)[0]
    t = time.perf_counter()
    try:
        model = load_model(args.model, args.device, DTYPES[args.dtype])
    except Refused as e:
        print(str(e), file=sys.stderr)
        return 2
    model.sdpa = args.sdpa
    alpha = 2.0 * args.rank if args.alpha is None else args.alpha
    try:
        make_full(model) if args.full else add_lora(model, args.rank, alpha, args.seed)
    except Refused as e:
        print(str(e), file=sys.stderr)
        return 2
    sync(model.device)
    load_s = time.perf_counter() - t
    r = train(model, wins, steps=args.steps, batch=args.batch, lr=args.lr, warmup_steps=args.warmup_steps,
              clip=args.clip, schedule=args.lr_schedule)
    dev = torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else "cpu"
    report = {"peer": "torch-eager", "device": dev, "model": model.path.name, "arch": model.hp.arch,
              "dtype": args.dtype, "attention": "sdpa" if args.sdpa else "matmul", "tf32": args.tf32,
              "mode": "full" if args.full else "lora",
              "T": args.ctx, "batch": args.batch, "rank": args.rank, "alpha": alpha, "steps": args.steps,
              "warmup_steps": args.warmup_steps, "lr": args.lr, "lr_schedule": args.lr_schedule,
              "losses": r["losses"], "tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
              "tokens_per_s_all": r["tokens_per_s_all"], "params": sum(p.numel() for p in model.params()),
              "peak_mem_bytes": r["peak_mem_bytes"],
              "windows": len(wins), "load_s": load_s, "torch": torch.__version__}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
