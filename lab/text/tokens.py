"""One token named by the user, as the experiments take it (the page's Experiments card and `lab ablate | patch |
steer | attribute`): `#ID`, or text that is exactly one token of the vocabulary (with its leading space where the
vocabulary has one, e.g. " Paris").

What it does not know: what the token is for.
"""

from __future__ import annotations


def token_id(tok, spec: str, what: str = "the token") -> int:
    """The id `spec` names; ValueError saying what to give instead when it names none or several."""
    s = spec.strip() if spec.strip().startswith("#") else spec
    if s.startswith("#"):
        if not s[1:].isdigit():
            raise ValueError(f"{what} {spec!r}: #ID takes a number, e.g. #1234")
        i = int(s[1:])
        if not 0 <= i < tok.vocab_size:
            raise ValueError(f"{what} {spec!r}: the vocabulary has ids 0 .. {tok.vocab_size - 1}")
        return i
    if not spec:
        raise ValueError(f"{what} is empty: give one token's text (with its leading space where the vocabulary has "
                         f"one) or #ID")
    ids = tok.encode(spec)
    if len(ids) != 1:
        raise ValueError(f"{what} {spec!r} is {len(ids)} tokens {ids[:8]}, not one: give one token's text (with its "
                         f"leading space where the vocabulary has one) or #ID")
    return ids[0]
