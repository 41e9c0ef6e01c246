"""`lab`'s parsers: the flags several subcommands share, each defined once, and one function a subcommand that adds
its parser with its flags in the order `lab CMD --help` lists them. Handlers live in the other modules here; this
one knows only the flags, their defaults (from their homes: lab/settings.py, lab/instruments/retrieval.py) and,
in `settings`, how the sampling flags read back."""

from __future__ import annotations

from lab.host.bench.browser_args import add_browser_options
from lab.settings import DEFAULT_CTX, PERPLEXITY_CTX, Settings

RAW_PROMPT = "raw text (BOS as the vocabulary adds it; no chat template)"
ONE_TOKEN = "one token: its text (with its leading space) or #ID"
EXPERIMENT_PAGE = ("browser: the page in headless Chromium, through the Experiments card's message (JSON with the "
                   "sweep's seconds, twice: cold, then warm)")


# --- flags several subcommands share

def model_arg(s, help: str | None = None) -> None:
    s.add_argument("model", help=help)


def gpu_flags(s) -> None:
    """--disable: for every command that opens the GPU."""
    s.add_argument("--disable", action="append", default=[], help="feature to leave off (e.g. subgroups)")


def json_flag(s, help: str | None = None) -> None:
    s.add_argument("--json", action="store_true", help=help)


def ctx_flag(s, default: int = DEFAULT_CTX, help: str = "KV cache length in tokens") -> None:
    s.add_argument("--ctx", type=int, default=default, help=help)


def engine_flags(s, ctx_help: str = "KV cache length in tokens", json_help: str | None = None,
                 ctx: int = DEFAULT_CTX) -> None:
    """--lora, --ctx, --json and --disable, in that order: the last flags of every command that loads a model
    natively."""
    lora_flag(s)
    ctx_flag(s, ctx, ctx_help)
    json_flag(s, json_help)
    gpu_flags(s)


def lora_flag(s) -> None:
    """--lora: every command that runs the model can run it with a LoRA adapter (llama.cpp's adapter GGUF)."""
    s.add_argument("--lora", default=None, metavar="FILE", help="a LoRA adapter GGUF (llama.cpp's format) to run with")


def sampling_flags(s) -> None:
    """The sampler's flags and -n, with Settings' defaults (read back by `settings`)."""
    defaults = Settings()
    s.add_argument("--greedy", action="store_true")
    s.add_argument("--temperature", type=float, default=defaults.temperature)
    s.add_argument("--top-p", type=float, default=defaults.top_p)
    s.add_argument("--top-k", type=int, default=defaults.top_k)
    s.add_argument("--min-p", type=float, default=defaults.min_p)
    s.add_argument("--seed", type=int, default=defaults.seed)
    s.add_argument("-n", type=int, default=128, help="maximum new tokens")


def settings(args) -> Settings:
    """The sampler's settings from the flags `sampling_flags` adds."""
    return Settings(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    min_p=args.min_p, seed=args.seed)


def backend_flags(s, help: str, choices: tuple[str, ...] = ("native", "browser")) -> None:
    """--backend and the browser's own options (lab/host/bench/browser_args.py)."""
    s.add_argument("--backend", choices=choices, default="native", help=help)
    add_browser_options(s)


def window_flags(s) -> None:
    """A retrieval index's windows: their length and the step between their starts."""
    from lab.instruments import retrieval
    s.add_argument("--window", type=int, default=retrieval.WINDOW, help="tokens a window holds")
    s.add_argument("--stride", type=int, default=retrieval.STRIDE, help="tokens between the starts of two windows")


def prompt_flag(s) -> None:
    s.add_argument("--prompt", required=True, help=RAW_PROMPT)


def target_flag(s) -> None:
    s.add_argument("--target", required=True, help=ONE_TOKEN)


# --- one function a subcommand: `sub` is `lab`'s subparsers, `name` the subcommand's; each returns its parser

def serve(sub, name):
    s = sub.add_parser(name, help="serve the lab page on this machine (assets only; inference runs in the browser)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", default=None, help="GGUF served as the default model (default: the cached SmolLM2)")
    return s


