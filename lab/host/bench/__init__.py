"""`lab bench`'s measurements: a model's load, prefill and decode natively (`native`), through headless Chromium and
the real page (`browser`, with Chromium's command line in `browser_args`), and in the browser peer, llama.cpp in wasm
(`wllama`). Speeds are recorded in docs/performance.md, never asserted by a test."""
