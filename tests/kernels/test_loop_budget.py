"""The adapter's loop budget: lavapipe (llvmpipe) ends a shader invocation's loops after a fixed number of iterations
counted over all its loops together (Mesa's gallivm LP_MAX_TGSI_LOOP_ITERATIONS, 65,535, "shared between every loop
in a shader"), silently: a loop past the budget stops early and every later loop runs its body once. A kernel that
walks keys in a loop is right on lavapipe only while its invocation's iterations stay inside the budget; GPU drivers
have no such budget. Measured here (LLVM 15): one loop stops at 32,768 iterations; nested loops stop near 65,535
together. What that means for attention on this machine (tests/kernels/test_attention.py, QWEN's heads of 64, one
query): `prefill` (the CPU adapters' tiles) is cut past about 6,800 keys (Gemma's heads of 256: 2,160), the narrow
tiles past about 25,000, `prefill_rows` past about 27,600, `decode_whole` past about 77,600; the split decode's
chunks (9 tiles each at 32,768 keys) stay far inside it."""

from __future__ import annotations

import struct

import pytest

from lab import gpu
from lab.engine.engine import Engine, EngineError
from lab.format import gguf
from lab.host.synthetic import releases as synthetic
from lab.ops.attention import budget_keys

SRC = """
struct P { n: u32, inner: u32, later: u32, _p: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() {
    var outer = 0u;
    var total = 0u;
    for (var i = 0u; i < p.n; i++) {
        outer += 1u;
        for (var j = 0u; j < p.inner; j++) { total += 1u; }
    }
    var after = 0u;
    for (var k = 0u; k < p.later; k++) { after += 1u; }
    out[0] = outer;
    out[1] = total;
    out[2] = after;
}
"""


def iterations(device, n: int, inner: int, later: int = 10) -> tuple[int, int, int]:
    """(outer, inner, later) iterations one invocation ran of loops of n x inner, then `later`."""
    before = set(map(id, device.buffers))
    try:
        k = device.kernel(SRC, "loop budget", "main")
        out = device.buffer(16, gpu.CONVERSATION, "loop budget out")
        bound = device.bind(k, [device.uniform(struct.pack("<4I", n, inner, later, 0), "p"), out], "loop budget")
        device.run([gpu.Dispatch(k, bound, (1, 1, 1))])
        return struct.unpack("<3I", device.read_sync(out, 0, 12))
    finally:
        for buf in [b for b in device.buffers if id(b) not in before]:
            device.destroy(buf)


def test_loops_inside_the_budget_run_whole(device):
    assert iterations(device, 1000, 10) == (1000, 10_000, 10)
    assert iterations(device, 30_000, 0) == (30_000, 0, 10)


def test_llvmpipe_cuts_loops_past_its_budget(device):
    if "llvmpipe" not in device.info.name.lower():
        pytest.skip(f"{device.info.name}: no loop budget known")
    outer, total, after = iterations(device, 10_000, 10)
    assert outer < 10_000 and total < 100_000 and outer + total <= 65_535 + 2    # one budget for both loops
    assert after == 1                                                            # a later loop: its body once
    assert iterations(device, 100_000, 0)[0] < 100_000


def test_engine_refuses_keys_past_the_budget(device, tmp_path):
    """An engine on lavapipe refuses a step whose attention would walk past lab.ops.attention.budget_keys (6,400
    keys at heads of 64) with a message, instead of computing it wrong; a GPU adapter has no such bound."""
    assert budget_keys(0, 64) is None
    assert budget_keys(65_535, 64) == 6_400 and budget_keys(65_535, 256) == 1_600
    path = tmp_path / "small.gguf"
    synthetic.write("smollm3-small", path, vocab=True)                  # heads of 64
    eng = Engine(device, gguf.read_file(path), n_ctx=6_500)
    try:
        if not device.info.loop_budget:
            assert eng.max_keys is None
            pytest.skip(f"{device.info.name}: no loop budget")
        assert eng.max_keys == 6_400
        eng.check_step([1], 6_399)                                       # the last key inside: accepted
        with pytest.raises(EngineError, match="without a word.*6,400 keys"):
            eng.step([1], 6_400)
    finally:
        eng.close()