def info(sub, name):
    s = sub.add_parser(name, help="summarize a GGUF file from its header")
    model_arg(s)
    return s


def selftest(sub, name):
    s = sub.add_parser(name, help="run the GPU self-test through the native backend")
    gpu_flags(s)
    return s


def generate(sub, name):
    s = sub.add_parser(name, help="generate text natively (wgpu) with the same engine the page runs")
    model_arg(s)
    s.add_argument("--prompt", required=True)
    s.add_argument("--chat", action="store_true", help="render the prompt as one user message with the chat template")
    s.add_argument("--system", default=None, help="system message for --chat (default: the template's own)")
    sampling_flags(s)
    engine_flags(s)
    return s


def tokenize(sub, name):
    s = sub.add_parser(name, help="token ids of a text file (no BOS, no special-token parsing)")
    model_arg(s)
    s.add_argument("file")
    json_flag(s)
    return s


def tokenizer_train(sub, name):
    from lab.text.tokenizer import train
    s = sub.add_parser(name, help="train a byte-level BPE tokenizer on text files (pure Python); prints its bytes "
                                  "per token, and the model's with --model")
    s.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files")
    s.add_argument("--vocab", type=int, required=True,
                   help=f"tokens in all: special tokens, 256 bytes and merges (at least the specials and the bytes, at "
                        f"most {train.TOKENIZER.max_vocab:,}; training stops early when no pair is left)")
    s.add_argument("--out", required=True, metavar="FILE.json", help="where the trained tokenizer is written")
    s.add_argument("--pre", default=train.DEFAULT_PRE, choices=sorted(train.PRE_NAMES),
                   help="the pre-tokenizer that cuts the text into chunks (llama.cpp's names)")
    s.add_argument("--special", action="append", default=None, metavar="TOKEN",
                   help=f"a special token (repeatable; default {' '.join(train.DEFAULT_SPECIALS)})")
    s.add_argument("--model", default=None, metavar="GGUF", help="a model whose tokenizer is measured on the same files")
    json_flag(s)
    return s

def perplexity(sub, name):
    s = sub.add_parser(name, help="perplexity of a text file in windows, as llama.cpp's llama-perplexity")
    model_arg(s)
    s.add_argument("text", help="a UTF-8 text file (at least 2 x --ctx tokens)")
    ctx_flag(s, PERPLEXITY_CTX, "window length in tokens (llama-perplexity's -c)")
    s.add_argument("--chunks", type=int, default=None, help="score at most this many windows (llama's --chunks)")
    lora_flag(s)
    json_flag(s)
    gpu_flags(s)
    return s


