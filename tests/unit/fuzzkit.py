"""What the fuzz tests (test_fuzz_*.py) share: small GGUF seeds with the real models' tokenizer metadata,
the Hypothesis settings, the one property every hostile file must meet, and a guard that turns a hang
into a failure.

Seeds: `seed("smollm2" | "qwen2.5" | "gemma3")` is a GGUF file of a tiny model (2 blocks, width 32) of
that model's architecture, carrying the first ~1000 tokens of its real vocabulary (with the merges
among them, the scores, the token types, the special tokens and the chat template). It is built once
per session with gguf-py's writer and read back with lab.format.gguf; the real file is only read.

Examples: a fixed seed and CI_EXAMPLES per property by default (derandomize=True: every run tries the
same inputs). LAB_FUZZ_EXAMPLES=5000 runs that many per property with fresh random inputs:

    LAB_FUZZ_EXAMPLES=5000 OPENBLAS_NUM_THREADS=1 .venv/bin/pytest -q tests/unit/test_fuzz_*.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings

from lab.engine.load import validate
from lab.format import gguf
from lab.format.gguf import GGUFError
from lab.format.model import ModelError
from lab.host import models
from lab.text import chat

DEEP = int(os.environ.get("LAB_FUZZ_EXAMPLES", "0") or 0)
HANG_S = 20.0            # one example taking more CPU time than this is a hang (a real load takes < 1 s here)


def fuzz_settings(ci_examples: int):
    """CI: ci_examples, derandomized. Deep run: LAB_FUZZ_EXAMPLES, random."""
    return settings(max_examples=DEEP or ci_examples, derandomize=not DEEP, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.large_base_example, HealthCheck.filter_too_much])


class Hang(BaseException):
    """Raised by `no_hang` in the code under test: a BaseException, so no `except Exception` eats it."""


@contextlib.contextmanager
def no_hang(seconds: float = HANG_S):
    """Raise Hang once the process has spent `seconds` of CPU time in the block (ITIMER_PROF), not of wall time: a
    hang spins, while a process the machine starves does not; with wall time, a `make test-all` beside other work
    once timed out a header load in a jinja compile (2026-12-07)."""
    def alarm(_sig, _frame):
        raise Hang(f"no answer after {seconds} s of CPU time")

    old = signal.signal(signal.SIGPROF, alarm)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


# --- seeds ---------------------------------------------------------------------------------------

ARCH = {"smollm2": "llama", "qwen2.5": "qwen2", "gemma3": "gemma3"}
KEEP = {"smollm2": 1024, "qwen2.5": 1024, "gemma3": 2048}   # gemma3's byte tokens are ids 238..493
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 32, 4, 2, 64, 2


@functools.cache
def real_metadata(name: str) -> dict:
    return gguf.read_file(models.path(name)).metadata


def small_vocab(name: str) -> dict:
    """The real tokenizer metadata of `name`, cut to its first KEEP tokens plus every non-normal one
    (Qwen's control tokens sit at the end), ids renumbered, merges kept where both halves and the
    result survive."""
    md = real_metadata(name)
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    keep = list(range(KEEP[name]))
    if name == "qwen2.5":
        keep += [i for i in range(KEEP[name], len(tokens)) if types[i] != 1]
    new_id = {old: new for new, old in enumerate(keep)}
    out = {k: v for k, v in md.items() if k.startswith("tokenizer.") and not k.endswith("_token_id")}
    out["tokenizer.ggml.tokens"] = [tokens[i] for i in keep]
    out["tokenizer.ggml.token_type"] = [types[i] for i in keep]
    if "tokenizer.ggml.scores" in md:
        out["tokenizer.ggml.scores"] = [md["tokenizer.ggml.scores"][i] for i in keep]
    if "tokenizer.ggml.merges" in md:
        have = set(out["tokenizer.ggml.tokens"])
        out["tokenizer.ggml.merges"] = [m for m in md["tokenizer.ggml.merges"]
                                        if all(p in have for p in (*m.split(" ", 1), m.replace(" ", "", 1)))]
    for k, v in md.items():
        if k.endswith("_token_id") and v in new_id:
            out[k] = new_id[v]
    return out


def _add(w, key: str, v) -> None:
    from gguf import GGUFValueType as V

    def enc(s):
        return s.encode("utf-8", "surrogateescape")

    if isinstance(v, bool):
        w.add_key_value(key, v, V.BOOL)
    elif isinstance(v, int):
        w.add_key_value(key, v, V.UINT32)
    elif isinstance(v, float):
        w.add_key_value(key, v, V.FLOAT32)
    elif isinstance(v, str):
        w.add_key_value(key, enc(v), V.STRING)
    elif v and isinstance(v[0], str):
        w.add_key_value(key, [enc(s) for s in v], V.ARRAY, sub_type=V.STRING)
    elif v and isinstance(v[0], float):
        w.add_key_value(key, v, V.ARRAY, sub_type=V.FLOAT32)
    else:
        w.add_key_value(key, v, V.ARRAY, sub_type=V.INT32)


def write_seed(name: str, path: Path) -> Path:
    from gguf import GGUFWriter
    arch, vocab = ARCH[name], small_vocab(name)
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    gemma = arch == "gemma3"
    head_dim = 16 if gemma else N_EMBD // N_HEAD
    w = GGUFWriter(str(path), arch)
    a = arch + "."
    for k, v in {"block_count": N_LAYER, "embedding_length": N_EMBD, "feed_forward_length": N_FF,
                 "context_length": 256, "attention.head_count": N_HEAD, "attention.head_count_kv": N_HEAD_KV,
                 "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0,
                 "rope.dimension_count": head_dim, "vocab_size": n_vocab}.items():
        _add(w, a + k, v)
    if gemma:
        for k, v in {"attention.key_length": head_dim, "attention.value_length": head_dim,
                     "attention.sliding_window": 8}.items():
            _add(w, a + k, v)
    for k, v in vocab.items():
        _add(w, k, v)
    rng = np.random.default_rng(0)
    q, kv = N_HEAD * head_dim, N_HEAD_KV * head_dim

    def t(tname, *shape):     # GGUF shape, ne0 first: numpy's is reversed
        w.add_tensor(tname, rng.standard_normal(tuple(reversed(shape)), dtype=np.float32))

    t("token_embd.weight", N_EMBD, n_vocab)
    t("output_norm.weight", N_EMBD)
    if arch == "qwen2":
        t("output.weight", N_EMBD, n_vocab)
    for il in range(N_LAYER):
        b = f"blk.{il}."
        t(b + "attn_norm.weight", N_EMBD)
        t(b + "ffn_norm.weight", N_EMBD)
        for role, shape in (("attn_q", (N_EMBD, q)), ("attn_k", (N_EMBD, kv)), ("attn_v", (N_EMBD, kv)),
                            ("attn_output", (q, N_EMBD)), ("ffn_gate", (N_EMBD, N_FF)), ("ffn_up", (N_EMBD, N_FF)),
                            ("ffn_down", (N_FF, N_EMBD))):
            t(b + role + ".weight", *shape)
        if arch == "qwen2":
            for role, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                t(b + role + ".bias", n)
        if gemma:
            for n in ("post_attention_norm", "post_ffw_norm"):
                t(b + n + ".weight", N_EMBD)
            t(b + "attn_q_norm.weight", head_dim)
            t(b + "attn_k_norm.weight", head_dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@functools.cache
def seed(name: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        return write_seed(name, Path(tmp) / f"{name}.gguf").read_bytes()


@functools.cache
def seed_header(name: str) -> gguf.Header:
    data = seed(name)
    return gguf.read(data, len(data))


def with_metadata(h: gguf.Header, md: dict) -> gguf.Header:
    return dataclasses.replace(h, metadata=md)


# --- the property --------------------------------------------------------------------------------

def use(checked, md: dict) -> None:
    """What the page and the CLI do next with a model that passed: it must not fail either."""
    cfg, tok = checked
    for v in (cfg.eps, cfg.rope_base, cfg.rope_base_local, cfg.rope_scale, cfg.attn_scale, cfg.embd_scale,
              cfg.attn_softcap, cfg.final_softcap):
        assert v == v and abs(v) < 3.5e38, cfg
    assert cfg.eps > 0 and cfg.rope_base > 1 and cfg.rope_scale > 0
    assert tok.vocab_size == cfg.n_vocab
    for tid in (tok.bos_id, tok.eos_id, tok.unk_id, *tok.eos_ids):
        assert tid is None or 0 <= tid < tok.vocab_size
    ids = tok.encode("Hello, wörld! <|im_start|> 12345\n", add_bos=tok.add_bos)
    assert all(0 <= i < tok.vocab_size for i in ids)
    tok.decode(ids)
    dec = tok.stream_decoder()
    "".join(dec.feed(i) for i in ids) + dec.flush()
    for i in range(0, tok.vocab_size, max(1, tok.vocab_size // 64)):
        tok.piece(i)
    for use_jinja in (False, True):
        try:
            ids = chat.render_chat(tok, md, [{"role": "user", "content": "Hi"}], use_jinja=use_jinja)
        except chat.ChatTemplateError:
            continue
        assert all(0 <= i < tok.vocab_size for i in ids)


def load(header: gguf.Header):
    """The load-time path of the page and the CLI: validate, then use. Returns the Validated model or the
    user-facing error; any other exception, or a hang, propagates (and fails the test)."""
    with no_hang():
        gguf.summary(header)
        try:
            checked = validate(header)
        except ModelError as e:
            assert str(e), type(e)
            return e
        use(checked, header.metadata)
        return checked


def load_bytes(data: bytes, file_size: int | None = None):
    """gguf.read of damaged bytes, then `load`: a GGUFError, a ModelError or a model."""
    with no_hang():
        try:
            h = gguf.read(data, len(data) if file_size is None else file_size)
        except GGUFError as e:
            assert str(e), type(e)
            return e
    return load(h)
