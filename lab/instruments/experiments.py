"""The experiments on a model's insides, on the GPU and in pure Python (the page's Experiments card through
lab/worker/experiments.py, and natively `lab ablate | patch | steer | attribute` and lab.host.lab for notebooks):

- **Ablation**: the target token's log-probability at the last position with chosen attention heads, a whole attention
  block or an MLP block zeroed, or set to their mean over the prompt's positions (mean ablation: what the site holds on
  average, from the clean run); one run per row, `delta` = ablated - base.
- **Activation patching** (causal tracing): a clean and a corrupted prompt of the same token length; for each layer
  and position, the corrupted run with the site's values at that (layer, position) taken from the clean run; the
  recovery of the logit difference target - foil is (patched - corrupted) / (clean - corrupted). Positions are matched
  one to one, so the lengths must be equal. The sanity run: the last layer's residual patched at every position gives
  the clean run's logit difference exactly (the rest of the model after it is the head alone).
- **Steering**: a vector, the mean residual after layer L over the "plus" prompts' positions minus the same over the
  "minus" prompts' (BOS left out: it is the same for both, and its residual is the largest), added times a scale at
  every position of a generation (prefill and each decode step).
- **Direct logit attribution**: the residual at the last position is a sum (embedding + each block's output, an lfm2
  short-conv block's in its "attn" bar, without heads); the final norm is linear once its scale is frozen at the
  run's own value, so each term's share of the target's logit is its dot product with w_norm * u_target / rms(x_final), and the shares sum to the logit (the remainder: gemma2's
  soft-cap and rounding). A head's share is its slice of `kqv_out-L` through its columns of `attn_output.weight`,
  projected on the GPU by the layer's own matmul (one row per head, the other heads' columns zero); where a post-norm
  follows the projection (gemma3) it is frozen at the run's scale, so the heads still sum to their block.

Sweeps are batched: each run is one submit of the prefill plan with its interventions and a `pick` op (wgsl/pick.wgsl)
that writes the run's log-normaliser and the logits the experiment compares into a results table; blocks of runs are
submitted before the previous block's results are read (one read a block, a block sized to take about POLL_S), so a
30-layer x 16-position patching sweep is 480 submits and a few reads, not 480 round trips.

Every run starts at position 0 and overwrites the engine's KV cache: `kept(session)` copies the chat's cached K/V rows
aside and back, so the chat's cache, and so its next outputs, are exactly as before.

Buffers (kind CONVERSATION: they hold what the user's prompts made): the interventions' slots, the results table, the
pick ids and parameters, the attribution's head rows, the cache snapshot while an experiment runs. Forget wipes them
while they are alive; `close` frees them.

What it does not know: text (callers pass ids), the page, numpy.
"""

from __future__ import annotations

import heapq
import math
import struct
import time
from array import array
from contextlib import asynccontextmanager

from lab import gpu, ops
from lab.instruments.interventions import EVERY, Intervention, InterventionError, Interventions, logits_row
from lab.ops import matmul
from lab.ops.embed import get_rows
from lab.ops.intervene import LOAD, intervene
from lab.ops.intervene import PARAMS as IV_PARAMS
from lab.ops.pick import PARAMS as PICK
from lab.ops.pick import pick

POLL_S = 0.25           # a block of runs takes about this long: progress and Stop are seen between blocks
MAX_BLOCK = 256         # runs in a block at most
MAX_PICK = 4            # logits a run keeps besides its normaliser
TOP = 5                 # tokens in the before / after lists


def top_logprobs(raw: bytes, lse: float, n: int = TOP) -> list[list]:
    """The n most likely ids of a logits row (f32 bytes) with their log-probabilities (logit - lse)."""
    row = array("f", raw)
    best = heapq.nlargest(n, ((v, i) for i, v in enumerate(row) if math.isfinite(v)))
    return [[i, v - lse] for v, i in best]


def _layers(cfg, site: str) -> list[int]:
    """Every layer the site exists at: an attention site only where there is attention (not lfm2's conv blocks)."""
    return list(cfg.attention_layers) if site == "attn" else list(range(cfg.n_layer))


