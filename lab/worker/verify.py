"""The worker's side of the verification card (Pyodide only; lab/worker/router.py routes "verify" and "verify-kernels"
here; the card is web/verify.js).

    verify {file, seq}      the loaded file's content hash (its header and sampled tensor bytes, read by File.slice),
                            its references looked up in /reference/index.json, the replay and comparison
                            (lab.instruments.verify.run) -> "verify" {seq, hash, result | null}
    verify-kernels {seq}    the kernel fixtures (/reference/kernels.json) through lab.instruments.kernelcheck, compared
                            in pure Python (lab.instruments.verify.run_kernels) -> "verify-kernels" {seq, rows,
                            adapter, buffers}

The replay writes the engine's KV cache from position 0, so the chat's cache is dropped afterwards (the next turn
prefills its prompt again); it uses only the engine's own buffers, all of kind CONVERSATION, and the kernel checks
make their own and free them. The read-back staging buffers are cleared after either.
"""

from __future__ import annotations

import json

import js

from lab.instruments import verify
from lab.worker.state import Worker, clear_staging


async def fetch_bytes(url: str) -> bytes:
    resp = await js.fetch(url)
    if not resp.ok:
        raise RuntimeError(f"{url}: HTTP {resp.status}")
    return (await resp.arrayBuffer()).to_bytes()


async def file_hash(file, data_offset: int) -> str:
    size = int(file.size)
    slices = []
    for off, n in verify.hash_ranges(size, data_offset):
        slices.append((await file.slice(off, off + n).arrayBuffer()).to_bytes())
    return verify.content_hash(size, slices)


async def run(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    file = msg["file"]
    if int(file.size) != lo.header.file_size:
        raise RuntimeError("the file given is not the one loaded")
    digest = await file_hash(file, lo.header.data_offset)
    index = json.loads(await fetch_bytes("/reference/index.json"))
    entry = verify.find(index, digest)
    reply = {"type": "verify", "seq": msg["seq"], "hash": digest, "result": None}
    if entry is None:
        w.post(reply)
        return
    w.post({"type": "verify-progress", "seq": msg["seq"], "model": entry["model"],
            "prompt": len(entry["prompt_ids"]), "steps": 1 + len(entry["references"]["exact"]["greedy"])})

    async def fetch(name: str) -> bytes:
        return await fetch_bytes(f"/reference/{name}")

    try:   # the replay overwrites the cache the chat's session thinks it holds: run() resets that session
        result = await verify.run(lo.engine, lo.tokenizer, entry, fetch, chat_session=lo.session)
    finally:
        clear_staging(lo.engine.device)
    w.post({**reply, "result": result, "kv_used": 0})


async def run_kernels(msg: dict, w: Worker) -> None:
    device = w.device()
    cases = json.loads(await fetch_bytes("/reference/kernels.json"))["cases"]
    kernels = w.kernels()
    before = len(device.buffers)
    try:
        rows = await verify.run_kernels(device, kernels, cases)
    finally:
        clear_staging(device)
    w.post({"type": "verify-kernels", "seq": msg["seq"], "rows": rows, "adapter": device.info.summary(),
            "buffers": {"before": before, "after": len(device.buffers)}})
