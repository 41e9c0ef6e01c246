"""`lab bench --backend browser` without a browser: the refusals, the prompt of a chosen length, and the
arithmetic on the worker's counter snapshots. The end-to-end run takes minutes on SwiftShader, so it is a
benchmark (docs/performance.md), not a test."""

from __future__ import annotations

from lab import chat, gguf
from lab.host import bench_browser, cli, models, synthetic
from lab.tokenizer import from_metadata


def test_synthetic_and_tokenizerless_files_are_refused(tmp_path, capsys):
    assert cli.main(["bench", "--synthetic", "smollm2", "--backend", "browser"]) == 2
    assert "needs a tokenizer" in capsys.readouterr().err
    path = synthetic.write("smollm2", tmp_path / "s.gguf")
    assert cli.main(["bench", str(path), "--backend", "browser"]) == 2
    assert "has no tokenizer" in capsys.readouterr().err


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
