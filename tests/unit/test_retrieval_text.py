"""The retrieval index's CPU side (lab/instruments/retrieval.py): which files it takes, how it cuts windows, the hit
rule of its recall, and the prompt it packs. No GPU."""

from __future__ import annotations

import pytest

from lab.instruments.retrieval import (
    SYSTEM,
    Hit,
    RetrievalError,
    check_shape,
    covered,
    pack_messages,
    read_text,
    windows_of,
)


def test_read_text_takes_utf8_and_drops_the_bom():
    assert read_text("a.md", "\ufeff# Title\nnaïve <script>".encode()) == "# Title\nnaïve <script>"


@pytest.mark.parametrize("raw,needle", [
    (b"", "a.txt: the file is empty"),
    (b"   \n\t ", "a.txt: holds only white space"),
    (b"text\x00more", "a.txt: a binary file"),
    (b"caf\xe9 au lait", "a.txt: not UTF-8 text (byte 3 is 0xe9)"),
    (bytes(range(1, 9)) * 50, "a.txt: 400 control characters in its first 400"),
])
def test_read_text_refuses_by_name(raw, needle):
    with pytest.raises(RetrievalError) as e:
        read_text("a.txt", raw)
    assert needle in str(e.value)


@pytest.mark.parametrize("n,window,stride,want", [
    (0, 8, 4, []),
    (5, 8, 4, [(0, 5)]),
    (8, 8, 4, [(0, 8)]),
    (16, 8, 4, [(0, 8), (4, 12), (8, 16)]),
    (17, 8, 4, [(0, 8), (4, 12), (8, 16), (9, 17)]),      # the last window ends at the file's end
    (20, 8, 8, [(0, 8), (8, 16), (12, 20)]),
])
def test_windows_of(n, window, stride, want):
    got = windows_of(n, window, stride)
    assert got == want
    assert all(b - a == min(window, n) for a, b in got)
    assert sorted({i for a, b in got for i in range(a, b)}) == list(range(n)), "every token in some window"


def test_check_shape():
    check_shape(64, 32, 2048)
    for window, stride, n_ctx, needle in [(4, 2, 2048, "window of 4"), (64, 65, 2048, "stride of 65"),
                                          (64, 0, 2048, "stride of 0"), (64, 32, 64, "context made at load is 64")]:
        with pytest.raises(RetrievalError, match=needle):
            check_shape(window, stride, n_ctx)


def test_covered_is_the_hit_rule():
    crop = (10, 34)                                   # 24 tokens; a hit covers at least 12 of them
    assert covered(crop, (0, 64)) == 24
    assert covered(crop, (22, 86)) == 12
    assert covered(crop, (23, 87)) == 11
    assert covered(crop, (34, 98)) == 0


def test_pack_messages_numbers_passages_in_rank_order():
    hits = [Hit(1, 7, "b.md", 32, 96, 0.9, "  second file <b>bold</b>\n"), Hit(2, 0, "a.txt", 0, 64, 0.8, "first")]
    msgs = pack_messages("Who?", hits)
    assert msgs[0] == {"role": "system", "content": SYSTEM}
    user = msgs[1]["content"]
    assert user.index("[1] b.md, tokens 32-96:\nsecond file <b>bold</b>") < user.index("[2] a.txt, tokens 0-64:\nfirst")
    assert user.endswith("\n\nQuestion: Who?")
