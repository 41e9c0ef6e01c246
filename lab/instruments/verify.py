"""Does the engine match llama.cpp? The page's verification card, natively and in the worker (no numpy).

    content_hash   which file is this, by its bytes (never its name): SHA-256 over the file size, the header
                   (everything before the tensor data) and SAMPLES fixed-size slices at fixed fractions of the
                   tensor data. The reference index (reference/index.json, scripts/make_verify_fixtures.py)
                   maps that hash to a model's fixtures.
    replay         the fixture's prompt through the engine's prefill steps (the ones a turn runs), the final
                   logits read back, then a greedy continuation by lab.engine.session's own loop: decode steps, each
                   reading the K/V the earlier ones wrote.
    compare        our final logits and continuation against one llama.cpp reference: max |diff|, RMS of the
                   diff, argmax, continuation; each row with its verdict and its tolerance.

Two references per model (see docs/correctness.md): "exact" is llama.cpp on an F32 copy of the weights with an F32 KV
cache (no rounding of its own: the function we compute), "quant" is llama.cpp's CPU path on the quantized file (8-bit
activations in its quantized dot products, an f16 KV cache), which moves logits by up to ~1.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
from array import array
from dataclasses import asdict, dataclass

from lab.engine.session import Session, common_prefix
from lab.format.gguf import read_file
from lab.instruments import kernelcheck
from lab.settings import Settings

SAMPLES = 9                 # slices of the tensor data hashed, at fractions 0, 1/8, ..., 1 of it
SAMPLE_BYTES = 1 << 16
HASH_TAG = b"llm-lab verify content v1\0"
N_GEN = 16                  # greedy continuation compared

# Tolerances, each next to its reason (the card shows them).
EXACT_REL = 1e-3            # vs exact: max |diff| <= 1e-3 x max |logit| of the reference. Both sides compute in f32 from
#                             the same weights and differ only in summation order (measured ~1e-6 relative); gemma3's
#                             GELU is an f16 lookup table in llama.cpp (~7e-3 absolute on logits ~30, i.e. 2.5e-4).
#                             A real bug (a RoPE base off by 1%, an RMSNorm epsilon 10x off) moves logits by >= 1e-2.
QUANT_MAX = 4.0             # vs the quantized CPU path: max |diff| loose bound. Its 8-bit activations and f16 KV cache
#                             move logits by up to ~1 (SmolLM2), ~3 (gemma3) from exact arithmetic; a real bug moves
#                             them by 10-100 (tests/engine/test_reference.py lists the measured ones).
NEAR_TIE = {"exact": 0.01, "quant": 1.0}   # the reference's top-2 gap under which a different argmax is a tie, not a
#                             bug: f32 summation order (exact), the CPU path's rounding noise (quant; the largest gap
#                             measured to flip was 0.39, tests/engine/test_reference.py)

EXPLAIN = ("llama.cpp's CPU path quantizes activations to 8 bits for its quantized dot products and keeps the KV "
           "cache in f16, which moves logits by up to ~1 from exact arithmetic; on an F32 copy of the weights with an "
           "F32 KV cache it rounds nothing of its own and computes the same function as this engine.")


# -- which file is this ------------------------------------------------------------------------------------------
def hash_ranges(file_size: int, data_offset: int) -> list[tuple[int, int]]:
    """(offset, size) of every slice the content hash reads: the header, then SAMPLES slices of the tensor data
    (all of it when it is small)."""
    ranges = [(0, data_offset)]
    span = file_size - data_offset
    if span <= SAMPLES * SAMPLE_BYTES:
        ranges.append((data_offset, span))
    else:
        ranges += [(data_offset + (span - SAMPLE_BYTES) * k // (SAMPLES - 1), SAMPLE_BYTES) for k in range(SAMPLES)]
    return ranges


def content_hash(file_size: int, slices) -> str:
    """SHA-256 (hex) of the bytes at hash_ranges, in order. A file with the same name and other bytes in its header
    or in a sampled slice hashes differently; a change elsewhere in the weights does not (a sample, not a checksum:
    reading all of a 500 MB file to open a card would cost seconds)."""
    h = hashlib.sha256(HASH_TAG + int(file_size).to_bytes(8, "little"))
    for s in slices:
        h.update(s)
    return h.hexdigest()


def file_content_hash(path) -> str:
    """content_hash of a local file (the native side and scripts/make_verify_fixtures.py)."""
    header = read_file(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        def read(off: int, n: int) -> bytes:
            f.seek(off)
            return f.read(n)
        return content_hash(size, [read(o, n) for o, n in hash_ranges(size, header.data_offset)])


def find(index: dict, digest: str) -> dict | None:
    """The reference index's entry for this content hash, or None: no reference for this file."""
    return index.get("models", {}).get(digest)


