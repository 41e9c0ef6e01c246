"""Does the GPU's time for one step depend on how long it idled before (clock ramp)? Native, by timestamps."""
import asyncio, json, random, sys, time
from lab import gguf, profile
from lab.engine import Engine
from lab.host.native import open_native
path = sys.argv[1]
if not path.endswith(".gguf"):
    from lab.host import synthetic
    path = str(synthetic.write(path, f"/tmp/{path}.gguf", vocab=True))
dev = open_native()
h = gguf.read_file(path)
eng = Engine(dev, h, n_ctx=2200, max_batch=512)
eng.weights.upload_file(path)
rng = random.Random(0)
eng.step([rng.randrange(eng.cfg.n_vocab) for _ in range(512)], 0)
plan = eng.prepared(512)
def t(pos=0, n=512):
    return asyncio.run(dev.time_pass(eng.prepared(n, pos=pos), eng.step_writes(None, pos, n))) * 1e3
out = {"warm": [round(t(), 2) for _ in range(5)]}
for idle in (0.05, 0.2, 0.5, 1.0, 2.0):
    vals = []
    for _ in range(3):
        time.sleep(idle); vals.append(round(t(), 2))
    out[f"after {idle}s idle"] = vals
dec = []
for _ in range(3):
    time.sleep(0.5); dec.append([round(t(31, 1), 3) for _ in range(6)])
out["decode after 0.5s idle, 6 in a row"] = dec
print(json.dumps(out))
