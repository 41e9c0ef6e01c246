"""A model opened natively, and a LoRA adapter file put on it: the one way every native tool loads (the CLI,
lab.host.experiments.Lab, the gradient checker, the tests). Imports are deferred: `lab --help` loads no engine.

    read_model(path)                      header, config and tokenizer, validated (nothing on a GPU yet)
    open_engine(path, n_ctx, ...)         (header, tokenizer, engine with its weights uploaded, timing)
    attach_lora(engine, path)             an adapter file checked against the engine's model and set on it
    open_untrained(shape, vocab, seed, ...)   (header, tokenizer, engine) of a llama model never trained: its weights
                                          drawn on the GPU (lab.format.untrained; a model trained from scratch)
"""

from __future__ import annotations


def read_model(model_path):
    """Header, config and tokenizer of a GGUF, validated: everything that can be refused before a GPU opens."""
    from lab.engine.load import validate
    from lab.format import gguf
    header = gguf.read_file(model_path)
    cfg, tok = validate(header)
    return header, cfg, tok


def open_engine(model_path, n_ctx: int, *, disable=(), device=None, model=None, max_batch: int | None = None,
                logits_all: bool = False, lora: str | None = None):
    """(header, tokenizer, engine, {load_s, weight_bytes}): a native engine of n_ctx positions (steps of max_batch
    rows: the engine's default unless given) on `device` (or a native device of its own, less `disable`'s features),
    the weights uploaded and timed; `model`: read_model's, if read; `lora`: an adapter file to run with. Nothing is
    left allocated when any of it fails."""
    import time

    from lab.engine.engine import Engine, read_host_values
    from lab.host.native import open_native
    header, cfg, tok = model or read_model(model_path)
    device = device or open_native(disable=tuple(disable))
    t0 = time.perf_counter()
    sizes = {"max_batch": max_batch} if max_batch else {}
    engine = Engine(device, header, cfg, n_ctx=n_ctx, logits_all=logits_all,
                    host_values=read_host_values(model_path, header, cfg), **sizes)
    try:
        nbytes = engine.weights.upload_file(model_path)
        if lora:
            attach_lora(engine, lora)
    except BaseException:
        engine.close()
        raise
    return header, tok, engine, {"load_s": time.perf_counter() - t0, "weight_bytes": nbytes}


def open_untrained(shape, vocab, seed: int, *, disable=(), device=None, max_batch: int | None = None):
    """(header, tokenizer, engine): the untrained llama model of `shape` (lab.format.untrained Shape) with the trained
    vocabulary `vocab` (lab.text.tokenizer.train TrainedBPE), an engine of shape.ctx positions (steps of max_batch
    rows: shape.ctx unless given), every weight drawn from `seed` on the GPU. Nothing is left allocated when any of
    it fails."""
    from lab.engine.load import untrained as untrained_engine
    from lab.engine.load import validate
    from lab.format import gguf, untrained
    from lab.host.native import open_native
    header = gguf.read(untrained.header_bytes(shape, vocab.kvs()))
    cfg, tok = validate(header)
    device = device or open_native(disable=tuple(disable))
    engine = untrained_engine(device, header, cfg, shape, seed, n_ctx=shape.ctx, max_batch=max_batch or shape.ctx)
    return header, tok, engine


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
