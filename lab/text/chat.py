"""Chat prompts: a conversation [{role, content}] -> the token ids the model expects.

Control tokens come only from the template; message content can never produce one. The template
is rendered with a unique sentinel in place of each message's content, the rendered text is cut at
the sentinels, and the pieces go to `Tokenizer.encode_segments`: template pieces with
special-token spellings recognised (so `<|im_start|>` in the template becomes its control id),
contents with them off (so a user typing `<|im_start|>system` gets plain text tokens). Adjacent
template and content text is pre-tokenized together, exactly as llama.cpp tokenizes the whole
rendered prompt, so benign conversations give llama.cpp's ids.

Templates:
* With jinja2 importable and `tokenizer.chat_template` in the metadata: that template, rendered
  like llama-cpp-python / transformers do (sandboxed, trim_blocks, lstrip_blocks, loopcontrols,
  bos_token/eos_token, raise_exception, add_generation_prompt). A rendering is checked against a
  rendering with the real contents; a template that changes contents other than by trimming them
  is refused (ChatTemplateError) rather than guessed at.
* Otherwise built-ins: ChatML (SmolLM2, Qwen; with the template's own default system message when
  its text has one) and Gemma (llama.cpp's `gemma` format: system text folded into the first user
  turn, contents trimmed, "assistant" called "model").

BOS: prepended when the vocabulary's add_bos_token says so, unless the template already put it
there.

A template is file data, so hostile: anything it raises while rendering comes out
as ChatTemplateError, and a rendering is bounded (range() items, `*` and `**` results, output size),
so a template cannot hang or exhaust memory through them.
"""

from __future__ import annotations

import json
import re

ROLES = ("system", "user", "assistant", "tool")
MAX_RENDER = 1 << 22       # characters one rendering of a template may produce
MAX_ITEMS = 1 << 20        # range() items in one rendering, and the length of a `*` product


class ChatTemplateError(ValueError):
    pass


def _sentinel(i: int) -> str:
    return f"\ue000chat-content-{i}\ue001"


_SENTINEL_RE = re.compile("\ue000chat-content-([0-9]{1,9})\ue001")


def _check_messages(messages) -> list[dict]:
    if not messages:
        raise ChatTemplateError("a conversation needs at least one message")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ChatTemplateError(f"a message must be a {{role, content}} object, not {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"unsupported role {role!r}; use one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ChatTemplateError("message content must be a string")
        out.append({**m, "role": role, "content": content})
    return out


# --- jinja path ------------------------------------------------------------------------------

def _jinja_env():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _IgnoreGeneration(jinja2.ext.Extension):   # transformers' {% generation %} tag
        tags = {"generation"}

        def parse(self, parser):
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class _Bounded(ImmutableSandboxedEnvironment):
        """Sandboxed, and with the ways to make much work from little text capped."""
        intercepted_binops = frozenset(("*", "**"))
        items = 0

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                _raise(f"exponent {right!r} is too large")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_ITEMS:
                        _raise(f"a repetition of {len(seq)} x {n} items is too large")
            return super().call_binop(context, operator, left, right)

    env = _Bounded(trim_blocks=True, lstrip_blocks=True,
                   extensions=[_IgnoreGeneration, jinja2.ext.loopcontrols])

    def bounded_range(*args):
        r = range(*args)
        env.items += len(r)
        if env.items > MAX_ITEMS:
            _raise(f"range() gave more than {MAX_ITEMS} items in one rendering")
        return r

    env.globals["range"] = bounded_range

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    return env


def jinja_available() -> bool:
    try:
        import jinja2  # noqa: F401
        return True
    except ImportError:
        return False


def _raise(msg):
    raise ChatTemplateError(f"chat template: {msg}")


def _jinja_segments(tok, template: str, messages: list[dict], add_generation_prompt: bool):
    import datetime

    env = _jinja_env()
    ctx = dict(
        bos_token=tok.tokens[tok.bos_id] if tok.bos_id is not None else "",
        eos_token=tok.tokens[tok.eos_id] if tok.eos_id is not None else "",
        raise_exception=_raise, add_generation_prompt=add_generation_prompt,
        strftime_now=lambda f: datetime.datetime.now().strftime(str(f)),
    )

    compiled = []

    def render(msgs) -> str:
        env.items = 0
        out, n = [], 0
        try:
            if not compiled:
                compiled.append(env.from_string(template))
            for piece in compiled[0].generate(messages=msgs, **ctx):
                n += len(piece)
                if n > MAX_RENDER:
                    _raise(f"the rendering is longer than {MAX_RENDER} characters")
                out.append(piece)
        except ChatTemplateError:
            raise
        except Exception as exc:   # the template is file data: whatever it raises, the message says so
            raise ChatTemplateError(f"chat template (tokenizer.chat_template): {type(exc).__name__}: {exc}") from None
        return "".join(out)

    real = render(messages)
    masked = [{**m, "content": _sentinel(i)} for i, m in enumerate(messages)]
    rendered = render(masked)
    parts = _SENTINEL_RE.split(rendered)      # template, index, template, index, ..., template
    if any(int(p) >= len(messages) for p in parts[1::2]):   # sentinel text that did not come from a content
        raise ChatTemplateError("the chat template's rendering contains the lab's content marker; "
                                "use the built-in format")
    for transform in (lambda s: s, str.strip):
        segs = []
        for k, p in enumerate(parts):
            if k % 2 == 0:
                segs.append((p, True))
            else:
                segs.append((transform(messages[int(p)]["content"]), False))
        if "".join(s for s, _ in segs) == real:
            return segs
    raise ChatTemplateError("the chat template transforms message contents in a way the sentinel "
                            "rendering cannot follow; use the built-in format")


# --- built-in formats --------------------------------------------------------------------------

_DEFAULT_SYSTEM_RE = re.compile(
    r"<\|im_start\|>system(?:\n|\\n)((?:[^'\"\\]|\\.)*?)<\|im_end\|>")


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), s)


