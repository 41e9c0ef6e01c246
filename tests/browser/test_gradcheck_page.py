"""The whole-model gradient check in the page (headless Chromium, SwiftShader WebGPU): the training step's LoRA
gradients, computed by the worker's engine (the `labTrainGrads` test hook: lab.instruments.training.Trainer on the
loaded model), against central differences of the same loss in float64 (lab/host/reference/training.py, here in
CPython), at the entry of each adapter tensor with the largest gradient, every tensor of every layer, as
lab/host/gradcheck.py checks the native engine. The file: the synthetic Llama 3 (lab.host.synthetic.arch "llama3",
F32; rope_freqs, a tied head), loaded through the file input of the cards' page."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np

from lab.engine.lora import choose, layout
from lab.format import gguf
from lab.host import gradcheck
from lab.host.models import cache_dir
from lab.host.reference.training import LoraLoss
from lab.host.synthetic import arch as synthetic_arch
from tests.browser.conftest import take

T, RANK, ALPHA = 12, 4, 8.0


def _layout(path) -> SimpleNamespace:
    """The adapter's layout the page's Trainer gives this file's targets (lab.engine.lora.choose, then layout)."""
    header = gguf.read_file(path)
    shapes = choose({t.name: t for t in header.tensors}, header.metadata["llama.block_count"], rank=RANK)
    targets, n = layout(shapes)
    return SimpleNamespace(targets=targets, n_params=n)


def test_page_gradients_match_central_differences(card_page):
    path = synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")
    lab = take(card_page, path)
    lay = _layout(path)
    params = gradcheck.random_params(lay, 7)
    rng = np.random.default_rng(7)
    wins = [[int(i) for i in rng.integers(0, 49152, T)]]
    m = lab.page.evaluate("(m) => window.labTrainGrads(m)",
                          {"T": T, "rank": RANK, "alpha": ALPHA, "windows": wins,
                           "params": base64.b64encode(params).decode()})
    grads = gradcheck.adapter_arrays(lay, base64.b64decode(m["grads"]))
    oracle = LoraLoss(path, gradcheck.adapter_arrays(lay, params), ALPHA)
    loss64 = oracle.loss(wins)
    assert abs(m["loss"] - loss64) / loss64 < 1e-5, (m["loss"], loss64)
    worst = 0.0
    for name in grads:
        for k, which in enumerate("AB"):
            g = grads[name][k]
            e = np.unravel_index(int(np.argmax(np.abs(g))), g.shape)
            fd = oracle.central(wins, name, which, e, gradcheck.H)
            worst = max(worst, abs(g[e] - fd) / abs(fd))
    print(f"\npage gradients: {2 * len(grads)} tensors, worst relative error {worst:.2e}")
    assert worst < gradcheck.TOL
