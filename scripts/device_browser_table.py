"""The H200 browser tables of docs/performance.md from scripts/device_browser.sh's results, as markdown:

    python3 scripts/device_browser_table.py bench.jsonl      # profile_native.jsonl beside it is read too

bench.jsonl has one line per model and run ({"name", "backend", "result"}): `native`, and the page as `browser`
(each turn after 1 s of GPU work), `browser-cold` (turns as typed, after a pause), `browser-int8` (the tensor-core
prefill), `browser-nochecks` (Dawn's workgroup zero-fill and robustness checks off). Browser turns are chat turns:
"ctx 0" is the shortest chat prompt (the template around a one-word message), "2048" a prompt of about 2,048 tokens;
the native figures are the same file's, measured in the same run.

The second table is GPU time by timestamp queries (`lab/instruments/profile.py`: the page's from its worker, native's
from `lab bench --profile`): the whole step, and the families that differ most.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VARIANTS = {"browser": "page", "browser-cold": "page, cold", "browser-int8": "page, int8 prefill",
            "browser-nochecks": "page, Dawn checks off"}


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
    out = [("| model (same-shape file), run | load MB/s page / native | TTFT 128 ms page / native | prefill 512 tok/s "
            "page / native (ratio) | decode ctx 0 tok/s page / native (ratio) | decode ctx 2048 page / native (ratio) "
            "| Python->JS calls / token | wasm heap MB boot -> peak |"),
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in by.items():
        n = r.get("native", {})
        np_ = n.get("prefill", {})
        nd = n.get("decode", {})
        for variant, label in VARIANTS.items():
            if variant not in r:
                continue
            b = r[variant]
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
                f"| {name}, {label} | {_f(b.get('load_mb_s'))} / {_f(n.get('load_mb_s'))} "
                f"| {_f(g(p128, 'ttft_ms'), 1)} / {_f(g(np_.get('128'), 'ttft_ms'), 1)} "
                f"| {_f(g(p512, 'tok_s'))} / {_f(g(np_.get('512'), 'tok_s'))} ({_ratio(g(p512, 'tok_s'), g(np_.get('512'), 'tok_s'))}) "
                f"| {_f(g(d0, 'tok_s'))} / {_f(nat('tok_s', 0))} ({_ratio(g(d0, 'tok_s'), nat('tok_s', 0))}; page ctx {n0}) "
                f"| {_f(g(d2k, 'tok_s'))} / {_f(nat('tok_s', 2048))} ({_ratio(g(d2k, 'tok_s'), nat('tok_s', 2048))}; page ctx {n2k}) "
                f"| {' / '.join(_f(c, 1) for c in calls) or '-'} "
                f"| {_f(heap.get('after_boot'), 1)} -> {_f(heap.get('peak'), 1)} |")
    return out


def _short(family: str) -> str:
    """`matvec:main ACT=silu BIAS=// IN=in_norm` -> `matvec in_norm`: the kernel and what feeds it."""
    name, *consts = family.split(" ")
    feed = [c.split("=", 1)[1] for c in consts if c.startswith("IN=")]
    return " ".join([name.split(":")[0] if feed else name, *feed])


def gpu_rows(lines: list[dict], native: list[dict]) -> list[str]:
    """GPU microseconds of the same steps: the page's runs (their `gpu`) beside native's profile rows."""
    nat = {}
    for line in native:      # {"name", "t", "pos", "row"}
        nat.setdefault((line["name"], line["t"], line["pos"]), {})[line["row"]["family"]] = line["row"]["gpu_us"]
    out = ["| model, run | step | whole step us page / native | families (page / native us) |", "| --- | --- | --- | --- |"]
    for line in lines:
        gpu = line["result"].get("gpu")
        if not gpu or line["backend"] not in VARIANTS:
            continue
        for step, rows_ in gpu.items():       # "prefill 512 @0", "decode @31", ...
            t = int(step.split()[1]) if step.startswith("prefill") else 1
            pos = int(step.split("@")[1])
            mine = {r["family"]: r["gpu_us"] for r in rows_}
            theirs = nat.get((line["name"], t, pos), {})
            if not theirs and t == 1:      # the native short-context decode ran at 31: the page's shortest turn differs
                near = [k for k in nat if k[0] == line["name"] and k[1] == 1]
                theirs = nat[min(near, key=lambda k: abs(k[2] - pos))] if near else {}
            fams = sorted((f for f in mine if f != "whole step"), key=lambda f: -mine[f])[:4]
            out.append(f"| {line['name']}, {VARIANTS[line['backend']]} | {step} | {_f(mine.get('whole step'))} / "
                       f"{_f(theirs.get('whole step'))} | "
                       + "; ".join(f"{_short(f)} {_f(mine[f])} / {_f(theirs.get(f))}" for f in fams) + " |")
    return out


def main(path: str) -> int:
    with open(path) as f:
        lines = [json.loads(s) for s in f if s.strip()]
    native_path = Path(path).with_name("profile_native.jsonl")
    native = [json.loads(s) for s in native_path.read_text().splitlines() if s.strip()] if native_path.exists() else []
    print("\n".join(rows(lines)))
    print()
    print("\n".join(gpu_rows(lines, native)))
    for line in lines:
        if line["backend"].startswith("browser"):
            a = line["result"].get("adapter_info") or {}
            print(f"\n{line['name']}: adapter {a.get('vendor')} / {a.get('architecture')}, fallback "
                  f"{a.get('isFallbackAdapter')}, page errors {len(line['result'].get('page_errors', []))}, "
                  f"n_ctx {line['result'].get('n_ctx')}, features {', '.join(a.get('features', []))}")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
