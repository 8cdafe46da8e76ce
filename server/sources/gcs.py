"""``gs://`` sources: Google Cloud Storage objects and folders over its JSON API, through the guarded client.

google-auth does what it is for: a service-account key from the credentials Secret becomes
``google.oauth2.service_account.Credentials`` (read-only scope), and the token flow (the signed JWT-bearer grant
to the key's ``token_uri``) is google-auth's own. It never opens a connection: every request it makes goes
through ``GuardedRequest``, our implementation of its public transport interface ``google.auth.transport.Request``,
which sends through ``client.StoreClient`` (the token_uri is written by whoever wrote the key, so it is admitted
for the namespace like any URL). Workload identity (the metadata server, or the process's own application default
credentials) is the operator's identity: only for namespaces the admin lists, its requests through a client of
its own that reaches the metadata server's link-local address and nothing else private.

Object metadata, folder listings (paged, bounded) and the ranged media downloads are plain JSON-API requests
sent by the StoreClient with the access token. A file is pinned by the spec's sha256, else by the object's
generation (recorded as ``gcs-generation <n>``): every read asks for that generation, whose bytes Cloud Storage
never changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import google.auth
import google.auth.credentials
import google.auth.exceptions
import google.auth.transport
import httpx
from google.oauth2 import service_account

from .client import StoreClient
from .egress import AddressPolicy, parse_networks
from .errors import INVALID, NOT_FOUND, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, SourceError, printable
from .transfer import RangeAnswer, RemoteFile
from .uris import GcsLocation, safe_relative

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
#: the only scope asked for: reading objects and listing buckets
READ_ONLY_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"
#: the Secret keys a service-account key is read from: ours, KServe's, and the variable's name
KEY_NAMES = ("key.json", "gcloud-application-credentials.json", "GOOGLE_APPLICATION_CREDENTIALS")
#: the largest listing page or metadata document read
MAX_API_ANSWER = 16 << 20
#: the metadata server workload identity asks for tokens (GKE's and Compute Engine's, link-local)
METADATA_NETWORKS = ("169.254.169.254/32",)
log = logging.getLogger("kubeinfer.sources.gcs")


def gcs_endpoint(endpoint: str | None) -> httpx.URL:
    """Cloud Storage's base URL: storage.googleapis.com unless ``source.endpoint`` names another (an emulator, a
    private endpoint)."""
    url = httpx.URL(endpoint or DEFAULT_ENDPOINT)
    if url.scheme not in ("http", "https") or not url.host or url.query or url.path not in ("", "/"):
        raise SourceError(INVALID, "source.endpoint must be a Cloud Storage base URL, http(s)://host[:port]")
    return httpx.URL(f"{url.scheme}://{url.netloc.decode('ascii')}")


# ------------------------------------------------------------------------------- google-auth's transport


class _Response(google.auth.transport.Response):
    def __init__(self, status: int, headers: Mapping[str, str], data: bytes) -> None:
        self._status = status
        self._headers = dict(headers)
        self._data = data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


class GuardedRequest(google.auth.transport.Request):
    """google-auth's HTTP transport: each of its requests (a token grant, a metadata-server call) is sent by the
    StoreClient, its URL admitted for ``namespace`` first; no redirect is followed and no other socket is opened.

    A refused URL raises SourceError (REFUSED) through google-auth unchanged; a broken connection is google-auth's
    TransportError, whose message names the host and never the body (the signed assertion)."""

    def __init__(self, client: StoreClient, namespace: str, where: str) -> None:
        self.client = client
        self.namespace = namespace
        self.where = where

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> _Response:
        target = httpx.URL(url)
        try:
            with self.client.request(
                method,
                target,
                dict(headers or {}),
                namespace=self.namespace,
                where=self.where,
                body=body or b"",
                timeout=timeout,
            ) as answer:
                data = answer.read()
                return _Response(answer.status, answer.headers, data)
        except SourceError as exc:
            if exc.reason != UNAVAILABLE:
                raise  # refused by the guard or the namespace's hosts: google-auth passes it on unchanged
            # (google-auth's exceptions and credentials methods carry no annotations: the ignores below)
            raise google.auth.exceptions.TransportError(exc.message) from None  # type: ignore[no-untyped-call]


# ------------------------------------------------------------------------------------- credentials


def credentials_from(data: Mapping[str, str]) -> service_account.Credentials:
    """A service-account key from a Secret's data (``key.json``, KServe's ``gcloud-application-credentials.json``,
    or ``GOOGLE_APPLICATION_CREDENTIALS`` holding the key's JSON), with the read-only scope. Other credential
    types (external accounts, user credentials) are refused: their flows read files and URLs of their own."""
    raw = next((data[k] for k in KEY_NAMES if data.get(k)), "")
    if not raw:
        raise SourceError(
            UNAUTHORIZED, f"the credentials Secret of a gs:// source needs a service-account key under {KEY_NAMES[0]}"
        )
    try:
        info = json.loads(raw)
    except ValueError:
        raise SourceError(UNAUTHORIZED, "the service-account key in the credentials Secret is not JSON") from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise SourceError(
            UNAUTHORIZED,
            'the credentials Secret of a gs:// source must hold a service-account key ("type": '
            '"service_account"); other credential types are not used',
        )
    token_uri = info.get("token_uri")
    if not isinstance(token_uri, str) or not token_uri.startswith("https://"):
        raise SourceError(UNAUTHORIZED, "the service-account key's token_uri must be an https:// URL")
    try:
        key: service_account.Credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
            info, scopes=[READ_ONLY_SCOPE]
        )
        return key
    except (ValueError, KeyError, TypeError, google.auth.exceptions.GoogleAuthError):
        # google-auth's words may quote the key: ours name only what is wrong with it
        raise SourceError(
            UNAUTHORIZED,
            "the service-account key in the credentials Secret is not usable (it needs client_email, "
            "private_key and token_uri, and a PEM RSA private key)",
        ) from None


_ambient_lock = threading.Lock()
_ambient: tuple[google.auth.credentials.Credentials | None, StoreClient] | None = None


def ambient_client() -> StoreClient:
    """The client of the operator's own token flows: public addresses and the metadata server, any host."""
    return StoreClient(AddressPolicy(allowed=parse_networks(METADATA_NETWORKS)), timeout=30.0)


