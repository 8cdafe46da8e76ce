"""The operator's Azure workload identity (``--ambient-azure-credentials``), end to end through the egress guard:
azure-identity's own ``WorkloadIdentityCredential`` reads a federated token file (what AKS's webhook projects),
posts its client-credentials grant through ``GuardedTransport`` (the guarded pool, no socket of its own) to a token
endpoint over TLS at ``login.microsoftonline.com``, and the access token it gets is the ``Authorization: Bearer``
of every blob request to the account's public endpoint ``devstoreaccount1.blob.core.windows.net``, served by a
real Azure Blob Storage: Microsoft's emulator Azurite over https with ``--oauth basic``.

What is real and what is not: no open Microsoft Entra ID exists to test against, so the token endpoint is the
test's (``EntraTokenEndpoint``: it checks the grant azure-identity sends, the federated assertion, client id and
scope, and answers as Entra ID does, with a JWT access token). Azurite's basic OAuth mode checks the token's claims
(issuer https://sts.windows.net/<tenant>/, audience https://storage.azure.com, nbf/iat/exp) and refuses a token
without them, but not its signature (Azurite 3.37.0, dist/src/blob/authentication/BlobTokenAuthenticator.js), and
it grants every valid token every container: role assignments (Storage Blob Data Reader) are not tested. Both names
resolve to 127.0.0.1 through the client's ``resolve`` hook, and the test's CA is trusted through its ``ca_file``;
the accounts' public endpoint is StoreSources' ``azure_public`` (with Azurite's port), so the "public endpoint
only" rule is the operator's own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import logging
import secrets
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from azure.storage.blob import BlobServiceClient
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.server.sources.azure_identity import STORAGE_SCOPE, StorageToken, workload_identity
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import IPAddress, literal_address

from tests.support.azurite import Azurite
from tests.support.https import make_ca_and_cert
from tests.support.sources import LOOPBACK, NS, make_writer, model_spec, relu_onnx, volume_root

ACCOUNT = Azurite.account
BLOB_HOST = f"{ACCOUNT}.blob.core.windows.net"
LOGIN_HOST = "login.microsoftonline.com"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
CLIENT_ID = "0b7f5f8a-4c1e-4a59-9d5e-3f1b6a8e2c11"


def _anonymous(name: str, host: str) -> dict[str, str]:
    raise AssertionError("no Secret is read")


# ------------------------------------------------------------------------------------------------ TLS


def to_loopback(host: str, port: int) -> list[IPAddress]:
    """The clients' resolver: the two public names at 127.0.0.1, no other name resolves."""
    address = literal_address("127.0.0.1")
    return [address] if address is not None and host in (BLOB_HOST, LOGIN_HOST) else []


# ------------------------------------------------------------------------------------- Azurite, https + OAuth


class OAuthAzurite(Azurite):
    """Azurite over https (the test's certificate) with ``--oauth basic``: bearer tokens accepted (Azurite refuses
    Bearer over plain http). The shared key still works, for the test's own uploads."""

    def __init__(self, root: Path, tls: tuple[Path, Path, Path]) -> None:
        self.tls = tls
        super().__init__(root)

    @property
    def endpoint(self) -> str:
        return f"https://{self.host}:{self.port}/{self.account}"

    def command(self) -> list[str]:
        return [*super().command(), "--oauth", "basic", "--cert", str(self.tls[1]), "--key", str(self.tls[2])]

    def ready(self) -> bool:
        try:
            with httpx.Client(trust_env=False, timeout=2, verify=ssl.create_default_context(cafile=self.tls[0])) as h:
                answer = h.get(f"{self.endpoint}?comp=list")
        except httpx.HTTPError:
            return False
        return "x-ms-request-id" in answer.headers

    def service(self) -> Any:
        return BlobServiceClient(
            self.endpoint,
            credential={"account_name": self.account, "account_key": self.key},
            connection_verify=str(self.tls[0]),
        )


