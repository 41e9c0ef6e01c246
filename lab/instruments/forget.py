"""Forget: clear every GPU buffer that holds conversation-derived data, and prove it by reading each one back.

The buffers are found by kind in the device's registry (`device.buffers`, kind CONVERSATION: KV caches,
activations, logits, sampling scratch, probe outputs, the step uniform, the read-back staging buffer),
never from a hand-made list, so a buffer added later is covered as soon as it is registered with its kind.

Order, because reads go through a staging buffer that is itself conversation data:
  1. size the staging buffers now (a larger read later would replace one mid-walk), then list the buffers;
  2. before: read the staging buffers first, by mapping them (every other read overwrites them), then the rest;
  3. clear the rest, read them back (through staging);
  4. clear the staging buffers last and read them by mapping them.
The report counts non-zero 32-bit words before and after; `wiped` is true only when there was something to wipe
and nothing is left. Natively `read_sync` (benchmarks, tests) reads through wgpu-py's own staging buffer, made
and dropped inside `read_buffer`: outside the registry, and outside what this module can check (docs/privacy.md).

The Python caches that keep pieces of typed text for speed (the BPE tokenizer's chunk cache, the pre-tokenizer's
per-character tables) are the tokenizer's to drop (`Tokenizer.drop_caches`); the caller drops them and the session's
token lists itself.

What it does not know: sessions, or the page (it clears its own DOM).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from lab import gpu


def nonzero_words(raw: bytes) -> int:
    """Non-zero 32-bit little-endian words in raw (len a multiple of 4), at C speed in CPython and Pyodide alike:
    OR the four byte lanes as big integers, so a word's byte is non-zero iff the word is, then count zero bytes."""
    n = len(raw) // 4
    if n == 0:
        return 0
    lanes = 0
    for k in range(4):
        lanes |= int.from_bytes(raw[k::4], "little")
    return n - lanes.to_bytes(n, "little").count(0)


@dataclass
class Wiped:
    label: str
    size: int           # bytes
    before: int         # non-zero words before the wipe
    after: int          # non-zero words after it


@dataclass
class Report:
    buffers: list[Wiped] = field(default_factory=list)
    ms: float = 0.0

    @property
    def before(self) -> int:
        return sum(b.before for b in self.buffers)

    @property
    def after(self) -> int:
        return sum(b.after for b in self.buffers)

    @property
    def wiped(self) -> bool:
        """Something was there, and nothing is left."""
        return self.before > 0 and self.after == 0

    @property
    def status(self) -> str:
        if self.after:
            return "failed"
        return "wiped" if self.before else "nothing"

    def to_dict(self) -> dict:
        return {"buffers": len(self.buffers), "bytes": sum(b.size for b in self.buffers), "before": self.before,
                "after": self.after, "wiped": self.wiped, "status": self.status, "ms": round(self.ms, 1),
                "items": [{"label": b.label, "size": b.size, "before": b.before, "after": b.after}
                          for b in self.buffers if b.before or b.after]}


def conversation_buffers(device: gpu.Device) -> list[gpu.Buffer]:
    return [b for b in device.buffers if b.kind == gpu.CONVERSATION]


async def wipe(device: gpu.Device, *, on_after=None, skip: str | None = None, leave=()) -> Report:
    """`on_after(buffer, raw, before, after)` sees each non-staging buffer's bytes as read back after the wipe (the KV
    panel redraws its picture from them, lab/instruments/kvview.py). `skip` is a test hook: the buffer with that label
    is left uncleared, so a test can prove that the check, and the page, catch a buffer the wipe missed. `leave`: the
    buffers a new chat leaves as they are (the user's files: the retrieval index, a trained adapter), neither read nor
    cleared nor counted; Forget leaves none."""
    t0 = time.perf_counter()
    left = {id(b) for b in leave}
    found = [b for b in conversation_buffers(device) if id(b) not in left]
    if skip is not None and skip not in {b.label for b in found}:
        # a hook that silently skipped nothing would let a stale label pass a test as a clean wipe
        raise ValueError(f"skip: no conversation buffer is labelled {skip!r}")
    staging = device.staging(max((b.size for b in found), default=0)) if found else []
    conv = [b for b in conversation_buffers(device) if id(b) not in left]   # again: sizing may replace a staging one
    direct = [b for b in conv if b in staging]
    rest = [b for b in conv if b not in staging]
    before = {}
    for b in direct + rest:
        before[id(b)] = nonzero_words(await device.read(b))
    after = {}
    for b in rest:
        if b.label != skip:
            device.clear(b)
    for b in rest:
        raw = await device.read(b)
        after[id(b)] = nonzero_words(raw)
        if on_after is not None:
            on_after(b, raw, before[id(b)], after[id(b)])
    for b in direct:
        device.clear(b)
        after[id(b)] = nonzero_words(await device.read(b))
    report = Report([Wiped(b.label, b.size, before[id(b)], after[id(b)]) for b in conv])
    report.ms = (time.perf_counter() - t0) * 1e3
    return report
