"""One markdown table of the lab against llama.cpp (CUDA) and PyTorch on the same GPU, from a folder of results:

    python3 scripts/h200_table.py DIR [--pp 512] [--tg 128] [--depth 2048[,8192,32768]]

What it reads in DIR (by content, so the file names may vary):
  - `lab bench --json` objects, one a file (scripts/device_bench.sh writes bench_<model>.json, docs/results holds
    h200_bench_<model>.json): prefill tok/s at --pp tokens, decode tok/s at context 0 and at each --depth, peak GPU
    memory where the JSON has it ("gpu_memory_mb": {"peak": ...}, or a top-level "*gpu*_mb" / "*gpu*_bytes"), and
    the contexts it skipped as past the model's own ("skipped_contexts");
  - llama-bench `-o json` arrays (scripts/device_llamacpp.sh writes llamacpp_<model>.json and
    llamacpp_<model>_d<depth>.json, one a depth): pp<pp>, tg<tg> and tg<tg> at each depth of --depth, as the mean of
    the repetitions (samples_ts) ± half their range;
  - scripts/torch_bench.py's JSONL (docs/results/h200_torch.jsonl): the best of its dtype x cache rows per figure.
The model of a lab file is its name's bench_<model>.json part (else its "model" path's stem), of a llama-bench row
its model_filename's stem (lab/host/synthetic/releases.py's names in both scripts), of a torch row its "model".
Each depth adds three columns, one in each group: the lab's decode, llama.cpp's tg at that depth, and their ratio;
a figure missing (a context the model cannot hold, a run cut short) is "-".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

LABELS = {"smollm2": "SmolLM2-135M Q4_1", "qwen2.5": "Qwen2.5-0.5B Q5_0/Q8_0/K", "gemma3": "Gemma 3 270M Q5_0/Q8_0/K",
          "llama3.2-1b": "Llama-3.2-1B Q4_K_M", "llama3.1-8b": "Llama-3.1-8B Q4_K_M"}


def _stem(path: str) -> str:
    return Path(path).name.removesuffix(".gguf")


def _gpu_mb(res: dict) -> float | None:
    """Peak GPU memory in MB: `lab bench`'s "gpu_memory_mb" {"peak": MB, ...}, or any top-level *gpu*_mb / _bytes."""
    for k, v in res.items():
        if "gpu" not in k:
            continue
        if isinstance(v, dict):
            v = v.get("peak")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if k.endswith(("_mb", "_mib")):
                return float(v)
            if k.endswith("_bytes"):
                return v / 1e6
    return None


def load(folder: Path) -> tuple[dict, dict, dict, list[str]]:
    """(lab, llama.cpp, torch) by model, and the files read."""
    lab, llama, torch, used = {}, {}, {}, []
    for p in sorted(folder.iterdir()):
        if p.suffix not in (".json", ".jsonl") or not p.is_file():
            continue
        text = p.read_text(errors="replace").strip()
        if not text:
            continue
        try:
            docs = [json.loads(text)]
        except json.JSONDecodeError:
            try:
                docs = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                print(f"h200_table: {p.name}: not JSON or JSONL ({exc}), skipped", file=sys.stderr)
                continue
        took = False
        for doc in docs:
            if isinstance(doc, dict) and "prefill" in doc and "decode" in doc and "weight_bytes" in doc:
                m = re.search(r"bench_(.+)\.json$", p.name)
                lab[m.group(1) if m else _stem(doc.get("model", p.stem))] = doc
                took = True
            elif isinstance(doc, dict) and "torch" in doc and "model" in doc:
                torch.setdefault(doc["model"], []).append(doc)
                took = True
            elif isinstance(doc, list) and doc and all(isinstance(r, dict) and "avg_ts" in r for r in doc):
                for r in doc:
                    llama.setdefault(_stem(r.get("model_filename", p.stem)), []).append(r)
                took = True
        if took:
            used.append(p.name)
    return lab, llama, torch, used


def _llama_cell(rows: list[dict], n_prompt: int, n_gen: int, depth: int) -> tuple[float | None, str]:
    for r in rows:
        if (r.get("n_prompt"), r.get("n_gen"), r.get("n_depth", 0)) == (n_prompt, n_gen, depth):
            samples = r.get("samples_ts") or [r["avg_ts"]]
            mean = sum(samples) / len(samples)
            half = (max(samples) - min(samples)) / 2
            return mean, f"{mean:,.0f} ± {half:,.0f}" if mean >= 100 else f"{mean:,.1f} ± {half:,.1f}"
    return None, "-"


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def _torch_best(rows: list[dict], section: str, key: int) -> float | None:
    vals = [r.get(section, {}).get(str(key), {}).get("tok_s") for r in rows]
    vals = [v for v in vals if v]
    return max(vals) if vals else None


