"""llama.cpp's tokens, logits and greedy output of a model the lab trained from scratch (tests/fixtures/scratch/).
NOT part of CI.

Issue #44 part 2: "The file loads in llama.cpp with its own tokenizer and greedy output identical to the lab's". Runs
with a Python that has llama-cpp-python 0.3.36 (and numpy), the lab on its path:

    PYTHONPATH=. /work/llamavenv/bin/python scripts/make_scratch_fixture.py

1. A byte-level BPE vocabulary of VOCAB tokens trained on tests/fixtures/constitution.txt (lab.text.tokenizer.train,
   pure Python: the test trains the same one again).
2. `lab train --scratch` (the project's .venv, natively: lavapipe here) with RUN's shape and settings, twice: with
   --steps 0 (the untrained model as drawn from the seed) and with RUN's steps (the trained model).
3. llama.cpp loads each written file (F32 KV cache, flash attention off: it rounds nothing of its own on F32
   weights), tokenizes PROMPT with the file's own vocabulary, gives the logits at every position, and the trained
   model's greedy continuation of N_GREEDY tokens (each the argmax of a fresh evaluation of all before it).

Written: logits.npz (`ids`, `cols`: the top TOP of every position and N_SAMPLE fixed random ids, `logits` and
`untrained` [positions, cols], `greedy` ids, `margins` the gap between the first and second logit at each greedy
step), meta.json (the run, its losses, the files' sizes and sha256 on the adapter that made them). The model files
are not kept: tests/engine/test_scratch.py trains them again with the same run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "tests" / "fixtures" / "scratch"
TEXT = ROOT / "tests" / "fixtures" / "constitution.txt"
VOCAB = 400
# the run: tests/engine/test_scratch.py imports these
SHAPE = {"layers": 2, "width": 64, "heads": 4, "kv_heads": 2, "ffn": 128}
RUN = {"ctx": 64, "batch": 2, "steps": 60, "lr": 1e-2, "optimizer": "adamw", "seed": 7, "held_out": 0.1}
PROMPT = "We the People of the United States, in Order to form"
N_GREEDY = 24
SEED = 44


def train_args(tokenizer: Path, out: Path, steps: int | None = None) -> list[str]:
    """`lab train --scratch`'s arguments for the fixture's run (the test runs the same)."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**SHAPE, **RUN}.items() if k != "steps"]
    return ["train", "--scratch", "--tokenizer", str(tokenizer), "--data", str(TEXT), *flags,
            "--steps", str(RUN["steps"] if steps is None else steps), "--out", str(out), "--json"]


def tokenizer(path: Path) -> str:
    """The run's vocabulary trained and saved at `path`; its sha256."""
    from lab.text.tokenizer import train
    train.train([TEXT.read_text(encoding="utf-8")], VOCAB).save(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    import llama_cpp
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_lora_fixtures import N_SAMPLE, TOP
    from make_lora_fixtures import run as llama_cpp_logits
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok, trained, fresh = Path(tmp) / "tok.json", Path(tmp) / "trained.gguf", Path(tmp) / "untrained.gguf"
        tok_sha = tokenizer(tok)
        reports = []
        for out, steps in ((fresh, 0), (trained, None)):
            got = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "lab.host.cli",
                                  *train_args(tok, out, steps)], check=True, capture_output=True, text=True, cwd=ROOT,
                                 env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
            reports.append(json.loads(got.stdout))
        run = reports[1]
        probe = llama_cpp.Llama(str(trained), n_ctx=64, vocab_only=True, verbose=False)
        ids = probe.tokenize(PROMPT.encode(), add_bos=False, special=False)
        del probe
        logits = llama_cpp_logits(trained, ids, None)
        untrained = llama_cpp_logits(fresh, ids, None)
        greedy, margins, seq = [], [], list(ids)
        for _ in range(N_GREEDY):
            last = llama_cpp_logits(trained, seq, None)[-1].astype(np.float64)
            order = np.argsort(-last, kind="stable")
            greedy.append(int(order[0]))
            margins.append(float(last[order[0]] - last[order[1]]))
            seq.append(int(order[0]))
        files = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                 for p in (fresh, trained)}
    top = {int(i) for lg in (logits, untrained) for row in lg for i in np.argsort(-row, kind="stable")[:TOP]}
    sample = np.random.default_rng(SEED).choice(logits.shape[1], min(N_SAMPLE, logits.shape[1]), replace=False)
    cols = np.array(sorted(top | {int(i) for i in sample}), dtype=np.int32)
    np.savez_compressed(OUT / "logits.npz", ids=np.array(ids, np.int32), cols=cols, logits=logits[:, cols],
                        untrained=untrained[:, cols], greedy=np.array(greedy, np.int32),
                        margins=np.array(margins, np.float32))
    effect = float(np.abs(logits - untrained)[:, cols].max())
    meta = {"text": "tests/fixtures/constitution.txt", "vocab": VOCAB, "tokenizer_sha256": tok_sha, "shape": SHAPE,
            **RUN, "losses": run["losses"], "held_out_losses": run["held_out"], "params": run["params"],
            "trained_on": run["adapter"], "files": files, "prompt": PROMPT, "ids": ids, "greedy": greedy,
            "greedy_text": None, "min_greedy_margin": round(min(margins), 4),
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_args": "n_ctx=64, type_k=F32, type_v=F32, flash_attn=False, logits_all=True",
            "effect_max_abs": round(effect, 4)}
    from lab.text.tokenizer import train
    meta["greedy_text"] = train.train([TEXT.read_text(encoding="utf-8")], VOCAB).tokenizer().decode(greedy)
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")
    print(f"losses {run['losses'][0]:.3f} -> {run['losses'][-1]:.3f}; training moved the logits by up to {effect:.3f};"
          f" greedy {meta['greedy_text']!r}, smallest margin {meta['min_greedy_margin']}")


if __name__ == "__main__":
    main()