def train(sub, name):
    from lab.engine.lora import DEFAULT_TARGETS
    from lab.settings import SCRATCH_PRESETS
    s = sub.add_parser(name, help="train a LoRA adapter (llama.cpp's adapter GGUF), every weight of an F32 model "
                                  "(--full: a model GGUF), or a llama model from scratch (--scratch), on a text file "
                                  "natively")
    s.add_argument("model", nargs="?", help="the GGUF to train (none with --scratch)")
    s.add_argument("--data", required=True, help="a UTF-8 text file, tokenized as `lab tokenize` does; or a .jsonl of "
                                                 "chat turns (one {\"messages\": [...]} a line, as `lab grounded-data` "
                                                 "writes), each a window in the model's chat template trained on its "
                                                 "assistant's tokens alone")
    s.add_argument("--full", action="store_true",
                   help="full fine-tuning: every weight and norm of an F32 model trained in place, written as a model "
                        "GGUF of the same architecture (the --lora-* flags then do nothing)")
    g = s.add_argument_group("from scratch", "a llama model of this shape, its weights drawn from --seed, trained "
                                             "whole and written as a model GGUF with the tokenizer's vocabulary")
    g.add_argument("--scratch", action="store_true", help="train a new model instead of MODEL")
    g.add_argument("--tokenizer", metavar="FILE.json", help="its vocabulary: a `lab tokenizer-train` file")
    g.add_argument("--preset", choices=tuple(SCRATCH_PRESETS),
                   help="a shape by name (" + ", ".join(f"{k}: {v[0]} layers x {v[1]}, {v[2]} heads, feed-forward "
                                                        f"{v[3]}" for k, v in SCRATCH_PRESETS.items())
                        + "); the flags below change it")
    g.add_argument("--layers", type=int)
    g.add_argument("--width", type=int, help="the residual stream's width (a multiple of 32)")
    g.add_argument("--heads", type=int, help="query heads (a head: a multiple of 8 wide, at most 256)")
    g.add_argument("--kv-heads", type=int, help="key/value heads (default: as many as --heads)")
    g.add_argument("--ffn", type=int, help="the feed-forward's width (default: 8/3 of --width, up to a multiple of 32)")
    s.add_argument("--sample", type=int, default=0, metavar="N",
                   help="a checkpoint's sample: the model's greedy continuation, N tokens, of a held-out window's "
                        "first 8 tokens (a training window's without --held-out; of a .jsonl, its answer to the "
                        "conversation's prompt), before the first step, every tenth "
                        "of the run and after the last")
    s.add_argument("--held-out", type=float, default=0.0, metavar="SHARE",
                   help="the share of the text's windows (its last ones, at least one) held out of training, their "
                        "loss measured before the first step, every tenth of the run and after the last")
    s.add_argument("--lora-rank", type=int, default=8)
    s.add_argument("--lora-alpha", type=float, default=None, help="default: twice the rank")
    s.add_argument("--lora-targets", default=",".join(DEFAULT_TARGETS),
                   help="the projections to adapt, by their tensor names' kind (those a model lacks are skipped)")
    s.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--warmup", type=int, default=0, help="steps of linear warm-up before the cosine decay")
    s.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled decay")
    s.add_argument("--clip", type=float, default=1.0, help="AdamW: the gradients' global norm clipped to this (0: off)")
    s.add_argument("--ctx", type=int, default=128, help="tokens a training window holds")
    s.add_argument("--batch", type=int, default=1, help="windows a step")
    s.add_argument("--seed", type=int, default=0,
                   help="the start: the adapter's (A random, B zero), or with --scratch the model's weights")
    s.add_argument("--out", default=None, help="the adapter file (default: MODEL's name + .lora.gguf, here), or with "
                                               "--full the model (MODEL's name + .trained.gguf); with --scratch the "
                                               "model (required; --steps 0 writes it untrained)")
    s.add_argument("--profile", action="store_true", help="also one window's GPU time by kernel family")
    json_flag(s, "print {losses, tokens_per_s, out, ...} as JSON")
    gpu_flags(s)
    backend_flags(s, "browser: the page's Training card in headless Chromium trains (its defaults for what it does "
                     "not ask: alpha twice the rank, clip 1, no warm-up or decay, seed 0), JSON out, no file written")
    return s


def f32_copy(sub, name):
    s = sub.add_parser(name, help="write the model with every tensor dequantized to F32 (what --full trains)")
    model_arg(s)
    s.add_argument("--out", required=True, help="the F32 file to write")
    json_flag(s)
    return s


def gradcheck(sub, name):
    from lab.engine.lora import DEFAULT_TARGETS
    s = sub.add_parser(name, help="the whole model's LoRA gradients (or with --full every weight's) on the GPU against "
                                  "float64 central differences")
    model_arg(s)
    s.add_argument("--full", action="store_true", help="full fine-tuning's gradients, of every weight of an F32 model")
    s.add_argument("--masked", action="store_true", help="the loss over an answer's tokens alone, as a .jsonl of chat "
                                                         "turns trains (a random span of each window)")
    s.add_argument("--ctx", type=int, default=16, help="tokens a window holds")
    s.add_argument("--batch", type=int, default=1)
    s.add_argument("--rank", type=int, default=4)
    s.add_argument("--lora-targets", default=",".join(DEFAULT_TARGETS),
                   help="the projections the adapter takes, by their tensor names' kind (qwen35's ssm_beta and "
                        "ssm_alpha are not default targets)")
    s.add_argument("--samples", type=int, default=2, help="entries checked a tensor (the largest gradient first)")
    s.add_argument("--seed", type=int, default=0)
    json_flag(s)
    gpu_flags(s)
    return s


