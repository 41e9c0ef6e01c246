"""The grounded set (lab.instruments.grounded): questions made by rule from the files, answers quoted verbatim from
the passage shown, rows that must decline shown passages without the answer, refusals under 40%, held-out questions
from passages no training row asks about; and the measures of a reply."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.instruments import grounded
from lab.instruments.grounded import REFUSAL, GroundedDataError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def docs():
    return [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
            for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]


@pytest.fixture(scope="module")
def sets(docs):
    return grounded.make_set(docs, seed=3)


def test_questions_by_rule():
    p = grounded.Passage("a.md", 1, "The index holds one row a window. It is saved by `lab index`. "
                                    "At most the last 256 positions are drawn. Each file is read once.")
    assert grounded.questions(p) == [("What does the index hold?", "The index holds one row a window.")]


def test_passages_leave_out_code_tables_and_headings():
    text = ("# Title\n\nThe cache holds the keys and the values of every layer for each position of the chat so far "
            "in the conversation.\n\n```\nThe code holds nothing.\n\nThe code is code.\n```\n\n| a | b |\n|---|---|\n"
            "| The table is | here |\n\n- The list holds items of its own.\n- The second item is another one.\n")
    ps = grounded.passages("f.md", text)
    joined = " ".join(p.text for p in ps)
    assert "code" not in joined and "table" not in joined and "Title" not in joined
    assert "The list holds items of its own." in joined


def test_passages_leave_out_indented_code_and_run_on_lines():
    """Markdown's indented code block (README's command list) and a "sentence" longer than a passage are no prose:
    neither reaches a passage, and no passage passes WORDS_MAX words."""
    long = " ".join(f"lab cmd{i} MODEL [--flag]" for i in range(40))
    text = ("The cache holds the keys and the values of every layer for each position of the chat so far in the "
            "conversation.\n\n    lab serve   # the page holds the model\n    lab ask MODEL FILES\n\n"
            f"\tThe tab holds code too.\n\n{long}\n")
    ps = grounded.passages("f.md", text)
    joined = " ".join(p.text for p in ps)
    assert "The cache holds" in joined and "lab serve" not in joined and "tab holds" not in joined
    assert "cmd1" not in joined and all(len(p.text.split()) <= grounded.WORDS_MAX for p in ps)


def test_no_passage_of_the_docs_passes_words_max(docs):
    for name, text in docs:
        assert all(len(p.text.split()) <= grounded.WORDS_MAX for p in grounded.passages(name, text)), name


def test_every_answer_is_quoted_from_a_passage_shown(sets):
    for rows in sets:
        for r in rows:
            reply = r["messages"][-1]["content"]
            if r["answerable"]:
                n = int(reply.rsplit("[", 1)[1].rstrip("]"))
                assert r["answer"] in r["passages"][n - 1] and reply.startswith(r["answer"])
                assert grounded.grounding(reply, r["passages"]) == 1.0
                assert f"[{n}] " in r["messages"][1]["content"]
            else:
                assert reply == REFUSAL
                assert not any(grounded.holds(p, r_answer) for p in r["passages"]
                               for r_answer in [_answer_of(sets, r["question"])] if r_answer)


def _answer_of(sets, question):
    return next((r["answer"] for rows in sets for r in rows if r["question"] == question and r["answer"]), None)


def test_refusals_under_40_percent_and_held_out_passages_apart(sets):
    train, held = sets
    for rows in sets:
        share = sum(not r["answerable"] for r in rows) / len(rows)
        assert 0.2 < share < grounded.REFUSALS_MAX, share
    assert len(train) > 3 * len(held) > 0
    assert not {r["source"] for r in train} & {r["source"] for r in held}


def test_seeded_and_refused_settings(docs, sets):
    assert grounded.make_set(docs, seed=3) == sets
    assert grounded.make_set(docs, seed=4) != sets
    with pytest.raises(GroundedDataError, match="under 0.4"):
        grounded.make_set(docs, refusals=0.4)
    with pytest.raises(GroundedDataError, match="too little prose"):
        grounded.make_set([("x.md", "# Only a heading\n\n```\ncode\n```\n")])


def test_refusal_and_grounding_measures():
    assert grounded.is_refusal(REFUSAL) and grounded.is_refusal("Sorry, the passages don't say.")
    assert not grounded.is_refusal("The index holds one row a window. [1]")
    src = ["The index holds one row a window, made by the model itself."]
    assert grounded.grounding("The index holds one row a window. [1]", src) == 1.0
    assert grounded.grounding("The index holds one row of the moon.", src) == pytest.approx(1 / 4)
    assert grounded.grounding("Index.", src) == 1.0 and grounded.grounding("[2]", src) is None
    s = grounded.Score()
    s.add(True, "The index holds one row a window. [1]", src)
    s.add(True, REFUSAL, src)
    s.add(False, REFUSAL, src)
    s.add(False, "The moon is made of cheese entirely, I think.", src)
    d = s.to_dict()
    assert (d["refuses_when_it_should"], d["refuses_when_it_should_not"]) == (0.5, 0.5)
    assert d["grounding"] == pytest.approx(0.5) and d["replies_grounded"] == 2
