"""numpy references (CPython only): the forward pass the GPU engine is checked against (forward.py, on weights.py's
dequantized GGUF), and the float64 references its kernels are checked against (kernels.py, attention.py, quant.py).
The forward pass and the kernels' references share one implementation of each op (ops.py).

    from lab.host.reference import Reference
    from lab.host.reference.bisect import bisect
    ref = Reference(models.path("smollm2"))
    logits = ref.forward(ids, trace=True)      # ref.trace: llama.cpp-named intermediate tensors
    bisect(ref.trace, gpu_trace, ref.trace_order, tol=1e-2)   # first tensor off by more than tol

Imports numpy and gguf, so nothing on the Pyodide path may import this package. (bisect is not
re-exported here so that `python -m lab.host.reference.bisect` runs without runpy's double-import
warning.)
"""

from lab.host.reference.forward import Reference
from lab.host.reference.weights import Hparams, Weights

__all__ = ["Hparams", "Reference", "Weights"]
