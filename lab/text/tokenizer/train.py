"""Training a byte-level BPE vocabulary on the user's text (issue #44), standard library only (it runs in the worker
too).

    trained = train([text], vocab_size=1024)          # pre-tokenizer "gpt-2", one special token <|endoftext|>
    tok = trained.tokenizer()                         # a lab.text.tokenizer.bpe.BPETokenizer, as from a GGUF
    trained.save("tok.json"); load("tok.json")        # the JSON file (`dumps()`: its text)
    trained.gguf()                                    # the vocabulary as a GGUF without weights, for llama.cpp
    bytes_per_token(tok, [text], n_bytes)             # what the CLI and the page report

    t = BPETrainer(word_counts([text]), 1024)         # the same training in slices: the page's worker runs a few
    while not t.run(64): ...                          # merges at a time and gives the JS event loop a turn between
    trained = t.result()                              # (to hear Stop); stopped after k merges: train()'s first k

The steps, as GPT-2's trainer and the `tokenizers` package's BpeTrainer:

1. The text is cut into chunks by a pre-tokenizer of `pretokenize` (default "gpt-2": the GPT-2 expression, which
   the `tokenizers` package's ByteLevel pre-tokenizer runs too), each chunk's UTF-8 bytes spelled in GPT-2's byte
   alphabet (`bpe.BYTE_TO_CHAR`), and the distinct chunks counted: a chunk is a word, with its count.
2. Every adjacent pair of symbols inside a word is counted, weighted by the word's count. Pairs never cross
   chunks, so a merge only rewrites the words that hold its pair, and the counts are updated for those words
   alone (`PairCounts.merge`): training costs about the text's length plus the words each merge touches, never
   text x merges (the quadratic trap: a trainer or encoder over the whole file at once hung on a 4.8 MB corpus).
3. The most frequent pair is merged into a new token, until the vocabulary holds `vocab_size` tokens or no pair
   is left. The merge order is the encoder's priority (`tokenizer.ggml.merges`).

Tie rule (TIE_RULE): among pairs of equal count, the pair (left id, right id) that is smallest wins, ids numbered
as the vocabulary: the special tokens first, then the 256 byte characters in code-point order of their alphabet
character, then each merged token in the order it was made. This is the `tokenizers` package's rule (its
trainer's heap orders equal counts by the pair of ids, ascending, over the same numbering), so the two give the
same merges and the same ids (tests/unit/test_tokenizer_reference.py).

Encoding and decoding are not here: the trained vocabulary is GGUF tokenizer metadata (`metadata()`), and
`bpe.BPETokenizer` applies the merges by rank inside each pre-tokenized chunk, as llama.cpp does.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter

from lab.format import gguf as fmt
from lab.format.writer import write_gguf
from lab.settings import TOKENIZER
from lab.text.tokenizer.base import TYPE_CONTROL, TYPE_NORMAL, clean_text
from lab.text.tokenizer.bpe import _LATIN1_TO_ALPHABET, BYTE_TO_CHAR, BPETokenizer
from lab.text.tokenizer.pretokenize import PRE_NAMES, PreTokenizer

FORMAT = "llm-lab-bpe"
VERSION = 1
DEFAULT_PRE = "gpt-2"
DEFAULT_SPECIALS = ("<|endoftext|>",)
TIE_RULE = ("equal counts: the smallest (left id, right id); ids: special tokens, then the 256 byte characters in "
            "code-point order, then merged tokens in the order made")
# The byte alphabet in code-point order: the byte tokens' order in a trained vocabulary, after the special tokens.
BYTE_TOKENS = tuple(sorted(BYTE_TO_CHAR))
# The GGUF holding only the vocabulary: the least a llama's hyperparameters must say for llama.cpp to read on to the
# vocabulary (it reads them before the vocabulary even with vocab_only), so the file is no model. In gguf.GGUFWriter's
# order for its add_* calls (tests/unit/test_trained_tokenizer_gguf.py holds the bytes to its).
GGUF_NAME = "llm-lab trained tokenizer (vocabulary only)"
_PLACEHOLDER = (("llama.context_length", fmt.UINT32, 128), ("llama.embedding_length", fmt.UINT32, 64),
                ("llama.block_count", fmt.UINT32, 1), ("llama.feed_forward_length", fmt.UINT32, 128),
                ("llama.attention.head_count", fmt.UINT32, 4),
                ("llama.attention.layer_norm_rms_epsilon", fmt.FLOAT32, 1e-5))


def check_vocab(vocab_size, n_specials: int) -> int:
    """The vocabulary size asked for, as an int, or a ValueError a user reads: a whole number from the specials and
    the 256 bytes (below that nothing is left to merge into) to lab.settings TOKENIZER.max_vocab."""
    base = n_specials + len(BYTE_TOKENS)
    if vocab_size is None:
        raise ValueError(f"no vocabulary size: choose {base} .. {TOKENIZER.max_vocab:,}")
    if (isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, float)) or not math.isfinite(vocab_size)
            or vocab_size != int(vocab_size)):
        raise ValueError(f"the vocabulary's size must be a whole number, not {vocab_size!r}: choose {base} .. "
                         f"{TOKENIZER.max_vocab:,}")
    vocab_size = int(vocab_size)
    if vocab_size < base:
        raise ValueError(f"a vocabulary of {vocab_size} tokens is below the {base} special and byte tokens: choose "
                         f"{base} .. {TOKENIZER.max_vocab:,}")
    if vocab_size > TOKENIZER.max_vocab:
        raise ValueError(f"a vocabulary of {vocab_size:,} tokens is above {TOKENIZER.max_vocab:,}: choose {base} .. "
                         f"{TOKENIZER.max_vocab:,} (training stops anyway when no pair is left to merge)")
    return vocab_size


def bytes_per_token(tok, texts: list[str], n_bytes: int) -> float:
    """The texts' bytes over the tokens `tok` makes of them (no BOS, no special-token parsing): `lab
    tokenizer-train`'s and the Tokenizer card's measure. More bytes a token: fewer tokens for the same text."""
    n_tokens = sum(len(tok.encode(t)) for t in texts)
    return round(n_bytes / max(n_tokens, 1), 4)


def alphabet_word(chunk: str) -> str:
    """A chunk's UTF-8 bytes spelled in GPT-2's byte alphabet, one character a byte."""
    return chunk.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ALPHABET)


def word_counts(texts, pre: str = DEFAULT_PRE) -> Counter:
    """Each distinct chunk of `texts` (byte-alphabet spelled) -> how often the pre-tokenizer cut it. Lone
    surrogates become U+FFFD first, as the encoder makes them."""
    split = PreTokenizer(pre).split
    chunks: Counter = Counter()
    for text in texts:
        chunks.update(split(clean_text(text)))
    words: Counter = Counter()
    for chunk, n in chunks.items():
        words[alphabet_word(chunk)] += n
    return words


def merged(word: tuple, a: int, b: int, new: int) -> tuple:
    """`word` with every (a, b) replaced by `new`, left to right, not overlapping: (a a a) with (a, a) is (aa a)."""
    out = []
    i, n = 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def pair_counts(words, freqs) -> dict:
    """Every adjacent pair's count over `words` (tuples of ids), each word weighted by its count: from scratch."""
    counts: dict = {}
    for w, f in zip(words, freqs):
        for p in zip(w, w[1:]):
            counts[p] = counts.get(p, 0) + f
    return counts


class PairCounts:
    """The words (tuples of token ids) with their counts, every adjacent pair's count, where each pair occurs,
    and a heap to find the best pair. A merge touches only the words holding its pair."""

    def __init__(self, words: list, freqs: list):
        self.words = list(words)
        self.freqs = list(freqs)
        self.counts = pair_counts(self.words, self.freqs)
        self.where: dict = {}          # pair -> indices of words that hold it (or did: checked when used)
        for wi, w in enumerate(self.words):
            for p in zip(w, w[1:]):
                self.where.setdefault(p, set()).add(wi)
        # (-count, left, right): the heap's smallest is the best pair under the tie rule. Entries go stale when a
        # count falls; `best` re-files those, and `merge` files a pair again whenever its count rises.
        self.heap = [(-c, a, b) for (a, b), c in self.counts.items()]
        heapq.heapify(self.heap)

    def best(self):
        """((left, right), count) of the most frequent pair (ties by TIE_RULE), or None when no pair is left."""
        heap, counts = self.heap, self.counts
        while heap:
            neg, a, b = heap[0]
            c = counts.get((a, b), 0)
            if c == -neg:
                return (a, b), c
            if c:
                heapq.heapreplace(heap, (-c, a, b))
            else:
                heapq.heappop(heap)
        return None

    def merge(self, pair: tuple, new: int) -> None:
        """Replace `pair` by token `new` in every word that holds it, and update the pair counts of those words
        only: their old pairs out, their new pairs in."""
        a, b = pair
        delta: dict = {}
        where, words, freqs = self.where, self.words, self.freqs
        for wi in where.pop(pair, ()):
            old = words[wi]
            new_word = merged(old, a, b, new)
            if len(new_word) == len(old):
                continue                       # a word that no longer holds the pair
            f = freqs[wi]
            for p in zip(old, old[1:]):
                delta[p] = delta.get(p, 0) - f
            for p in zip(new_word, new_word[1:]):
                delta[p] = delta.get(p, 0) + f
                where.setdefault(p, set()).add(wi)
            words[wi] = new_word
        self._apply(delta)
        # zero by now when the counts are right; dropped all the same, so that a wrong count can never pick the
        # same pair forever (training always ends)
        self.counts.pop(pair, None)

    def _apply(self, delta: dict) -> None:
        counts, heap = self.counts, self.heap
        for p, d in delta.items():
            if not d:
                continue
            c = counts.get(p, 0) + d
            if c:
                counts[p] = c
            else:
                del counts[p]
            if d > 0:
                heapq.heappush(heap, (-c, p[0], p[1]))


class TrainedBPE:
    """A trained vocabulary: tokens (specials, the byte alphabet, then each merge's new token), merges as (left, right)
    strings in rank order, each merge's pair count when it was made, the pre-tokenizer's name."""

    def __init__(self, merges: list, *, specials=DEFAULT_SPECIALS, pre: str = DEFAULT_PRE, counts=None):
        if pre not in PRE_NAMES:
            raise ValueError(f"unknown pre-tokenizer {pre!r}; known: {', '.join(sorted(PRE_NAMES))}")
        self.specials = list(specials)
        self.merges = [tuple(m) for m in merges]
        self.pre = pre
        self.counts = list(counts) if counts is not None else None
        self.tokens = [*self.specials, *BYTE_TOKENS]
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("a special token is spelled twice, or as a byte character")
        seen = set(self.tokens)
        for a, b in self.merges:       # two merges may make one token ("a bc", later "ab c"): it keeps one id
            if a not in seen or b not in seen:
                raise ValueError(f"merge {a!r} {b!r} joins a token not made before it")
            if a + b not in seen:
                seen.add(a + b)
                self.tokens.append(a + b)

    def metadata(self) -> dict:
        """The vocabulary as GGUF tokenizer metadata (`tokenizer.ggml.*`), what `from_metadata` and llama.cpp read.
        The first special token, if any, is BOS and EOS (llama.cpp would default both to id 11 otherwise)."""
        n = len(self.specials)
        md = {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": list(self.tokens),
            "tokenizer.ggml.token_type": [TYPE_CONTROL] * n + [TYPE_NORMAL] * (len(self.tokens) - n),
            "tokenizer.ggml.merges": [f"{a} {b}" for a, b in self.merges],
            "tokenizer.ggml.add_bos_token": False,
        }
        if n:
            md["tokenizer.ggml.bos_token_id"] = md["tokenizer.ggml.eos_token_id"] = 0
        return md

    def tokenizer(self) -> BPETokenizer:
        return BPETokenizer(self.metadata())

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "pre": self.pre, "tie_rule": TIE_RULE,
                "specials": self.specials, "merges": [f"{a} {b}" for a, b in self.merges],
                "merge_counts": self.counts, "tokens": self.tokens}

    def dumps(self) -> str:
        """The JSON file's text: what `save` writes (as UTF-8) and the Tokenizer card downloads."""
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=0) + "\n"

    def save(self, path) -> None:
        # bytes, not text mode: the same file on every system (no CRLF on Windows), byte for byte the card's download
        with open(path, "wb") as f:
            f.write(self.dumps().encode("utf-8"))

    def kvs(self) -> list[tuple[str, int, object]]:
        """`metadata()` as typed GGUF key-values (key, value type, value), in gguf.GGUFWriter's order for its add_*
        calls: what a vocabulary's file and an untrained model's (lab.format.untrained) hold."""
        md = self.metadata()
        kvs = [("tokenizer.ggml.model", fmt.STRING, md["tokenizer.ggml.model"]),
               ("tokenizer.ggml.pre", fmt.STRING, md["tokenizer.ggml.pre"]),
               ("tokenizer.ggml.tokens", fmt.ARRAY, (fmt.STRING, md["tokenizer.ggml.tokens"])),
               ("tokenizer.ggml.token_type", fmt.ARRAY, (fmt.INT32, md["tokenizer.ggml.token_type"])),
               ("tokenizer.ggml.merges", fmt.ARRAY, (fmt.STRING, md["tokenizer.ggml.merges"])),
               ("tokenizer.ggml.add_bos_token", fmt.BOOL, md["tokenizer.ggml.add_bos_token"])]
        if "tokenizer.ggml.eos_token_id" in md:
            kvs += [("tokenizer.ggml.bos_token_id", fmt.UINT32, md["tokenizer.ggml.bos_token_id"]),
                    ("tokenizer.ggml.eos_token_id", fmt.UINT32, md["tokenizer.ggml.eos_token_id"])]
        return kvs

    def gguf(self) -> bytes:
        """The vocabulary as a GGUF without weights (`kvs()` after a placeholder llama's hyperparameters), which
        llama.cpp opens with vocab_only and lab.format.gguf reads back."""
        return write_gguf([("general.architecture", fmt.STRING, "llama"), ("general.name", fmt.STRING, GGUF_NAME),
                           *_PLACEHOLDER, *self.kvs()])


def from_dict(d: dict) -> TrainedBPE:
    """A TrainedBPE from `to_dict`'s form, every field checked; a ValueError names what is wrong."""
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
        raise ValueError(f"not a tokenizer file of this lab (format {FORMAT!r}, version {VERSION})")
    merges = []
    for m in d.get("merges", ()):
        left, sep, right = m.partition(" ") if isinstance(m, str) else ("", "", "")
        if not (left and sep and right) or " " in right:
            raise ValueError(f"merge {m!r} is not two tokens joined by one space")
        merges.append((left, right))
    trained = TrainedBPE(merges, specials=d.get("specials", ()), pre=d.get("pre"), counts=d.get("merge_counts"))
    if "tokens" in d and d["tokens"] != trained.tokens:
        raise ValueError("the file's tokens are not its special tokens, the byte alphabet and its merges in order")
    return trained


def load(path) -> TrainedBPE:
    with open(path, encoding="utf-8") as f:
        return from_dict(json.load(f))


class BPETrainer:
    """One training, run a slice of merges at a time (`run(n)`): the CLI runs it whole (`train`), the page's worker
    (lab/worker/tokenizer.py) a few merges at a time, giving the JS event loop a turn between slices so that the page's
    Stop reaches it. Stopping after k merges leaves the first k merges of the whole run: the merges are the same
    whatever the slices."""

    def __init__(self, words: Counter, vocab_size: int, *, pre: str = DEFAULT_PRE, specials=DEFAULT_SPECIALS):
        self.specials, self.pre = list(specials), pre
        self.vocab_size = check_vocab(vocab_size, len(self.specials))
        self.tokens = [*self.specials, *BYTE_TOKENS]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        ids = self.ids
        self.pairs = PairCounts([tuple(ids[c] for c in w) for w in words], list(words.values()))
        self.merges: list = []
        self.counts: list = []
        self.done = False               # the vocabulary is full, or no pair is left

    @property
    def target(self) -> int:
        """Merges asked for: the vocabulary less the specials and the bytes (fewer are made when no pair is left)."""
        return self.vocab_size - len(self.specials) - len(BYTE_TOKENS)

    def run(self, n: int | None = None) -> bool:
        """Make up to `n` more merges (all that are left when None); True once training is over."""
        tokens, ids, pairs = self.tokens, self.ids, self.pairs
        made = 0
        while not self.done and (n is None or made < n):
            found = pairs.best() if len(tokens) < self.vocab_size else None
            if found is None:
                self.done = True
                break
            (a, b), c = found
            text = tokens[a] + tokens[b]
            new = ids.get(text)
            if new is None:               # else an earlier merge made this token already: it keeps its id
                new = ids[text] = len(tokens)
                tokens.append(text)
            pairs.merge((a, b), new)
            self.merges.append((tokens[a], tokens[b]))
            self.counts.append(c)
            made += 1
        return self.done

    def result(self) -> TrainedBPE:
        """The vocabulary so far: every merge made, in order."""
        return TrainedBPE(self.merges, specials=self.specials, pre=self.pre, counts=self.counts)


def train(texts, vocab_size: int, *, pre: str = DEFAULT_PRE, specials=DEFAULT_SPECIALS) -> TrainedBPE:
    """Learn merges on `texts` (strings) until the vocabulary has `vocab_size` tokens (specials + 256 bytes +
    merges) or no pair is left (see the module docstring; ties by TIE_RULE)."""
    specials = list(specials)
    check_vocab(vocab_size, len(specials))       # before the counting: a wrong size costs nothing
    trainer = BPETrainer(word_counts(texts, pre), vocab_size, pre=pre, specials=specials)
    trainer.run()
    return trainer.result()
