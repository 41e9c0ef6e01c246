"""An F32 copy of a GGUF model: every tensor dequantized by gguf-py's gguf.quants and written as F32, the metadata
unchanged but general.file_type (all-F32). What full fine-tuning trains (its weights are the master copy, so they must
be F32: lab.engine.backward untrainable_full), and what llama.cpp runs when it is to round nothing of its own (the
fixture scripts hold the lab to llama.cpp on such copies). `lab f32-copy MODEL --out FILE`.

Host only (numpy, gguf-py): the page's worker has neither.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def f32_copy(src: str | Path, dst: str | Path) -> None:
    """Rewrite the GGUF `src` as `dst` with every tensor dequantized to F32 (same metadata, same tensor order)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(k, 0 if k == "general.file_type" else f.contents(), vt,
                        f.types[1] if vt == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w.add_tensor(t.name, a.reshape([int(n) for n in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
