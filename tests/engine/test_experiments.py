"""The experiments' machinery (lab/instruments/experiments.py) natively on lavapipe, on the small synthetic Llama 3 file
(tests/conftest.py `tiny`: 4 layers of 256, 4 heads, SmolLM2's vocabulary; the machinery does not depend on the
weights, and what a real model's experiments show is held on SmolLM2 by tests/engine/test_interventions.py and
test_attribute.py): a batched sweep gives
what its runs give one at a time, Stop keeps the runs done, mean ablation sets the site's mean, the chat's cache and
next turn are exactly as before an experiment, steering matches the numpy reference with the same hook (prefill and
every decode step), a zero scale is the plain generation, and `lab steer --json`.

Tolerances. A sweep's picked logits are the same GPU runs' logits: bit-identical. Its log-normaliser is an f32 sum of
49,152 exponentials in a tree order, against float64 here: LSE_TOL = 1e-5 relative. The mean a mean ablation sets is
a float64 mean rounded to f32 here and in the test alike: MEAN_TOL = 1e-5 of a log-probability. Steered logits against
the reference: the forward's own agreement, 2e-3 of the logits' largest magnitude (docs/correctness.md).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from lab.engine.session import Session
from lab.host import cli
from lab.host.experiments import Lab
from lab.host.reference.forward import Reference
from lab.host.reference.interventions import hooks
from lab.instruments.interventions import Intervention
from lab.settings import Settings

LSE_TOL = 1e-5
MEAN_TOL = 1e-5
LOGIT_TOL = 2e-3
PROMPT = "The capital of France is"
N_EMBD = 256                 # synthetic_arch "llama3"


@pytest.fixture(scope="module")
def lab(device, tiny_path):
    lab = Lab.load(tiny_path, 64, device=device)
    yield lab
    lab.close()


def _lse(x: np.ndarray) -> float:
    x = x.astype(np.float64)
    m = x.max()
    return float(m + np.log(np.exp(x - m).sum()))


def test_a_sweep_is_its_runs_one_at_a_time(lab):
    ids, paris, rome = lab.encode(PROMPT), lab.token(" Paris"), lab.token(" Rome")
    runs = [[], [Intervention("attn", 3, "zero", heads=(2,))],
            [Intervention("resid", 1, "add", positions=(3, 4), values=tuple(np.linspace(-1, 1, N_EMBD)))],
            [Intervention("mlp", 2, "scale", scale=0.5)]]
    seen = []
    got, seconds = asyncio.run(lab.exp.sweep(ids, runs, [paris, rome], lambda *a: seen.append(a)))
    assert seconds > 0 and seen and seen[-1][:2] == (len(runs), len(runs))
    for ivs, (lse, lp, lr) in zip(runs, got):
        want = lab.logits(ids, ivs)
        assert (lp, lr) == (float(want[paris]), float(want[rome])), ivs
        assert abs(lse - _lse(want)) <= LSE_TOL * abs(_lse(want)), ivs
    assert got[0] != got[1] and got[1] != got[2]            # the runs did differ: each took its own interventions


def test_a_resumed_run_is_the_whole_run(lab):
    """A sweep's run that starts after layer L from the plain run's residual there (the layers before it are the plain
    run's) gives the whole run's numbers bit for bit, at every site; an intervention before L is refused."""
    ids, paris = lab.encode(PROMPT), lab.token(" Paris")
    src = lab.trace(lab.encode("The capital of Italy is"), ["l_out-1"])["l_out-1"]
    runs = [[Intervention("resid", 1, "set", positions=(2, 3), values=tuple(src[2].tolist()))],
            [Intervention("attn", 2, "zero", heads=(1,))], [Intervention("mlp", 1, "scale", scale=0.0)],
            [Intervention("resid", 3, "add", values=tuple([0.5] * N_EMBD))]]
    whole, _ = asyncio.run(lab.exp.sweep(ids, runs, [paris]))
    resumed, _ = asyncio.run(lab.exp.sweep(ids, runs, [paris], resume=[1, 1, 0, 2]))
    assert resumed == whole
    assert whole[0] != whole[1] != whole[2]
    with pytest.raises(Exception, match="earlier activation"):
        asyncio.run(lab.exp.sweep(ids, runs[:1], [paris], resume=[2]))


def test_stop_keeps_the_runs_done(lab):
    ids, paris = lab.encode(PROMPT), lab.token(" Paris")
    out = lab.ablate(ids, paris, layers=[3], should_stop=lambda: True)
    assert out["stopped"] and out["runs"] == len(out["rows"]) == 1 and out["rows"][0]["head"] == 0
    full = lab.ablate(ids, paris, layers=[3], heads=[0])
    assert full["rows"][0]["logprob"] == out["rows"][0]["logprob"]


def test_mean_ablation_sets_the_sites_mean(lab):
    ids, paris = lab.encode(PROMPT), lab.token(" Paris")
    out = lab.ablate(ids, paris, layers=[3], block="attn", mode="mean")
    mean = lab.trace(ids, ["kqv_out-3"])["kqv_out-3"].astype(np.float64).mean(axis=0)
    want = lab.logits(ids, [Intervention("attn", 3, "set", values=tuple(mean.astype(np.float32).tolist()))])
    assert out["rows"][0]["head"] is None
    assert abs(out["rows"][0]["logprob"] - (want[paris] - _lse(want))) <= MEAN_TOL
    assert len(out["top5_after"]) == 5 and out["top5_before"][0][0] == int(np.argmax(lab.logits(ids, [])))


def test_an_experiment_leaves_the_chat_as_it_was(lab):
    eng, tok = lab.engine, lab.tok
    turn1, turn2 = lab.encode("Once upon a time"), lab.encode(" there was a")
    greedy = Settings(greedy=True)

    def chat(experiment):
        s = Session(eng, tok)
        r1 = asyncio.run(s.generate(turn1, greedy, 4))
        kv = [asyncio.run(eng.device.read(k, 0, 4 * len(s.cached) * eng.cfg.kv_dim)) for k, _ in eng.kv_buffers]
        if experiment:
            async def run():
                async with lab.exp.kept(s):
                    await lab.exp.ablate(lab.encode(PROMPT), lab.token(" Paris"), layers=[3], heads=[1])
            asyncio.run(run())
        after = [asyncio.run(eng.device.read(k, 0, 4 * len(s.cached) * eng.cfg.kv_dim)) for k, _ in eng.kv_buffers]
        r2 = asyncio.run(s.generate(turn1 + r1.ids + turn2, greedy, 6))
        return kv, after, r2

    kv, after, with_exp = chat(True)
    assert after == kv, "the experiment changed the chat's cached K/V"
    _, _, without = chat(False)
    assert with_exp.reused == without.reused > 0 and with_exp.ids == without.ids
    assert not [b for b in eng.device.buffers if b.label.startswith("experiment.kept")], "the snapshot stayed"


def test_steering_matches_the_reference(lab, tiny_path):
    ids = lab.encode("I think that the movie", bos=False)
    vec = lab.steering_vector([lab.encode("I love this, it is wonderful")], [lab.encode("I hate this, it is awful")],
                              2)
    iv = Intervention("resid", 2, "add", values=tuple((vec * 6.0).tolist()))
    got = lab.steer(ids, vec, 2, 6.0, 6)
    ref = Reference(tiny_path)
    ref.hooks = hooks([iv], lab.exp.runner.head_dim)
    want_first = ref.forward(ids)[-1].astype(np.float64)
    steered_first = lab.logits(ids, [iv])
    assert np.abs(steered_first - want_first).max() <= LOGIT_TOL * np.abs(want_first).max()
    ref.reset()
    assert got.ids == ref.greedy(ids, 6), "steered greedy ids differ from the reference's with the same hook"
    plain = lab.generate(ids, 6)
    assert got.ids != plain.ids, "the steering must change the reply for this test to mean anything"
    assert lab.steer(ids, vec, 2, 0.0, 6).ids == plain.ids


def test_cli_steer_json(tiny_path, capsys):
    assert cli.main(["steer", str(tiny_path), "--prompt", "I think that the movie", "--plus", "I love it",
                     "--minus", "I hate it", "--layer", "2", "--scale", "6", "-n", "4", "--greedy", "--ctx", "64",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"layer", "scale", "vector_norm", "plain", "steered"} and out["vector_norm"] > 0
    assert len(out["plain"]["ids"]) == len(out["steered"]["ids"]) == 4


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_a_hybrid_keeps_its_states_through_an_experiment(device, arch):
    """lfm2 (short-conv blocks with a conv state that cannot be cut back) and qwen35 (delta-net layers: a conv state and
    a recurrent state, with snapshots): an experiment between two turns puts the states and the engine's account of
    them back, so the next turn reuses them and is the turn it would have been; ablation sweeps only the attention
    layers, and attribution gives the other blocks their bar without heads."""
    from lab.host.synthetic import arch as synthetic_arch
    from lab.host.models import cache_dir
    lab = Lab.load(synthetic_arch.build(arch, "f32", cache_dir() / "synthetic"), 64, device=device)
    try:
        eng, tok = lab.engine, lab.tok
        turn1, turn2 = lab.encode("The old lighthouse keeper"), lab.encode(" climbed the")
        greedy = Settings(greedy=True)

        def chat(experiment):
            s = Session(eng, tok)
            r1 = asyncio.run(s.generate(turn1, greedy, 3))
            kept = [*eng.state_buffers.values(), *eng.recurrent_buffers.values()]
            states = [asyncio.run(eng.device.read(b)) for b in kept]
            if experiment:
                async def run():
                    async with lab.exp.kept(s):
                        # another prompt (its rows land on the ring's), shorter than the conversation, mean-ablated
                        # (a traced run, which moves the engine's account of the states back to its own length)
                        out = await lab.exp.ablate(lab.encode("Once upon"), 5, mode="mean")
                        assert {r["layer"] for r in out["rows"]} == set(eng.cfg.attention_layers)
                asyncio.run(run())
            assert [asyncio.run(eng.device.read(b)) for b in kept] == states
            return asyncio.run(s.generate(turn1 + r1.ids + turn2, greedy, 5))

        with_exp, without = chat(True), chat(False)
        assert with_exp.reused == without.reused > 0 and with_exp.ids == without.ids
        att = lab.attribute(turn1, 5)
        conv = [r for r in att["rows"] if r["layer"] not in eng.cfg.attention_layers]
        assert conv and all(r["heads"] == [] for r in conv)
        assert abs(att["remainder"]) <= 1e-4 * max(1.0, abs(att["logit"]))
    finally:
        lab.close()
