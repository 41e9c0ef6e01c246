"""SentencePiece-style tokenizer (llama.cpp vocab type SPM, `tokenizer.ggml.model == "llama"`).

Standard library only. As llama.cpp's llm_tokenizer_spm_session, per raw text fragment left by
the special-token partition in `Tokenizer` (which, even with special parsing off, cuts out
USER_DEFINED tokens: for Gemma that includes runs of newlines, spaces and tabs, and some HTML
tags):

1. When add_space_prefix (tokenizer.ggml.add_space_prefix, default true) and the fragment starts
   the text or follows a special token, a space is put in front.
2. Spaces become U+2581 '▁'. No other normalisation, no pre-tokenizer: the whole fragment is one
   sequence of characters.
3. Merges by score: start from single characters; repeatedly take the adjacent pair whose
   concatenation is a token with the highest score (ties: leftmost), merge it, and consider the
   new neighbours. Any token counts, whatever its type.
4. A final symbol that is a token is emitted; a character that is not becomes its UTF-8 bytes as
   byte tokens `<0xNN>`.

Decoding a NORMAL token turns '▁' back into spaces. Defaults, as llama_vocab::load for SPM:
bos 1, eos 2, unk 0, add_bos true.
"""

from __future__ import annotations

import heapq

from lab.format.checks import TokenizerError
from lab.text.tokenizer.base import Tokenizer, raw_bytes
from lab.text.tokenizer.bpe import join


class SPMTokenizer(Tokenizer):
    model = "llama"

    def __init__(self, md: dict):
        self._init_vocab(md, bos=1, eos=2, unk=0, add_bos=True)
        scores = md.get("tokenizer.ggml.scores")
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * self.vocab_size
        v = md.get("tokenizer.ggml.add_space_prefix")
        self.add_space_prefix = True if v is None else bool(v)
        self._byte_ids = []
        for b in range(256):
            tid = self.token_to_id.get(f"<0x{b:02X}>")
            if tid is None:
                tid = self.token_to_id.get(chr(b)) if b < 0x80 else None
            if tid is None:    # llama.cpp's byte_to_token would throw while encoding: refused at load
                raise TokenizerError(f"tokenizer.ggml.model = 'llama' (SentencePiece) needs the byte tokens "
                                     f"<0x00>..<0xFF> in tokenizer.ggml.tokens for characters it has no token "
                                     f"for; <0x{b:02X}> is missing")
            self._byte_ids.append(tid)

    # --- encoding ----------------------------------------------------------------------------

    def _encode_fragments(self, frags: list, out: list[int]) -> None:
        prev_special = True                      # the text's start counts as "after a special"
        for f in frags:
            if type(f) is str:
                if self.add_space_prefix and prev_special:
                    f = " " + f
                self._spm(f.replace(" ", "\u2581"), out)
                prev_special = False
            else:
                out.append(f)
                prev_special = True

    def _spm(self, text: str, out: list[int]) -> None:
        vocab, scores = self.token_to_id, self.scores
        syms = list(text)
        n = len(syms)
        if n > 1:
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            prv = list(range(-1, n - 1))
            heap = []
            for i in range(n - 1):
                t = syms[i] + syms[i + 1]
                tid = vocab.get(t)
                if tid is not None:
                    heap.append((-scores[tid], i, i + 1, len(t)))
            heapq.heapify(heap)
            push, pop = heapq.heappush, heapq.heappop
            while heap:
                _, left, right, size = pop(heap)
                ls, rs = syms[left], syms[right]
                if not ls or not rs or len(ls) + len(rs) != size:
                    continue                     # stale: one side was merged since
                text2 = ls + rs
                p = join(syms, nxt, prv, left, right, text2)
                nr = nxt[left]
                if p >= 0:
                    t = syms[p] + text2
                    tid = vocab.get(t)
                    if tid is not None:
                        push(heap, (-scores[tid], p, left, len(t)))
                if nr >= 0:
                    t = text2 + syms[nr]
                    tid = vocab.get(t)
                    if tid is not None:
                        push(heap, (-scores[tid], left, nr, len(t)))
        byte_ids = self._byte_ids
        for s in syms:
            if not s:
                continue
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
                continue
            out.extend([byte_ids[b] for b in s.encode("utf-8")])

    # --- decoding ----------------------------------------------------------------------------

    def _normal_bytes(self, tid: int) -> bytes:
        return raw_bytes(self.tokens[tid].replace("\u2581", " "))
