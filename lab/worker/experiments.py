"""The worker's side of the Experiments card: ablation, activation patching, steering and direct logit attribution
on the loaded model (lab/worker/router.py routes the two messages here; the card is web/experiments.js; the
experiments themselves are lab/instruments/experiments.py).

    experiment-tokens {texts: {name: text}, seq}  ->  "experiment-tokens" {seq, tokens: {name: [piece, ...]}}: how
        the card's prompts tokenize (BOS included where the vocabulary adds one), as the user types them
    experiment {kind, ...its inputs, confirm, seq}  ->  "experiment-plan" {seq, kind, runs, seconds_per_run,
        estimate_s, ask, ...}, then (unless it asks) "experiment-progress" {seq, done, total, seconds, eta_s}...,
        for steering "experiment-token" {seq, which: "steered" | "plain", piece}..., and "experiment-result"
        {seq, kind, result, pieces}

The inputs, per kind (text as the user typed it; a TOKEN is one token's text, with its leading space where the
vocabulary has one, or `#ID`, lab/text/tokens.py; LAYERS and HEADS are lists and ranges, "0-3, 7", empty for all):
    ablate     {prompt, target, what: "heads" | "attn" | "mlp", layers, heads, mode: "zero" | "mean"}
    patch      {clean, corrupt, target, foil (empty: the corrupted run's top token), site, layers}
    steer      {plus, minus (one prompt a line), layer, scale, prompt, chat (the prompt as a chat message), max_new,
                settings}
    attribute  {prompt, target}

Before a sweep the worker times one plain run and says how long the sweep will take (runs x that). A sweep longer
than ASK_S waits for the page: the plan comes back with `ask` and the layers that would fit in ASK_S, and nothing
runs until the same message comes again with `confirm` (the card's "Run anyway", or its "Limit" with fewer layers).

Every run overwrites the engine's KV cache from position 0, so each experiment runs inside `Experiments.kept` of the
chat's session: the cached rows are set aside and put back, and the chat's next turn is what it would have been. The
steered and unsteered replies are generated on a session of their own, each from an empty cache, with the same
Settings (so the same seed): the chat's session never sees them.

The Experiments object (its GPU buffers, kind CONVERSATION) is made on the first experiment and held by the loaded
model (its state `cards.EXPERIMENTS` in lab/worker/state.py `Loaded.cards`): Forget wipes its buffers with the rest
while they are alive and then closes it (router.py `_forget`); a new load, an unload and a lost device close it
(lab/worker/cards.py says so).

What it does not know: the page (it posts dicts), how an experiment runs (lab/instruments/experiments.py), chat
templates (lab/text/chat.py renders the steering prompt as a user message when asked).
"""

from __future__ import annotations

import time

from lab.engine.session import Session
from lab.instruments.experiments import Experiments
from lab.instruments.interventions import InterventionError
from lab.settings import MAX_NEW, Settings
from lab.text import chat
from lab.text.tokens import token_id
from lab.worker.cards import EXPERIMENTS
from lab.worker.state import Loaded, Worker

ASK_S = 30.0            # a sweep estimated longer than this waits for the user's go-ahead (or a smaller sweep)
KINDS = ("ablate", "patch", "steer", "attribute")
SITES = ("resid", "attn", "mlp")
MAX_PROMPTS = 32        # steering prompts a side (each is one run)



# -- what the user typed ----------------------------------------------------------------------------------------
def numbers(spec: str, n: int, what: str) -> list[int] | None:
    """"0-3, 7" -> [0, 1, 2, 3, 7] within 0 .. n-1 (sorted, each once); an empty spec -> None (all of them)."""
    spec = (spec or "").strip()
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        if not part:
            continue
        a, dash, b = part.partition("-")
        if not a.isdigit() or (dash and not b.isdigit()):
            raise InterventionError(f"{what} {spec!r}: give numbers and ranges such as \"0-3, 7\" (empty: all)")
        lo, hi = int(a), int(b) if dash else int(a)
        if lo > hi:
            raise InterventionError(f"{what} {part}: a range runs from the lower number to the higher, {hi}-{lo}")
        if hi >= n:
            raise InterventionError(f"{what} {part}: the model has {what} 0 .. {n - 1}")
        out.update(range(lo, hi + 1))
    return sorted(out)


