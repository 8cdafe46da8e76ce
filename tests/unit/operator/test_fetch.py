"""Downloads against real HTTP(S) servers on 127.0.0.1: redirects, credentials, limits, and the egress rules.

The SSRF cases run with nothing allowed but what each test names: a server on a refused address must
see no request at all. A "public-looking name resolving to a private address" uses the operator's
resolver hook (this machine's DNS cannot be pointed at a test name), plus ``localhost`` through the
real system resolver.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.credentials import CREDENTIALS_LABEL, HOSTS_ANNOTATION, credential_headers
from kubeinfer.operator.sources.fetch import Fetcher
from kubeinfer.operator.sources.fetch import system_resolve as real_resolve
from kubeinfer.server.sources.egress import AddressPolicy, HostRules, IPAddress, parse_networks

from tests.support import hostile
from tests.support.https import ScriptedServer, make_ca_and_cert

DATA = b"model bytes " * 1000
SHA = hashlib.sha256(DATA).hexdigest()
LOOPBACK_1 = parse_networks(["127.0.0.1/32"])
MAX = 1 << 30


def ok(_: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {}, DATA


def redirect(location: str):
    return lambda _: (302, {"Location": location}, b"")


@pytest.fixture
def tls(tmp_path: Path) -> tuple[Path, Path, Path]:
    return make_ca_and_cert(tmp_path)


@pytest.fixture
def client(tls) -> Iterator[Fetcher]:
    """The operator's fetcher, trusting the test CA instead of the system store, allowed to reach 127.0.0.1."""
    f = Fetcher(AddressPolicy(allowed=LOCAL_ALL), timeout=10, ca_file=str(tls[0]))
    yield f
    f.close()


LOCAL_ALL = parse_networks(["127.0.0.0/8"])


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


@pytest.fixture
def bad() -> Iterator[hostile.HostileServer]:
    s = hostile.HostileServer()
    yield s
    s.close()


@pytest.fixture
def elsewhere() -> Iterator[hostile.HostileServer]:
    """A server on 127.0.0.2: loopback, but outside the 127.0.0.1/32 the SSRF tests allow."""
    s = hostile.HostileServer(host="127.0.0.2")
    yield s
    s.close()


def fetch(uri: str, client: Fetcher, **kw) -> int:
    kw.setdefault("max_bytes", MAX)
    return client.download(uri, kw.pop("sha", SHA), io.BytesIO(), **kw)


def refused(uri: str, client: Fetcher, reason: str, **kw) -> ArtifactError:
    with pytest.raises(ArtifactError) as err:
        fetch(uri, client, **kw)
    assert err.value.reason == reason, err.value.message
    return err.value


# ------------------------------------------------------------------------------ redirects and TLS


def test_plain_and_upgraded_downloads(servers, client):
    http, https = servers["http"], servers["https"]
    http.routes["/m.onnx"] = ok
    assert fetch(f"{http.url}/m.onnx", client) == len(DATA)
    https.routes["/m.onnx"] = ok
    http.routes["/up"] = redirect(f"{https.url}/m.onnx")  # http -> https is an upgrade: followed
    assert fetch(f"{http.url}/up", client) == len(DATA)


@pytest.mark.parametrize("target", ["ftp://127.0.0.1/m.onnx", "file:///etc/passwd", "{http}/m.onnx"])
def test_redirects_to_other_schemes_or_down_to_http_are_refused(servers, client, target):
    servers["http"].routes["/m.onnx"] = ok
    servers["https"].routes["/r"] = redirect(target.format(http=servers["http"].url))
    refused(f"{servers['https'].url}/r", client, "RedirectRejected")
    assert not any(p == "/m.onnx" for p, _ in servers["http"].seen.requests)


def test_redirect_loops_stop(servers, client):
    servers["http"].routes["/loop"] = redirect("/loop")
    with pytest.raises(ArtifactError, match="redirects more than 5 times"):
        fetch(f"{servers['http'].url}/loop", client)


