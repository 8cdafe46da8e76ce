"""The stub channel's pure parts: message framing, the shared-memory allocator, and reading tensor
descriptors a stub sent (which the server must treat as untrusted: nothing outside the stub's own
segments, no object dtypes, sizes that match)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from kubeinfer.server.backends.python import ipc


def test_messages_are_framed_and_split_wherever_the_bytes_break() -> None:
    stream = ipc.frame({"op": "a", "n": 1}) + ipc.frame({"op": "b", "s": "é" * 3})
    decoder = ipc.Decoder()
    got: list[dict[str, Any]] = []
    for i in range(0, len(stream), 3):
        got += decoder.feed(stream[i : i + 3])
    assert got == [{"op": "a", "n": 1}, {"op": "b", "s": "ééé"}]


def test_a_frame_over_the_limit_or_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="over the"):
        ipc.Decoder().feed((ipc.MAX_MESSAGE + 1).to_bytes(4, "little"))
    with pytest.raises(ValueError, match="JSON object"):
        ipc.Decoder().feed(ipc.frame([1, 2]))  # type: ignore[arg-type]


class _Announced:
    def __init__(self) -> None:
        self.new: list[tuple[int, int]] = []
        self.retired: list[int] = []

    def announce(self, sid: int, fd: int, size: int) -> None:
        self.new.append((sid, size))

    def retire(self, sid: int) -> None:
        self.retired.append(sid)


def test_the_arena_reuses_freed_blocks_coalesces_and_grows_by_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _Announced()
    arena = ipc.Arena(1 << 20, seen.announce, seen.retire)
    try:
        a = arena.alloc(100)
        b = arena.alloc(300_000)
        c = arena.alloc(100)
        assert seen.new == [(0, 1 << 20)] and a[0] == b[0] == c[0] == 0
        arena.free(*b)
        arena.free(*a)
        assert arena.alloc(300_000) == a  # the two freed neighbours merged at the start
        big = arena.alloc(3 << 20)  # does not fit: a new segment, rounded up to whole MiB
        assert big == (1, 0) and seen.new[-1] == (1, 3 << 20)
        arena.free(*big)
        monkeypatch.setattr(ipc, "IDLE_SEGMENT_SECONDS", -1.0)
        arena.free(*c)  # trimming: the extra, wholly free segment goes; the first stays
        assert seen.retired == [1] and list(arena.segments) == [0]
        arena.free(5, 0)  # not a block of ours: ignored
        arena.free(0, 12345)
    finally:
        arena.close()


def _segment_with(array: np.ndarray) -> tuple[ipc.SegmentMap, list[Any], list[tuple[int, int]]]:
    released: list[tuple[int, int]] = []
    segments = ipc.SegmentMap(lambda sid, offset: released.append((sid, offset)))
    fd, mapping = ipc.create_segment(1 << 20)
    np.ndarray(array.shape, array.dtype, buffer=mapping, offset=64)[...] = array
    segments.add(7, os.dup(fd), 1 << 20)
    mapping.close()
    os.close(fd)
    return segments, ["X", array.dtype.str, list(array.shape), 7, 64, array.nbytes], released


def test_a_descriptor_reads_the_tensor_in_place_and_releases_the_block_with_the_last_view() -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    segments, desc, released = _segment_with(values)
    view = segments.array(desc)
    np.testing.assert_array_equal(view, values)
    row = view[1]
    del view
    assert released == []  # a view of it is still alive
    del row
    assert released == [(7, 64)]
    segments.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({4: (1 << 20) - 8}, "outside segment"),  # runs past the segment's end
        ({4: -64}, "outside segment"),
        ({3: 8}, "unknown shared-memory segment"),
        ({5: 40}, "do not hold"),  # nbytes that do not match dtype x shape
        ({1: "|O"}, "unsupported tensor data type"),  # an object dtype from a stub would be a pointer
        ({1: "(2,)f4"}, "unsupported tensor data type"),
        ({2: [3, -4]}, "negative dimension"),
    ],
)
def test_descriptors_a_stub_cannot_use_to_read_what_is_not_its_own(change: dict[int, Any], message: str) -> None:
    segments, desc, _ = _segment_with(np.zeros((3, 4), np.float32))
    for index, value in change.items():
        desc[index] = value
    with pytest.raises((ValueError, TypeError), match=message):
        segments.array(desc)
    segments.close()


def test_bytes_tensors_round_trip_and_a_truncated_one_is_refused() -> None:
    values = np.array([[b"a", "é"], [b"", b"xyz"]], dtype=np.object_)
    encoded = ipc.encode_bytes(values)
    decoded = ipc.decode_bytes(memoryview(encoded), (2, 2))
    assert decoded.tolist() == [[b"a", "é".encode()], [b"", b"xyz"]]
    with pytest.raises(ValueError, match="runs past"):
        ipc.decode_bytes(memoryview(encoded[:-1]), (2, 2))
    with pytest.raises(ValueError, match="shorter than its shape"):
        ipc.decode_bytes(memoryview(encoded), (3, 2))