# ------------------------------------------------------------------------------------- the token endpoint


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def access_token(**claims: Any) -> str:
    """A JWT as Entra ID issues for Azure Storage (HS256 with a throwaway key: Azurite reads, never verifies, it)."""
    now = int(time.time())
    body = {
        "aud": "https://storage.azure.com",
        "iss": f"https://sts.windows.net/{TENANT}/",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 3600,
        "appid": CLIENT_ID,
        "tid": TENANT,
        "uti": secrets.token_urlsafe(12),
        **claims,
    }
    signing = f"{_b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{_b64(json.dumps(body).encode())}"
    signature = hmac.new(secrets.token_bytes(32), signing.encode(), hashlib.sha256).digest()
    return f"{signing}.{_b64(signature)}"


class EntraTokenEndpoint:
    """``POST /<tenant>/oauth2/v2.0/token`` over TLS: the client-credentials grant with a federated client assertion,
    checked as Entra ID would (tenant, client id, assertion type and value, scope); answers an access token.
    ``refuse`` answers Entra ID's error for an assertion no federated credential matches; ``claims`` go into the
    tokens it issues."""

    def __init__(self, tls: tuple[Path, Path, Path], assertion: str) -> None:
        self.assertion = assertion
        self.grants: list[dict[str, str]] = []
        self.hosts: list[str] = []
        self.issued: list[str] = []
        self.refuse = False
        self.claims: dict[str, Any] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                outer.hosts.append(self.headers.get("Host") or "")
                status, answer = outer.answer(self.path, dict(urllib.parse.parse_qsl(body)))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(tls[1]), str(tls[2]))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def authority(self) -> str:
        return f"https://{LOGIN_HOST}:{self.port}"

    def answer(self, path: str, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if path != f"/{TENANT}/oauth2/v2.0/token":
            return 404, {"error": "invalid_request", "error_description": f"AADSTS90002: Tenant not found ({path})"}
        self.grants.append(form)
        expected = {
            "grant_type": "client_credentials",
            "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "client_assertion": self.assertion,
            "client_id": CLIENT_ID,
            "scope": STORAGE_SCOPE,
        }
        if self.refuse or any(form.get(k) != v for k, v in expected.items()):
            return 400, {
                "error": "invalid_client",
                "error_description": "AADSTS700213: No matching federated identity record found for presented "
                "assertion subject 'system:serviceaccount:kubeinfer:kubeinfer-operator'.\r\nTrace ID: 0000\r\n"
                "Correlation ID: 1111\r\nTimestamp: 2026-12-01 00:00:00Z",
                "error_codes": [700213],
            }
        token = access_token(**self.claims)
        self.issued.append(token)
        return 200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    # one certificate for the two public names the test serves, and 127.0.0.1 (its own uploads to Azurite)
    return make_ca_and_cert(tmp_path_factory.mktemp("tls"), (BLOB_HOST, LOGIN_HOST))


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory, tls: tuple[Path, Path, Path]) -> Iterator[OAuthAzurite]:
    with OAuthAzurite(tmp_path_factory.mktemp("azurite-oauth"), tls) as store:
        store.service().create_container("models")
        yield store


@pytest.fixture
def federated(tmp_path: Path) -> tuple[Path, str]:
    """The projected service-account token (a JWT of the cluster's issuer; only its value matters here)."""
    assertion = access_token(aud="api://AzureADTokenExchange", iss="https://oidc.example/", sub="system:sa")
    path = tmp_path / "azure-identity-token"
    path.write_text(assertion)
    return path, assertion


@pytest.fixture
def entra(tls: tuple[Path, Path, Path], federated: tuple[Path, str]) -> Iterator[EntraTokenEndpoint]:
    endpoint = EntraTokenEndpoint(tls, federated[1])
    yield endpoint
    endpoint.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    return relu_onnx(tmp_path / "relu.onnx").read_bytes()


