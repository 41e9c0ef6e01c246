"""Pre-tokenizers: split text into the chunks that BPE merges run inside, as llama.cpp does.

Standard library only (this runs in Pyodide: no `regex` module). llama.cpp's rules, restated:

* Every code point gets category flags from the Unicode general category (L* letter, N* number,
  P* punctuation, S* symbol, M* mark, Z* separator, Cc/Cf/Co/Cs control, Cn undefined) plus a
  whitespace flag from the Unicode White_Space property (not `str.isspace`, which also counts
  U+001C..U+001F).
* A pre-tokenizer is a list of steps applied in turn; each step splits every piece the previous
  step produced and never looks across a piece's ends (a piece end is "end of text" to it).
* The GPT-2 and Llama-3 expressions are not run as regular expressions in llama.cpp but by
  hand-written scanners (`unicode_regex_split_custom_gpt2/_llama3`); `_split_gpt2` and
  `_split_llama3` follow those scanners step by step.
* Every other expression runs through C++ std::regex on a "collapsed" copy of the text: each
  code point >= 128 becomes one stand-in character for its class (whitespace -> U+000B, number
  -> U+00D1, letter -> U+00D2, punctuation -> U+00D3, mark -> U+00D4, symbol -> U+00D5, anything
  else -> U+00D0), and \\p{X} in the expression becomes a class of that stand-in plus the ASCII
  members. `_collapse_regex` does the same rewrite and runs Python's `re` with re.ASCII, whose
  \\s is the same [ \\t\\n\\v\\f\\r] as std::regex's in the C locale.

Pieces are returned as (start, end) code-point offsets into the text.

The pre-tokenizers (`tokenizer.ggml.pre` -> steps), as llama.cpp's llm_tokenizer_bpe:
  gpt-2, phi-2        GPT-2: 's|'t|'re|'ve|'m|'ll|'d (lower case only) | ?\\p{L}+ | ?\\p{N}+ (any
                      digit run, with one leading space) | ?[^\\s\\p{L}\\p{N}]+ | \\s+(?!\\S) | \\s+
  llama-bpe, llama3,  Llama-3: contractions case-insensitive | one non-letter/non-digit (not \\r\\n)
  llama-v3            glued to a following letter run | digits in groups of 1-3 | ?punctuation run
                      plus trailing \\r\\n | whitespace up to the last \\r\\n | \\s+(?!\\S) | \\s+.
                      Also ignore_merges (a chunk that is a token is taken whole) and add_bos.
  qwen2,              Llama-3's expression but single digits (\\p{N}); not one llama.cpp hand-codes,
  deepseek-r1-qwen    so it runs on the collapsed text.
  smollm, starcoder,  two steps: every digit alone (\\p{N}), then GPT-2's rules on each piece. So
  refact              unlike GPT-2, a space before a number is its own piece and digit runs split.
  default             [\\p{P}$+<=>^~|]+, then GPT-2, then \\p{N}+, then [0-9][0-9][0-9] (what
                      llama.cpp uses when the key is missing).
Any other name raises UnknownPreTokenizer naming it.

Unicode version: categories come from this Python's `unicodedata` (3.11: Unicode 14; 3.12:
15.0). llama.cpp's table is generated from a newer UnicodeData.txt, so a code point assigned
after this Python's version counts as "undefined" here and may split differently.
"""

from __future__ import annotations

import re
import unicodedata

from lab.format.checks import UnsupportedTokenizer

UNDEFINED = 0x0001
NUMBER = 0x0002
LETTER = 0x0004
SEPARATOR = 0x0008
MARK = 0x0010
PUNCTUATION = 0x0020
SYMBOL = 0x0040
CONTROL = 0x0080
WHITESPACE = 0x0100

