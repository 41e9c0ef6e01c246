"""The file: what a GGUF holds and what each of its values may be, before anything reaches a GPU.

ggml (the tensor types, and which the kernels read) < gguf (the header reader) < checks (every metadata key's
type and range) < model (one frozen Config per architecture, and the tensor table it expects).
Standard library only; imports nothing of the lab above it.
"""