# -- comparing -----------------------------------------------------------------------------------------------------
@dataclass
class Row:
    reference: str          # "exact" or "quant"
    check: str              # "max |diff|", "RMS diff", "argmax", "greedy 16"
    value: str              # what was measured, as shown
    verdict: str            # "pass", "fail", "near-tie" (a difference the tolerance allows), "reported"
    tolerance: str          # the bound and its reason, as shown
    number: float | None = None    # the measured number (tests read it)


def top2(v) -> tuple[int, float]:
    """argmax (lowest index on ties, as the engine's argmax) and the gap to the runner-up."""
    best, second, at = -math.inf, -math.inf, 0
    for i, x in enumerate(v):
        if x > best:
            best, second, at = x, best, i
        elif x > second:
            second = x
    return at, best - second


def diff_stats(ours, ref) -> tuple[float, float, float]:
    """max |ours - ref|, RMS of the difference, max |ref| (inf when anything is non-finite)."""
    if len(ours) != len(ref):
        raise ValueError(f"{len(ours)} logits against a reference of {len(ref)}: another vocabulary")
    mx = ss = mref = 0.0
    for a, b in zip(ours, ref):
        d = abs(a - b)
        if d > mx or math.isnan(d):
            mx = math.inf if math.isnan(d) else d
        ss += d * d
        mref = max(mref, abs(b))
    rms = math.sqrt(ss / len(ref)) if ref else 0.0
    return mx, (rms if math.isfinite(rms) else math.inf), mref


def compare(kind: str, ours_logits, ours_ids: list[int], ref: dict, ref_logits) -> list[Row]:
    """Rows for one reference. ref: the index's entry for it (greedy ids, top2_gap per step); the logits are f32
    sequences (array('f') or a list) over the full vocabulary."""
    mx, rms, mref = diff_stats(ours_logits, ref_logits)
    our_top, _ = top2(ours_logits)
    ref_top, ref_gap = top2(ref_logits)
    rows = []
    if kind == "exact":
        bound = EXACT_REL * mref
        rows.append(Row(kind, "max |diff|", f"{mx:.3g}", "pass" if mx <= bound else "fail",
                        f"<= {bound:.3g} (1e-3 x max |logit| {mref:.3g}): f32 on both sides, only the summation "
                        f"order differs", mx))
        rows.append(Row(kind, "RMS diff", f"{rms:.3g}", "pass" if rms <= bound else "fail",
                        f"<= {bound:.3g}, as max |diff|", rms))
    else:
        rows.append(Row(kind, "max |diff|", f"{mx:.3g}", "pass" if mx <= QUANT_MAX else "fail",
                        f"<= {QUANT_MAX:g} (loose): 8-bit activations and an f16 KV cache move logits by up to ~1-3; "
                        f"a real bug moves them by 10+", mx))
        rows.append(Row(kind, "RMS diff", f"{rms:.3g}", "reported" if math.isfinite(rms) else "fail",
                        "reported: the CPU path's rounding noise spread over the vocabulary", rms))
    tie = NEAR_TIE[kind]
    if our_top == ref_top:
        verdict = "pass"
    else:
        verdict = "near-tie" if ref_gap < tie else "fail"
    rows.append(Row(kind, "argmax", f"{our_top} vs {ref_top} (reference top-2 gap {ref_gap:.3g})", verdict,
                    f"identical unless the reference's top-2 gap < {tie:g} (a near-tie)", float(our_top == ref_top)))
    want = list(ref["greedy"])
    same = common_prefix(ours_ids, want)
    identical = ours_ids == want
    value = (f"identical ({len(want)} tokens)" if identical else
             f"{same} of {len(want)} identical, then {ours_ids[same] if same < len(ours_ids) else 'end'} vs "
             f"{want[same] if same < len(want) else 'end'}")
    gaps = ref.get("top2_gap", [])
    first_gap = gaps[same] if not identical and same < len(gaps) else None
    if first_gap is not None:
        value += f" (reference top-2 gap there {first_gap:.3g})"
    if kind == "exact":
        if identical:
            verdict = "pass"
        else:
            verdict = "near-tie" if first_gap is not None and first_gap < tie else "fail"
        tol = f"identical ids; a divergence allowed only at a step whose reference top-2 gap < {tie:g}"
    else:
        verdict = "pass" if identical else "reported"
        tol = "compared and reported: near-ties in the CPU path's noise may send greedy decoding elsewhere"
    rows.append(Row(kind, f"greedy {len(want)}", value, verdict, tol, float(same)))
    return rows


def passed(rows: list[Row]) -> bool:
    return all(r.verdict != "fail" for r in rows)


def rows_dict(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]


def floats(raw: bytes) -> array:
    """Little-endian f32 bytes as an array('f') (every platform the lab runs on is little-endian)."""
    a = array("f")
    a.frombytes(raw)
    return a


