"""Retrieval with the loaded model's own embeddings: an index of the user's text files, a search, and its measured
recall. Everything runs on the engine that chats; nothing is trained.

- **Files.** `read_text(name, raw)` decodes one file or refuses it by name (empty, binary, invalid UTF-8); one bad
  file never drops the others (`Index.prepare` collects the refusals). Each file is tokenised once, without special
  tokens (a file holding `<|im_start|>` holds those characters), by the tokenizer's per-word path.
- **Windows.** A file's ids are cut into windows of `window` tokens every `stride` tokens (default 64 and 32, so each
  token sits in two windows); the last window ends at the file's end (`windows_of`).
- **An embedding** of a window: its ids run from position 0 (behind BOS when the vocabulary adds one, as a document
  starts) through the engine's own plan up to its final norm, llama.cpp's `result_norm`; the mean over the window's
  positions (BOS left out) of those rows, L2-normalised (wgsl/retrieval.wgsl `pool`). A window longer than the
  engine's batch runs in several steps, pooled across them. Windows are queued in blocks, each block submitted before
  the read-back after the previous one is awaited: the GPU never waits for the CPU, and a read about every `POLL_S`
  counts the windows done and lets the page's stop in.
  Packing several windows into one step would need a block-diagonal attention mask the attention kernel lacks.
- **The index** is one GPU matrix [n_windows, n_embd] f32, kind CONVERSATION (Forget wipes it and reads it back), and
  on the CPU the files' names, ids and the windows' spans (`Index.drop` empties them).
- **Search.** Queries are embedded the same way into rows of a [QUERY_ROWS, n_embd] buffer; one dispatch scores them
  all against the index (`score`: dot products of unit vectors, the cosines), then the sampler's top-k takes the best
  `min(MAX_K, n_windows)` of each row, sorted by score, ties by the lower window number (what a stable numpy sort of
  -score gives). A larger k than the index holds returns the whole index, ranked. Rows a stopped build never filled
  score -inf, which the top-k never picks.
- **Recall** (`Index.recall`): random CROP-token crops of the indexed files, each embedded as a question; a hit is a
  retrieved window of the same file covering at least half of the crop; recall@1 and recall@5 over the queries.
- **A tuned embedder** (`Index(adapter=)`, lab/instruments/embedder.py): the windows and questions run through plans
  of the index's own with that LoRA adapter's terms (Engine.plans_with), so the chat, which runs the engine's plans,
  never uses it. `adopt` takes files another index prepared, for a fresh index of the same files.

Running windows overwrites the engine's KV cache from position 0, as a perplexity run does: a caller with a chat
session must drop what it believed the cache held (lab/worker/retrieval.py, lab/host/cli/retrieval.py do).

What it does not know: the page, sessions, chat templates beyond `messages` (the caller renders and generates), and
the index file on disk (lab/host/index_file.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from lab import gpu, ops
from lab.ops import sample
from lab.ops.pool import ADD, NEG_INF, NORMALIZE, POOL, SCORES
from lab.ops.pool import pool as pool_op
from lab.ops.pool import score as score_op
from lab.ops.rows import Rows

WINDOW = 64             # tokens a window holds, by default
STRIDE = 32             # tokens between the starts of consecutive windows, by default
MIN_WINDOW = 8
MAX_WINDOW = 512
CROP = 24               # tokens of a recall query (a random crop of an indexed file)
MAX_K = sample.MAX_K    # most hits a search returns (the top-k kernel's bound)
ASK_K = 4               # passages packed into a prompt, by default
RECALL_QUERIES = 100    # crops a recall measurement asks, by default
MAX_QUERIES = 100_000   # and at most
QUERY_ROWS = 64         # queries embedded and scored in one dispatch (recall runs in chunks of this many)
MAX_PREPARED = 64       # prepared dispatch lists kept (one per step length seen: windows, questions, crops)
POLL_S = 0.25           # seconds of work between read-backs while indexing: progress, and the page's stop

SYSTEM = ("You answer questions about the user's files. Use only the numbered passages in the user's message; "
          "if they do not hold the answer, say so. Name the passages you used by their numbers.")


class RetrievalError(ValueError):
    """A file, a setting or a question the index cannot take; the message names what to change."""


# -- files and windows (pure: no GPU) ----------------------------------------------------------------------
def read_text(name: str, raw: bytes) -> str:
    """The text of a file, or RetrievalError naming it: empty, binary (a NUL byte, or mostly control characters),
    or not UTF-8 (with the offset of the first bad byte). A UTF-8 byte-order mark is dropped."""
    if not raw:
        raise RetrievalError(f"{name}: the file is empty")
    if b"\x00" in raw[:1 << 16]:
        raise RetrievalError(f"{name}: a binary file (it holds NUL bytes), not text: pick a .txt or .md file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RetrievalError(f"{name}: not UTF-8 text (byte {exc.start:,} is {raw[exc.start]:#04x}): save it as "
                             f"UTF-8 and pick it again") from None
    text = text.removeprefix("\ufeff")
    sample_ = text[:1 << 16]
    control = sum(1 for c in sample_ if ord(c) < 32 and c not in "\t\n\r\f")
    if control > len(sample_) // 10:
        raise RetrievalError(f"{name}: {control:,} control characters in its first {len(sample_):,}: a binary file, "
                             f"not text")
    if not text.strip():
        raise RetrievalError(f"{name}: holds only white space")
    return text


def windows_of(n_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, end) token spans covering ids 0 .. n_tokens-1: every `stride` tokens a window of `window`, the last
    one ending at n_tokens (a file shorter than a window is one window)."""
    if n_tokens <= window:
        return [(0, n_tokens)] if n_tokens else []
    spans = [(a, a + window) for a in range(0, n_tokens - window + 1, stride)]
    if spans[-1][1] < n_tokens:
        spans.append((n_tokens - window, n_tokens))
    return spans


