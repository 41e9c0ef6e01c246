"""The worker's side of the Tokenizer card (web/tokenizer.js): a byte-level BPE vocabulary trained in the tab on the
user's text files or the chat's text so far, by the trainer `lab tokenizer-train` runs (lab/text/tokenizer/train.py,
the same defaults: the "gpt-2" pre-tokenizer, the one special token <|endoftext|>), measured as the CLI measures it.

    tokenizer-train {files: [File] | text: str, vocab, seq}
        -> "tokenizer-progress" {seq, phase, done, total, seconds}: phase "count" (texts cut into words: done of
           total texts), "merge" (merges made of the target, after every slice), "measure" (the texts encoded by
           the trained tokenizer, then by the loaded model's: done of 1 or 2)
        -> "tokenizer-done" {seq, result (`summary`), json (the file `lab tokenizer-train --out` writes, as text),
           gguf (the vocabulary-only GGUF, through Worker.f32: padded to whole words), gguf_size}

Refused before anything is read, each in one line the card shows: a vocabulary size out of bounds
(`train.check_vocab`), no file and no text, more than lab.settings TOKENIZER.max_bytes of text (the File's sizes
are read, not its bytes); then each file as the Ask-your-files card reads it (lab.instruments.retrieval `read_text`):
empty, only white space, binary (NUL bytes, mostly control characters) or not UTF-8 (the offset of the first bad
byte) is refused by name, never repaired, so that the bytes measured are the file's; so is one the browser can no
longer read (written again since it was picked). A UTF-8 byte-order mark is dropped (the CLI keeps it).

Stop: the page's "stop", which web/worker.js records only while Python gives the JS event loop a turn; training is
plain Python, so the merges run in slices of about SLICE_S and `await asyncio.sleep(0)` between two (the JS event loop
runs the page's messages there), and Stop is polled before each slice. A stopped run keeps the merges it made
(train()'s first k: `BPETrainer`), skips the bytes-per-token counts (each a whole pass over the text) and says so.
The word counts are made whole before Stop is heard (k merges on part of the counts would be no run's first k), and
each bytes-per-token pass runs to its end: about 2 s each at the cap.

What it keeps: nothing. The text, its word counts and the trained vocabulary live in this call's locals and are
posted to the page, which holds its copy until Forget, New chat or another model drops it (web/tokenizer.js); the
character tables the pre-tokenizer fills and the loaded tokenizer's chunk cache, which the counts and the
measurements filled with pieces of the text, are emptied before the call returns, whatever it ends with. So Forget
and New chat find nothing of it here (tests/unit/test_tokenizer_card.py checks that nothing outlives the call).

What it does not know: the page (it posts dicts), how the merges are learned (train.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from lab.instruments.retrieval import read_text
from lab.settings import TOKENIZER
from lab.text.tokenizer import pretokenize, train
from lab.worker.state import Worker

MERGES_SHOWN = 20      # the first merges the card lists, in order, with their counts
SAMPLE_CHARS = 160     # the sample shown as tokens both ways: the text's opening, cut back to a white space
SLICE_S = 0.05         # seconds of merges between two turns of the JS event loop: Stop answered within about this
FIRST_SLICE = 16       # merges in the first slice, before one is timed


def refusal(vocab, files: list, text: str | None) -> str | None:
    """Why a request is refused before any text is read (None: it goes on): the vocabulary, no text, too much text."""
    try:
        train.check_vocab(vocab, len(train.DEFAULT_SPECIALS))
    except ValueError as exc:
        return str(exc)
    if not files and not (text or "").strip():
        return "no text: choose one or more text files, or train on the conversation once it has messages"
    size = sum(int(f.size) for f in files) if files else len((text or "").encode("utf-8"))
    if size > TOKENIZER.max_bytes:
        return (f"{size:,} bytes of text: the page trains on at most {TOKENIZER.max_bytes:,} (a run that size takes "
                f"several seconds of this tab's Python, and its counting passes cannot be stopped half-way): pick "
                f"less; `lab tokenizer-train` on the command line takes any size")
    return None


def sample_of(text: str) -> str:
    """The text's opening, at most SAMPLE_CHARS characters, cut back to its last white space when it has one."""
    if len(text) <= SAMPLE_CHARS:
        return text
    cut = text[:SAMPLE_CHARS]
    at = max(cut.rfind(" "), cut.rfind("\n"))
    return cut[:at] if at > SAMPLE_CHARS // 2 else cut


def summary(trained: train.TrainedBPE, trainer: train.BPETrainer, texts: list[str], n_bytes: int, *, names: list[str],
            train_s: float, model=None, measured: tuple[float, float | None] | None = None) -> dict:
    """What the card shows of a run: the vocabulary's size, the merges made of the target, the time, bytes per token
    on the text (`measured`: the trained tokenizer's and the loaded model's, `measure`; None: a stopped run, not
    measured), the first merges with their counts, and the text's opening as tokens both ways."""
    tok = trained.tokenizer()
    index = {t: i for i, t in enumerate(trained.tokens)}
    first = [{"rank": r, "left": tok.piece(index[a]), "right": tok.piece(index[b]), "count": c}
             for r, ((a, b), c) in enumerate(zip(trained.merges[:MERGES_SHOWN], trained.counts))]
    sample = sample_of(texts[0]) if texts else ""
    return {
        "names": names, "bytes": n_bytes, "chars": sum(len(t) for t in texts), "pre": trained.pre,
        "specials": trained.specials, "vocab": len(trained.tokens), "merges": len(trained.merges),
        "target": trainer.target, "vocab_asked": trainer.vocab_size, "stopped": measured is None,
        "exhausted": trainer.done and len(trained.tokens) < trainer.vocab_size,   # no pair left before the target
        "words": len(trainer.pairs.words), "train_s": round(train_s, 3), "tie_rule": train.TIE_RULE,
        "bytes_per_token": None if measured is None else measured[0],
        "model": None if model is None else {
            "vocab": model.vocab_size, "bytes_per_token": None if measured is None else measured[1]},
        "first_merges": first,
        "sample": {"text": sample, "trained": [tok.piece(i) for i in tok.encode(sample)],
                   "model": None if model is None else [model.piece(i) for i in model.encode(sample)]},
    }