# -- running ---------------------------------------------------------------------------------------------------------
async def replay(engine, tokenizer, prompt: list[int], n_gen: int = N_GEN) -> tuple[bytes, list[int]]:
    """The prompt through the engine's prefill steps (max_batch tokens each, as a turn prefills), the final logits
    read back; then the continuation by lab.engine.session's greedy loop, from a session that holds all but the last
    prompt token (it runs that token again as a decode step at the same position, as a turn would, then n_gen decode
    steps that read the prefill's K/V). Returns (final logits as raw f32 bytes, generated ids, an end-of-generation id
    included as the fixtures include it). The prefill path and the decode path are both held to llama.cpp: the
    logits by the prefill's last row, the 16 greedy ids by decode steps (a bug in either moves one of them).

    It overwrites the KV cache from position 0: the caller must drop the chat session's cache afterwards."""
    if not prompt or len(prompt) + n_gen > engine.n_ctx:
        raise ValueError(f"a prompt of {len(prompt)} tokens plus {n_gen} does not fit the context of {engine.n_ctx}")
    # an int8 engine's prefill rounds its inputs to 8 bits (lab.ops.matmul.matmul_i8): the card holds the exact
    # path, so there the prompt runs as decode steps, one token at a time
    step = 1 if engine.int8_prefill else engine.max_batch
    for pos in range(0, len(prompt), step):
        chunk = prompt[pos:pos + step]
        engine.step(chunk, pos)
    n_vocab = engine.cfg.n_vocab
    last_row = len(chunk) - 1 if engine.logits_all else 0     # an engine with every row's logits keeps them all
    logits = await engine.device.read(engine.scratch.logits, 4 * n_vocab * last_row, 4 * n_vocab)
    # no tokenizer: the loop runs all n_gen steps; the ids are cut after an end-of-generation id below, since the
    # session leaves out the id it stops at and the fixtures keep it
    session = Session(engine, None)
    session.cached = list(prompt[:-1])
    res = await session.generate(list(prompt), Settings(greedy=True), n_gen)
    eog = tokenizer.eos_ids if tokenizer is not None else frozenset()
    ids = []
    for t in res.ids:
        ids.append(t)
        if t in eog:
            break
    return logits, ids


async def run(engine, tokenizer, entry: dict, fetch, chat_session=None) -> dict:
    """Replay entry's prompt and compare with both references. fetch(name) -> bytes gives a fixture file's bytes
    (disk natively, the server in the browser). chat_session: the conversation's session on this engine, whose cache
    the replay overwrites: it is reset, so that its next turn prefills again instead of reusing the replay's K/V."""
    import time
    t0 = time.perf_counter()
    try:
        logits_raw, ids = await replay(engine, tokenizer, entry["prompt_ids"],
                                       len(entry["references"]["exact"]["greedy"]))
    finally:
        if chat_session is not None:
            chat_session.reset()
    t1 = time.perf_counter()
    ours = floats(logits_raw)
    rows = []
    for kind in ("exact", "quant"):
        ref = entry["references"][kind]
        rows += compare(kind, ours, ids, ref, floats(await fetch(ref["logits"])))
    return {"model": entry["model"], "prompt_ids": entry["prompt_ids"], "ids": ids, "rows": rows_dict(rows),
            "ok": passed(rows), "replay_s": round(t1 - t0, 2), "compare_s": round(time.perf_counter() - t1, 2),
            "explain": EXPLAIN}


# -- the kernel checks (reference/kernels.json, scripts/make_kernel_fixtures.py) --------------------------------------
def kernel_error(case: dict, got: bytes) -> float:
    """max |got - want| / scale over the case's output (want and scale from the numpy oracles); a scale of 0 asks for
    the very same bits. Pure Python: it runs in the worker."""
    import base64
    want_raw, scale = base64.b64decode(case["want"]), floats(base64.b64decode(case["scale"]))
    if len(got) != len(want_raw):
        return math.inf
    if case["dtype"] == "u32":
        return 0.0 if got == want_raw else math.inf
    g, w = floats(got), floats(want_raw)
    g_bits, w_bits = array("I", got), array("I", want_raw)
    err = 0.0
    for i in range(len(w)):
        s = scale[i]
        if s == 0.0:
            if g_bits[i] != w_bits[i]:
                return math.inf
            continue
        d = abs(g[i] - w[i])
        if not d <= err * s:          # NaN compares false: an output NaN is infinitely wrong
            e = d / s
            if math.isnan(e):
                return math.inf
            err = e
    return err


async def run_kernels(device, kernels, cases: list[dict]) -> list[dict]:
    """Run each fixture case through lab.instruments.kernelcheck (the engine's own op builders) and compare in pure Python."""
    rows = []
    for case in cases:
        spec = dict(case["spec"])
        spec["inputs"] = {k: base64.b64decode(v) for k, v in spec["inputs"].items()}
        r = await kernelcheck.run(device, kernels, spec)
        err = kernel_error(case, r["outputs"][case["output"]])
        rows.append({"name": case["name"], "trap": case["trap"], "error": err if math.isfinite(err) else None,
                     "tolerance": case["tolerance"], "tolerance_why": case["tolerance_why"],
                     "pass": err <= case["tolerance"], "kernels": r["kernels"]})
    return rows
