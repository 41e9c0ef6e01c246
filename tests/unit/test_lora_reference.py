"""A LoRA adapter on the numpy reference (lab/host/reference/lora.py) against llama.cpp, and lab.format.adapter against
llama.cpp's loader. No GPU: the reference is numpy.

The evidence (tests/fixtures/lora/, scripts/make_lora_fixtures.py): llama.cpp (llama-cpp-python 0.3.36, CPU) on the
synthetic Llama 3 file in F32 (lab.host.synthetic.arch "llama3", rebuilt here from its seeds and checked by sha256),
with an F32 KV cache and flash attention off, run on 12 token ids with and without adapter.gguf (alpha 8; rank 4 on
attn_q/k/v/output, rank 2 on ffn_gate/up/down, every layer: two scales, 2 and 4). llama.cpp then rounds nothing of its
own: every matmul is f32 x f32, and the adapter is y = W x + s B (A x). The reference in float64 merges W + s B A.

Tolerance TOL = 1e-4 on every kept logit (the top 16 of both runs at every position and 64 fixed ids: 353 of
49,152): measured 6.7e-6 without the adapter and 8.1e-6 with it (llama.cpp's f32 sums against float64), so 12x
margin. The adapter moves those logits by up to 16.8 (17.6 over the vocabulary), 1.7e5 x TOL, and changes the top
token at all 12 positions. Each of the broken readings below misses llama.cpp's logits by more than 4 (measured:
alpha alone as the scale 22.6, one rank (4) for every pair 4.1, alpha doubled 15.5, A and B read with ggml's
[ne0, ne1] taken as numpy's (rows, cols) 20.4), so a reader that makes one of those mistakes fails by 4e4 x TOL.

llama.cpp's loader (llama_adapter_lora_init) was run on tests/unit/adapterkit.py's hostile adapters for this model
(meta.json "llama_cpp_loader"): every file it refuses, lab.format.adapter refuses; what it loads, the lab loads,
but for the cases the lab refuses on purpose ("stricter": alpha absent or negative, a rank above min(n_in, n_out), no
tensor, an F64 pair; lab/format/adapter.py says why).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lab.format import gguf, model
from lab.format.adapter import decode_f32, read_adapter, read_adapter_file
from lab.format.rules import ModelError
from lab.host.models import cache_dir
from lab.host.reference import Reference
from lab.host.reference import lora
from lab.host.synthetic import arch as synthetic_arch
from tests.conftest import FIXTURES
from tests.unit.adapterkit import loader_cases

FIX = FIXTURES / "lora"
ADAPTER = FIX / "adapter.gguf"
TOL = 1e-4
BROKEN_BY = 4.0          # every broken reading misses by more than this (measured: the module doc)


@pytest.fixture(scope="module")
def meta() -> dict:
    return json.loads((FIX / "meta.json").read_text())


@pytest.fixture(scope="module")
def golden():
    with np.load(FIX / "logits.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model_path(meta):
    path = synthetic_arch.build(meta["spec"], meta["mix"], cache_dir() / "synthetic")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == meta["model_sha256"], f"{path} is not the file llama.cpp ran: rebuild it (force=True)"
    return path


@pytest.fixture(scope="module")
def ref(model_path):
    return Reference(model_path, dtype=np.float64)


def kept(ref, golden) -> np.ndarray:
    return ref.forward(golden["ids"])[:, golden["cols"]]


def test_the_committed_adapter_is_the_one_llama_cpp_ran(meta):
    assert hashlib.sha256(ADAPTER.read_bytes()).hexdigest() == meta["adapter_sha256"]


def test_without_the_adapter_the_reference_is_llama_cpp(ref, golden):
    lora.remove(ref)
    got = kept(ref, golden)
    assert np.abs(got - golden["without"]).max() < TOL
    sure = golden["gap_without"] > 2 * TOL            # position 9's top two are 0.0009 apart: still 9 x TOL
    assert np.array_equal(golden["cols"][got.argmax(1)][sure], golden["argmax_without"][sure])


def test_with_the_adapter_the_reference_is_llama_cpp(ref, golden):
    lora.apply(ref, ADAPTER)
    try:
        got = kept(ref, golden)
    finally:
        lora.remove(ref)
    assert np.abs(got - golden["with_adapter"]).max() < TOL
    assert np.array_equal(golden["cols"][got.argmax(1)], golden["argmax_with"])


def test_the_adapter_moves_the_logits_far_past_the_tolerance(golden, meta):
    effect = np.abs(golden["with_adapter"] - golden["without"]).max()
    assert effect > 1e4 * TOL and effect == pytest.approx(meta["effect_max_abs"], abs=1e-3)
    assert not np.array_equal(golden["argmax_with"], golden["argmax_without"])


def misread(pairs: lora.Pairs) -> lora.Pairs:
    """A and B as a reader gets them that takes ggml's shape [ne0, ne1] for numpy's (rows, cols): each the same
    bytes in the transposed shape, transposed back to fit."""
    return {k: (a.reshape(a.shape[1], a.shape[0]).T, b.reshape(b.shape[1], b.shape[0]).T) for k, (a, b) in
            pairs.items()}


BROKEN = {
    "alpha alone as the scale": lambda ref, alpha, pairs: lora.apply(ref, pairs, alpha, scale=lambda a, r: a),
    "one rank (4) for every pair": lambda ref, alpha, pairs: lora.apply(ref, pairs, alpha, scale=lambda a, r: a / 4),
    "alpha doubled": lambda ref, alpha, pairs: lora.apply(ref, pairs, 2 * alpha),
    "A and B read transposed": lambda ref, alpha, pairs: lora.apply(ref, misread(pairs), alpha),
}


@pytest.mark.parametrize("how", BROKEN)
def test_a_broken_reading_misses_llama_cpp(ref, golden, how):
    alpha, pairs = lora.load(ADAPTER)
    BROKEN[how](ref, alpha, pairs)
    try:
        got = kept(ref, golden)
    finally:
        lora.remove(ref)
    assert np.abs(got - golden["with_adapter"]).max() > BROKEN_BY


def test_the_lab_reader_and_gguf_py_read_the_same_adapter(model_path):
    """lab.format.adapter (the engine's reader: offsets to stream from) and gguf-py (the reference's) agree on every
    value of every pair, against the model's own tensor table."""
    header = gguf.read_file(model_path)
    cfg = model.from_gguf(header)
    ad = read_adapter_file(ADAPTER, cfg, {t.name: t.shape for t in header.tensors})
    alpha, pairs = lora.load(ADAPTER)
    assert ad.alpha == alpha == 8.0 and set(ad.bases) == set(pairs) and len(pairs) == 7 * cfg.n_layer
    assert {p.scale for p in ad.pairs} == {2.0, 4.0}
    data = ADAPTER.read_bytes()
    for p in ad.pairs:
        a, b = pairs[p.base]
        assert a.shape == (p.rank, p.n_in) and b.shape == (p.n_out, p.rank)
        got_a = np.array(decode_f32(data[p.a_offset:p.a_offset + p.a_nbytes], p.a_type)).reshape(a.shape)
        got_b = np.array(decode_f32(data[p.b_offset:p.b_offset + p.b_nbytes], p.b_type)).reshape(b.shape)
        assert np.array_equal(got_a, a) and np.array_equal(got_b, b)


def test_the_lab_refuses_what_llama_cpps_loader_refuses(model_path, meta):
    header = gguf.read_file(model_path)
    cfg, table = model.from_gguf(header), {t.name: t.shape for t in header.tensors}
    said = meta["llama_cpp_loader"]
    cases = loader_cases()
    assert set(said) == set(cases)
    for name, (verdict, data) in cases.items():
        assert said[name].startswith("refused" if verdict == "refused" else "loaded"), (name, said[name])
        try:
            read_adapter(data, len(data), cfg, table)
            ours = "loaded"
        except ModelError as e:
            ours = f"refused: {e}"
        assert ours.startswith("loaded" if verdict == "loaded" else "refused"), (name, said[name], ours)