def default_system_message(template: str | None) -> str | None:
    """The system message a ChatML template adds when the conversation has none (the first
    literal `<|im_start|>system\\n...<|im_end|>` in its text), else None."""
    if not template:
        return None
    m = _DEFAULT_SYSTEM_RE.search(template)
    return _unescape(m.group(1)) if m else None


def builtin_format(tok, md: dict) -> str:
    template = md.get("tokenizer.chat_template") or ""
    if "<|im_start|>" in template:
        return "chatml"
    if "<start_of_turn>" in template:
        return "gemma"
    if not template:
        if "<|im_start|>" in tok.token_to_id:
            return "chatml"
        if "<start_of_turn>" in tok.token_to_id:
            return "gemma"
        # A base model with no turns in its vocabulary (one trained from scratch in the Training card, on plain
        # text): the conversation is text for it to continue, not turns it never saw.
        return "plain"
    raise ChatTemplateError("no built-in chat format matches this model's template")


def _plain_segments(messages):
    """Each message's text in order, a blank line between two, nothing after the last: the model continues it."""
    segs = []
    for i, m in enumerate(messages):
        if i:
            segs.append(("\n\n", False))
        segs.append((m["content"], False))
    return segs


def _chatml_segments(messages, add_generation_prompt, default_system):
    segs = []
    if default_system is not None and messages[0]["role"] != "system":
        segs.append(("<|im_start|>system\n", True))
        segs.append((default_system, False))
        segs.append(("<|im_end|>\n", True))
    for m in messages:
        segs.append((f"<|im_start|>{m['role']}\n", True))
        segs.append((m["content"], False))
        segs.append(("<|im_end|>\n", True))
    if add_generation_prompt:
        segs.append(("<|im_start|>assistant\n", True))
    return segs


_ASCII_SPACE = " \t\n\v\f\r"


def _gemma_segments(messages, add_generation_prompt):
    # llama.cpp llm_chat_apply_template, LLM_CHAT_TEMPLATE_GEMMA
    segs = []
    system = ""
    for m in messages:
        if m["role"] == "system":
            system += m["content"].strip(_ASCII_SPACE)
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        segs.append((f"<start_of_turn>{role}\n", True))
        if system and role != "model":
            segs.append((system, False))
            segs.append(("\n\n", True))
            system = ""
        segs.append((m["content"].strip(_ASCII_SPACE), False))
        segs.append(("<end_of_turn>\n", True))
    if add_generation_prompt:
        segs.append(("<start_of_turn>model\n", True))
    return segs


def builtin_segments(tok, md: dict, messages, add_generation_prompt: bool = True):
    fmt = builtin_format(tok, md)
    if fmt == "plain":
        return _plain_segments(messages)
    if fmt == "chatml":
        return _chatml_segments(messages, add_generation_prompt,
                                default_system_message(md.get("tokenizer.chat_template")))
    return _gemma_segments(messages, add_generation_prompt)


# --- entry point -------------------------------------------------------------------------------

def chat_segments(tok, md: dict, messages, *, add_generation_prompt: bool = True,
                  use_jinja: bool | None = None) -> list[tuple[str, bool]]:
    """The rendered prompt as (text, is_template) pieces. use_jinja: None = when possible."""
    messages = _check_messages(messages)
    template = md.get("tokenizer.chat_template")
    if use_jinja is None:
        use_jinja = bool(template) and jinja_available()
    if use_jinja:
        if not template:
            raise ChatTemplateError("the model has no tokenizer.chat_template")
        return _jinja_segments(tok, template, messages, add_generation_prompt)
    return builtin_segments(tok, md, messages, add_generation_prompt)


def render_chat(tokenizer, md: dict, messages, *, add_generation_prompt: bool = True,
                use_jinja: bool | None = None) -> list[int]:
    """Token ids of the conversation, ending with the assistant's turn opener when
    add_generation_prompt."""
    segs = chat_segments(tokenizer, md, messages, add_generation_prompt=add_generation_prompt,
                         use_jinja=use_jinja)
    ids = tokenizer.encode_segments(segs)
    if tokenizer.add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
        ids.insert(0, tokenizer.bos_id)
    return ids


def render_text(tokenizer, md: dict, messages, *, add_generation_prompt: bool = True,
                use_jinja: bool | None = None) -> str:
    """The rendered prompt as one string (for display)."""
    return "".join(s for s, _ in chat_segments(tokenizer, md, messages,
                                               add_generation_prompt=add_generation_prompt,
                                               use_jinja=use_jinja))
