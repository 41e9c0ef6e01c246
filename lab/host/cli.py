"""The `lab` command: serve the page, and native tools for the same engine the page runs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def _serve(args) -> int:
    from lab.host import models
    from server.app import serve
    serve(args.model or models.path(models.DEFAULT), args.host, args.port)
    return 0


def _info(args) -> int:
    from lab.format import gguf
    header = gguf.read_file(args.model)
    print(json.dumps(gguf.summary(header), indent=2))
    return 0


def _selftest(args) -> int:
    from lab.host.native import open_native
    from lab.instruments import selftest
    device = open_native(disable=tuple(args.disable))
    print(json.dumps({"gpu": device.info.summary(), "selftest": asyncio.run(selftest.run(device))}, indent=2))
    return 0


def _read_model(model_path: str):
    """Header, config and tokenizer of a GGUF, validated: everything that can be refused before a GPU opens."""
    from lab.engine.load import validate
    from lab.format import gguf
    header = gguf.read_file(model_path)
    cfg, tok = validate(header)
    return header, cfg, tok


def _load(model_path: str, n_ctx: int, disable=(), model=None):
    """Header, tokenizer and a native engine with the weights uploaded (timed); `model`: _read_model's, if read."""
    import time

    from lab.engine.engine import Engine, read_host_values
    from lab.host.native import open_native
    header, cfg, tok = model or _read_model(model_path)
    device = open_native(disable=tuple(disable))
    t0 = time.perf_counter()
    engine = Engine(device, header, cfg, n_ctx=n_ctx, host_values=read_host_values(model_path, header, cfg))
    nbytes = engine.weights.upload_file(model_path)
    return header, tok, engine, {"load_s": time.perf_counter() - t0, "weight_bytes": nbytes}


def _settings(args):
    """The sampler's settings from the flags `sampling_flags` (in `main`) adds."""
    from lab.settings import Settings
    return Settings(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p, seed=args.seed)


def _generate(args) -> int:
    from lab.engine.session import Session
    from lab.text import chat
    header, tok, engine, load = _load(args.model, args.ctx, args.disable)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        messages.append({"role": "user", "content": args.prompt})
        prompt = chat.render_chat(tok, header.metadata, messages)
    else:
        prompt = tok.encode(args.prompt, add_bos=tok.add_bos)
    session = Session(engine, tok)
    stream = None if args.json else (lambda _id, piece: print(piece, end="", flush=True))
    result = asyncio.run(session.generate(prompt, _settings(args), args.n, on_token=stream))
    if args.json:
        out = result.to_dict()
        out.update(load_s=round(load["load_s"], 3), weight_bytes=load["weight_bytes"],
                   dispatches_per_token=engine.dispatches_per_step(1), adapter=engine.device.info.name)
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(f"[{len(prompt)} prompt tokens, {result.prefill_tok_s:.1f} tok/s prefill; {len(result.ids)} generated, "
              f"{result.decode_tok_s:.1f} tok/s decode; stop: {result.stop}]", file=sys.stderr)
    return 0


def _perplexity(args) -> int:
    from lab.instruments.perplexity import Perplexity, tokens_of
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    _header, tok, engine, load = _load(args.model, args.ctx, args.disable)
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
        print(json.dumps({**res.to_dict(), "load_s": round(load["load_s"], 3), "adapter": engine.device.info.name}))
    else:
        err = f" +/- {res.ppl_err:.5f}" if res.ppl_err is not None else ""
        print(f"PPL = {res.ppl:.4f}{err}  ({res.chunks} chunks of {res.n_ctx}, {res.tokens_scored} tokens scored of "
              f"{res.n_tokens}, {res.seconds:.1f} s)")
    return 0


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


