"""The Tokenizer card's worker side (lab/worker/tokenizer.py) outside the browser: its handler run with a Worker whose
ways out are a list and lambdas, and Files that are stand-ins (a name, a size, the bytes). What it posts against what
`lab tokenizer-train` and lab/text/tokenizer/train.py make of the same text (the JSON file byte for byte, the merges,
bytes per token for the trained tokenizer and for the loaded model's), the refusals in the words the card shows, Stop
after k slices leaving the whole run's first merges, and nothing of the text left in the worker after a run."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.host import cli
from lab.settings import TOKENIZER
from lab.text.tokenizer import pretokenize, train
from lab.worker import tokenizer as card
from lab.worker.state import State, Worker

ROOT = Path(__file__).resolve().parents[2]
CONSTITUTION = ROOT / "tests" / "fixtures" / "constitution.txt"
TEXT = CONSTITUTION.read_text(encoding="utf-8")
OTHER = "Grüße aus Köln! 日本語のテキスト。 it's they'll WE'RE 1234567\n\n  tabs\tand spaces  \n"


class File:
    """What web/worker.js hands Python for a picked file: name, size, and arrayBuffer() whose to_bytes() is the bytes
    (raw None: the browser cannot read it any more, as when the file was written again after it was picked)."""

    def __init__(self, name: str, raw: bytes | None):
        self.name, self.raw, self.size = name, raw, len(raw or b"")

    async def arrayBuffer(self):
        if self.raw is None:
            raise OSError("NotReadableError: The requested file could not be read")
        return SimpleNamespace(to_bytes=lambda: self.raw)


def worker(stop_after: int | None = None, model=None) -> tuple[Worker, list]:
    """A Worker posting to a list; Stop heard once `stop_after` polls have said no (None: never); `model` the loaded
    model's tokenizer, as Loaded.tokenizer (the handler reads nothing else of a loaded model)."""
    posted, polls = [], [0]

    def stop_requested() -> bool:
        polls[0] += 1
        return stop_after is not None and polls[0] > stop_after
    w = Worker(post=posted.append, f32=bytes, stop_requested=stop_requested, stop_clear=lambda: None)
    if model is not None:
        w.state = State(loaded=SimpleNamespace(tokenizer=model))
    return w, posted


def run(msg: dict, w: Worker) -> None:
    asyncio.run(card.run({"type": "tokenizer-train", "seq": 3, **msg}, w))


def done(posted: list) -> dict:
    [d] = [m for m in posted if m["type"] == "tokenizer-done"]
    return d


@pytest.fixture(scope="module")
def model():
    """A loaded model's tokenizer stands in as another trained one (a BPETokenizer, as SmolLM2's is)."""
    return train.train([OTHER, TEXT[:4000]], 400).tokenizer()


def test_the_min_vocabulary_in_settings_is_the_trainer_s():
    assert TOKENIZER.min_vocab == len(train.DEFAULT_SPECIALS) + len(train.BYTE_TOKENS) == 257


