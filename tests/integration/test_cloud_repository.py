"""``--model-repository`` on a cloud store as Triton reads one, against real stores: ``s3://`` on SeaweedFS,
``gs://`` on Google's emulator fake-gcs-server, ``as://`` on Microsoft's emulator Azurite. For each, the server
copies each model locally, serves it to tritonclient, notices a model changed or deleted in the store at its next
poll, and stops with Triton's error for a missing bucket or container instead of starting on an empty repository.
Credentials come from Triton's variables and from TRITON_CLOUD_CREDENTIAL_PATH (the longest prefix wins).
"""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import jwt

from tests.integration.test_reload import CONFIG, add_sub_plus
from tests.support.azurite import Azurite
from tests.support.gcs_store import GcsStore
from tests.support.s3_store import S3Store
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG_TEXT = CONFIG.format(max_batch_size=8, extra="").replace('name: "drill"', 'name: "adder"')
BUCKET = "repository"
#: what the tests' environment must not lend the server (the developer's own credentials)
CLEAN_ENV = dict.fromkeys(
    (
        "TRITON_CLOUD_CREDENTIAL_PATH",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUD_STORAGE_EMULATOR_ENDPOINT",
        "STORAGE_EMULATOR_HOST",
        "AZURE_STORAGE_ACCOUNT",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_AUTH_TYPE",
        "AZURE_STORAGE_CONNECTION_STRING",
    ),
    "",
)
WRONG_AZURE_KEY = "AAAA" + Azurite.key[4:]


# ----------------------------------------------------------------------------------------------- the stores


class Repository:
    """One store holding the test's repositories under a bucket (or container) named BUCKET."""

    scheme = ""

    def uri(self, prefix: str) -> str:
        raise NotImplementedError

    def missing_uri(self) -> str:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, key: str) -> None:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        """Variables through which the server finds the store and is let in."""
        raise NotImplementedError

    def upload_model(self, prefix: str, offset: float) -> None:
        self.put(f"{prefix}/adder/config.pbtxt", CONFIG_TEXT.encode())
        self.put(f"{prefix}/adder/1/model.onnx", add_sub_plus(offset).SerializeToString())
        self.put(f"{prefix}/README.md", b"a file beside the model folders: ignored, as Triton does")


class S3Repository(Repository):
    scheme = "s3"

    def __init__(self, store: S3Store) -> None:
        self.store = store
        store.client().create_bucket(Bucket=BUCKET)

    def uri(self, prefix: str) -> str:
        return f"s3://{self.store.host}:{self.store.port}/{BUCKET}/{prefix}"

    def missing_uri(self) -> str:
        return f"s3://{self.store.host}:{self.store.port}/nosuchbucket/x"

    def put(self, key: str, data: bytes) -> None:
        self.store.client().put_object(Bucket=BUCKET, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.store.client().delete_object(Bucket=BUCKET, Key=key)

    def env(self, identity: str = "reader") -> dict[str, str]:
        access, secret = self.store.credentials(identity)
        return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1"}


class GcsRepository(Repository):
    """fake-gcs-server checks no credentials: the server reaches it anonymously, through the emulator variable
    google-cloud-cpp (Triton's client) reads."""

    scheme = "gs"

    def __init__(self, store: GcsStore) -> None:
        self.store = store
        store.create_bucket(BUCKET)

    def uri(self, prefix: str) -> str:
        return f"gs://{BUCKET}/{prefix}"

    def missing_uri(self) -> str:
        return "gs://nosuchbucket/x"

    def put(self, key: str, data: bytes) -> None:
        self.store.upload(BUCKET, key, data)

    def delete(self, key: str) -> None:
        with self.store.http() as http:
            answer = http.delete(f"/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(key, safe='')}")
        assert answer.status_code in (200, 204), answer.text

    def env(self) -> dict[str, str]:
        return {"CLOUD_STORAGE_EMULATOR_ENDPOINT": self.store.endpoint}


class AzureRepository(Repository):
    """Azurite's account through Triton's AZURE_STORAGE_ACCOUNT/AZURE_STORAGE_KEY; its endpoint (path style) from a
    connection string that names no key."""

    scheme = "as"

    def __init__(self, azurite: Azurite) -> None:
        self.azurite = azurite
        self.container = azurite.service().get_container_client(BUCKET)
        self.container.create_container()

    def uri(self, prefix: str) -> str:
        return f"as://{self.azurite.account}/{BUCKET}/{prefix}"

    def missing_uri(self) -> str:
        return f"as://{self.azurite.account}/nosuchcontainer/x"

    def put(self, key: str, data: bytes) -> None:
        self.container.upload_blob(key, data, overwrite=True)

    def delete(self, key: str) -> None:
        self.container.delete_blob(key)

    def endpoint_only(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": f"BlobEndpoint={self.azurite.endpoint};"}

    def env(self) -> dict[str, str]:
        return {
            **self.endpoint_only(),
            "AZURE_STORAGE_ACCOUNT": self.azurite.account,
            "AZURE_STORAGE_KEY": self.azurite.key,
        }


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Repository]:
    with S3Store(tmp_path_factory.mktemp("s3-repository")) as store:
        yield S3Repository(store)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsRepository]:
    with GcsStore(tmp_path_factory.mktemp("gcs-repository")) as store:
        yield GcsRepository(store)


