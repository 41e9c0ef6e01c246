"""llama.cpp's token ids for vocabularies the lab's trainer makes (tests/fixtures/trained_tokenizer.json). NOT part
of CI: it needs llama-cpp-python (here /work/llamavenv, 0.3.36):

    /work/llamavenv/bin/python scripts/make_trained_tokenizer_fixture.py

For each of CONFIGS it trains on the start of tests/fixtures/constitution.txt and MULTISCRIPT
(lab/text/tokenizer/train.py), writes the vocabulary as a GGUF without weights (`TrainedBPE.gguf()`), opens
it in llama.cpp with vocab_only and records llama.cpp's ids for each of TEXTS (add_bos=False, special=False), with
the sha256 of the merges so the test knows it retrained the same vocabulary. tests/unit/test_trained_tokenizer_gguf.py
holds the lab's tokenizer, read back from the same GGUF, to those ids.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lab.text.tokenizer.train import train  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "trained_tokenizer.json"
CORPUS_CHARS = 12000
MULTISCRIPT = ("Grüße aus Köln! 日本語のテキスト。 Ελληνικά κείμενα, русский текст; العربية והעברית. "
               "हिन्दी भाषा 😀👍🏽 e\u0301 \t\r\n  1234567 it's they'll WE'RE")
CONFIGS = [("gpt-2", 1024), ("smollm", 600)]
TEXTS = [
    "We the People of the United States, in Order to form a more perfect Union,",
    MULTISCRIPT,
    "  leading spaces,\n\n\nnewlines\r\n and\ttabs   \n",
    "numbers 3.14159 and 2026-12-07, 1000000 $5",
    "it's, IT'S, we've, you'd, they'll, I'm",
    "<|endoftext|> is text here, as is <s>",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces, \x00 NUL, \ufeff BOM",
    "code: def f(x):\n    return x ** 2  # comment\n",
]


def corpus() -> list[str]:
    return [(ROOT / "tests" / "fixtures" / "constitution.txt").read_text(encoding="utf-8")[:CORPUS_CHARS],
            MULTISCRIPT]


def merges_sha256(trained) -> str:
    return hashlib.sha256("\n".join(f"{a} {b}" for a, b in trained.merges).encode()).hexdigest()


def main() -> None:
    out = {"llama_cpp_python": llama_cpp.__version__, "corpus_chars": CORPUS_CHARS, "corpus_extra": MULTISCRIPT,
           "vocabularies": []}
    with tempfile.TemporaryDirectory() as tmp:
        for pre, vocab in CONFIGS:
            trained = train(corpus(), vocab, pre=pre)
            path = Path(tmp) / f"{pre}-{vocab}.gguf"
            path.write_bytes(trained.gguf())
            llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
            cases = [{"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=False, special=False)} for t in TEXTS]
            out["vocabularies"].append({"pre": pre, "vocab": vocab, "merges_sha256": merges_sha256(trained),
                                        "cases": cases})
            del llm
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