class Experiments:
    """The four experiments on one engine; buffers made on first use."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.device = engine.device
        self.cfg = engine.cfg
        self.runner = Interventions(engine)
        self._pick = None           # (ids buffer, params uniform, the pick op) once built
        self._results = None        # the results table, grown to the largest sweep
        self._heads = None          # the attribution's per-head projections, once built
        self._resume = None         # (table, params, load op): a plain run's residual after every layer, on the GPU

    def close(self) -> None:
        self.runner.close()
        self.device.free(self)
        self._pick = self._results = self._heads = self._resume = None

    def buffers(self) -> list[gpu.Buffer]:
        return self.device.owned_by(self) + self.device.owned_by(self.runner)

    # -- the cache kept aside ----------------------------------------------------------------------------------
    @asynccontextmanager
    async def kept(self, session):
        """Run an experiment with the chat's cached K/V rows, the conv states (whole: a ring of a few rows) and
        qwen35's recurrent states copied aside and back (GPU copies, no read-back), and the engine's account of the
        positions those states and their snapshots hold put back as it was (the experiment's steps take no
        snapshot, so the snapshot buffers stay as the chat left them)."""
        eng = self.engine
        n = len(session.cached) if session is not None else 0
        pairs = []              # (the engine's buffer, its copy, bytes)
        owner = object()
        held, snaps = eng.held, list(eng.snaps)
        if n:
            size = eng.kv_value_bytes * n * self.cfg.kv_dim
            with self.device.owning(owner):
                for il, (k, v) in zip(eng.kv_layers, eng.kv_buffers):
                    for name, buf in (("k", k), ("v", v)):
                        pairs.append((buf, self.device.buffer(size, gpu.CONVERSATION,
                                                              f"experiment.kept {name} cache {il} [{n}, kv]"), size))
                for what, states in (("conv", eng.state_buffers), ("recurrent", eng.recurrent_buffers)):
                    for il, buf in states.items():
                        pairs.append((buf, self.device.buffer(buf.size, gpu.CONVERSATION,
                                                              f"experiment.kept {what} state {il}"), buf.size))
            self.device.run([], (), [(src, 0, dst, 0, size) for src, dst, size in pairs])
        try:
            yield
        finally:
            eng.held, eng.snaps = held, snaps
            if n:
                self.device.run([], (), [(dst, 0, src, 0, size) for src, dst, size in pairs])
                self.device.free(owner)

    # -- runs ------------------------------------------------------------------------------------------------
    def _check_prompt(self, ids: list[int], what: str = "the prompt") -> int:
        t = len(ids)
        if not 1 <= t <= self.engine.max_batch:
            raise InterventionError(f"{what} is {t} tokens: an experiment runs 1 .. {self.engine.max_batch} "
                                    f"(one step of the loaded engine)")
        self.engine.check_ids(ids, InterventionError, f"{what}: ")
        return t

    def _build_pick(self, runs: int) -> None:
        dev = self.device
        with dev.owning(self):
            if self._pick is None:
                ids = dev.buffer(4 * MAX_PICK, gpu.CONVERSATION, f"experiment.pick ids [{MAX_PICK}] u32")
                params = dev.uniform(bytes(PICK.size), "experiment.pick params", kind=gpu.CONVERSATION)
                self._pick = (ids, params, None)
            need = 4 * runs * (1 + MAX_PICK)
            if self._results is None or self._results.size < need:
                if self._results is not None:
                    dev.destroy(self._results)
                self._results = dev.buffer(max(need, 4096), gpu.CONVERSATION,
                                           "experiment.results [runs, 1 + picked] f32")
                ids, params, _ = self._pick
                self._pick = (ids, params, pick(dev, self.engine.kernels, self.engine.scratch.logits, ids,
                                                self._results, params, "experiment.pick"))

    async def _keep_residuals(self, ids: list[int]) -> None:
        """The residual after every layer of a plain run of `ids`, on the GPU: where a resumed run starts (made again
        for every sweep: one traced run, so that nothing stale, e.g. a table Forget zeroed, can be resumed from)."""
        cfg, dev, t = self.cfg, self.device, len(ids)
        names = [f"l_out-{il}" for il in range(cfg.n_layer)]
        raw = await self.engine.traced(ids, 0, names=names)
        need = 4 * cfg.n_layer * t * cfg.n_embd
        with dev.owning(self):
            if self._resume is None or self._resume[0].size < need:
                if self._resume is not None:
                    dev.destroy(self._resume[0])
                    dev.destroy(self._resume[1])
                table = dev.buffer(need, gpu.CONVERSATION, "experiment.resume residuals [layers, t, n_embd]")
                params = dev.uniform(bytes(IV_PARAMS.size), "experiment.resume params", kind=gpu.CONVERSATION)
                load = intervene(dev, self.engine.kernels, self.engine.scratch.x, table, self.engine.scratch.step,
                                 params, cfg.n_embd, "experiment.resume load")
            else:
                table, params, load = self._resume
        dev.write(table, b"".join(raw[n] for n in names))
        self._resume = (table, params, load)

    async def sweep(self, ids: list[int], runs: list[list[Intervention]], picked: list[int], on_progress=None,
                    should_stop=None, resume: list[int | None] | None = None) -> tuple[list[list[float] | None], float]:
        """Each run of `ids` from position 0 with its interventions: [log-normaliser, logits of `picked`...] per run
        (None for runs a stop left unrun), and the seconds the sweep took. resume[r] = L: run r starts after layer L
        from the plain run's residual there (what comes before is the plain run's anyway: its interventions sit at
        `l_out-L` or later), which a sweep over layers halves on average; the results are bit for bit the same."""
        eng, dev = self.engine, self.device
        t = self._check_prompt(ids)
        if not 1 <= len(picked) <= MAX_PICK:
            raise InterventionError(f"{len(picked)} picked tokens: 1 .. {MAX_PICK}")
        eng.check_ids(picked, InterventionError, "a picked token: ")
        self._build_pick(len(runs))
        pick_ids, params, pick_op = self._pick
        width = 1 + MAX_PICK
        dev.write(pick_ids, struct.pack(f"<{len(picked)}I", *picked))
        plan = eng.step_plan(t, 0)
        row, step_writes = logits_row(eng, t), eng.step_writes(ids, 0, t)
        cfg_e = self.cfg.n_embd
        for ivs in runs:            # every run refused before the first is submitted
            self.runner.check(ivs)
        resume = resume if resume is not None and t > 1 else [None] * len(runs)     # (one token: decode's plan)
        if any(r is not None for r in resume):
            await self._keep_residuals(ids)

        def submit(first: int, n: int) -> None:
            for r in range(first, first + n):
                more = [(params, 0, PICK.pack(eng.cfg.n_vocab, row, len(picked), r * width))]
                at = None
                if resume[r] is not None:
                    _, load_params, load = self._resume
                    at = (resume[r], load)
                    more.append((load_params, 0, IV_PARAMS.pack(cfg_e, 0, cfg_e, 0, EVERY[1], LOAD,
                                                                resume[r] * t * cfg_e, 1.0)))
                run, writes = self.runner.step(plan, t, runs[r], (pick_op,), at)
                dev.run(run, step_writes + writes + more)

        return await self._in_blocks(len(runs), submit, width, 1 + len(picked), on_progress, should_stop)

    async def _in_blocks(self, n_runs: int, submit, width: int, kept: int, on_progress,
                         should_stop) -> tuple[list[list[float] | None], float]:
        """Runs 0 .. n_runs-1 through submit(first, n), in blocks sized to take about POLL_S each: each run's first
        `kept` floats of its `width` in the results table (None where a stop left it unrun), and the seconds taken."""
        dev = self.device
        out: list[list[float] | None] = [None] * n_runs
        t0 = time.perf_counter()
        if not n_runs:
            return out, 0.0
        block, first, n = 1, 0, 1
        submit(0, 1)
        read = dev.read(self._results, 0, 4 * width)
        while True:
            nxt = first + n
            stop = should_stop is not None and should_stop()
            m = 0 if stop else min(block, n_runs - nxt)
            if m:
                submit(nxt, m)          # queued before this block's results are awaited: the GPU keeps busy
            raw = array("f", await read)
            for j in range(n):
                out[first + j] = raw[j * width: j * width + kept].tolist()
            done = nxt
            seconds = time.perf_counter() - t0
            if on_progress is not None:
                on_progress(done, n_runs, seconds)
            block = max(1, min(MAX_BLOCK, int(POLL_S * done / max(seconds, 1e-6))))
            if not m:
                return out, seconds
            first, n = nxt, m
            read = dev.read(self._results, 4 * first * width, 4 * n * width)

    async def _run_full(self, ids: list[int], ivs: list[Intervention], target: int) -> tuple[float, float, bytes]:
        """One run: (log-normaliser, the target's logit, the whole last logits row)."""
        (res,), _ = await self.sweep(ids, [ivs], [target])
        t = len(ids)
        raw = await self.device.read(self.engine.scratch.logits, 4 * logits_row(self.engine, t),
                                     4 * self.cfg.n_vocab)
        return res[0], res[1], raw

    async def seconds_per_run(self, ids: list[int]) -> float:
        """One plain run of `ids`, timed to the read of its result: what a sweep's estimate multiplies."""
        t0 = time.perf_counter()
        await self.sweep(ids, [[]], [0])
        return time.perf_counter() - t0

    async def site_rows(self, ids: list[int], site: str, layers: list[int]) -> dict[int, list[list[float]]]:
        """The site's rows ([t][width] floats) at each layer in a plain run of `ids` from position 0."""
        t = self._check_prompt(ids)
        names = {il: self.runner.name(site, il) for il in layers}
        raw = await self.engine.traced(ids, 0, names=list(names.values()))
        width = self.runner.sites[site][2]
        out = {}
        for il, name in names.items():
            a = array("f", raw[name])
            out[il] = [a[r * width:(r + 1) * width].tolist() for r in range(t)]
        return out

    # -- ablation ----------------------------------------------------------------------------------------------
    async def ablate(self, ids: list[int], target: int, *, layers=None, heads=None, block: str | None = None,
                     mode: str = "zero", on_progress=None, should_stop=None) -> dict:
        """{"target_id", "base_logprob", "top5_before", "rows": [{"layer", "head", "logprob", "delta"}], "top5_after"
        (one row only), "runs", "seconds", "stopped"}: a row per (layer, head) (heads None: every head), or per layer
        with `block` ("attn" | "mlp"; head None)."""
        cfg = self.cfg
        if mode not in ("zero", "mean"):
            raise InterventionError(f"mode {mode!r}: zero or mean")
        if block not in (None, "attn", "mlp"):
            raise InterventionError(f"block {block!r}: attn or mlp")
        if block is not None and heads is not None:
            raise InterventionError("heads or a block, not both")
        self._check_prompt(ids)
        self.engine.check_ids([target], InterventionError, "the target: ")
        site = block or "attn"
        layers = _layers(cfg, site) if layers is None else list(layers)
        bad = [il for il in layers if not 0 <= il < cfg.n_layer]
        if bad or not layers:
            raise InterventionError(f"layers {bad or layers}: the model has layers 0 .. {cfg.n_layer - 1}")
        units = [None] if block is not None else list(range(cfg.n_head)) if heads is None else list(heads)
        means = None
        if mode == "mean":
            rows = await self.site_rows(ids, site, layers)
            means = {il: [sum(col) / len(r) for col in zip(*r)] for il, r in rows.items()}
        hd = self.runner.head_dim
        cells, runs = [], []
        for il in layers:
            for head in units:
                values = None
                if means is not None:
                    m = means[il]
                    values = tuple(m if head is None else m[head * hd:(head + 1) * hd])
                cells.append((il, head))
                runs.append([Intervention(site, il, "zero" if mode == "zero" else "set",
                                          heads=None if head is None else (head,), values=values)])
        lse, logit, raw = await self._run_full(ids, [], target)
        base = logit - lse
        resume = [il - 1 if il >= 1 else None for il, _ in cells]     # layer L's sites: nothing before L changes
        res, seconds = await self.sweep(ids, runs, [target], on_progress, should_stop, resume)
        out_rows = [{"layer": il, "head": head, "logprob": r[1] - r[0], "delta": (r[1] - r[0]) - base}
                    for (il, head), r in zip(cells, res) if r is not None]
        out = {"target_id": target, "base_logprob": base, "top5_before": top_logprobs(raw, lse), "rows": out_rows,
               "runs": len(out_rows), "seconds": seconds, "stopped": len(out_rows) < len(runs)}
        if len(runs) == 1 and out_rows:
            lse1, _, raw1 = await self._run_full(ids, runs[0], target)
            out["top5_after"] = top_logprobs(raw1, lse1)
        return out

    # -- activation patching -------------------------------------------------------------------------------------
    async def patch(self, clean: list[int], corrupt: list[int], target: int, foil: int | None = None, *,
                    site: str = "resid", layers=None, on_progress=None, should_stop=None) -> dict:
        """{"target_id", "foil_id", "clean_diff", "corrupt_diff", "layers", "recovery": [[layer][position]] (None
        where a stop left it unrun), "sanity": {"diff", "clean_diff", "exact"}, "runs", "seconds", "stopped"}."""
        if len(clean) != len(corrupt):
            raise InterventionError(f"the clean prompt is {len(clean)} tokens and the corrupted one {len(corrupt)}: "
                                    f"patching matches positions one to one, so reword one until both have the "
                                    f"same number of tokens")
        if site not in self.runner.sites:
            raise InterventionError(f"site {site!r}: one of {', '.join(self.runner.sites)}")
        cfg = self.cfg
        t = self._check_prompt(clean, "the clean prompt")
        self._check_prompt(corrupt, "the corrupted prompt")
        self.engine.check_ids([target] + ([foil] if foil is not None else []), InterventionError, "the target: ")
        if t < 2 and site == "mlp":
            raise InterventionError("the mlp site needs prompts of two tokens or more")
        layers = _layers(cfg, site) if layers is None else list(layers)
        bad = [il for il in layers if not 0 <= il < cfg.n_layer]
        if bad or not layers:
            raise InterventionError(f"layers {bad or layers}: the model has layers 0 .. {cfg.n_layer - 1}")
        lse_x, _, raw_x = await self._run_full(corrupt, [], target)
        if foil is None:
            foil = top_logprobs(raw_x, lse_x, 1)[0][0]
        if foil == target:
            raise InterventionError("the foil is the target: the corrupted run already answers the target; choose "
                                    "a foil")
        (c,), _ = await self.sweep(clean, [[]], [target, foil])
        (x,), _ = await self.sweep(corrupt, [[]], [target, foil])
        clean_diff, corrupt_diff = c[1] - c[2], x[1] - x[2]
        if abs(clean_diff - corrupt_diff) < 1e-6:
            raise InterventionError("the clean and corrupted runs give the same logit difference: nothing to recover")
        last = cfg.n_layer - 1
        src = await self.site_rows(clean, site, sorted(set(layers) | ({last} if site == "resid" else set())))
        cells, runs = [], []
        for il in layers:
            for pos in range(t):
                cells.append((il, pos))
                runs.append([Intervention(site, il, "set", positions=(pos, pos + 1), values=tuple(src[il][pos]))])
        sanity = None
        if site == "resid":         # every position of the last residual from the clean run: the clean answer
            runs.append([Intervention("resid", last, "set", positions=(p, p + 1), values=tuple(src[last][p]))
                         for p in range(t)])
        # a patch at layer L changes nothing before it: resume after L (resid) or after L - 1 (attn, mlp)
        back = 0 if site == "resid" else 1
        resume = [il - back if il - back >= 0 else None for il, _ in cells] + [None] * (len(runs) - len(cells))
        res, seconds = await self.sweep(corrupt, runs, [target, foil], on_progress, should_stop, resume)
        recovery = [[None] * t for _ in layers]
        for (il, pos), r in zip(cells, res):
            if r is not None:
                recovery[layers.index(il)][pos] = ((r[1] - r[2]) - corrupt_diff) / (clean_diff - corrupt_diff)
        if site == "resid" and res[-1] is not None:
            d = res[-1][1] - res[-1][2]
            sanity = {"diff": d, "clean_diff": clean_diff, "exact": d == clean_diff}
        ran = sum(r is not None for r in res[:len(cells)])
        return {"target_id": target, "foil_id": foil, "clean_diff": clean_diff, "corrupt_diff": corrupt_diff,
                "layers": layers, "recovery": recovery, "sanity": sanity, "runs": ran, "seconds": seconds,
                "stopped": ran < len(cells)}

    # -- an expert's ablation (the Router card) ---------------------------------------------------------------------
    async def continuation(self, ids: list[int], ivs: list[Intervention], max_new: int,
                           stop: set[int] = frozenset()) -> tuple[bytes, float, list[int]]:
        """`ids` from position 0 with `ivs` in place at every step (none: a plain run), the prompt in steps of at most
        max_batch tokens, then up to max_new greedy tokens one step each (stopping after one in `stop`): (the logits
        row after the prompt, f32 [n_vocab] bytes, its log-normaliser, the greedy ids)."""
        eng = self.engine
        if not ids:
            raise InterventionError("no tokens to continue: chat first")
        eng.check_ids(ids, InterventionError)
        if len(ids) + max_new > eng.n_ctx:
            raise InterventionError(f"{len(ids)} tokens and {max_new} more pass the context of {eng.n_ctx}")
        edit = self.runner.editor(ivs) if ivs else None
        for start in range(0, len(ids), eng.max_batch):
            chunk = ids[start:start + eng.max_batch]
            eng.step(chunk, start, edit=edit)
        raw = await self.device.read(eng.scratch.logits, 4 * logits_row(eng, len(chunk)), 4 * self.cfg.n_vocab)
        row = [v for v in array("f", raw) if math.isfinite(v)]
        mx = max(row)
        lse = mx + math.log(math.fsum(math.exp(v - mx) for v in row))
        out: list[int] = []
        pos = len(ids)
        while len(out) < max_new:
            out.append(await eng.argmax())
            if out[-1] in stop or len(out) == max_new:
                break
            eng.step([out[-1]], pos, edit=edit)
            pos += 1
        return raw, lse, out

    async def expert_ablation(self, ids: list[int], layer: int, expert: int, max_new: int,
                              stop: set[int] = frozenset()) -> dict:
        """Expert `expert` of routed layer `layer` left out of the weighted sum at every position (the "expert" site:
        its weight zeroed where a token chose it, the other chosen experts' not renormalised), against the plain run:
        {"layer", "expert", "top5_before", "top5_after" ([id, log p]), "kl_bits" (KL(before || after) of the next
        token's distribution), "greedy_before", "greedy_after" (up to max_new ids), "first_change" (the first step
        where the greedy ids differ, or None), "seconds"}. The caller keeps the chat's cache aside (`kept`)."""
        t0 = time.perf_counter()
        iv = Intervention("expert", layer, "zero", experts=(expert,))
        self.runner.check([iv])
        raw0, lse0, plain = await self.continuation(ids, [], max_new, stop)
        raw1, lse1, ablated = await self.continuation(ids, [iv], max_new, stop)
        kl = 0.0
        for a, b in zip(array("f", raw0), array("f", raw1)):
            if math.isfinite(a) and math.isfinite(b):
                lp, lq = a - lse0, b - lse1
                kl += math.exp(lp) * (lp - lq)
        first = next((i for i, (a, b) in enumerate(zip(plain, ablated)) if a != b),
                     None if len(plain) == len(ablated) else min(len(plain), len(ablated)))
        return {"layer": layer, "expert": expert, "top5_before": top_logprobs(raw0, lse0),
                "top5_after": top_logprobs(raw1, lse1), "kl_bits": max(0.0, kl) / math.log(2),
                "greedy_before": plain, "greedy_after": ablated, "first_change": first,
                "seconds": time.perf_counter() - t0}

    # -- steering ----------------------------------------------------------------------------------------------
    def _bos(self) -> int | None:
        return self.engine.header.metadata.get("tokenizer.ggml.bos_token_id")

    async def mean_residual(self, prompts: list[list[int]], layer: int) -> list[float]:
        """The mean of `l_out-layer` over every position of `prompts` (a leading BOS left out)."""
        if not prompts:
            raise InterventionError("no prompts to take a mean residual over")
        if not 0 <= layer < self.cfg.n_layer:
            raise InterventionError(f"layer {layer}: the model has layers 0 .. {self.cfg.n_layer - 1}")
        bos, total, n = self._bos(), [0.0] * self.cfg.n_embd, 0
        for ids in prompts:
            rows = (await self.site_rows(ids, "resid", [layer]))[layer]
            skip = 1 if bos is not None and ids and ids[0] == bos else 0
            for r in rows[skip:]:
                total = [a + b for a, b in zip(total, r)]
                n += 1
        if not n:
            raise InterventionError("the prompts hold no token past BOS")
        return [v / n for v in total]

    async def steering_vector(self, plus: list[list[int]], minus: list[list[int]], layer: int) -> list[float]:
        """mean_residual(plus) - mean_residual(minus) at `layer`: n_embd floats."""
        a, b = await self.mean_residual(plus, layer), await self.mean_residual(minus, layer)
        return [x - y for x, y in zip(a, b)]

    async def steer(self, session, prompt: list[int], vector: list[float], layer: int, scale: float, settings,
                    max_new: int, on_token=None, should_stop=None):
        """A generation from an empty cache with vector * scale added to the residual after `layer` at every position
        (lab.engine.session.Result). The session's account of its cache is reset first."""
        if len(vector) != self.cfg.n_embd:
            raise InterventionError(f"a steering vector of {len(vector)} floats: the residual has {self.cfg.n_embd}")
        iv = Intervention("resid", layer, "add", values=tuple(v * scale for v in vector))
        session.reset()
        return await session.generate(prompt, settings, max_new, on_token, should_stop,
                                      edit=self.runner.editor([iv]))

    # -- direct logit attribution ------------------------------------------------------------------------------
    def _build_heads(self) -> None:
        cfg, dev, eng = self.cfg, self.device, self.engine
        n = cfg.n_layer * cfg.n_head
        with dev.owning(self):
            x = dev.buffer(4 * n * cfg.q_dim, gpu.CONVERSATION, "experiment.heads in [layers x heads, q]")
            y = dev.buffer(4 * n * cfg.n_embd, gpu.CONVERSATION, "experiment.heads out [layers x heads, n_embd]")
            step = ops.make_step(dev, "experiment.heads step")
            ids = dev.buffer(4, gpu.CONVERSATION, "experiment.target id")
            u = dev.buffer(4 * cfg.n_embd, gpu.CONVERSATION, "experiment.unembedding row [n_embd]")
            op_list = []
            for il in cfg.attention_layers:     # lfm2's short-conv blocks have no heads
                op_list += matmul.matmul(dev, eng.kernels, eng.weights.matrices[f"blk.{il}.attn_output.weight"], x,
                                         y, step, max_tokens=cfg.n_head, x_offset=il * cfg.n_head * cfg.q_dim,
                                         y_offset=il * cfg.n_head * cfg.n_embd)
            row = get_rows(dev, eng.kernels, eng.weights.head, ids, u, step)
        self._heads = (x, y, step, ids, u, op_list, row)

    async def _vector(self, name: str) -> list[float]:
        buf = self.engine.weights.vectors[name]
        return array("f", await self.device.read(buf, 0, 4 * self.cfg.n_embd)).tolist()

    async def _project_heads(self, last, target: int) -> tuple[list[float], array]:
        """The target's unembedding row, and each head's output at the last position (last(name, width): a traced
        tensor's last row) through its own columns of attn_output.weight: [layers x heads, n_embd] floats."""
        cfg, dev = self.cfg, self.device
        E, Q, hd, H = cfg.n_embd, cfg.q_dim, self.runner.head_dim, cfg.n_head
        if self._heads is None:
            self._build_heads()
        x, y, step, id_buf, u_buf, op_list, row = self._heads
        heads_in = array("f", bytes(4 * cfg.n_layer * H * Q))
        for il in cfg.attention_layers:
            o = last(f"kqv_out-{il}", Q)
            for h in range(H):
                base = (il * H + h) * Q + h * hd
                heads_in[base:base + hd] = array("f", o[h * hd:(h + 1) * hd])
        # the heads' rows and the target's unembedding row take the same step uniform: H rows for the matmuls, one
        # row for get_rows (it reads ids[0] only; its grid is sized by its own t)
        dev.run(ops.dispatches(op_list, H), [(step, 0, ops.step_bytes(0, H, self.engine.n_ctx)),
                                             (x, 0, heads_in.tobytes())])
        dev.run(ops.dispatches(row, 1), [(step, 0, ops.step_bytes(0, 1, self.engine.n_ctx)),
                                         (id_buf, 0, struct.pack("<I", target))])
        u = array("f", await dev.read(u_buf, 0, 4 * E)).tolist()
        per_head = array("f", await dev.read(y, 0, 4 * cfg.n_layer * H * E))
        return u, per_head

    async def attribute(self, ids: list[int], target: int) -> dict:
        """{"target_id", "logit", "embedding", "rows": [{"layer", "attn", "mlp", "heads"}], "remainder"}."""
        cfg = self.cfg
        t = self._check_prompt(ids)
        self.engine.check_ids([target], InterventionError, "the target: ")
        raw = await self.engine.traced(ids, 0)
        E, H = cfg.n_embd, cfg.n_head

        def last(name: str, width: int) -> list[float]:
            a = array("f", raw[name])
            return a[len(a) - width:].tolist()

        u, per_head = await self._project_heads(last, target)
        w_norm = await self._vector(cfg.output_norm)

        def rms(v: list[float]) -> float:
            return math.sqrt(sum(a * a for a in v) / len(v) + cfg.eps)

        x_final = last(f"l_out-{cfg.n_layer - 1}", E)
        r = rms(x_final)
        proj = [w * b / r for w, b in zip(w_norm, u)]

        def share(v) -> float:
            return math.fsum(a * b for a, b in zip(v, proj))

        embd = last("inp_scaled" if "inp_scaled" in raw else "inp_embd", E)
        rows, before = [], embd
        for il in range(cfg.n_layer):
            mid, after = last(f"ffn_inp-{il}", E), last(f"l_out-{il}", E)
            attn = [a - b for a, b in zip(mid, before)]
            mlp = [a - b for a, b in zip(after, mid)]
            heads = [per_head[(il * H + h) * E:(il * H + h + 1) * E].tolist() for h in range(H)] \
                if il in cfg.attention_layers else []      # a short-conv block (lfm2): its share is the block's
            if cfg.post_norms:      # the block added norm(o_proj): frozen at the run's scale, a head's share is linear
                total = [math.fsum(col) for col in zip(*heads)]
                w_post = await self._vector(f"blk.{il}.post_attention_norm.weight")
                s = rms(total)
                heads = [[v * w / s for v, w in zip(hv, w_post)] for hv in heads]
            rows.append({"layer": il, "attn": share(attn), "mlp": share(mlp), "heads": [share(hv) for hv in heads]})
            before = after
        logit = last("result_output", cfg.n_vocab)[target] if t else 0.0
        emb = share(embd)
        remainder = logit - (emb + math.fsum(rw["attn"] + rw["mlp"] for rw in rows))
        return {"target_id": target, "logit": logit, "embedding": emb, "rows": rows, "remainder": remainder}
