"""scripts/h200_table.py (the H200 side-by-side table) on a fake results folder: `lab bench --json` files and
llama-bench `-o json` files at several depths, as scripts/device_h200.sh writes them (bench_<model>.json,
llamacpp_<model>.json, llamacpp_<model>_d<depth>.json). Each depth of --depth gets its lab column, its llama.cpp
column and their ratio; a context the lab skipped is "-" and named under the table."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location("h200_table", ROOT / "scripts" / "h200_table.py")
h200_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h200_table)


def _lab(decode: dict, **extra) -> dict:
    """A `lab bench --json` object with the fields the table reads."""
    return {"model": "/tmp/llamacpp/models/x.gguf", "weight_bytes": 1, "prefill": {"512": {"tok_s": 12000.0}},
            "decode": {str(c): {"tok_s": v} for c, v in decode.items()}, "gpu_memory_mb": {"peak": 900.0}, **extra}


def _llama(model: str, n_prompt: int, n_gen: int, depth: int, samples: list[float]) -> dict:
    """One llama-bench row (its fields as `-o json` writes them)."""
    return {"model_filename": f"/tmp/llamacpp/models/{model}.gguf", "n_prompt": n_prompt, "n_gen": n_gen,
            "n_depth": depth, "avg_ts": sum(samples) / len(samples), "samples_ts": samples,
            "gpu_info": "NVIDIA H200", "backends": "CUDA", "build_commit": "abc1234"}


@pytest.fixture
def results(tmp_path):
    """Qwen2.5 at depths 2048 and 8192 on both sides; SmolLM2 with 32768 skipped by the lab (past its 8192) and no
    llama-bench file at that depth (device_llamacpp.sh skips it too)."""
    w = lambda name, doc: (tmp_path / name).write_text(json.dumps(doc))
    w("bench_qwen2.5.json", _lab({0: 700.0, 2048: 600.0, 8192: 450.0}))
    w("bench_smollm2.json", _lab({0: 800.0, 2048: 650.0, 8192: 500.0}, skipped_contexts=[32768], n_ctx_train=8192))
    w("llamacpp_qwen2.5.json", [_llama("qwen2.5", 512, 0, 0, [36000.0, 38000.0]),
                                _llama("qwen2.5", 0, 128, 0, [870.0, 890.0])])
    w("llamacpp_qwen2.5_d2048.json", [_llama("qwen2.5", 0, 128, 2048, [790.0, 810.0])])
    w("llamacpp_qwen2.5_d8192.json", [_llama("qwen2.5", 0, 128, 8192, [495.0, 505.0])])
    w("llamacpp_smollm2_d8192.json", [_llama("smollm2", 0, 128, 8192, [620.0, 630.0])])
    return tmp_path


def rows(text: str) -> tuple[dict[str, dict[str, str]], str]:
    """The table's rows as {model label: {column: cell}}, and the note under it."""
    lines = text.splitlines()
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]
    head = cells(lines[0])
    body = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        row = dict(zip(head, cells(line)))
        body[row["model"]] = row
    return body, lines[-1]


def test_each_depth_gets_its_lab_llama_and_ratio_columns(results, capsys):
    assert h200_table.main([str(results), "--depth", "2048,8192,32768"]) == 0
    body, note = rows(capsys.readouterr().out)
    qwen, smol = body["Qwen2.5-0.5B Q5_0/Q8_0/K"], body["SmolLM2-135M Q4_1"]
    # 2048, as the one-depth table had it
    assert (qwen["lab decode 2048"], qwen["llama.cpp tg128 @2048"], qwen["lab / llama.cpp tg128 @2048"]) == \
        ("600", "800 ± 10", "0.75")
    # 8192: its own three columns, from the _d8192 file and the lab's context 8192
    assert (qwen["lab decode 8192"], qwen["llama.cpp tg128 @8192"], qwen["lab / llama.cpp tg128 @8192"]) == \
        ("450", "500 ± 5", "0.90")
    assert (smol["lab decode 8192"], smol["llama.cpp tg128 @8192"], smol["lab / llama.cpp tg128 @8192"]) == \
        ("500", "625 ± 5", "0.80")
    # 32768: no figure on either side
    assert all(r[c] == "-" for r in (qwen, smol) for c in ("lab decode 32768", "llama.cpp tg128 @32768",
                                                            "lab / llama.cpp tg128 @32768"))
    # the columns context 0 and prefill keep
    assert (qwen["lab decode ctx 0"], qwen["llama.cpp tg128"], qwen["lab / llama.cpp tg128"]) == \
        ("700", "880 ± 10", "0.80")
    assert qwen["lab / llama.cpp pp512"] == "0.32" and qwen["lab peak GPU MB"] == "900"
    assert "contexts 0, 2048, 8192 and 32768" in note
    assert "contexts past the model's own skipped: SmolLM2-135M Q4_1 32768 (past its 8192)" in note
    assert "llamacpp_qwen2.5_d8192.json" in note


def test_one_depth_is_the_table_it_was(results):
    text = h200_table.table(results)          # --depth's default, 2048
    head = text.splitlines()[0]
    assert head == ("| model | lab prefill 512 | lab decode ctx 0 | lab decode 2048 | lab peak GPU MB "
                    "| llama.cpp pp512 | llama.cpp tg128 | llama.cpp tg128 @2048 | lab / llama.cpp pp512 "
                    "| lab / llama.cpp tg128 | lab / llama.cpp tg128 @2048 |")
    assert h200_table.table(results, depth=(2048,)) == text == h200_table.table(results, depth=2048)
    assert rows(h200_table.table(results, depth=8192))[0]["Qwen2.5-0.5B Q5_0/Q8_0/K"]["lab decode 8192"] == "450"


def test_depth_must_be_a_list_of_token_counts(results, capsys):
    for bad in ("2048,8k", "0", ""):
        with pytest.raises(SystemExit):
            h200_table.main([str(results), "--depth", bad])
    assert "--depth" in capsys.readouterr().err
