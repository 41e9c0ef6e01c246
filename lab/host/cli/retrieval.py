"""`lab index | ask | retrieval-eval`: windows of text files embedded by the model itself
(lab/instruments/retrieval.py), saved to an index file (lab/host/index_file.py), searched for an answer's passages,
or scored by recall in memory."""

from __future__ import annotations

import asyncio
import json
import sys

from lab.host.cli.parsers import settings
from lab.host.loading import open_engine, read_model


def _read_files(paths: list[str], prog: str) -> tuple[list[tuple[str, bytes]], dict[str, str], list[dict]]:
    """(name, bytes) of each readable file, named as typed and each once, with the sha256 of each; a file that cannot
    be read is refused on stderr (returned as {name, message}) and the rest go on."""
    import hashlib
    files, digests, refused = [], {}, []
    for path in dict.fromkeys(paths):
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            refused.append({"name": path, "message": f"{path}: {exc.strerror or exc}"})
            print(f"{prog}: refused {refused[-1]['message']}", file=sys.stderr)
            continue
        files.append((path, raw))
        digests[path] = hashlib.sha256(raw).hexdigest()
    return files, digests, refused


async def _build(index, files: list[tuple[str, bytes]], prog: str):
    """Prepare and embed `files` into `index` with a progress line on stderr; the files it refuses are printed (and
    returned as {name, message}); RetrievalError when none is left."""
    prepared = index.prepare(files)
    for _name, message in prepared.refused:
        print(f"{prog}: refused {message}", file=sys.stderr)

    def progress(done: int, total: int, seconds: float) -> None:
        rate = done / seconds if seconds else 0.0
        left = f", about {(total - done) / rate:,.0f} s left" if rate and done < total else ""
        print(f"\r{prog}: {done:,}/{total:,} windows, {seconds:,.1f} s, {rate:,.1f} windows/s{left}   ", end="",
              file=sys.stderr, flush=True)
    built = await index.build(on_progress=progress)
    print(file=sys.stderr)
    return built, [{"name": n, "message": m} for n, m in prepared.refused]


def index(args) -> int:
    from pathlib import Path

    from lab.host import index_file
    from lab.instruments.retrieval import Index, check_shape
    check_shape(args.window, args.stride, args.ctx)
    model = read_model(args.model)
    info = index_file.model_info(args.model, model[0], model[1])
    files, digests, unreadable = _read_files(args.files, "lab index")
    _header, tok, engine, _timing = open_engine(args.model, args.ctx, disable=args.disable, model=model, lora=args.lora)
    index = Index(engine, tok, window=args.window, stride=args.stride)

    async def run():
        built, refused = await _build(index, files, "lab index")
        saved = index_file.Saved.of_index(index, info, [digests[n] for n in index.prepared.names],
                                          await index.embeddings())
        return built, refused, saved
    try:
        built, refused, saved = asyncio.run(run())
    finally:
        index.close()
    size = index_file.save(args.out, saved)
    out = {"index": args.out, "bytes": size, "model": Path(args.model).name,
           "files": [{"name": f.name, "tokens": len(f.ids), "sha256": f.sha256} for f in saved.files],
           "refused": unreadable + refused, "window": saved.window, "stride": saved.stride,
           "windows": len(saved.embeddings), "tokens": saved.n_tokens, "seconds": round(built.seconds, 3),
           "windows_per_s": round(built.per_second, 2)}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(f"indexed {len(out['files'])} file(s), {out['tokens']:,} tokens: {out['windows']:,} windows of "
              f"{saved.window} tokens every {saved.stride}, in {built.seconds:,.1f} s ({built.per_second:,.1f} "
              f"windows/s); wrote {args.out} ({size:,} bytes)")
    return 0