class Recording(StoreClient):
    """The StoreClient, noting the Authorization header of each request it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.authorizations: list[str | None] = []

    def request(self, method: str, url: Any, headers: Any, **kwargs: Any) -> Any:
        self.authorizations.append(headers.get("Authorization"))
        return super().request(method, url, headers, **kwargs)


def _clients(tls: tuple[Path, Path, Path]) -> tuple[Recording, Recording]:
    """(the blob requests' client, the token requests' client: the operator's ambient one), both guarded."""
    return (
        Recording(LOOPBACK, timeout=10.0, ca_file=str(tls[0]), resolve=to_loopback),
        Recording(LOOPBACK, timeout=10.0, ca_file=str(tls[0]), resolve=to_loopback),
    )


def _identity(token_client: StoreClient, federated: tuple[Path, str], entra: EntraTokenEndpoint) -> StorageToken:
    environ = {
        "AZURE_CLIENT_ID": CLIENT_ID,
        "AZURE_TENANT_ID": TENANT,
        "AZURE_FEDERATED_TOKEN_FILE": str(federated[0]),
        "AZURE_AUTHORITY_HOST": entra.authority,
    }
    identity = workload_identity(token_client, environ, retries=0)
    assert identity is not None
    return identity


def _writer(root: Path, client: StoreClient, identity: StorageToken, azurite: OAuthAzurite) -> Any:
    return make_writer(
        root,
        client=client,
        ambient_azure_namespaces=(NS,),
        azure_identity=lambda: identity,
        azure_public=f"https://{{account}}.blob.core.windows.net:{azurite.port}",
    )


def _upload(azurite: OAuthAzurite, name: str, data: bytes) -> str:
    azurite.service().get_blob_client("models", name).upload_blob(data, overwrite=True)
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------- tests


def test_the_workload_identitys_token_reads_a_private_blob_through_the_guard(
    root: Path,
    azurite: OAuthAzurite,
    tls: tuple[Path, Path, Path],
    federated: tuple[Path, str],
    entra: EntraTokenEndpoint,
    model_bytes: bytes,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sha = _upload(azurite, "wi/model.onnx", model_bytes)
    client, token_client = _clients(tls)
    identity = _identity(token_client, federated, entra)
    writer = _writer(root, client, identity, azurite)
    server_dir = writer.server_dir(NS, "ns/pool")
    # the az:// form and KServe's https form of the same blob, both to the account's public endpoint
    for name, uri in (
        ("a", f"az://{ACCOUNT}/models/wi/model.onnx"),
        ("b", f"https://{BLOB_HOST}/models/wi/model.onnx"),
    ):
        fetch = Fetch(_anonymous)
        writer.sync_model(server_dir, render_model(name, model_spec({"uri": uri, "sha256": sha})), fetch=fetch)
        assert (server_dir / name / "1/model.onnx").read_bytes() == model_bytes
        assert fetch.served == {1: f"sha256 sha256:{sha}"}
    # azure-identity posted one grant (the token is cached across the two models): the federated assertion from the
    # file, for Azure Storage's scope, to login.microsoftonline.com (the name the guard resolved), through the token
    # client's guarded pool; the blob requests went to the account's public name through the other
    assert len(entra.grants) == 1 and entra.hosts == [f"{LOGIN_HOST}:{entra.port}"]
    assert token_client.backend.connected == [(LOGIN_HOST, "127.0.0.1")]
    assert {host for host, _ in client.backend.connected} == {BLOB_HOST}
    # the token Azurite accepted is the one issued, on every blob request (HEAD, ranged GETs)
    [token] = entra.issued
    assert len(client.authorizations) >= 4 and set(client.authorizations) == {f"Bearer {token}"}
    assert token_client.authorizations == [None]  # the grant carries its assertion in its body
    # neither the access token nor the federated assertion is logged (azure-core's and azure-identity's loggers too)
    assert caplog.records and not any(token in r.getMessage() or federated[1] in r.getMessage() for r in caplog.records)


def test_without_the_token_or_with_a_bad_one_azurite_refuses(
    root: Path,
    azurite: OAuthAzurite,
    tls: tuple[Path, Path, Path],
    federated: tuple[Path, str],
    entra: EntraTokenEndpoint,
    model_bytes: bytes,
) -> None:
    sha = _upload(azurite, "refused/model.onnx", model_bytes)
    source = {"uri": f"az://{ACCOUNT}/models/refused/model.onnx", "sha256": sha}
    client, token_client = _clients(tls)
    writer = _writer(root, client, _identity(token_client, federated, entra), azurite)
    # a namespace the admin did not list: anonymous, and the container is private
    (root / "other").mkdir()
    other = writer.server_dir("other", "other/pool")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(other, render_model("n", model_spec(source)), fetch=Fetch(_anonymous))
    assert info.value.reason == "SourceUnauthorized" and "AuthorizationFailure" in info.value.message
    assert entra.grants == [] and set(client.authorizations) == {None}
    # a token for another audience, or one past its lifetime: Azurite checks the claims and refuses it (a HEAD's
    # answer has no body, so only its code), in words that name the role the identity needs
    server_dir = writer.server_dir(NS, "ns/pool")
    for name, claims in (("w", {"aud": "https://vault.azure.net"}), ("x", {"exp": int(time.time()) - 120})):
        entra.claims = claims
        writer = _writer(root, client, _identity(token_client, federated, entra), azurite)  # a fresh token cache
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model(name, model_spec(source)), fetch=Fetch(_anonymous))
        assert info.value.reason == "SourceUnauthorized" and "AuthenticationFailed" in info.value.message
        assert "Storage Blob Data Reader" in info.value.message
        assert client.authorizations[-1] == f"Bearer {entra.issued[-1]}"
        assert entra.issued[-1] not in info.value.message
        assert not (server_dir / name).exists()
    assert len(entra.grants) == 2


def test_entra_ids_refusal_is_a_condition_that_names_no_secret(
    root: Path,
    azurite: OAuthAzurite,
    tls: tuple[Path, Path, Path],
    federated: tuple[Path, str],
    entra: EntraTokenEndpoint,
    model_bytes: bytes,
) -> None:
    sha = _upload(azurite, "denied/model.onnx", model_bytes)
    entra.refuse = True
    client, token_client = _clients(tls)
    writer = _writer(root, client, _identity(token_client, federated, entra), azurite)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": f"az://{ACCOUNT}/models/denied/model.onnx", "sha256": sha}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("d", model_spec(source)), fetch=Fetch(_anonymous))
    assert info.value.reason == "SourceUnauthorized"
    assert "AADSTS700213" in info.value.message and "Trace ID" not in info.value.message
    assert federated[1] not in info.value.message
    # nothing was asked of the store without a token
    assert client.authorizations == [] and client.backend.connected == []


def test_a_tenants_endpoint_never_gets_the_token(
    root: Path,
    azurite: OAuthAzurite,
    tls: tuple[Path, Path, Path],
    federated: tuple[Path, str],
    entra: EntraTokenEndpoint,
    model_bytes: bytes,
) -> None:
    """Azurite's own path-style endpoint is a tenant's choice of server: refused before any token or connection."""
    sha = _upload(azurite, "tenant/model.onnx", model_bytes)
    client, token_client = _clients(tls)
    writer = _writer(root, client, _identity(token_client, federated, entra), azurite)
    server_dir = writer.server_dir(NS, "ns/pool")
    source = {"uri": f"az://{ACCOUNT}/models/tenant/model.onnx", "sha256": sha, "endpoint": azurite.endpoint}
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("t", model_spec(source)), fetch=Fetch(_anonymous))
    assert info.value.reason == "SourceRefused" and f"https://{BLOB_HOST}:{azurite.port} only" in info.value.message
    assert entra.grants == [] and client.backend.connected == [] and token_client.backend.connected == []
