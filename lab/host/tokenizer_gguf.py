"""A trained tokenizer (lab/text/tokenizer/train.py) written as a GGUF that holds a vocabulary and no weights, which
llama.cpp opens with vocab_only (scripts/make_trained_tokenizer_fixture.py) and lab.format.gguf reads back. The
`tokenizer.ggml.*` keys are `TrainedBPE.metadata()`'s; the architecture keys are a placeholder llama's (llama.cpp reads
the hyperparameters before the vocabulary even when it loads the vocabulary alone), so the file is no model."""

from __future__ import annotations

from pathlib import Path

# The least a llama's hyperparameters must say for llama.cpp to read on to the vocabulary.
_PLACEHOLDER = {"context_length": 128, "embedding_length": 64, "block_count": 1, "feed_forward_length": 128,
                "head_count": 4}


def write_vocab_gguf(trained, path) -> Path:
    """Write `trained`'s vocabulary (tokens, token types, merges, pre-tokenizer, special ids) to `path`."""
    import gguf
    path = Path(path)
    md = trained.metadata()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llm-lab trained tokenizer (vocabulary only)")
    w.add_context_length(_PLACEHOLDER["context_length"])
    w.add_embedding_length(_PLACEHOLDER["embedding_length"])
    w.add_block_count(_PLACEHOLDER["block_count"])
    w.add_feed_forward_length(_PLACEHOLDER["feed_forward_length"])
    w.add_head_count(_PLACEHOLDER["head_count"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(md["tokenizer.ggml.model"])
    w.add_tokenizer_pre(md["tokenizer.ggml.pre"])
    w.add_token_list(md["tokenizer.ggml.tokens"])
    w.add_token_types(md["tokenizer.ggml.token_type"])
    w.add_token_merges(md["tokenizer.ggml.merges"])
    w.add_add_bos_token(md["tokenizer.ggml.add_bos_token"])
    if "tokenizer.ggml.eos_token_id" in md:
        w.add_bos_token_id(md["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(md["tokenizer.ggml.eos_token_id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