@pytest.fixture(scope="module")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureRepository]:
    with Azurite(tmp_path_factory.mktemp("azurite-repository")) as store:
        yield AzureRepository(store)


@pytest.fixture(params=["s3", "gs", "as"])
def repository(request: pytest.FixtureRequest) -> Repository:
    fixture = {"s3": "s3", "gs": "gcs", "as": "azure"}[request.param]
    found: Repository = request.getfixturevalue(fixture)
    return found


# ------------------------------------------------------------------------------------------------ helpers


def _start(uri: str, tmp_path: Path, env: dict[str, str], *extra: str, wait: bool = True) -> ServerProcess:
    return start_server(uri, *extra, log_dir=tmp_path, env={**CLEAN_ENV, **env}, wait=wait)  # type: ignore[arg-type]


def _infer(url: str) -> float:
    client = httpclient.InferenceServerClient(url)
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return float(client.infer("adder", inputs).as_numpy("OUTPUT0")[0, 0])


def _stops(server: ServerProcess) -> str:
    """The log of a server that must stop at start (exit status 1)."""
    try:
        assert server.proc.wait(timeout=60) == 1, server.log()
    finally:
        server.terminate()
    return server.log()


def _credential_file(tmp_path: Path, sections: dict[str, Any]) -> dict[str, str]:
    path = tmp_path / "cloud-credentials.json"
    path.write_text(json.dumps(sections))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}


# ------------------------------------------------------------------------------------------- every scheme


def test_a_cloud_repository_is_served_and_polled(repository: Repository, tmp_path: Path) -> None:
    repository.upload_model("polled", 0.0)
    server = _start(
        repository.uri("polled"), tmp_path, repository.env(), "--model-control-mode=poll", "--repository-poll-secs=1"
    )
    try:
        assert _infer(server.http_url) == 2.0
        repository.upload_model("polled", 100.0)  # the model changed in the store: the next poll reloads it
        wait_for("the changed model served", lambda: _infer(server.http_url) == 102.0, 60, describe=server.log)
        repository.delete("polled/adder/1/model.onnx")
        repository.delete("polled/adder/config.pbtxt")
        client = httpclient.InferenceServerClient(server.http_url)
        wait_for("the deleted model unloaded", lambda: not client.is_model_ready("adder"), 60, describe=server.log)
    finally:
        server.terminate()


def test_a_missing_bucket_stops_the_server_with_tritons_words(repository: Repository, tmp_path: Path) -> None:
    log = _stops(_start(repository.missing_uri(), tmp_path, repository.env(), wait=False))
    assert f"failed to poll model repository '{repository.missing_uri()}'" in log
    assert "error: creating server: Internal - failed to load all models" in log
    expected = {
        # Triton's HeadBucket check (CheckClient of s3.h)
        "s3": "Unable to create S3 filesystem client. Check account credentials. Exception: 'SourceNotFound'",
        # Triton's listing of the repository's folders (GetDirectoryContents of gcs.h)
        "gs": f"Could not list contents of directory at {repository.missing_uri()} : ",
        # Triton's ListDirectory of as.h: the folder is the path inside the container
        "as": "Failed to get contents of directory x:",
    }[repository.scheme]
    assert expected in log
    assert {"s3": "NoSuchBucket", "gs": "404", "as": "ContainerNotFound"}[repository.scheme] in log


# ---------------------------------------------------------------------------------------------------- s3


def test_s3_credentials_from_triton_cloud_credential_path(s3: S3Repository, tmp_path: Path) -> None:
    s3.upload_model("byfile", 0.0)
    uri = s3.uri("byfile")
    access, secret = s3.store.credentials("reader")
    env = _credential_file(
        tmp_path,
        {
            "s3": {
                uri.rsplit("/", 1)[0]: {"key_id": access, "secret_key": "wrong-secret", "region": "us-east-1"},
                uri: {"key_id": access, "secret_key": secret, "region": "us-east-1"},  # the longest prefix wins
            }
        },
    )
    server = _start(uri, tmp_path, env)
    try:
        assert _infer(server.http_url) == 2.0
    finally:
        server.terminate()
    # the file is the only place credentials come from: no prefix matching is Triton's error
    env = {**s3.env(), **_credential_file(tmp_path, {"s3": {"s3://elsewhere": {}}})}
    log = _stops(_start(uri, tmp_path, env, wait=False))
    assert f"Cannot match credential for path  {uri}" in log