_CATEGORY_FLAGS = {
    "Cn": UNDEFINED, "Cc": CONTROL, "Cf": CONTROL, "Co": CONTROL, "Cs": CONTROL,
    "Ll": LETTER, "Lm": LETTER, "Lo": LETTER, "Lt": LETTER, "Lu": LETTER,
    "Mc": MARK, "Me": MARK, "Mn": MARK,
    "Nd": NUMBER, "Nl": NUMBER, "No": NUMBER,
    "Pc": PUNCTUATION, "Pd": PUNCTUATION, "Pe": PUNCTUATION, "Pf": PUNCTUATION,
    "Pi": PUNCTUATION, "Po": PUNCTUATION, "Ps": PUNCTUATION,
    "Sc": SYMBOL, "Sk": SYMBOL, "Sm": SYMBOL, "So": SYMBOL,
    "Zl": SEPARATOR, "Zp": SEPARATOR, "Zs": SEPARATOR,
}

# Unicode White_Space property (PropList.txt).
WHITE_SPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
     0x202F, 0x205F, 0x3000])

_flag_cache: dict[str, int] = {}


def char_flags(ch: str) -> int:
    """Category flags (| WHITESPACE) of one character."""
    f = _flag_cache.get(ch)
    if f is None:
        f = _CATEGORY_FLAGS[unicodedata.category(ch)]
        if ord(ch) in WHITE_SPACE:
            f |= WHITESPACE
        _flag_cache[ch] = f
    return f


for _c in range(128):
    char_flags(chr(_c))


def text_flags(text: str) -> list[int]:
    get = _flag_cache.get
    return [get(c) or char_flags(c) for c in text]


# --- the collapsed-text regular expression path ------------------------------------------------

_STANDIN = {NUMBER: "\u00d1", LETTER: "\u00d2", PUNCTUATION: "\u00d3", MARK: "\u00d4", SYMBOL: "\u00d5"}
# \p{X} -> (stand-in, ASCII members), as llama.cpp's k_ucat_map.
_UCAT = {
    r"\p{N}": _STANDIN[NUMBER] + "0-9",
    r"\p{L}": _STANDIN[LETTER] + "A-Za-z",
    r"\p{P}": _STANDIN[PUNCTUATION] + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    r"\p{M}": _STANDIN[MARK],
    r"\p{S}": _STANDIN[SYMBOL] + r"\$\+<->\^`\|",
}
_collapse_cache: dict[str, str] = {}


def _collapsed_char(ch: str) -> str:
    c = _collapse_cache.get(ch)
    if c is None:
        if ord(ch) < 128:
            c = ch
        else:
            f = char_flags(ch)
            if f & WHITESPACE:
                c = "\x0b"
            else:
                c = _STANDIN.get(f & 0xFF, "\u00d0")
        _collapse_cache[ch] = c
    return c


def collapse_text(text: str) -> str:
    get = _collapse_cache.get
    return "".join([get(c) or _collapsed_char(c) for c in text])


