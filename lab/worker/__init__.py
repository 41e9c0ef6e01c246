"""The page's side of the lab (Pyodide only): web/worker.js hands every message to `router.handle`, which routes it
by its type to one handler. `protocol` names the messages, `state` holds what every handler reads, `cards` says what
a loaded model's cards hold and what a new chat, Forget, an unload and a lost device do to it, the card modules
(`rope`, `verify`, `perplexity`, `retrieval`, `experiments`, `training`, `tokenizer`) adapt a card's messages to
lab.instruments (the Tokenizer card's to lab.text's trainer), and `hooks` answers tests and benchmarks.

What it does not know: how anything is computed; every answer comes from lab.engine, lab.instruments and lab.text.
"""
