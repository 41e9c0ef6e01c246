"""The `lab` command: serve the page, and native tools for the same engine the page runs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys


def _serve(args) -> int:
    from server.app import serve
    serve(args.host, args.port, args.model)
    return 0


def _info(args) -> int:
    from lab import gguf
    header = gguf.read_file(args.model)
    print(json.dumps(gguf.summary(header), indent=2))
    return 0


def _selftest(args) -> int:
    from lab import gpu, selftest
    device = gpu.open_native(disable=tuple(args.disable))
    print(json.dumps({"gpu": device.info.summary(), "selftest": asyncio.run(selftest.run(device))}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="serve the lab page on this machine (assets only; inference runs in the browser)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", default=None, help="GGUF served as the default model (default: the cached SmolLM2)")
    s.set_defaults(fn=_serve)

    s = sub.add_parser("info", help="summarize a GGUF file from its header")
    s.add_argument("model")
    s.set_defaults(fn=_info)

    s = sub.add_parser("selftest", help="run the GPU self-test through the native backend")
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")
    s.set_defaults(fn=_selftest)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except Exception as exc:  # one clear line for the user, not a traceback
        from lab.gguf import GGUFError
        from lab.gpu import GpuError
        if isinstance(exc, (GGUFError, GpuError, FileNotFoundError)):
            print(f"lab {args.cmd}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
