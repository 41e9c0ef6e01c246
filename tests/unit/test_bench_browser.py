"""`lab bench --backend browser` without a browser: the browser and flag options, the same-shape file it benches
for --synthetic, the refusals, the prompt of a chosen length, and the arithmetic on the worker's counter
snapshots. The end-to-end run takes minutes on SwiftShader, so it is a benchmark (docs/performance.md), not a
test."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lab.format import gguf
from lab.host import cli, models
from lab.host.bench import browser as bench_browser
from lab.host.synthetic import sameshape
from lab.host.synthetic import releases as synthetic
from lab.text import chat
from lab.text.tokenizer import from_metadata

NV = "--enable-unsafe-webgpu --ignore-gpu-blocklist --enable-features=Vulkan --use-angle=vulkan 'x y'"


def test_browser_and_flags_come_from_options_then_environment_then_defaults():
    assert bench_browser.browser_command(env={}) == (bench_browser.CHROMIUM, bench_browser.ARGS)
    env = {"LAB_CHROMIUM": "/tmp/chr/shell", "LAB_CHROMIUM_FLAGS": NV}
    path, args = bench_browser.browser_command(env=env)
    assert path == "/tmp/chr/shell"
    assert args == ["--enable-unsafe-webgpu", "--ignore-gpu-blocklist", "--enable-features=Vulkan",
                    "--use-angle=vulkan", "x y"]        # replaces the SwiftShader set; shell quoting kept
    assert bench_browser.browser_command("/opt/c", "--a --b", ["--c"], env=env) == ("/opt/c", ["--a", "--b", "--c"])
    # appended flags go after whichever set won; an empty LAB_CHROMIUM_FLAGS is unset, not "no flags"
    assert bench_browser.browser_command(extra=["--x"], env={"LAB_CHROMIUM_FLAGS": ""})[1] == bench_browser.ARGS + ["--x"]
    assert bench_browser.browser_command(env={"LAB_CHROMIUM_FLAGS": NV}, flags="")[1] == bench_browser.ARGS


@pytest.fixture
def captured(monkeypatch):
    """bench_browser replaced by a recorder: what the CLI hands it, and the file's header at that moment."""
    calls = []

    def fake(path, **kw):
        h = gguf.read_file(path)
        calls.append({"path": path, "size": os.path.getsize(path), "header": h, **kw})
        return {"backend": "browser"}
    monkeypatch.setattr(bench_browser, "bench_browser", fake)
    return calls


def test_cli_hands_the_browser_options_to_the_bench(captured, monkeypatch, capsys):
    real = str(models.path("smollm2"))
    monkeypatch.setenv("LAB_CHROMIUM", "/from/env")
    monkeypatch.setenv("LAB_CHROMIUM_FLAGS", "--env-flag")
    assert cli.main(["bench", real, "--backend", "browser", "--prompts", "1,128", "--decode", "16"]) == 0
    assert (captured[-1]["chromium"], captured[-1]["args"]) == ("/from/env", ["--env-flag"])
    assert captured[-1]["prompts"] == (1, 128) and captured[-1]["decode_tokens"] == 16
    assert cli.main(["bench", real, "--backend", "browser", "--chromium", "/opt/shell", "--chromium-flags",
                     NV, "--chromium-flag=--enable-dawn-features=vulkan_enable_f16_on_nvidia",
                     "--chromium-flag=--v=1"]) == 0
    assert captured[-1]["chromium"] == "/opt/shell"
    assert captured[-1]["args"][0] == "--enable-unsafe-webgpu"
    assert captured[-1]["args"][-2:] == ["--enable-dawn-features=vulkan_enable_f16_on_nvidia", "--v=1"]
    assert captured[-1]["path"] == real
    capsys.readouterr()


def test_synthetic_in_the_browser_is_the_real_header_over_random_blocks(captured, capsys):
    real = models.path("smollm2")
    assert cli.main(["bench", "--synthetic", "smollm2", "--backend", "browser"]) == 0
    got, want = captured[-1]["header"], gguf.read_file(real)
    assert captured[-1]["size"] == real.stat().st_size
    assert got.metadata == want.metadata                 # tokenizer and chat template included
    assert [(t.name, t.shape, t.type_id, t.offset) for t in got.tensors] == \
        [(t.name, t.shape, t.type_id, t.offset) for t in want.tensors]
    assert not os.path.exists(captured[-1]["path"])      # made for the run, removed after it
    capsys.readouterr()


