"""The forward pass on the GPU and the conversation around it.

scratch (the buffers of a step and of the conversation, and the sizes they are made at) < lora (a LoRA adapter's
factors on the GPU and its terms in a projection) < blocks (each kind of layer part: its buffers, ops, traced names
and states, and its backward; lab.engine.blocks) < plans (a step's ops, the blocks' in turn) < backward (training's
step: the forward again layer by layer, the loss and the gradients) < budget (the memory budget, counted with the
engine's own allocation code) < engine (weights, scratch, plans, the step) < load (one validated load) < sampler (the CPU's draw from the top-k) < session (turns, KV reuse, the generation loop).

What it does not know: the page, the panels' questions (lab.instruments) or how bytes leave a file.
"""
