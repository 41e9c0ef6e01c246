"""The file: what a GGUF holds and what each of its values may be, before anything reaches a GPU.

ggml (the tensor types, and which the kernels read) < iq_grids (the i-quants' grids) < gguf (the header reader)
< writer (GGUF files written: metadata and laid-out tensors) < rules (what one metadata key may hold, the keys every
architecture reads, ModelError) < config (one frozen Config for every architecture) < arches (one module per
architecture: its keys, flags, tensors and reading steps; inside it, base < each architecture's module < the registry)
< checks (every metadata key's type and range, through the registry) < model (from_gguf, and the tensor table a Config
expects) < adapter (LoRA adapter files: read_adapter against a model's tensor table, decode_f32, write_adapter)
< untrained (an untrained llama's shape, its GGUF header with a trained vocabulary, its weights' first values' rule).
Standard library only; imports nothing of the lab above it.
"""
