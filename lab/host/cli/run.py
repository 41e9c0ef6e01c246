"""`lab serve | info | selftest | tokenize | generate | perplexity`: the page's server, a file's header, the GPU
self-test, and one model read or run natively; `read_model` and `load`, which the retrieval commands share."""

from __future__ import annotations

import asyncio
import json
import sys

from lab.host.cli.parsers import settings
from lab.host.loading import open_engine


def serve(args) -> int:
    from lab.host import models
    from server.app import serve as serve_page
    serve_page(args.model or models.path(models.DEFAULT), args.host, args.port)
    return 0


def info(args) -> int:
    from lab.format import gguf
    header = gguf.read_file(args.model)
    print(json.dumps(gguf.summary(header), indent=2))
    return 0


def selftest(args) -> int:
    from lab.host.native import open_native
    from lab.instruments import selftest as checks
    device = open_native(disable=tuple(args.disable))
    print(json.dumps({"gpu": device.info.summary(), "selftest": asyncio.run(checks.run(device))}, indent=2))
    return 0


def tokenize(args) -> int:
    from lab.format import gguf
    from lab.text.tokenizer import from_metadata
    tok = from_metadata(gguf.read_file(args.model).metadata)
    with open(args.file, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    ids = tok.encode(text)
    print(json.dumps(ids) if args.json else " ".join(map(str, ids)))
    return 0


def generate(args) -> int:
    from lab.engine.session import Session
    from lab.text import chat
    header, tok, engine, timing = open_engine(args.model, args.ctx, disable=args.disable, lora=args.lora)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        messages.append({"role": "user", "content": args.prompt})
        prompt = chat.render_chat(tok, header.metadata, messages)
    else:
        prompt = tok.encode(args.prompt, add_bos=tok.add_bos)
    session = Session(engine, tok)
    stream = None if args.json else (lambda _id, piece: print(piece, end="", flush=True))
    result = asyncio.run(session.generate(prompt, settings(args), args.n, on_token=stream))
    if args.json:
        out = result.to_dict()
        out.update(load_s=round(timing["load_s"], 3), weight_bytes=timing["weight_bytes"],
                   dispatches_per_token=engine.dispatches_per_step(1), adapter=engine.device.info.name)
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(f"[{len(prompt)} prompt tokens, {result.prefill_tok_s:.1f} tok/s prefill; {len(result.ids)} generated, "
              f"{result.decode_tok_s:.1f} tok/s decode; stop: {result.stop}]", file=sys.stderr)
    return 0


def perplexity(args) -> int:
    from lab.instruments.perplexity import Perplexity, tokens_of
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    _header, tok, engine, timing = open_engine(args.model, args.ctx, disable=args.disable, lora=args.lora)
    ppl = Perplexity(engine)
    ids = tokens_of(tok, text)

    def progress(i, n, value):
        if i and not args.json:
            print(f"[{i}]{value:.4f},", end="\n" if i == n else "", file=sys.stderr, flush=True)
    try:
        res = asyncio.run(ppl.run(ids, args.ctx, bos_id=tok.bos_id, add_bos=tok.add_bos, n_chunks=args.chunks,
                                  on_chunk=progress))
    finally:
        ppl.close()
    if args.json:
        print(json.dumps({**res.to_dict(), "load_s": round(timing["load_s"], 3), "adapter": engine.device.info.name}))
    else:
        err = f" +/- {res.ppl_err:.5f}" if res.ppl_err is not None else ""
        print(f"PPL = {res.ppl:.4f}{err}  ({res.chunks} chunks of {res.n_ctx}, {res.tokens_scored} tokens scored of "
              f"{res.n_tokens}, {res.seconds:.1f} s)")
    return 0
