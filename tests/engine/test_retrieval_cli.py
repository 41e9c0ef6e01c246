"""`lab index`, `lab ask` and `lab retrieval-eval` through the CLI's main, natively (lavapipe), on the small synthetic
Llama 3 file (tests/conftest.py `tiny`: SmolLM2's vocabulary and chat template; what the commands do does not depend on
the weights; the real models' recall is docs/retrieval.md's), on
the Constitution's preamble (327 characters, 67 tokens: five windows of 16).

The index is built once for the module; `ask` asks for the exact text of one window, so the search must find that
window first with a cosine of 1 and rank the others as numpy does on the saved embeddings; damaged and foreign
indexes are refused before a GPU opens, with one line and exit status 2."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json

import numpy as np
import pytest

from lab.engine.load import validate
from lab.format import gguf
from lab.host import cli, index_file
from lab.instruments.retrieval import CROP, windows_of
from lab.text.tokenizer import from_metadata
from tests.conftest import FIXTURES

TEXT = (FIXTURES / "constitution.txt").read_text().split("\n\n")[0]      # the preamble
WINDOW = 16
HIT_KEYS = {"file", "window", "start_token", "end_token", "score", "text"}
COS_TOL = 1e-3      # the question runs the windows' own kernels on the same ids: only f32 summation order differs


def lab(*argv) -> tuple[int, str, str]:
    """rc, stdout and stderr of `lab ARGV...`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def tok(tiny_path):
    return from_metadata(gguf.read_file(tiny_path).metadata)


@pytest.fixture(scope="module")
def info(tiny_path):
    header = gguf.read_file(tiny_path)
    return index_file.model_info(tiny_path, header, validate(header)[0])


