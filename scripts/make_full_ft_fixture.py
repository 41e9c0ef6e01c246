"""llama.cpp's logits of a model the lab fine-tuned in full (tests/fixtures/full-ft/). NOT part of CI.

Issue #43: "a full or from-scratch run writes a model GGUF of the same architecture with its metadata and every
tensor in F32", held to llama.cpp. Runs with a Python that has llama-cpp-python 0.3.36 (and numpy, gguf), the lab on
its path:

    PYTHONPATH=. /work/llamavenv/bin/python scripts/make_full_ft_fixture.py

1. `lab train --full` (the project's .venv, natively: lavapipe here) trains every weight and norm of the synthetic
   Llama 3 file (lab.host.synthetic.arch "llama3" F32: 4 layers of 256, the tied head, SmolLM2's vocabulary) with
   RUN's settings on the first TEXT_CHARS characters of tests/fixtures/constitution.txt and writes the model.
2. llama.cpp loads the written file (F32 KV cache, flash attention off: it rounds nothing of its own on F32 weights)
   and gives the logits of PROMPT at every position.

Written: logits.npz (`ids`, `cols`: the top TOP of every position and N_SAMPLE fixed random ids, `logits`
[positions, cols] of the trained model, `untrained` the same of the file before training), meta.json (the run, its
losses, the written file's size and sha256 on the adapter that made it). The file itself is not kept (61 MB):
tests/engine/test_full_finetune.py trains it again with the same run (the same bits on lavapipe; other adapters sum in
other orders, ~1e-6 of a weight after these steps, far inside the tolerance) and holds the lab's logits on its own
written file to these.
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
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch

# llama_cpp (and scripts/make_lora_fixtures.py, which imports it) is imported where it runs: tests/engine/
# test_full_finetune.py imports RUN, PROMPT, TEXT_CHARS and train_args from here without it
OUT = ROOT / "tests" / "fixtures" / "full-ft"
SPEC, MIX = "llama3", "f32"
TEXT_CHARS = 3000
# the run: tests/engine/test_full_finetune.py imports these
RUN = {"ctx": 16, "batch": 1, "steps": 3, "lr": 2e-3, "optimizer": "adamw"}
PROMPT = "We the People of the United States, in Order to form a more perfect Union"
SEED = 43


def train_args(model: Path, data: Path, out: Path) -> list[str]:
    """`lab train`'s arguments for the fixture's run (the test runs the same)."""
    return ["train", str(model), "--data", str(data), "--full", "--ctx", str(RUN["ctx"]), "--batch",
            str(RUN["batch"]), "--steps", str(RUN["steps"]), "--lr", str(RUN["lr"]), "--optimizer", RUN["optimizer"],
            "--out", str(out), "--json"]


def main() -> None:
    import llama_cpp
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_lora_fixtures import N_SAMPLE, TOP
    from make_lora_fixtures import run as llama_cpp_logits
    llama_logits = lambda path, ids: llama_cpp_logits(path, ids, None)     # noqa: E731
    model = synthetic_arch.build(SPEC, MIX, cache_dir() / "synthetic")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        data, trained = Path(tmp) / "text.txt", Path(tmp) / "trained.gguf"
        data.write_text((ROOT / "tests" / "fixtures" / "constitution.txt").read_text()[:TEXT_CHARS])
        got = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "lab.host.cli",
                              *train_args(model, data, trained)], check=True, capture_output=True, text=True,
                             cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        run = json.loads(got.stdout)
        probe = llama_cpp.Llama(str(trained), n_ctx=64, vocab_only=True, verbose=False)
        ids = probe.tokenize(PROMPT.encode(), add_bos=True, special=False)
        del probe
        logits, untrained = llama_logits(trained, ids), llama_logits(model, ids)
        size, sha = trained.stat().st_size, hashlib.sha256(trained.read_bytes()).hexdigest()
    top = {int(i) for lg in (logits, untrained) for row in lg for i in np.argsort(-row, kind="stable")[:TOP]}
    sample = np.random.default_rng(SEED).choice(logits.shape[1], N_SAMPLE, replace=False)
    cols = np.array(sorted(top | {int(i) for i in sample}), dtype=np.int32)
    np.savez_compressed(OUT / "logits.npz", ids=np.array(ids, np.int32), cols=cols, logits=logits[:, cols],
                        untrained=untrained[:, cols])
    effect = float(np.abs(logits - untrained)[:, cols].max())
    meta = {"spec": SPEC, "mix": MIX, "model_file": model.name, "text": f"tests/fixtures/constitution.txt, first "
            f"{TEXT_CHARS} characters", **RUN, "losses": run["losses"], "params": run["params"],
            "trained_on": run["adapter"], "written_bytes": size, "written_sha256": sha, "prompt": PROMPT, "ids": ids,
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_args": "n_ctx=64, type_k=F32, type_v=F32, flash_attn=False, logits_all=True",
            "effect_max_abs": round(effect, 4)}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size:,} bytes")
    print(f"losses {run['losses']}; training moved the logits by up to {effect:.3f}")


if __name__ == "__main__":
    main()
