"""OneWriteResponses: a response with a Content-Length leaves in one write(); nothing else is held back."""

from __future__ import annotations

from kubeinfer.server.http.protocol import OneWriteResponses

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_head_and_body_leave_in_one_write() -> None:
    t = Transport()
    w = OneWriteResponses(t)
    w.write(HEAD)
    assert t.writes == []
    w.write(b"hello")
    assert t.writes == [HEAD + b"hello"]


def test_a_chunked_head_is_written_at_once() -> None:
    t = Transport()
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\ntransfer-encoding: chunked\r\n\r\n"
    OneWriteResponses(t).write(head)
    assert t.writes == [head]


def test_100_continue_passes_and_the_head_after_it_is_still_joined_to_its_body() -> None:
    t = Transport()
    w = OneWriteResponses(t)
    w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    w.write(HEAD)
    w.write(b"hello")
    assert t.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", HEAD + b"hello"]


def test_a_later_body_chunk_that_looks_like_a_head_is_never_held() -> None:
    t = Transport()
    w = OneWriteResponses(t)
    w.write(HEAD)
    w.write(b"first")
    w.write(HEAD)  # body bytes of a multi-part body that happen to look like a response head
    assert t.writes == [HEAD + b"first", HEAD]


def test_close_flushes_a_held_head_first() -> None:
    t = Transport()
    w = OneWriteResponses(t)
    w.write(HEAD)
    w.close()
    assert t.writes == [HEAD]
    assert t.closed


def test_other_transport_methods_pass_through() -> None:
    assert OneWriteResponses(Transport()).get_extra_info("peername") == "extra peername"