def index(sub, name):
    s = sub.add_parser(name, help="index text files for `lab ask`: windows embedded by the model itself, saved to a "
                                  "file (format: lab/host/index_file.py)")
    model_arg(s)
    s.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text or Markdown; a file that is not is refused "
                                                            "by name and the others indexed")
    s.add_argument("--out", required=True, metavar="INDEX", help="the index file to write")
    window_flags(s)
    engine_flags(s, "KV cache length in tokens (more than --window)")
    return s


def ask(sub, name):
    from lab.instruments import retrieval
    s = sub.add_parser(name, help="answer a question from an index's passages: prints the hits, the prompt verbatim "
                                  "and the answer")
    model_arg(s, "the GGUF that made the index")
    s.add_argument("--index", required=True, help="a file `lab index` wrote with this model")
    s.add_argument("--question", required=True)
    s.add_argument("-k", type=int, default=retrieval.ASK_K,
                   help=f"passages packed into the prompt (at most {retrieval.MAX_K})")
    s.add_argument("--no-retrieval", action="store_true",
                   help="answer the question alone, without passages (the index is still checked; compare "
                        "with the same --seed)")
    sampling_flags(s)
    engine_flags(s, "KV cache length in tokens (prompt and answer)",
                 'print {"hits": [{rank, file, window, start_token, end_token, score, text}], "prompt", "answer"}')
    return s


def grounded_data(sub, name):
    from lab.instruments import grounded
    s = sub.add_parser(name, help="make question / passages / answer rows from text files by rule (answers quoted "
                                  "from the passages; some rows shown passages without the answer, to decline): "
                                  "SET.jsonl to train on and SET.heldout.jsonl to measure")
    s.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text or Markdown (its prose: headings, code and "
                                                            "tables are left out)")
    s.add_argument("--out", required=True, metavar="SET.jsonl")
    s.add_argument("--refusals", type=float, default=0.3,
                   help=f"the share of rows that decline (under {grounded.REFUSALS_MAX})")
    s.add_argument("--held-out", type=float, default=0.2, help="the share of passages whose questions are held out")
    s.add_argument("--per-passage", type=int, default=2, help="questions asked of a passage, at most")
    s.add_argument("--seed", type=int, default=0)
    json_flag(s)
    return s


def grounded_eval(sub, name):
    from lab.instruments import retrieval
    s = sub.add_parser(name, help="a model's greedy replies to a held-out set (`lab grounded-data`): refuses when it "
                                  "should, refuses when it should not, grounding (five-word sequences of a reply "
                                  "found verbatim in its passages)")
    model_arg(s)
    s.add_argument("--set", required=True, metavar="HELDOUT.jsonl")
    s.add_argument("--index", metavar="INDEX", help="retrieve each question's passages from this index (`lab index`) "
                                                    "instead of the row's own")
    s.add_argument("-k", type=int, default=2, help=f"passages retrieved with --index (at most {retrieval.MAX_K})")
    s.add_argument("-n", type=int, default=96, help="a reply's tokens, at most")
    s.add_argument("--limit", type=int, default=0, help="the set's first N rows only (0: all)")
    engine_flags(s, "KV cache length in tokens (prompt and reply)", ctx=1024)
    return s


def retrieval_eval(sub, name):
    from lab.instruments import retrieval
    s = sub.add_parser(name, help="recall@1 and @5 of an index of the files on random crops of them "
                                  "(in memory, nothing saved)")
    model_arg(s)
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--queries", type=int, default=retrieval.RECALL_QUERIES,
                   help=f"random {retrieval.CROP}-token crops asked")
    s.add_argument("--seed", type=int, default=0, help="seed of the crops")
    s.add_argument("--crop", type=int, default=retrieval.CROP, help="tokens a query crop holds")
    window_flags(s)
    engine_flags(s, "KV cache length in tokens (more than --window)")
    backend_flags(s, "browser: the page in headless Chromium, indexing through the retrieval card")
    return s


