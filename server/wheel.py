"""Builds the pure-Python `lab` wheel the worker installs into Pyodide, in memory, from the sources
on disk, so the browser always runs the code in this checkout (a stale wheel cannot be served)."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

import lab

NAME = "llm_lab"
VERSION = lab.__version__
FILENAME = f"{NAME}-{VERSION}-py3-none-any.whl"
_FIXED_TIME = (2026, 1, 1, 0, 0, 0)   # same bytes for the same sources: a cacheable, checkable wheel


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build(package_dir: Path | None = None) -> bytes:
    """The wheel's bytes: every .py file of lab/ except lab/host/ (the CPython-only tools: native backend,
    numpy reference, CLI, benchmarks), plus dist-info. The package layout decides what ships, not a list."""
    root = Path(package_dir or Path(lab.__file__).parent)
    files: list[tuple[str, bytes]] = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root.parent)
        if {"host", "__pycache__"} & set(rel.parts[1:-1]):
            continue
        files.append((rel.as_posix(), p.read_bytes()))
    dist = f"{NAME}-{VERSION}.dist-info"
    files.append((f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: llm-lab\nVersion: {VERSION}\n".encode()))
    files.append((f"{dist}/WHEEL", b"Wheel-Version: 1.0\nGenerator: llm-lab server\nRoot-Is-Purelib: true\n"
                                   b"Tag: py3-none-any\n"))
    record = [_record_line(n, d) for n, d in files] + [f"{dist}/RECORD,,"]
    files.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            z.writestr(zipfile.ZipInfo(name, _FIXED_TIME), data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()
