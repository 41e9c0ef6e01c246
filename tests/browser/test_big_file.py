"""Model files past 2 and 4 GB in the page, and models that do not fit the adapter.

The large file is a real, valid GGUF of 5.5 GiB: a one-layer tiny llama whose `general.alignment` is 2^29
(512 MiB; a power of two, which is all the GGUF spec, llama.cpp's gguf.cpp and lab/format/gguf.py ask of it). Every
tensor then starts on its own 512 MiB boundary: the data section at 0.5 GiB, tensor i at (i + 1) x 0.5 GiB, so
blk.0.attn_q sits at exactly 2^31 and token_embd at exactly 2^32 (the offsets that a 32-bit or sign-truncating
conversion would turn into 0 or a negative number). The padding between tensors is left as holes (a sparse file on
disk), so the test writes and uploads a few hundred KB, not 5 GB, while every byte offset that crosses between
Python and JS (the plan's to_js, File.slice in labUpload, the host-value slices) is past 2^31 or 2^32. Each tensor has
its own random contents, so an offset truncated mod 2^32 reads another tensor (or a hole of zeros) and the
comparison names it.

After loading, every byte of every tensor is read back from the GPU (window.labWeightBytes,
lab/instruments/weightread.py) and compared with what was written. The figures (file size, load MB/s, bytes compared)
are printed (-s shows them). Not marked slow: 21 s and 47 s here at load average ~5 (110 s and 7 minutes at load average
25 from other jobs).
"""

from __future__ import annotations

import base64
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from tests.unit.fuzzkit import small_vocab

LOAD_MS = 600_000     # two shared cores, often at load average 20+ from other jobs: SmolLM2 alone can take minutes
ALIGN = 1 << 29
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 2, 1, 32, 128
F32 = 0      # ggml type id

# GGUF value types
U32, I32, F32V, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, v) -> bytes:
    def enc(s):
        return s.encode("utf-8", "surrogateescape")
    head = _s(key.encode())
    if isinstance(v, bool):
        return head + struct.pack("<IB", BOOL, v)
    if isinstance(v, int):
        return head + struct.pack("<II", U32, v)
    if isinstance(v, float):
        return head + struct.pack("<If", F32V, v)
    if isinstance(v, str):
        return head + struct.pack("<I", STR) + _s(enc(v))
    if v and isinstance(v[0], str):
        return head + struct.pack("<IIQ", ARR, STR, len(v)) + b"".join(_s(enc(x)) for x in v)
    if v and isinstance(v[0], float):
        return head + struct.pack("<IIQ", ARR, F32V, len(v)) + struct.pack(f"<{len(v)}f", *v)
    return head + struct.pack("<IIQ", ARR, I32, len(v)) + struct.pack(f"<{len(v)}i", *v)


