"""A LoRA that answers from the sources or declines (issue #44 part 4): the question / passages / answer set made
from the user's files by rule (never written by a model), and the measure of what a model answers.

    holds(text, answer)                 whether a text holds an answer word for word
    passages(name, text)                the file's passages: its paragraphs, long ones cut at sentences, short ones
                                        joined, WORDS_MIN .. WORDS_MAX words each
    questions(passage)                  (question, answer) pairs: a sentence of the passage whose subject comes before
                                        one of VERBS is asked about ("The index holds ..." -> "What does the index
                                        hold?"), the sentence itself, verbatim, the answer
    make_set(files, ...)                (training rows, held-out rows): each a conversation (lab.instruments.retrieval
                                        pack_messages's prompt: the system prompt, numbered passages, the question)
                                        with its answer quoted and its passage named, or, where the passages shown do
                                        not hold the answer, REFUSAL; the held-out rows' questions come from passages
                                        no training row asks about
    held_rows(text)                     a held-out .jsonl's rows, each checked (`lab grounded-eval`, the page)
    is_refusal(reply)                   whether a reply declines (REFUSAL, or a phrase of REFUSAL_PHRASES)
    grounding(reply, sources)           the share of the reply's five-word sequences found verbatim in the sources
    Score                               refuses when it should, refuses when it should not, grounding: a model's
                                        replies to held-out rows (`lab grounded-eval`)

The rule makes plain questions about what a sentence says of its subject; it asks nothing a sentence does not
answer word for word, so an answer's every five-word sequence is in its passage (`make_set` checks it). An
unanswerable row is one of the same questions shown with passages that neither hold its answer nor name its subject:
the model has to read the passages, not remember the question. Refusals are at most REFUSALS_MAX of a set (the
issue's "under 40%"), so declining is never the best guess. Pure Python: the worker can run it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from lab.instruments.chatdata import conversations
from lab.instruments.retrieval import pack_messages

REFUSAL = "The passages do not hold the answer."
# the phrases a reply that declines holds (a stock model declines in its own words); lower case, after
# normalisation (`_words`); REFUSAL's own words first
REFUSAL_PHRASES = ("passages do not hold the answer", "do not hold the answer", "does not hold the answer",
                   "do not say", "does not say", "don't say", "doesn't say", "do not mention", "does not mention",
                   "doesn't mention", "not mentioned", "no information", "do not contain", "does not contain",
                   "doesn't contain", "don't contain", "cannot answer", "can't answer", "unable to answer",
                   "not provided", "no mention", "there is no answer", "i don't know", "i do not know")
GRAM = 5                # words of a sequence grounding looks for
WORDS_MIN, WORDS_MAX = 25, 70       # a passage's words: about a retrieval window's 64 tokens
SENTENCE_WORDS = (6, 40)            # words of a sentence a question is made of
SUBJECT_WORDS = 6                   # most words before the verb
REFUSALS_MAX = 0.4                  # share of a set's rows that decline, at most (exclusive)
SHOWN = 2                           # passages a row shows: its own (or none) and distractors
# verb -> (auxiliary, base form): "X holds Y" -> "What does X hold?"; the copulas ask "What is X?"
VERBS = {"is": ("is", ""), "are": ("are", ""), "holds": ("does", "hold"), "hold": ("do", "hold"),
         "runs": ("does", "run"), "reads": ("does", "read"), "writes": ("does", "write"), "takes": ("does", "take"),
         "gives": ("does", "give"), "makes": ("does", "make"), "uses": ("does", "use"), "keeps": ("does", "keep"),
         "shows": ("does", "show"), "says": ("does", "say"), "counts": ("does", "count"), "means": ("does", "mean"),
         "returns": ("does", "return"), "checks": ("does", "check"), "prints": ("does", "print"),
         "measures": ("does", "measure"), "trains": ("does", "train"), "needs": ("does", "need"),
         "builds": ("does", "build"), "loads": ("does", "load"), "starts": ("does", "start"),
         "wipes": ("does", "wipe"), "refuses": ("does", "refuse"), "lists": ("does", "list")}
# a subject that names nothing without the sentences around it
_PRONOUNS = {"it", "this", "that", "they", "these", "those", "there", "here", "we", "you", "i", "he", "she", "which",
             "what", "who", "its", "their", "our", "both", "all", "one", "each", "some", "none", "another", "then",
             "so", "but", "and", "or", "if", "when", "where", "while", "as", "also", "only", "every", "such"}
_NOT_FIRST = {"at", "in", "on", "for", "with", "from", "by", "to", "of", "after", "before", "during", "without",
              "under", "over", "most", "more", "less", "not", "no", "once", "even", "until", "since", "how", "why"}
_BEFORE_ARTICLE = {"of", "in", "on", "for", "to", "from", "by", "with", "at"}     # "the size of the cache" is one
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*_(\[\"'])")
_FENCED = re.compile(r"^\s*(```|~~~).*?^\s*\1[^\n]*$", re.S | re.M)
_LEAD = re.compile(r"^\*\*[^*]{1,60}[.:]\*\*\s+")     # a paragraph's bold lead-in
_ITEM = re.compile(r"\n\s*(?:[-*+]|\d+[.)])\s+")
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")
_CITATION = re.compile(r"(?:^|(?<=\s))\[\d+\](?=\W|$)")   # "[2]" alone, not "ids[0]"


class GroundedDataError(ValueError):
    """Files or settings that make no set; the message says what to change."""


@dataclass(frozen=True)
class Passage:
    file: str
    index: int          # its number in the file (1-based)
    text: str

    @property
    def where(self) -> str:
        return f"passage {self.index}"


def _words(text: str) -> list[str]:
    """Lower-case words: letters and digits, an apostrophe's suffix kept; everything else a separator."""
    return _WORD.findall(text.lower())


