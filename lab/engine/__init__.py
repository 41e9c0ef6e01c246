"""The forward pass on the GPU and the conversation around it.

scratch (activations and the KV cache) < plans (a step's ops) < budget (the memory budget, counted with the
engine's own allocation code) < engine (weights, scratch, plans, the step) < load (one validated load) < sampler
< session (turns, KV reuse, the generation loop).

What it does not know: the page, the panels' questions (lab.instruments) or how bytes leave a file.
"""