def test_credentials_go_only_to_the_uri_origin(servers, client):
    https, other = servers["https"], servers["other"]
    https.routes["/private"] = lambda auth: (200, {}, DATA) if auth == "Bearer s3cret" else (401, {}, b"")
    assert fetch(f"{https.url}/private", client, headers={"Authorization": "Bearer s3cret"}) == len(DATA)
    with pytest.raises(ArtifactError, match="HTTP 401"):
        fetch(f"{https.url}/private", client)
    # a redirect to another origin (e.g. a pre-signed object store URL) gets no credentials
    https.routes["/signed"] = redirect(f"{other.url}/blob")
    other.routes["/blob"] = ok
    assert fetch(f"{https.url}/signed", client, headers={"Authorization": "Bearer s3cret"}) == len(DATA)
    assert other.seen.requests == [("/blob", None)]
    assert ("/signed", "Bearer s3cret") in https.seen.requests


def test_credentials_never_over_plain_http(servers, client):
    servers["http"].routes["/m.onnx"] = ok
    refused(f"{servers['http'].url}/m.onnx", client, "CredentialsRejected", headers={"Authorization": "Bearer x"})
    assert servers["http"].seen.requests == []


def test_sha256_required_size_limited_and_checked(servers, client):
    servers["http"].routes["/m.onnx"] = ok
    url = f"{servers['http'].url}/m.onnx"
    refused(url, client, "ChecksumRequired", sha="")
    refused(url, client, "TooLarge", max_bytes=len(DATA) - 1)
    err = refused(url, client, "ChecksumMismatch", sha="0" * 64)
    assert SHA not in err.message and "does not have the sha256 in source.sha256" in err.message
    refused("ftp://127.0.0.1/m.onnx", client, "SchemeRejected")


def test_cancelled_between_chunks(servers, client):
    servers["http"].routes["/m.onnx"] = ok
    refused(f"{servers['http'].url}/m.onnx", client, "Cancelled", cancelled=lambda: True)


