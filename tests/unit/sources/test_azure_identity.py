"""The operator's Azure workload identity, its parts: ``GuardedTransport`` (azure-core's public HttpTransport over the
guarded StoreClient) against a real local HTTP server through azure-core's own Pipeline and policies; the mapping
of the credential's failures to our reasons (never a token in a message); what ``workload_identity`` makes of the
webhook's variables (azure-identity's real WorkloadIdentityCredential); and StoreSources' rules: the bearer goes to
the account's public endpoint only, for listed namespaces without a credentialsSecret.

The whole token flow (a federated token file, the grant at a token endpoint over TLS, the bearer on the blob
requests of a real Azurite) is tests/integration/test_azure_identity.py.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
from azure.core.pipeline import Pipeline
from azure.core.pipeline.policies import ContentDecodePolicy, HeadersPolicy, RetryPolicy, UserAgentPolicy
from azure.core.rest import HttpRequest
from azure.identity import WorkloadIdentityCredential
from kubeinfer.operator.api.model_types import Source
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.sources.store_sources import StoreSources
from kubeinfer.server.sources import azure_identity
from kubeinfer.server.sources.azure_identity import (
    STORAGE_SCOPE,
    GuardedAnswer,
    GuardedTransport,
    StorageToken,
    workload_identity,
)
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, IPAddress, literal_address, parse_networks
from kubeinfer.server.sources.errors import REFUSED, UNAUTHORIZED, UNAVAILABLE, SourceError

LOOPBACK = AddressPolicy(allowed=parse_networks(["127.0.0.0/8"]))


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Recorder:
    """A local HTTP server: every request recorded (its headers as sent, repeated ones too), one JSON answer."""

    status: int = 200
    answer: dict[str, Any] = field(default_factory=lambda: {"access_token": "t", "expires_in": 3600})
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append(Seen(self.command, self.path, list(self.headers.items()), body))
                data = json.dumps(outer.answer).encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.close()


def pipeline(transport: GuardedTransport, retries: int = 0) -> Pipeline[HttpRequest, Any]:
    """An azure-core pipeline of public policies, as azure-identity's (headers, user agent, decoding, retries)."""
    policies = [
        HeadersPolicy(),
        UserAgentPolicy(base_user_agent="azsdk-python-identity"),
        ContentDecodePolicy(),
        RetryPolicy(retry_total=retries, retry_backoff_factor=0.0),
    ]
    return Pipeline(transport, policies=policies)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the transport


