"""Synthetic GGUFs (for benchmarks on machines without the model files) have exactly the real models'
tensor names, shapes and types, valid blocks, and the same config; the benchmark runs on them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from lab import gguf, model
from lab.host import bench, models, synthetic


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_same_tensors_and_config_as_the_real_file(name, tmp_path):
    path = synthetic.write(name, tmp_path / f"{name}.gguf")
    syn, real = gguf.read_file(path), gguf.read_file(models.path(name))
    assert {t.name: (t.shape, t.type_id) for t in syn.tensors} == {t.name: (t.shape, t.type_id) for t in real.tensors}
    assert model.from_gguf(syn) == model.from_gguf(real)
    # every block decodes to finite values (the f16 scales were made valid)
    r = GGUFReader(path)
    for t in r.tensors[:12]:
        assert np.isfinite(dequantize(t.data, t.tensor_type)).all(), t.name


def test_bench_kernels_runs(device):
    rows = bench.bench_kernels(shapes=[("Q4_1", 64, 256), ("Q6_K", 32, 512)], repeat=2, tokens=4)
    assert [r["type"] for r in rows] == ["Q4_1", "Q6_K"]
    assert all(r["matvec_us"] > 0 and math.isfinite(r["matmul_gflop_s"]) for r in rows)
