"""The server's side of the stub channel maps no shared memory: it writes its segments with ``pwrite``
and copies the stub's tensors out with ``pread``, so a segment the stub truncated is an error for that
tensor (or grows back under the server's write), never a SIGBUS. The live drill is
tests/integration/test_python_hostile.py."""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np
import pytest
from kubeinfer.server.backends.python import ipc


def _stub_segment(array: np.ndarray) -> tuple[int, list[Any]]:
    """A stub's segment holding ``array`` at offset 64: (the server's descriptor of it, the descriptor)."""
    fd, mapping = ipc.create_segment(1 << 20)
    assert mapping is not None
    np.ndarray(array.shape, array.dtype, buffer=mapping, offset=64)[...] = array
    mapping.close()
    return fd, ["X", array.dtype.str, list(array.shape), 7, 64, array.nbytes]


def test_the_server_copies_a_stub_tensor_out_and_frees_its_block_at_once() -> None:
    released: list[tuple[int, int]] = []
    reader = ipc.SegmentReader(lambda sid, offset: released.append((sid, offset)))
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    fd, desc = _stub_segment(values)
    reader.add(7, fd, 1 << 20)
    copy = reader.array(desc)
    np.testing.assert_array_equal(copy, values)
    assert released == [(7, 64)] and not copy.flags.writeable  # a copy: the block is the stub's again
    reader.close()


def test_a_tensor_past_the_end_of_a_truncated_segment_is_an_error_not_a_fault() -> None:
    reader = ipc.SegmentReader(lambda sid, offset: None)
    fd, desc = _stub_segment(np.ones(1000, np.float64))
    reader.add(7, os.dup(fd), 1 << 20)
    os.ftruncate(fd, 100)  # what a hostile model does with the descriptor it holds
    with pytest.raises(ipc.SegmentUnreadable, match=r"\[64, 8064\) of the stub's shared-memory segment 7, which the"):
        reader.array(desc)
    os.close(fd)
    reader.close()


def test_a_segment_that_is_not_a_file_is_refused() -> None:
    reader = ipc.SegmentReader(lambda sid, offset: None)
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match="not a file"):
        reader.add(0, os.dup(a.fileno()), 1 << 20)
    a.close()
    b.close()


def test_the_servers_arena_is_written_without_a_mapping_and_grows_back_when_truncated() -> None:
    fds: list[int] = []
    arena = ipc.Arena(1 << 20, lambda sid, fd, size: fds.append(fd), lambda sid: None, mapped=False)
    try:
        first = ipc.write_tensor(arena, "A", np.arange(6, dtype=np.int32).reshape(2, 3))
        assert arena.segments[0].map is None
        os.ftruncate(fds[0], 0)  # the stub truncates the server's segment
        values = np.array([[b"x", b"yz"]], dtype=np.object_)
        second = ipc.write_tensor(arena, "B", values)  # no SIGBUS: pwrite extends the file
        strided = np.arange(20, dtype=np.float16)[::2]  # not contiguous
        third = ipc.write_tensor(arena, "C", strided)
        reader = ipc.SegmentMap(lambda sid, offset: None)  # how the stub reads it
        reader.add(0, os.dup(fds[0]), os.fstat(fds[0]).st_size)
        assert reader.array(second).tolist() == [[b"x", b"yz"]]
        np.testing.assert_array_equal(reader.array(third), strided)
        assert first[3:5] == [0, 0]  # truncated: its bytes are zeros now, the stub's problem only
        reader.close()
    finally:
        arena.close()
