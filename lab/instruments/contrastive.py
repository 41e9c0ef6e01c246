"""Retrieval tuned on the user's files (issue #44 part 3): the retrieval card's embedder (lab/instruments/retrieval.py:
a window's final-norm rows, BOS left out, summed and L2-normalised) trained contrastively, a LoRA adapter or every
weight, on the same engine that chats.

    c = Contrastive(engine, tokenizer, T=64, pairs=8, rank=8)
    loss = await c.step([(ids_a, ids_b), ...])      # InfoNCE over the batch, one optimizer step

The loss is InfoNCE with in-batch negatives, symmetric: with a_i, b_j the unit embeddings of the pairs' two sides and
S = A B^T / temperature (0.05), loss = (mean_i [logsumexp_j S_ij - S_ii] + mean_j [logsumexp_i S_ij - S_jj]) / 2,
computed as written (no clamp). The pairs come from the user's files in two stages (`crop_pairs`, `query_pairs`):
two random crops of one window, then a short query (QUERY tokens) inside its window, the passage; both sides run
through the same weights (two towers that share them), so their gradients add.

A step runs in two passes, because every window's gradient depends on every other's embedding:
1. each window forward to its final norm, its rows summed into a row of `sums` (lab.ops.pool without its
   normalisation: the sum's length is needed for the normalisation's gradient);
2. the host reads the 2B sums (2B x n_embd floats), normalises them, computes the loss and its gradient per
   embedding, and takes it back through the normalisation: for p the sum and e = p / |p|, dp = (g - e (e . g)) / |p|,
   which every pooled row receives as its gradient at the final norm's output; then each window runs forward and
   back again (lab.engine.backward with pooled=True, `Trainer.run_pooled`), its parameters' gradients added in.
The host's part is plain Python (no numpy: it runs in the page's worker too): 2B <= 2 MAX_PAIRS vectors.

The float64 oracle is lab/host/reference/contrastive.py; lab/host/gradcheck.py `check_contrastive` holds the GPU's
gradients to its central differences.

What it does not know: files and the CLI (lab/host/cli/training.py), the index's search (retrieval.py).
"""

from __future__ import annotations

import math
import random
from array import array

from lab import gpu, ops
from lab.engine.backward import TrainError
from lab.engine.lora import DEFAULT_TARGETS
from lab.instruments.training import Optim, Trainer
from lab.ops.pool import POOL
from lab.ops.pool import pool as pool_op
from lab.settings import EMBEDDER

TEMPERATURE = 0.05      # the reference system's: sharp enough that the hardest in-batch negatives carry the gradient
QUERY = 16              # tokens of a query inside its passage (stage 2)
MIN_CROP = 0.5          # a crop (stage 1) keeps at least this share of its window
MAX_PAIRS = EMBEDDER.max_pairs     # pairs a step (the host's part is O(pairs^2 n_embd) in plain Python)
STAGES = EMBEDDER.stages           # ("crops", "query"): what a user chooses, so lab/settings.py names them


class Diverged(TrainError):
    """A window's pooled state is not a number: the parameters left the numbers (too high a learning rate)."""


# -- the loss on the host -------------------------------------------------------------------------------------
def _dot(x, y) -> float:
    return math.fsum(a * b for a, b in zip(x, y))


def _lse(xs) -> float:
    m = max(xs)
    return m + math.log(math.fsum(math.exp(x - m) for x in xs))