def test_sameshape_from_a_header_prefix_has_valid_blocks_that_are_not_the_real_ones(tmp_path):
    from gguf import GGMLQuantizationType, quants
    real = models.path("smollm2")
    prefix = tmp_path / "smollm2.head"
    prefix.write_bytes(sameshape.header_prefix(real))
    assert prefix.stat().st_size == gguf.read_file(real).data_offset < 2 * 2**20   # what travels
    out = sameshape.build(prefix, tmp_path / "s.gguf")
    h = gguf.read_file(out)
    assert out.stat().st_size == real.stat().st_size
    raw_out, raw_real = out.read_bytes(), real.read_bytes()
    for name in ("blk.0.attn_q.weight", "token_embd.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
        t = next(t for t in h.tensors if t.name == name)
        data = np.frombuffer(raw_out[t.offset:t.offset + t.nbytes], np.uint8)
        if t.type.name == "F32":
            assert np.all(data.view(np.float32) == 1.0)   # a norm: ones
            continue
        w = quants.dequantize(data.reshape(t.n_elements // t.shape[0], -1), GGMLQuantizationType[t.type.name])
        assert np.all(np.isfinite(w)) and 0 < np.abs(w).max() < 10
        assert raw_out[t.offset:t.offset + 64] != raw_real[t.offset:t.offset + 64]


def test_tokenizerless_files_and_missing_real_models_are_refused(tmp_path, capsys, monkeypatch):
    path = synthetic.write("smollm2", tmp_path / "s.gguf")
    assert cli.main(["bench", str(path), "--backend", "browser"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err
    monkeypatch.setattr(models, "cache_dir", lambda: tmp_path / "nowhere")
    assert cli.main(["bench", "--synthetic", "gemma3", "--backend", "browser"]) == 2
    assert "keeps the real model's header" in capsys.readouterr().err


def test_prompt_reaches_the_asked_length_with_the_template():
    header = gguf.read_file(models.path("smollm2"))
    tok = from_metadata(header.metadata)
    for n in (1, 32, 100):
        text = bench_browser._prompt_text(tok, header.metadata, n)
        ids = chat.render_chat(tok, header.metadata, [{"role": "user", "content": text}])
        shorter = chat.render_chat(tok, header.metadata, [{"role": "user", "content": text.rsplit(" ", 1)[0]}])
        assert len(ids) >= n and (" " not in text or len(shorter) < n)


def test_per_token_counts_are_differences_between_token_marks():
    def mark(ms, k):   # k decode steps done: each one labEncode, one mapAsync waiting 100 ms, 245 dispatches
        return {"ms": ms, "python": {"labEncode": k, "GPUBuffer.mapAsync": k, "postMessage": k + 1},
                "js": {"GPUComputePassEncoder.dispatchWorkgroups": 245 * k, "GPUCommandEncoder.beginComputePass": k},
                "wait_ms": {"GPUBuffer.mapAsync": 100.0 * k}}
    r = bench_browser._per_token([mark(1000 + 120 * k, k) for k in range(4)])
    assert r["steps"] == 3 and r["ms_per_token"] == 120
    assert r["python_js_calls"] == {"GPUBuffer.mapAsync": 1, "labEncode": 1, "postMessage": 1}
    assert r["python_js_calls_per_token"] == 3
    assert (r["dispatches_per_token"], r["compute_passes_per_token"], r["map_wait_ms_per_token"]) == (245, 1, 100)
    assert bench_browser._per_token([mark(0, 0)]) == {}


def test_sameshape_keeps_the_alignment_gaps_between_tensors(tmp_path):
    """A 3-float tensor leaves a gap before the next one (data is aligned to 32 bytes): the same-shape file must pad
    it, or every later tensor would sit off its recorded offset (the real models happen to have no gaps)."""
    import gguf as gguf_py
    w = gguf_py.GGUFWriter(str(tmp_path / "gaps.gguf"), "llama")
    w.add_tensor("a", np.zeros(3, np.float32))
    w.add_tensor("b", synthetic.random_blocks("Q8_0", 2, 64, np.random.default_rng(1)), raw_dtype=gguf_py.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    src = gguf.read_file(tmp_path / "gaps.gguf")
    a, b = src.tensors
    assert b.offset > a.offset + a.nbytes                     # the gap is there
    out = sameshape.build(tmp_path / "gaps.gguf", tmp_path / "same.gguf")
    raw = out.read_bytes()
    assert len(raw) == b.offset + b.nbytes
    scales = np.frombuffer(raw[b.offset:b.offset + b.nbytes], np.uint8).reshape(-1, 34)[:, :2].copy().view(np.float16)
    assert np.all((scales >= 1e-3) & (scales < 2e-2))         # b's blocks start where the table says
