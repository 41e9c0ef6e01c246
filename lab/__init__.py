"""llm-lab: a language model on the user's own GPU, with its insides on display.

Pure Python on purpose: the same package runs in CPython (native backend, tests, tools) and in
Pyodide inside the browser's worker. Nothing here imports numpy.
"""

__version__ = "0.1.0"