def test_s3_bad_credentials_stop_the_server_with_tritons_words(s3: S3Repository, tmp_path: Path) -> None:
    s3.upload_model("refused", 0.0)
    env = {**s3.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-abcdef"}
    log = _stops(_start(s3.uri("refused"), tmp_path, env, wait=False))
    assert "Unable to create S3 filesystem client. Check account credentials." in log
    assert "wrong-secret-abcdef" not in log


# ---------------------------------------------------------------------------------------------------- gs


class TokenEndpoint:
    """An OAuth 2.0 token endpoint (plain http, on loopback) answering service-account keys' JWT-bearer grants: it
    checks each assertion's signature against the key's public half and notes its claims."""

    def __init__(self, public_pem: bytes) -> None:
        self.public_pem = public_pem
        self.access_token = "ya29.test-" + secrets.token_urlsafe(24)
        self.grants: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers["Content-Length"])).decode()))
                assert form.get("grant_type") == "urn:ietf:params:oauth:grant-type:jwt-bearer"
                # google-auth's assertions name Google's token endpoint as their audience, wherever token_uri is
                audience = "https://oauth2.googleapis.com/token"
                outer.grants.append(jwt.decode(form["assertion"], certs=outer.public_pem, audience=audience))
                data = json.dumps({"access_token": outer.access_token, "expires_in": 3600, "token_type": "Bearer"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def token_uri(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/token"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _service_account_key(path: Path, token_uri: str) -> tuple[dict[str, str], bytes]:
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
    path.write_text(json.dumps(key))
    return key, public


def test_gs_credentials_from_triton_cloud_credential_path(gcs: GcsRepository, tmp_path: Path) -> None:
    """The ``gs`` section names the service-account key of the longest prefix; google-auth's token flow for it
    reaches the key's token_uri (checked here: a grant signed by that key) and the store gets its Bearer token.
    Not exercised: fake-gcs-server accepts any token (or none), so a refused token is not."""
    gcs.upload_model("bykey", 0.0)
    uri = gcs.uri("bykey")
    key_path = tmp_path / "reader.json"
    endpoint = TokenEndpoint(b"")
    try:
        key, public = _service_account_key(key_path, endpoint.token_uri)
        endpoint.public_pem = public
        sections = {"gs": {f"gs://{BUCKET}": str(tmp_path / "no-such-key.json"), uri: str(key_path)}}
        # STORAGE_EMULATOR_HOST (google-cloud-storage's variable) as host:port
        env = {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{gcs.store.port}", **_credential_file(tmp_path, sections)}
        server = _start(uri, tmp_path, env)
        try:
            assert _infer(server.http_url) == 2.0
        finally:
            server.terminate()
        assert endpoint.grants and endpoint.grants[0]["iss"] == key["client_email"]
        assert endpoint.grants[0]["scope"] == "https://www.googleapis.com/auth/devstorage.read_only"
    finally:
        endpoint.close()
    # the shorter prefix's file does not exist: Triton's words for a client it cannot make
    log = _stops(_start(gcs.uri("other"), tmp_path, env, wait=False))
    assert "Unable to create GCS client. Check account credentials." in log and "no-such-key.json" in log
    assert key["private_key_id"] not in server.log()


# ---------------------------------------------------------------------------------------------------- as


def test_as_credentials_from_triton_cloud_credential_path(azure: AzureRepository, tmp_path: Path) -> None:
    """The ``as`` section's account key of the longest prefix signs the requests (Azurite checks it); the connection
    string gives only the endpoint."""
    azure.upload_model("byfile", 0.0)
    uri = azure.uri("byfile")
    account = azure.azurite.account
    sections = {
        "as": {
            f"as://{account}": {"account_str": account, "account_key": WRONG_AZURE_KEY},
            uri: {"account_str": account, "account_key": azure.azurite.key},
        }
    }
    env = {**azure.endpoint_only(), **_credential_file(tmp_path, sections)}
    server = _start(uri, tmp_path, env)
    try:
        assert _infer(server.http_url) == 2.0
    finally:
        server.terminate()
    # the shorter prefix's key is wrong: the store refuses it, in Triton's words for a failed listing
    log = _stops(_start(azure.uri("other"), tmp_path, env, wait=False))
    assert "Failed to get contents of directory other:" in log and "AuthorizationFailure" in log
    assert WRONG_AZURE_KEY not in log and azure.azurite.key not in log
    # what to check is the server's settings (Triton's variables), not an operator's Secret
    assert "'as' section of TRITON_CLOUD_CREDENTIAL_PATH" in log and "credentials Secret" not in log


def test_as_with_a_connection_string_alone(azure: AzureRepository, tmp_path: Path) -> None:
    """AZURE_STORAGE_CONNECTION_STRING (Azurite's, with its key) is enough: endpoint, account and key."""
    azure.upload_model("byconnection", 0.0)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azure.azurite.connection_string()}
    server = _start(azure.uri("byconnection"), tmp_path, env)
    try:
        assert _infer(server.http_url) == 2.0
    finally:
        server.terminate()
    assert azure.azurite.key not in server.log()