def _index(args) -> int:
    from pathlib import Path

    from lab.host import index_file
    from lab.instruments.retrieval import Index, check_shape
    check_shape(args.window, args.stride, args.ctx)
    model = _read_model(args.model)
    info = index_file.model_info(args.model, model[0], model[1])
    files, digests, unreadable = _read_files(args.files, "lab index")
    _header, tok, engine, _timing = _load(args.model, args.ctx, args.disable, model)
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


def _ask(args) -> int:
    from lab.engine.session import Session
    from lab.host import index_file
    from lab.instruments.retrieval import Index, RetrievalError, pack_messages
    from lab.text import chat
    if not args.question.strip():
        raise RetrievalError("an empty --question: type one")
    # the index is validated for this model before a GPU opens: a damaged or foreign index costs no weight upload
    model = _read_model(args.model)
    saved = index_file.load(args.index, index_file.model_info(args.model, model[0], model[1]))
    header, tok, engine, _timing = _load(args.model, args.ctx, args.disable, model)

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
        return hits, text, await session.generate(prompt, _settings(args), args.n, on_token=stream)
    hits, text, result = asyncio.run(run())
    if args.json:
        print(json.dumps({"hits": [h.to_dict() for h in hits], "prompt": text, "answer": result.text},
                         ensure_ascii=False))
    else:
        print()
        print(f"[{len(hits)} passage(s); {len(result.prompt_ids)} prompt tokens; {len(result.ids)} generated, "
              f"{result.decode_tok_s:.1f} tok/s decode; stop: {result.stop}]", file=sys.stderr)
    return 0


def _retrieval_eval(args) -> int:
    from pathlib import Path

    from lab.instruments.retrieval import Index, check_queries, check_shape
    check_shape(args.window, args.stride, args.ctx)
    check_queries(args.queries)
    if args.backend == "browser":
        from lab.host import bench_browser
        chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
        try:
            out = bench_browser.retrieval_page(args.model, args.files, queries=args.queries, seed=args.seed,
                                               window=args.window, stride=args.stride, chromium=chromium, args=flags)
        except bench_browser.BenchError as exc:
            print(f"lab retrieval-eval: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(out, ensure_ascii=False))
        return 0
    files, _digests, _unreadable = _read_files(args.files, "lab retrieval-eval")
    _header, tok, engine, _timing = _load(args.model, args.ctx, args.disable)
    index = Index(engine, tok, window=args.window, stride=args.stride)

    def progress(done: int, total: int, seconds: float) -> None:
        print(f"\rlab retrieval-eval: {done:,}/{total:,} queries, {seconds:,.1f} s   ", end="", file=sys.stderr,
              flush=True)

    async def run():
        built, _refused = await _build(index, files, "lab retrieval-eval")
        recall = await index.recall(args.queries, args.seed, on_progress=progress)
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


def _lab(args):
    from lab.host.experiments import Lab
    return Lab.load(args.model, args.ctx, args.disable)


def _attribute(args) -> int:
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        ids = lab.encode(args.prompt)
        res = lab.attribute(ids, target)
    finally:
        lab.close()
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"target {target} {lab.piece(target)!r}: logit {res['logit']:.4f} at position {len(ids) - 1}")
    print(f"  embedding {res['embedding']:+.4f}")
    for r in res["rows"]:
        top = sorted(range(len(r["heads"])), key=lambda h: -abs(r["heads"][h]))[:3]
        print(f"  layer {r['layer']:3d}  attn {r['attn']:+.4f}  mlp {r['mlp']:+.4f}   heads "
              + ", ".join(f"{h}: {r['heads'][h]:+.3f}" for h in top))
    print(f"  remainder {res['remainder']:+.6f}")
    return 0


def _ints(text: str | None):
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def _progress(args):
    if args.json:
        return None
    return lambda done, total, seconds: print(f"\r{done}/{total} runs, {seconds:.1f} s", end="", file=sys.stderr,
                                              flush=True)


