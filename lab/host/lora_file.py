"""A LoRA adapter file (llama.cpp's adapter GGUF) put on a native engine: `attach_lora`, for `--lora` on every command
that runs a model natively (lab/host/cli) and for lab.host.experiments.Lab."""

from __future__ import annotations


def attach_lora(engine, path: str) -> None:
    """The LoRA adapter of file `path` checked against the engine's model, read, and set on the engine."""
    from lab.engine.lora import Lora
    from lab.format.adapter import decode_f32, read_adapter_file
    table = {t.name: tuple(t.shape) for t in engine.header.tensors}
    adapter = read_adapter_file(path, engine.cfg, table)
    values = {}
    with open(path, "rb") as f:
        def half(offset: int, nbytes: int, type_name: str) -> bytes:
            f.seek(offset)
            return decode_f32(f.read(nbytes), type_name).tobytes()
        for p in adapter.pairs:
            values[p.base] = (half(p.a_offset, p.a_nbytes, p.a_type), half(p.b_offset, p.b_nbytes, p.b_type))
    with engine.device.owning(engine):
        lora = Lora(engine.device, Lora.shapes_of(adapter), adapter.alpha, engine.max_batch)
    engine.device.write(lora.params, lora.packed(values))
    engine.set_lora(lora)
