"""``--grpc-transport``: which transport serves gRPC, and what the server says when the Rust one cannot.

The behaviour of each transport is tested by the gRPC modules themselves (parametrized over
``grpc_transports()``); here: the choice, the refusal and the fallback, read from the server's log.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from kubeinfer.server.grpc.transport import rust_missing
from tritonclient.utils import InferenceServerException

from tests.support.https import make_ca_and_cert
from tests.support.server import ServerProcess, start_server

RUST_LISTENING = "(Rust transport)"
needs_rust = pytest.mark.skipif(rust_missing() is not None, reason=f"Rust transport: {rust_missing()}")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo"


def tls_flags(tmp_path: Path) -> list[str]:
    _, cert, key = make_ca_and_cert(tmp_path)
    return ["--grpc-use-ssl", "true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]


#: grpc-core polices client PINGs (Triton's --grpc-http2-* flags); hyper answers every PING
PING_POLICY = ["--grpc-http2-max-ping-strikes", "5"]
POLICY_REASON = "a --grpc-http2-* ping policy other than Triton's default is enforced by grpc.aio only"


def exited(server: ServerProcess) -> tuple[int, str]:
    try:
        code = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.terminate(10)
        raise AssertionError(f"the server did not refuse to start:\n{server.log()}") from None
    return code, server.log()


def test_rust_refuses_a_configuration_it_cannot_serve(repo: Path) -> None:
    server = start_server(repo, "--grpc-transport", "rust", *PING_POLICY, wait=False)
    code, log = exited(server)
    assert code != 0
    reason = rust_missing() or POLICY_REASON
    assert f"--grpc-transport rust: the Rust gRPC transport cannot serve this server: {reason}" in log


@needs_rust
def test_auto_falls_back_to_grpcio_saying_why(repo: Path) -> None:
    server = start_server(repo, "--grpc-transport", "auto", *PING_POLICY)
    try:
        log = server.log()
        why = f"gRPC served by grpc.aio, not the Rust transport: {POLICY_REASON}"
        assert log.count(why) == 1 and RUST_LISTENING not in log and "gRPC listening on" in log
    finally:
        assert server.terminate() == 0


@needs_rust
def test_auto_serves_tls_with_rust(repo: Path, tmp_path: Path) -> None:
    """gRPC TLS is the Rust transport's (tonic, rustls): tritonclient over TLS, a plain client refused."""
    server = start_server(repo, "--grpc-transport", "auto", *tls_flags(tmp_path))
    try:
        assert RUST_LISTENING in server.log() and "served by grpc.aio" not in server.log(), server.log()
        client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=str(tmp_path / "ca.pem"))
        assert client.is_server_live()
        client.close()
        plain = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=10)
        plain.close()
    finally:
        assert server.terminate() == 0


@needs_rust
def test_a_certificate_the_transport_cannot_use_stops_the_server_saying_why(repo: Path, tmp_path: Path) -> None:
    flags = tls_flags(tmp_path)
    (tmp_path / "server.key").write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
    server = start_server(repo, "--grpc-transport", "rust", *flags, wait=False)
    code, log = exited(server)
    assert code != 0
    assert f"gRPC listener on 127.0.0.1:{server.grpc_port}: TLS: " in log, log


@needs_rust
@pytest.mark.parametrize("how", ["flag", "environment"])
def test_auto_serves_with_rust_when_it_can(repo: Path, how: str) -> None:
    if how == "flag":
        server = start_server(repo, "--grpc-transport", "auto")
    else:
        server = start_server(repo, env={"KUBEINFER_GRPC_TRANSPORT": "auto"})
    try:
        assert RUST_LISTENING in server.log() and "served by grpc.aio" not in server.log()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_ready()
        client.close()
    finally:
        assert server.terminate() == 0


def test_the_flag_wins_over_the_environment(repo: Path) -> None:
    server = start_server(repo, "--grpc-transport", "grpcio", env={"KUBEINFER_GRPC_TRANSPORT": "rust"})
    try:
        assert RUST_LISTENING not in server.log() and "gRPC listening on" in server.log()
    finally:
        assert server.terminate() == 0


def test_a_bad_environment_value_is_refused(repo: Path) -> None:
    server = start_server(repo, env={"KUBEINFER_GRPC_TRANSPORT": "quic"}, wait=False)
    code, log = exited(server)
    assert code != 0
    assert "KUBEINFER_GRPC_TRANSPORT='quic': expected one of auto, rust, grpcio" in log
