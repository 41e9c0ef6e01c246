"""Text in and out: the tokenizers built from a GGUF's vocabulary (`tokenizer/`) and the chat templates (`chat`).

What it does not know: the GPU or the engine; the ids it makes are what the engine runs.
"""
