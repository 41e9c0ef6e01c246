"""`Device.rekind` (lab/gpu): live buffers of the device take another kind, so Forget (which walks the registry by
kind) finds a file's weights once full fine-tuning has made them the user's data, and `destroy` zeroes them. Checked
on a stand-in backend (buffers with no GPU behind them): a CONVERSATION buffer never leaves that kind, a buffer not
live on the device is refused, and nothing changes when any buffer of the list is refused."""

from __future__ import annotations

import pytest

from lab import gpu
from lab.instruments.forget import conversation_buffers


class _Handle:
    def __init__(self) -> None:
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True


class _Device(gpu.Device):
    """The registry alone: buffers with a stand-in handle, clears recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.info = gpu.AdapterInfo("native", "stand-in", frozenset(), {"max_buffer_size": 1 << 30})
        self.cleared: list[str] = []

    def _create_buffer(self, size, label, uniform):
        return _Handle()

    def write(self, buf, data, offset=0) -> None:
        pass

    def clear(self, buf) -> None:
        self.cleared.append(buf.label)


def test_weights_become_conversation_and_forget_finds_them():
    dev = _Device()
    w = [dev.buffer(64, gpu.WEIGHTS, f"blk.{i}.w") for i in range(2)]
    kv = dev.buffer(64, gpu.CONVERSATION, "k cache 0")
    assert conversation_buffers(dev) == [kv]
    dev.rekind(w, gpu.CONVERSATION)
    assert [b.kind for b in w] == [gpu.CONVERSATION] * 2
    assert set(map(id, conversation_buffers(dev))) == {id(b) for b in (*w, kv)}
    dev.destroy(w[0])                        # zeroed before it goes, as any CONVERSATION buffer is
    assert dev.cleared == ["blk.0.w"]
    dev.rekind([w[1]], gpu.CONVERSATION)     # again: nothing to change
    assert w[1].kind == gpu.CONVERSATION


def test_a_conversation_buffer_stays_one_and_nothing_changes_on_a_refusal():
    dev = _Device()
    w = dev.buffer(64, gpu.WEIGHTS, "token_embd.weight")
    kv = dev.buffer(64, gpu.CONVERSATION, "k cache 0")
    with pytest.raises(ValueError, match="k cache 0: a CONVERSATION buffer stays one"):
        dev.rekind([w, kv], gpu.WEIGHTS)
    assert (w.kind, kv.kind) == (gpu.WEIGHTS, gpu.CONVERSATION)
    with pytest.raises(ValueError, match="unknown buffer kind 'secret'"):
        dev.rekind([w], "secret")


def test_a_buffer_not_live_on_the_device_is_refused():
    dev, other = _Device(), _Device()
    w = dev.buffer(64, gpu.WEIGHTS, "blk.0.w")
    gone = dev.buffer(64, gpu.WEIGHTS, "blk.1.w")
    dev.destroy(gone)
    elsewhere = other.buffer(64, gpu.WEIGHTS, "output.weight")
    for stray in (gone, elsewhere):
        with pytest.raises(ValueError, match="not a live buffer of this device"):
            dev.rekind([w, stray], gpu.CONVERSATION)
        assert w.kind == gpu.WEIGHTS
