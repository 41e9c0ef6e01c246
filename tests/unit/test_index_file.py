"""lab.host.index_file: the documented layout byte for byte, the round trip, and every check `load` makes, on small
indexes built here with numpy (no GPU, no model file).

The bytes are assembled by `build` below from the module docstring's layout, independently of the writer: the
writer must produce exactly them, and each damaged file is `build` with one part changed, so every check is reached
on purpose and its message asserted (it names the file, what is wrong, and what to do)."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import numpy as np
import pytest

from lab.host import index_file
from lab.host.index_file import IndexFileError, ModelInfo, Saved, SavedFile
from lab.instruments.retrieval import RetrievalError

FP = "ab" * 32
MODEL = ModelInfo("llama", "tiny", 8, 100, FP)
WINDOW, STRIDE = 8, 4


def unit_rows(n: int, e: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, e)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def saved() -> Saved:
    """Two files: 21 tokens (windows 0-8, 4-12, 8-16, 12-20 and the last, 13-21) and 5 (one window)."""
    rng = np.random.default_rng(1)
    files = [SavedFile("a.txt", "0" * 64, rng.integers(0, MODEL.n_vocab, 21).tolist()),
             SavedFile("dir/b <x>.md", "f" * 64, rng.integers(0, MODEL.n_vocab, 5).tolist())]
    return Saved(MODEL, WINDOW, STRIDE, 1, files, unit_rows(6, MODEL.n_embd))


def parts(s: Saved) -> dict:
    """The pieces of a file, as the docstring lays them out: each a test may replace."""
    return {"magic": b"LLMLABIX", "version": 1, "header": s.header(),
            "table": np.asarray(s.spans, dtype="<u4").reshape(-1, 3),
            "ids": np.concatenate([np.asarray(f.ids, "<u4") for f in s.files]),
            "emb": np.asarray(s.embeddings, "<f4")}


def build(p: dict, head: bytes | None = None, hlen: int | None = None) -> bytes:
    """magic | u32 version | u32 header length | header JSON | zeros to a multiple of 4 | table | ids | embeddings."""
    head = json.dumps(p["header"]).encode() if head is None else head
    fixed = p["magic"] + struct.pack("<II", p["version"], len(head) if hlen is None else hlen)
    pad = bytes(-(len(fixed) + len(head)) % 4)
    return fixed + head + pad + p["table"].astype("<u4").tobytes() + p["ids"].astype("<u4").tobytes() \
        + p["emb"].astype("<f4").tobytes()


def refused(tmp_path, raw: bytes, model: ModelInfo | None = None) -> str:
    path = tmp_path / "x.idx"
    path.write_bytes(raw)
    with pytest.raises(IndexFileError) as e:
        index_file.load(path, model)
    msg = str(e.value)
    assert msg.startswith(f"{path}: "), msg          # every message names the file
    return msg


# -- the layout and the round trip -------------------------------------------------------------------------------

def test_the_writer_writes_the_documented_layout(tmp_path):
    s = saved()
    path = tmp_path / "i.idx"
    size = index_file.save(path, s)
    raw = path.read_bytes()
    assert raw == build(parts(s)) and size == len(raw)
    assert raw[:8] == b"LLMLABIX" and struct.unpack_from("<II", raw, 8)[0] == 1
    hlen = struct.unpack_from("<I", raw, 12)[0]
    head = json.loads(raw[16:16 + hlen])
    assert head == {"format": "llm-lab retrieval index", "version": 1,
                    "model": {"architecture": "llama", "name": "tiny", "n_embd": 8, "n_vocab": 100, "fingerprint": FP},
                    "window": 8, "stride": 4, "first": 1,
                    "files": [{"name": "a.txt", "tokens": 21, "sha256": "0" * 64},
                              {"name": "dir/b <x>.md", "tokens": 5, "sha256": "f" * 64}],
                    "windows": 6}
    at = 16 + hlen + (-(16 + hlen) % 4)
    assert at % 4 == 0 and not any(raw[16 + hlen:at])
    table = struct.unpack_from("<18I", raw, at)
    assert [table[i:i + 3] for i in range(0, 18, 3)] == [(0, 0, 8), (0, 4, 12), (0, 8, 16), (0, 12, 20), (0, 13, 21),
                                                         (1, 0, 5)]
    assert len(raw) == at + 12 * 6 + 4 * 26 + 4 * 6 * 8
    assert not list(tmp_path.glob("*.part"))          # written beside and renamed


def test_round_trip(tmp_path):
    s = saved()
    path = tmp_path / "i.idx"
    index_file.save(path, s)
    back = index_file.load(path, MODEL)
    assert (back.model, back.window, back.stride, back.first) == (MODEL, WINDOW, STRIDE, 1)
    assert back.files == s.files
    assert back.embeddings.dtype == np.float32 and np.array_equal(back.embeddings, s.embeddings)
    p = back.prepared()
    assert p.names == ["a.txt", "dir/b <x>.md"] and p.ids == [f.ids for f in s.files]
    assert p.spans == [(0, 0, 8), (0, 4, 12), (0, 8, 16), (0, 12, 20), (0, 13, 21), (1, 0, 5)]
    assert back.n_tokens == 26


def test_of_index_takes_a_built_index_only():
    s = saved()
    p = s.prepared()
    built = SimpleNamespace(prepared=p, ready=6, window=WINDOW, stride=STRIDE, first=1)
    got = Saved.of_index(built, MODEL, ["0" * 64, "f" * 64], s.embeddings.tobytes())
    assert got.files == s.files and np.array_equal(got.embeddings, s.embeddings)
    with pytest.raises(IndexFileError, match="holds 4 of its 6 windows: a stopped build is not saved"):
        Saved.of_index(SimpleNamespace(prepared=p, ready=4, window=WINDOW, stride=STRIDE, first=1), MODEL,
                       ["0" * 64, "f" * 64], s.embeddings[:4].tobytes())
    with pytest.raises(IndexFileError, match=r"embeddings of shape \(5, 8\) for 6 windows"):
        index_file.save("/nonexistent/never.idx", Saved(MODEL, WINDOW, STRIDE, 1, s.files, s.embeddings[:5]))


def test_fingerprint_is_size_and_both_ends(tmp_path):
    """What the fingerprint sees (a changed last MiB, a changed length) and what it does not (the middle: the
    module's docstring says why that is the trade)."""
    span = index_file.FINGERPRINT_SPAN
    data = bytearray(np.random.default_rng(0).integers(0, 256, 3 * span, dtype=np.uint8).tobytes())
    path = tmp_path / "m.gguf"

    def fp(b) -> str:
        path.write_bytes(bytes(b))
        return index_file.fingerprint(path)
    base = fp(data)
    assert len(base) == 64 and base == fp(data)
    assert fp(data[:1] + b"\x00" + data[2:]) != base          # the first MiB (the header)
    assert fp(data[:-1] + b"\x00") != base                      # the last MiB (the last tensors)
    assert fp(data + b"\x00") != base                           # the size
    assert fp(data[:span + 5] + bytes([data[span + 5] ^ 1]) + data[span + 6:]) == base   # the middle: unseen


# -- every check of load -------------------------------------------------------------------------------------------

def test_the_fixed_part(tmp_path):
    raw = build(parts(saved()))
    assert "truncated: 10 bytes, fewer than the 16" in refused(tmp_path, raw[:10])
    p = parts(saved())
    p["magic"] = b"NOTANIDX"
    assert "not an llm-lab index: the first bytes are b'NOTANIDX', expected b'LLMLABIX'" in refused(tmp_path, build(p))
    p["magic"] = b"GGUF\x03\x00\x00\x00"
    assert "a GGUF model: pass it as MODEL, and the index after --index" in refused(tmp_path, build(p))
    p = parts(saved())
    p["version"] = 2
    msg = refused(tmp_path, build(p))
    assert "index format version 2 (at offset 8); this lab reads version 1: rebuild it with `lab index" in msg
    msg = refused(tmp_path, build(parts(saved()), hlen=len(raw)))
    assert f"the header length {len(raw):,} (at offset 12) runs past the end of the file ({len(raw):,} bytes)" in msg


@pytest.mark.parametrize("head, why", [
    (b"{not json", "the header is not valid JSON"),
    (b'{"format": "\xff"}', "the header is not valid JSON ('utf-8' codec can't decode byte 0xff"),
    (b"[1, 2]", "the header is a JSON list, not an object"),
])
def test_a_header_that_is_not_a_json_object(tmp_path, head, why):
    assert why in refused(tmp_path, build(parts(saved()), head=head))


def edited(edit) -> bytes:
    p = parts(saved())
    edit(p["header"])
    return build(p)


@pytest.mark.parametrize("edit, why", [
    (lambda h: h.pop("window"), "the header lacks 'window'"),
    (lambda h: h["model"].pop("fingerprint"), "the header lacks model.'fingerprint'"),
    (lambda h: h["files"][1].pop("tokens"), "the header lacks files[1].'tokens'"),
    (lambda h: h.update(window="8"), "the header's 'window' is str \"8\", not int"),
    (lambda h: h["model"].update(n_embd=8.0), "the header's model.'n_embd' is float 8.0, not int"),
    (lambda h: h.update(first=True), "the header's 'first' is bool true, not int"),
    (lambda h: h.update(model=[]), "the header's 'model' is list [], not dict"),
    (lambda h: h.update(files={}), "the header's 'files' is dict {}, not list"),
    (lambda h: h["files"].__setitem__(0, "a.txt"), "the header's files[0] is str \"a.txt\", not an object"),
    (lambda h: h.update(format="something else"), "the header's format is \"something else\", not 'llm-lab retrieval"),
    (lambda h: h.update(version=2), "the header says version 2, the file's fixed part says 1"),
    (lambda h: h.update(window=4), "the header's 'window' is 4, not 8 .. 512"),
    (lambda h: h.update(stride=9), "the header's 'stride' is 9, not 1 .. 8"),
    (lambda h: h.update(first=2), "the header's 'first' is 2, not 0 .. 1"),
    (lambda h: h["model"].update(n_vocab=0), "the header's model.'n_vocab' is 0, not at least 1"),
    (lambda h: h["model"].update(fingerprint="AB" * 32), "model.'fingerprint' is \"ABABAB"),
    (lambda h: h["files"][0].update(sha256="0" * 63), "files[0].'sha256' is \"000"),
    (lambda h: h["files"][0].update(name=""), "the header's files[0].'name' is empty"),
    (lambda h: h.update(files=[]), "the header lists no files"),
    (lambda h: h.update(windows=0), "the header's 'windows' is 0, not at least 1"),
])
def test_each_header_field_is_checked(tmp_path, edit, why):
    msg = refused(tmp_path, edited(edit))
    assert why in msg, msg
    assert "rebuild it with `lab index MODEL FILES... --out INDEX`" in msg or "not an llm-lab index" in msg


def test_sizes_against_the_file_length(tmp_path):
    raw = build(parts(saved()))
    assert "truncated: " in refused(tmp_path, raw[:-4])
    assert "its header describes" in refused(tmp_path, raw[:-4])
    assert "4 bytes past the end of the embeddings" in refused(tmp_path, raw + bytes(4))
    # a token count the file cannot hold is refused before any window is cut from it
    msg = refused(tmp_path, edited(lambda h: h["files"][0].update(tokens=10**12)))
    assert "counts 1,000,000,000,005 tokens" in msg and "follow it: truncated" in msg
    # windows in the header disagree with the files' token counts (here one more)
    msg = refused(tmp_path, edited(lambda h: h.update(windows=7)))
    assert "the header says 7 windows but its files' 26 tokens cut at window 8 and stride 4 make 6" in msg
    # token counts that cut the same number of windows, but change the sizes: the length no longer matches
    msg = refused(tmp_path, edited(lambda h: h["files"][1].update(tokens=6)))
    assert "truncated: " in msg and "27 tokens" in msg


@pytest.mark.parametrize("row, why", [
    ((2, 0, 5), "window 5 spans tokens 0-5 of file 2, outside its range: the index holds 2 files"),
    ((1, 0, 6), "window 5 spans tokens 0-6 of file 1, outside its range: file 1 ('dir/b <x>.md') holds 5 tokens"),
    ((1, 3, 3), "window 5 spans tokens 3-3 of file 1, outside its range"),
    ((1, 1, 5), "window 5 is tokens 1-5 of file 1, but window 8 and stride 4 cut tokens 0-5 of file 1 there"),
])
def test_the_window_table(tmp_path, row, why):
    p = parts(saved())
    p["table"][5] = row
    assert why in refused(tmp_path, build(p))


def test_a_table_in_another_order_is_refused(tmp_path):
    p = parts(saved())
    p["table"][[0, 1]] = p["table"][[1, 0]]
    assert "window 0 is tokens 4-12 of file 0, but window 8 and stride 4 cut tokens 0-8" in refused(tmp_path, build(p))


def test_token_ids_inside_the_vocabulary(tmp_path):
    p = parts(saved())
    p["ids"][23] = 100
    msg = refused(tmp_path, build(p))
    assert "token id 100 (file 'dir/b <x>.md', token 2) is outside the vocabulary of 100" in msg


@pytest.mark.parametrize("value, why", [
    (np.nan, "window 3's embedding holds a non-finite value (nan)"),
    (np.inf, "window 3's embedding holds a non-finite value (inf)"),
])
def test_embeddings_finite(tmp_path, value, why):
    p = parts(saved())
    p["emb"][3, 2] = value
    assert why in refused(tmp_path, build(p))


def test_embeddings_of_unit_length(tmp_path):
    p = parts(saved())
    p["emb"][4] *= 0.5
    assert "window 4's embedding has length 0.5, not 1 (within 0.001)" in refused(tmp_path, build(p))
    p["emb"][4] *= 0
    assert "window 4's embedding has length 0, not 1" in refused(tmp_path, build(p))
    # within the tolerance (f32 normalisation on a GPU) loads
    p = parts(saved())
    p["emb"][4] *= 1 + 5e-4
    path = tmp_path / "ok.idx"
    path.write_bytes(build(p))
    assert index_file.load(path).embeddings.shape == (6, 8)


def test_the_model(tmp_path):
    path = tmp_path / "i.idx"
    index_file.save(path, saved())
    other = ModelInfo("llama", "tiny-finetune", 8, 100, "cd" * 32)
    msg = refused(tmp_path, path.read_bytes(), other)
    assert "made with another model of the same shape (another fine-tune or quantization): fingerprint abababababab " \
           "(tiny), this model's is cdcdcdcdcdcd (tiny-finetune)" in msg
    assert "ask with the model that made it, or rebuild it with `lab index MODEL FILES... --out INDEX` with this " \
           "model" in msg
    msg = refused(tmp_path, path.read_bytes(), ModelInfo("qwen2", "Qwen", 16, 100, "cd" * 32))
    assert "made with another model: tiny (llama, n_embd 8, fingerprint abababababab), vocabulary 100; this is Qwen " \
           "(qwen2, n_embd 16, fingerprint cdcdcdcdcdcd), vocabulary 100" in msg
    msg = refused(tmp_path, path.read_bytes(), ModelInfo("llama", "tiny", 8, 120, FP))
    assert "vocabulary 100; this is tiny" in msg and "vocabulary 120" in msg
    assert index_file.load(path, MODEL).model == MODEL        # the same model loads
    assert issubclass(IndexFileError, RetrievalError)            # `lab`'s one-line error path takes it

