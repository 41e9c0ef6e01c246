"""`lab bench --backend browser`'s own options: which browser, with which flags, on which file (CPython only).

The browser and its flags: --chromium PATH, --chromium-flags "..." (the whole set, shell-quoted, replacing the
defaults) and --chromium-flag=FLAG (repeatable, appended), else LAB_CHROMIUM / LAB_CHROMIUM_FLAGS, else Debian's
Chromium on SwiftShader (lab/host/bench/browser.py browser_command). --synthetic NAME benches a same-shape file
made from the cached real model's header (lab/host/synthetic/sameshape.py): the page needs the tokenizer.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path


def add_browser_options(parser) -> None:
    parser.add_argument("--chromium", default=None,
                        help="browser: the Chromium binary (default $LAB_CHROMIUM, else /usr/bin/chromium)")
    parser.add_argument("--chromium-flags", default=None,
                        help="browser: its whole flag set as one shell-quoted string (default $LAB_CHROMIUM_FLAGS, "
                             "else WebGPU on SwiftShader)")
    parser.add_argument("--chromium-flag", action="append", default=[],
                        help="browser: one more flag, appended (repeatable); write it with '=' since it starts "
                             "with dashes: --chromium-flag=--enable-dawn-features=...")


@contextmanager
def model_file(model: str, synthetic: str | None):
    """The file to bench: `model`, or for --synthetic a same-shape copy of the cached real model (real header
    and tokenizer, random blocks), made in a temporary folder for the run."""
    if not synthetic:
        if not model:
            raise ValueError("give a GGUF file, or --synthetic NAME")
        yield model
        return
    from lab.host import models
    from lab.host.synthetic import sameshape
    real = models.path(synthetic)
    if not real.exists():
        raise ValueError(f"--synthetic {synthetic} with --backend browser keeps the real model's header and tokenizer "
                         f"(the page chats), and {real} is missing: run `make setup`, or build a file from a header "
                         f"prefix with `python -m lab.host.synthetic.sameshape build PREFIX OUT`")
    with tempfile.TemporaryDirectory() as tmp:
        yield str(sameshape.build(real, Path(tmp) / f"{synthetic}.sameshape.gguf"))
