"""llama.cpp's intermediate tensors by their eval-callback names ("ffn_moe_topk-3"), read on its CPU backend through
llama-cpp-python. NOT part of CI: the reference venv only (scripts/make_arch_fixtures.py records the routers' choices
with it).

    with Traced(lambda name: name.startswith("ffn_moe_topk-")) as t:
        llm = llama_cpp.Llama(path, ...)        # made inside: its context carries the callback
        t.on = True
        llm.eval(ids)
        t.on = False
    t.seen["ffn_moe_topk-0"]                    # numpy, ggml's shape reversed: [n_tokens, k]

llama.cpp asks the callback (llama_context_params.cb_eval, ggml_backend_sched_eval_callback) of each graph node
whether it wants it (ask = true); a node wanted is computed at the end of a split of the graph, then handed over again
(ask = false) while its data is still in host memory (the CPU backend: tensor->data is a host pointer). The tensor is
read through a ctypes mirror of struct ggml_tensor (ggml/include/ggml.h of the vendored llama.cpp: GGML_MAX_DIMS 4,
GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64), views by their strides. Splitting the graph computes the
same ops on the same rows, so the logits of a traced run are the untraced run's (make_arch_fixtures checks that).

What it does not know: which names a graph has (llama.cpp's `cb(tensor, name, il)` calls: src/models/*.cpp,
src/llama-graph.cpp) or what they mean.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import llama_cpp
import numpy as np

# enum ggml_type values read here (ggml/include/ggml.h)
_DTYPES = {0: np.float32, 26: np.int32}


class _GgmlTensor(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
                ("padding", ctypes.c_char * 8)]


def _array(t: _GgmlTensor) -> np.ndarray:
    """A copy of tensor t's values, shape ggml's ne reversed (rows last), read by its strides."""
    dtype = _DTYPES.get(t.type)
    if dtype is None:
        raise ValueError(f"{t.name.decode()}: ggml type {t.type} is not read here")
    ne, nb = list(t.ne), list(t.nb)
    size = np.dtype(dtype).itemsize
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + size      # bytes from the first element to past the last
    base = np.frombuffer((ctypes.c_char * span).from_address(t.data), dtype, count=span // size)
    return np.lib.stride_tricks.as_strided(base, shape=ne[::-1], strides=nb[::-1]).copy()


class Traced:
    """While entered, every llama_cpp.Llama made gets a context whose eval callback keeps (in `seen`, by name) the
    tensors `want` names, while `on` is true; the last evaluation of a name wins."""

    def __init__(self, want: Callable[[str], bool]) -> None:
        self.want = want
        self.on = False
        self.seen: dict[str, np.ndarray] = {}
        self._callback = llama_cpp.llama_cpp.ggml_backend_sched_eval_callback(self._eval)
        self._defaults = None

    def _eval(self, tensor: int, ask: bool, _user: int) -> bool:
        t = ctypes.cast(tensor, ctypes.POINTER(_GgmlTensor)).contents
        name = t.name.decode(errors="replace")
        if ask:
            return self.on and self.want(name)
        if self.on and self.want(name):
            self.seen[name] = _array(t)
        return True

    def __enter__(self) -> Traced:
        lib = llama_cpp.llama_cpp
        self._defaults = lib.llama_context_default_params

        def with_callback():
            params = self._defaults()
            params.cb_eval = self._callback
            params.cb_eval_user_data = None
            return params

        lib.llama_context_default_params = with_callback
        return self

    def __exit__(self, *exc) -> None:
        llama_cpp.llama_cpp.llama_context_default_params = self._defaults
