"""One gRPC call written by hand over HTTP/2 (the ``h2`` library): what a gRPC client would not send, or not
send yet (a call's headers and only part of its message; header bytes that are not text; odd ``grpc-*``
metadata), and the answer as it came."""

from __future__ import annotations

import socket
import time
import urllib.parse
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events


def framed(message: bytes, flag: int = 0) -> bytes:
    """A gRPC message with its 5-byte prefix."""
    return bytes([flag]) + len(message).to_bytes(4, "big") + message


@dataclass
class Answer:
    #: response headers and trailers by (lower-case) name; ``grpc-message`` percent-decoded as clients read it
    fields: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    #: the stream ended (END_STREAM) or was reset (RST_STREAM's error code) before the wait ran out
    ended: bool = False
    reset: int | None = None

    @property
    def status(self) -> str | None:
        return self.fields.get("grpc-status")

    @property
    def message(self) -> str | None:
        return self.fields.get("grpc-message")


def call(
    address: str,
    path: str,
    body: bytes,
    metadata: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    end: bool = True,
    wait: float = 10.0,
) -> Answer:
    """Open a connection, send one call's HEADERS (with ``metadata``) and ``body``, with END_STREAM only when
    ``end``, and read until the stream ends or ``wait`` seconds pass (then ``ended`` is False). ``body`` must
    fit HTTP/2's initial window (64 KiB)."""
    host, port = address.rsplit(":", 1)
    config = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_outbound_headers=False)
    conn = h2.connection.H2Connection(config=config)
    answer = Answer()
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", address.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *metadata,
        ]
        conn.send_headers(stream, headers, end_stream=not body and end)
        if body:
            conn.send_data(stream, body, end_stream=end)
        sock.sendall(conn.data_to_send())
        deadline = time.monotonic() + wait
        while not answer.ended and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                received = sock.recv(65536)
            except TimeoutError:
                break
            if not received:
                break
            for event in conn.receive_data(received):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    for name, value in event.headers:
                        answer.fields[name.decode().lower()] = value.decode("latin-1")
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    answer.data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream:
                    answer.ended = True
                elif isinstance(event, h2.events.StreamReset) and event.stream_id == stream:
                    answer.ended, answer.reset = True, int(event.error_code)
            sock.sendall(conn.data_to_send())
    if "grpc-message" in answer.fields:
        answer.fields["grpc-message"] = urllib.parse.unquote(answer.fields["grpc-message"])
    return answer


class Quiet:
    """A connection that opens one call and then only listens: it acknowledges the server's SETTINGS and
    nothing else (no PING answers), so a server's keepalive shows: its PINGs, then its closing the connection."""

    def __init__(self, address: str, path: str) -> None:
        import hpack

        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        block = hpack.Encoder().encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", address),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        self.sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"") + _frame(1, 4, 1, block)  # END_HEADERS only
        )
        self.buffer = b""

    def frames(self, wait: float) -> list[tuple[int, int]]:
        """(type, flags) of each frame the server sends within ``wait`` seconds, up to its closing the connection
        (then the last item is (-1, 0))."""
        seen: list[tuple[int, int]] = []
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                received = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionError:
                received = b""
            if not received:
                seen.append((-1, 0))
                break
            self.buffer += received
            while len(self.buffer) >= 9 and len(self.buffer) >= 9 + int.from_bytes(self.buffer[:3], "big"):
                length, kind, flags = int.from_bytes(self.buffer[:3], "big"), self.buffer[3], self.buffer[4]
                self.buffer = self.buffer[9 + length :]
                seen.append((kind, flags))
                if kind == 4 and not flags & 1:  # SETTINGS: acknowledged, as every client must
                    self.sock.sendall(_frame(4, 1, 0, b""))
        return seen

    def close(self) -> None:
        self.sock.close()


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
