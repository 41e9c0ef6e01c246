"""What every vocabulary shares (llama_vocab::load's rules): token types -> attributes, special ids and their
defaults, add_bos, the end-of-generation set, the special-token partition that runs before any model-specific
splitting, decoding, and the incremental decoder. The model-specific subclasses are lab.text.tokenizer.bpe and
lab.text.tokenizer.spm; lab.text.tokenizer.from_metadata picks one. Standard library only.
"""

from __future__ import annotations

import codecs

from lab.format.checks import TokenizerError, show
from lab.text.tokenizer import pretokenize

# GGUF token types (llama_token_type) and llama.cpp attribute bits (llama_token_attr).
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
_TYPE_ATTR = {
    TYPE_UNDEFINED: ATTR_UNDEFINED, TYPE_NORMAL: ATTR_NORMAL, TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_CONTROL: ATTR_CONTROL, TYPE_USER_DEFINED: ATTR_USER_DEFINED, TYPE_UNUSED: ATTR_UNUSED,
    TYPE_BYTE: ATTR_BYTE,
}

# Text-based detection in llama_vocab::load (a GGUF id key wins where present).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)


def raw_bytes(s: str) -> bytes:
    """A token string's bytes (lab.format.gguf keeps invalid UTF-8 as lone surrogates: surrogateescape)."""
    return s.encode("utf-8", "surrogateescape")


