"""The peer users would pick instead: PyTorch + transformers running the same architectures and shapes
on the lent GPU (random weights; speed does not depend on them). Run by scripts/device_bench.sh `torch`.

Prints one JSON line per (model, dtype, cache): prefill tok/s of 128 and 512 tokens, decode tok/s at
contexts 0, 512 and 2048 (greedy, one token per forward, each read back, as `lab bench` measures it).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import transformers as tf

SHAPES = {
    "smollm2": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True,
        max_position_embeddings=8192, rms_norm_eps=1e-5)),
    "qwen2.5": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512,
        max_position_embeddings=32768, rms_norm_eps=1e-6)),
    "llama3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5)),
    "llama3.1-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False,
        max_position_embeddings=131072, rms_norm_eps=1e-5)),
}


def sync() -> None:
    torch.cuda.synchronize()


@torch.inference_mode()
def bench(name: str, dtype: torch.dtype, static: bool, decode: int = 64) -> dict:
    cfg_cls, model_cls, kw = SHAPES[name]
    cfg = getattr(tf, cfg_cls)(**kw)
    model = getattr(tf, model_cls)(cfg).to("cuda", dtype).eval()
    out = {"model": name, "dtype": str(dtype).split(".")[-1], "cache": "static" if static else "dynamic",
           "torch": torch.__version__, "transformers": tf.__version__, "prefill": {}, "decode": {}}
    gen = torch.Generator("cuda").manual_seed(0)
    max_len = 2048 + decode + 8

    def cache():
        if static:
            return tf.StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device="cuda", dtype=dtype)
        return tf.DynamicCache()

    def ids(n):
        return torch.randint(0, cfg.vocab_size, (1, n), device="cuda", generator=gen)

    for n in (128, 512, 128):           # the first 128 warms up; the last one counts
        c = cache()
        x = ids(n)
        sync()
        t = time.perf_counter()
        model(x, past_key_values=c, use_cache=True, cache_position=torch.arange(n, device="cuda"))
        sync()
        out["prefill"][n] = {"tok_s": round(n / (time.perf_counter() - t), 1)}
    for ctx in (0, 512, 2048):
        c = cache()
        n0 = max(ctx, 1)
        logits = model(ids(n0), past_key_values=c, use_cache=True,
                       cache_position=torch.arange(n0, device="cuda")).logits
        tok = logits[:, -1:].argmax(-1)
        for warm in (True, False):
            steps = 8 if warm else decode
            sync()
            t = time.perf_counter()
            for i in range(steps):
                pos = torch.tensor([n0], device="cuda")
                logits = model(tok, past_key_values=c, use_cache=True, cache_position=pos).logits
                tok = logits[:, -1:].argmax(-1)
                tok.item()  # a chat needs each token on the host (as `lab bench` reads each one back)
                n0 += 1
            sync()
        out["decode"][ctx] = {"tok_s": round(decode / (time.perf_counter() - t), 1)}
    del model
    torch.cuda.empty_cache()
    return out


def main(argv: list[str]) -> None:
    """argv: model names (default: all); --bf16-only runs bfloat16 with both caches, not float32 too."""
    dtypes = (torch.bfloat16,) if "--bf16-only" in argv else (torch.float32, torch.bfloat16)
    names = [a for a in argv if not a.startswith("--")] or list(SHAPES)
    for name in names:
        for dtype in dtypes:
            for static in (True, False):
                try:
                    print(json.dumps(bench(name, dtype, static)), flush=True)
                except Exception as exc:    # one configuration failing must not hide the others
                    print(json.dumps({"model": name, "dtype": str(dtype), "static": static,
                                      "error": f"{type(exc).__name__}: {exc}"[:400]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
