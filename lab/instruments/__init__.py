"""What the lab's cards and checks measure on a loaded engine: probes (attention, logit lens, residuals, embedding
neighbours), the KV cache picture, Forget, perplexity, the verification against llama.cpp, GPU timing, the kernel
checks and the self-test. Each reads the engine through its public plans and buffers and never changes the
conversation behind the caller's back.

What it does not know: the page or its messages (lab.worker adapts them).
"""
