"""The trainer against a float-free reference: the `tokenizers` package's BpeTrainer (PyPI, the test extra only;
skipped where it is missing) on the same text and settings: the ByteLevel pre-tokenizer without a prefix space (the
GPT-2 expression, as our "gpt-2"), all 256 byte characters as the initial alphabet, the same special token and
vocabulary size, no minimum frequency.

Its tie rule is ours (equal counts: the smallest pair of ids, the same numbering), so merges, vocabularies and the
ids of the encoded text are expected identical. Where merges differ, `explain` accepts the difference only at a tie:
at the first merge where the two disagree, both pairs must have the same count, the largest at that step (after a
tie is broken differently, what follows may differ too, so nothing after it is compared)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lab.text.tokenizer.train import merged, pair_counts, train, word_counts

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
CONSTITUTION = (ROOT / "tests" / "fixtures" / "constitution.txt").read_text(encoding="utf-8")


def random_text(seed: int, n: int = 6000) -> str:
    """Several scripts, digits, apostrophes, newlines: many ties between rare pairs."""
    rng = random.Random(seed)
    alphabet = "abcdeéü日本語ملاπσ 0123.,'\n"
    return "".join(rng.choice(alphabet) for _ in range(n))


def reference(texts: list[str], vocab: int, specials: list[str]):
    """(merges as (left, right), vocabulary in id order, the encoder) of the `tokenizers` package's trainer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=0, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    vocabulary = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    return merges, vocabulary, tok


def counts_after(texts: list[str], merges: list[tuple[str, str]]) -> dict:
    """Every pair's count (as token strings) once `merges` are applied, recounted from the text."""
    words = word_counts(texts)
    ws, freqs = [tuple(w) for w in words], list(words.values())
    for a, b in merges:
        ws = [merged(w, a, b, a + b) for w in ws]
    return pair_counts(ws, freqs)


def explain(texts: list[str], ours: list, theirs: list) -> str:
    """"identical", or "tie at merge K (count C)" where the first difference is two pairs of the same, largest
    count; an AssertionError where it is anything else."""
    k = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), None)
    if k is None:
        assert len(ours) == len(theirs), f"one stops early: {len(ours)} merges against {len(theirs)}"
        return "identical"
    counts = counts_after(texts, ours[:k])
    best = max(counts.values())
    c_ours, c_theirs = counts.get(ours[k], 0), counts.get(theirs[k], 0)
    assert c_ours == c_theirs == best, (f"merge {k}: ours {ours[k]} ({c_ours}), theirs {theirs[k]} ({c_theirs}), "
                                        f"the most frequent pair counts {best}: not a tie")
    return f"tie at merge {k} (count {best})"


@pytest.mark.parametrize("texts, vocab", [
    ([CONSTITUTION], 300), ([CONSTITUTION], 1024), ([CONSTITUTION], 4096),
    ([random_text(0)], 800), ([random_text(1), random_text(2)], 2000),
], ids=["constitution-300", "constitution-1024", "constitution-all", "scripts-800", "scripts-2000"])
def test_the_trainer_makes_the_reference_merges(texts, vocab):
    ours = train(texts, vocab)
    theirs, vocabulary, tok = reference(texts, vocab, ["<|endoftext|>"])
    assert explain(texts, ours.merges, theirs) == "identical"
    assert ours.tokens == vocabulary
    lab_tok = ours.tokenizer()
    for text in texts:
        assert lab_tok.encode(text) == tok.encode(text).ids


def test_a_difference_is_accepted_only_at_a_tie():
    # "cd ab": (a b), (c d) and (Ġ a) each count 1, so a trainer that took (c d) first broke the tie otherwise
    texts = ["cd ab"]
    ours = train(texts, 300, specials=()).merges
    assert explain(texts, ours, [("c", "d"), ("a", "b")]) == "tie at merge 0 (count 1)"
    # "ab ab ab abc": (a b) counts 4 and (Ġ a) 3: taking (Ġ a) first is a wrong count, not a tie
    texts = ["ab ab ab abc"]
    with pytest.raises(AssertionError, match="not a tie"):
        explain(texts, train(texts, 300, specials=()).merges, [("Ġ", "a")])