def check_shape(window: int, stride: int, n_ctx: int) -> None:
    if not MIN_WINDOW <= window <= min(MAX_WINDOW, n_ctx - 1):
        raise RetrievalError(f"a window of {window} tokens: choose {MIN_WINDOW} .. {min(MAX_WINDOW, n_ctx - 1)} "
                             f"(the context made at load is {n_ctx})")
    if not 1 <= stride <= window:
        raise RetrievalError(f"a stride of {stride} tokens: choose 1 .. {window} (the window)")




def check_queries(n: int) -> None:
    """RetrievalError for a recall run of n queries outside 1 .. MAX_QUERIES (checked before any GPU work)."""
    if not 1 <= n <= MAX_QUERIES:
        raise RetrievalError(f"{n} queries: choose 1 .. {MAX_QUERIES:,}")


def covered(crop: tuple[int, int], span: tuple[int, int]) -> int:
    """Tokens of `crop` that `span` covers (both half-open token ranges of the same file)."""
    return max(0, min(crop[1], span[1]) - max(crop[0], span[0]))


def pack_messages(question: str, hits: list) -> list[dict]:
    """The chat messages of a grounded question: the system prompt, then the passages (Hits, or anything with a file,
    a `where` and a text: lab.instruments.grounded's), numbered in rank order with their file and place, then the
    question. The caller renders them with the model's own template."""
    parts = [f"[{i + 1}] {h.file}, {h.where}:\n{h.text.strip()}" for i, h in enumerate(hits)]
    user = "Passages:\n\n" + "\n\n".join(parts) + f"\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# -- results --------------------------------------------------------------------------------------------------
@dataclass
class Hit:
    rank: int
    window: int             # its row in the index
    file: str
    start: int              # token span in its file's ids
    end: int
    score: float            # cosine with the question
    text: str

    @property
    def where(self) -> str:
        return f"tokens {self.start}-{self.end}"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "file": self.file, "window": self.window, "start_token": self.start,
                "end_token": self.end, "score": self.score, "text": self.text}


