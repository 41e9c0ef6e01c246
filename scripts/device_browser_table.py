"""The H200 browser table of docs/performance.md from scripts/device_browser.sh's bench.jsonl (one line per model
and backend: {"name", "backend", "result"}), as markdown:

    python3 scripts/device_browser_table.py bench.jsonl

Browser turns are chat turns: "ctx 0" is the shortest chat prompt (the template around a one-word message),
"2048" a prompt of about 2,048 tokens; the native figures are the same file's, measured in the same run.
"""

from __future__ import annotations

import json
import sys


def _f(v, nd=0) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def _browser_turn(res: dict, want: int) -> tuple[dict | None, dict | None, int | None]:
    """(prefill, decode, prompt tokens) of the browser turn asked for with `want` tokens."""
    p = res.get("prefill", {}).get(str(want))
    if p is None:
        return None, None, None
    n = p["prompt_tokens"]
    return p, res.get("decode", {}).get(str(n)), n


def rows(lines: list[dict]) -> list[str]:
    by = {}
    for line in lines:
        by.setdefault(line["name"], {})[line["backend"]] = line["result"]
    out = [("| model (same-shape file) | load MB/s page / native | TTFT 128 ms page / native | prefill 512 tok/s page / "
            "native (ratio) | decode ctx 0 tok/s page / native (ratio) | decode ctx 2048 page / native (ratio) | "
            "Python->JS calls / token | wasm heap MB boot -> peak |"),
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in by.items():
        b, n = r.get("browser", {}), r.get("native", {})
        np_ = n.get("prefill", {})
        nd = n.get("decode", {})
        p128, _, _ = _browser_turn(b, 128)
        p512, _, _ = _browser_turn(b, 512)
        _, d0, n0 = _browser_turn(b, 1)
        _, d2k, n2k = _browser_turn(b, 2048)
        def g(d, k):
            return (d or {}).get(k)

        def nat(k, c, nd=nd):
            return (nd.get(str(c)) or {}).get(k)
        heap = b.get("wasm_heap_mb", {})
        calls = [g(d, "python_js_calls_per_token") for d in (d0, d2k) if d]
        out.append(
            f"| {name} | {_f(b.get('load_mb_s'))} / {_f(n.get('load_mb_s'))} "
            f"| {_f(g(p128, 'ttft_ms'), 1)} / {_f(g(np_.get('128'), 'ttft_ms'), 1)} "
            f"| {_f(g(p512, 'tok_s'))} / {_f(g(np_.get('512'), 'tok_s'))} ({_ratio(g(p512, 'tok_s'), g(np_.get('512'), 'tok_s'))}) "
            f"| {_f(g(d0, 'tok_s'))} / {_f(nat('tok_s', 0))} ({_ratio(g(d0, 'tok_s'), nat('tok_s', 0))}; page ctx {n0}) "
            f"| {_f(g(d2k, 'tok_s'))} / {_f(nat('tok_s', 2048))} ({_ratio(g(d2k, 'tok_s'), nat('tok_s', 2048))}; page ctx {n2k}) "
            f"| {' / '.join(_f(c, 1) for c in calls) or '-'} "
            f"| {_f(heap.get('after_boot'), 1)} -> {_f(heap.get('peak'), 1)} |")
    return out


def main(path: str) -> int:
    with open(path) as f:
        lines = [json.loads(s) for s in f if s.strip()]
    print("\n".join(rows(lines)))
    for line in lines:
        if line["backend"] == "browser":
            a = line["result"].get("adapter_info") or {}
            print(f"\n{line['name']}: adapter {a.get('vendor')} / {a.get('architecture')}, fallback "
                  f"{a.get('isFallbackAdapter')}, page errors {len(line['result'].get('page_errors', []))}, "
                  f"n_ctx {line['result'].get('n_ctx')}, features {', '.join(a.get('features', []))}")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
