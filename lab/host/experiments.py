"""The experiments from Python, natively on wgpu (any GPU wgpu reaches, lavapipe included): load a GGUF, run it with
interventions, get numpy arrays back, and the four experiments of lab/instruments/experiments.py as plain calls. In
the spirit of TransformerLens's `run_with_hooks` and nnsight's tracing, on the user's own file:

    from lab.host.experiments import Lab
    from lab.instruments.interventions import Intervention

    lab = Lab.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = lab.encode("The capital of France is")
    paris = lab.token(" Paris")
    plain = lab.logits(ids)                                            # [n_vocab] float32, the last position
    knocked = lab.logits(ids, [Intervention("attn", 23, "zero", heads=(4,))])
    acts = lab.trace(ids, ["l_out-12", "kqv_out-23"])                  # {name: [tokens, width] float32}
    lab.ablate(ids, paris, layers=[23])                                # dicts, as `lab ablate --json` prints
    lab.close()

`lab ablate | patch | steer | attribute` (lab/host/cli/experiments.py) are this class's calls with their JSON printed.
Each call starts at position 0 and owns the engine while it runs; `generate` and `steer` keep no conversation between
calls.

What it does not know: the page (lab/worker/experiments.py drives the same instrument there).
"""

from __future__ import annotations

import asyncio

import numpy as np

from lab.engine.engine import Engine
from lab.engine.session import Result, Session
from lab.instruments.experiments import Experiments
from lab.instruments.interventions import Intervention
from lab.settings import DEFAULT_CTX, Settings
from lab.text.tokens import token_id


class Lab:
    """One model on a native GPU device, with its tokenizer and the experiments."""

    def __init__(self, engine: Engine, tokenizer) -> None:
        self.engine = engine
        self.tok = tokenizer
        self.exp = Experiments(engine)

    @classmethod
    def load(cls, path, n_ctx: int = DEFAULT_CTX, disable=(), device=None, lora: str | None = None) -> Lab:
        """Read, check and upload a GGUF (`disable`: adapter features to leave off, e.g. ("subgroups",)); `lora`: a
        LoRA adapter file every experiment runs with."""
        from lab.host.loading import open_engine
        _, tok, engine, _ = open_engine(path, n_ctx, disable=disable, device=device, lora=lora)
        return cls(engine, tok)

    def close(self) -> None:
        self.exp.close()
        self.engine.close()

    # -- text ------------------------------------------------------------------------------------------------
    def encode(self, text: str, bos: bool = True) -> list[int]:
        """Ids of raw text (BOS where the vocabulary adds one, unless bos=False); no chat template."""
        return self.tok.encode(text, add_bos=bos and self.tok.add_bos)

    def token(self, spec: str) -> int:
        """One token: its text (with its leading space where the vocabulary has one) or "#ID"."""
        return token_id(self.tok, spec)

    def piece(self, i: int) -> str:
        return self.tok.piece(i)

    # -- runs ------------------------------------------------------------------------------------------------
    def logits(self, ids: list[int], interventions: list[Intervention] = ()) -> np.ndarray:
        """The last position's logits after `ids` with the interventions in place: float32 [n_vocab]."""
        raw = asyncio.run(self.exp.runner.logits(list(ids), list(interventions)))
        return np.frombuffer(raw, np.float32).copy()

    def trace(self, ids: list[int], names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Activations of a plain run under llama.cpp's names (`attn_norm-0`, `kqv_out-3`, `l_out-29`, ...; None:
        every traced one): {name: float32 [rows, width]} (a routed layer's chosen experts, ffn_moe_topk-L: uint32)."""
        eng = self.engine
        raw = asyncio.run(eng.traced(list(ids), 0, names))
        plan = {tr.name: tr for tr in eng.step_plan(len(ids), 0).trace}
        types = {"f32": np.float32, "u32": np.uint32}
        return {n: np.frombuffer(b, types[plan[n].dtype]).reshape(-1, plan[n].width).copy() for n, b in raw.items()}

    def generate(self, ids: list[int], max_new: int = 32, settings: Settings | None = None) -> Result:
        """A plain generation from an empty cache (greedy unless `settings` say otherwise)."""
        return asyncio.run(Session(self.engine, self.tok).generate(list(ids), settings or Settings(greedy=True),
                                                                   max_new))

    # -- the four experiments --------------------------------------------------------------------------------
    def ablate(self, ids, target: int, **kw) -> dict:
        return asyncio.run(self.exp.ablate(list(ids), target, **kw))

    def patch(self, clean, corrupt, target: int, foil: int | None = None, **kw) -> dict:
        return asyncio.run(self.exp.patch(list(clean), list(corrupt), target, foil, **kw))

    def attribute(self, ids, target: int) -> dict:
        return asyncio.run(self.exp.attribute(list(ids), target))

    def steering_vector(self, plus: list[list[int]], minus: list[list[int]], layer: int) -> np.ndarray:
        return np.array(asyncio.run(self.exp.steering_vector(plus, minus, layer)), np.float32)

    def steer(self, ids, vector, layer: int, scale: float, max_new: int = 32,
              settings: Settings | None = None) -> Result:
        """A generation from an empty cache with vector * scale added to the residual after `layer` everywhere."""
        return asyncio.run(self.exp.steer(Session(self.engine, self.tok), list(ids), [float(v) for v in vector],
                                          layer, scale, settings or Settings(greedy=True), max_new))
