"""A LoRA trained on chat turns (issue #44 part 4), natively on lavapipe: the loss over the assistant's tokens alone
held to float64 central differences (its divisor the step's trained tokens, written each step), `lab train` on a
.jsonl that `lab grounded-data` wrote, and `lab grounded-eval` on its held-out rows with and without an index."""

from __future__ import annotations

import json

import pytest

from lab.host import gradcheck
from lab.host.cli import main
from lab.host.models import cache_dir
from lab.host.synthetic import arch as synthetic_arch
from lab.instruments.training import Trainer

TEXT = ("The index holds one row for each window of the files. The cache keeps the keys of every layer. "
        "The sampler takes the logits of the last position.\n\n"
        "The worker runs the engine inside the page and answers its messages one at a time.\n\n"
        "The server sends the files of the page and never sees a conversation.\n\n"
        "The adapter holds two small matrices for each projection it changes.\n\n"
        "The budget counts every buffer before any of them is made on the GPU.\n\n"
        "The tokenizer reads the vocabulary from the header of the model file.\n")


@pytest.fixture(scope="module")
def model():
    return synthetic_arch.build("llama3", "f32", cache_dir() / "synthetic")


def test_masked_gradients_match_central_differences(device, model):
    """The answer-only loss: every LoRA tensor's gradient against float64 central differences of the same masked
    loss, two windows of different answers (the divisor counts both)."""
    engine = gradcheck.open_engine(model, 12, device=device)
    try:
        # the mask reaches every gradient through the head's dlogits alone: a layer's first and the last layer's
        # last adapted matrices are enough to catch it, and the float64 forward is the test's cost
        r = gradcheck.check(model, T=12, batch=2, samples=1, engine=engine, masked=True,
                            only=("blk.0.attn_q.", "blk.3.ffn_down."))
    finally:
        engine.close()
    assert r["masked"] and r["ok"], sorted(r["tensors"], key=lambda t: -t["worst_rel_err"])[:3]
    assert r["loss_rel_err"] < 1e-5                      # f32 sums: ~1e-7 measured


def test_a_step_without_a_trained_token_is_refused(device, model):
    engine = gradcheck.open_engine(model, 8, device=device)
    tr = Trainer(engine, T=8, batch=1, rank=2)
    try:
        with pytest.raises(ValueError, match="no token of the step's windows is trained"):
            import asyncio
            asyncio.run(tr.step([[1] * 8], [[False] * 8]))
    finally:
        tr.close()
        engine.close()


def _made(tmp_path, capsys):
    docs, sets = tmp_path / "notes.md", tmp_path / "set.jsonl"
    docs.write_text(TEXT)
    assert main(["grounded-data", str(docs), "--out", str(sets), "--held-out", "0.3", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["held_out"] == str(tmp_path / "set.heldout.jsonl") and made["train"]["rows"] >= 2
    assert made["held"]["rows"] >= 1
    return docs, sets, tmp_path / "set.heldout.jsonl"


@pytest.mark.slow      # by default the Training card's chat-turn run (test_training_card.py) takes the same path
def test_train_on_chat_turns(model, tmp_path, capsys):
    """`lab train` on a .jsonl: each conversation a window, its answers' tokens alone counted and trained, the held-out
    loss over the held-out conversations' answers."""
    turns = [[{"role": "user", "content": f"Say {w}."}, {"role": "assistant", "content": f"{w} {w}."}]
             for w in ("red", "green", "blue", "black", "white")]
    data, out = tmp_path / "turns.jsonl", tmp_path / "t.lora.gguf"
    data.write_text("".join(json.dumps({"messages": t}) + "\n" for t in turns))
    assert main(["train", str(model), "--data", str(data), "--ctx", "40", "--batch", "2", "--steps", "2",
                 "--lora-rank", "2", "--held-out", "0.2", "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["data"] == "chat turns" and (r["windows"], r["held_out_windows"]) == (4, 1)
    assert 4 * 3 <= r["trained_tokens"] <= 4 * 8 and len(r["held_out"]) == 3 and out.exists()


@pytest.mark.slow
def test_grounded_data_then_train_then_eval(model, tmp_path, capsys):
    _docs, sets, held = _made(tmp_path, capsys)
    out = tmp_path / "a.lora.gguf"
    assert main(["train", str(model), "--data", str(sets), "--ctx", "256", "--batch", "1", "--steps", "2",
                 "--lora-rank", "2", "--held-out", "0.3", "--sample", "2", "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    rows = [json.loads(line) for line in sets.read_text().splitlines()]
    assert r["data"] == "chat turns" and r["windows"] + r["held_out_windows"] == len(rows)
    # the answers' tokens and their end of turn: far fewer than the windows' positions
    assert 0 < r["trained_tokens"] < r["windows"] * 255 / 4 and len(r["held_out"]) == 3 and out.exists()
    assert main(["grounded-eval", str(model), "--set", str(held), "--lora", str(out), "-n", "2", "--limit", "1",
                 "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert len(e["replies"]) == 1 and e["rows_should_refuse"] + e["rows_should_answer"] == 1


@pytest.mark.slow
def test_grounded_eval_with_an_index(model, tmp_path, capsys):
    docs, _sets, held = _made(tmp_path, capsys)
    index = tmp_path / "notes.index"
    assert main(["index", str(model), str(docs), "--out", str(index), "--window", "16", "--stride", "8"]) == 0
    capsys.readouterr()
    assert main(["grounded-eval", str(model), "--set", str(held), "--index", str(index), "-k", "2", "-n", "2",
                 "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["retrieved"] and len(e["replies"]) == len(held.read_text().splitlines())
    assert all(r["answerable"] in (True, False) for r in e["replies"])


def test_grounded_eval_refuses_a_prompt_over_the_context_by_its_line(model, tmp_path, capsys):
    """Every prompt is measured before the first reply: the longest's line and the --ctx that fits, in one line."""
    _docs, _sets, held = _made(tmp_path, capsys)
    rc = main(["grounded-eval", str(model), "--set", str(held), "--ctx", "64", "-n", "8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert " line " in err and "more than the context of 64: run with --ctx " in err and "grounded-eval: 1/" not in err, err


@pytest.mark.parametrize("line,words", [
    ('{"messages": [{"role": "user", "content": "q"}]}', "line 1: no assistant message"),
    ('{"messages": [{"role": "user", "content": "' + "word " * 400 + '"}, {"role": "assistant", "content": "a"}]}',
     "longer than a window of 32"),
])
def test_train_refuses_bad_chat_lines_in_one_line(model, tmp_path, capsys, line, words):
    data = tmp_path / "bad.jsonl"
    data.write_text(line + "\n")
    rc = main(["train", str(model), "--data", str(data), "--ctx", "32", "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