def ambient_credentials() -> tuple[google.auth.credentials.Credentials | None, StoreClient]:
    """The process's own credentials (google-auth's application default credentials: workload identity's
    metadata server, or GOOGLE_APPLICATION_CREDENTIALS), found once, refreshed by google-auth through the
    ambient client; (None, client) when there are none."""
    global _ambient
    with _ambient_lock:
        if _ambient is None:
            client = ambient_client()
            request = GuardedRequest(client, "", "workload identity")
            found: google.auth.credentials.Credentials | None
            try:
                found, _ = google.auth.default(scopes=[READ_ONLY_SCOPE], request=request)
            except (google.auth.exceptions.DefaultCredentialsError, SourceError):
                found = None
            _ambient = (found, client)
        return _ambient


# ------------------------------------------------------------------------------------- the source


class GcsSource:
    """One ``gs://`` location: what it names (objects with their generations), and ranged reads of them."""

    def __init__(
        self,
        client: StoreClient,
        location: GcsLocation,
        namespace: str,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        credentials: google.auth.credentials.Credentials | None = None,
        token_client: StoreClient | None = None,
        token_namespace: str | None = None,
        refusal_hint: str | None = None,
    ) -> None:
        """``refusal_hint``: what a refused request's message tells the reader to check (by default the operator's
        Secret or the service account's role; the server's cloud repository names Triton's variables instead)."""
        self.client = client
        self.refusal_hint = refusal_hint
        self.location = location
        self.namespace = namespace
        self.endpoint = gcs_endpoint(endpoint)
        self.credentials = credentials
        self.shown = location.shown
        #: google-auth's transport: the token_uri of a tenant's key is admitted for the namespace; workload
        #: identity's requests go through the ambient client
        self.token_request = GuardedRequest(
            token_client or client,
            namespace if token_namespace is None else token_namespace,
            f"the token request of {self.shown}",
        )
        self._token_lock = threading.Lock()

    # -------------------------------------------------------------------------------------- requests
    def _auth(self) -> dict[str, str]:
        if self.credentials is None:
            return {}
        headers: dict[str, str] = {}
        try:
            with self._token_lock:
                if not self.credentials.valid:
                    self.credentials.refresh(self.token_request)  # type: ignore[no-untyped-call]
                self.credentials.apply(headers)  # type: ignore[no-untyped-call]
        except google.auth.exceptions.RefreshError as exc:
            said = printable(str(exc.args[0]) if exc.args else "", 160)
            raise SourceError(
                UNAUTHORIZED,
                f"{self.shown}: no access token for the credentials ({said or 'refused'}); check the "
                "service-account key in the credentials Secret",
            ) from None
        except google.auth.exceptions.TransportError as exc:
            said = printable(str(exc.args[0]) if exc.args else "", 160)
            raise SourceError(UNAVAILABLE, f"{self.shown}: the token request failed ({said}); retried") from None
        found = [value for name, value in headers.items() if name.lower() == "authorization"]
        return {"Authorization": found[0]} if found else {}

    def _url(self, path: str, query: list[tuple[str, str]]) -> httpx.URL:
        text = f"{str(self.endpoint).rstrip('/')}{path}"
        if query:
            text += "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)
        return httpx.URL(text)

    def _object_path(self, name: str, download: bool = False) -> str:
        base = "/download/storage/v1" if download else "/storage/v1"
        bucket = urllib.parse.quote(self.location.bucket, safe="")
        return f"{base}/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"

    def _document(self, path: str, query: list[tuple[str, str]], what: str) -> dict[str, Any]:
        url = self._url(path, query)
        headers = {"Accept": "application/json", **self._auth()}
        with self.client.request("GET", url, headers, namespace=self.namespace, where=what) as answer:
            body = answer.read(MAX_API_ANSWER)
            if answer.status >= 300:
                raise _error(answer.status, body, what, self.credentials is not None, self.refusal_hint)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise SourceError(UNAVAILABLE, f"{what}: the store's answer is not a Cloud Storage JSON document")
        return doc

    # ------------------------------------------------------------------------------------- listing
    def metadata(self, name: str) -> RemoteFile:
        """The object's size and generation (its path left empty)."""
        what = f"gs://{self.location.bucket}/{name}"
        return _entry(self._document(self._object_path(name), [], what), name, "", what)

    def list_folder(self, max_files: int) -> list[tuple[str, RemoteFile]]:
        """(name, file) of every object under the prefix (folder markers left out); SourceTooLarge past
        ``max_files``."""
        prefix = self.location.name
        path = f"/storage/v1/b/{urllib.parse.quote(self.location.bucket, safe='')}/o"
        out: list[tuple[str, RemoteFile]] = []
        token = ""
        for _ in range(max_files + 2):  # a page holds at least one object, or the listing ends
            query = [("prefix", prefix), ("maxResults", "1000"), ("fields", _LIST_FIELDS)]
            if token:
                query.append(("pageToken", token))
            doc = self._document(path, query, self.shown)
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise SourceError(UNAVAILABLE, f"{self.shown}: the listing's items are not a list")
            for item in items:
                name = item.get("name") if isinstance(item, dict) else None
                if not isinstance(name, str) or not name.startswith(prefix):
                    said = str(name)[:120]
                    raise SourceError(INVALID, f"{self.shown}: the listing names '{said}' outside the prefix")
                if name.endswith("/") and str(item.get("size")) == "0":
                    continue  # a folder marker the console creates
                what = f"gs://{self.location.bucket}/{name}"
                out.append((name, _entry(item, name, name[len(prefix) :], what)))
                if len(out) > max_files:
                    raise SourceError(TOO_LARGE, f"{self.shown} holds more than {max_files} objects (the limit)")
            token = doc.get("nextPageToken") or ""
            if not isinstance(token, str):
                raise SourceError(UNAVAILABLE, f"{self.shown}: the listing's page token is not a string")
            if not token:
                return out
        raise SourceError(UNAVAILABLE, f"{self.shown}: the listing does not end")

    def files(self, sha256: str | None, max_files: int, max_bytes: int) -> list[RemoteFile]:
        """What this location names, each file pinned by the spec's sha256 or its generation."""
        if not self.location.is_folder:
            entry = self.metadata(self.location.name)
            if sha256:
                return [RemoteFile("", entry.size, sha256.lower(), "sha256", entry.locator)]
            return [entry]
        if sha256:
            raise SourceError(
                INVALID, "source.sha256 pins one file; a folder's objects are pinned by their own generations"
            )
        listed = self.list_folder(max_files)
        if not listed:
            raise SourceError(NOT_FOUND, f"{self.shown}: no object under this prefix")
        total = sum(f.size for _, f in listed)
        if total > max_bytes:
            raise SourceError(TOO_LARGE, f"{self.shown} lists {total} bytes, over the limit of {max_bytes} bytes")
        return [RemoteFile(safe_relative(f.path), f.size, None, f.pinned_by, f.locator) for _, f in listed]

    # ----------------------------------------------------------------------------------- transfer
    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        name, generation = file.locator
        what = f"gs://{self.location.bucket}/{name}#{generation}"
        url = self._url(self._object_path(name, download=True), [("alt", "media"), ("generation", generation)])
        headers = {"Range": f"bytes={start}-{end}", **self._auth()}
        with self.client.request("GET", url, headers, namespace=self.namespace, where=what) as answer:
            if answer.status >= 300:
                raise _error(
                    answer.status, answer.read(64 << 10), what, self.credentials is not None, self.refusal_hint
                )
            served = answer.header("x-goog-generation")
            if served and served != generation:
                raise SourceError(UNAVAILABLE, f"{what}: the store served generation {printable(served, 40)}")
            yield answer.ranged()