def clean_text(text: str) -> str:
    """Lone surrogates (possible in text from JavaScript) become U+FFFD, as llama.cpp does with
    invalid UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def _md_id(md: dict, key: str, default: int | None, n_vocab: int) -> int | None:
    ok = default if default is not None and 0 <= default < n_vocab else None
    v = md.get(key)
    if v is None:
        return ok
    v = int(v)
    return v if 0 <= v < n_vocab else ok


class Tokenizer:
    """Common interface and the vocabulary rules every model type shares.

    Attributes: tokens (list of token strings), token_to_id, vocab_size, attrs (llama.cpp
    attribute bits per id), bos_id, eos_id, unk_id, eos_ids (the end-of-generation set),
    add_bos, add_eos."""

    model = "?"

    def _init_vocab(self, md: dict, *, bos: int | None, eos: int | None, unk: int | None,
                    add_bos: bool, add_eos: bool = False) -> None:
        tokens = md["tokenizer.ggml.tokens"]
        n = len(tokens)
        self.tokens: list[str] = list(tokens)
        self.vocab_size = n
        self.token_to_id: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            if t == "":
                t = self.tokens[i] = f"[EMPTY_{i}]"
            if t in self.token_to_id:
                raise TokenizerError(f"tokenizer.ggml.tokens has {show(t)} twice: ids {self.token_to_id[t]} and {i}")
            self.token_to_id[t] = i
        types = md.get("tokenizer.ggml.token_type")
        self.attrs = [_TYPE_ATTR[t] for t in types] if types is not None else [ATTR_NORMAL] * n
        self.bos_id = _md_id(md, "tokenizer.ggml.bos_token_id", bos, n)
        self.eos_id = _md_id(md, "tokenizer.ggml.eos_token_id", eos, n)
        self.unk_id = _md_id(md, "tokenizer.ggml.unknown_token_id", unk, n)
        v = md.get("tokenizer.ggml.add_bos_token")
        self.add_bos = add_bos if v is None else bool(v)
        v = md.get("tokenizer.ggml.add_eos_token")
        self.add_eos = add_eos if v is None else bool(v)
        self.eos_ids = self._eog_ids(md)
        specials = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        specials.sort(key=lambda i: (-len(raw_bytes(self.tokens[i])), i))
        self._specials = specials

    def _find_text(self, key: str, md: dict, texts: tuple[str, ...]) -> int | None:
        v = _md_id(md, key, None, self.vocab_size)
        if v is not None:
            return v
        for t in texts:
            i = self.token_to_id.get(t)
            if i is not None:
                self.attrs[i] |= ATTR_CONTROL
                return i
        return None

    def _eog_ids(self, md: dict) -> frozenset[int]:
        """End-of-generation ids, by llama_vocab::load's rules."""
        eot = self._find_text("tokenizer.ggml.eot_token_id", md, _EOT_TEXTS)
        eom = self._find_text("tokenizer.ggml.eom_token_id", md, _EOM_TEXTS)
        fim_pad = self._find_text("tokenizer.ggml.fim_pad_token_id", md, _FIM_PAD_TEXTS)
        fim_rep = self._find_text("tokenizer.ggml.fim_rep_token_id", md, _FIM_REP_TEXTS)
        fim_sep = self._find_text("tokenizer.ggml.fim_sep_token_id", md, _FIM_SEP_TEXTS)
        for i, a in enumerate(self.attrs):             # control tokens named "unused..." are unused
            if a & ATTR_CONTROL and "unused" in self.tokens[i]:
                self.attrs[i] |= ATTR_UNUSED
        eog = {i for i in (fim_pad, fim_rep, fim_sep) if i is not None}
        for t in _EOG_TEXTS:
            i = self.token_to_id.get(t)
            if i is not None:
                eog.add(i)
                self.attrs[i] |= ATTR_CONTROL
        eog.update(i for i in (self.eos_id, eot, eom) if i is not None)
        texts = {self.tokens[i]: i for i in eog}
        call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and (("<|return|>" in texts and call) or (call and "<|flush|>" in texts)):
            eog.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = ATTR_NORMAL
        return frozenset(eog)

    # --- encoding ----------------------------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> list:
        """Cut `text` at special-token spellings: a list of raw strings and token ids."""
        frags: list = [text]
        skip = 0 if parse_special else (ATTR_CONTROL | ATTR_UNKNOWN)
        attrs, tokens = self.attrs, self.tokens
        for tid in self._specials:
            if attrs[tid] & skip:
                continue
            spelling = tokens[tid]
            if not any(type(f) is str and spelling in f for f in frags):
                continue
            out: list = []
            for f in frags:
                if type(f) is not str or spelling not in f:
                    out.append(f)
                    continue
                for k, p in enumerate(f.split(spelling)):
                    if k:
                        out.append(tid)
                    if p:
                        out.append(p)
            frags = out
        return frags

    def encode_segments(self, segments, *, add_bos: bool = False) -> list[int]:
        """Encode (text, parse_special) pieces as one text: special-token spellings are recognised
        only inside pieces with parse_special=True, and raw text adjacent across piece boundaries
        is tokenized together, exactly as llama.cpp tokenizes the whole text with those spellings
        protected. Used by the chat template; `encode` is the one-piece, special-off case."""
        frags: list = []
        for text, parse_special in segments:
            if not text:
                continue
            for f in self._partition(clean_text(text), bool(parse_special)):
                if type(f) is str and frags and type(frags[-1]) is str:
                    frags[-1] += f
                else:
                    frags.append(f)
        out: list[int] = []
        if add_bos and self.bos_id is not None:
            out.append(self.bos_id)
        self._encode_fragments(frags, out)
        return out

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special-token spellings in it are ordinary characters (except
        USER_DEFINED tokens, as in llama.cpp)."""
        return self.encode_segments([(text, False)], add_bos=add_bos)

    def _encode_fragments(self, frags: list, out: list[int]) -> None:  # pragma: no cover
        raise NotImplementedError

    # --- decoding ----------------------------------------------------------------------------

    def _normal_bytes(self, tid: int) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def token_bytes(self, tid: int, *, special: bool = True) -> bytes:
        """The bytes token `tid` stands for (llama.cpp token_to_piece). With special=False,
        CONTROL/UNKNOWN tokens give b""."""
        attr = self.attrs[tid]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL):
            return raw_bytes(self.tokens[tid]) if special else b""
        if attr & ATTR_USER_DEFINED:
            return raw_bytes(self.tokens[tid])
        if attr & ATTR_NORMAL:
            return self._normal_bytes(tid)
        if attr & ATTR_BYTE:
            return bytes([int(self.tokens[tid][3:5], 16)])
        return b""

    def decode_bytes(self, ids, *, special: bool = False) -> bytes:
        tb = self.token_bytes
        return b"".join([tb(i, special=special) for i in ids])

    def decode(self, ids, *, special: bool = False) -> str:
        """Text of `ids` (pieces concatenated, as llama.cpp's token_to_piece; no space clean-up).
        Control tokens are left out unless special=True. Invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids, special=special).decode("utf-8", "replace")

    def piece(self, tid: int) -> str:
        """Display text of one token for the UI: its text when its bytes are valid UTF-8 (control
        tokens show their spelling), else the bytes as \\xNN escapes."""
        return self.token_bytes(tid, special=True).decode("utf-8", "backslashreplace")

    def stream_decoder(self, *, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special=special)

    def drop_caches(self) -> int:
        """Empty the caches that hold pieces of text the user typed (or the model wrote), for Forget: this
        tokenizer's chunk -> ids cache and the pre-tokenizer's per-character tables. Returns the entries dropped.
        (They refill on the next encode.)"""
        return pretokenize.drop_caches() + self._drop_own_caches()

    def _drop_own_caches(self) -> int:
        return 0

    # --- special tokens ----------------------------------------------------------------------

    def is_control(self, tid: int) -> bool:
        return bool(self.attrs[tid] & ATTR_CONTROL)

    def special_id(self, spelling: str) -> int:
        """Id of a control/user-defined token by its spelling (for the chat template only)."""
        tid = self.token_to_id.get(spelling)
        if tid is None or not self.attrs[tid] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN):
            raise KeyError(f"{spelling!r} is not a special token of this vocabulary")
        return tid


class StreamDecoder:
    """Incremental detokenizer: `feed(id)` returns the text completed by that token; bytes of an
    unfinished UTF-8 sequence wait for the next token. `flush()` returns what is left (an
    incomplete sequence becomes U+FFFD). The concatenation equals `tokenizer.decode(ids)`."""

    def __init__(self, tokenizer: Tokenizer, *, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, tid: int) -> str:
        return self._dec.decode(self.tokenizer.token_bytes(tid, special=self.special))

    def flush(self) -> str:
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out