def test_the_transport_sends_a_form_grant_through_the_guarded_pool(recorder: Recorder) -> None:
    client = StoreClient(LOOPBACK, timeout=5.0)
    request = HttpRequest(
        "POST",
        f"{recorder.url}/tenant/oauth2/v2.0/token",
        data={"grant_type": "client_credentials", "scope": STORAGE_SCOPE, "client_assertion": "a.b c"},
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    response = pipeline(GuardedTransport(client, "", "the token request")).run(request, stream=False)
    answer = response.http_response
    assert isinstance(answer, GuardedAnswer)
    assert answer.status_code == 200 and answer.reason == "OK" and answer.encoding == "utf-8"
    assert answer.json() == {"access_token": "t", "expires_in": 3600}
    # decoded by azure-core as azure-identity reads it: the decoding policy's context, else from the answer itself
    assert response.context[ContentDecodePolicy.CONTEXT_NAME] == {"access_token": "t", "expires_in": 3600}
    assert ContentDecodePolicy.deserialize_from_http_generics(answer) == {"access_token": "t", "expires_in": 3600}
    # the guarded backend made the one connection
    assert client.backend.connected == [("127.0.0.1", "127.0.0.1")]
    [seen] = recorder.seen
    assert seen.method == "POST" and seen.path == "/tenant/oauth2/v2.0/token"
    assert (
        seen.body
        == b"grant_type=client_credentials&scope=https%3A%2F%2Fstorage.azure.com%2F.default&client_assertion=a.b+c"
    )
    names = [name.lower() for name, _ in seen.headers]
    # one of each header our client owns (no second User-Agent from the pipeline), the pipeline's own passed on
    for own in ("host", "user-agent", "accept-encoding", "content-length"):
        assert names.count(own) == 1, (own, seen.headers)
    assert dict((k.lower(), v) for k, v in seen.headers)["content-type"] == "application/x-www-form-urlencoded"


def test_a_refused_address_is_refused_unchanged_and_never_connected(recorder: Recorder) -> None:
    client = StoreClient(AddressPolicy(), timeout=5.0)  # public addresses only: not loopback
    request = HttpRequest("POST", f"{recorder.url}/token", data={"grant_type": "client_credentials"})
    with pytest.raises(SourceError) as info:
        pipeline(GuardedTransport(client), retries=2).run(request)
    assert info.value.reason == REFUSED and "loopback" in info.value.message
    assert recorder.seen == [] and client.backend.connected == []


def test_a_broken_connection_is_a_service_request_error_retried_by_azure_core() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()  # no answer: the connection breaks off

    threading.Thread(target=serve, daemon=True).start()
    client = StoreClient(LOOPBACK, timeout=5.0)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/token"
    request = HttpRequest("POST", url, data={"client_assertion": "federated-token-never-shown"})
    try:
        with pytest.raises(ServiceRequestError) as info:
            # POSTs retried as azure-identity asks for its token grants
            pipeline(GuardedTransport(client), retries=2).run(request, retry_on_methods=["POST"])
    finally:
        listener.close()
    assert len(accepted) == 3  # the first try and azure-core's two retries, each through the guard
    assert "federated-token-never-shown" not in str(info.value)


def test_only_whole_bodies_are_sent(recorder: Recorder) -> None:
    client = StoreClient(LOOPBACK, timeout=5.0)
    streamed = HttpRequest("POST", f"{recorder.url}/token", content=iter([b"a", b"b"]))
    with pytest.raises(ServiceRequestError, match="whole bodies"):
        pipeline(GuardedTransport(client)).run(streamed)
    text = HttpRequest("POST", f"{recorder.url}/token", content="plain text")
    pipeline(GuardedTransport(client)).run(text)
    assert recorder.seen[-1].body == b"plain text"


# ------------------------------------------------------------------------------------------- the token


class Credential:
    """An azure-core TokenCredential (its public protocol) scripted by the test."""

    def __init__(self, give: Callable[[], str]) -> None:
        self.give = give
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(self.give(), 2_000_000_000)


def _raise(exc: Exception) -> Callable[[], str]:
    def give() -> str:
        raise exc

    return give


def _entra_error(status: int) -> ClientAuthenticationError:
    answer = GuardedAnswer(HttpRequest("POST", "https://login.example/t"), status, {}, b"")
    return ClientAuthenticationError(
        message="Microsoft Entra ID error '(invalid_client) AADSTS700213: No matching federated identity record "
        "found.'\nTrace ID: 1234",
        response=answer,
    )


def test_the_bearer_header_and_the_scope() -> None:
    credential = Credential(lambda: "eyJ.token.sig")
    token = StorageToken(credential)  # type: ignore[arg-type]
    assert token.authorization("az://acct/c/m") == "Bearer eyJ.token.sig"
    assert credential.scopes == [("https://storage.azure.com/.default",)]
    assert "eyJ" not in repr(token)


@pytest.mark.parametrize(
    ("failure", "reason", "words"),
    [
        (_entra_error(400), UNAUTHORIZED, "AADSTS700213: No matching federated identity record found."),
        (_entra_error(503), UNAVAILABLE, "Microsoft Entra ID is unavailable"),
        (ServiceRequestError("the connection could not be made"), UNAVAILABLE, "the connection could not be made"),
        (SourceError(REFUSED, "host 'login.example' resolves to a private address"), REFUSED, "private address"),
        (FileNotFoundError("/var/run/secrets/azure/tokens/azure-identity-token"), UNAUTHORIZED, "not usable"),
    ],
)
def test_failures_become_our_reasons_in_our_words(failure: Exception, reason: str, words: str) -> None:
    token = StorageToken(Credential(_raise(failure)))  # type: ignore[arg-type]
    with pytest.raises(SourceError) as info:
        token.authorization("az://acct/c/m")
    assert info.value.reason == reason and words in info.value.message
    assert info.value.message.startswith("az://acct/c/m: ") and "Trace ID" not in info.value.message


def test_a_token_that_is_no_header_value_is_refused() -> None:
    token = StorageToken(Credential(lambda: "two\r\nlines"))  # type: ignore[arg-type]
    with pytest.raises(SourceError) as info:
        token.authorization("az://acct/c/m")
    assert info.value.reason == UNAUTHORIZED and "two" not in info.value.message


# ------------------------------------------------------------------------------ the webhook's variables


def test_workload_identity_needs_the_webhooks_variables(tmp_path: Path) -> None:
    client = StoreClient(timeout=5.0)
    file = tmp_path / "azure-identity-token"
    file.write_text("federated")
    full = {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_FEDERATED_TOKEN_FILE": str(file)}
    assert workload_identity(client, {}) is None
    assert workload_identity(client, {**full, "AZURE_TENANT_ID": " "}) is None
    made = workload_identity(client, full)
    assert made is not None and isinstance(made.credential, WorkloadIdentityCredential)
    assert made.scope == STORAGE_SCOPE
    # azure-identity itself refuses an authority that is not https: our reason, its words
    with pytest.raises(SourceError) as info:
        workload_identity(client, {**full, "AZURE_AUTHORITY_HOST": "http://login.example"})
    assert info.value.reason == UNAUTHORIZED and "https" in info.value.message


def test_the_operator_without_an_identity_says_how_to_give_it_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in azure_identity.WORKLOAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(azure_identity, "_ambient", None)
    with pytest.raises(SourceError) as info:
        azure_identity.ambient_identity()
    assert info.value.reason == UNAUTHORIZED
    assert "azure.workload.identity/use=true" in info.value.message and "AZURE_CLIENT_ID" in info.value.message


# ------------------------------------------------------------------------------ StoreSources' rules


def _to_loopback(host: str, port: int) -> list[IPAddress]:
    address = literal_address("127.0.0.1")
    assert address is not None
    return [address]


@dataclass
class Made:
    """The operator's identity as StoreSources asks for it: counted, a scripted credential."""

    credential: Credential = field(default_factory=lambda: Credential(lambda: "eyJ.operator.token"))
    asked: int = 0

    def __call__(self) -> StorageToken:
        self.asked += 1
        return StorageToken(self.credential)  # type: ignore[arg-type]


def _fill(sources: StoreSources, spec: dict[str, Any], namespace: str, tmp_path: Path, fetch: Fetch) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sources.fill(
            Source.from_spec(spec), fd, "model.onnx", False, namespace=namespace, fetch=fetch, max_bytes=1 << 20
        )
    finally:
        os.close(fd)


@pytest.fixture
def made() -> Made:
    return Made()


def stores(made: Made, **more: Any) -> StoreSources:
    # public addresses only, every name resolving to loopback: a request is refused where it would connect
    client = StoreClient(AddressPolicy(), timeout=5.0, resolve=_to_loopback)
    return StoreSources(client, deadline=30.0, ambient_azure_namespaces=("team-a",), azure_identity=made, **more)


def test_a_tenants_endpoint_never_gets_the_operators_token(made: Made, tmp_path: Path) -> None:
    sources = stores(made)
    for endpoint in ("https://evil.example.com", "https://acct.privatelink.example.com/acct", "http://10.0.0.5/acct"):
        spec = {"uri": "az://acct/models/m/model.onnx", "endpoint": endpoint}
        with pytest.raises(ArtifactError) as info:
            _fill(sources, spec, "team-a", tmp_path, Fetch())
        assert info.value.reason == "SourceRefused", endpoint
        assert (
            "https://acct.blob.core.windows.net only" in info.value.message
            and "credentialsSecret" in info.value.message
        )
    assert made.asked == 0 and made.credential.scopes == []
    assert sources.client.backend.connected == []


def test_the_public_endpoint_gets_the_token_in_a_listed_namespace_only(made: Made, tmp_path: Path) -> None:
    sources = stores(made)
    # listed: the token is taken for the request to the account's public endpoint (which the guard then refuses
    # here, every name resolving to loopback), whether the endpoint is left out or named as it is
    for spec in (
        {"uri": "az://acct/models/m/model.onnx"},
        {"uri": "https://acct.blob.core.windows.net/models/m/model.onnx"},
        {"uri": "az://acct/models/m/model.onnx", "endpoint": "https://acct.blob.core.windows.net/"},
    ):
        with pytest.raises(ArtifactError) as info:
            _fill(sources, spec, "team-a", tmp_path, Fetch())
        assert info.value.reason == "SourceRefused" and "acct.blob.core.windows.net" in info.value.message
        assert "loopback" in info.value.message and "eyJ" not in info.value.message
    assert made.asked == 3 and made.credential.scopes == [(STORAGE_SCOPE,)] * 3
    # a namespace not listed: anonymous, the identity never asked for
    with pytest.raises(ArtifactError):
        _fill(sources, {"uri": "az://acct/models/m/model.onnx"}, "team-b", tmp_path, Fetch())
    # a credentialsSecret wins over the operator's identity
    sas = {"AZURE_STORAGE_SAS_TOKEN": "sv=2024-08-04&sr=c&sp=rl&sig=abc"}
    spec = {"uri": "az://acct/models/m/model.onnx", "credentialsSecret": "sas"}
    with pytest.raises(ArtifactError):
        _fill(sources, spec, "team-a", tmp_path, Fetch(lambda name, host: sas))
    assert made.asked == 3


def test_every_namespace_with_a_star_and_the_public_endpoint_as_a_parameter(made: Made, tmp_path: Path) -> None:
    sources = stores(made, azure_public="https://{account}.blob.core.chinacloudapi.cn")
    sources.ambient_azure_namespaces = ("*",)
    with pytest.raises(ArtifactError) as info:
        _fill(sources, {"uri": "az://acct/models/m/model.onnx"}, "any", tmp_path, Fetch())
    assert "acct.blob.core.chinacloudapi.cn" in info.value.message and made.asked == 1
    # the public cloud's endpoint is now a tenant's choice like any other
    spec = {"uri": "az://acct/models/m/model.onnx", "endpoint": "https://acct.blob.core.windows.net"}
    with pytest.raises(ArtifactError) as info:
        _fill(sources, spec, "any", tmp_path, Fetch())
    assert info.value.reason == "SourceRefused" and "chinacloudapi.cn only" in info.value.message
    # a public endpoint over plain http never carries the token
    plain = stores(made, azure_public="http://{account}.blob.example")
    with pytest.raises(ArtifactError) as info:
        _fill(plain, {"uri": "az://acct/models/m/model.onnx"}, "team-a", tmp_path, Fetch())
    assert info.value.reason == "SourceRefused" and "plain http" in info.value.message
    assert plain.client.backend.connected == []