def test_proxy_variables_are_not_used(servers, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:9")
    servers["http"].routes["/m.onnx"] = ok
    f = Fetcher(AddressPolicy(allowed=LOCAL_ALL), timeout=10)
    try:
        assert fetch(f"{servers['http'].url}/m.onnx", f) == len(DATA)
    finally:
        f.close()


def test_an_untrusted_certificate_is_named_without_the_remote_text(tls, servers):
    servers["https"].routes["/m.onnx"] = ok
    f = Fetcher(AddressPolicy(allowed=LOCAL_ALL), timeout=10)  # the system store: the test CA is unknown
    try:
        err = refused(f"{servers['https'].url}/m.onnx", f, "FetchFailed")
    finally:
        f.close()
    assert "TLS certificate is not trusted" in err.message, err.message
    assert "kubeinfer test CA" not in err.message and "CERTIFICATE_VERIFY_FAILED" not in err.message


def test_tls_verifies_the_host_name_not_the_address_connected(tls, servers):
    """The socket goes to the checked address, but the certificate must still be the host's: a server whose
    certificate names only 127.0.0.1 is not accepted as models.example.com."""
    servers["https"].routes["/m.onnx"] = ok
    port = servers["https"].url.rsplit(":", 1)[1]
    f = Fetcher(
        AddressPolicy(allowed=LOCAL_ALL), timeout=10, ca_file=str(tls[0]), resolve=lambda h, p: [ip("127.0.0.1")]
    )
    try:
        err = refused(f"https://models.example.com:{port}/m.onnx", f, "FetchFailed")
        assert fetch(f"https://127.0.0.1:{port}/m.onnx", f) == len(DATA)
    finally:
        f.close()
    assert "TLS certificate is not trusted" in err.message


# ------------------------------------------------------------------------------------- the SSRF rules


def strict(**kw) -> Fetcher:
    """Nothing but public addresses, plus what a test allows."""
    return Fetcher(AddressPolicy(allowed=kw.pop("allowed", ())), timeout=kw.pop("timeout", 10), **kw)


@pytest.mark.parametrize(
    ("host", "cls"),
    [
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.1", "private"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("[::ffff:127.0.0.1]", "loopback"),
    ],
)
def test_non_public_address_literals_are_refused_before_any_connection(bad, host, cls):
    bad.routes["/m.onnx"] = hostile.file(DATA)
    f = strict()
    try:
        err = refused(f"http://{host}:{bad.port}/m.onnx", f, "AddressRefused")
    finally:
        f.close()
    assert f"a {cls} address" in err.message and "artifacts.allowedNetworks" in err.message, err.message
    assert bad.seen.requests == [] and f.backend.connected == []


def test_a_public_looking_name_that_resolves_to_a_private_address_is_refused(bad):
    bad.routes["/m.onnx"] = hostile.file(DATA)
    f = strict(resolve=lambda host, port: [ip("127.0.0.1")] if host == "models.example.com" else [])
    try:
        err = refused(f"http://models.example.com:{bad.port}/m.onnx", f, "AddressRefused")
    finally:
        f.close()
    assert "host 'models.example.com' resolves to a loopback address" in err.message, err.message
    assert "127.0.0.1" not in err.message  # the class, not the address: internal DNS is not revealed
    assert bad.seen.requests == []


def test_localhost_through_the_system_resolver_is_refused(bad):
    bad.routes["/m.onnx"] = hostile.file(DATA)
    f = strict()
    try:
        err = refused(f"http://localhost:{bad.port}/m.onnx", f, "AddressRefused")
    finally:
        f.close()
    assert "host 'localhost' resolves to a loopback address" in err.message
    assert bad.seen.requests == []


def ip(text: str) -> IPAddress:
    import ipaddress

    return ipaddress.ip_address(text)


def test_the_connection_goes_to_exactly_the_checked_address(bad):
    """The name is resolved once; the socket connects to that address, TLS/Host still name the host."""
    bad.routes["/m.onnx"] = hostile.file(DATA)
    lookups: list[str] = []

    def resolve(host: str, port: int) -> list[IPAddress]:
        lookups.append(host)
        return [ip("127.0.0.1")]

    f = strict(allowed=LOOPBACK_1, resolve=resolve)
    try:
        assert fetch(f"http://models.example.com:{bad.port}/m.onnx", f) == len(DATA)
    finally:
        f.close()
    assert lookups == ["models.example.com"]
    assert f.backend.connected == [("models.example.com", "127.0.0.1")]
    assert bad.seen.requests[0].headers["host"] == f"models.example.com:{bad.port}"


def test_dns_rebinding_meets_the_check_at_every_connection(bad, elsewhere):
    """A name that first resolves to an allowed address and then to a refused one: the second connection is
    refused, and the refused address never sees a request. A name with both kinds of address is refused."""
    for s in (bad, elsewhere):
        s.routes["/m.onnx"] = hostile.file(DATA)
    answers = [[ip("127.0.0.1")], [ip("127.0.0.2")]]
    f = strict(allowed=LOOPBACK_1, resolve=lambda host, port: answers.pop(0))
    # keep-alive would reuse the first connection; a new port per download forces a new one
    both = strict(allowed=LOOPBACK_1, resolve=lambda host, port: [ip("127.0.0.1"), ip("127.0.0.2")])
    try:
        assert fetch(f"http://rebind.example.com:{bad.port}/m.onnx", f) == len(DATA)
        err = refused(f"http://rebind.example.com:{elsewhere.port}/m.onnx", f, "AddressRefused")
        assert "resolves to a loopback address" in err.message
        refused(f"http://both.example.com:{bad.port}/m.onnx", both, "AddressRefused")
    finally:
        f.close()
        both.close()
    assert elsewhere.seen.requests == [] and len(bad.seen.requests) == 1


@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/meta-data/", "{elsewhere}/m.onnx"])
def test_every_redirect_hop_is_checked(bad, elsewhere, target):
    elsewhere.routes["/m.onnx"] = hostile.file(DATA)
    bad.routes["/r"] = hostile.redirect(target.format(elsewhere=elsewhere.url))
    f = strict(allowed=LOOPBACK_1)
    try:
        err = refused(f"{bad.url}/r", f, "AddressRefused")
    finally:
        f.close()
    assert err.message.startswith("redirect 1 of source.uri: "), err.message
    assert elsewhere.seen.requests == []
    assert [a for _, a in f.backend.connected] == ["127.0.0.1"]  # never connected past the first hop


def test_a_redirect_to_a_name_of_a_private_address_is_refused(bad):
    bad.routes["/r"] = hostile.redirect("http://metadata.google.internal/computeMetadata/v1/")
    names = {"metadata.google.internal": [ip("169.254.169.254")]}
    f = strict(allowed=LOOPBACK_1, resolve=lambda host, port: names.get(host) or real_resolve(host, port))
    try:
        err = refused(f"{bad.url}/r", f, "AddressRefused")
    finally:
        f.close()
    assert "host 'metadata.google.internal' resolves to a link-local address" in err.message


def test_blocked_networks_win_over_allowed_and_public(bad):
    bad.routes["/m.onnx"] = hostile.file(DATA)
    f = Fetcher(AddressPolicy(allowed=LOCAL_ALL, blocked=LOOPBACK_1), timeout=10)
    try:
        err = refused(f"{bad.url}/m.onnx", f, "AddressRefused")
    finally:
        f.close()
    assert "blocked by the operator" in err.message
    assert bad.seen.requests == []


def test_host_allow_lists_apply_per_namespace_and_to_every_hop(bad):
    bad.routes["/m.onnx"] = hostile.file(DATA)
    bad.routes["/away"] = hostile.redirect(f"http://elsewhere.example.com:{bad.port}/m.onnx")
    hosts = HostRules.parse(["team-a=files.example.com", "*=*.example.org"])
    names = {"files.example.com", "elsewhere.example.com", "x.example.org"}
    f = Fetcher(
        AddressPolicy(allowed=LOOPBACK_1),
        hosts,
        timeout=10,
        resolve=lambda host, port: [ip("127.0.0.1")] if host in names else [],
    )
    try:
        assert fetch(f"http://files.example.com:{bad.port}/m.onnx", f, namespace="team-a") == len(DATA)
        err = refused(f"http://x.example.org:{bad.port}/m.onnx", f, "HostNotAllowed", namespace="team-a")
        assert "host 'x.example.org' is not among the hosts namespace 'team-a' may download from" in err.message
        assert fetch(f"http://x.example.org:{bad.port}/m.onnx", f, namespace="team-b") == len(DATA)
        refused(f"http://files.example.com:{bad.port}/m.onnx", f, "HostNotAllowed", namespace="team-b")
        err = refused(f"http://files.example.com:{bad.port}/away", f, "HostNotAllowed", namespace="team-a")
        assert err.message.startswith("redirect 1 of source.uri: host 'elsewhere.example.com'")
    finally:
        f.close()
    assert bad.seen.paths == ["/m.onnx", "/m.onnx", "/away"]


class _ForwardProxy:
    """A minimal HTTP forward proxy (absolute-URI GETs) that records the targets it was asked for."""

    def __init__(self, upstream_port: int) -> None:
        self.targets: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.targets.append(self.path)
                with socket.create_connection(("127.0.0.1", upstream_port), timeout=5) as up:
                    path = "/" + self.path.split("/", 3)[3]
                    up.sendall(f"GET {path} HTTP/1.0\r\nHost: upstream\r\n\r\n".encode())
                    while select.select([up], [], [], 5)[0] and (data := up.recv(65536)):
                        self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_with_a_proxy_the_proxy_is_connected_and_ip_literals_are_still_checked(bad):
    """--fetch-proxy: the operator connects only to the proxy (not checked: the admin's own setting), passes
    names on unresolved, and still refuses URL hosts that are non-public IP literals and hosts off the list."""
    bad.routes["/m.onnx"] = hostile.file(DATA)
    proxy = _ForwardProxy(bad.port)
    f = Fetcher(
        AddressPolicy(),
        HostRules.parse(["*=files.example.com"]),
        timeout=10,
        proxy=f"http://127.0.0.1:{proxy.httpd.server_address[1]}",
        resolve=lambda host, port: pytest.fail(f"resolved {host} although a proxy is set"),
    )
    try:
        assert fetch("http://files.example.com/m.onnx", f) == len(DATA)
        refused(f"http://127.0.0.1:{bad.port}/m.onnx", f, "HostNotAllowed")
        g = Fetcher(AddressPolicy(), timeout=10, proxy=f"http://127.0.0.1:{proxy.httpd.server_address[1]}")
        try:
            err = refused(f"http://169.254.169.254:{bad.port}/m.onnx", g, "AddressRefused")
            assert "a link-local address" in err.message
        finally:
            g.close()
    finally:
        f.close()
        proxy.close()
    assert proxy.targets == ["http://files.example.com/m.onnx"]


# --------------------------------------------------------------------------------- bytes and time


def test_a_gzip_bomb_is_refused_unread(bad):
    bad.routes["/bomb"] = hostile.gzip_bomb(50 << 20)  # 50 KiB on the wire, 50 MiB decoded
    f = strict(allowed=LOOPBACK_1)
    try:
        err = refused(f"{bad.url}/bomb", f, "EncodingRefused", max_bytes=1 << 20)
    finally:
        f.close()
    assert "'gzip'" in err.message and "serve it uncompressed" in err.message
    assert bad.seen.requests[0].headers["accept-encoding"] == "identity"


def test_raw_bytes_count_against_the_limit(bad):
    """Bytes are counted as received: a limit of N refuses the N+1st byte on the wire."""
    stop = threading.Event()
    bad.routes["/endless"] = hostile.endless(stop, 64 << 10)
    bad.routes["/declared"] = hostile.declared(100 << 30)
    f = strict(allowed=LOOPBACK_1)
    try:
        seen: list[int] = []
        err = refused(f"{bad.url}/endless", f, "TooLarge", max_bytes=(1 << 20) + 1, on_bytes=seen.append)
        assert "larger than the operator's limit of 1048577 bytes" in err.message
        assert sum(seen) <= (1 << 20) + 1
        started = time.monotonic()
        err = refused(f"{bad.url}/declared", f, "TooLarge", max_bytes=1 << 30)
        assert time.monotonic() - started < 1.5  # refused on the header, not after reading
        assert "is 107374182400 bytes" in err.message
    finally:
        stop.set()
        f.close()


def test_slow_drip_stops_at_the_overall_deadline(bad):
    """One byte every 0.1 s never trips the 10 s read timeout; the 1.5 s deadline ends it."""
    stop = threading.Event()
    bad.routes["/drip"] = hostile.drip(stop, 0.1)
    bad.routes["/stall"] = hostile.declared(1000)  # headers, then silence
    f = Fetcher(AddressPolicy(allowed=LOOPBACK_1), timeout=10, deadline=1.5)
    try:
        for path in ("/drip", "/stall"):
            started = time.monotonic()
            err = refused(f"{bad.url}{path}", f, "DeadlineExceeded")
            took = time.monotonic() - started
            assert 1.4 < took < 4.0, (path, took)
            assert "within the operator's limit of 1.5 s per download" in err.message
    finally:
        stop.set()
        f.close()


def test_refusals_echo_neither_the_digest_nor_the_remote_text(bad):
    bad.routes["/500"] = hostile.error(500, b"SECRET-BODY internal stack trace")
    bad.routes["/garbage"] = hostile.garbage(b"SECRET-GARBAGE not http\r\n\r\n")
    bad.routes["/file"] = hostile.file(b"SECRET-FILE")
    f = strict(allowed=LOOPBACK_1)
    try:
        messages = [
            refused(f"{bad.url}/500", f, "FetchFailed").message,
            refused(f"{bad.url}/garbage", f, "FetchFailed").message,
            refused(f"{bad.url}/file", f, "ChecksumMismatch", sha="0" * 64).message,
            refused("http://127.0.0.1:1/x.onnx", f, "FetchFailed").message,
        ]
    finally:
        f.close()
    actual = hashlib.sha256(b"SECRET-FILE").hexdigest()
    for message in messages:
        assert "SECRET" not in message and actual not in message, message
    assert "returned HTTP 500" in messages[0]
    assert "the server's answer is not valid HTTP" in messages[1]
    assert "the connection could not be made" in messages[3]


def test_user_info_and_query_are_not_echoed(bad):
    bad.routes["/x?token=SECRET-QUERY"] = hostile.error(404, b"")
    f = strict(allowed=LOOPBACK_1)
    try:
        err = refused(f"http://user:SECRET-PASS@127.0.0.1:{bad.port}/x?token=SECRET-QUERY", f, "FetchFailed")
    finally:
        f.close()
    assert "SECRET" not in err.message and f"http://127.0.0.1:{bad.port}/x" in err.message


# ------------------------------------------------------------------------------------- credentials


def _secret(data: dict[str, str], labelled: bool = True, hosts: str | None = "models.example.com") -> dict:
    labels = {CREDENTIALS_LABEL: "true"} if labelled else {}
    annotations = {HOSTS_ANNOTATION: hosts} if hosts is not None else {}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"metadata": {"name": "creds", "labels": labels, "annotations": annotations}, "data": encoded}


