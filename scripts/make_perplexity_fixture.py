"""Make tests/fixtures/perplexity.json: llama.cpp's own perplexity (its `llama-perplexity` tool) on
tests/fixtures/perplexity_text.txt for each real model, the figures tests/engine/test_perplexity.py and the page's
test hold lab/instruments/perplexity.py to. Not run in CI: it needs a llama.cpp build.

    python scripts/make_perplexity_fixture.py [--bin PATH/llama-perplexity] [--ctx 128] [--models smollm2,...]

llama-perplexity is run as `-m MODEL -f TEXT -c CTX -b CTX -t 2 --no-repack`: a batch of one window, so one
sequence per pass (n_seq = 1) and the convention of its `perplexity()`: BOS per the vocabulary's add_bos_token,
chunks of CTX tokens, the second half of each scored. `--no-repack` keeps ggml's plain CPU kernels: with repacking
on, a build with -march=native on this machine's CPU picks the AMX kernels, which die on an illegal instruction
(the VM does not enable AMX tiles), and the plain path is the one the other fixtures come from.
What is kept: the per-chunk running values it prints (`[i]value,`, 4 decimals), the final estimate and its +/-,
the chunk count, and the text's sha256 (a test refuses a fixture made from another text).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lab.host import models

TEXT = ROOT / "tests" / "fixtures" / "perplexity_text.txt"
OUT = ROOT / "tests" / "fixtures" / "perplexity.json"
BIN = Path("/root/ref/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-perplexity")


def run(binary: Path, model: Path, ctx: int, threads: int) -> dict:
    cmd = [str(binary), "-m", str(model), "-f", str(TEXT), "-c", str(ctx), "-b", str(ctx), "-t", str(threads),
           "--no-repack"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = p.stdout + p.stderr
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{log[-3000:]}")
    running = [float(v) for _, v in re.findall(r"\[(\d+)\](\d+\.\d+),", log)]
    final = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", log)
    if not (running and final and chunks):
        raise SystemExit(f"could not read llama-perplexity's output:\n{log[-3000:]}")
    if int(chunks.group(4)) != 1 or int(chunks.group(2)) != ctx:
        raise SystemExit(f"expected one sequence of {ctx} per pass: {chunks.group(0)}")
    return {"ctx": ctx, "chunks": int(chunks.group(1)), "ppl": float(final.group(1)),
            "ppl_err": float(final.group(2)), "running": running, "command": " ".join(["llama-perplexity"] + cmd[1:]),
            "llama_cpp": "llama_cpp_python-0.3.36/vendor/llama.cpp (tools/perplexity)"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, default=BIN)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2,qwen2.5,gemma3")
    args = ap.parse_args()
    out = {"text": str(TEXT.relative_to(ROOT)), "text_sha256": hashlib.sha256(TEXT.read_bytes()).hexdigest(),
           "models": {}}
    for name in args.models.split(","):
        path = models.path(name)
        fx = run(args.bin, path, args.ctx, args.threads)
        fx["command"] = fx["command"].replace(str(path), models.MODELS[name].filename).replace(str(TEXT), out["text"])
        out["models"][name] = fx
        print(f"{name}: PPL {fx['ppl']} +/- {fx['ppl_err']} over {fx['chunks']} chunks of {fx['ctx']}", file=sys.stderr)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
