"""``gs://`` sources through the operator's writer against Google's Cloud Storage emulator (fake-gcs-server): an object
pinned by the spec's sha256 or by its generation, a folder into a SavedModel's folder, missing buckets and objects;
and a service-account key whose token flow is google-auth's, sent through the egress guard: the JWT-bearer grant
reaches the key's token_uri (a token endpoint of the test's, over https) through the guarded pool, its access token
is the Bearer the store gets, a token_uri at a refused address is never connected to, and the key appears in no
message.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import secrets
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.client import Answer, StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks

from tests.support.gcs_store import GcsStore
from tests.support.https import make_ca_and_cert
from tests.support.sources import (
    LOOPBACK,
    NS,
    files_in,
    make_writer,
    model_spec,
    relu_onnx,
    secret_lookup,
    volume_root,
)


class RecordingClient(StoreClient):
    """The StoreClient, noting the method and Authorization header of each request it sends and the port of each
    connection its guarded backend makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.authorizations: list[tuple[str, str | None]] = []
        self.ports: list[int] = []
        connect = self.backend.connect_tcp

        def connect_tcp(host: str, port: int, *more: Any, **named: Any) -> Any:
            self.ports.append(port)
            return connect(host, port, *more, **named)

        self.backend.connect_tcp = connect_tcp  # type: ignore[method-assign]

    @contextmanager
    def request(self, method: str, url: Any, headers: Mapping[str, str], **kwargs: Any) -> Iterator[Answer]:
        self.authorizations.append((method, headers.get("Authorization")))
        with super().request(method, url, headers, **kwargs) as answer:
            yield answer


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_ca_and_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsStore]:
    with GcsStore(tmp_path_factory.mktemp("gcs")) as gcs:
        gcs.create_bucket("models")
        yield gcs


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, tls: tuple[Path, Path, Path]) -> Iterator[GcsStore]:
    ca, cert, key = tls
    with GcsStore(tmp_path_factory.mktemp("gcs-tls"), tls=(cert, key), ca_file=ca) as gcs:
        gcs.create_bucket("private")
        yield gcs


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    return relu_onnx(tmp_path / "relu.onnx").read_bytes()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


def _anonymous(name: str, host: str) -> dict[str, str]:
    raise AssertionError("an anonymous source reads no Secret")


def test_an_object_pinned_by_sha256_or_by_its_generation(root: Path, store: GcsStore, model_bytes: bytes) -> None:
    generation = store.upload("models", "resnet/model.onnx", model_bytes)["generation"]
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()
    source = {"uri": "gs://models/resnet/model.onnx", "endpoint": store.endpoint}
    fetch = Fetch(_anonymous)
    writer.sync_model(server_dir, render_model("a", model_spec({**source, "sha256": digest})), fetch=fetch)
    assert (server_dir / "a/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"sha256 sha256:{digest}"}
    assert read_model(server_dir, "a").error == ""
    # no sha256: the object's generation pins it, and the download asks for that generation
    fetch = Fetch(_anonymous)
    writer.sync_model(server_dir, render_model("b", model_spec(source)), fetch=fetch)
    assert (server_dir / "b/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"gcs-generation {generation}"}
    # a wrong sha256: the bytes are refused, nothing is published
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            server_dir, render_model("c", model_spec({**source, "sha256": "0" * 64})), fetch=Fetch(_anonymous)
        )
    assert info.value.reason == "ChecksumMismatch" and not (server_dir / "c").exists()


def test_a_folder_becomes_the_savedmodel_folder(root: Path, store: GcsStore) -> None:
    files = {"saved_model.pb": b"graph", "variables/variables.index": b"index", "variables/variables.data": b"w" * 9999}
    for rel, data in files.items():
        store.upload("models", f"saved/1/{rel}", data)
    store.upload("models", "saved/1/", b"")  # a console's folder marker: skipped
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_anonymous)
    spec = model_spec({"uri": "gs://models/saved/1/", "endpoint": store.endpoint}, "tensorflow_savedmodel")
    writer.sync_model(server_dir, render_model("tf", spec), fetch=fetch)
    folder = server_dir / "tf/1/model.savedmodel"
    assert files_in(folder) == files
    assert fetch.served == {1: "3 objects pinned by gcs-generation"}
    assert sorted(os.listdir(server_dir / "tf/1")) == sorted([SOURCE_MARKER, "model.savedmodel"])
    # a folder is pinned by its objects: a sha256 for it is refused
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(
            {"uri": "gs://models/saved/1/", "endpoint": store.endpoint, "sha256": "0" * 64}, "tensorflow_savedmodel"
        )
        writer.sync_model(server_dir, render_model("tf2", spec), fetch=Fetch(_anonymous))
    assert info.value.reason == "SourceInvalid"


