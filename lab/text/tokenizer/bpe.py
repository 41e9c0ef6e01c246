"""Byte-level BPE (llama.cpp vocab type BPE, `tokenizer.ggml.model == "gpt2"`), standard library only.

Encoding a raw text fragment (after the special-token partition in `Tokenizer`), as llama.cpp's
llm_tokenizer_bpe_session:

1. The pre-tokenizer named by `tokenizer.ggml.pre` cuts it into chunks (`pretokenize`).
2. Each chunk's UTF-8 bytes are mapped to the GPT-2 byte alphabet (one printable character per
   byte), and BPE merges run inside the chunk only: repeatedly merge the adjacent pair with the
   lowest merge rank (rank = position in tokenizer.ggml.merges), leftmost first. Results are
   cached per chunk. Llama-3 style vocabularies (ignore_merges) take a chunk that is itself a
   token whole.
3. A merged symbol that is not a token falls back to its single-byte tokens (llama.cpp looks up
   each raw byte of the symbol's text, so only ASCII ones are found; the rest are dropped).

Decoding a NORMAL token maps its characters back through the byte alphabet.

Defaults, as llama_vocab::load for BPE: bos = eos = 11 when the GGUF has no ids, add_bos false
except for Llama-3 style pre-tokenizers; tokenizer.ggml.add_bos_token overrides.
"""

from __future__ import annotations

import heapq

from lab.text.tokenizer.base import Tokenizer, raw_bytes
from lab.text.tokenizer.pretokenize import PreTokenizer


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    for b in keep:
        table[b] = chr(b)
    n = 0
    for b in range(256):
        if not table[b]:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
# str.translate over a latin-1 view maps every byte to its alphabet character in one C call
_LATIN1_TO_ALPHABET = {b: BYTE_TO_CHAR[b] for b in range(256)}
CACHE_LIMIT = 200_000



def join(syms: list[str], nxt: list[int], prv: list[int], left: int, right: int, text: str) -> int:
    """Merge symbol `right` into its left neighbour `left` (the merged text is `text`) in the linked list of
    symbols (nxt / prv indices, -1 at the ends; a merged-away symbol is left as ""). Returns left's previous
    symbol, the one pair that can newly form on the left (the caller checks the right one)."""
    syms[left] = text
    syms[right] = ""
    nr = nxt[right]
    nxt[left] = nr
    if nr >= 0:
        prv[nr] = left
    return prv[left]

class BPETokenizer(Tokenizer):
    """Byte-level BPE tokenizer built from GGUF metadata (see module docstring)."""

    model = "gpt2"

    def __init__(self, md: dict):
        merges = md["tokenizer.ggml.merges"]     # present and well formed: lab.format.checks.check_tokenizer
        self.pre = PreTokenizer(md.get("tokenizer.ggml.pre") or "default")
        self._init_vocab(md, bos=11, eos=11, unk=None, add_bos=self.pre.add_bos_default)
        ranks: dict[tuple[str, str], int] = {}
        for i, m in enumerate(merges):
            p = m.find(" ", 1)
            ranks.setdefault((m[:p], m[p + 1:]), i)
        self.ranks = ranks
        self._cache: dict[str, tuple[int, ...]] = {}

    def _drop_own_caches(self) -> int:
        n = len(self._cache)
        self._cache.clear()
        return n

    # --- encoding ----------------------------------------------------------------------------

    def _bpe(self, chunk: str) -> tuple[int, ...]:
        word = chunk.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ALPHABET)
        vocab = self.token_to_id
        if self.pre.ignore_merges:
            tid = vocab.get(word)
            if tid is not None:
                return (tid,)
        syms = list(word)
        n = len(syms)
        if n > 1:
            ranks = self.ranks
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            prv = list(range(-1, n - 1))
            heap = []
            for i in range(n - 1):
                r = ranks.get((syms[i], syms[i + 1]))
                if r is not None:
                    heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
            heapq.heapify(heap)
            push, pop = heapq.heappush, heapq.heappop
            while heap:
                _, left, right, text = pop(heap)
                ls, rs = syms[left], syms[right]
                if not ls or not rs or ls + rs != text:
                    continue                  # stale: one side was merged since
                p = join(syms, nxt, prv, left, right, text)
                nr = nxt[left]
                if p >= 0:
                    r2 = ranks.get((syms[p], text))
                    if r2 is not None:
                        push(heap, (r2, p, left, syms[p] + text))
                if nr >= 0:
                    r2 = ranks.get((text, syms[nr]))
                    if r2 is not None:
                        push(heap, (r2, left, nr, text + syms[nr]))
        out = []
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
            else:
                for ch in s.encode("utf-8"):
                    t1 = vocab.get(chr(ch)) if ch < 0x80 else None
                    if t1 is not None:
                        out.append(t1)
        return tuple(out)

    def _encode_text(self, text: str, out: list[int]) -> None:
        cache = self._cache
        for chunk in self.pre.split(text):
            ids = cache.get(chunk)
            if ids is None:
                ids = self._bpe(chunk)
                if len(cache) > CACHE_LIMIT:
                    cache.clear()
                cache[chunk] = ids
            out.extend(ids)

    def _encode_fragments(self, frags: list, out: list[int]) -> None:
        for f in frags:
            if type(f) is str:
                self._encode_text(f, out)
            else:
                out.append(f)

    # --- decoding ----------------------------------------------------------------------------

    def _normal_bytes(self, tid: int) -> bytes:
        t = self.tokens[tid]
        try:
            return bytes([CHAR_TO_BYTE[c] for c in t])
        except KeyError:   # not a byte-alphabet string (llama.cpp prints an [UNK_BYTE_..] marker)
            return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else raw_bytes(c) for c in t)
