"""Issue 15 part 7: optional bearer-token authentication and TLS / mTLS on HTTP and gRPC, with real clients.

Certificates are made for the test with ``cryptography`` (a CA, a server certificate for 127.0.0.1, a
client certificate, and one from another CA). The health probes and the metrics port never need a token.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubeinfer.server.grpc.server import BearerInterceptor
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support import h2client
from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, grpc_transports, start_server

GOOD = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1.0, -1.0, 2.0, -2.0]}]}


def _cert(
    name: str, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None, *, server: bool = False
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if server:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    return cert, key


def _write(folder: Path, name: str, pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey]) -> tuple[Path, Path]:
    cert, key = pair
    (folder / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / f"{name}.crt", folder / f"{name}.key"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = _cert("kubeinfer test CA", None)
    other_ca = _cert("someone else's CA", None)
    files: dict[str, Path] = {}
    files["ca"], _ = _write(folder, "ca", ca)
    files["server.crt"], files["server.key"] = _write(folder, "server", _cert("127.0.0.1", ca, server=True))
    files["client.crt"], files["client.key"] = _write(folder, "client", _cert("client", ca))
    files["rogue.crt"], files["rogue.key"] = _write(folder, "rogue", _cert("rogue", other_ca))
    return files


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("auth") / "repo"
    write_model(repo, "relu", 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n', {1: unary("relu", "Relu", TensorProto.FLOAT, ["b", 4])})  # fmt: skip
    return repo


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text("s3cret-token\n")
    return path


@pytest.fixture(scope="module", params=grpc_transports())
def token_server(request: pytest.FixtureRequest, repo: Path, token_file: Path) -> Iterator[ServerProcess]:
    """On each gRPC transport (--grpc-transport): the token is checked by both."""
    s = start_server(repo, "--auth-token-file", str(token_file), "--grpc-transport", str(request.param))
    yield s
    assert s.terminate() == 0


def _grpc_infer(client: grpcclient.InferenceServerClient, **kw: object) -> np.ndarray:
    inp = grpcclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([[1.0, -1.0, 2.0, -2.0]], np.float32))
    return client.infer("relu", [inp], **kw).as_numpy("OUT")  # type: ignore[arg-type]


def test_http_requests_need_the_token_but_probes_and_metrics_do_not(
    token_server: ServerProcess, token_file: Path
) -> None:
    url = f"{token_server.base_url}/v2/models/relu/infer"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        r = httpx.post(url, json=GOOD, headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        assert "--auth-token-file" in r.json()["error"]
    for path in ("/v2", "/v2/models/relu", "/openapi.json"):
        assert httpx.get(token_server.base_url + path, timeout=30).status_code == 401
    assert httpx.post(f"{token_server.base_url}/v2/repository/index", json={}, timeout=30).status_code == 401
    r = httpx.post(url, json=GOOD, headers={"Authorization": "Bearer s3cret-token"}, timeout=30)
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 0.0, 2.0, 0.0]
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert httpx.get(token_server.base_url + path, timeout=30).status_code == 200
    assert "nv_inference_request_success" in httpx.get(token_server.metrics_url, timeout=30).text


def test_grpc_requests_need_the_token_but_probes_do_not(token_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(token_server.grpc_url)
    try:
        assert client.is_server_live() and client.is_server_ready()
        for headers in (None, {"authorization": "Bearer wrong"}):
            with pytest.raises(InferenceServerException) as info:
                _grpc_infer(client, headers=headers)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED" and "--auth-token-file" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            client.get_model_repository_index()
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        out = _grpc_infer(client, headers={"authorization": "Bearer s3cret-token"})
        np.testing.assert_array_equal(out, [[1.0, 0.0, 2.0, 0.0]])
        # the streaming RPC too
        import queue

        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inp = grpcclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), np.float32))
        try:
            client.async_stream_infer("relu", [inp])
        except InferenceServerException:
            pass  # the server may have refused the stream before this request was written; the callback says why
        _, error = results.get(timeout=30)
        client.stop_stream()
        assert error is not None and "UNAUTHENTICATED" in str(error.status())
    finally:
        client.close()


@pytest.mark.parametrize("path", ["/inference.GRPCInferenceService/NoSuchRpc", "/other.Service/Method"])
def test_an_unknown_method_asks_for_the_token_first(token_server: ServerProcess, path: str) -> None:
    """As grpc.aio's interceptor runs before its method lookup: UNAUTHENTICATED without the token,
    UNIMPLEMENTED (grpc's "Method not found!") with it."""
    with grpc.insecure_channel(token_server.grpc_url) as channel:
        call = channel.unary_unary(path)
        for metadata, code, message in (
            (None, grpc.StatusCode.UNAUTHENTICATED, BearerInterceptor.MESSAGE),
            ([("authorization", "Bearer wrong")], grpc.StatusCode.UNAUTHENTICATED, BearerInterceptor.MESSAGE),
            ([("authorization", "Bearer s3cret-token")], grpc.StatusCode.UNIMPLEMENTED, "Method not found!"),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(b"", metadata=metadata, timeout=30)
            assert (info.value.code(), info.value.details()) == (code, message)  # type: ignore[attr-defined]


INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
#: the 5-byte prefix of a 1 MiB message and its first KiB: the rest is never sent
PARTIAL = h2client.framed(b"x" * (1 << 20))[: 5 + 1024]


@pytest.mark.parametrize("authorization", [None, b"Bearer wrong", b"Basic s3cret-token"])
def test_the_token_is_checked_before_the_message_is_read(
    token_server: ServerProcess, authorization: bytes | None
) -> None:
    """A call without the token is refused on its headers: the answer comes while the client has sent only
    part of its message (the server would wait for the rest of it before running the call)."""
    metadata = [(b"authorization", authorization)] if authorization else []
    for path in (INFER, STREAM):
        answer = h2client.call(token_server.grpc_url, path, PARTIAL, metadata, end=False)
        assert answer.ended, f"{path}: no answer before the message was complete"
        assert (answer.status, answer.message) == ("16", BearerInterceptor.MESSAGE), (path, answer)


def test_with_the_token_the_server_waits_for_the_message(token_server: ServerProcess) -> None:
    """The control of the test above: with the right token the same partial call gets no answer yet."""
    metadata = [(b"authorization", b"Bearer s3cret-token")]
    answer = h2client.call(token_server.grpc_url, INFER, PARTIAL, metadata, end=False, wait=2)
    assert not answer.ended and answer.status is None, answer


def test_an_authorization_value_that_is_not_text_fails_only_its_own_call(token_server: ServerProcess) -> None:
    """Header values are compared as bytes: a value that is not Latin-1 (UTF-8 "tök€") or not UTF-8 at all is
    UNAUTHENTICATED, and the calls arriving with it (the Rust transport drains them in one batch) are served."""
    odd = [b"Bearer t\xc3\xb6k\xe2\x82\xac", b"Bearer \xff\xfe", "Bearer s3cret-token\u00e9".encode()]
    body = h2client.framed(b"")
    with ThreadPoolExecutor(max_workers=24) as pool:
        clients = [grpcclient.InferenceServerClient(token_server.grpc_url) for _ in range(4)]
        good = [
            pool.submit(_grpc_infer, clients[i % 4], headers={"authorization": "Bearer s3cret-token"})
            for i in range(40)
        ]
        bad = [
            pool.submit(h2client.call, token_server.grpc_url, INFER, body, [(b"authorization", value)])
            for value in odd * 4
        ]
        for answer in (f.result(timeout=60) for f in bad):
            assert (answer.status, answer.message) == ("16", BearerInterceptor.MESSAGE), answer
        for out in (f.result(timeout=60) for f in good):
            np.testing.assert_array_equal(out, [[1.0, 0.0, 2.0, 0.0]])
        for client in clients:
            client.close()


def test_a_rotated_or_revoked_token_takes_effect_on_grpc_at_once(token_server: ServerProcess, token_file: Path) -> None:
    """The token's value a transport has let through before is not trusted after the file changed."""
    client = grpcclient.InferenceServerClient(token_server.grpc_url)
    old, new = {"authorization": "Bearer s3cret-token"}, {"authorization": "Bearer rotated-token"}
    try:
        _grpc_infer(client, headers=old)
        token_file.write_text("rotated-token\n")
        for headers in (old, {"authorization": "Bearer wrong"}):
            with pytest.raises(InferenceServerException) as info:
                _grpc_infer(client, headers=headers)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value
        np.testing.assert_array_equal(_grpc_infer(client, headers=new), [[1.0, 0.0, 2.0, 0.0]])
        with pytest.raises(InferenceServerException) as info:
            _grpc_infer(client, headers=old)  # a refused value is not let through again either
        assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value
    finally:
        token_file.write_text("s3cret-token\n")
        client.close()
    np.testing.assert_array_equal(
        _grpc_infer(grpcclient.InferenceServerClient(token_server.grpc_url), headers=old), [[1.0, 0.0, 2.0, 0.0]]
    )


def test_a_rotated_token_takes_effect_without_a_restart(token_server: ServerProcess, token_file: Path) -> None:
    url = f"{token_server.base_url}/v2/models/relu/infer"
    token_file.write_text("rotated-token\n")
    try:
        assert (
            httpx.post(url, json=GOOD, headers={"Authorization": "Bearer s3cret-token"}, timeout=30).status_code == 401
        )
        assert (
            httpx.post(url, json=GOOD, headers={"Authorization": "Bearer rotated-token"}, timeout=30).status_code == 200
        )
    finally:
        token_file.write_text("s3cret-token\n")


def _log_lines(server: ServerProcess, since: int, text: str) -> list[str]:
    return [line for line in server.log()[since:].splitlines() if text in line]


def test_emptying_or_deleting_the_token_file_revokes_the_token(token_server: ServerProcess, token_file: Path) -> None:
    """Issue 23 part 4: revocation fails closed on both protocols, with one WARNING per revocation that says
    why; a token written again restores service. The probes stay open throughout."""
    url = f"{token_server.base_url}/v2/models/relu/infer"
    good = {"Authorization": "Bearer s3cret-token"}
    client = grpcclient.InferenceServerClient(token_server.grpc_url)
    try:
        for revoke, why in ((lambda: token_file.write_text(""), "it is empty"), (token_file.unlink, "cannot read it")):
            mark = len(token_server.log())
            revoke()
            for _ in range(3):  # several refusals, one log line
                r = httpx.post(url, json=GOOD, headers=good, timeout=30)
                assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
                assert httpx.get(f"{token_server.base_url}/v2", headers=good, timeout=30).status_code == 401
                with pytest.raises(InferenceServerException) as info:
                    _grpc_infer(client, headers={"authorization": "Bearer s3cret-token"})
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"
            assert httpx.get(f"{token_server.base_url}/v2/health/ready", timeout=30).status_code == 200
            assert client.is_server_ready()
            warnings = _log_lines(token_server, mark, "no longer holds a token")
            assert len(warnings) == 1 and why in warnings[0] and "WARNING" in warnings[0], warnings
            token_file.write_text("s3cret-token\n")  # service is back at once
            assert httpx.post(url, json=GOOD, headers=good, timeout=30).status_code == 200
            np.testing.assert_array_equal(
                _grpc_infer(client, headers={"authorization": "Bearer s3cret-token"}), [[1.0, 0.0, 2.0, 0.0]]
            )
            assert len(_log_lines(token_server, mark, "holds a token again")) == 1
    finally:
        token_file.write_text("s3cret-token\n")
        client.close()


def test_the_extension_endpoints_need_the_token(token_server: ServerProcess) -> None:
    """Logging, trace settings (global and per model), the repository API (poll requests included) and
    shared-memory registration are refused without the token on both protocols, and a refused update changes
    nothing."""
    base = token_server.base_url
    good = {"Authorization": "Bearer s3cret-token"}
    calls = [
        ("GET", "/v2/logging", None),
        ("POST", "/v2/logging", {"log_verbose_level": 3}),
        ("GET", "/v2/trace/setting", None),
        ("POST", "/v2/trace/setting", {"trace_rate": "7"}),
        ("GET", "/v2/models/relu/trace/setting", None),
        ("POST", "/v2/models/relu/trace/setting", {"trace_rate": "7"}),
        ("POST", "/v2/repository/index", {}),
        ("POST", "/v2/repository/models/relu/load", {}),
        ("POST", "/v2/repository/models/relu/unload", {}),
        ("POST", "/v2/repository/poll", {"models": ["relu"]}),
        ("GET", "/v2/systemsharedmemory/status", None),
        ("POST", "/v2/systemsharedmemory/region/r/register", {"key": "/k", "offset": 0, "byte_size": 8}),
        ("GET", "/v2/models/relu/config", None),
        ("GET", "/v2/models/stats", None),
    ]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for method, path, body in calls:
            r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (method, path, r.text)
    assert httpx.get(f"{base}/v2/logging", headers=good, timeout=30).json()["log_verbose_level"] == 0
    assert httpx.get(f"{base}/v2/trace/setting", headers=good, timeout=30).json()["trace_rate"] != "7"
    assert httpx.post(f"{base}/v2/repository/index", json={}, headers=good, timeout=30).status_code == 200

    client = grpcclient.InferenceServerClient(token_server.grpc_url)
    try:
        refused = [
            client.get_log_settings,
            lambda **kw: client.update_log_settings({"log_verbose_level": 3}, **kw),
            client.get_trace_settings,
            lambda **kw: client.update_trace_settings(settings={"trace_rate": "7"}, **kw),
            lambda **kw: client.update_trace_settings("relu", {"trace_rate": "7"}, **kw),
            client.get_model_repository_index,
            lambda **kw: client.load_model("relu", **kw),
            lambda **kw: client.unload_model("relu", **kw),
            client.get_system_shared_memory_status,
            lambda **kw: client.register_system_shared_memory("r", "/k", 8, **kw),
            lambda **kw: client.get_model_config("relu", **kw),
            client.get_inference_statistics,
        ]
        for headers in (None, {"authorization": "Bearer wrong"}):
            for call in refused:
                with pytest.raises(InferenceServerException) as info:
                    call(headers=headers)
                assert info.value.status() == "StatusCode.UNAUTHENTICATED", info.value
        good = {"authorization": "Bearer s3cret-token"}
        assert client.get_log_settings(headers=good, as_json=True)["settings"]["log_verbose_level"]["uint32_param"] == 0
        settings = client.get_trace_settings(headers=good, as_json=True)["settings"]
        assert settings["trace_rate"]["value"] != ["7"]
        assert client.get_model_repository_index(headers=good, as_json=True)["models"]
    finally:
        client.close()


def test_an_authorization_value_no_text_encoding_gives_is_refused_alone(token_server: ServerProcess) -> None:
    """Issue 25 part 4 (the Python side): an ``authorization`` value that is not UTF-8 or Latin-1 text is
    UNAUTHENTICATED, and calls that arrive with it are served: it never stops the server's call loop."""
    good = grpcclient.InferenceServerClient(token_server.grpc_url)
    try:
        with ThreadPoolExecutor(4) as pool:
            served = [
                pool.submit(_grpc_infer, good, headers={"authorization": "Bearer s3cret-token"}, client_timeout=30)
                for _ in range(40)
            ]
            for value in (b"Bearer \xe9\xff\xfe", "Bearer \u20ac\u4e2d".encode()):
                # written by hand (tests/support/h2client): grpc's client refuses to send such header bytes
                answer = h2client.call(
                    token_server.grpc_url,
                    "/inference.GRPCInferenceService/ServerMetadata",
                    h2client.framed(b""),
                    [(b"authorization", value)],
                    wait=20,
                )
                assert answer.ended and answer.status == "16", answer
            for future in served:
                np.testing.assert_array_equal(future.result(timeout=60), [[1.0, 0.0, 2.0, 0.0]])
        np.testing.assert_array_equal(
            _grpc_infer(good, headers={"authorization": "Bearer s3cret-token"}), [[1.0, 0.0, 2.0, 0.0]]
        )
    finally:
        good.close()
    r = httpx.post(
        f"{token_server.base_url}/v2/models/relu/infer", json=GOOD, headers={"Authorization": b"Bearer \xe9\xff"}
    )
    assert r.status_code == 401


@pytest.fixture(scope="module")
def tls_server(
    repo: Path, pki: dict[str, Path], token_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    s = start_server(
        repo,
        "--http-tls-cert", str(pki["server.crt"]), "--http-tls-key", str(pki["server.key"]),
        "--http-tls-client-ca", str(pki["ca"]),
        "--grpc-use-ssl", "true", "--grpc-use-ssl-mutual", "true",
        "--grpc-server-cert", str(pki["server.crt"]), "--grpc-server-key", str(pki["server.key"]),
        "--grpc-root-cert", str(pki["ca"]),
        "--auth-token-file", str(token_file),
        wait=False, log_dir=tmp_path_factory.mktemp("tls-logs"),
    )  # fmt: skip
    client = httpx.Client(verify=ssl.create_default_context(cafile=str(pki["ca"])), cert=(str(pki["client.crt"]), str(pki["client.key"])))  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            if client.get(f"https://127.0.0.1:{s.http_port}/v2/health/ready", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not s.alive():
            s.terminate(10)
            pytest.fail(f"TLS server not ready:\n{s.log()}")
        time.sleep(0.2)
    client.close()
    yield s
    assert s.terminate() == 0


def _https(pki: dict[str, Path], client_cert: str | None) -> httpx.Client:
    cert = (str(pki[f"{client_cert}.crt"]), str(pki[f"{client_cert}.key"])) if client_cert else None
    return httpx.Client(verify=ssl.create_default_context(cafile=str(pki["ca"])), cert=cert, timeout=30)


def test_https_with_client_certificates(tls_server: ServerProcess, pki: dict[str, Path]) -> None:
    url = f"https://127.0.0.1:{tls_server.http_port}/v2/models/relu/infer"
    with _https(pki, "client") as client:
        r = client.post(url, json=GOOD, headers={"Authorization": "Bearer s3cret-token"})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 0.0, 2.0, 0.0]
        assert client.post(url, json=GOOD).status_code == 401  # TLS does not replace the token
    for who in (None, "rogue"):  # no client certificate, or one another CA signed: the handshake fails
        with _https(pki, who) as client, pytest.raises(httpx.HTTPError):
            client.post(url, json=GOOD, headers={"Authorization": "Bearer s3cret-token"})
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
        httpx.post(f"http://127.0.0.1:{tls_server.http_port}/v2/models/relu/infer", json=GOOD, timeout=10)
    assert httpx.get(tls_server.metrics_url, timeout=30).status_code == 200  # metrics stay plain and open


def test_grpc_over_mutual_tls(tls_server: ServerProcess, pki: dict[str, Path]) -> None:
    def client(who: str | None) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(
            tls_server.grpc_url,
            ssl=True,
            root_certificates=str(pki["ca"]),
            private_key=str(pki[f"{who}.key"]) if who else None,
            certificate_chain=str(pki[f"{who}.crt"]) if who else None,
        )

    good = client("client")
    np.testing.assert_array_equal(
        _grpc_infer(good, headers={"authorization": "Bearer s3cret-token"}), [[1.0, 0.0, 2.0, 0.0]]
    )
    good.close()
    for who in (None, "rogue"):
        bad = client(who)
        with pytest.raises(InferenceServerException) as info:
            bad.is_server_live(client_timeout=10)
        assert info.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"), info.value
        bad.close()
    plain = grpcclient.InferenceServerClient(tls_server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=10)
    plain.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--grpc-use-ssl", "true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--http-tls-cert", "/nonexistent.crt"], "HTTPS needs both --http-tls-cert and --http-tls-key"),
        (["--auth-token-file", "/nonexistent"], "--auth-token-file '/nonexistent' does not exist"),
    ],
)
def test_incomplete_security_flags_stop_the_server_with_a_reason(repo: Path, flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubeinfer.server", "--model-repository", str(repo), *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
