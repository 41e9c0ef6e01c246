"""numpy reference forward pass (CPython only): the oracle the GPU engine is checked against.

    from lab.reference import Reference, bisect
    ref = Reference(models.path("smollm2"))
    logits = ref.forward(ids, trace=True)      # ref.trace: llama.cpp-named intermediate tensors

Imports numpy and gguf, so nothing in the Pyodide path may import this package.
"""

from .bisect import bisect, rel_error
from .forward import Reference
from .weights import Hparams, Weights

__all__ = ["Reference", "Hparams", "Weights", "bisect", "rel_error"]
