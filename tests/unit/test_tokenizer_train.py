"""The byte-level BPE trainer (lab/text/tokenizer/train.py): merges worked out by hand (the tie rule among them), the
incremental pair counts against a recount from scratch after every merge, decode(encode(s)) == s for any text
(Hypothesis), the training time growing about linearly with the text, training in slices and stopped part-way (the
page's worker) against the whole run, the vocabulary's bounds, the JSON file, and a trained vocabulary working as the
lab's Tokenizer."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.settings import TOKENIZER
from lab.text.tokenizer import from_metadata
from lab.text.tokenizer.train import (
    BYTE_TOKENS, BPETrainer, PairCounts, TrainedBPE, bytes_per_token, check_vocab, from_dict, load, pair_counts, train,
    word_counts,
)
from tests.unit.fuzzkit import fuzz_settings

ROOT = Path(__file__).resolve().parents[2]
CONSTITUTION = (ROOT / "tests" / "fixtures" / "constitution.txt").read_text(encoding="utf-8")
MULTISCRIPT = ("Grüße aus Köln! 日本語のテキスト。 Ελληνικά κείμενα, русский текст; العربية והעברית. "
               "हिन्दी भाषा 😀👍🏽 e\u0301 \t\r\n  1234567 it's they'll WE'RE")
# Any text but lone surrogates (a str that is not UTF-8; the encoder's clean_text makes them U+FFFD): every
# category of every plane, control characters, unassigned code points and private use included.
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=80)


def merges_of(text: str, vocab: int = 400) -> list[str]:
    return [f"{a} {b}" for a, b in train([text], vocab, specials=()).merges]


# --- merges worked out by hand ------------------------------------------------------------------

def test_the_most_frequent_pair_is_merged_first():
    # "ab ab ab abc" -> chunks "ab", " ab" x2, " abc": (a b) 4, (Ġ a) 3, (b c) 1; then (Ġ ab) 3, (ab c) 1;
    # then (Ġab c) 1; then nothing is left to merge
    assert merges_of("ab ab ab abc") == ["a b", "Ġ ab", "Ġab c"]
    assert train(["ab ab ab abc"], 400, specials=()).counts == [4, 3, 1]


def test_ties_go_to_the_smallest_pair_of_ids():
    # "cd ab": (c d), (Ġ a), (a b) all once; ids in code-point order: a < c < Ġ (U+0120), so (a b) first, then
    # (c d) before (Ġ ab)
    assert merges_of("cd ab") == ["a b", "c d", "Ġ ab"]
    # the right id decides when the left ones are equal: (a b) before (a c)
    assert merges_of("ac ab")[:1] == ["a b"]


def test_overlapping_pairs_merge_left_to_right():
    # "aaaa": (a a) counts 3; merged left to right it is (aa aa), which counts 1
    assert merges_of("aaaa") == ["a a", "aa aa"]
    assert merges_of("aaa") == ["a a", "aa a"]


def test_pairs_never_cross_chunks():
    # "a.b": chunks "a", ".b"? no: GPT-2 cuts "a", "." and "b" (letters, then punctuation, then letters)
    assert merges_of("a.b") == []
    assert merges_of("x x") == ["Ġ x"]


def test_training_stops_at_the_vocabulary_size():
    trained = train([CONSTITUTION], 300)
    assert len(trained.tokens) == 300 == 1 + 256 + len(trained.merges)
    assert trained.tokens[0] == "<|endoftext|>" and trained.tokens[1:257] == list(BYTE_TOKENS)
    with pytest.raises(ValueError, match="below the 257"):
        train(["x"], 256)


@pytest.mark.parametrize("vocab, message", [
    (256, "a vocabulary of 256 tokens is below the 257 special and byte tokens: choose 257 .. 65,536"),
    (TOKENIZER.max_vocab + 1, "a vocabulary of 65,537 tokens is above 65,536"),
    (300.5, "must be a whole number, not 300.5: choose 257 .. 65,536"),
    ("300", "must be a whole number, not '300'"),
    (True, "must be a whole number, not True"),
    (float("nan"), "must be a whole number, not nan"),
    (float("inf"), "must be a whole number, not inf"),
])
def test_a_vocabulary_size_out_of_bounds_is_refused_with_the_bounds(vocab, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        check_vocab(vocab, 1)
    with pytest.raises(ValueError, match="is below the 256 special and byte tokens"):
        train(["x"], 255, specials=())
    assert check_vocab(257.0, 1) == 257 and check_vocab(TOKENIZER.max_vocab, 1) == TOKENIZER.max_vocab


def test_bytes_per_token_is_the_bytes_over_the_tokens():
    """The CLI's and the card's measure, worked out by hand: UTF-8 bytes (not characters) over all the texts' tokens,
    no BOS."""
    tok = TRAINED.tokenizer()
    texts = [CONSTITUTION[:3000], MULTISCRIPT]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    n_tokens = len(tok.encode(texts[0])) + len(tok.encode(texts[1]))
    assert bytes_per_token(tok, texts, n_bytes) == round(n_bytes / n_tokens, 4) != round(n_bytes / (n_tokens + 1), 4)


# --- in slices, and stopped part-way (the page's worker) ----------------------------------------------------

def test_slices_make_the_whole_run_s_merges():
    whole = train([CONSTITUTION], 1024)
    t = BPETrainer(word_counts([CONSTITUTION]), 1024)
    slices = 0
    while not t.run(37):
        slices += 1
    assert slices == (1024 - 257) // 37 and t.result().merges == whole.merges and t.result().counts == whole.counts
    assert t.result().to_dict() == whole.to_dict()


@pytest.mark.parametrize("k", [0, 1, 100, 500])
def test_stopped_after_k_merges_it_holds_the_whole_run_s_first_k(k):
    """What a Stop leaves: the first k merges of the run that was not stopped, each with its count, and a vocabulary
    that is the smaller one trained to 257 + k (so the JSON the card downloads is that file)."""
    whole = train([CONSTITUTION, MULTISCRIPT], 2048)
    t = BPETrainer(word_counts([CONSTITUTION, MULTISCRIPT]), 2048)
    assert not t.run(k) and len(t.merges) == k and t.target == 2048 - 257
    part = t.result()
    assert part.merges == whole.merges[:k] and part.counts == whole.counts[:k]
    assert part.dumps() == train([CONSTITUTION, MULTISCRIPT], 257 + k).dumps()


def test_a_run_ends_when_no_pair_is_left():
    t = BPETrainer(word_counts(["ab ab"]), 1000)
    assert t.run(100) and t.done and [f"{a} {b}" for a, b in t.result().merges] == ["a b", "Ġ ab"]
    assert t.run(100) and len(t.merges) == 2          # over: more slices make nothing


def test_a_token_made_twice_keeps_one_id():
    # two merges may spell one token ("a bc" and "ab c"; the `tokenizers` trainer reuses the id, and so does
    # `train`): the vocabulary keeps one id for it, and the encoder's ranks the first merge's
    trained = TrainedBPE([("b", "c"), ("a", "bc"), ("a", "b"), ("ab", "c")], specials=())
    assert trained.tokens[256:] == ["bc", "abc", "ab"]
    tok = trained.tokenizer()
    assert tok.encode("abc") == [257] and tok.decode(tok.encode("abcab")) == "abcab"


# --- the incremental counts ---------------------------------------------------------------------------

def random_corpus(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    letters = "aabbcdeé日 "
    return " ".join("".join(rng.choice(letters) for _ in range(rng.randint(1, 9))) for _ in range(n_words))


@pytest.mark.parametrize("seed", [0, 1])
def test_incremental_counts_equal_a_recount_after_every_merge(seed):
    words = word_counts([random_corpus(seed, 300)])
    ids = {c: i for i, c in enumerate(BYTE_TOKENS)}
    pairs = PairCounts([tuple(ids[c] for c in w) for w in words], list(words.values()))
    new = len(BYTE_TOKENS)
    while (found := pairs.best()) is not None:
        (a, b), c = found
        fresh = pair_counts(pairs.words, pairs.freqs)
        assert pairs.counts == fresh
        assert c == max(fresh.values()) and (a, b) == min(p for p, n in fresh.items() if n == c)
        pairs.merge((a, b), new)
        new += 1
    assert pairs.counts == {} and new > 300


# --- decoding what was encoded -----------------------------------------------------------------------

TRAINED = train([CONSTITUTION, MULTISCRIPT], 700)


@fuzz_settings(200)
@given(ANY_TEXT)
def test_decode_encode_is_the_text(s):
    tok = TRAINED.tokenizer()
    ids = tok.encode(s)
    assert all(0 < i < len(TRAINED.tokens) for i in ids)      # never the special token
    assert tok.decode(ids) == s


@fuzz_settings(60)
@given(st.lists(ANY_TEXT, min_size=1, max_size=4), st.integers(257, 400))
def test_a_vocabulary_trained_on_any_text_round_trips_it(texts, vocab):
    trained = train(texts, vocab)
    tok = trained.tokenizer()
    for s in texts:
        assert tok.decode(tok.encode(s)) == s


def test_the_trained_text_takes_fewer_tokens():
    tok = TRAINED.tokenizer()
    ids = tok.encode(CONSTITUTION)
    assert len(CONSTITUTION.encode()) / len(ids) > 3     # measured 3.03 (1.0 before any merge)


# --- time: linear in the text, not quadratic -------------------------------------------------------------

def best_time(text: str, vocab: int) -> float:
    """The least CPU time of three runs (CPU, not wall-clock: a busy machine, e.g. pytest -n, stretches the latter)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        train([text], vocab)
        best = min(best, time.process_time() - t0)
    return best


