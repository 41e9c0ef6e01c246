"""`lab train` and `lab gradcheck` as a user (and the issue's outside tests) run them: the fixed flags, the JSON's
shape, the adapter file it writes, and one-line refusals naming the number."""

from __future__ import annotations

import json

import pytest

from lab.format import gguf
from lab.format.adapter import read_adapter_file
from lab.engine.load import validate
from lab.host.cli import main
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch

TEXT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture(scope="module")
def model():
    return synthetic_arch.build("llama3", "q4_k_m", cache_dir() / "synthetic")


def test_train_json_and_the_adapter_file(model, tmp_path, capsys):
    data, out = tmp_path / "data.txt", tmp_path / "a.gguf"
    data.write_text(TEXT)
    rc = main(["train", str(model), "--data", str(data), "--ctx", "8", "--batch", "2", "--steps", "2",
               "--lora-rank", "2", "--lora-targets", "attn_q,ffn_down", "--optimizer", "sgd", "--lr", "0.01",
               "--seed", "3", "--out", str(out), "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["losses"]) == 2 and r["tokens_per_s"] > 0 and r["out"] == str(out)
    cfg, _ = validate(gguf.read_file(model))
    adapter = read_adapter_file(out, cfg, {t.name: tuple(t.shape) for t in gguf.read_file(model).tensors})
    assert adapter.alpha == 4.0 and {p.base.split(".")[2] for p in adapter.pairs} == {"attn_q", "ffn_down"}
    assert len(adapter.pairs) == 2 * cfg.n_layer and all(p.rank == 2 for p in adapter.pairs)


@pytest.mark.parametrize("flags,words", [
    (["--ctx", "4096"], "fewer than one window of 4096"),
    (["--lora-rank", "300"], "rank 300 is larger than"),
    (["--full"], "full fine-tuning trains the weights themselves in f32, and this file's matrices are"),
    (["--backend", "browser", "--full"], "--full cannot be set there"),
    (["--lora-targets", "ffn_nowhere"], "ffn_nowhere"),
    (["--backend", "browser", "--warmup", "2", "--seed", "3"], "--warmup, --seed cannot be set there"),
    (["--backend", "browser", "--lora-targets", "attn_q"], "--lora-targets cannot be set there"),
])
def test_train_refusals_are_one_line(model, tmp_path, capsys, flags, words):
    data = tmp_path / "data.txt"
    data.write_text(TEXT)
    rc = main(["train", str(model), "--data", str(data), "--ctx", "8", "--steps", "1", *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err


def test_gradcheck_json(model, capsys):
    assert main(["gradcheck", str(model), "--ctx", "6", "--rank", "2", "--samples", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ok"] and r["worst_rel_err"] < r["tolerance"] and len(r["tensors"]) == 2 * 7 * 4
