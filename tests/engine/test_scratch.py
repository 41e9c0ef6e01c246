"""A model trained from scratch (issue #44 part 2, `lab train --scratch`), natively.

1. The file llama.cpp reads: the fixture's run (scripts/make_scratch_fixture.py: a vocabulary trained on the
   constitution, a 2-layer llama with grouped-query attention and a tied head, its weights drawn from a seed) trained
   again here, the untrained file (--steps 0) and the trained one each held to llama.cpp on the same run's files:
   the prompt's tokens identical (each side with the file's own vocabulary), the logits at every position within
   the usual tolerance, the trained model's greedy continuation identical.
2. The gradients of an untrained model against float64 central differences (every tensor: the drawn weights start
   where no real release does, with GQA and the tied head).
3. The start: one seed, one model; another seed, another; the norms at one, the residual outputs narrower. A
   checkpoint's sample (--sample) leaves the run's losses as they were.
4. What is refused, in words: shapes the kernels cannot run, MODEL and --scratch together, no tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys

import numpy as np
import pytest

from lab.engine.engine import Engine
from lab.engine.load import validate
from lab.format import gguf, untrained
from lab.host import cli, gradcheck
from lab.host.loading import open_untrained
from lab.text.tokenizer import train as bpe
from tests.conftest import FIXTURES, ROOT

FIX = FIXTURES / "scratch"
LLAMA_TOL = 2e-3    # as tests/engine/test_full_finetune.py: F32 on both sides, summed in other orders

sys.path.insert(0, str(ROOT / "scripts"))
from make_scratch_fixture import N_GREEDY, PROMPT, RUN, SHAPE, VOCAB, tokenizer, train_args  # noqa: E402


@pytest.fixture(scope="module")
def golden():
    with np.load(FIX / "logits.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def meta():
    return json.loads((FIX / "meta.json").read_text())


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory, meta):
    path = tmp_path_factory.mktemp("scratch") / "tok.json"
    assert tokenizer(path) == meta["tokenizer_sha256"], "the fixture's vocabulary is no longer what the trainer makes"
    return path


def _logits(device, path, ids: list[int], greedy: int = 0):
    """The lab on the file at `path`: logits at every position of ids, and `greedy` tokens after them."""
    header = gguf.read_file(path)
    cfg, tok = validate(header)
    engine = Engine(device, header, cfg, n_ctx=len(ids) + greedy, logits_all=True)
    try:
        engine.weights.upload_file(path)
        engine.step(ids, 0)
        raw = device.read_sync(engine.scratch.logits, 0, 4 * len(ids) * cfg.n_vocab)
        logits = np.frombuffer(raw, np.float32).reshape(len(ids), cfg.n_vocab).copy()
        out = []
        for i in range(greedy):
            out.append(asyncio.run(engine.argmax()))
            if i + 1 < greedy:
                engine.step(None, len(ids) + i)
        return tok, logits, out
    finally:
        engine.close()


def test_a_model_trained_from_scratch_is_llama_cpps(device, tmp_path, capsys, golden, meta, tok_file):
    assert {k: meta[k] for k in RUN} == RUN and meta["shape"] == SHAPE and meta["vocab"] == VOCAB
    ids = [int(i) for i in golden["ids"]]
    for steps, key in ((0, "untrained"), (RUN["steps"], "logits")):
        out = tmp_path / f"{key}.gguf"
        assert cli.main(train_args(tok_file, out, steps)) == 0
        report = json.loads(capsys.readouterr().out.splitlines()[-1])     # after this test's own prints
        tok, got, greedy = _logits(device, out, ids, N_GREEDY if steps else 0)
        assert tok.encode(PROMPT) == ids, "the lab's tokens of the prompt are not llama.cpp's"
        err = float(np.abs(got[:, golden["cols"]] - golden[key]).max())
        print(f"\n{key}: the lab vs llama.cpp {err:.2e}")
        assert err < LLAMA_TOL
        if steps:
            np.testing.assert_allclose(report["losses"], meta["losses"], rtol=1e-4)
            assert [h[0] for h in report["held_out"]] == [h[0] for h in meta["held_out_losses"]]
            np.testing.assert_allclose([h[1] for h in report["held_out"]],
                                       [h[1] for h in meta["held_out_losses"]], rtol=1e-4)
            assert report["mode"] == "scratch" and report["held_out_windows"] >= 1
            assert greedy == [int(i) for i in golden["greedy"]], (greedy, golden["greedy"])
    # the run moved the model: llama.cpp's own two files apart by far more than the tolerance
    assert np.abs(golden["logits"] - golden["untrained"]).max() > 100 * LLAMA_TOL
    # the untrained model's loss is the uniform guess's: every token about as likely
    assert abs(meta["losses"][0] - math.log(VOCAB)) < 0.1


def test_checkpoint_samples_leave_the_run_as_it_was(tmp_path, capsys, meta, tok_file):
    """--sample: the model's greedy continuation at each checkpoint, generated between steps on the engine the steps
    use; the losses are the fixture's all the same (each window writes the KV cache afresh)."""
    assert cli.main([*train_args(tok_file, tmp_path / "m.gguf"), "--sample", "6"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    np.testing.assert_allclose(report["losses"], meta["losses"], rtol=1e-4)
    assert [s[0] for s in report["samples"]] == [h[0] for h in meta["held_out_losses"]]
    prompt = bpe.load(tok_file).tokenizer().decode(_held_out_start(tok_file))
    assert all(text.startswith(prompt) and len(text) > len(prompt) for _, text in report["samples"])


def _held_out_start(tok_file) -> list[int]:
    from lab.host.cli.training import SAMPLE_PROMPT
    from lab.instruments.training import split
    tok = bpe.load(tok_file).tokenizer()
    held = split(tok.encode((FIXTURES / "constitution.txt").read_text()), RUN["ctx"], RUN["held_out"])[1]
    return held[0][:SAMPLE_PROMPT]


def test_an_untrained_models_gradients_match_central_differences(device, tmp_path, capsys, tok_file):
    path = tmp_path / "fresh.gguf"
    assert cli.main(train_args(tok_file, path, 0)) == 0
    capsys.readouterr()
    engine = gradcheck.open_engine(path, 8, device=device)
    try:
        r = gradcheck.check(path, T=8, engine=engine, full=True, batch=1, samples=2)
    finally:
        engine.close()
    worst = max(row["worst_rel_err"] for row in r["tensors"])
    print(f"\nan untrained model's gradients: {len(r['tensors'])} tensors, worst {worst:.2e}")
    assert r["ok"] and len(r["tensors"]) == 1 + 9 * SHAPE["layers"] + 1


def _weights(device, shape, seed: int) -> dict[str, np.ndarray]:
    vocab = bpe.train(["a small text for a small vocabulary, " * 20], 300)
    header, _, engine = open_untrained(shape, vocab, seed, device=device)
    try:
        raw = asyncio.run(untrained_bytes(engine))
    finally:
        engine.close()
    h = gguf.read(raw, len(raw))
    return {t.name: np.frombuffer(raw[t.offset:t.offset + t.nbytes], np.float32) for t in h.tensors}


async def untrained_bytes(engine) -> bytes:
    from lab.instruments.training import model_bytes
    return await model_bytes(engine)


def test_the_start_is_the_seeds(device):
    shape = untrained.Shape(layers=2, width=64, heads=2, ffn=96, ctx=16)
    a, b, c = _weights(device, shape, 1), _weights(device, shape, 1), _weights(device, shape, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert all(not np.allclose(a[k], c[k]) for k in a if not k.endswith("norm.weight"))
    for name, w in a.items():
        mean, std = untrained.init_rule(name, shape)
        if std == 0:
            assert (w == mean).all(), name
        else:
            assert abs(w.std() - std) < 0.1 * std and abs(w.mean()) < 0.1 * std, (name, w.mean(), w.std())
    assert untrained.init_rule("blk.0.ffn_down.weight", shape)[1] == pytest.approx(0.02 / 2)
    n_vocab = a["token_embd.weight"].size // shape.width        # the text runs out of pairs before 300
    assert shape.n_params(n_vocab) == sum(w.size for w in a.values())


@pytest.mark.parametrize("kw,words", [
    (dict(width=60), "a multiple of 32"),
    (dict(heads=3), "does not split into 3 heads"),
    (dict(heads=16), "are 4 wide"),
    (dict(kv_heads=3), "do not share 3"),
    (dict(layers=0), "at least 1"),
    (dict(ctx=1), "a context of 1"),
    (dict(layers=2.5), "whole number"),
])
def test_shapes_the_kernels_cannot_run_are_refused(kw, words):
    base = dict(layers=2, width=64, heads=4, ffn=128, ctx=16)
    with pytest.raises(ValueError, match=words):
        untrained.Shape(**{**base, **kw})


def test_the_cli_refuses_what_does_not_fit(tmp_path, capsys, tok_file):
    data = str(FIXTURES / "constitution.txt")
    cases = [
        (["train", "--scratch", "--preset", "nano", "--data", data, "--out", str(tmp_path / "m.gguf")],
         "--tokenizer FILE.json"),
        (["train", "some.gguf", "--scratch", "--preset", "nano", "--tokenizer", str(tok_file), "--data", data,
          "--out", str(tmp_path / "m.gguf")], "drop MODEL"),
        (["train", "--scratch", "--width", "64", "--tokenizer", str(tok_file), "--data", data,
          "--out", str(tmp_path / "m.gguf")], "--layers, --heads"),
        (["train", "--layers", "2", "--data", data], "no MODEL"),
        (["train", str(tmp_path / "x.gguf"), "--layers", "2", "--data", data], "add --scratch"),
    ]
    for argv, words in cases:
        assert cli.main(argv) != 0, argv
        assert words in capsys.readouterr().err, argv
