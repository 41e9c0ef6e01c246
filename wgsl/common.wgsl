// The per-step uniform every per-step kernel reads (included; no entry points, no bindings of its own).
// Bindings: none; the including kernel binds a `var<uniform> step: Step` (elementwise.wgsl's layout C: step_c).
// Math: none. Layout mirrors lab/ops/__init__.py STEP (16 bytes), written once per step by the engine:
//   pos       position of the step's first token (token j of the step sits at pos + j)
//   n_tokens  tokens in the step (t): a kernel's rows past it do nothing
//   n_ctx     rows of the KV cache
// Constants: none, so any kernel can include it (a constant in an include must be filled by every includer).

struct Step { pos: u32, n_tokens: u32, n_ctx: u32, _pad: u32 };