def _and(items: list) -> str:
    return ", ".join(map(str, items[:-1])) + (" and " if len(items) > 1 else "") + str(items[-1])


def table(folder: Path, pp: int = 512, tg: int = 128, depth: int | tuple[int, ...] = 2048) -> str:
    """The markdown table; `depth`: one decode context / llama-bench depth, or several (a column of each kind each)."""
    depths = (depth,) if isinstance(depth, int) else tuple(depth)
    lab, llama, torch, used = load(folder)
    models = [m for m in LABELS if m in lab or m in llama or m in torch]
    models += sorted((set(lab) | set(llama) | set(torch)) - set(models))
    gpu = any(_gpu_mb(r) is not None for r in lab.values())
    head = ["model", f"lab prefill {pp}", "lab decode ctx 0"] + [f"lab decode {d}" for d in depths]
    head += ["lab peak GPU MB"] if gpu else []
    head += [f"llama.cpp pp{pp}", f"llama.cpp tg{tg}"] + [f"llama.cpp tg{tg} @{d}" for d in depths]
    head += [f"lab / llama.cpp pp{pp}", f"lab / llama.cpp tg{tg}"] + [f"lab / llama.cpp tg{tg} @{d}" for d in depths]
    head += [f"torch prefill {pp} / decode 0 / {' / '.join(map(str, depths))}"] if torch else []
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for m in models:
        r = lab.get(m, {})
        lp = r.get("prefill", {}).get(str(pp), {}).get("tok_s")
        l0 = r.get("decode", {}).get("0", {}).get("tok_s")
        ld = [r.get("decode", {}).get(str(d), {}).get("tok_s") for d in depths]
        rows = llama.get(m, [])
        cp, cp_s = _llama_cell(rows, pp, 0, 0)
        c0, c0_s = _llama_cell(rows, 0, tg, 0)
        cd = [_llama_cell(rows, 0, tg, d) for d in depths]
        cells = [LABELS.get(m, m), _num(lp), _num(l0)] + [_num(v) for v in ld]
        cells += [_num(_gpu_mb(r))] if gpu else []
        cells += [cp_s, c0_s] + [s for _, s in cd]
        cells += [_ratio(lp, cp), _ratio(l0, c0)] + [_ratio(v, c) for v, (c, _) in zip(ld, cd)]
        if torch:
            t = torch.get(m, [])
            cells.append("-" if not t else " / ".join(_num(_torch_best(t, s, k)) for s, k in
                                                    (("prefill", pp), ("decode", 0), *(("decode", d) for d in depths))))
        out.append("| " + " | ".join(cells) + " |")
    info = sorted({f"{r.get('gpu_info') or r.get('cpu_info', '?')}, {r.get('backends', '?')}, "
                   f"build {r.get('build_commit', '?')}" for rows in llama.values() for r in rows})
    skipped = [f"{LABELS.get(m, m)} {_and(r['skipped_contexts'])} (past its {r.get('n_ctx_train', '?')})"
               for m, r in lab.items() if r.get("skipped_contexts")]
    out += ["", (f"tok/s; lab decode is `lab bench`'s chat-loop figure at contexts {_and([0, *depths])}"
                 + (f"; contexts past the model's own skipped: {'; '.join(skipped)}" if skipped else "")
                 + ". llama.cpp: mean of the repetitions ± half their range "
                 + f"({'; '.join(info) or 'no llama-bench files'})"
                 + ("; torch: the best of its dtype x cache rows" if torch else "")
                 + f". Files: {', '.join(used) or 'none'}.")]
    return "\n".join(out)


def _depths(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token counts: {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"depths must be positive token counts: {text!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--pp", type=int, default=512, help="prefill length (lab --prompts, llama-bench -p)")
    p.add_argument("--tg", type=int, default=128, help="llama-bench -n")
    p.add_argument("--depth", type=_depths, default=(2048,),
                   help="decode contexts, comma-separated (lab --contexts, llama-bench -d; each its own columns)")
    a = p.parse_args(argv)
    print(table(a.folder, a.pp, a.tg, a.depth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
