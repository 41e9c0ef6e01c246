"""Tokenizers built from GGUF metadata, matching llama.cpp id for id. Standard library only.

    tok = from_metadata(header.metadata)               # dispatches on tokenizer.ggml.model
    ids = tok.encode("Hello", add_bos=tok.add_bos)     # control-token spellings stay plain text
    tok.decode(ids) == "Hello"
    dec = tok.stream_decoder(); text = "".join(dec.feed(i) for i in ids) + dec.flush()

`tokenizer.ggml.model`:
  "gpt2"  -> byte-level BPE (`bpe.BPETokenizer`), pre-tokenizer from `tokenizer.ggml.pre`
  "llama" -> SentencePiece-style (`spm.SPMTokenizer`, llama.cpp vocab type SPM)
  other   -> UnsupportedTokenizer naming it.

What every vocabulary shares lives in `Tokenizer` (base.py: llama_vocab::load's rules): token types ->
attributes, special ids and their defaults, add_bos, the end-of-generation set, and the
special-token partition that runs before any model-specific splitting:

* The text is cut at spellings of special tokens, longest spelling first (ties by id). With
  special parsing off (the default for `encode`) only USER_DEFINED tokens are cut out (llama.cpp
  and HF tokenizers both do this, e.g. Qwen's `<tool_call>`); CONTROL tokens such as `<|im_end|>`
  stay ordinary text. Special parsing is on only for the chat template's own text, through
  `encode_segments`.
* Decoding (llama.cpp token_to_piece): CONTROL/UNKNOWN tokens give their spelling only with
  special=True, else nothing; USER_DEFINED give their spelling; BYTE tokens `<0xNN>` their byte;
  UNUSED/UNDEFINED nothing; NORMAL tokens the model-specific text.
"""

from __future__ import annotations

from lab.format.checks import TokenizerError, UnsupportedTokenizer, check_tokenizer, show
from lab.text.tokenizer.base import StreamDecoder, Tokenizer
from lab.text.tokenizer.bpe import BPETokenizer
from lab.text.tokenizer.spm import SPMTokenizer


def from_metadata(md: dict, *, n_vocab: int | None = None) -> Tokenizer:
    """Build the tokenizer a GGUF's metadata describes (plain Python data: strings and lists), after
    `lab.format.checks.check_tokenizer` (n_vocab: the embedding rows the vocabulary must match, when known).
    Every refusal is a TokenizerError naming the key."""
    check_tokenizer(md, n_vocab)
    model = md.get("tokenizer.ggml.model")
    if model == "gpt2":
        return BPETokenizer(md)
    if model == "llama":
        return SPMTokenizer(md)
    raise UnsupportedTokenizer(f"unsupported tokenizer model {show(model)} (tokenizer.ggml.model)")


__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError", "UnsupportedTokenizer", "from_metadata"]