def info_nce(a: list, b: list, temperature: float = TEMPERATURE) -> tuple[float, list, list]:
    """(loss, dL/da, dL/db) of the symmetric InfoNCE over unit vectors a[i], b[i] (pairs i), in-batch negatives."""
    n = len(a)
    s = [[_dot(x, y) / temperature for y in b] for x in a]
    rows = [_lse(r) for r in s]
    cols = [_lse([s[i][j] for i in range(n)]) for j in range(n)]
    loss = (math.fsum(rows[i] - s[i][i] for i in range(n)) + math.fsum(cols[j] - s[j][j] for j in range(n))) / (2 * n)
    # dL/dS_ij: (softmax over the row j + softmax over the column i - 2 [i == j]) / 2n
    d = [[(math.exp(s[i][j] - rows[i]) + math.exp(s[i][j] - cols[j]) - 2.0 * (i == j)) / (2 * n)
          for j in range(n)] for i in range(n)]
    width = len(a[0])
    ga = [[math.fsum(d[i][j] * b[j][k] for j in range(n)) / temperature for k in range(width)] for i in range(n)]
    gb = [[math.fsum(d[i][j] * a[i][k] for i in range(n)) / temperature for k in range(width)] for j in range(n)]
    return loss, ga, gb


def normalized(p: list) -> tuple[list, float]:
    """(p / |p|, |p|)."""
    norm = math.sqrt(math.fsum(x * x for x in p))
    if not math.isfinite(norm):
        raise Diverged("the embeddings are not numbers any more: the training diverged (too high a learning rate)")
    if not norm > 0:
        raise TrainError("a window's pooled state is zero: its embedding has no direction")
    return [x / norm for x in p], norm


def normalize_back(e: list, norm: float, g: list) -> list:
    """The gradient at p of a loss whose gradient at e = p / |p| is g: (g - e (e . g)) / |p|."""
    eg = _dot(e, g)
    return [(gk - ek * eg) / norm for ek, gk in zip(e, g)]


