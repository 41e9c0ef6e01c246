"""lab/instruments/verify.py without a GPU: the content hash that picks a file's references, the comparison's verdicts (a
perturbed logit vector must fail), and the kernel fixtures' pure-Python check."""

from __future__ import annotations

import base64
import json
import shutil
from array import array

import pytest

from lab.format import gguf
from lab.host.verify_native import REFERENCE, index
from lab.instruments import verify


@pytest.fixture(scope="module")
def smol_entry(smollm2_path):
    digest = verify.file_content_hash(smollm2_path)
    entry = verify.find(index(), digest)
    assert entry is not None and entry["model"] == "smollm2", "the index has no entry for SmolLM2's bytes"
    return entry


def _logits(entry, kind) -> array:
    return verify.floats((REFERENCE / entry["references"][kind]["logits"]).read_bytes())


# -- content hash ----------------------------------------------------------------------------------------------------
def test_every_index_entry_is_keyed_by_its_file_content():
    """Each reference is keyed by its file's content: the real models where downloaded, and the synthetic hybrids
    (rebuilt from their fixed seeds), whose sha256 the entry also records."""
    import hashlib

    from lab.host import models
    from lab.host.synthetic import arch as synthetic_arch
    for digest, entry in index()["models"].items():
        if entry["file"].startswith("synthetic-"):
            p = synthetic_arch.build(entry["model"], "f32", models.cache_dir() / "synthetic")
            assert hashlib.sha256(p.read_bytes()).hexdigest() == entry["sha256"], entry["model"]
        else:
            p = models.path(entry["model"])
        if p.exists():
            assert verify.file_content_hash(p) == digest, entry["model"]


def test_same_name_other_bytes_has_no_reference(smollm2_path, tmp_path):
    """A copy under the very same file name matches; one tensor byte changed inside a sampled slice does not; nor does
    a changed header byte. (A byte outside the samples is not seen: a sample, not a checksum, as documented.)"""
    header = gguf.read_file(smollm2_path)
    size = smollm2_path.stat().st_size
    ranges = verify.hash_ranges(size, header.data_offset)
    assert ranges[0] == (0, header.data_offset) and len(ranges) == 1 + verify.SAMPLES
    digest = verify.file_content_hash(smollm2_path)
    same = tmp_path / "a" / smollm2_path.name
    same.parent.mkdir()
    shutil.copyfile(smollm2_path, same)
    assert verify.file_content_hash(same) == digest
    mid = header.data_offset + (size - header.data_offset) // 2     # a tensor byte in the middle of the data, which
    assert any(o <= mid < o + n for o, n in ranges[1:])              # the middle sample covers (fraction 1/2)
    name_at = smollm2_path.open("rb").read(1 << 16).index(b"HuggingFaceTB")    # a header byte: a string value's
    for at in (mid, name_at):
        other = tmp_path / f"b{at}" / smollm2_path.name     # same name again
        other.parent.mkdir()
        shutil.copyfile(smollm2_path, other)
        with open(other, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x20]))     # a letter's case: the header still parses
        assert verify.file_content_hash(other) != digest, at
        assert verify.find(index(), verify.file_content_hash(other)) is None, at
    assert verify.find(index(), digest)["model"] == "smollm2"


def test_small_tensor_data_is_hashed_whole():
    assert verify.hash_ranges(1000, 600) == [(0, 600), (600, 400)]


# -- comparison ------------------------------------------------------------------------------------------------------
def test_the_reference_against_itself_passes(smol_entry):
    for kind in ("exact", "quant"):
        ref = smol_entry["references"][kind]
        rows = verify.compare(kind, _logits(smol_entry, kind), list(ref["greedy"]), ref, _logits(smol_entry, kind))
        assert verify.passed(rows) and all(r.verdict == "pass" for r in rows if r.check != "RMS diff"), rows
        assert [r.check for r in rows] == ["max |diff|", "RMS diff", "argmax", f"greedy {len(ref['greedy'])}"]