async def measure(trained: train.TrainedBPE, model, texts: list[str], n_bytes: int, progress) -> tuple:
    """Bytes per token on the texts (train.bytes_per_token, the CLI's measure): (the trained tokenizer's, the loaded
    model's or None), the JS event loop given a turn between the two passes."""
    total = 1 if model is None else 2
    progress("measure", 0, total)
    await asyncio.sleep(0)
    own = train.bytes_per_token(trained.tokenizer(), texts, n_bytes)
    if model is None:
        return own, None
    progress("measure", 1, total)
    await asyncio.sleep(0)
    return own, train.bytes_per_token(model, texts, n_bytes)


async def _texts(msg: dict) -> tuple[list[str], list[str], int]:
    """(names, texts, UTF-8 bytes of the texts) of the request: its files read and checked, or the chat's text."""
    files = msg.get("files") or []
    if not files:
        text = str(msg.get("text") or "")
        return ["the conversation"], [text], len(text.encode("utf-8"))
    names, texts = [], []
    for f in files:
        name = str(f.name)
        try:
            raw = (await f.arrayBuffer()).to_bytes()
        except Exception as exc:  # the browser's NotReadableError: the file changed, moved or went since it was picked
            raise ValueError(f"{name} could not be read ({exc}): it changed or moved since it was picked; pick it "
                             f"again") from None
        texts.append(read_text(name, raw))
        names.append(name)
    return names, texts, sum(len(t.encode("utf-8")) for t in texts)


async def _merges(trainer: train.BPETrainer, progress, stop_heard) -> bool:
    """The merges in slices of about SLICE_S, Stop polled before each (`stop_heard` gives the JS event loop its
    turn); progress after each. True when Stop ended them before the target or the text's last pair."""
    n = FIRST_SLICE
    while True:
        progress("merge", len(trainer.merges), trainer.target)
        if await stop_heard():
            return True
        ts = time.perf_counter()
        if trainer.run(n):
            progress("merge", len(trainer.merges), trainer.target)
            return False
        # the next slice sized to take about SLICE_S at this one's pace (at most four times as many merges)
        n = max(1, min(4 * n, int(n * SLICE_S / max(time.perf_counter() - ts, 1e-4))))


async def run(msg: dict, w: Worker) -> None:
    """tokenizer-train (the module docstring): refused in one line, or trained, measured and posted whole."""
    seq = msg.get("seq")
    files = list(msg.get("files") or [])
    why = refusal(msg.get("vocab"), files, msg.get("text"))
    if why:
        raise ValueError(why)
    vocab = train.check_vocab(msg.get("vocab"), len(train.DEFAULT_SPECIALS))
    lo = w.state.loaded
    model = lo.tokenizer if lo is not None else None
    w.stop_clear()
    t0 = time.perf_counter()

    def progress(phase: str, done: int, total: int) -> None:
        w.post({"type": "tokenizer-progress", "seq": seq, "phase": phase, "done": done, "total": total,
                "seconds": round(time.perf_counter() - t0, 3)})

    async def stop_heard() -> bool:
        await asyncio.sleep(0)                     # the JS event loop's turn: a "stop" posted by now is recorded
        return bool(w.stop_requested())

    names, texts, words = [], [], Counter()
    try:
        names, texts, n_bytes = await _texts(msg)
        t_train = time.perf_counter()              # the CLI's train_s: the word counting and the merges
        for i, text in enumerate(texts):           # word counts text by text: the sum is the CLI's over all of them
            progress("count", i, len(texts))
            await asyncio.sleep(0)                 # the progress drawn; a Stop now is heard before the first merge
            words.update(train.word_counts([text]))
        trainer = train.BPETrainer(words, vocab)
        words.clear()
        stopped = await _merges(trainer, progress, stop_heard)
        train_s = time.perf_counter() - t_train
        trained = trainer.result()
        measured = None if stopped else await measure(trained, model, texts, n_bytes, progress)
        result = summary(trained, trainer, texts, n_bytes, names=names, train_s=train_s, model=model,
                         measured=measured)
        raw = trained.gguf()
        w.post({"type": "tokenizer-done", "seq": seq, "result": result, "json": trained.dumps(), "gguf_size": len(raw),
                "gguf": w.f32(raw + bytes(-len(raw) % 4))})
    finally:
        texts.clear()
        words.clear()
        pretokenize.drop_caches()                  # the character tables: characters of the user's text
        if model is not None:
            model.drop_caches()                    # its chunk -> ids cache: chunks of the user's text