@dataclass
class Prepared:
    """What an index will hold, before any GPU work: the files it took, those it refused, and its windows."""
    names: list[str] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)     # (file name, why)
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (file, start, end) per window
    tokenize_s: float = 0.0

    @property
    def n_tokens(self) -> int:
        return sum(len(i) for i in self.ids)

    def to_dict(self) -> dict:
        return {"files": [{"name": n, "tokens": len(i)} for n, i in zip(self.names, self.ids)],
                "refused": [{"name": n, "message": m} for n, m in self.refused], "windows": len(self.spans),
                "tokens": self.n_tokens, "tokenize_s": round(self.tokenize_s, 3)}


@dataclass
class Built:
    windows: int
    done: int               # windows embedded (fewer than `windows` when stopped)
    seconds: float
    stopped: bool = False

    @property
    def per_second(self) -> float:
        return self.done / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {"windows": self.windows, "done": self.done, "seconds": round(self.seconds, 3),
                "windows_per_s": round(self.per_second, 1), "stopped": self.stopped}


@dataclass
class Recall:
    queries: int
    at1: float
    at5: float
    seconds: float
    crop: int = CROP
    seed: int = 0

    def to_dict(self) -> dict:
        return {"queries": self.queries, "recall_at_1": round(self.at1, 4), "recall_at_5": round(self.at5, 4),
                "seconds": round(self.seconds, 3), "crop": self.crop, "seed": self.seed}