def test_files_train_what_the_cli_trains_and_measure_what_it_measures(tmp_path, capsys, model):
    a, b = tmp_path / "constitution.txt", tmp_path / "other.txt"
    a.write_text(TEXT, encoding="utf-8")
    b.write_text(OTHER, encoding="utf-8")
    out = tmp_path / "cli.json"
    assert cli.main(["tokenizer-train", str(a), str(b), "--vocab", "700", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    w, posted = worker(model=model)
    run({"files": [File("constitution.txt", a.read_bytes()), File("other.txt", b.read_bytes())], "vocab": 700}, w)
    d = done(posted)
    r = d["result"]
    assert d["seq"] == 3 and d["json"].encode("utf-8") == out.read_bytes()         # the download is the CLI's file
    trained = train.train([TEXT, OTHER], 700)
    assert d["gguf"][:d["gguf_size"]] == trained.gguf() and len(d["gguf"]) % 4 == 0
    assert (r["vocab"], r["merges"], r["target"], r["bytes"]) == (report["vocab"], report["merges"], 700 - 257,
                                                                   report["bytes"])
    assert r["bytes_per_token"] == report["bytes_per_token"] == train.bytes_per_token(
        trained.tokenizer(), [TEXT, OTHER], report["bytes"])
    assert r["model"] == {"vocab": 400, "bytes_per_token": train.bytes_per_token(model, [TEXT, OTHER], r["bytes"])}
    assert not r["stopped"] and not r["exhausted"] and r["names"] == ["constitution.txt", "other.txt"]
    # the first merges in order with their counts, as the pieces they join
    tok = trained.tokenizer()
    pieces = {t: tok.piece(i) for i, t in enumerate(trained.tokens)}
    assert [(m["left"], m["right"], m["count"]) for m in r["first_merges"]] == [
        (pieces[x], pieces[y], c) for (x, y), c in zip(trained.merges[:card.MERGES_SHOWN], trained.counts)]
    assert r["first_merges"][0] == {"rank": 0, "left": " ", "right": "t", "count": trained.counts[0]}
    # the text's opening as tokens both ways: each spells the sample
    s = r["sample"]
    assert s["text"] == card.sample_of(TEXT) and "".join(s["trained"]) == "".join(s["model"]) == s["text"]
    assert s["trained"] == [tok.piece(i) for i in tok.encode(s["text"])]
    # progress: the texts counted, merges made of the target (the last one all of them), then the two measurements
    phases = [(m["phase"], m["done"], m["total"]) for m in posted if m["type"] == "tokenizer-progress"]
    assert phases[:2] == [("count", 0, 2), ("count", 1, 2)]
    merges = [p for p in phases if p[0] == "merge"]
    assert merges[0] == ("merge", 0, 443) and merges[-1] == ("merge", 443, 443)
    assert [m[1] for m in merges] == sorted(m[1] for m in merges)
    assert phases[-2:] == [("measure", 0, 2), ("measure", 1, 2)]


def test_the_conversation_s_text_trains_without_a_model():
    w, posted = worker()
    run({"text": OTHER * 3, "vocab": 300}, w)
    r = done(posted)["result"]
    assert r["model"] is None and r["sample"]["model"] is None and r["names"] == ["the conversation"]
    assert r["bytes"] == len((OTHER * 3).encode("utf-8"))
    assert r["merges"] == len(train.train([OTHER * 3], 300).merges)


def test_a_text_with_too_few_pairs_ends_before_the_target():
    w, posted = worker()
    run({"text": "ab ab", "vocab": 1000}, w)
    r = done(posted)["result"]
    assert r["exhausted"] and r["merges"] == 2 and r["vocab"] == 259 and r["target"] == 743


@pytest.mark.parametrize("slices", [0, 1, 3])
def test_stop_keeps_the_whole_run_s_first_merges(slices):
    """Stop heard after `slices` slices of merges (0: before the first): the merges made are the first ones of the
    run that was not stopped, with their counts, the file is the smaller vocabulary's, and nothing is measured."""
    w, posted = worker(stop_after=slices)
    run({"files": [File("c.txt", TEXT.encode())], "vocab": 4000}, w)
    d = done(posted)
    r = d["result"]
    made = r["merges"]
    assert r["stopped"] and r["bytes_per_token"] is None and r["model"] is None
    assert made == {0: 0, 1: card.FIRST_SLICE}.get(slices, made) and (slices < 3 or card.FIRST_SLICE < made < 3743)
    whole = train.train([TEXT], 4000)
    back = json.loads(d["json"])
    assert back["merges"] == [f"{a} {b}" for a, b in whole.merges[:made]] and back["merge_counts"] == whole.counts[:made]
    assert d["json"] == train.train([TEXT], 257 + made).dumps()


@pytest.mark.parametrize("msg, message", [
    ({"vocab": 256, "text": "some text"}, "a vocabulary of 256 tokens is below the 257 special and byte tokens: choose 257 .. 65,536"),
    ({"vocab": 70_000, "text": "some text"}, "a vocabulary of 70,000 tokens is above 65,536"),
    ({"vocab": None, "text": "some text"}, "no vocabulary size: choose 257 .. 65,536"),
    ({"vocab": 500}, "no text: choose one or more text files"),
    ({"vocab": 500, "text": " \n\t "}, "no text"),
    ({"vocab": 500, "files": [File("big.txt", b"x" * (TOKENIZER.max_bytes + 1))]},
     "4,000,001 bytes of text: the page trains on at most 4,000,000"),
    ({"vocab": 500, "text": "é" * (TOKENIZER.max_bytes // 2 + 1)}, "4,000,002 bytes of text"),
    ({"vocab": 500, "files": [File("a.txt", b"fine text"), File("empty.txt", b"")]}, "empty.txt: the file is empty"),
    ({"vocab": 500, "files": [File("blank.txt", b"  \n ")]}, "blank.txt: holds only white space"),
    ({"vocab": 500, "files": [File("photo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")]},
     "photo.png: a binary file (it holds NUL bytes), not text"),
    ({"vocab": 500, "files": [File("gone.txt", None)]},
     "gone.txt could not be read (NotReadableError: The requested file could not be read): it changed or moved since "
     "it was picked; pick it again"),
    ({"vocab": 500, "files": [File("latin1.txt", "café au lait".encode("latin-1"))]},
     "latin1.txt: not UTF-8 text (byte 3 is 0xe9): save it as UTF-8 and pick it again"),
])
def test_bad_input_is_refused_in_one_line_and_nothing_is_posted(msg, message):
    w, posted = worker()
    with pytest.raises(ValueError) as caught:
        run(msg, w)
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert posted == []          # refused before any progress: the card shows the line, nothing half-done


@pytest.mark.parametrize("loaded", [True, False], ids=["with-a-model", "no-model"])
def test_nothing_of_the_text_outlives_the_run(model, loaded):
    """The worker keeps no copy: no trainer or trained vocabulary left alive, the pre-tokenizer's character tables
    and the loaded tokenizer's chunk cache (which the run filled with pieces of the text) empty, the worker's state
    as it was. So Forget and New chat have nothing of the card's to drop here."""
    model.encode("a chat turn's text")           # a cache the chat filled goes too (it refills on the next encode)
    w, posted = worker(model=model if loaded else None)
    before = w.state

    def alive() -> set:              # (the other test modules' own vocabularies are alive before and after)
        gc.collect()
        return {id(o) for o in gc.get_objects() if isinstance(o, (train.BPETrainer, train.TrainedBPE,
                                                                   train.PairCounts))}
    earlier = alive()
    run({"files": [File("c.txt", TEXT.encode())], "vocab": 600}, w)
    del posted[:]
    assert alive() - earlier == set()
    assert pretokenize._flag_cache == {} and pretokenize._collapse_cache == {}
    assert w.state is before
    if loaded:
        assert model.drop_caches() == 0 and w.state.loaded.tokenizer is model
    else:
        model.drop_caches()


def test_a_failed_run_leaves_nothing_either(model):
    w, _ = worker(model=model)
    with pytest.raises(ValueError, match="not UTF-8"):
        run({"files": [File("ok.txt", TEXT.encode()), File("bad.txt", b"ok \xff")], "vocab": 600}, w)
    assert model.drop_caches() == 0 and pretokenize._flag_cache == {}


def test_the_sample_is_the_opening_cut_at_a_space():
    assert card.sample_of("short text") == "short text"
    s = card.sample_of(TEXT)
    assert TEXT.startswith(s) and len(s) <= card.SAMPLE_CHARS and TEXT[len(s)] in " \n"