def test_a_perturbed_logit_vector_fails(smol_entry):
    ref = smol_entry["references"]["exact"]
    want = _logits(smol_entry, "exact")
    bound = verify.EXACT_REL * max(abs(x) for x in want)
    ours = array("f", want)
    ours[12345] += 3 * bound                                  # one logit off by 3x the tolerance
    rows = {r.check: r for r in verify.compare("exact", ours, list(ref["greedy"]), ref, want)}
    assert rows["max |diff|"].verdict == "fail" and rows["argmax"].verdict == "pass"
    ours = array("f", want)
    top = ref["argmax"]
    ours[top] -= 10.0                                          # the argmax moved: not a near-tie (gap ~3)
    rows = {r.check: r for r in verify.compare("exact", ours, list(ref["greedy"]), ref, want)}
    assert rows["argmax"].verdict == "fail"
    ours = array("f", want)
    ours[7] = float("nan")
    rows = {r.check: r for r in verify.compare("exact", ours, list(ref["greedy"]), ref, want)}
    assert rows["max |diff|"].verdict == "fail" and rows["RMS diff"].verdict == "fail"
    # against the quantized path the bound is loose, but 10 logits off is a bug
    qref = smol_entry["references"]["quant"]
    ours = array("f", _logits(smol_entry, "quant"))
    ours[99] += 10.0
    rows = {r.check: r for r in verify.compare("quant", ours, list(qref["greedy"]), qref, _logits(smol_entry, "quant"))}
    assert rows["max |diff|"].verdict == "fail"


def test_continuation_verdicts(smol_entry):
    ref = dict(smol_entry["references"]["exact"])
    want = _logits(smol_entry, "exact")
    ids = list(ref["greedy"])
    ids[5] += 1
    rows = {r.check: r for r in verify.compare("exact", want, ids, ref, want)}
    assert rows["greedy 16"].verdict == "fail" and rows["greedy 16"].number == 5.0
    ref["top2_gap"] = [1.0] * 5 + [0.001] + [1.0] * 10       # the reference itself was at a near-tie there
    rows = {r.check: r for r in verify.compare("exact", want, ids, ref, want)}
    assert rows["greedy 16"].verdict == "near-tie"
    qref = smol_entry["references"]["quant"]
    rows = {r.check: r for r in verify.compare("quant", want, ids, qref, want)}
    assert rows["greedy 16"].verdict in ("reported", "pass")   # compared and reported, never a failure


def test_other_vocabulary_is_refused():
    with pytest.raises(ValueError, match="another vocabulary"):
        verify.diff_stats([0.0] * 3, [0.0] * 4)


# -- kernel fixtures -------------------------------------------------------------------------------------------------
def test_kernel_fixture_check_in_pure_python():
    cases = json.loads((REFERENCE / "kernels.json").read_text())["cases"]
    assert len(cases) >= 20 and all(c["trap"] and c["tolerance_why"] for c in cases)
    for c in cases:
        want = base64.b64decode(c["want"])
        assert verify.kernel_error(c, want) == 0.0, c["name"]
        if c["dtype"] == "f32":
            bad = verify.floats(want)
            scale = verify.floats(base64.b64decode(c["scale"]))
            i = max(range(len(scale)), key=lambda j: scale[j])
            bad[i] += 10 * c["tolerance"] * scale[i] + 1e-3 * abs(bad[i])   # just past the tolerance
            assert verify.kernel_error(c, bad.tobytes()) > c["tolerance"], c["name"]
        else:
            bad = bytearray(want)
            bad[0] ^= 1
            assert verify.kernel_error(c, bytes(bad)) > c["tolerance"], c["name"]
    rope = next(c for c in cases if "rot32of80" in c["name"])  # dims past n_rot: bit-identical or wrong
    want = verify.floats(base64.b64decode(rope["want"]))
    scale = verify.floats(base64.b64decode(rope["scale"]))
    j = next(j for j in range(len(scale)) if scale[j] == 0.0)
    want[j] = float(want[j]) * (1 + 2 ** -20) if want[j] else 1e-30
    assert verify.kernel_error(rope, want.tobytes()) == float("inf")
