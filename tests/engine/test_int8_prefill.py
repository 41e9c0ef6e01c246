"""The engine's tensor-core prefill (Engine(int8_prefill=True): each projection of a type in lab.ops.matmul.I8_TYPES
through wgsl/matmul_i8.wgsl on 8-bit inputs), natively, with the kernel's subgroup-matrix products written out in
plain WGSL (tests/kernels/i8_plain.py). The kernel itself is held to its oracle in tests/kernels/test_matmul_i8.py;
this holds the engine's routing (every I8 type of a Q*_K_M-like mix takes it, with its own unpack, block size and
halves; Q2_K keeps the f32 GEMM) and the whole prefill to the f32 one on the same file.

Tolerance: the int8 prefill is not the f32 function: each input to a projection is rounded to 1/254 of its block's
largest value (llama.cpp's q8_1; its quantized matmuls do the same), so a logit moves by about
a small fraction of a percent per projection, compounding through the layers (an early layer's the most). Measured on
this file with seeds 3-6: the logits' largest difference 1.3-3.2% of the largest logit (the legacy types alone:
0.05%, their projections being in the last layer); I8_LOGIT_TOL = 8%. Three of tests/kernels' broken variants
(Q6_K's two scales swapped, Q3_K's high bit from the wrong sub-block, IQ4_XS's second eighth read as the first)
moved them by 80-150% on the same seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine import gpu_trace
from test_new_quants import N_VOCAB, write_model

from lab.engine import engine as engine_module
from lab.engine.engine import Engine
from lab.format import gguf as lab_gguf
from lab.ops.matmul import I8_TYPES
from tests.kernels.i8_plain import PlainKernels, int8_adapter

# every int8 type in some projection, and Q2_K (which has no int8 GEMM) beside them
TYPES = {
    "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q5_K", "blk.0.attn_v.weight": "Q6_K",
    "blk.0.attn_output.weight": "Q3_K", "blk.0.ffn_gate.weight": "IQ4_XS", "blk.0.ffn_up.weight": "Q4_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.attn_q.weight": "Q8_0", "blk.1.attn_k.weight": "Q4_0", "blk.1.attn_v.weight": "Q5_1",
    "blk.1.attn_output.weight": "Q4_1", "blk.1.ffn_gate.weight": "Q5_0", "blk.1.ffn_up.weight": "Q2_K",
    "blk.1.ffn_down.weight": "Q5_K", "output.weight": "Q6_K", "token_embd.weight": "Q4_K",
}
I8_LOGIT_TOL = 0.08


@pytest.fixture(scope="module")
def engines(device, tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("i8") / "i8.gguf", types=TYPES, seed=3)
    header = lab_gguf.read_file(path)
    with int8_adapter(device), pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine_module, "KernelCache", PlainKernels)
        i8 = Engine(device, header, n_ctx=64, logits_all=True, int8_prefill=True)
        mp.undo()
        f32 = Engine(device, header, n_ctx=64, logits_all=True)
        for e in (i8, f32):
            e.weights.upload_file(path)
        yield i8, f32
        i8.close()
        f32.close()


def test_int8_prefill_follows_the_f32_prefill(engines):
    i8, f32 = engines
    ids = np.random.default_rng(11).integers(0, N_VOCAB, 37).tolist()       # a 32-token tile and a partial one
    got = gpu_trace(i8, ids, 0)["result_output"].astype(np.float64)
    want = gpu_trace(f32, ids, 0)["result_output"].astype(np.float64)
    assert got.shape == want.shape == (37, N_VOCAB)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    agree = float((got.argmax(1) == want.argmax(1)).mean())
    print(f"\nint8 prefill: largest logit difference {err:.3%} of the largest logit; top-1 agrees on {agree:.0%}")
    assert err <= I8_LOGIT_TOL, f"int8 prefill: logits differ by {err:.3%} of the largest (tolerance {I8_LOGIT_TOL:.0%})"


def test_every_int8_type_took_the_tensor_cores(engines):
    i8, _ = engines
    labels = [k.label for k in i8.kernels._cache.values()]
    took = {next(c.split("=")[1] for c in lab.split() if c.startswith("IQ=")) for lab in labels
            if lab.startswith("matmul_i8 plain")}
    used = set(TYPES.values()) - {"Q2_K"}
    assert took == {I8_TYPES[t] for t in used}, sorted(took)
    # Q2_K's projection kept the f32 GEMM (matmul.wgsl on a GPU, matmul_lanes.wgsl on a CPU adapter)
    assert any(lab.startswith(("matmul:", "matmul_lanes:")) and "dq_q2_k" in lab for lab in labels), labels
