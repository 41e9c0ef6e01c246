"""Generate llama.cpp reference fixtures (tests/fixtures/*.json). NOT part of CI.

Runs only with a Python that has llama-cpp-python (the reference venv):

    /root/refvenv/bin/python scripts/make_fixtures.py [smollm2 qwen2.5 gemma3]

Per model it writes tests/fixtures/<model>.json:
  tokenize      ids of tests/fixtures/tokenizer_text.txt, llama.cpp tokenize(add_bos=False,
                special=False), plus the text's sha256
  vocab         n_vocab, bos/eos, add_bos, the end-of-generation ids (llama_vocab_is_eog), and a
                sha256 over every token's piece (token_to_piece, special=True and =False)
  prompts       raw and chat prompts: prompt (the raw text, or the rendered chat prompt), messages
                (chat), prompt_ids, greedy continuation ids (48 tokens, stopping at an
                end-of-generation token), its text (and exact bytes as hex), the top-2
                logit gap at each generated step, top-5 (ids, logits) at every prompt position and
                every generated step
  llama_cpp_speed  CPU prefill / decode tokens per second on this machine (indicative only)
  meta          llama-cpp-python version, model sha256
and tests/fixtures/pretokenizer_variants.json: the fixture text tokenized by llama.cpp with the
smollm2 / qwen2.5 vocabularies under other pre-tokenizers (tokenizer.ggml.pre overridden) and
the gemma3 vocabulary with add_space_prefix=true.

    /root/refvenv/bin/python scripts/make_fixtures.py --f32 [smollm2 qwen2.5 gemma3]

writes tests/fixtures/<model>.f32.json instead: llama.cpp on an F32 copy of the model (every tensor
dequantized by gguf-py's gguf.quants and written as F32, metadata unchanged but general.file_type;
made under /tmp and deleted after), run with an F32 KV cache and flash attention off. llama.cpp then
rounds nothing of its own (f32 x f32 matmuls; only gemma3's GELU is a float16 lookup table), so it
computes the same function as our engine. The prompts are <model>.json's, by id (prompt_ids are
copied, not re-tokenized), with the same per-prompt fields (greedy ids, text, top2_gap, top5 at
every prompt position, gen_top5).

Chat prompts are rendered the way llama-cpp-python does (its Jinja2ChatFormatter over the GGUF's
tokenizer.chat_template, then tokenize(add_bos=False, special=True)); a GGUF without a template
(Gemma 3 here) goes through llama.cpp's own llama_chat_apply_template with its built-in format
("gemma"), then tokenize(add_bos=True, special=True).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.host import models
from lab.host.f32copy import f32_copy

FIXTURES = ROOT / "tests" / "fixtures"
N_GEN = 48
N_THREADS = 2

RAW_PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Once upon a time, in a small village by the sea, there lived",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Hi! My name is Ada."},
     {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
     {"role": "user", "content": "Write a haiku about the sea 🌊."}],
]
BUILTIN_TEMPLATE = {"gemma3": "gemma"}     # models whose GGUF has no tokenizer.chat_template
# (vocabulary, metadata overrides): other pre-tokenizers on real BPE vocabularies, and SPM with a
# space prefix
VARIANTS = [
    ("smollm2", {"tokenizer.ggml.pre": "gpt-2"}),
    ("smollm2", {"tokenizer.ggml.pre": "llama-bpe"}),
    ("smollm2", {"tokenizer.ggml.pre": "qwen2"}),
    ("qwen2.5", {"tokenizer.ggml.pre": "gpt-2"}),
    ("qwen2.5", {"tokenizer.ggml.pre": "llama-bpe"}),
    ("qwen2.5", {"tokenizer.ggml.pre": "smollm"}),
    ("qwen2.5", {"tokenizer.ggml.pre": "default"}),
    ("gemma3", {"tokenizer.ggml.add_space_prefix": True}),
]


def piece(llm, tid: int, special: bool) -> bytes:
    # llama-cpp-python's own detokenize uses a 32-byte buffer and truncates longer pieces
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, tid, buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def detok(llm, ids, special=False) -> bytes:
    return b"".join(piece(llm, t, special) for t in ids)


def vocab_info(llm) -> dict:
    vocab = llm._model.vocab
    n = llm.n_vocab()
    h_special, h_plain = hashlib.sha256(), hashlib.sha256()
    for t in range(n):
        for h, sp in ((h_special, True), (h_plain, False)):
            p = piece(llm, t, sp)
            h.update(len(p).to_bytes(4, "little") + p)
    return {
        "n_vocab": n,
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "pieces_sha256_special": h_special.hexdigest(),
        "pieces_sha256": h_plain.hexdigest(),
    }


def render_builtin(name: str, messages) -> str:
    arr = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        r, c = m["role"].encode(), m["content"].encode()
        keep += [r, c]
        arr[i].role = r
        arr[i].content = c
    size = 4096
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), True, buf, size)
    assert 0 < n <= size, n
    return buf.raw[:n].decode("utf-8")


def topk(row: np.ndarray, k: int = 5):
    idx = np.argsort(-row, kind="stable")[:k]
    return [int(i) for i in idx], [round(float(row[i]), 5) for i in idx]


def run_prompt(llm, eog: set[int], prompt_ids: list[int]) -> dict:
    llm.reset()
    llm.eval(prompt_ids)
    n = len(prompt_ids)
    top5 = [topk(llm.scores[i]) for i in range(n)]
    ids, gaps, gen_top5 = [], [], []
    for _ in range(N_GEN):
        row = llm.scores[llm.n_tokens - 1]
        t5 = topk(row)
        gen_top5.append(t5)
        nxt = t5[0][0]
        gaps.append(round(t5[1][0] - t5[1][1], 5))
        ids.append(nxt)
        if nxt in eog:
            break
        llm.eval([nxt])
    raw = detok(llm, ids)
    return {
        "prompt_ids": prompt_ids, "ids": ids, "text": raw.decode("utf-8", "replace"),
        "text_bytes_hex": raw.hex(), "stopped_at_eog": ids[-1] in eog, "top2_gap": gaps,
        "top5": [{"ids": a, "logits": b} for a, b in top5],
        "gen_top5": [{"ids": a, "logits": b} for a, b in gen_top5],
    }


def speed(path: str, text_ids: list[int]) -> dict:
    out = {"prefill_tokens": 512, "decode_tokens": 64, "load_avg_before": [round(x, 2) for x in os.getloadavg()],
           "note": "best of 2 runs; shared 2-core machine with other jobs running: indicative only"}
    prompt = text_ids[:512]
    for n_threads in (1, 2):
        llm = llama_cpp.Llama(path, n_ctx=2048, n_threads=n_threads, n_threads_batch=n_threads,
                              n_batch=512, seed=0, verbose=False)
        best_pre, best_dec = 0.0, 0.0
        for _ in range(2):
            llm.reset()
            t = time.perf_counter()
            llm.eval(prompt)
            best_pre = max(best_pre, len(prompt) / (time.perf_counter() - t))
            tok = prompt[-1]
            t = time.perf_counter()
            for _ in range(64):
                llm.eval([tok])
            best_dec = max(best_dec, 64 / (time.perf_counter() - t))
        out[f"threads_{n_threads}"] = {"prefill_tok_s": round(best_pre, 1), "decode_tok_s": round(best_dec, 1)}
        del llm
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def make(name: str, text: str) -> dict:
    path = str(models.path(name))
    llm = llama_cpp.Llama(path, n_ctx=2048, logits_all=True, seed=0, verbose=False,
                          n_threads=N_THREADS, n_threads_batch=N_THREADS)
    info = vocab_info(llm)
    eog = set(info["eog_ids"])
    text_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    prompts = []
    for p in RAW_PROMPTS:
        ids = llm.tokenize(p.encode("utf-8"), add_bos=True, special=False)   # BOS per the vocab
        prompts.append({"prompt": p, "chat": False, **run_prompt(llm, eog, ids)})
    template = llm.metadata.get("tokenizer.chat_template")
    for msgs in CHATS:
        if template:
            fmt = Jinja2ChatFormatter(template=template,
                                      eos_token=llm._model.token_get_text(llm.token_eos()),
                                      bos_token=llm._model.token_get_text(llm.token_bos()))
            rendered = fmt(messages=msgs).prompt
            ids = llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
            how = "jinja2 (llama-cpp-python Jinja2ChatFormatter), tokenize(add_bos=False, special=True)"
        else:
            rendered = render_builtin(BUILTIN_TEMPLATE[name], msgs)
            ids = llm.tokenize(rendered.encode("utf-8"), add_bos=True, special=True)
            how = (f"llama_chat_apply_template({BUILTIN_TEMPLATE[name]!r}), "
                   "tokenize(add_bos=True, special=True)")
        prompts.append({"prompt": rendered, "chat": True, "messages": msgs, "rendered_with": how,
                        **run_prompt(llm, eog, ids)})
    del llm
    return {
        "model": name,
        "meta": {"llama_cpp_python": llama_cpp.__version__, "model_sha256": models.MODELS[name].sha256,
                 "model_file": models.MODELS[name].filename,
                 "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()},
        "vocab": info,
        "tokenize": {"text_sha256": hashlib.sha256(text.encode()).hexdigest(), "add_bos": False,
                     "special": False, "ids": text_ids},
        "prompts": prompts,
        "n_vocab": info["n_vocab"],
        "llama_cpp_speed": speed(path, text_ids),
    }


def make_f32(name: str) -> dict:
    quant = json.loads((FIXTURES / f"{name}.json").read_text())
    eog = set(quant["vocab"]["eog_ids"])
    dst = f"/tmp/llm-lab-{name}-f32.gguf"
    t0 = time.time()
    try:
        f32_copy(str(models.path(name)), dst)
        size = os.path.getsize(dst)
        t1 = time.time()
        # type_k / type_v 0 = GGML_TYPE_F32
        llm = llama_cpp.Llama(dst, n_ctx=512, n_batch=512, logits_all=True, seed=0, verbose=False,
                              n_threads=N_THREADS, n_threads_batch=N_THREADS, type_k=0, type_v=0,
                              flash_attn=False)
        prompts = []
        for p in quant["prompts"]:
            keep = {k: p[k] for k in ("prompt", "chat", "messages", "rendered_with") if k in p}
            prompts.append({**keep, **run_prompt(llm, eog, p["prompt_ids"])})
        del llm
    finally:
        if os.path.exists(dst):
            os.remove(dst)
    return {
        "model": name,
        "meta": {"llama_cpp_python": llama_cpp.__version__, "model_sha256": models.MODELS[name].sha256,
                 "model_file": models.MODELS[name].filename,
                 "f32_copy": "every tensor dequantized by gguf.quants.dequantize, written as F32; "
                             "general.file_type=0; other metadata unchanged",
                 "f32_bytes": size, "llama_cpp_args": "type_k=F32, type_v=F32, flash_attn=False, "
                                                      f"n_threads={N_THREADS}, logits_all=True",
                 "convert_s": round(t1 - t0, 1), "eval_s": round(time.time() - t1, 1),
                 "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()},
        "eog_ids": sorted(eog),
        "prompts": prompts,
    }


def variants(text: str) -> dict:
    out = {"text_sha256": hashlib.sha256(text.encode()).hexdigest(), "variants": []}
    for name, overrides in VARIANTS:
        llm = llama_cpp.Llama(str(models.path(name)), vocab_only=True, verbose=False, kv_overrides=overrides)
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        out["variants"].append({"vocab": name, "overrides": overrides, "ids": ids})
        del llm
    return out


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--f32":
        for name in argv[1:] or ["smollm2", "qwen2.5", "gemma3"]:
            t = time.time()
            data = make_f32(name)
            out = FIXTURES / f"{name}.f32.json"
            out.write_text(json.dumps(data, ensure_ascii=True, separators=(",", ":")) + "\n", encoding="utf-8")
            print(f"{out}: {out.stat().st_size:,} bytes, {time.time() - t:.1f}s", flush=True)
        return
    text = (FIXTURES / "tokenizer_text.txt").read_bytes().decode("utf-8")
    names = [a for a in argv if a != "variants"] if argv else ["smollm2", "qwen2.5", "gemma3"]
    for name in names:
        t = time.time()
        data = make(name, text)
        out = FIXTURES / f"{name}.json"
        out.write_text(json.dumps(data, ensure_ascii=True, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"{out}: {out.stat().st_size:,} bytes, {len(data['tokenize']['ids'])} text tokens, "
              f"speed {data['llama_cpp_speed']}, {time.time() - t:.1f}s", flush=True)
    if not argv or argv == ["variants"]:
        out = FIXTURES / "pretokenizer_variants.json"
        out.write_text(json.dumps(variants(text), separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"{out}: {out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
