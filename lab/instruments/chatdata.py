"""Chat turns as training data (issue #44 part 4): a `.jsonl` file, one conversation a line, trained on its
assistant's tokens alone.

    conversations(text, source)         [{"messages": [{role, content}, ...], ...}, ...] of a .jsonl file's lines
    example(tok, md, messages)          Example: the conversation's ids in the model's chat template and, a flag a
                                        token, whether it is an assistant's (trained) token
    examples(tok, md, convs, T)         every conversation's Example, each refused with its line when it does not fit T
    padded(ex, T, pad)                  (ids, mask) of T tokens: the example, then `pad` untrained
    windows(text, tok, md, T, share)    a file's windows and masks, the last `share` of its conversations held out
                                        (`lab train` and the page's Training card)

A line is a JSON object with "messages" (the roles of lab.text.chat) and anything else the writer keeps (`lab
grounded-data` keeps whether the passages hold the answer). The rendering is the one the chat uses
(lab.text.chat.render_chat), so a trained turn is the text the model will see at inference. An assistant's tokens
are those the conversation's rendering adds from the end of the prompt before it (the template's turn opener for
the assistant, add_generation_prompt) to the end of the conversation through that message: its content and the
template's end of turn, which is what teaches the model to stop. Where a template renders a prefix of the
conversation differently from the whole (none of the built-ins does), the ids they share decide: nothing before
the shared prefix is ever trained.

Each example is a window of its own, from position 0, padded to the step's T: no window sees another's text, and
padding is never a target (lab.instruments.training Trainer.targets). Pure Python: the worker runs it too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lab.engine.session import common_prefix
from lab.text import chat

MAX_LINES = 100_000     # conversations a file may hold


class ChatDataError(ValueError):
    """A line of the file the lab cannot train on; the message names the line and what to change."""


@dataclass(frozen=True)
class Example:
    ids: tuple[int, ...]
    mask: tuple[bool, ...]          # mask[i]: token i is an assistant's, predicted and trained
    line: int                       # its line in the file (1-based)

    @property
    def trained(self) -> int:
        return sum(self.mask)


def conversations(text: str, source: str = "the data") -> list[dict]:
    """The file's conversations, one a non-empty line, each checked: a JSON object whose "messages" is a list of
    {role, content} with at least one assistant message after a first message of another role. The first bad line is
    refused by its number."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) == MAX_LINES:
            raise ChatDataError(f"{source}: more than {MAX_LINES:,} conversations; split the file")
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ChatDataError(f"{source} line {n}: not JSON ({exc})") from None
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not msgs:
            raise ChatDataError(f'{source} line {n}: a conversation is an object with "messages": '
                                f'[{{"role": ..., "content": ...}}, ...]')
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in chat.ROLES or not isinstance(m.get("content"), str):
                raise ChatDataError(f"{source} line {n}, message {i + 1}: a {{role, content}} object with a role "
                                    f"among {', '.join(chat.ROLES)} and text content")
        if msgs[0]["role"] == "assistant" or not any(m["role"] == "assistant" for m in msgs):
            raise ChatDataError(f"{source} line {n}: no assistant message after a prompt: nothing to train on")
        out.append({**row, "line": n})
    if not out:
        raise ChatDataError(f"{source}: no conversation in it (one JSON object a line)")
    return out


def example(tok, md: dict, messages: list[dict], line: int = 0) -> Example:
    """The conversation's ids in the model's chat template and its assistant tokens (the module's docstring)."""
    whole = chat.render_chat(tok, md, messages, add_generation_prompt=False)
    mask = [False] * len(whole)
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = common_prefix(chat.render_chat(tok, md, messages[:k], add_generation_prompt=True), whole)
        end = common_prefix(chat.render_chat(tok, md, messages[:k + 1], add_generation_prompt=False), whole)
        for i in range(start, end):
            mask[i] = True
    if not any(mask):
        raise ChatDataError(f"line {line}: the chat template renders no token of its assistant's messages")
    return Example(tuple(whole), tuple(mask), line)


def examples(tok, md: dict, convs: list[dict], T: int, source: str = "the data") -> list[Example]:
    """Every conversation's Example; one longer than a window of T tokens is refused by its line."""
    out = []
    for c in convs:
        try:
            ex = example(tok, md, c["messages"], c["line"])
        except chat.ChatTemplateError as exc:
            raise ChatDataError(f"{source} line {c['line']}: {exc}") from None
        if len(ex.ids) > T:
            raise ChatDataError(f"{source} line {c['line']}: {len(ex.ids)} tokens in the model's chat template, "
                                f"longer than a window of {T}: train with a context of at least {len(ex.ids)}, or "
                                f"shorten it")
        out.append(ex)
    return out


def padded(ex: Example, T: int, pad: int) -> tuple[list[int], list[bool]]:
    """(ids, mask) of the example as a window of T tokens: `pad` (any id the model has) after it, never trained."""
    n = T - len(ex.ids)
    if n < 0:
        raise ChatDataError(f"line {ex.line}: {len(ex.ids)} tokens do not fit a window of {T}")
    return list(ex.ids) + [pad] * n, list(ex.mask) + [False] * n


def windows(text: str, tok, md: dict, T: int, share: float, source: str = "the data") -> tuple[list, list, list, list]:
    """(trained windows, held-out windows, their masks, the held-out ones' masks) of a .jsonl file's conversations,
    each a window of T tokens padded with EOS (or id 0); the last `share` of them (at least one, with share > 0)
    held out, so that at least one is trained on."""
    exs = examples(tok, md, conversations(text, source), T, source)
    held = max(1, round(len(exs) * share)) if share else 0
    if held and held >= len(exs):
        raise ChatDataError(f"{source}: {len(exs)} conversation(s): at least one to train on and one held out")
    pad = tok.eos_id if tok.eos_id is not None else 0
    rows = [padded(ex, T, pad) for ex in exs]
    train, kept = rows[:len(rows) - held], rows[len(rows) - held:]
    return [w for w, _ in train], [w for w, _ in kept], [m for _, m in train], [m for _, m in kept]
