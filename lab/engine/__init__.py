"""The forward pass on the GPU and the conversation around it.

scratch (the buffers of a step and of the conversation, and the sizes they are made at) < blocks (each kind of layer
part: its buffers, ops, traced names and states; lab.engine.blocks) < plans (a step's ops, the blocks' in turn) <
budget (the memory budget, counted with the engine's own allocation code) < engine (weights, scratch, plans, the step)
< load (one validated load) < sampler (the CPU's draw from the top-k) < session (turns, KV reuse, the generation loop).

What it does not know: the page, the panels' questions (lab.instruments) or how bytes leave a file.
"""
