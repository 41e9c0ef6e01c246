"""Does a step's GPU time depend on how long the GPU idled before it? (An idle H200 drops to 345 of 1,980 MHz.)

    python3 scripts/idle_clock_probe.py MODEL.gguf | smollm2 | qwen2.5 | ...   # a synthetic file for a name

Native (wgpu-py); prints JSON: the GPU milliseconds of one 512-token prefill step (timestamp queries) back to back,
then after idle pauses of 0.05-2 s, and of decode steps after 0.5 s. The results of the fourth session are in
docs/results/h200_browser_run6/idle_clock_probe.json; they are why `lab bench --backend browser --warm-gpu` exists.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

from lab.engine.engine import Engine
from lab.format import gguf
from lab.host.native import open_native


def main(path: str) -> None:
    if not path.endswith(".gguf"):
        from lab.host.synthetic import releases as synthetic
        path = str(synthetic.write(path, f"/tmp/{path}.gguf", vocab=True))
    dev = open_native()
    eng = Engine(dev, gguf.read_file(path), n_ctx=2200, max_batch=512)
    eng.weights.upload_file(path)
    rng = random.Random(0)
    eng.step([rng.randrange(eng.cfg.n_vocab) for _ in range(512)], 0)

    def ms(pos: int = 0, n: int = 512) -> float:
        return round(asyncio.run(dev.time_pass(eng.prepared(n, pos=pos), eng.step_writes(None, pos, n))) * 1e3, 3)

    out = {"warm": [ms() for _ in range(5)]}
    for idle in (0.05, 0.2, 0.5, 1.0, 2.0):
        vals = []
        for _ in range(3):
            time.sleep(idle)
            vals.append(ms())
        out[f"after {idle}s idle"] = vals
    decode = []
    for _ in range(3):
        time.sleep(0.5)
        decode.append([ms(31, 1) for _ in range(6)])
    out["decode after 0.5s idle, 6 in a row"] = decode
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
