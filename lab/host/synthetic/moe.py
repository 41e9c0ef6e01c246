"""The routed experts of the synthetic mixture-of-experts files (lab.host.synthetic.arch's specs with a `Moe`): which
layers route, the router and the stacked experts that take a dense layer's FFN's place, and the metadata keys that size
them, as llama.cpp's loaders read them. The rest of such a file (attention, norms, short-conv blocks, the head) is the
dense architecture's layout, which the lab's registry gives (lab.host.synthetic.layout).

    keys = moe_keys(moe, "qwen3moe")                   # "{arch}.expert_count", ...
    shapes = with_experts(moe, n_layer, n_embd, n_ff, dense_shapes)

Facts, each from the llama.cpp that llama-cpp-python 0.3.36 vendors (vendor/llama.cpp) and runs on these files:
- names (src/llama-arch.cpp, LLM_TENSOR_NAMES): blk.N.ffn_gate_inp (the router), blk.N.ffn_gate_exps,
  blk.N.ffn_down_exps, blk.N.ffn_up_exps (the experts, stacked), blk.N.exp_probs_b (a selection bias); keys
  (LLM_KV_NAMES): "%s.expert_count", "%s.expert_used_count", "%s.expert_feed_forward_length",
  "%s.leading_dense_block_count", "%s.expert_gating_func".
- shapes, ggml order (ne0, the contiguous row, first), from the loaders (src/models/qwen3moe.cpp, llama.cpp and
  lfm2moe.cpp, load_arch_tensors): router {n_embd, n_expert}; gate and up {n_embd, n_ff_exp, n_expert}; down
  {n_ff_exp, n_embd, n_expert}; exp_probs_b.bias {n_expert}. n_ff_exp is expert_feed_forward_length (qwen3moe falls
  back to feed_forward_length / expert_used_count without it; llama's experts are feed_forward_length wide and it
  reads no expert width).
- which layers route: every layer (qwen3moe, llama with expert_count > 0), or those from leading_dense_block_count on
  (lfm2moe: the first keep ffn_gate / ffn_up / ffn_down).
- what routes (llm_graph_context::build_moe_ffn in src/llama-graph.cpp, called by each graph): router logits
  ffn_gate_inp . x; probabilities by the gating function (softmax, or sigmoid where expert_gating_func = 2); the top
  expert_used_count experts by probability (plus exp_probs_b where the file has it: the bias chooses, the unbiased
  probability weighs); the chosen weights divided by their sum (norm_w, true in all three graphs); each chosen expert's
  down(silu(gate . x) * (up . x)) weighted and summed. No shared experts in any of the three.

What it does not know: the tensors' values or types (lab.host.synthetic.arch), and the engine that runs these files
(lab.engine.blocks.moe; docs/moe.md).
"""

from __future__ import annotations

from dataclasses import dataclass

Shape = tuple[int, ...]     # GGUF order: ne0 first

# The tensors a routed layer holds in place of ffn_gate / ffn_up / ffn_down, in the order the loaders create them
ROUTER = "ffn_gate_inp.weight"
EXPERTS = ("ffn_gate_exps.weight", "ffn_down_exps.weight", "ffn_up_exps.weight")
PROBS_BIAS = "exp_probs_b.bias"
DENSE_FFN = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")

# llama_expert_gating_func_type (src/llama-hparams.h), the values of "{arch}.expert_gating_func"
SOFTMAX, SIGMOID = 1, 2


@dataclass(frozen=True)
class Moe:
    dense: str              # the architecture whose dense layout the rest of the file has (qwen3 for qwen3moe)
    n_expert: int           # {arch}.expert_count: experts per routed layer
    n_expert_used: int      # {arch}.expert_used_count: experts each token is routed to
    n_ff_exp: int = 0       # {arch}.expert_feed_forward_length (0: no such key; an expert is feed_forward_length wide)
    n_dense_lead: int = 0   # {arch}.leading_dense_block_count (0: no such key): the first layers keep a dense FFN
    gating: int = 0         # {arch}.expert_gating_func (0: no such key; the graph fixes softmax)
    probs_bias: bool = False    # blk.N.exp_probs_b.bias [n_expert] on each routed layer

    def width(self, n_ff: int) -> int:
        """An expert's hidden width: expert_feed_forward_length, or feed_forward_length where the file has none."""
        return self.n_ff_exp or n_ff

    def routed(self, il: int) -> bool:
        return il >= self.n_dense_lead


def moe_keys(moe: Moe, arch: str) -> dict:
    """The "{arch}." keys that size the experts, in the order the files write them."""
    a = arch + "."
    keys = {a + "expert_count": moe.n_expert, a + "expert_used_count": moe.n_expert_used}
    if moe.n_ff_exp:
        keys[a + "expert_feed_forward_length"] = moe.n_ff_exp
    if moe.n_dense_lead:
        keys[a + "leading_dense_block_count"] = moe.n_dense_lead
    if moe.gating:
        keys[a + "expert_gating_func"] = moe.gating
    return keys


def expert_shapes(moe: Moe, il: int, n_embd: int, n_ff: int) -> dict[str, Shape]:
    """A routed layer's router, experts (and selection bias) by name, GGUF shapes (the loaders' create_tensor order)."""
    ff = moe.width(n_ff)
    b = f"blk.{il}."
    out = {b + ROUTER: (n_embd, moe.n_expert),
           b + EXPERTS[0]: (n_embd, ff, moe.n_expert),
           b + EXPERTS[1]: (ff, n_embd, moe.n_expert),
           b + EXPERTS[2]: (n_embd, ff, moe.n_expert)}
    if moe.probs_bias:
        out[b + PROBS_BIAS] = (moe.n_expert,)
    return out


def with_experts(moe: Moe, n_layer: int, n_embd: int, n_ff: int, shapes: dict[str, Shape]) -> dict[str, Shape]:
    """`shapes` (a dense file's table, name -> GGUF shape) with each routed layer's ffn_gate / ffn_up / ffn_down
    replaced by its router and experts."""
    out = dict(shapes)
    for il in range(n_layer):
        if not moe.routed(il):
            continue
        for name in DENSE_FFN:
            del out[f"blk.{il}.{name}"]
        out.update(expert_shapes(moe, il, n_embd, n_ff))
    return out


def block_order(order: tuple[str, ...]) -> tuple[str, ...]:
    """A block's file order (names after "blk.N.") with the router and experts after ffn_norm, where the dense FFN
    starts."""
    at = order.index("ffn_norm.weight") + 1
    return order[:at] + (ROUTER, *EXPERTS, PROBS_BIAS) + order[at:]