# -- the GPU index --------------------------------------------------------------------------------------------
class Index:
    """One index of files on one engine. `prepare` (tokenise, window), then `build` (embed every window), or
    `restore` (embeddings from a saved index); then `search` and `recall`. `close` frees (and, being CONVERSATION,
    zeroes) every buffer; `drop` also empties the CPU's copies of the files."""

    def __init__(self, engine, tokenizer, *, window: int = WINDOW, stride: int = STRIDE, adapter=None) -> None:
        check_shape(window, stride, engine.n_ctx)
        self.engine = engine
        # a LoRA adapter the index embeds with through plans of its own (Engine.plans_with), whatever the engine's
        # own plans add: the retrieval card's tuned embedder, which the chat does not use; None: the engine's plans
        self.adapter = adapter
        self.device = engine.device
        self.tokenizer = tokenizer
        self.window = window
        self.stride = stride
        # a window runs behind BOS when the vocabulary adds one: position 0 is then the BOS, not pooled
        self.first = 1 if tokenizer.add_bos and tokenizer.bos_id is not None else 0
        self.prepared = Prepared()
        self.ready = 0               # windows whose embeddings the index holds
        self._ops = None
        self._search = None
        self._prepared: dict[tuple[int, str], object] = {}

    # -- the CPU side ------------------------------------------------------------------------------------
    def prepare(self, files: list[tuple[str, bytes | str]]) -> Prepared:
        """Decode and tokenise each (name, raw bytes or text) and cut the windows; a file that fails is refused by
        name and the rest go on. RetrievalError when nothing is left to index."""
        if self.ready or self._ops is not None:
            raise RetrievalError("this index is built: make a new one for other files")
        p = Prepared()
        t0 = time.perf_counter()
        for name, raw in files:
            try:
                text = raw if isinstance(raw, str) else read_text(name, raw)
                if isinstance(raw, str) and not text.strip():
                    raise RetrievalError(f"{name}: holds only white space")
                ids = self.tokenizer.encode(text)
            except RetrievalError as exc:
                p.refused.append((name, str(exc)))
                continue
            f = len(p.names)
            p.names.append(name)
            p.ids.append(ids)
            p.spans += [(f, a, b) for a, b in windows_of(len(ids), self.window, self.stride)]
        p.tokenize_s = time.perf_counter() - t0
        if not p.spans:
            why = "; ".join(m for _, m in p.refused) or "no files"
            raise RetrievalError(f"nothing to index: {why}")
        self.capacity_check(len(p.spans))
        self.prepared = p
        return p

    def adopt(self, p: Prepared) -> Prepared:
        """Take files another index prepared as this one's, nothing read or tokenised again (the tuning's fresh
        indexes of the files already indexed, lab/instruments/embedder.py): their windows must be those this index
        cuts. The Prepared is shared, not copied: `close` (not `drop`) every index but the one that keeps it."""
        if self.ready or self._ops is not None:
            raise RetrievalError("this index is built: make a new one for other files")
        if not p.spans:
            raise RetrievalError("nothing prepared: add files first")
        self._check_spans(p)
        self.capacity_check(len(p.spans))
        self.prepared = p
        return p

    def _check_spans(self, p: Prepared) -> None:
        want = [(f, a, b) for f, ids in enumerate(p.ids) for a, b in windows_of(len(ids), self.window, self.stride)]
        if p.spans != want or len(p.names) != len(p.ids):
            raise RetrievalError(f"the saved windows are not those of its files at window {self.window} and stride "
                                 f"{self.stride}: the index is damaged")

    def capacity_check(self, n: int) -> None:
        """RetrievalError when an index of n windows would pass one storage binding of this GPU."""
        E = self.engine.cfg.n_embd
        limit = self.device.info.limits["max_storage_buffer_binding_size"]
        most = limit // (4 * E)
        if n > most:
            raise RetrievalError(f"{n:,} windows of {E:,} floats would pass this GPU's largest buffer "
                                 f"({limit / 2**20:,.0f} MiB holds {most:,}): index fewer files, or a larger stride")

    def drop(self) -> None:
        """Free the GPU buffers and empty the files' ids and names in place (Forget)."""
        self.close()
        p = self.prepared
        for ids in p.ids:
            ids.clear()
        p.ids.clear()
        p.names.clear()
        p.spans.clear()
        p.refused.clear()

    def close(self) -> None:
        self.device.free(self)
        self._ops = self._search = None
        self._prepared.clear()
        self.ready = 0

    @property
    def buffers(self) -> list[gpu.Buffer]:
        return self.device.owned_by(self)

    def window_ids(self, w: int) -> list[int]:
        f, a, b = self.prepared.spans[w]
        return self.prepared.ids[f][a:b]

    def hit(self, rank: int, w: int, score: float) -> Hit:
        f, a, b = self.prepared.spans[w]
        return Hit(rank, w, self.prepared.names[f], a, b, score, self.tokenizer.decode(self.prepared.ids[f][a:b]))

    # -- the GPU side --------------------------------------------------------------------------------------
    def _build_ops(self) -> None:
        eng, dev, cfg, kc = self.engine, self.device, self.engine.cfg, self.engine.kernels
        n, E = len(self.prepared.spans), cfg.n_embd
        s, conv = eng.scratch, gpu.CONVERSATION
        limit = dev.info.limits["max_storage_buffer_binding_size"]
        self.query_rows = max(1, min(QUERY_ROWS, limit // (4 * n)))
        self.k = min(MAX_K, n)
        with dev.owning(self):
            self.table = dev.buffer(4 * n * E, conv, f"retrieval.index [{n}, n_embd]")
            self.queries = dev.buffer(4 * self.query_rows * E, conv, f"retrieval.queries [{self.query_rows}, n_embd]")
            self.scores = dev.buffer(4 * self.query_rows * n, conv, f"retrieval.scores [{self.query_rows}, {n}]")
            self.top = dev.buffer(8 * self.query_rows * self.k, conv,
                                  f"retrieval.top-k [{self.query_rows}, {self.k}] (u32, f32)")
            # rewritten before every step with a slot of the index: it says which window ran
            self.pool_p = dev.uniform(bytes(POOL.size), "retrieval.pool {n_embd, first, slot, flags}", kind=conv)
            # the index's size is a fact of the user's files; `ready` is rewritten before each search
            self.score_p = score_p = dev.uniform(bytes(SCORES.size), "retrieval.scores {n, n_embd, ready}", kind=conv)
            pool = {name: pool_op(dev, kc, s.xn, buf, s.step, self.pool_p, f"retrieval.pool {name}")
                    for name, buf in (("index", self.table), ("queries", self.queries))}
            score = score_op(dev, kc, self.table, self.queries, self.scores, s.step, score_p, n, "retrieval.score")
            top = sample.top_k(dev, kc, self.scores, self.top, s.step, n, self.k,
                               rows=Rows.per_token(self.query_rows))
            # the engine's own plans, or, with an adapter of the index's own, plans of its own (their buffers this
            # index's, freed with it)
            plans = {True: eng.prefill, False: eng.decode} if self.adapter is None else \
                dict(zip((True, False), eng.plans_with(self.adapter)))
        # the plans up to the final norm (found by the name the plans trace): prefill for a step of several tokens,
        # decode's for a lone one; what follows there (the head, the sampler's tail) is not run
        body = {b: plan.ops[:plan.at("result_norm") + 1] for b, plan in plans.items()}
        self._ops = {(b, name): body[b] + [pool[name]] for b in (True, False) for name in pool}
        self._search = [score] + top
        # the engine's plans as the windows are embedded (Engine.set_lora builds them again; a Trainer sets it, a full
        # fine-tune's included, before its weights move): `_stale` compares them
        self._plans = (eng.prefill, eng.decode)

    def _steps(self, ids: list[int], slot: int, into: str) -> None:
        """Submit the steps that embed `ids` into row `slot` of the index or of the queries: from position 0, behind
        BOS when the vocabulary adds one, in steps of the engine's batch."""
        eng, dev = self.engine, self.device
        run = ([self.tokenizer.bos_id] if self.first else []) + ids
        batch = eng.max_batch
        for a in range(0, len(run), batch):
            chunk = run[a:a + batch]
            flags = (ADD if a else 0) | (NORMALIZE if a + batch >= len(run) else 0)
            writes = eng.step_writes(chunk, a, len(chunk))
            writes.append((self.pool_p, 0, POOL.pack(eng.cfg.n_embd, self.first, slot, flags)))
            dev.run(self._prepared_for(len(chunk), into), writes)

    def _prepared_for(self, t: int, into: str):
        """The backend's prepared dispatch list of a step of t tokens pooled `into` the index or the queries, made
        once per (t, into): every window of a file has the same length, so indexing encodes from one list (as the
        engine's steps do, Engine.prepared)."""
        if self._stale():
            raise RetrievalError("the model changed since the files were indexed (a LoRA adapter went on or off, or "
                                 "a training run began): the index's windows were embedded by the other model; index "
                                 "the files again")
        key = (t, into)
        p = self._prepared.get(key)
        if p is None:
            if len(self._prepared) >= MAX_PREPARED:
                self._prepared.clear()
            p = self._prepared[key] = self.device.prepare(ops.dispatches(self._ops[t > 1, into], t))
        return p

    def _stale(self) -> bool:
        """The model changed since the windows were embedded. An index on the engine's plans: they were built again
        (an adapter on or off, a training run's start). An index with an adapter of its own runs plans of its own, which
        the engine's adapter does not reach: only weights trained in place change it (they are then the user's,
        CONVERSATION, and any rebuild of the engine's plans since may have come with a run that moved them)."""
        eng = self.engine
        if self._plans[0] is eng.prefill and self._plans[1] is eng.decode:
            return False
        return self.adapter is None or eng.weights.kind == gpu.CONVERSATION

    async def build(self, on_progress=None, should_stop=None) -> Built:
        """Embed every prepared window into the index. on_progress(done, total, seconds) after each block of windows
        the GPU finished (the first block is one window: its rate is the estimate the page shows before the rest);
        should_stop() is polled there too: a True stops, and the index keeps the windows done (searchable, `ready`)."""
        spans = self.prepared.spans
        if not spans:
            raise RetrievalError("nothing prepared: add files first")
        check = self.engine.check_ids
        for ids in self.prepared.ids:
            check(ids, RetrievalError)
        if self._ops is None:
            self._build_ops()
            await self.device.flush_errors()
        n = len(spans)
        res = Built(n, 0, 0.0)
        t0 = time.perf_counter()
        # Blocks of windows, each followed by a small read that completes when the GPU has run it. A block is
        # submitted before the read after the one before it is awaited (Device.read is ordered where it is asked), so
        # the GPU never waits for the round trip, and progress counts windows the GPU finished, not windows queued.
        # One read at a time: the next is asked only once the last has landed (they share the staging buffer). A
        # block grows to about POLL_S of work: progress and the page's stop message get in that often.
        block, w, pending = 1, 0, None          # pending: (the read after a block, the windows done when it lands)
        try:
            while w < n and not res.stopped:
                end = min(n, w + block)
                for j in range(w, end):
                    self._steps(self.window_ids(j), j, "index")
                w = end
                if pending is not None:
                    read, pending = pending, None
                    await read[0]
                    res.done = read[1]
                    seconds = time.perf_counter() - t0
                    if on_progress is not None:
                        on_progress(res.done, n, seconds)
                    res.stopped = should_stop is not None and should_stop() and w < n
                    block = max(1, min(256, int(res.done / seconds * POLL_S))) if seconds else block
                pending = (self.device.read(self.pool_p, 0, 4), end)
        finally:                 # a read asked is always finished: its staging buffer stays mapped until then
            if pending is not None:
                await pending[0]
                res.done = pending[1]
        if on_progress is not None and not res.stopped:
            on_progress(res.done, n, time.perf_counter() - t0)
        self.ready = res.done
        res.seconds = time.perf_counter() - t0
        return res

    async def restore(self, prepared: Prepared, embeddings: bytes) -> None:
        """Fill the index from a saved one: its files' names and ids, its window spans (each must be what
        `windows_of` cuts at this index's window and stride), and its embeddings, f32 [n_windows, n_embd]."""
        if self.ready or self._ops is not None:
            raise RetrievalError("this index is built: make a new one to restore another")
        self._check_spans(prepared)
        n, E = len(prepared.spans), self.engine.cfg.n_embd
        if len(embeddings) != 4 * n * E:
            raise RetrievalError(f"{len(embeddings):,} bytes of embeddings for {n:,} windows of {E:,} floats "
                                 f"({4 * n * E:,} bytes)")
        for ids in prepared.ids:
            self.engine.check_ids(ids, RetrievalError)
        self.capacity_check(n)
        self.prepared = prepared
        self._build_ops()
        await self.device.flush_errors()
        self.device.write(self.table, embeddings)
        self.ready = n

    async def embeddings(self) -> bytes:
        """The index as read back: f32 [n_windows, n_embd] (tests, and the index file)."""
        self._need_ready()
        return await self.device.read(self.table, 0, 4 * self.ready * self.engine.cfg.n_embd)

    async def embed_queries(self, queries: list[list[int]]) -> bytes:
        """Embed up to query_rows id lists as the windows are, into the queries buffer; returns them read back,
        f32 [len(queries), n_embd] (tests compare them with the index's own rows)."""
        self._embed(queries)
        return await self.device.read(self.queries, 0, 4 * len(queries) * self.engine.cfg.n_embd)

    def _need_ready(self) -> None:
        if not self.ready:
            raise RetrievalError("the index holds no windows yet: index some files first")

    def _embed(self, queries: list[list[int]]) -> None:
        if self._ops is None:
            raise RetrievalError("the index holds no windows yet: index some files first")
        if not 1 <= len(queries) <= self.query_rows:
            raise RetrievalError(f"{len(queries)} queries at once: 1 .. {self.query_rows}")
        for r, ids in enumerate(queries):
            if not ids:
                raise RetrievalError("an empty question: type one first")
            if len(ids) + self.first > self.engine.n_ctx:
                raise RetrievalError(f"a question of {len(ids)} tokens is longer than the context of "
                                     f"{self.engine.n_ctx}: shorten it")
            self.engine.check_ids(ids, RetrievalError)
            self._steps(ids, r, "queries")

    async def search_ids(self, queries: list[list[int]], k: int) -> list[list[tuple[int, float]]]:
        """The k best windows (row, cosine) of each query, best first, ties by the lower row; k is capped by MAX_K
        and by the windows the index holds (only the first `ready` rows are searched when a build stopped early)."""
        self._need_ready()
        if k < 1:
            raise RetrievalError(f"k = {k}: ask for at least one passage")
        self._embed(queries)
        q = len(queries)
        n = len(self.prepared.spans)
        self.device.run(ops.dispatches(self._search, q),
                        self.engine.step_writes(None, 0, q)
                        + [(self.score_p, 0, SCORES.pack(n, self.engine.cfg.n_embd, self.ready, NEG_INF))])
        raw = await self.device.read(self.top, 0, 8 * q * self.k)
        out = []
        for r in range(q):
            pairs = [sample.PAIR.unpack_from(raw, 8 * (r * self.k + i)) for i in range(self.k)]
            out.append([(w, v) for w, v in pairs if w != sample.NONE][:k])
        return out

    async def search(self, question_ids: list[int], k: int = ASK_K) -> list[Hit]:
        """The k windows nearest to the question, ranked, with their text."""
        (best,) = await self.search_ids([question_ids], k)
        return [self.hit(i + 1, w, v) for i, (w, v) in enumerate(best)]

    async def recall(self, n_queries: int = RECALL_QUERIES, seed: int = 0, on_progress=None, should_stop=None,
                     crop: int = CROP) -> Recall:
        """recall@1 and @5 on n_queries random `crop`-token crops of the indexed files (`sample_crops`); a hit is a
        retrieved window of the crop's file covering at least half of it."""
        self._need_ready()
        p = self.prepared
        crops = sample_crops(p, n_queries, seed, crop)
        t0 = time.perf_counter()
        hit1 = hit5 = done = 0
        for c in range(0, n_queries, self.query_rows):
            part = crops[c:c + self.query_rows]
            found = await self.search_ids([p.ids[f][a:b] for f, a, b in part], 5)
            for (f, a, b), best in zip(part, found):
                ok = [hits(p, (f, a, b), w) for w, _ in best]
                hit1 += bool(ok[:1] and ok[0])
                hit5 += any(ok)
            done += len(part)
            if on_progress is not None:
                on_progress(done, n_queries, time.perf_counter() - t0)
            if should_stop is not None and should_stop():
                break
        return Recall(done, hit1 / done, hit5 / done, time.perf_counter() - t0, crop, seed)


def sample_crops(p: Prepared, n_queries: int, seed: int, crop: int = CROP) -> list[tuple[int, int, int]]:
    """n_queries random (file, start, end) crops of `crop` tokens of the prepared files, files drawn by their number
    of crops, so every crop position is equally likely; the same seed, the same crops."""
    starts = [(f, len(ids) - crop + 1) for f, ids in enumerate(p.ids) if len(ids) >= crop]
    if not starts:
        raise RetrievalError(f"every file is shorter than a {crop}-token crop: nothing to measure")
    check_queries(n_queries)
    rng = random.Random(seed)
    files, weights = zip(*starts)
    crops = []
    for _ in range(n_queries):
        f = rng.choices(files, weights)[0]
        a = rng.randrange(len(p.ids[f]) - crop + 1)
        crops.append((f, a, a + crop))
    return crops


def hits(p: Prepared, crop: tuple[int, int, int], window: int) -> bool:
    """Window `window` is a hit for the crop: of the crop's file, covering at least half of it."""
    f, a, b = crop
    return p.spans[window][0] == f and 2 * covered((a, b), p.spans[window][1:]) >= b - a


def overlap_recall(p: Prepared, n_queries: int, seed: int = 0, crop: int = CROP) -> Recall:
    """The token-overlap baseline on the same crops as `Index.recall`: each window scored by the tokens it shares
    with the crop (counted with multiplicity), best first, ties by the lower window. On verbatim crops it is a ceiling
    an embedding is measured against, not a retriever (it knows nothing of meaning)."""
    from collections import Counter
    t0 = time.perf_counter()
    bags = [Counter(p.ids[f][a:b]) for f, a, b in p.spans]
    hit1 = hit5 = 0
    crops = sample_crops(p, n_queries, seed, crop)
    for c in crops:
        f, a, b = c
        q = Counter(p.ids[f][a:b])
        scores = [sum(min(n, bag[t]) for t, n in q.items()) for bag in bags]
        best = sorted(range(len(bags)), key=lambda w: (-scores[w], w))[:5]
        ok = [hits(p, c, w) for w in best]
        hit1 += ok[0]
        hit5 += any(ok)
    return Recall(len(crops), hit1 / len(crops), hit5 / len(crops), time.perf_counter() - t0, crop, seed)
