"""GGUF files made here with exact tensor layouts and random weights: the published releases' shapes and quant types
(`releases`, `lab bench --synthetic`), small files of every architecture the lab runs (`arch`, the tests' files and
the llama.cpp parity fixtures'), and same-shape copies of a real model, its header and tokenizer over random blocks
(`sameshape`)."""
