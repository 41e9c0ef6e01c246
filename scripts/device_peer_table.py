"""The browser peer's table of docs/performance.md from `scripts/device_browser.sh peer`'s peer.jsonl, as markdown:

    python3 scripts/device_peer_table.py peer.jsonl

peer.jsonl has one line per file and run ({"name", "run", "result"}): `wllama-f16` and `wllama` (lab bench --backend
wllama with and without Dawn's vulkan_enable_f16_on_nvidia toggle), `page-f16` and `page` (the lab's page, the same
two ways), and for the real SmolLM2 `native-greedy` (lab generate's greedy ids of the fixtures' raw prompt).

One row per file and pairing, lab / wllama and their ratio (above 1: the lab ahead):
- "wllama at its best": the page as users run it (no flag) against wllama with the flag (its WebGPU path);
- "both with the flag", "both without" (wllama on its CPU path there).
The page's turns are chat turns (ctx 0: the template around one word), wllama's raw prompts of exactly the asked
length; both decode 64 greedy tokens after 1 s of warm-up. A decode figure is "-" where wllama stopped early (NaN
logits: random weights on its CPU path). Then which path wllama ran, and the greedy ids against llama.cpp's.
"""

from __future__ import annotations

import json
import sys

from device_browser_table import _browser_turn, _f, _ratio

REFS = {"cpu": "llama.cpp CPU on the file", "f32": "llama.cpp on its F32 copy"}
PAIRS = [("page", "wllama-f16", "wllama at its best: page without the flag, wllama with it"),
         ("page-f16", "wllama-f16", "both with the flag"),
         ("page", "wllama", "both without the flag")]


def _figures(res: dict) -> dict:
    """TTFT at 128, prefill 512, decode at the shortest and the 2,048 turn, load seconds, from either bench's JSON
    (bench_wllama's keys are bench_browser's)."""
    p128, _, _ = _browser_turn(res, 128)
    p512, _, _ = _browser_turn(res, 512)
    _, d0, n0 = _browser_turn(res, 1)
    _, d2k, n2k = _browser_turn(res, 2048)
    return {"ttft": (p128 or {}).get("ttft_ms"), "prefill": (p512 or {}).get("tok_s"),
            "d0": (d0 or {}).get("tok_s"), "n0": n0, "d2k": (d2k or {}).get("tok_s"), "n2k": n2k,
            "load": res.get("load_wall_s")}


def _same_prefix(a: list, b: list) -> int:
    """How many leading ids two greedy runs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def rows(lines: list[dict]) -> list[str]:
    by = {}
    for line in lines:
        by.setdefault(line["name"], {})[line["run"]] = line["result"]
    out = ["| file | pairing | prefill 512 tok/s lab / wllama (ratio) | decode ctx 0 tok/s lab / wllama (ratio) "
           "| decode ctx 2048 lab / wllama (ratio) | TTFT 128 ms lab / wllama | load s lab / wllama | wllama path |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in by.items():
        for lab_run, peer_run, label in PAIRS:
            if lab_run not in r or peer_run not in r:
                continue
            a, b = _figures(r[lab_run]), _figures(r[peer_run])
            off = r[peer_run].get("offloaded") or {}
            path = r[peer_run].get("path")
            path += f" ({off['layers']}/{off['of']} layers)" if off else " (no offload line)"
            out.append(
                f"| {name} | {label} | {_f(a['prefill'])} / {_f(b['prefill'])} ({_ratio(a['prefill'], b['prefill'])}) "
                f"| {_f(a['d0'])} / {_f(b['d0'])} ({_ratio(a['d0'], b['d0'])}; ctx {a['n0']} / {b['n0']}) "
                f"| {_f(a['d2k'])} / {_f(b['d2k'])} ({_ratio(a['d2k'], b['d2k'])}) "
                f"| {_f(a['ttft'], 1)} / {_f(b['ttft'], 1)} | {_f(a['load'], 2)} / {_f(b['load'], 2)} | {path} |")
    return out


def notes(lines: list[dict]) -> list[str]:
    """wllama's runtime (threads, isolation, shader-f16 on the adapter) and the greedy ids against llama.cpp's."""
    out = []
    native = {line["name"]: line["result"] for line in lines if line["run"] == "native-greedy"}
    for line in lines:
        res = line["result"]
        if line["run"] == "native-greedy":
            refs = next((x["result"].get("greedy", {}) for x in lines
                         if x["name"] == line["name"] and x["run"].startswith("wllama")), {})
            for kind, label in REFS.items():
                ref = (refs.get(f"llama_cpp_{kind}") or {}).get("ids")
                if ref:
                    # the lab's ids leave out the end-of-generation token it stopped at; llama.cpp's include it
                    out.append(f"- {line['name']}, the lab natively ({res.get('adapter')}): greedy ids, the first "
                               f"{_same_prefix(res['ids'], ref)} of {len(ref)} equal to {label} "
                               f"(the lab's {len(res['ids'])}, stop: {res.get('stop')})")
        if line["run"].startswith("wllama"):
            out.append(f"- {line['name']}, {line['run']}: {res.get('path')}, libllama {res.get('libllama')}, "
                       f"{res.get('threads')} thread(s) (multithread {res.get('multithread')}, cross-origin isolated "
                       f"{res.get('cross_origin_isolated')}), adapter {res.get('adapter')} with shader-f16 "
                       f"{res.get('shader_f16')}, page errors {len(res.get('page_errors', []))}")
            g = res.get("greedy", {})
            if "error" in g:
                out.append(f"  greedy ids: {g['error']}")
            for kind, label in REFS.items():
                ref = g.get(f"llama_cpp_{kind}")
                if ref:
                    out.append(f"  greedy ids: the first {ref['same_prefix']} of {len(ref['ids'])} equal to {label}")
            lab_ids = (native.get(line["name"]) or {}).get("ids")
            if lab_ids and g.get("ids"):
                out.append(f"  greedy ids: the first {_same_prefix(lab_ids, g['ids'])} of {len(lab_ids)} equal to "
                           f"the lab's (native)")
    return out


def main(path: str) -> int:
    with open(path) as f:
        lines = [json.loads(s) for s in f if s.strip()]
    print("\n".join(rows(lines)))
    print()
    print("\n".join(notes(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