def ask(args) -> int:
    from lab.engine.session import Session
    from lab.host import index_file
    from lab.instruments.retrieval import Index, RetrievalError, pack_messages
    from lab.text import chat
    if not args.question.strip():
        raise RetrievalError("an empty --question: type one")
    # the index is validated for this model before a GPU opens: a damaged or foreign index costs no weight upload
    model = read_model(args.model)
    saved = index_file.load(args.index, index_file.model_info(args.model, model[0], model[1]))
    header, tok, engine, _timing = open_engine(args.model, args.ctx, disable=args.disable, model=model, lora=args.lora)

    async def run():
        hits = []
        if not args.no_retrieval:
            index = Index(engine, tok, window=saved.window, stride=saved.stride)
            try:
                if index.first != saved.first:
                    raise index_file.IndexFileError(
                        f"{args.index}: its windows ran {'behind' if saved.first else 'without'} BOS, this lab runs "
                        f"them {'behind' if index.first else 'without'} it: {index_file.REBUILD}")
                await index.restore(saved.prepared(), saved.embeddings.tobytes())
                hits = await index.search(tok.encode(args.question), args.k)
            finally:
                index.close()
        messages = (pack_messages(args.question, hits) if hits
                    else [{"role": "user", "content": args.question}])
        prompt = chat.render_chat(tok, header.metadata, messages)
        text = chat.render_text(tok, header.metadata, messages)
        if not args.json:
            for h in hits:
                print(f"{h.rank:3d}  {h.score:.4f}  {h.file}  tokens {h.start}-{h.end}")
            print(f"--- prompt ({len(prompt)} tokens) ---\n{text}\n--- answer ---")
        # the search ran its windows over the KV cache from position 0: a new session, whose cache is empty
        session = Session(engine, tok)
        stream = None if args.json else (lambda _id, piece: print(piece, end="", flush=True))
        return hits, text, await session.generate(prompt, settings(args), args.n, on_token=stream)
    hits, text, result = asyncio.run(run())
    if args.json:
        print(json.dumps({"hits": [h.to_dict() for h in hits], "prompt": text, "answer": result.text},
                         ensure_ascii=False))
    else:
        print()
        print(f"[{len(hits)} passage(s); {len(result.prompt_ids)} prompt tokens; {len(result.ids)} generated, "
              f"{result.decode_tok_s:.1f} tok/s decode; stop: {result.stop}]", file=sys.stderr)
    return 0


def retrieval_eval(args) -> int:
    from pathlib import Path

    from lab.instruments.retrieval import Index, check_queries, check_shape
    check_shape(args.window, args.stride, args.ctx)
    check_queries(args.queries)
    if args.backend == "browser":
        if args.lora:
            raise ValueError("--lora runs natively: the page takes an adapter in its Training card")
        if args.crop != retrieval_crop():
            raise ValueError("--crop runs natively: the page's card asks crops of its own length")
        return _retrieval_eval_in_page(args)
    files, _digests, _unreadable = _read_files(args.files, "lab retrieval-eval")
    _header, tok, engine, _timing = open_engine(args.model, args.ctx, disable=args.disable, lora=args.lora)
    index = Index(engine, tok, window=args.window, stride=args.stride)

    def progress(done: int, total: int, seconds: float) -> None:
        print(f"\rlab retrieval-eval: {done:,}/{total:,} queries, {seconds:,.1f} s   ", end="", file=sys.stderr,
              flush=True)

    async def run():
        built, _refused = await _build(index, files, "lab retrieval-eval")
        recall = await index.recall(args.queries, args.seed, on_progress=progress, crop=args.crop)
        print(file=sys.stderr)
        return built, recall
    try:
        built, recall = asyncio.run(run())
        p = index.prepared
        out = {"model": Path(args.model).name, "files": [{"name": n, "tokens": len(i)} for n, i in zip(p.names, p.ids)],
               "windows": built.windows, "tokens": p.n_tokens, "index_seconds": round(built.seconds, 3),
               "windows_per_s": round(built.per_second, 2), "recall": recall.to_dict()}
    finally:
        index.drop()
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(f"{out['model']} on {len(out['files'])} file(s), {out['tokens']:,} tokens: {out['windows']:,} windows of "
              f"{args.window} every {args.stride}, indexed in {built.seconds:,.1f} s ({built.per_second:,.1f} "
              f"windows/s)\nrecall@1 {recall.at1:.3f}, recall@5 {recall.at5:.3f} over {recall.queries} random "
              f"{recall.crop}-token crops (seed {recall.seed}), {recall.seconds:,.1f} s")
    return 0


def retrieval_crop() -> int:
    from lab.instruments.retrieval import CROP
    return CROP


def _retrieval_eval_in_page(args) -> int:
    """`--backend browser`: the same recall measured by the page's retrieval card (lab/host/bench/browser.py)."""
    from lab.host.bench import browser as bench_browser
    chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
    try:
        out = bench_browser.retrieval_page(args.model, args.files, queries=args.queries, seed=args.seed,
                                           window=args.window, stride=args.stride, chromium=chromium, args=flags)
    except bench_browser.BenchError as exc:
        print(f"lab retrieval-eval: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, ensure_ascii=False))
    return 0