def train_embedder(sub, name):
    from lab.instruments import contrastive, retrieval
    s = sub.add_parser(name, help="tune the retrieval embedder (the model's mean final-norm state) contrastively on "
                                  "the files, a LoRA adapter or every weight, with recall before and after")
    model_arg(s)
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--stage", choices=(*contrastive.STAGES, "both"), default="both",
                   help="crops: two random crops of one window; query: a 16-token query inside its window; both: "
                        "crops, then query")
    s.add_argument("--steps", type=int, default=100, help="steps a stage")
    s.add_argument("--batch", type=int, default=16, help="pairs a step (each pair's negatives: the others)")
    s.add_argument("--lr", type=float, default=1e-3)
    s.add_argument("--lora-rank", type=int, default=8, help="alpha is twice the rank")
    s.add_argument("--full", action="store_true", help="every weight of an F32 model instead (a model GGUF out)")
    s.add_argument("--seed", type=int, default=0, help="the adapter's start, the pairs' and the crops' draws")
    s.add_argument("--queries", type=int, default=500, help=f"random crops of {retrieval.CROP} and 12 tokens asked")
    s.add_argument("--out", required=True, help="the adapter (or, --full, model) GGUF written")
    window_flags(s)
    ctx_flag(s, retrieval.WINDOW + 1, "KV cache length in tokens (at least --window + 1)")
    json_flag(s, 'print {"before", "overlap", "stages": [{"stage", "losses", "recall"}], "out", ...}')
    gpu_flags(s)
    return s


def ablate(sub, name):
    s = sub.add_parser(name, help="the target's log-probability with attention heads, or an attention or MLP "
                                  "block, zeroed or mean-ablated (lab/instruments/experiments.py)")
    model_arg(s)
    prompt_flag(s)
    target_flag(s)
    s.add_argument("--layer", type=int, default=None, help="one layer (default: every layer)")
    s.add_argument("--heads", default=None, help="query heads, comma-separated (default: every head)")
    s.add_argument("--block", choices=("attn", "mlp"), default=None, help="a whole block per layer instead of heads")
    s.add_argument("--mode", choices=("zero", "mean"), default="zero", help="mean: the site's mean over the prompt")
    s.add_argument("--top", type=int, default=20, help="rows printed (the largest drops first); --json has all")
    engine_flags(s, json_help='print {"target_id", "base_logprob", "rows": [{"layer", "head", "logprob", "delta"}]}')
    backend_flags(s, EXPERIMENT_PAGE)
    return s


def patch(sub, name):
    s = sub.add_parser(name, help="activation patching: the recovery of the target-foil logit difference when one "
                                  "(layer, position) of the corrupted run takes the clean run's values")
    model_arg(s)
    s.add_argument("--clean", required=True)
    s.add_argument("--corrupt", required=True, help="as many tokens as --clean")
    target_flag(s)
    s.add_argument("--foil", default=None, help="one token (default: the corrupted run's top token)")
    s.add_argument("--site", choices=("resid", "attn", "mlp"), default="resid",
                   help="resid: the residual after block L (l_out-L); attn: the attention output before its "
                        "projection; mlp: the FFN's hidden after the GLU")
    s.add_argument("--layers", default=None, help="layers, comma-separated (default: every layer)")
    engine_flags(s, json_help='print {"target_id", "foil_id", "clean_diff", "corrupt_diff", "positions", "layers", '
                              '"recovery": [[layer][position]]}')
    backend_flags(s, EXPERIMENT_PAGE)
    return s


def steer(sub, name):
    s = sub.add_parser(name, help="a steering vector (mean residual after --layer over --plus prompts minus "
                                  "over --minus prompts) added times --scale at every position: the steered and "
                                  "plain replies with the same sampler settings")
    model_arg(s)
    prompt_flag(s)
    s.add_argument("--plus", action="append", required=True, help="a prompt of the direction (repeatable)")
    s.add_argument("--minus", action="append", required=True, help="a prompt of the opposite (repeatable)")
    s.add_argument("--layer", type=int, required=True, help="the residual after this block (l_out-L)")
    s.add_argument("--scale", type=float, default=4.0, help="times the vector (negative: the other way)")
    sampling_flags(s)
    engine_flags(s, json_help='print {"layer", "scale", "vector_norm", "plain", "steered"} (each reply as `lab '
                              'generate --json` prints it)')
    return s