@pytest.fixture(scope="module")
def built(tiny_path, tmp_path_factory):
    """`lab index` of the preamble, with an empty file, a binary one and a missing one among the files."""
    d = tmp_path_factory.mktemp("rag")
    (d / "preamble.txt").write_text(TEXT)
    (d / "empty.txt").write_bytes(b"")
    (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    files = [d / "preamble.txt", d / "empty.txt", d / "image.png", d / "missing.txt"]
    out = d / "preamble.idx"
    rc, stdout, stderr = lab("index", tiny_path, *files, "--out", out, "--window", WINDOW, "--stride", WINDOW,
                             "--ctx", 256, "--json")
    return {"dir": d, "files": files, "index": out, "rc": rc, "out": stdout, "err": stderr}


def test_index_indexes_the_text_and_names_each_refused_file(built, tok, info):
    assert built["rc"] == 0, built["err"]
    s = json.loads(built["out"])
    src, empty, image, missing = (str(f) for f in built["files"])
    n_tokens = len(tok.encode(TEXT))
    assert s["files"] == [{"name": src, "tokens": n_tokens, "sha256": hashlib.sha256(TEXT.encode()).hexdigest()}]
    assert s["windows"] == len(windows_of(n_tokens, WINDOW, WINDOW)) == 5 and s["tokens"] == n_tokens == 67
    assert (s["window"], s["stride"], s["index"], s["bytes"]) == (WINDOW, WINDOW, str(built["index"]),
                                                                  built["index"].stat().st_size)
    assert s["seconds"] > 0 and s["windows_per_s"] > 0
    why = {r["name"]: r["message"] for r in s["refused"]}
    assert set(why) == {empty, image, missing}
    assert "the file is empty" in why[empty] and "a binary file" in why[image] and "No such file" in why[missing]
    for name in why:
        assert f"lab index: refused {name}: " in built["err"]
    assert "5/5 windows" in built["err"] and "windows/s" in built["err"]      # the progress line
    saved = index_file.load(built["index"], info)
    assert saved.embeddings.shape == (5, 256) and saved.files[0].ids == tok.encode(TEXT)
    print(f"\nlab index: {s['windows']} windows of {WINDOW} in {s['seconds']} s ({s['windows_per_s']} windows/s)")


def test_ask_finds_the_window_it_is_asked_and_packs_the_prompt(built, tiny_path, tok, info):
    saved = index_file.load(built["index"], info)
    w = 1
    _f, a, b = saved.spans[w]
    question = tok.decode(saved.files[0].ids[a:b])
    assert tok.encode(question) == saved.files[0].ids[a:b]     # the question is exactly window 1's ids
    rc, out, err = lab("ask", tiny_path, "--index", built["index"], "--question", question, "-k", 3, "-n", 4,
                       "--greedy", "--ctx", 256, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert set(res) == {"hits", "prompt", "answer"}
    hits = res["hits"]
    assert len(hits) == 3 and all(HIT_KEYS <= set(h) <= HIT_KEYS | {"rank"} for h in hits)
    assert [h["rank"] for h in hits] == [1, 2, 3]
    scores = [h["score"] for h in hits]
    assert scores == sorted(scores, reverse=True)
    # the window asked for comes first with a cosine of 1, and the rest as numpy ranks the saved embeddings
    cos = saved.embeddings @ saved.embeddings[w]
    want = np.argsort(-cos, kind="stable")[:3]
    assert [h["window"] for h in hits] == want.tolist() and want[0] == w
    np.testing.assert_allclose(scores, cos[want], atol=COS_TOL)
    for h in hits:
        f, a, b = saved.spans[h["window"]]
        assert (h["file"], h["start_token"], h["end_token"]) == (saved.files[f].name, a, b)
        assert h["text"] == tok.decode(saved.files[f].ids[a:b])
        assert h["text"].strip() in res["prompt"]
    assert question in res["prompt"] and res["prompt"].index(hits[0]["text"].strip()) < res["prompt"].index(
        "Question: " + question)
    assert res["prompt"].startswith("<|im_start|>system\n") and res["prompt"].endswith("<|im_start|>assistant\n")
    assert isinstance(res["answer"], str) and res["answer"]


def damaged(built, name: str, edit) -> str:
    raw = bytearray(built["index"].read_bytes())
    edit(raw)
    path = built["dir"] / name
    path.write_bytes(bytes(raw))
    return str(path)


@pytest.mark.parametrize("name, edit, why", [
    ("flipped.idx", lambda raw: raw.__setitem__(slice(-600, -596), bytes(b ^ 0xFF for b in raw[-600:-596])),
     "embedding"),
    ("truncated.idx", lambda raw: raw.__delitem__(slice(-100, None)), "truncated: "),
])
def test_ask_refuses_a_damaged_index(built, tiny_path, name, edit, why):
    path = damaged(built, name, edit)
    rc, out, err = lab("ask", tiny_path, "--index", path, "--question", "Who ordains it?", "--json")
    assert rc == 2 and not out
    assert err.startswith(f"lab ask: {path}: ") and why in err and "rebuild it with `lab index" in err, err
    assert "Traceback" not in err and err.count("\n") == 1


def test_ask_refuses_an_index_of_another_model(built, tiny_path, qwen_path, info):
    # the same shape and another fingerprint (a fine-tune): faked in the header
    path = damaged(built, "finetune.idx", lambda raw: raw.__setitem__(
        slice(raw.index(info.fingerprint.encode()), raw.index(info.fingerprint.encode()) + 64), b"0" * 64))
    rc, _out, err = lab("ask", tiny_path, "--index", path, "--question", "Who ordains it?")
    assert rc == 2 and "made with another model of the same shape" in err and "Traceback" not in err, err
    # a real other model
    rc, _out, err = lab("ask", qwen_path, "--index", built["index"], "--question", "Who ordains it?")
    assert rc == 2 and f"lab ask: {built['index']}: made with another model: " in err, err
    assert "(llama, n_embd 256" in err and "(qwen2, n_embd 896" in err


def test_index_of_nothing_fails(built, tiny_path):
    empty = built["files"][1]
    out = built["dir"] / "nothing.idx"
    rc, stdout, err = lab("index", tiny_path, empty, "--out", out, "--window", WINDOW, "--stride", WINDOW,
                          "--ctx", 256)
    assert rc == 2 and not stdout and not out.exists()
    assert f"nothing to index: {empty}: the file is empty" in err, err


def test_retrieval_eval(built, tiny_path):
    rc, out, err = lab("retrieval-eval", tiny_path, built["files"][0], "--queries", 8, "--window", WINDOW,
                       "--stride", WINDOW, "--ctx", 256, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert set(res) == {"model", "files", "windows", "tokens", "index_seconds", "windows_per_s", "recall"}
    assert res["model"] == tiny_path.name and res["files"] == [{"name": str(built["files"][0]), "tokens": 67}]
    assert (res["windows"], res["tokens"]) == (5, 67) and res["index_seconds"] > 0 and res["windows_per_s"] > 0
    r = res["recall"]
    assert set(r) == {"queries", "recall_at_1", "recall_at_5", "seconds", "crop", "seed"}
    assert (r["queries"], r["crop"], r["seed"]) == (8, CROP, 0)
    assert 0 <= r["recall_at_1"] <= r["recall_at_5"] <= 1
    # five windows: a top 5 holds the whole index, so every crop's covering window is in it
    assert r["recall_at_5"] == 1
    print(f"\nretrieval-eval: {res['windows_per_s']} windows/s; recall@1 {r['recall_at_1']} over 8 crops")


def test_ask_text_output_and_no_retrieval(built, tiny_path):
    rc, out, err = lab("ask", tiny_path, "--index", built["index"], "--question", "Who ordains this Constitution?",
                       "-k", 2, "-n", 4, "--greedy", "--ctx", 256)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:1] == ["1"] and "tokens " in lines[0] and lines[2].startswith("--- prompt (")
    assert "--- answer ---" in out and "Passages:" in out
    rc, out, err = lab("ask", tiny_path, "--index", built["index"], "--question", "Who ordains this Constitution?",
                       "--no-retrieval", "-n", 4, "--greedy", "--ctx", 256, "--json")
    res = json.loads(out)
    assert rc == 0 and res["hits"] == [] and "Passages" not in res["prompt"]
    assert "Who ordains this Constitution?" in res["prompt"]