def test_missing_buckets_objects_and_folders(root: Path, store: GcsStore) -> None:
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    for uri, platform in (
        ("gs://nosuchbucket/m.onnx", "onnxruntime_onnx"),
        ("gs://models/none/model.onnx", "onnxruntime_onnx"),
        ("gs://models/none/", "tensorflow_savedmodel"),
    ):
        spec = model_spec({"uri": uri, "endpoint": store.endpoint}, platform)
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("n", spec), fetch=Fetch(_anonymous))
        assert info.value.reason == "SourceNotFound", info.value.message
    assert not (server_dir / "n").exists()


# ------------------------------------------------------------------------------- service-account keys


class TokenEndpoint:
    """An OAuth 2.0 token endpoint (https) answering the JWT-bearer grant of one service-account key: it checks
    the assertion's signature, issuer, audience and scope, and answers with an access token of its own."""

    def __init__(self, tls: tuple[Path, Path, Path], public_pem: bytes, host: str = "127.0.0.1") -> None:
        self.public_pem = public_pem
        self.access_token = "ya29.test-" + secrets.token_urlsafe(24)
        self.grants: list[dict[str, Any]] = []
        self.refuse = False
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                form = dict(urllib.parse.parse_qsl(body))
                status, answer = outer.answer(self.path, form)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[1]), str(tls[2]))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def token_uri(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"https://{host!s}:{port}/token"

    def answer(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path != "/token" or form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, {"error": "unsupported_grant_type"}
        # google-auth's assertions name Google's token endpoint as their audience, wherever token_uri points
        claims = jwt.decode(form["assertion"], certs=self.public_pem, audience="https://oauth2.googleapis.com/token")
        self.grants.append(claims)
        if self.refuse:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        return 200, {"access_token": self.access_token, "expires_in": 3600, "token_type": "Bearer"}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _service_account_key(token_uri: str) -> tuple[dict[str, str], bytes]:
    """(a service-account key's JSON fields, its public key in PEM): a fresh RSA key, as the IAM console gives."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key = {
        "type": "service_account",
        "project_id": "kubeinfer-test",
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": "reader@kubeinfer-test.iam.gserviceaccount.com",
        "client_id": "1234567890",
        "token_uri": token_uri,
    }
    return key, public


def _secret(key: dict[str, str], allowed_host: str) -> Any:
    return secret_lookup({"key.json": json.dumps(key)}, allowed_host)


@pytest.fixture
def keyed(tls: tuple[Path, Path, Path]) -> Iterator[tuple[TokenEndpoint, dict[str, str]]]:
    key, public = _service_account_key("")
    endpoint = TokenEndpoint(tls, public)
    key["token_uri"] = endpoint.token_uri
    try:
        yield endpoint, key
    finally:
        endpoint.close()


def _key_material(key: dict[str, str]) -> list[str]:
    body = [line for line in key["private_key"].splitlines() if line and not line.startswith("-----")]
    return [*body, key["private_key_id"]]


def test_a_service_account_key_token_flow_goes_through_the_guard(
    root: Path,
    secure: GcsStore,
    tls: tuple[Path, Path, Path],
    keyed: tuple[TokenEndpoint, dict[str, str]],
    model_bytes: bytes,
) -> None:
    endpoint, key = keyed
    generation = secure.upload("private", "m/model.onnx", model_bytes)["generation"]
    client = RecordingClient(LOOPBACK, timeout=10.0, ca_file=str(tls[0]))
    writer = make_writer(root, client=client)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": "gs://private/m/model.onnx", "endpoint": secure.endpoint, "credentialsSecret": "gcs"}
    fetch = Fetch(_secret(key, "127.0.0.1"))
    writer.sync_model(server_dir, render_model("k", model_spec(source)), fetch=fetch)
    assert (server_dir / "k/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"gcs-generation {generation}"}
    # google-auth signed the grant (checked by the endpoint: signature, audience) and asked for read-only access
    assert len(endpoint.grants) == 1
    grant = endpoint.grants[0]
    assert (
        grant["iss"] == key["client_email"] and grant["scope"] == "https://www.googleapis.com/auth/devstorage.read_only"
    )
    # ... through the guarded pool (its backend made the connection), and its token is what the store got
    token_port = urllib.parse.urlsplit(endpoint.token_uri).port
    assert token_port in client.ports and secure.port in client.ports
    # (the grant itself is posted through the same client, with no Authorization: the assertion is its body)
    assert ("POST", None) in client.authorizations
    reads = {authorization for method, authorization in client.authorizations if method != "POST"}
    assert reads == {f"Bearer {endpoint.access_token}"}

    # the token endpoint refuses the grant: unauthorized, in words that name neither key nor token
    endpoint.refuse = True
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("r", model_spec(source)), fetch=Fetch(_secret(key, "127.0.0.1")))
    assert info.value.reason == "SourceUnauthorized" and "invalid_grant" in info.value.message
    for secret in [*_key_material(key), endpoint.access_token]:
        assert secret not in info.value.message
    # a Secret that does not list the endpoint's host is not used
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("h", model_spec(source)), fetch=Fetch(_secret(key, "elsewhere")))
    assert info.value.reason == "CredentialsRejected"
    assert not (server_dir / "r").exists() and not (server_dir / "h").exists()


def test_a_token_uri_at_a_refused_address_is_never_connected(
    root: Path, secure: GcsStore, tls: tuple[Path, Path, Path], model_bytes: bytes
) -> None:
    secure.upload("private", "refused/model.onnx", model_bytes)
    # a listener on 127.0.0.2 that counts connections; the guard allows 127.0.0.1 only
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.2", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    only_store = AddressPolicy(allowed=parse_networks(["127.0.0.1/32"]))
    try:
        for token_uri in (f"https://127.0.0.2:{port}/token", f"https://169.254.169.254:{port}/token"):
            key, _ = _service_account_key(token_uri)
            client = StoreClient(only_store, timeout=5.0, ca_file=str(tls[0]))
            writer = make_writer(root, client=client)
            server_dir = writer.server_dir(NS, "ns/pool")
            source = {"uri": "gs://private/refused/model.onnx", "endpoint": secure.endpoint, "credentialsSecret": "g"}
            with pytest.raises(ArtifactError) as info:
                writer.sync_model(
                    server_dir, render_model("x", model_spec(source)), fetch=Fetch(_secret(key, "127.0.0.1"))
                )
            assert info.value.reason == "SourceRefused", info.value.message
            assert "token" in info.value.message
            for secret in _key_material(key):
                assert secret not in info.value.message
            assert not client.backend.connected  # not even the store: the token comes first
            assert not (server_dir / "x").exists()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in accepted:
            conn.close()
    assert accepted == []


def test_credentials_are_not_sent_over_plain_http(root: Path, store: GcsStore, model_bytes: bytes) -> None:
    store.upload("models", "plain/model.onnx", model_bytes)
    key, _ = _service_account_key("https://127.0.0.1:1/token")
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": "gs://models/plain/model.onnx", "endpoint": store.endpoint, "credentialsSecret": "gcs"}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("p", model_spec(source)), fetch=Fetch(_secret(key, "127.0.0.1")))
    assert info.value.reason == "SourceRefused" and "plain http" in info.value.message


def test_workload_identity_goes_to_googles_endpoint_only(root: Path, store: GcsStore, model_bytes: bytes) -> None:
    """The operator's own identity (``--ambient-gcs-credentials``) is a bearer token: never for a tenant's endpoint."""
    store.upload("models", "ambient/model.onnx", model_bytes)
    client = StoreClient(LOOPBACK, timeout=10.0)
    writer = make_writer(root, client=client, deadline=60.0, ambient_gcs_namespaces=(NS,))
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": "gs://models/ambient/model.onnx", "endpoint": store.endpoint}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("w", model_spec(source)), fetch=Fetch(_anonymous))
    assert info.value.reason == "SourceRefused" and "storage.googleapis.com" in info.value.message
    assert not client.backend.connected
    # a namespace the admin did not list reads the same source anonymously
    other = writer.server_dir("other", "other/pool")
    (root / "other").mkdir(exist_ok=True)
    writer.sync_model(other, render_model("w", model_spec(source)), fetch=Fetch(_anonymous))
    assert (other / "w/1/model.onnx").read_bytes() == model_bytes