# -- the pairs ------------------------------------------------------------------------------------------------
def crop_pairs(windows: list[list[int]], n: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Stage 1: n windows drawn without replacement, each cut twice at random (each crop at least MIN_CROP of it)."""
    def crop(w):
        size = rng.randint(max(2, math.ceil(MIN_CROP * len(w))), len(w))
        start = rng.randrange(len(w) - size + 1)
        return w[start:start + size]
    return [(crop(w), crop(w)) for w in rng.sample(windows, n)]


def query_pairs(windows: list[list[int]], n: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Stage 2: n windows drawn without replacement, each the passage of a QUERY-token query cut from inside it."""
    out = []
    for w in rng.sample(windows, n):
        start = rng.randrange(len(w) - QUERY + 1)
        out.append((w[start:start + QUERY], w))
    return out


def pairs_of(stage: str, windows: list[list[int]], n: int, rng: random.Random):
    if stage not in STAGES:
        raise TrainError(f"stage {stage!r}: one of {', '.join(STAGES)}")
    if len(windows) < max(2, n):
        raise TrainError(f"{len(windows)} windows for {n} pairs a step: a step's pairs are different windows (each "
                         f"the others' negatives); index more text or ask fewer pairs")
    return (crop_pairs if stage == "crops" else query_pairs)(windows, n, rng)


# -- the GPU side -------------------------------------------------------------------------------------------
class Contrastive:
    """The embedder of `engine` trained on pairs of at most T tokens each (BOS added where the vocabulary adds one,
    as the index embeds), `pairs` pairs a step: a LoRA adapter (rank, alpha, targets) or, full=True, every weight.
    `trainer` owns the adapter and every buffer of training; this object the pooled sums and their uniform."""

    def __init__(self, engine, tokenizer, *, T: int, pairs: int, rank: int = 8, alpha: float = 16.0,
                 targets=DEFAULT_TARGETS, optim: Optim | None = None, seed: int = 0, full: bool = False,
                 temperature: float = TEMPERATURE) -> None:
        if not 2 <= pairs <= MAX_PAIRS:
            raise TrainError(f"{pairs} pairs a step: 2 to {MAX_PAIRS} (one pair has no negative)")
        self.engine, self.device, self.pairs, self.temperature = engine, engine.device, pairs, temperature
        self.first = 1 if tokenizer.add_bos and tokenizer.bos_id is not None else 0
        self.bos = tokenizer.bos_id
        self.T = T
        self.trainer = Trainer(engine, T=T + self.first, rank=rank, alpha=alpha, targets=targets, optim=optim,
                               seed=seed, full=full, pooled=True)
        dev, E = self.device, engine.cfg.n_embd
        try:
            with dev.owning(self):
                self.sums = dev.buffer(4 * 2 * pairs * E, gpu.CONVERSATION, f"contrastive sums [{2 * pairs}, {E}]")
                self.pool_p = dev.uniform(bytes(POOL.size), "contrastive pool {n_embd, first, slot, flags}",
                                          kind=gpu.CONVERSATION)
                pool = pool_op(dev, engine.kernels, engine.scratch.xn, self.sums, engine.scratch.step, self.pool_p,
                               "contrastive pool")
        except BaseException:
            self.trainer.close()
            raise
        # the engine's plans (the adapter's terms in them, Trainer set it) up to the final norm, then the sum
        self._body = {b: engine.plan_for(b).ops[:engine.plan_for(b).at("result_norm") + 1] + [pool]
                      for b in (True, False)}
        self._prepared: dict[int, object] = {}

    def close(self) -> None:
        self.trainer.close()
        self.device.free(self)

    def _run(self, ids: list[int]) -> list[int]:
        run = ([self.bos] if self.first else []) + list(ids)
        if not self.first < len(run) <= self.T + self.first:
            raise TrainError(f"a window of {len(ids)} tokens: 1 to {self.T} here")
        return run

    def _pool(self, ids: list[int], slot: int) -> None:
        run, eng = self._run(ids), self.engine
        t = len(run)
        p = self._prepared.get(t)
        if p is None:
            p = self._prepared[t] = self.device.prepare(ops.dispatches(self._body[t > 1], t))
        writes = eng.step_writes(run, 0, t)
        writes.append((self.pool_p, 0, POOL.pack(eng.cfg.n_embd, self.first, slot, 0)))
        self.device.run(p, writes)

    async def embeddings(self, seqs: list[list[int]]) -> list[tuple[list, float]]:
        """(unit embedding, the sum's length) of each sequence, as the model is now."""
        if len(seqs) > 2 * self.pairs:
            raise TrainError(f"{len(seqs)} windows at once: at most {2 * self.pairs}")
        for slot, ids in enumerate(seqs):
            self._pool(ids, slot)
        E = self.engine.cfg.n_embd
        raw = array("f", await self.device.read(self.sums, 0, 4 * len(seqs) * E))
        return [normalized(list(raw[k * E:(k + 1) * E])) for k in range(len(seqs))]

    async def gradients(self, batch: list[tuple[list[int], list[int]]]) -> float:
        """The batch's loss at the parameters as they are, their gradients left in the trainer's (cleared first)."""
        if len(batch) != self.pairs:
            raise TrainError(f"a step takes {self.pairs} pairs, not {len(batch)}")
        seqs = [a for a, _ in batch] + [b for _, b in batch]
        emb = await self.embeddings(seqs)
        n = len(batch)
        loss, ga, gb = info_nce([e for e, _ in emb[:n]], [e for e, _ in emb[n:]], self.temperature)
        tr, E = self.trainer, self.engine.cfg.n_embd
        tr.clear_grads()
        for (e, norm), g, ids in zip(emb, ga + gb, seqs):
            dp = array("f", normalize_back(e, norm, g))
            run = self._run(ids)
            tr.run_pooled(run, bytes(4 * E * self.first) + dp.tobytes() * (len(run) - self.first))
        return loss

    async def step(self, batch: list[tuple[list[int], list[int]]]) -> float:
        """One optimizer step on the batch's pairs: the loss its gradients were taken at."""
        loss = await self.gradients(batch)
        self.trainer.advance()
        return loss


def windows(ids_per_file: list[list[int]], size: int) -> list[list[int]]:
    """Each file's ids cut into whole windows of `size` tokens, side by side (no overlap: two windows of one step are
    each other's negatives, and overlapping ones would share half their text)."""
    return [ids[a:a + size] for ids in ids_per_file for a in range(0, len(ids) - size + 1, size)]