def test_four_times_the_text_takes_nowhere_near_sixteen_times_as_long():
    # distinct words grow with the text (a random corpus), so both the counting and the merges see more;
    # a trainer that rescans the text for every merge would take ~16x
    small, large = random_corpus(2, 1500), random_corpus(3, 6000)
    ratio = best_time(large, 600) / best_time(small, 600)
    assert ratio < 8, f"4x the text took {ratio:.1f}x the time"


# --- the file, and the lab's Tokenizer ------------------------------------------------------------------

def test_the_file_round_trips(tmp_path):
    path = tmp_path / "tok.json"
    TRAINED.save(path)
    assert path.read_bytes() == TRAINED.dumps().encode("utf-8")      # the card's download is this file, byte for byte
    back = load(path)
    assert (back.tokens, back.merges, back.specials, back.pre, back.counts) == (
        TRAINED.tokens, TRAINED.merges, TRAINED.specials, TRAINED.pre, TRAINED.counts)
    d = json.loads(path.read_text(encoding="utf-8"))
    assert d["pre"] == "gpt-2" and "smallest (left id, right id)" in d["tie_rule"]


@pytest.mark.parametrize("change, message", [
    ({"format": "x"}, "not a tokenizer file"),
    ({"merges": ["ab"]}, "not two tokens"),
    ({"merges": ["Ġ zz"]}, "not made before"),
    ({"tokens": ["a"]}, "the file's tokens"),
    ({"pre": "mine"}, "unknown pre-tokenizer"),
    ({"specials": ["a"]}, "spelled twice"),
])
def test_a_bad_file_is_refused_by_name(change, message):
    d = train(["hello hello"], 300).to_dict()
    d.update(change)
    with pytest.raises(ValueError, match=message):
        from_dict(d)


def test_the_vocabulary_is_gguf_tokenizer_metadata():
    tok = from_metadata(TRAINED.metadata())        # every key checked as a GGUF's are
    assert tok.model == "gpt2" and tok.vocab_size == 700 and tok.eos_id == 0 and not tok.add_bos
    assert tok.is_control(0) and tok.encode("<|endoftext|>") != [0]
    assert tok.encode(MULTISCRIPT) == TRAINED.tokenizer().encode(MULTISCRIPT)


def test_any_pre_tokenizer_the_encoder_knows_can_train():
    trained = train([MULTISCRIPT], 300, pre="smollm")
    assert trained.tokenizer().decode(trained.tokenizer().encode(MULTISCRIPT)) == MULTISCRIPT
    with pytest.raises(ValueError, match="unknown pre-tokenizer"):
        TrainedBPE([], pre="nope")