def _prose(par: str) -> bool:
    """A paragraph of sentences: not a heading, code (fenced, or indented four spaces or a tab: Markdown's other
    code block, README's command list), a table, a list of links or an image."""
    lines = par.lstrip("\n")
    first = lines.lstrip()
    return (bool(first) and not lines.startswith(("    ", "\t"))
            and not first.startswith(("#", "```", "|", "![", "<")) and "```" not in par)


def passages(name: str, text: str) -> list[Passage]:
    """The file's prose as passages of WORDS_MIN .. WORDS_MAX words: paragraphs (blank-line separated, lines
    joined), one too long cut at sentence ends, consecutive short ones joined; headings, code, tables dropped."""
    pieces: list[str] = []
    text = _FENCED.sub("\n\n", text.replace("\r\n", "\n"))      # code blocks, blank lines inside them too
    for par in re.split(r"\n\s*\n", text):
        if not _prose(par):
            continue
        # a list's items are pieces of their own: an item's sentence never runs into the next item
        sents = [s for item in _ITEM.split(par) for s in _SENTENCE_END.split(" ".join(item.split()))]
        cur: list[str] = []
        for sent in sents:
            if cur and len(" ".join(cur + [sent]).split()) > WORDS_MAX:
                pieces.append(" ".join(cur))
                cur = []
            cur.append(sent)
        if cur:
            pieces.append(" ".join(cur))
    # a "sentence" longer than a passage is no prose (a command list, a run-on table): left out, never a passage
    # that passes WORDS_MAX
    pieces = [p for p in pieces if len(p.split()) <= WORDS_MAX]
    out, cur = [], ""
    for p in pieces:
        joined = f"{cur} {p}".strip()
        if len(joined.split()) <= WORDS_MAX:
            cur = joined
        else:
            out.append(cur)
            cur = p
        if len(cur.split()) >= WORDS_MIN:
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return [Passage(name, i + 1, t) for i, t in enumerate(t for t in out if len(t.split()) >= WORDS_MIN // 2)]


def _subject(words: list[str]) -> str:
    """The subject as the question says it: a capital of a plain first word lowered ("The index" -> "the index")."""
    words = [w.replace("**", "") for w in words]         # emphasis is not part of a name
    if words[0] in ("The", "A", "An"):
        words = [words[0].lower()] + words[1:]
    return " ".join(words)


def _plain_subject(words: list[str]) -> bool:
    """A subject a question can name alone: not a pronoun, an adverb or a preposition first, no punctuation
    between its words, no article inside it (a relative clause: "positions the chat's KV cache holds")."""
    first = words[0].lower().strip("*_`\"'(")
    if first in _PRONOUNS or first in _NOT_FIRST or any(w[-1] in ",;:.)" for w in words):
        return False
    if " ".join(words).count("**") % 2 or " ".join(words).count("`") % 2:    # bold or code running on past it
        return False
    return not any(w.lower() in ("the", "a", "an") and words[i].lower() not in _BEFORE_ARTICLE
                   for i, w in enumerate(words[1:]))


def questions(p: Passage) -> list[tuple[str, str]]:
    """(question, answer) of each of the passage's sentences the rule asks about (the module's docstring)."""
    out = []
    for sent in _SENTENCE_END.split(p.text):
        sent = _LEAD.sub("", sent)          # "**Files.** Each file is ..." asks about "each file"
        words = sent.split()
        if not SENTENCE_WORDS[0] <= len(words) <= SENTENCE_WORDS[1] or not sent.endswith("."):
            continue
        for i, w in enumerate(words[1:SUBJECT_WORDS + 1], 1):
            if w not in VERBS:
                continue
            subject = words[:i]
            if not _plain_subject(subject):
                break
            aux, base = VERBS[w]
            question = f"What {aux} {_subject(subject)}{' ' + base if base else ''}?"
            out.append((question, sent))
            break
    return out


def holds(text: str, answer: str) -> bool:
    """Whether a text holds the answer word for word (lower case, punctuation dropped)."""
    return f" {' '.join(_words(answer))} " in f" {' '.join(_words(text))} "


def _holds(p: Passage, answer: str, subject: str) -> bool:
    """Whether a passage holds the answer, or names the question's subject (then it may answer it another way)."""
    return holds(p.text, answer) or holds(p.text, subject)


def _row(question: str, shown: list[Passage], answer: str | None, source: Passage) -> dict:
    """A conversation: pack_messages's prompt over the shown passages, then the answer citing its passage's number,
    or REFUSAL."""
    msgs = pack_messages(question, shown)
    reply = REFUSAL if answer is None else f"{answer} [{shown.index(source) + 1}]"
    return {"messages": msgs + [{"role": "assistant", "content": reply}], "answerable": answer is not None,
            "question": question, "answer": answer, "passages": [p.text for p in shown],
            "source": f"{source.file} {source.where}"}


def make_set(files: list[tuple[str, str]], *, seed: int = 0, refusals: float = 0.3, held_out: float = 0.2,
             per_passage: int = 2) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) from (name, text) files: every passage's questions (at most per_passage), each
    an answerable row (its passage among SHOWN, the others distractors), and `refusals` of the rows unanswerable (a
    question shown with passages that do not hold it); the passages of the last `held_out` share (seeded order) make
    the held-out rows' questions, never a training row's."""
    if not 0 <= refusals < REFUSALS_MAX:
        raise GroundedDataError(f"refusals {refusals}: from 0 to under {REFUSALS_MAX} of the set, so that declining is "
                                f"never the likeliest answer")
    if not 0 < held_out < 1:
        raise GroundedDataError(f"held out {held_out}: a share between 0 and 1")
    rng = random.Random(seed)
    every = [p for name, text in files for p in passages(name, text)]
    asked = [(p, qa) for p in every for qa in questions(p)[:per_passage]]
    if len(every) < SHOWN + 1 or len({id(p) for p, _ in asked}) < 2:
        raise GroundedDataError(f"{len(every)} passage(s) and {len(asked)} question(s) in the files: too little prose "
                                f"for a set (at least {SHOWN + 1} passages, two of them with a question)")
    order = sorted({id(p): p for p, _ in asked}.values(), key=lambda p: (p.file, p.index))
    rng.shuffle(order)
    n_held = max(1, round(len(order) * held_out))
    held_ids = {id(p) for p in order[len(order) - n_held:]}
    sets: tuple[list[dict], list[dict]] = ([], [])
    for held in (False, True):
        rows, candidates = sets[held], []
        for p, (question, answer) in asked:
            if (id(p) in held_ids) != held:
                continue
            subject = question.split(" ", 2)[2].rsplit(" ", 1)[0]
            others = [o for o in every if o is not p and not _holds(o, answer, subject)]
            if len(others) < SHOWN:
                continue
            shown = rng.sample(others, SHOWN - 1) + [p]
            rng.shuffle(shown)
            rows.append(_row(question, shown, answer, p))
            candidates.append((question, others, p))
        # unanswerable: some of the same questions, their passages not shown, `refusals` of the rows
        n = round(len(rows) * refusals / (1 - refusals))
        for question, others, p in rng.sample(candidates, min(n, len(candidates))):
            rows.append(_row(question, rng.sample(others, SHOWN), None, p))
        rng.shuffle(rows)
    if not sets[0] or not sets[1]:
        raise GroundedDataError("the files make no training or no held-out row: add prose, or change --held-out")
    return sets


def held_rows(text: str, source: str = "the set") -> list[dict]:
    """A held-out .jsonl's rows (lab.instruments.chatdata.conversations), each refused by its line unless `make_set`
    wrote it (answerable, question, answer, passages)."""
    rows = conversations(text, source)
    for r in rows:
        if (not isinstance(r.get("answerable"), bool) or not isinstance(r.get("question"), str)
                or not isinstance(r.get("passages"), list) or not all(isinstance(p, str) for p in r["passages"])
                or r["messages"][-1]["role"] != "assistant"):
            raise GroundedDataError(f"{source} line {r['line']}: not a `lab grounded-data` row (answerable, question, "
                                    f"answer, passages, its reply last)")
    return rows


def is_refusal(reply: str) -> bool:
    text = " ".join(_words(reply))
    return any(phrase in text for phrase in REFUSAL_PHRASES)


def grounding(reply: str, sources: list[str]) -> float | None:
    """The share of the reply's GRAM-word sequences (its citations "[n]" left out) found verbatim, word for word
    after lower-casing and dropping punctuation, in one of the sources; a reply of fewer words is one sequence.
    None for a reply without words."""
    words = _words(_CITATION.sub(" ", reply))
    if not words:
        return None
    n = min(GRAM, len(words))
    grams = [" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
    texts = [" " + " ".join(_words(s)) + " " for s in sources]
    return sum(any(f" {g} " in t for t in texts) for g in grams) / len(grams)


@dataclass
class Score:
    """A model's replies to held-out rows: refuses when it should (of the rows whose passages do not hold the
    answer), refuses when it should not (of those that do), grounding (the mean over the replies that do not decline
    of `grounding` against the passages shown)."""
    should_refuse: int = 0
    refused_rightly: int = 0
    should_answer: int = 0
    refused_wrongly: int = 0
    grounded: float = 0.0
    answered: int = 0

    def add(self, answerable: bool, reply: str, sources: list[str]) -> dict:
        refused = is_refusal(reply)
        if answerable:
            self.should_answer += 1
            self.refused_wrongly += refused
        else:
            self.should_refuse += 1
            self.refused_rightly += refused
        g = None if refused else grounding(reply, sources)
        if g is not None:
            self.grounded += g
            self.answered += 1
        return {"refused": refused, "grounding": g}

    def to_dict(self) -> dict:
        share = lambda a, b: a / b if b else None       # noqa: E731
        return {"refuses_when_it_should": share(self.refused_rightly, self.should_refuse),
                "refuses_when_it_should_not": share(self.refused_wrongly, self.should_answer),
                "grounding": share(self.grounded, self.answered), "rows_should_refuse": self.should_refuse,
                "rows_should_answer": self.should_answer, "replies_grounded": self.answered}