#: the listing's fields read (a smaller answer)
_LIST_FIELDS = "items(name,size,generation),nextPageToken"


def _entry(doc: Mapping[str, Any], name: str, rel: str, what: str) -> RemoteFile:
    """An object's metadata as a file pinned by its generation (the JSON API writes both numbers as strings)."""
    size, generation = str(doc.get("size", "")), str(doc.get("generation", ""))
    if not size.isdigit():
        raise SourceError(UNAVAILABLE, f"{what}: the store gave no size for the object")
    if not generation.isdigit() or generation == "0":
        raise SourceError(UNAVAILABLE, f"{what}: the store gave no generation for the object")
    return RemoteFile(rel, int(size), None, f"gcs-generation {generation}", (name, generation))


def _error(status: int, body: bytes, what: str, with_credentials: bool, hint: str | None = None) -> SourceError:
    """Cloud Storage's refusal in its own words (the error's message), nothing else of the answer."""
    message = ""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        doc = json.loads(body)
        message = printable(str(doc["error"]["message"]), 160) if isinstance(doc, dict) else ""
    said = f"HTTP {status}" + (f": {message}" if message else "")
    if status in (401, 403):
        hint = hint or (
            "check that the service account may read the bucket (roles/storage.objectViewer)"
            if with_credentials
            else "the bucket is not public: give a service-account key (source.credentialsSecret, key key.json)"
        )
        return SourceError(UNAUTHORIZED, f"{what}: the store refused ({said}); {hint}")
    if status == 404:
        return SourceError(NOT_FOUND, f"{what}: not found ({said})")
    if status >= 500 or status in (408, 429):
        return SourceError(UNAVAILABLE, f"{what}: the store is unavailable ({said}); retried")
    return SourceError(INVALID, f"{what}: the store refused the request ({said})")