def _experiment_in_page(args, msg: dict) -> int:
    """`--backend browser`: the same experiment through the page's Experiments card (lab/host/bench_browser.py)."""
    from lab.host import bench_browser
    chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
    try:
        out = bench_browser.experiment_page(args.model, msg, chromium=chromium, args=flags)
    except bench_browser.BenchError as exc:
        print(f"lab {msg['kind']}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out, ensure_ascii=False))
    return 0


def _ablate(args) -> int:
    if args.backend == "browser":
        return _experiment_in_page(args, {"kind": "ablate", "prompt": args.prompt, "target": args.target,
                                          "what": args.block or "heads", "mode": args.mode, "heads": args.heads or "",
                                          "layers": "" if args.layer is None else str(args.layer)})
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        ids = lab.encode(args.prompt)
        layers = [args.layer] if args.layer is not None else None
        out = lab.ablate(ids, target, layers=layers, heads=_ints(args.heads), block=args.block, mode=args.mode,
                         on_progress=_progress(args))
    finally:
        lab.close()
    if args.json:
        print(json.dumps(out))
        return 0
    print(file=sys.stderr)
    print(f"target {target} {lab.piece(target)!r}: log-probability {out['base_logprob']:.4f} without ablation "
          f"({out['runs']} runs, {out['seconds']:.2f} s)")
    for r in sorted(out["rows"], key=lambda r: r["delta"])[:args.top]:
        what = f"head {r['head']:3d}" if r["head"] is not None else f"{args.block} block"
        print(f"  layer {r['layer']:3d} {what}: {r['logprob']:.4f} ({r['delta']:+.4f})")
    return 0


def _patch(args) -> int:
    if args.backend == "browser":
        return _experiment_in_page(args, {"kind": "patch", "clean": args.clean, "corrupt": args.corrupt,
                                          "target": args.target, "foil": args.foil or "", "site": args.site,
                                          "layers": args.layers or ""})
    lab = _lab(args)
    try:
        target = lab.token(args.target)
        foil = lab.token(args.foil) if args.foil else None
        clean, corrupt = lab.encode(args.clean), lab.encode(args.corrupt)
        out = lab.patch(clean, corrupt, target, foil, site=args.site, layers=_ints(args.layers),
                        on_progress=_progress(args))
        out["positions"] = [lab.piece(i) for i in clean]
    finally:
        lab.close()
    if args.json:
        print(json.dumps(out))
        return 0
    print(file=sys.stderr)
    print(f"target {lab.piece(target)!r} - foil {lab.piece(out['foil_id'])!r}: clean {out['clean_diff']:+.3f}, "
          f"corrupted {out['corrupt_diff']:+.3f}; recovery by ({args.site}, layer, position), {out['runs']} runs in "
          f"{out['seconds']:.2f} s:")
    print("layer " + " ".join(f"{p[:7]:>7s}" for p in out["positions"]))
    for layer, row in zip(out["layers"], out["recovery"]):
        print(f"{layer:5d} " + " ".join(f"{v:7.3f}" for v in row))
    if out["sanity"]:
        print(f"sanity: the last layer patched everywhere gives {out['sanity']['diff']:+.4f} "
              f"({'exactly' if out['sanity']['exact'] else 'NOT'} the clean run's)")
    return 0


def _steer(args) -> int:
    import math
    lab = _lab(args)
    try:
        ids = lab.encode(args.prompt)
        vector = lab.steering_vector([lab.encode(t) for t in args.plus], [lab.encode(t) for t in args.minus],
                                     args.layer)
        settings = _settings(args)
        plain = lab.generate(ids, args.n, settings)
        steered = lab.steer(ids, vector, args.layer, args.scale, args.n, settings)
    finally:
        lab.close()
    out = {"layer": args.layer, "scale": args.scale, "vector_norm": math.sqrt(float((vector * vector).sum())),
           "plain": plain.to_dict(), "steered": steered.to_dict()}
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print(f"steering vector at layer {args.layer}: norm {out['vector_norm']:.3f}, scale {args.scale}")
    print(f"--- plain\n{args.prompt}{plain.text}\n--- steered\n{args.prompt}{steered.text}")
    return 0


def _tokenize(args) -> int:
    from lab.format import gguf
    from lab.text.tokenizer import from_metadata
    tok = from_metadata(gguf.read_file(args.model).metadata)
    with open(args.file, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    ids = tok.encode(text)
    print(json.dumps(ids) if args.json else " ".join(map(str, ids)))
    return 0


def _bench(args) -> int:
    import tempfile
    from pathlib import Path

    from lab.host import bench
    ints = lambda s: tuple(int(v) for v in s.split(",") if v)
    if args.model == "kernels":
        from lab.format.ggml import BY_NAME
        types = list(dict.fromkeys(args.types.split(","))) if args.types else None
        shapes = list(dict.fromkeys(args.shapes.split(","))) if args.shapes else None
        if types and (unknown := [t for t in types if t not in {sh[0] for sh in bench.KERNEL_SHAPES}]):
            print(f"lab bench kernels: no shapes of type {', '.join(unknown)} (the table has "
                  f"{', '.join(dict.fromkeys(sh[0] for sh in bench.KERNEL_SHAPES))})", file=sys.stderr)
            return 2
        if types and shapes:    # every type asked at every shape asked, in the table or not
            try:
                dims = [tuple(int(v) for v in sh.split("x")) for sh in shapes]
                if any(len(d) != 2 or min(d) < 1 for d in dims):
                    raise ValueError
            except ValueError:
                print(f"lab bench kernels: --shapes {args.shapes}: each shape is ROWSxCOLS, e.g. 14336x4096",
                      file=sys.stderr)
                return 2
            if bad := [f"{t} {r}x{c}" for t in types for r, c in dims if c % BY_NAME[t].block]:
                print(f"lab bench kernels: a row must hold whole blocks: {', '.join(bad)}", file=sys.stderr)
                return 2
            picked = [(t, r, c) for t in types for r, c in dims]
        else:
            picked = [sh for sh in bench.KERNEL_SHAPES if (types is None or sh[0] in types)
                      and (shapes is None or f"{sh[1]}x{sh[2]}" in shapes)]
        if not picked:
            print(f"lab bench kernels: no shapes {args.shapes} of types {args.types or 'any'}", file=sys.stderr)
            return 2
        sizes = {str(1 << i): 1 << i for i in range(9)}      # powers of two, 1 to 256
        if args.wg and any(v not in sizes for v in args.wg.split(",")):
            print(f"lab bench kernels: --wg {args.wg}: powers of two from 1 to 256", file=sys.stderr)
            return 2
        wgs = tuple(sizes[v] for v in args.wg.split(",")) if args.wg else (None,)
        rows = bench.bench_kernels(picked, repeat=args.repeat, disable=args.disable, wgs=wgs)
        if args.json:
            print(json.dumps(rows))
        else:
            print(f"{'type':7s} {'rows x cols':>14s} {'MB':>8s} {'wg':>4s} {'matvec us':>10s} {'GB/s':>8s} "
                  f"{'GEMM us':>10s} {'GFLOP/s':>8s}")
            for r in rows:
                print(f"{r['type']:7s} {r['rows']:>7d}x{r['cols']:<6d} {r['weight_bytes'] / 1e6:8.2f} {r['wg']:>4d} "
                      f"{r['matvec_us']:10.1f} {r['matvec_gb_s']:8.2f} {r['matmul_us']:10.1f} "
                      f"{r['matmul_gflop_s']:8.1f}")
        return 0
    if args.backend == "browser":
        from lab.host import bench_browser, browser_args, models
        from lab.instruments.profile import REPS
        if args.synthetic and args.synthetic not in models.MODELS:
            print(f"lab bench: --synthetic {args.synthetic} has no real model to take the header and tokenizer from "
                  f"(the page chats): only {', '.join(models.MODELS)} run in the browser", file=sys.stderr)
            return 2
        chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
        try:
            with browser_args.model_file(args.model, args.synthetic) as path:
                res = bench_browser.bench_browser(path, prompts=ints(args.prompts or "32"),
                                                  decode_tokens=args.decode or 8, chromium=chromium, args=flags,
                                                  int8=args.int8, profile=REPS if args.profile else 0,
                                                  warm_gpu_s=args.warm_gpu, kv=args.kv)
        except bench_browser.BenchError as exc:
            print(f"lab bench: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(res, indent=None if args.json else 2))
        return 0
    if args.backend == "wllama":
        from lab.host import bench_browser, bench_wllama, browser_args, models
        if args.synthetic and args.synthetic not in models.MODELS:
            print(f"lab bench: --synthetic {args.synthetic} has no real model to take the header and tokenizer from "
                  f"(wllama takes text prompts): only {', '.join(models.MODELS)} run in the browser", file=sys.stderr)
            return 2
        if args.profile or args.int8 or args.kv != "f32":
            print("lab bench: --profile, --int8 and --kv are the lab's; wllama has none of them (its cache is f16)",
                  file=sys.stderr)
            return 2
        chromium, flags = bench_browser.browser_command(args.chromium, args.chromium_flags, args.chromium_flag)
        try:
            with browser_args.model_file(args.model, args.synthetic) as path:
                res = bench_wllama.bench_wllama(path, prompts=ints(args.prompts or "32"),
                                                decode_tokens=args.decode or 8, chromium=chromium, args=flags,
                                                warm_gpu_s=args.warm_gpu)
        except bench_browser.BenchError as exc:
            print(f"lab bench: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(res, indent=None if args.json else 2))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if args.synthetic:
            from lab.host import synthetic
            if args.synthetic not in synthetic.SPECS:
                print(f"lab bench: --synthetic {args.synthetic!r} is not one of {', '.join(synthetic.SPECS)}",
                      file=sys.stderr)
                return 2
            # with the placeholder vocabulary: the same bytes llama.cpp benchmarks (scripts/device_llamacpp.sh)
            path = synthetic.write(args.synthetic, Path(tmp) / f"{args.synthetic}.gguf", vocab=True)
        if args.profile:
            t = max(ints(args.prompts or "1"))
            for row in bench.profile_step(path, t=t, context=max(ints(args.contexts) or (0,)), disable=args.disable,
                                          warm_gpu_s=args.warm_gpu, kv=args.kv):
                print(json.dumps(row))
            return 0
        res = bench.bench_model(path, prompts=ints(args.prompts or "128,512"), contexts=ints(args.contexts),
                                decode_tokens=args.decode or 32, max_batch=args.batch, disable=args.disable,
                                warm_gpu_s=args.warm_gpu, kv=args.kv)
    print(json.dumps(res, indent=None if args.json else 2))
    return 0


def main(argv: list[str] | None = None) -> int:
    from lab.host.browser_args import add_browser_options
    from lab.instruments import retrieval
    from lab.settings import DEFAULT_CTX, PERPLEXITY_CTX, Settings
    sampling = Settings()        # the defaults' one home

    def sampling_flags(s) -> None:
        """The sampler's flags and -n, as `lab generate` and `lab ask` take them (read back by `_settings`)."""
        s.add_argument("--greedy", action="store_true")
        s.add_argument("--temperature", type=float, default=sampling.temperature)
        s.add_argument("--top-p", type=float, default=sampling.top_p)
        s.add_argument("--top-k", type=int, default=sampling.top_k)
        s.add_argument("--min-p", type=float, default=sampling.min_p)
        s.add_argument("--seed", type=int, default=sampling.seed)
        s.add_argument("-n", type=int, default=128, help="maximum new tokens")

    p = argparse.ArgumentParser(prog="lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="serve the lab page on this machine (assets only; inference runs in the browser)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", default=None, help="GGUF served as the default model (default: the cached SmolLM2)")
    s.set_defaults(fn=_serve)

    s = sub.add_parser("info", help="summarize a GGUF file from its header")
    s.add_argument("model")
    s.set_defaults(fn=_info)

    s = sub.add_parser("selftest", help="run the GPU self-test through the native backend")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_selftest)

    s = sub.add_parser("generate", help="generate text natively (wgpu) with the same engine the page runs")
    s.add_argument("model")
    s.add_argument("--prompt", required=True)
    s.add_argument("--chat", action="store_true", help="render the prompt as one user message with the chat template")
    s.add_argument("--system", default=None, help="system message for --chat (default: the template's own)")
    sampling_flags(s)
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens")
    s.add_argument("--json", action="store_true")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_generate)

    s = sub.add_parser("tokenize", help="token ids of a text file (no BOS, no special-token parsing)")
    s.add_argument("model")
    s.add_argument("file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_tokenize)

    s = sub.add_parser("perplexity", help="perplexity of a text file in windows, as llama.cpp's llama-perplexity")
    s.add_argument("model")
    s.add_argument("text", help="a UTF-8 text file (at least 2 x --ctx tokens)")
    s.add_argument("--ctx", type=int, default=PERPLEXITY_CTX, help="window length in tokens (llama-perplexity's -c)")
    s.add_argument("--chunks", type=int, default=None, help="score at most this many windows (llama's --chunks)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_perplexity)

    s = sub.add_parser("index", help="index text files for `lab ask`: windows embedded by the model itself, saved to a "
                                     "file (format: lab/host/index_file.py)")
    s.add_argument("model")
    s.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text or Markdown; a file that is not is refused "
                                                            "by name and the others indexed")
    s.add_argument("--out", required=True, metavar="INDEX", help="the index file to write")
    s.add_argument("--window", type=int, default=retrieval.WINDOW, help="tokens a window holds")
    s.add_argument("--stride", type=int, default=retrieval.STRIDE, help="tokens between the starts of two windows")
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens (more than --window)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_index)

    s = sub.add_parser("ask", help="answer a question from an index's passages: prints the hits, the prompt verbatim "
                                   "and the answer")
    s.add_argument("model", help="the GGUF that made the index")
    s.add_argument("--index", required=True, help="a file `lab index` wrote with this model")
    s.add_argument("--question", required=True)
    s.add_argument("-k", type=int, default=retrieval.ASK_K,
                   help=f"passages packed into the prompt (at most {retrieval.MAX_K})")
    s.add_argument("--no-retrieval", action="store_true",
                   help="answer the question alone, without passages (the index is still checked; compare "
                        "with the same --seed)")
    sampling_flags(s)
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens (prompt and answer)")
    s.add_argument("--json", action="store_true",
                   help='print {"hits": [{rank, file, window, start_token, end_token, score, text}], "prompt", '
                        '"answer"}')
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_ask)

    s = sub.add_parser("retrieval-eval", help="recall@1 and @5 of an index of the files on random crops of them "
                                              "(in memory, nothing saved)")
    s.add_argument("model")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--queries", type=int, default=retrieval.RECALL_QUERIES, help=f"random {retrieval.CROP}-token crops asked")
    s.add_argument("--seed", type=int, default=0, help="seed of the crops")
    s.add_argument("--window", type=int, default=retrieval.WINDOW, help="tokens a window holds")
    s.add_argument("--stride", type=int, default=retrieval.STRIDE, help="tokens between the starts of two windows")
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens (more than --window)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.add_argument("--backend", choices=("native", "browser"), default="native",
                   help="browser: the page in headless Chromium, indexing through the retrieval card")
    add_browser_options(s)
    s.set_defaults(fn=_retrieval_eval)

    s = sub.add_parser("ablate", help="the target's log-probability with attention heads, or an attention or MLP "
                                      "block, zeroed or mean-ablated (lab/instruments/experiments.py)")
    s.add_argument("model")
    s.add_argument("--prompt", required=True, help="raw text (BOS as the vocabulary adds it; no chat template)")
    s.add_argument("--target", required=True, help="one token: its text (with its leading space) or #ID")
    s.add_argument("--layer", type=int, default=None, help="one layer (default: every layer)")
    s.add_argument("--heads", default=None, help="query heads, comma-separated (default: every head)")
    s.add_argument("--block", choices=("attn", "mlp"), default=None, help="a whole block per layer instead of heads")
    s.add_argument("--mode", choices=("zero", "mean"), default="zero", help="mean: the site's mean over the prompt")
    s.add_argument("--top", type=int, default=20, help="rows printed (the largest drops first); --json has all")
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens")
    s.add_argument("--json", action="store_true",
                   help='print {"target_id", "base_logprob", "rows": [{"layer", "head", "logprob", "delta"}]}')
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.add_argument("--backend", choices=("native", "browser"), default="native",
                   help="browser: the page in headless Chromium, through the Experiments card's message (JSON "
                        "with the sweep's seconds, twice: cold, then warm)")
    add_browser_options(s)
    s.set_defaults(fn=_ablate)

    s = sub.add_parser("patch", help="activation patching: the recovery of the target-foil logit difference when one "
                                     "(layer, position) of the corrupted run takes the clean run's values")
    s.add_argument("model")
    s.add_argument("--clean", required=True)
    s.add_argument("--corrupt", required=True, help="as many tokens as --clean")
    s.add_argument("--target", required=True, help="one token: its text (with its leading space) or #ID")
    s.add_argument("--foil", default=None, help="one token (default: the corrupted run's top token)")
    s.add_argument("--site", choices=("resid", "attn", "mlp"), default="resid",
                   help="resid: the residual after block L (l_out-L); attn: the attention output before its "
                        "projection; mlp: the FFN's hidden after the GLU")
    s.add_argument("--layers", default=None, help="layers, comma-separated (default: every layer)")
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens")
    s.add_argument("--json", action="store_true",
                   help='print {"target_id", "foil_id", "clean_diff", "corrupt_diff", "positions", "layers", '
                        '"recovery": [[layer][position]]}')
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.add_argument("--backend", choices=("native", "browser"), default="native",
                   help="browser: the page in headless Chromium, through the Experiments card's message (JSON "
                        "with the sweep's seconds, twice: cold, then warm)")
    add_browser_options(s)
    s.set_defaults(fn=_patch)

    s = sub.add_parser("steer", help="a steering vector (mean residual after --layer over --plus prompts minus "
                                     "over --minus prompts) added times --scale at every position: the steered and "
                                     "plain replies with the same sampler settings")
    s.add_argument("model")
    s.add_argument("--prompt", required=True, help="raw text (BOS as the vocabulary adds it; no chat template)")
    s.add_argument("--plus", action="append", required=True, help="a prompt of the direction (repeatable)")
    s.add_argument("--minus", action="append", required=True, help="a prompt of the opposite (repeatable)")
    s.add_argument("--layer", type=int, required=True, help="the residual after this block (l_out-L)")
    s.add_argument("--scale", type=float, default=4.0, help="times the vector (negative: the other way)")
    sampling_flags(s)
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens")
    s.add_argument("--json", action="store_true",
                   help='print {"layer", "scale", "vector_norm", "plain", "steered"} (each reply as `lab generate '
                        '--json` prints it)')
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_steer)

    s = sub.add_parser("attribute", help="direct logit attribution: each layer's attention (and each head) and MLP "
                                         "share of one token's logit at the last position (lab/instruments/experiments.py)")
    s.add_argument("model")
    s.add_argument("--prompt", required=True, help="raw text (BOS as the vocabulary adds it; no chat template)")
    s.add_argument("--target", required=True, help="one token: its text (with its leading space) or #ID")
    s.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="KV cache length in tokens")
    s.add_argument("--json", action="store_true",
                   help='print {"target_id", "logit", "embedding", "rows": [{"layer", "attn", "mlp", "heads"}], '
                        '"remainder"}')
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_attribute)

    s = sub.add_parser("bench", help="measure load, prefill and decode speed (or `kernels`), natively or in the page")
    s.add_argument("model", nargs="?", default="", help="a GGUF file, or `kernels`")
    s.add_argument("--profile", action="store_true",
                   help="GPU time of one step by kernel family (timestamp queries): decode with --prompts 1, else a "
                        "prefill of the largest --prompts, at the largest --contexts (browser: after the turns, the "
                        "page's prefill of the largest prompt up to its step, and decode at the shortest and longest "
                        "turn's context; add --chromium-flag=--enable-webgpu-developer-features, or Chromium rounds "
                        "timestamps to 100 us)")
    s.add_argument("--synthetic", metavar="NAME",
                   help="benchmark a random GGUF with this model's exact tensor shapes and types, a name of "
                        "lab/host/synthetic.py's SPECS (an unknown name prints them all); browser: the cached real "
                        "model's header and tokenizer over random blocks (lab/host/sameshape.py), smollm2, qwen2.5 and "
                        "gemma3 only (the others: lab bench FILE --backend browser on a written file)")
    s.add_argument("--backend", choices=("native", "browser", "wllama"), default="native",
                   help="browser: headless Chromium driving the real page, see lab/host/bench_browser.py; wllama: "
                        "the browser peer (llama.cpp in wasm) in the same browser, see lab/host/bench_wllama.py")
    add_browser_options(s)
    s.add_argument("--prompts", default=None, help="prefill lengths (default 128,512; browser: 32, chat template "
                                                   "included; wllama: 32, raw text of exactly that many tokens)")
    s.add_argument("--contexts", default="0,512,2048",
                   help="decode positions (native); one past the model's context_length is skipped, with a line on "
                        "stderr")
    s.add_argument("--decode", type=int, default=None,
                   help="tokens timed at each context (default 32; browser, wllama: 8)")
    s.add_argument("--batch", type=int, default=None, help="prefill chunk (tokens per step)")
    s.add_argument("--int8", action="store_true",
                   help="browser: load with the tensor-core prefill (adapters with int8 subgroup matrices)")
    s.add_argument("--kv", choices=("f32", "f16"), default="f32",
                   help="the KV cache's element type (f16: half the memory, each value rounded to f16; native and "
                        "browser)")
    s.add_argument("--warm-gpu", type=float, default=0, metavar="SECONDS",
                   help="keep the GPU busy this long before each measured prefill, decode or profile, as llama-bench's "
                        "warm-up run does (an idle GPU lowers its clocks; browser, 0: turns as typed after a pause)")
    s.add_argument("--repeat", type=int, default=20, help="kernels: dispatches per timed pass")
    s.add_argument("--types", default="", help="kernels: only these weight types (comma-separated, e.g. Q4_K,Q6_K)")
    s.add_argument("--shapes", default="",
                   help="kernels: rows x cols (comma-separated, e.g. 14336x4096): alone, the table's rows of these "
                        "shapes; with --types, every one of those types at every one of these shapes")
    s.add_argument("--wg", default="",
                   help="kernels: matvec threads a workgroup, comma-separated (each a row of the table; default: "
                        "lab.ops.matmul.matvec_wg's choice)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_bench)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except Exception as exc:  # one clear line for the user, not a traceback
        from lab.engine.engine import EngineError
        from lab.format.gguf import GGUFError
        from lab.format.model import ModelError
        from lab.gpu import GpuError
        if isinstance(exc, (GGUFError, GpuError, ModelError, EngineError, OSError, ValueError)):
            print(f"lab {args.cmd}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