def _prompt(tok, text: str, what: str = "prompt") -> list[int]:
    if not (text or "").strip():
        raise InterventionError(f"the {what} is empty: type one")
    return tok.encode(text, add_bos=tok.add_bos)


def _lines(tok, text: str, what: str) -> list[list[int]]:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        raise InterventionError(f"no {what} prompts: type at least one, one a line")
    if len(lines) > MAX_PROMPTS:
        raise InterventionError(f"{len(lines)} {what} prompts: at most {MAX_PROMPTS}, one a line")
    return [tok.encode(line, add_bos=tok.add_bos) for line in lines]


def _fits(ids: list[int], engine, what: str) -> None:
    """A run is one step from position 0: a steering prompt must fit in the engine's batch (the experiments check
    the others, and would not say which line of the steering prompts is too long)."""
    if len(ids) > engine.max_batch:
        raise InterventionError(f"the {what} is {len(ids)} tokens; one run takes at most {engine.max_batch}: "
                                f"shorten it")


# -- the plan: what will run, and how long it will take -----------------------------------------------------------
class Plan:
    """One experiment's inputs, checked and tokenized, and its number of runs; no GPU work."""

    def __init__(self, msg: dict, lo: Loaded) -> None:
        eng, tok, cfg = lo.engine, lo.tokenizer, lo.engine.cfg
        self.kind = str(msg.get("kind") or "")
        if self.kind not in KINDS:
            raise InterventionError(f"experiment {self.kind!r}: one of {', '.join(KINDS)}")
        self.msg, self.tok, self.engine = msg, tok, eng
        self.tokens: dict[str, list[list[int]] | list[int]] = {}
        if self.kind == "steer":
            self._steering(msg, lo)
            return
        self.target = token_id(tok, _text(msg, "target", strip=False), "the target")
        if self.kind == "patch":
            self._patching(msg, cfg.n_layer)
        else:
            self.ids = _prompt(tok, msg.get("prompt"))
            self.timed = self.ids
            if self.kind == "attribute":
                self.runs = 1
                return
            self._ablation(msg, cfg.n_layer, cfg.n_head)
        self.all_layers = list(range(cfg.n_layer)) if self.layers is None else self.layers
        self.runs = self.base_runs + self.per_layer * len(self.all_layers)

    def _steering(self, msg: dict, lo: Loaded) -> None:
        """The steering inputs: both sides' prompts, the prompt the replies continue, the layer, scale and length."""
        eng, tok, n_layer = self.engine, self.tok, self.engine.cfg.n_layer
        self.plus, self.minus = _lines(tok, msg.get("plus"), "plus"), _lines(tok, msg.get("minus"), "minus")
        text = _text(msg, "prompt")
        if not text:
            raise InterventionError("the prompt is empty: type one")
        # as a chat message (the model's template), or as text to continue (behind BOS, as `lab steer`)
        self.ids = chat.render_chat(tok, lo.header.metadata, [{"role": "user", "content": text}]) \
            if msg.get("chat") else tok.encode(text, add_bos=tok.add_bos)
        self.layer = _int(msg, "layer", "layer")
        if not 0 <= self.layer < n_layer:
            raise InterventionError(f"layer {self.layer}: the model has layers 0 .. {n_layer - 1}")
        self.scale = _float(msg, "scale")
        self.max_new = int(msg.get("max_new") or MAX_NEW)
        if not 1 <= self.max_new <= eng.n_ctx - len(self.ids):
            raise InterventionError(f"{self.max_new} tokens to generate: 1 .. {eng.n_ctx - len(self.ids)} after "
                                    f"the prompt's {len(self.ids)} (the context is {eng.n_ctx})")
        self.settings = Settings.from_dict(msg.get("settings") or {})
        for side, prompts in (("plus", self.plus), ("minus", self.minus)):
            for i, ids in enumerate(prompts):
                _fits(ids, eng, f"{side} prompt on line {i + 1}")
        # one run a prompt for the vector, then the two replies' prompts (their tokens come at the chat's speed)
        self.runs = len(self.plus) + len(self.minus) + 2
        self.timed = self.ids

    def _patching(self, msg: dict, n_layer: int) -> None:
        """The patching inputs: two prompts of one length, the foil, the site and the layers swept."""
        tok = self.tok
        self.clean, self.corrupt = _prompt(tok, msg.get("clean"), "clean prompt"), \
            _prompt(tok, msg.get("corrupt"), "corrupted prompt")
        if len(self.clean) != len(self.corrupt):
            raise InterventionError(f"the clean prompt is {len(self.clean)} tokens and the corrupted one "
                                    f"{len(self.corrupt)}: patching matches positions one to one, so the lengths "
                                    f"must match; reword one until both have the same number of tokens")
        foil = _text(msg, "foil", strip=False)
        self.foil = token_id(tok, foil, "the foil") if foil else None
        self.site = str(msg.get("site") or "resid")
        if self.site not in SITES:
            raise InterventionError(f"site {self.site!r}: one of {', '.join(SITES)}")
        self.layers = numbers(msg.get("layers"), n_layer, "layers")
        self.per_layer = len(self.clean)
        # the corrupted run (its top token is the default foil), the two runs compared, the clean run's trace,
        # and for the residual the check that patching all of the last layer gives the clean run
        self.base_runs = 5 if self.site == "resid" else 4
        self.timed = self.clean

    def _ablation(self, msg: dict, n_layer: int, n_head: int) -> None:
        """The ablation inputs (the prompt is read already): what is ablated, how, at which layers and heads."""
        self.what = str(msg.get("what") or "heads")
        if self.what not in ("heads", "attn", "mlp"):
            raise InterventionError(f"ablate {self.what!r}: heads, attn or mlp")
        self.mode = str(msg.get("mode") or "zero")
        if self.mode not in ("zero", "mean"):
            raise InterventionError(f"mode {self.mode!r}: zero or mean")
        self.layers = numbers(msg.get("layers"), n_layer, "layers")
        self.heads = numbers(msg.get("heads"), n_head, "heads") if self.what == "heads" else None
        self.per_layer = (n_head if self.heads is None else len(self.heads)) if self.what == "heads" else 1
        # the plain run, the trace a mean is taken from, and for a single row the run its top 5 come from
        self.base_runs = 1 + (self.mode == "mean") + (self.per_layer * len(self.layers or range(n_layer)) == 1)

    def fitting(self, seconds_per_run: float, budget_s: float) -> list[int] | None:
        """The layers a sweep of this kind can take in budget_s (a run of consecutive layers, ending at the last one
        chosen: the late layers are where a prediction is usually made); None when even one layer does not fit."""
        if self.kind in ("steer", "attribute"):
            return None
        n = int((budget_s / seconds_per_run - self.base_runs) // self.per_layer)
        return self.all_layers[-n:] if n >= 1 else None


def _text(msg: dict, key: str, *, strip: bool = True) -> str:
    v = str(msg.get(key) or "")
    return v.strip() if strip else v


def _int(msg: dict, key: str, what: str) -> int:
    try:
        return int(msg.get(key))
    except (TypeError, ValueError):
        raise InterventionError(f"the {what} {msg.get(key)!r} is not a whole number") from None


def _float(msg: dict, key: str) -> float:
    try:
        v = float(msg.get(key))
    except (TypeError, ValueError):
        v = float("nan")
    if v != v or v in (float("inf"), float("-inf")):
        raise InterventionError(f"the {key} {msg.get(key)!r} is not a number")
    return v


# -- the Experiments object of the loaded engine -----------------------------------------------------------------
def bench(lo: Loaded) -> Experiments:
    """The loaded model's experiments (`cards.EXPERIMENTS`), made on the first experiment (this card's, or the Router
    card's ablation of an expert, lab/worker/routing.py)."""
    return lo.made(EXPERIMENTS, lambda: Experiments(lo.engine))


# -- the handlers ---------------------------------------------------------------------------------------------------
async def tokens(msg: dict, w: Worker) -> None:
    tok = w.loaded().tokenizer
    out = {}
    for name, text in (msg.get("texts") or {}).items():
        out[str(name)] = [tok.piece(i) for i in tok.encode(str(text), add_bos=tok.add_bos)] if str(text).strip() \
            else []
    w.post({"type": "experiment-tokens", "seq": msg.get("seq"), "tokens": out})


def _progress(w: Worker, seq):
    def post(done: int, total: int, seconds: float) -> None:
        eta = seconds / done * (total - done) if done else None
        w.post({"type": "experiment-progress", "seq": seq, "done": done, "total": total,
                "seconds": round(seconds, 3), "eta_s": None if eta is None else round(eta, 1)})
    return post


async def run(msg: dict, w: Worker) -> None:
    lo = w.loaded()
    seq = msg.get("seq")
    plan = Plan(msg, lo)
    exp = bench(lo)
    tok = lo.tokenizer
    async with exp.kept(lo.session):
        spr = await exp.seconds_per_run(plan.timed)
        estimate = spr * plan.runs
        ask = estimate > ASK_S and not msg.get("confirm") and plan.kind in ("ablate", "patch")
        fit = plan.fitting(spr, ASK_S) if ask else None
        w.post({"type": "experiment-plan", "seq": seq, "kind": plan.kind, "runs": plan.runs,
                "seconds_per_run": round(spr, 4), "estimate_s": round(estimate, 2), "ask": ask, "ask_s": ASK_S,
                "slow": bool(lo.engine.device.info.swiftshader or lo.engine.device.info.software),
                "fit_layers": fit, "fit_runs": None if fit is None else plan.base_runs + plan.per_layer * len(fit)})
        if ask:
            return
        w.stop_clear()
        on_progress, should_stop = _progress(w, seq), lambda: bool(w.stop_requested())
        if plan.kind == "ablate":
            result = await exp.ablate(plan.ids, plan.target, layers=plan.layers, heads=plan.heads,
                                      block=None if plan.what == "heads" else plan.what, mode=plan.mode,
                                      on_progress=on_progress, should_stop=should_stop)
            ids = [plan.target] + [i for i, _ in result["top5_before"]] + [i for i, _ in result.get("top5_after") or []]
            extra = {"prompt": [tok.piece(i) for i in plan.ids], "what": plan.what, "mode": plan.mode}
        elif plan.kind == "patch":
            result = await exp.patch(plan.clean, plan.corrupt, plan.target, plan.foil, site=plan.site,
                                     layers=plan.layers, on_progress=on_progress, should_stop=should_stop)
            ids = [result["target_id"], result["foil_id"]]
            extra = {"positions": [tok.piece(i) for i in plan.clean], "corrupt": [tok.piece(i) for i in plan.corrupt],
                     "site": plan.site}
        elif plan.kind == "attribute":
            result = await exp.attribute(plan.ids, plan.target)
            ids = [plan.target]
            extra = {"prompt": [tok.piece(i) for i in plan.ids]}
        else:
            result = await _steer(exp, plan, lo, w, seq, on_progress)
            ids = []
            extra = {}
    w.post({"type": "experiment-result", "seq": seq, "kind": plan.kind, "result": {**result, **extra},
            "pieces": {str(i): tok.piece(i) for i in ids}})


async def _steer(exp: Experiments, plan: Plan, lo: Loaded, w: Worker, seq, on_progress) -> dict:
    """The steering vector, then the steered and the plain reply, each on an empty cache of a session of their own
    with the same Settings: the two differ only by the vector."""
    n = len(plan.plus) + len(plan.minus)
    t0 = time.perf_counter()
    vector = await exp.steering_vector(plan.plus, plan.minus, plan.layer)
    on_progress(n, n, time.perf_counter() - t0)     # the vector's runs; the replies then stream token by token
    norm = sum(v * v for v in vector) ** 0.5
    session = Session(lo.engine, lo.tokenizer)
    replies = {}
    for which in ("steered", "plain"):
        def on_token(tid: int, piece: str, which=which) -> None:
            w.post({"type": "experiment-token", "seq": seq, "which": which, "piece": piece})
        session.reset()
        if which == "steered":
            res = await exp.steer(session, plan.ids, vector, plan.layer, plan.scale, plan.settings, plan.max_new,
                                  on_token=on_token, should_stop=w.stop_requested)
        else:
            res = await session.generate(plan.ids, plan.settings, plan.max_new, on_token=on_token,
                                         should_stop=w.stop_requested)
        replies[which] = res.to_dict()
        del replies[which]["prompt_ids"]
        if res.stop == "stopped":
            break
    session.reset()
    return {"layer": plan.layer, "scale": plan.scale, "vector_norm": norm, "n_plus": len(plan.plus),
            "n_minus": len(plan.minus), "prompt_tokens": len(plan.ids), "seed": plan.settings.seed,
            "steered": replies.get("steered"), "plain": replies.get("plain"), "stopped": "plain" not in replies}
