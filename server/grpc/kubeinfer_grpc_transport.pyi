"""Type stub of the Rust gRPC transport (rust/src/lib.rs), which setup.py builds into this package."""

class PendingCall:
    """One call waiting for Python's answer: unary (``reply``/``abort``), a stream (``want``/``send``/``finish``),
    or a token check (``admit``/``refuse``)."""

    timeout: float | None
    def reply(self, message: bytes) -> bool: ...
    def send(self, message: bytes) -> bool: ...
    def finish(self) -> bool: ...
    def abort(self, code: int, message: str) -> bool: ...
    def admit(self) -> bool: ...
    def refuse(self, message: str) -> bool: ...
    def want(self) -> None: ...
    def full(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def authorization(self) -> bytes | None: ...
    def header(self, name: str) -> str | None: ...
    def metadata(self) -> list[tuple[str, str]]: ...

class Transport:
    port: int
    fd: int
    def __init__(
        self,
        host: str,
        port: int,
        methods: list[str],
        streams: list[str] = ...,
        *,
        open: list[str] = ...,
        token: bool = False,
        threads: int = 1,
        max_message_bytes: int = 67108864,
        max_metadata_bytes: int = 0,
        max_connection_age_ms: int = 0,
        max_connection_age_grace_ms: int = 0,
        keepalive_time_ms: int = 0,
        keepalive_timeout_ms: int = 0,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        tls_client_ca: bytes | None = None,
    ) -> None: ...
    def take(
        self,
    ) -> tuple[
        list[tuple[PendingCall, int, bytes | None, int]],
        tuple[int, ...] | list[int],
        list[tuple[int, bytes | None]],
        tuple[int, ...] | list[int],
        list[tuple[PendingCall, int]],
    ]: ...
    def stats(self) -> tuple[int, int]: ...
    def close(self) -> None: ...
    def shutdown(self, timeout: float) -> None: ...

class PendingRequest:
    """One HTTP request waiting for Python's answer: whole (``respond``) or streamed (``start``, ``send``...,
    ``finish``)."""

    id: int
    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool: ...
    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool: ...
    def send(self, chunk: bytes) -> bool: ...
    def finish(self) -> bool: ...
    def cancelled(self) -> bool: ...

class HttpTransport:
    """The HTTP/1.1 listener (rust/src/http1.rs, http_python.rs)."""

    port: int
    fd: int
    def __init__(
        self,
        host: str,
        port: int,
        *,
        threads: int = 1,
        max_body_bytes: int = 67108864,
        max_header_bytes: int = 16384,
        header_timeout_ms: int = 30000,
        body_timeout_ms: int = 60000,
        idle_timeout_ms: int = 75000,
        max_connections: int = 0,
    ) -> None: ...
    def take(
        self,
    ) -> tuple[
        list[tuple[PendingRequest, str, str, list[tuple[bytes, bytes]], bytes, tuple[str, int]]],
        tuple[int, ...] | list[int],
    ]: ...
    def stats(self) -> tuple[int, int]: ...
    def close(self) -> None: ...
    def shutdown(self, timeout: float) -> None: ...