def collapse_regex(expr: str) -> str:
    """Rewrite \\p{N}/\\p{L}/... in `expr` the way llama.cpp does for its collapsed text."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            pat = expr[i:close + 1]
            if close != -1 and pat in _UCAT:
                out.append(_UCAT[pat] if inside else "[" + _UCAT[pat] + "]")
                i = close + 1
                continue
            raise ValueError(f"unsupported unicode class {pat!r} in pre-tokenizer regex {expr!r}")
        out.append(c)
        i += 1
    return "".join(out)


class _RegexStep:
    """One std::regex step: matches and the gaps between them both become pieces."""

    def __init__(self, expr: str):
        self.expr = expr
        self.pattern = re.compile(collapse_regex(expr), re.ASCII)

    def __call__(self, text: str, flags: list[int], collapsed: str,
                 pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
        out = []
        finditer = self.pattern.finditer
        for a, b in pieces:
            prev = a
            for m in finditer(collapsed, a, b):
                s, e = m.span()
                if s > prev:
                    out.append((prev, s))
                out.append((s, e))
                prev = e
            if prev < b:
                out.append((prev, b))
        return out


# --- the hand-written scanners -----------------------------------------------------------------

_WLN = WHITESPACE | LETTER | NUMBER


def _split_gpt2(text: str, flags: list[int], collapsed: str,
                pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    # 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    out = []
    add = out.append
    for a, b in pieces:
        pos = a
        while pos < b:
            c = text[pos]
            f = flags[pos]
            if c == "'" and pos + 1 < b:
                n = text[pos + 1]
                if n == "s" or n == "t" or n == "m" or n == "d":
                    add((pos, pos + 2))
                    pos += 2
                    continue
                if pos + 2 < b:
                    nn = text[pos + 2]
                    if (n == "r" and nn == "e") or (n == "v" and nn == "e") or (n == "l" and nn == "l"):
                        add((pos, pos + 3))
                        pos += 3
                        continue
            sp = c == " "
            f2 = (flags[pos + 1] if pos + 1 < b else 0) if sp else f
            if f2 & LETTER:
                p = pos + sp
                while p < b and flags[p] & LETTER:
                    p += 1
                add((pos, p))
                pos = p
                continue
            if f2 & NUMBER:
                p = pos + sp
                while p < b and flags[p] & NUMBER:
                    p += 1
                add((pos, p))
                pos = p
                continue
            if f2 and not f2 & _WLN:
                p = pos + sp
                while p < b and not flags[p] & _WLN:
                    p += 1
                add((pos, p))
                pos = p
                continue
            n = 0
            while pos + n < b and flags[pos + n] & WHITESPACE:
                n += 1
            if n > 1 and pos + n < b:          # \s+(?!\S): leave the last space for the next word
                add((pos, pos + n - 1))
                pos += n - 1
                continue
            if n > 0:
                add((pos, pos + n))
                pos += n
                continue
            add((pos, pos + 1))
            pos += 1
    return out


_CONTRACTION_1 = frozenset("sStTmMdD")
_CONTRACTION_2 = frozenset(["re", "ve", "ll"])


def _llama3_contraction(text: str, pos: int, b: int) -> int:
    """The end of a contraction ('s, 'T, 're, 'LL, ...: any case, ASCII only) starting at the apostrophe at pos,
    or pos when none does."""
    if pos + 1 < b:
        n = text[pos + 1]
        if n in _CONTRACTION_1:
            return pos + 2
        if pos + 2 < b and (n + text[pos + 2]).lower() in _CONTRACTION_2 and (n + text[pos + 2]).isascii():
            return pos + 3
    return pos


def _llama3_digits(add, flags: list[int], pos: int, b: int) -> int:
    """\\p{N}{1,3}, repeated: the digit run at pos as pieces of three and a shorter last one; returns its end."""
    ini = p = pos
    while p < b and flags[p] & NUMBER:
        p += 1
        if p - ini >= 3:
            add((ini, p))
            ini = p
    if p > ini:
        add((ini, p))
    return p


def _llama3_space(text: str, flags: list[int], pos: int, b: int) -> int:
    """The end of the whitespace piece at pos: through its last \\r or \\n if it has one, else the run less its last
    character where a non-space follows, else the whole run (pos + 1 where no rule matched)."""
    n = 0
    last_rn = -1
    while pos + n < b and flags[pos + n] & WHITESPACE:
        if text[pos + n] == "\r" or text[pos + n] == "\n":
            last_rn = pos + n + 1
        n += 1
    if last_rn >= 0:                    # \s*[\r\n]+
        return last_rn
    if n > 1 and pos + n < b:           # \s+(?!\S)
        return pos + n - 1
    if n > 0:
        return pos + n
    return pos + 1


def _split_llama3(text: str, flags: list[int], collapsed: str,
                  pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    # (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
    # |\s*[\r\n]+|\s+(?!\S)|\s+
    # the letter and punctuation runs, most of the pieces, stay inline (the helpers take the rarer ones): a call
    # per piece adds up in this loop
    out = []
    add = out.append
    for a, b in pieces:
        pos = a
        while pos < b:
            c = text[pos]
            f = flags[pos]
            if c == "'":
                p = _llama3_contraction(text, pos, b)
                if p > pos:
                    add((pos, p))
                    pos = p
                    continue
            if not (c == "\r" or c == "\n" or f & NUMBER):
                if f & LETTER or (pos + 1 < b and flags[pos + 1] & LETTER):
                    p = pos + 1
                    while p < b and flags[p] & LETTER:
                        p += 1
                    add((pos, p))
                    pos = p
                    continue
            if f & NUMBER:
                pos = _llama3_digits(add, flags, pos, b)
                continue
            sp = c == " "
            f2 = (flags[pos + 1] if pos + 1 < b else 0) if sp else f
            if not f2 & _WLN:                   # f is never 0 inside the piece
                p = pos + sp
                while p < b and not flags[p] & _WLN:
                    p += 1
                while p < b and (text[p] == "\r" or text[p] == "\n"):
                    p += 1
                add((pos, p))
                pos = p
                continue
            p = _llama3_space(text, flags, pos, b)
            add((pos, p))
            pos = p
    return out


# --- the pre-tokenizers llama.cpp names ------------------------------------------------------

GPT2_EXPR = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_EXPR = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_EXPR = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _step(expr: str):
    # llama.cpp swaps in its hand-written scanner when the expression is exactly one of these.
    if expr == GPT2_EXPR:
        return _split_gpt2
    if expr == LLAMA3_EXPR:
        return _split_llama3
    return _RegexStep(expr)


# llama.cpp pre-type -> its list of expressions (llm_tokenizer_bpe's constructor).
_PRE_TYPES = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_EXPR, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt2": [GPT2_EXPR],
    "llama3": [LLAMA3_EXPR],
    "qwen2": [QWEN2_EXPR],
    "smollm": [r"\p{N}", GPT2_EXPR],     # digits split one by one, then the GPT-2 rules
}

# tokenizer.ggml.pre value -> (pre-type, ignore_merges, add_bos default), as llama_vocab::load.
# Only names whose llama.cpp pre-type is one of the above are accepted.
PRE_NAMES = {
    "default": ("default", False, False),    # also what llama.cpp uses when the key is missing
    "gpt-2": ("gpt2", False, False),
    "phi-2": ("gpt2", False, False),
    "llama3": ("llama3", True, True),
    "llama-v3": ("llama3", True, True),
    "llama-bpe": ("llama3", True, True),
    "qwen2": ("qwen2", False, False),
    "deepseek-r1-qwen": ("qwen2", False, False),
    "smollm": ("smollm", False, False),
    "starcoder": ("smollm", False, False),
    "refact": ("smollm", False, False),
}


class UnknownPreTokenizer(UnsupportedTokenizer):
    pass


class PreTokenizer:
    def __init__(self, name: str):
        if name not in PRE_NAMES:
            raise UnknownPreTokenizer(
                f"unsupported pre-tokenizer {name!r} (tokenizer.ggml.pre); supported: "
                + ", ".join(sorted(PRE_NAMES)))
        self.name = name
        self.pre_type, self.ignore_merges, self.add_bos_default = PRE_NAMES[name]
        self.exprs = _PRE_TYPES[self.pre_type]
        self.steps = [_step(e) for e in self.exprs]
        self._needs_collapsed = any(isinstance(s, _RegexStep) for s in self.steps)

    def spans(self, text: str) -> list[tuple[int, int]]:
        if not text:
            return []
        flags = text_flags(text)
        collapsed = collapse_text(text) if self._needs_collapsed else ""
        pieces = [(0, len(text))]
        for step in self.steps:
            pieces = step(text, flags, collapsed, pieces)
        return pieces

    def split(self, text: str) -> list[str]:
        return [text[a:b] for a, b in self.spans(text)]


def drop_caches() -> int:
    """Empty the per-character tables (they may hold characters of typed text, for Forget); returns the entries
    dropped. They refill on the next pre-tokenization."""
    n = len(_flag_cache) + len(_collapse_cache)
    _flag_cache.clear()
    _collapse_cache.clear()
    return n
