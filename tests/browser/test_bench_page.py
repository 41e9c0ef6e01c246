"""`lab bench --backend browser --profile` end to end on the small synthetic hybrids (lab/host/synthetic/releases.py
SMALL, with the placeholder vocabulary the page chats with): the page loads the file, runs a turn per prompt length,
then times its steps by kernel family (lab/host/bench/browser.py _gpu_profile), and the command prints the JSON.

Issue #45: the profile's decode at a turn's position came after steps at 0 that leave a hybrid's conv and delta-net
states past it, and stopped there ("cannot be cut back like a KV cache"). The default run holds the worker's `profile`
on both hybrids in the booted cards' page (tests/browser/test_hybrid_page.py test_the_bench_profile_of_a_hybrid) and
natively (tests/engine/test_profile.py); this runs the command itself, a page and a browser of its own, about 35 s a
file on SwiftShader: --slow."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader

from lab.host.synthetic import releases
from tests.conftest import FIXTURES

TIMEOUT_S = 600          # a load, three turns and the profile on SwiftShader, with the machine's cores shared


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lfm2-small", "qwen35-small"])
def test_the_page_bench_of_a_hybrid_runs_with_its_profile(name):
    """Each turn's prefill and decode are measured, and the profile times the prefill at 0 and the decode at the
    shortest and the longest turn's position, every kernel family with GPU time. (A process of its own: Playwright's
    sync API will not start where this session's browser fixture already runs.)"""
    done = subprocess.run([sys.executable, "-m", "lab.host.cli", "bench", str(releases.cached(name)), "--backend",
                           "browser", "--prompts", "8,64", "--decode", "2", "--profile", "--json"],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["arch"] == releases.spec(name).arch and out["page_errors"] == []
    positions = sorted(int(p) for p in out["decode"])
    assert len(positions) == 2 and all(out["decode"][str(p)]["tok_s"] > 0 for p in positions)
    assert [k for k in out["gpu"] if not k.startswith("prefill ")] == [f"decode @{p}" for p in positions]
    for step, rows in out["gpu"].items():
        assert rows[0]["family"] == "whole step" and sum(r["dispatches"] for r in rows[1:]) == rows[0]["dispatches"]
        assert any(r["family"].startswith(("shortconv", "deltanet")) for r in rows), (step, rows)
        assert all(r["gpu_us"] > 0 for r in rows), (step, rows)


@pytest.mark.slow
def test_the_page_trains_the_windows_lab_train_does(tiny_path, tmp_path):
    """`lab train --backend browser` (lab/host/bench/browser.py train_page): the page's Training card trains the
    text's first windows in order, as `lab train` does natively, so the two runs' losses agree step for step (the
    page on SwiftShader, natively on lavapipe: f32 sums in other orders, 1e-5 relative); the JSON has the native
    command's keys and the card's held-out losses."""
    data = tmp_path / "text.txt"
    data.write_text((FIXTURES / "perplexity_text.txt").read_text())
    common = ["train", str(tiny_path), "--data", str(data), "--ctx", "16", "--batch", "2", "--steps", "3", "--json"]
    runs = {}
    for backend in ("native", "browser"):
        extra = ["--out", str(tmp_path / f"{backend}.lora.gguf")]
        done = subprocess.run([sys.executable, "-m", "lab.host.cli", *common, "--backend", backend, *extra],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[backend] = json.loads(done.stdout)
    page, native = runs["browser"], runs["native"]
    assert len(page["losses"]) == len(native["losses"]) == 3
    for a, b in zip(page["losses"], native["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), (page["losses"], native["losses"])
    assert page["tokens_per_s"] > 0 and page["first_step_s"] > 0 and page["params"] == native["params"]
    assert page["held_out"]["before"] > 0 and page["memory"]["adapter"] == native["memory"]["adapter"]
    # --out: the page's adapter as the card's download makes it, the same tensors as natively's with values to the
    # losses' agreement (AdamW's first steps move each entry by about lr, whatever its gradient's size: an entry
    # whose gradient is near zero may move either way, so most entries, not all, are held)
    files = {b: GGUFReader(tmp_path / f"{b}.lora.gguf") for b in runs}
    assert [(t.name, list(t.shape)) for t in files["browser"].tensors] == \
        [(t.name, list(t.shape)) for t in files["native"].tensors]
    for a, b in zip(files["browser"].tensors, files["native"].tensors):
        close = np.isclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-3, atol=1e-6)
        assert close.mean() > 0.99, (a.name, close.mean())
