"""Download hardening against real HTTP and HTTPS servers on 127.0.0.1 (a throwaway CA)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubeinfer.operator.artifacts import (
    CREDENTIALS_LABEL,
    ArtifactError,
    credential_headers,
    download,
    fetch_client,
)

from tests.support.https import ScriptedServer, make_ca_and_cert

DATA = b"model bytes " * 1000
SHA = hashlib.sha256(DATA).hexdigest()


def ok(_: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, DATA


def redirect(location: str):
    return lambda _: (302, {"Location": location}, b"")


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_ca_and_cert(tmp_path)


@pytest.fixture
def client(tls) -> Iterator[httpx.Client]:
    """The operator's download client, trusting the test CA instead of the system store."""
    c = fetch_client(10, ca_file=str(tls[0]))
    yield c
    c.close()


@pytest.fixture
def servers(tls) -> Iterator[dict[str, ScriptedServer]]:
    made = {
        "http": ScriptedServer({}),
        "https": ScriptedServer({}, tls=(tls[1], tls[2])),
        "other": ScriptedServer({}, tls=(tls[1], tls[2])),
    }
    yield made
    for s in made.values():
        s.close()


def fetch(uri: str, client: httpx.Client, dest: Path, **kw) -> int:
    return download(uri, kw.pop("sha", SHA), dest / "out", client=client, **kw)


def test_plain_and_upgraded_downloads(servers, client, tmp_path):
    http, https = servers["http"], servers["https"]
    http.routes["/m.onnx"] = ok
    assert fetch(f"{http.url}/m.onnx", client, tmp_path) == len(DATA)
    https.routes["/m.onnx"] = ok
    http.routes["/up"] = redirect(f"{https.url}/m.onnx")  # http -> https is an upgrade: followed
    assert fetch(f"{http.url}/up", client, tmp_path) == len(DATA)


@pytest.mark.parametrize("target", ["ftp://127.0.0.1/m.onnx", "file:///etc/passwd", "{http}/m.onnx"])
def test_redirects_to_other_schemes_or_down_to_http_are_refused(servers, client, tmp_path, target):
    servers["http"].routes["/m.onnx"] = ok
    servers["https"].routes["/r"] = redirect(target.format(http=servers["http"].url))
    with pytest.raises(ArtifactError) as err:
        fetch(f"{servers['https'].url}/r", client, tmp_path)
    assert err.value.reason == "RedirectRejected", err.value.message
    assert not any(p == "/m.onnx" for p, _ in servers["http"].seen.requests)


def test_redirect_loops_stop(servers, client, tmp_path):
    servers["http"].routes["/loop"] = redirect("/loop")
    with pytest.raises(ArtifactError, match="redirects more than 5 times"):
        fetch(f"{servers['http'].url}/loop", client, tmp_path)


def test_credentials_go_only_to_the_uri_origin(servers, client, tmp_path):
    https, other = servers["https"], servers["other"]
    https.routes["/private"] = lambda auth: (200, {}, DATA) if auth == "Bearer s3cret" else (401, {}, b"")
    assert fetch(f"{https.url}/private", client, tmp_path, headers={"Authorization": "Bearer s3cret"}) == len(DATA)
    with pytest.raises(ArtifactError, match="HTTP 401"):
        fetch(f"{https.url}/private", client, tmp_path)
    # a redirect to another origin (e.g. a pre-signed object store URL) gets no credentials
    https.routes["/signed"] = redirect(f"{other.url}/blob")
    other.routes["/blob"] = ok
    assert fetch(f"{https.url}/signed", client, tmp_path, headers={"Authorization": "Bearer s3cret"}) == len(DATA)
    assert other.seen.requests == [("/blob", None)]
    assert ("/signed", "Bearer s3cret") in https.seen.requests


def test_credentials_never_over_plain_http(servers, client, tmp_path):
    servers["http"].routes["/m.onnx"] = ok
    with pytest.raises(ArtifactError) as err:
        fetch(f"{servers['http'].url}/m.onnx", client, tmp_path, headers={"Authorization": "Bearer x"})
    assert err.value.reason == "CredentialsRejected"
    assert servers["http"].seen.requests == []


def test_sha256_required_size_limited_and_checked(servers, client, tmp_path):
    servers["http"].routes["/m.onnx"] = ok
    url = f"{servers['http'].url}/m.onnx"
    with pytest.raises(ArtifactError) as err:
        fetch(url, client, tmp_path, sha="")
    assert err.value.reason == "ChecksumRequired"
    with pytest.raises(ArtifactError) as err:
        fetch(url, client, tmp_path, max_bytes=len(DATA) - 1)
    assert err.value.reason == "TooLarge"
    with pytest.raises(ArtifactError) as err:
        fetch(url, client, tmp_path, sha="0" * 64)
    assert err.value.reason == "ChecksumMismatch"
    with pytest.raises(ArtifactError) as err:
        fetch("ftp://127.0.0.1/m.onnx", client, tmp_path)
    assert err.value.reason == "SchemeRejected"


def test_cancelled_between_chunks(servers, client, tmp_path):
    servers["http"].routes["/m.onnx"] = ok
    with pytest.raises(ArtifactError) as err:
        fetch(f"{servers['http'].url}/m.onnx", client, tmp_path, cancelled=lambda: True)
    assert err.value.reason == "Cancelled"


def test_proxy_variables_are_not_used(servers, tmp_path, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    servers["http"].routes["/m.onnx"] = ok
    with fetch_client(10) as c:
        assert fetch(f"{servers['http'].url}/m.onnx", c, tmp_path) == len(DATA)


def _secret(data: dict[str, str], labelled: bool = True) -> dict:
    labels = {CREDENTIALS_LABEL: "true"} if labelled else {}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"metadata": {"name": "creds", "labels": labels}, "data": encoded}


def test_credential_secrets():
    assert credential_headers(_secret({"token": "abc\n"}), "creds") == {"Authorization": "Bearer abc"}
    basic = base64.b64encode(b"u:p").decode()
    assert credential_headers(_secret({"username": "u", "password": "p"}), "creds") == {
        "Authorization": f"Basic {basic}"
    }
    assert credential_headers(_secret({"authorization": "Token t"}), "creds") == {"Authorization": "Token t"}
    with pytest.raises(ArtifactError, match="not labelled serving.kubeinfer.io/artifact-credentials=true"):
        credential_headers(_secret({"token": "abc"}, labelled=False), "creds")
    with pytest.raises(ArtifactError, match="none of the keys"):
        credential_headers(_secret({"other": "x"}), "creds")
