"""`lab tokenizer-train`: a byte-level BPE tokenizer trained on the user's files (lab/text/tokenizer/train.py, pure
Python: the page's Tokenizer card runs the same, lab/worker/tokenizer.py), written as JSON, and measured in bytes per
token on the same files (`train.bytes_per_token`), beside a model's own tokenizer with --model (more bytes a token:
fewer tokens for the same text)."""

from __future__ import annotations

import json
import time


def _read(path: str) -> tuple[str, int]:
    """A file's text (invalid UTF-8 kept as surrogates, which the tokenizers make U+FFFD, as `lab tokenize` reads)
    and its size in bytes."""
    with open(path, "rb") as f:
        raw = f.read()
    return raw.decode("utf-8", "surrogateescape"), len(raw)


def tokenizer_train(args) -> int:
    from lab.text.tokenizer import train
    read = [_read(p) for p in dict.fromkeys(args.files)]
    texts, n_bytes = [t for t, _ in read], sum(n for _, n in read)
    specials = train.DEFAULT_SPECIALS if args.special is None else args.special
    t0 = time.perf_counter()
    trained = train.train(texts, args.vocab, pre=args.pre, specials=specials)
    train_s = time.perf_counter() - t0
    trained.save(args.out)
    out = {"out": args.out, "files": list(dict.fromkeys(args.files)), "bytes": n_bytes, "pre": trained.pre,
           "tie_rule": train.TIE_RULE, "vocab": len(trained.tokens), "merges": len(trained.merges),
           "train_s": round(train_s, 3), "bytes_per_token": train.bytes_per_token(trained.tokenizer(), texts, n_bytes)}
    if args.model:
        from lab.host.loading import read_model
        _header, _cfg, tok = read_model(args.model)
        out["model"] = {"path": args.model, "vocab": tok.vocab_size,
                        "bytes_per_token": train.bytes_per_token(tok, texts, n_bytes)}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(f"{args.out}: {out['vocab']} tokens ({out['merges']} merges) from {n_bytes} bytes in {out['train_s']} s")
    print(f"bytes per token: {out['bytes_per_token']} (this tokenizer)")
    if args.model:
        print(f"bytes per token: {out['model']['bytes_per_token']} ({args.model}, {out['model']['vocab']} tokens)")
    return 0
