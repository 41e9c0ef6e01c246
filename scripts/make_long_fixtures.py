"""llama.cpp's answers for the longer parity checks of the 2026 architectures (tests/fixtures/long/<spec>.json). NOT
part of CI.

    LLAMA_CPP_LIB_PATH=/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \\
        /root/refvenv/bin/python scripts/make_long_fixtures.py [lfm2 qwen35 smollm3 gemma4]

On each synthetic F32 file (lab/host/synthetic/arch.py, built with the project venv first: the tests' bytes),
with an F32 KV cache and flash attention off as scripts/make_arch_fixtures.py runs llama.cpp:

  prompts   for each of PROMPTS (with the vocabulary's BOS): its ids and GREEDY_N greedy ids, each step's top-2 gap
  chat      a two-turn conversation: turn 1's ids and TURN1_N greedy ids; turn 2's ids (turn 1, its reply, then more
            text) and GREEDY_N greedy ids, llama.cpp running turn 2's whole prompt in a fresh context. The lab must
            give the same ids while it reuses what turn 1 left: the KV cache, a hybrid's states
            (tests/engine/test_long_parity.py, and the page).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from make_arch_fixtures import greedy_on

from lab.host.synthetic import arch as synthetic_arch
from lab.host.models import cache_dir

OUT = ROOT / "tests" / "fixtures" / "long"
PROMPTS = ("The old lighthouse keeper climbed the stairs every evening, counting the steps.",
           "In the village market, a merchant sold spices from faraway lands",
           "Once upon a time")
MORE = " Then the storm came, and the light went out for the first time in forty years."
GREEDY_N = 48
TURN1_N = 16
N_CTX = 256


def greedy(llm, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """n greedy ids after `ids` from a fresh context, and llama.cpp's top-2 gap at each step."""
    llm.reset()
    llm.eval(ids)
    return greedy_on(llm, n)


def run(spec: str) -> dict:
    path = synthetic_arch.build(spec, "f32", cache_dir() / "synthetic")
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, seed=0, verbose=False,
                          n_threads=2, n_threads_batch=2, type_k=0, type_v=0, flash_attn=False)
    prompts = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        g, gaps = greedy(llm, ids, GREEDY_N)
        prompts.append({"text": text, "prompt_ids": ids, "greedy": g, "top2_gap": gaps})
    turn1 = prompts[0]["prompt_ids"]
    reply, reply_gaps = greedy(llm, turn1, TURN1_N)
    turn2 = turn1 + reply + llm.tokenize(MORE.encode(), add_bos=False, special=False)
    g2, gaps2 = greedy(llm, turn2, GREEDY_N)
    del llm
    return {"spec": spec, "file": path.name, "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_args": f"n_ctx={N_CTX}, type_k=F32, type_v=F32, flash_attn=False", "prompts": prompts,
            "chat": {"turn1_ids": turn1, "turn1_greedy": reply, "turn1_gaps": reply_gaps, "more": MORE,
                     "turn2_ids": turn2, "turn2_greedy": g2, "turn2_gaps": gaps2}}


def main(argv: list[str]) -> None:
    for spec in argv or ["lfm2", "qwen35", "smollm3", "gemma4"]:
        t = time.time()
        data = run(spec)
        out = OUT / f"{spec}.json"
        out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
        gaps = [g for p in data["prompts"] for g in p["top2_gap"]] + data["chat"]["turn2_gaps"]
        print(f"{out.name}: {out.stat().st_size:,} bytes, min gap {min(gaps):.4f}, {time.time() - t:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
