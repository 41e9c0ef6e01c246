"""The page's side of the lab (Pyodide only): web/worker.js hands every message to `router.handle`, which routes
it to one handler by its type. The other modules here adapt a card's messages to lab.instruments.

What it does not know: how anything is computed; every answer comes from lab.engine and lab.instruments.
"""