def test_credential_secrets():
    host = "models.example.com"
    assert credential_headers(_secret({"token": "abc\n"}), "creds", host) == {"Authorization": "Bearer abc"}
    basic = base64.b64encode(b"u:p").decode()
    assert credential_headers(_secret({"username": "u", "password": "p"}), "creds", host) == {
        "Authorization": f"Basic {basic}"
    }
    assert credential_headers(_secret({"authorization": "Token t"}), "creds", host) == {"Authorization": "Token t"}
    with pytest.raises(ArtifactError, match="not labelled serving.kubeinfer.io/artifact-credentials=true"):
        credential_headers(_secret({"token": "abc"}, labelled=False), "creds", host)
    with pytest.raises(ArtifactError, match="none of the keys"):
        credential_headers(_secret({"other": "x"}), "creds", host)


@pytest.mark.parametrize(
    ("hosts", "host", "allowed"),
    [
        ("models.example.com", "models.example.com", True),
        ("models.example.com", "MODELS.example.com.", True),
        ("models.example.com", "evil.example.com", False),
        ("models.example.com", "models.example.com.evil.io", False),
        ("*.blob.core.windows.net, models.example.com", "acct.blob.core.windows.net", True),
        ("*.blob.core.windows.net", "blob.core.windows.net", False),
        ("*.blob.core.windows.net", "evilblob.core.windows.net", False),
    ],
)
def test_credentials_are_bound_to_the_hosts_their_secret_names(hosts, host, allowed):
    secret = _secret({"token": "t"}, hosts=hosts)
    if allowed:
        assert credential_headers(secret, "creds", host) == {"Authorization": "Bearer t"}
    else:
        with pytest.raises(ArtifactError, match=f"may not be sent to '{host.lower().rstrip('.')}'") as err:
            credential_headers(secret, "creds", host)
        assert err.value.reason == "CredentialsRejected"


@pytest.mark.parametrize(("hosts", "message"), [(None, "names no hosts"), ("", "names no hosts"), ("*", "not '*'")])
def test_a_secret_without_hosts_is_never_sent(hosts, message):
    with pytest.raises(ArtifactError, match=message):
        credential_headers(_secret({"token": "t"}, hosts=hosts), "creds", "models.example.com")