def attribute(sub, name):
    s = sub.add_parser(name, help="direct logit attribution: each layer's attention (and each head) and MLP "
                                  "share of one token's logit at the last position (lab/instruments/experiments.py)")
    model_arg(s)
    prompt_flag(s)
    target_flag(s)
    engine_flags(s, json_help='print {"target_id", "logit", "embedding", "rows": [{"layer", "attn", "mlp", "heads"}], '
                              '"remainder"}')
    return s


def bench(sub, name):
    s = sub.add_parser(name, help="measure load, prefill and decode speed (or `kernels`), natively or in the page")
    s.add_argument("model", nargs="?", default="", help="a GGUF file, or `kernels`")
    s.add_argument("--profile", action="store_true",
                   help="GPU time of one step by kernel family (timestamp queries): decode with --prompts 1, else a "
                        "prefill of the largest --prompts, at the largest --contexts (browser: after the turns, the "
                        "page's prefill of the largest prompt up to its step, and decode at the shortest and longest "
                        "turn's context; add --chromium-flag=--enable-webgpu-developer-features, or Chromium rounds "
                        "timestamps to 100 us)")
    s.add_argument("--synthetic", metavar="NAME",
                   help="benchmark a random GGUF with this model's exact tensor shapes and types, a name of "
                        "lab/host/synthetic/releases.py's SPECS (an unknown name prints them all); browser: the cached real "
                        "model's header and tokenizer over random blocks (lab/host/synthetic/sameshape.py), smollm2, qwen2.5 and "
                        "gemma3 only (the others: lab bench FILE --backend browser on a written file)")
    backend_flags(s, "browser: headless Chromium driving the real page, see lab/host/bench/browser.py; wllama: "
                     "the browser peer (llama.cpp in wasm) in the same browser, see lab/host/bench/wllama.py",
                  ("native", "browser", "wllama"))
    _bench_run_flags(s)
    _bench_kernel_flags(s)
    json_flag(s)
    gpu_flags(s)
    return s


def _bench_run_flags(s) -> None:
    """`lab bench MODEL`'s: the prompts, contexts and steps timed, and how the engine loads."""
    s.add_argument("--prompts", default=None, help="prefill lengths (default 128,512; browser: 32, chat template "
                                                   "included; wllama: 32, raw text of exactly that many tokens)")
    s.add_argument("--contexts", default="0,512,2048",
                   help="decode positions (native); one past the model's context_length is skipped, with a line on "
                        "stderr")
    s.add_argument("--decode", type=int, default=None,
                   help="tokens timed at each context (default 32; browser, wllama: 8)")
    s.add_argument("--batch", type=int, default=None, help="prefill chunk (tokens per step)")
    s.add_argument("--int8", action="store_true",
                   help="browser: load with the tensor-core prefill (adapters with int8 subgroup matrices)")
    s.add_argument("--kv", choices=("f32", "f16"), default="f32",
                   help="the KV cache's element type (f16: half the memory, each value rounded to f16; native and "
                        "browser)")
    s.add_argument("--warm-gpu", type=float, default=0, metavar="SECONDS",
                   help="keep the GPU busy this long before each measured prefill, decode or profile, as llama-bench's "
                        "warm-up run does (an idle GPU lowers its clocks; browser, 0: turns as typed after a pause)")


def _bench_kernel_flags(s) -> None:
    """`lab bench kernels`'s: which weight types, shapes and workgroup sizes, timed how many times."""
    s.add_argument("--repeat", type=int, default=20, help="kernels: dispatches per timed pass")
    s.add_argument("--types", default="", help="kernels: only these weight types (comma-separated, e.g. Q4_K,Q6_K)")
    s.add_argument("--shapes", default="",
                   help="kernels: rows x cols (comma-separated, e.g. 14336x4096): alone, the table's rows of these "
                        "shapes; with --types, every one of those types at every one of these shapes")
    s.add_argument("--wg", default="",
                   help="kernels: matvec threads a workgroup, comma-separated (each a row of the table; default: "
                        "lab.ops.matmul.matvec_wg's choice)")