def write_tiny_llama(path: Path, alignment: int, context_length: int = 2048, seed: int = 0) -> dict[str, bytes]:
    """A one-layer F32 llama with SmolLM2's tokenizer cut small, written by hand so the padding between
    tensors is left as holes (GGUFWriter writes it out). Returns each tensor's bytes, in file order."""
    vocab = small_vocab("smollm2")
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    md = {"general.architecture": "llama", "general.name": "big sparse tiny llama", "general.alignment": alignment,
          "llama.block_count": 1, "llama.embedding_length": N_EMBD, "llama.feed_forward_length": N_FF,
          "llama.context_length": context_length, "llama.attention.head_count": N_HEAD,
          "llama.attention.head_count_kv": N_HEAD_KV, "llama.attention.layer_norm_rms_epsilon": 1e-5,
          "llama.rope.freq_base": 10000.0, "llama.rope.dimension_count": HEAD_DIM, "llama.vocab_size": n_vocab,
          **vocab}
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    # file order: small ones first, so attn_q lands at 2^31 and token_embd at 2^32 (with a 2^29 alignment)
    shapes = {"output_norm.weight": (N_EMBD,), "blk.0.attn_norm.weight": (N_EMBD,), "blk.0.ffn_norm.weight": (N_EMBD,),
              "blk.0.attn_q.weight": (N_EMBD, q), "blk.0.attn_k.weight": (N_EMBD, kv),
              "blk.0.attn_v.weight": (N_EMBD, kv), "blk.0.attn_output.weight": (q, N_EMBD),
              "token_embd.weight": (N_EMBD, n_vocab), "blk.0.ffn_gate.weight": (N_EMBD, N_FF),
              "blk.0.ffn_up.weight": (N_EMBD, N_FF), "blk.0.ffn_down.weight": (N_FF, N_EMBD)}
    rng = np.random.default_rng(seed)
    data = {name: (0.1 * rng.standard_normal(int(np.prod(shape)))).astype("<f4").tobytes()
            for name, shape in shapes.items()}
    infos, rel = b"", 0
    for name, shape in shapes.items():
        infos += _s(name.encode()) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
        infos += struct.pack("<IQ", F32, rel)
        rel += -(-len(data[name]) // alignment) * alignment
    header = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(md)) + b"".join(_kv(k, v) for k, v in md.items()) + infos
    start = -(-len(header) // alignment) * alignment
    with open(path, "wb") as f:
        f.write(header)
        at = start
        for name in shapes:                       # seek over the padding: it stays a hole on disk
            f.seek(at)
            f.write(data[name])
            at += -(-len(data[name]) // alignment) * alignment
    return data


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big-sparse.gguf"
    data = write_tiny_llama(path, ALIGN)
    yield path, data
    path.unlink()


def _facts(lab) -> dict:
    return lab.page.evaluate("Object.fromEntries([...document.querySelectorAll('[data-testid=model-info] dd')]"
                             ".map(d => [d.dataset.key, d.textContent]))")


def test_file_past_4gb_loads_and_its_tensors_reach_the_gpu_intact(lab, big_file):
    from lab.format import gguf
    path, data = big_file
    header = gguf.read_file(path)
    offsets = {t.name: t.offset for t in header.tensors}
    size = path.stat().st_size
    assert size > 4.3e9
    assert offsets["blk.0.attn_q.weight"] == 1 << 31 and offsets["token_embd.weight"] == 1 << 32
    assert max(offsets.values()) > 5 << 30

    lab.wait_ready()
    t0 = time.perf_counter()
    lab.pick(path)
    lab.wait_loaded(path.name, LOAD_MS)
    seconds = time.perf_counter() - t0
    stats = lab.page.evaluate("() => document.querySelector('[data-testid=model-info]').textContent")
    assert "loaded" in stats

    compared = 0
    for name, raw in data.items():
        got = base64.b64decode(lab.page.evaluate("([n, s]) => window.labWeightBytes(n, 0, s)", [name, len(raw)]))
        assert got == raw, f"{name} at file offset {offsets[name]:,}: the GPU holds other bytes than the file"
        compared += len(raw)
    # and a range inside a tensor, not at its start (the read-back's own offset arithmetic)
    raw = data["token_embd.weight"]
    got = base64.b64decode(lab.page.evaluate("([n, o, s]) => window.labWeightBytes(n, o, s)",
                                             ["token_embd.weight", 4096, 256]))
    assert got == raw[4096:4352]
    facts = _facts(lab)
    print(f"\nbig file: {size:,} bytes ({size / 2**30:.2f} GiB, tensors at {min(offsets.values()):,} .. "
          f"{max(offsets.values()):,}); load {seconds:.1f} s end to end, upload {facts.get('upload')}; "
          f"weights {sum(map(len, data.values())):,} bytes; bytes compared {compared + 256:,}")
    assert compared == sum(map(len, data.values()))
    assert not lab.errors(), lab.errors()
    assert not lab.foreign_requests()


def test_context_too_large_for_the_adapter_is_refused_before_any_upload(lab, tmp_path, smollm2_path):
    """A tiny model trained for 2^24 tokens, loaded at that context: each layer's K cache would be 2^24 x 32 x 4 B =
    2 GiB, over the adapter's limits. The page says so with the numbers before a byte moves, suggests the largest
    context that fits, loads the file at a smaller context, and then loads the default model."""
    path = tmp_path / "long-context.gguf"
    write_tiny_llama(path, 32, context_length=1 << 24)
    lab.wait_ready()
    limits = lab.page.evaluate("async () => { const a = await navigator.gpu.requestAdapter(); "
                               "return {buf: a.limits.maxBufferSize, bind: a.limits.maxStorageBufferBindingSize}; }")
    kv_layer = (1 << 24) * N_HEAD_KV * HEAD_DIM * 4
    assert kv_layer > min(limits["buf"], limits["bind"]), limits

    page = lab.page
    page.fill('[data-testid="context-length"]', str(1 << 24))
    page.dispatch_event('[data-testid="context-length"]', "change")
    lab.pick(path)
    page.wait_for_function("document.querySelector('[data-testid=load-error]').textContent.includes('does not fit')",
                           timeout=LOAD_MS)
    err = page.inner_text('[data-testid="load-error"]')
    limit = limits["buf"] if kv_layer > limits["buf"] else limits["bind"]
    print(f"\nadapter limits {limits}; refusal: {err}")
    assert "k cache 0" in err and f"{kv_layer:,} bytes" in err and f"{limit:,} bytes" in err, err
    assert ("maxBufferSize" if kv_layer > limits["buf"] else "maxStorageBufferBindingSize") in err, err
    suggested = limit // (N_HEAD_KV * HEAD_DIM * 4)
    assert f"A context of {suggested:,} tokens would fit" in err, err
    plan = lab.cells("context-plan", ["uploaded", "fits", "kvBytes"])[0]
    assert plan == {"uploaded": "0", "fits": "false", "kvBytes": str(2 * kv_layer)}, plan
    assert page.evaluate("document.querySelector('[data-testid=prompt]').disabled")

    # a smaller context loads the same file: the input's change reloads it. Not the suggestion itself: on SwiftShader
    # it is two caches of ~the binding limit each, which pass the limits but can fail as memory (WebGPU does not
    # report an adapter's total memory, so no plan can promise that)
    page.fill('[data-testid="context-length"]', "4096")
    page.dispatch_event('[data-testid="context-length"]', "change")
    lab.wait_loaded(path.name, LOAD_MS)
    assert _facts(lab)["KV cache"].startswith("4096 tokens")
    assert lab.cells("context-plan", ["fits", "kvBytes"])[0] == {"fits": "true", "kvBytes": str(4096 * 2 * 128)}

    # and the page goes on: the default model loads (its context is bounded by its own, 8192)
    page.click('[data-testid="load-default"]')
    lab.wait_loaded(smollm2_path.name, LOAD_MS)
    assert not lab.errors(), lab.errors()
