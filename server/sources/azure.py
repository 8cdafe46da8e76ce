"""``az://`` sources: Azure Blob Storage (and Azure-compatible endpoints such as Azurite), through the guarded client.

azure-storage-blob does what it is for: with an account's shared key, its public ``generate_container_sas``
signs a short-lived, read-and-list-only service SAS for the one container (a local computation: the key is
never sent, and the library opens no connection). A SAS token from the Secret is used as given. Every
request (List Blobs, Get Blob Properties, ranged Get Blob) is then a plain REST call with the SAS in its query,
sent by ``client.StoreClient``: the guarded httpcore pool, the endpoint's host admitted for the namespace like
any URL. Messages name URLs through ``client.shown``, which drops the query, so no SAS reaches a message.

The operator's own identity (Microsoft Entra Workload ID, ``azure_identity.StorageToken``: azure-identity's
credential, its token requests through the same kind of guarded client) is sent instead as ``Authorization: Bearer``
to the account's public endpoint only, over https (``operator/sources/store_sources.py`` decides where;
this class refuses plain http), and never appears in a message or a log either.

A file is pinned by the spec's sha256, else by the blob's version id (an account with blob versioning: the
download reads that version); a blob with neither is refused (ChecksumRequired). Content-MD5 is not a pin.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from .client import Answer, StoreClient
from .errors import (
    CHECKSUM_REQUIRED,
    INVALID,
    NOT_FOUND,
    REFUSED,
    TOO_LARGE,
    UNAUTHORIZED,
    UNAVAILABLE,
    SourceError,
    printable,
)
from .transfer import RangeAnswer, RemoteFile
from .uris import AzureLocation, safe_relative
from .xmldoc import MAX_PAGE, document, error_fields

if TYPE_CHECKING:
    from .azure_identity import StorageToken

#: the public cloud's blob endpoint of an account: https://<account>.blob.core.windows.net
DEFAULT_SUFFIX = "blob.core.windows.net"
#: the account's public endpoint, ``{account}`` filled in (another cloud's, or a test's, is a parameter)
PUBLIC_ENDPOINT = f"https://{{account}}.{DEFAULT_SUFFIX}"
#: the REST API version asked for (x-ms-version); a SAS names its own (sv)
API_VERSION = "2023-11-03"
#: how long a SAS signed here with the account key is valid, past the download's deadline
SAS_MARGIN = datetime.timedelta(minutes=15)
#: the error codes of a refused identity or permission (every 401 and 403 too)
_UNAUTHORIZED_CODES = {"AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
                       "AuthorizationResourceTypeMismatch", "AuthorizationServiceMismatch",
                       "AuthorizationProtocolMismatch", "AuthorizationSourceIPMismatch",
                       "InsufficientAccountPermissions", "NoAuthenticationInformation"}  # fmt: skip
_NOT_FOUND_CODES = {"ContainerNotFound", "BlobNotFound", "ResourceNotFound", "AccountNotFound"}
_SECRET_HINT = (
    "the credentials Secret needs AZURE_STORAGE_SAS_TOKEN (or sasToken) with read and list permissions, "
    "or AZURE_STORAGE_KEY (or accountKey), the account's key"
)
_IDENTITY_HINT = (
    "the operator's workload identity needs a role that reads blobs (Storage Blob Data Reader) on the account or "
    "container"
)


@dataclass(frozen=True)
class AzureCredential:
    """A SAS token (its query string), or an account's shared key (base64) that signs one here."""

    sas_token: str | None = None
    account_key: str | None = None

    def __repr__(self) -> str:  # never the secret itself
        sas, key = ("***" if v else None for v in (self.sas_token, self.account_key))
        return f"AzureCredential(sas_token={sas}, account_key={key})"


def credential_from(data: dict[str, str]) -> AzureCredential:
    """A SAS token or the account key from a Secret's data, under the Azure CLI's and KServe's names."""
    sas = (data.get("AZURE_STORAGE_SAS_TOKEN") or data.get("sasToken") or "").strip().lstrip("?")
    key = (data.get("AZURE_STORAGE_KEY") or data.get("accountKey") or "").strip()
    if sas:
        fields = urllib.parse.parse_qs(sas, keep_blank_values=True)
        if "sig" not in fields or any(not c.isprintable() or c.isspace() for c in sas):
            raise SourceError(UNAUTHORIZED, "the SAS token of the credentials Secret is not a SAS (no sig=...)")
        return AzureCredential(sas_token=sas)
    if key:
        try:
            base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise SourceError(UNAUTHORIZED, "the account key of the credentials Secret is not base64") from None
        return AzureCredential(account_key=key)
    raise SourceError(UNAUTHORIZED, _SECRET_HINT)


def public_url(location: AzureLocation, public: str = PUBLIC_ENDPOINT) -> httpx.URL:
    """The account's public blob endpoint (``https://<account>.blob.core.windows.net``): ``public`` filled in."""
    url = httpx.URL(public.format(account=location.account))
    return httpx.URL(f"{url.scheme}://{url.netloc.decode('ascii')}{url.path.rstrip('/')}")


def account_url(location: AzureLocation, endpoint: str | None, public: str = PUBLIC_ENDPOINT) -> httpx.URL:
    """The account's blob endpoint: the public one (``public_url``), or ``source.endpoint`` (a base URL, with the
    account as its path for path-style stores such as Azurite: ``http://host:10000/<account>``)."""
    if not endpoint:
        return public_url(location, public)
    url = httpx.URL(endpoint)
    path = url.path.rstrip("/")
    if (
        url.scheme not in ("http", "https")
        or not url.host
        or url.query
        or url.fragment
        or url.userinfo
        or path not in ("", f"/{location.account}")
    ):
        raise SourceError(
            INVALID,
            "source.endpoint of an az:// source must be the account's blob endpoint, http(s)://host[:port] or "
            "http(s)://host[:port]/<account> (path style, as Azurite serves)",
        )
    return httpx.URL(f"{url.scheme}://{url.netloc.decode('ascii')}{path}")


@dataclass(frozen=True)
class BlobInfo:
    name: str
    size: int
    etag: str = ""
    #: base64 of the MD5 the store keeps (set on upload): reported, not a pin
    content_md5: str | None = None
    version_id: str | None = None


class AzureBlobSource:
    """One ``az://`` location: what it lists, and ranged reads of its blobs."""

    #: blobs per List Blobs page (the service's own maximum)
    page_size = 5000

    def __init__(
        self,
        client: StoreClient,
        location: AzureLocation,
        namespace: str,
        *,
        endpoint: str | None = None,
        credential: AzureCredential | None = None,
        lifetime: float = 3600.0,
        token: StorageToken | None = None,
        refusal_hint: str | None = None,
    ) -> None:
        """``refusal_hint``: what a refused request's message tells the reader to check (the operator's Secret and
        identity hints by default; the server's cloud repository names Triton's variables instead)."""
        self.client = client
        self.refusal_hint = refusal_hint
        self.location = location
        self.namespace = namespace
        self.base = account_url(location, endpoint)
        self.shown = location.shown
        #: the operator's identity (a bearer, instead of a SAS): https only
        self.token = token
        if token is not None and self.base.scheme != "https":
            raise SourceError(REFUSED, f"{self.shown}: an access token is not sent over plain http")
        self._sas = ""
        if credential is not None and credential.sas_token:
            self._sas = credential.sas_token
        elif credential is not None and credential.account_key:
            expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime) + SAS_MARGIN
            try:
                self._sas = generate_container_sas(
                    location.account,
                    location.container,
                    account_key=credential.account_key,
                    permission=ContainerSasPermissions(read=True, list=True),
                    expiry=expiry,
                )
            except (ValueError, TypeError, binascii.Error):
                raise SourceError(UNAUTHORIZED, "the account key of the credentials Secret is not usable") from None

    # ------------------------------------------------------------------------------------ requests
    def _url(self, blob: str, query: list[tuple[str, str]]) -> httpx.URL:
        path = f"{self.base.path.rstrip('/')}/{self.location.container}"
        if blob:
            path += "/" + urllib.parse.quote(blob, safe="/-_.~")
        text = f"{self.base.scheme}://{self.base.netloc.decode('ascii')}{path}"
        parts = [f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}" for k, v in query]
        if self._sas:
            parts.append(self._sas)
        return httpx.URL(text + ("?" + "&".join(parts) if parts else ""))

    @contextlib.contextmanager
    def _call(
        self, method: str, blob: str, query: list[tuple[str, str]], extra: dict[str, str], what: str
    ) -> Iterator[Answer]:
        headers = {"x-ms-version": API_VERSION, **extra}
        if self.token is not None:
            headers["Authorization"] = self.token.authorization(what)
        url = self._url(blob, query)
        with self.client.request(method, url, headers, namespace=self.namespace, where=what) as answer:
            if answer.status >= 300:
                body = answer.read(64 << 10) if method != "HEAD" else b""
                hint = self.refusal_hint or (
                    _IDENTITY_HINT if self.token is not None else _SECRET_HINT + ", valid for this container"
                )
                raise _error(answer.status, answer.header("x-ms-error-code") or "", body, what, hint)
            yield answer

    # ------------------------------------------------------------------------------------- listing
    def head(self, blob: str) -> BlobInfo:
        """Get Blob Properties: size, ETag, Content-MD5 and the version id (when the account keeps versions)."""
        what = f"{self.location.base_shown}{blob}"
        with self._call("HEAD", blob, [], {}, what) as answer:
            headers = answer.headers
            size = headers.get("content-length", "")
            if not size.isdigit():
                raise SourceError(UNAVAILABLE, f"{what}: the store gave no size for the blob")
            return BlobInfo(
                blob,
                int(size),
                headers.get("etag", ""),
                headers.get("content-md5") or None,
                headers.get("x-ms-version-id") or None,
            )

    def list_folder(self, max_files: int) -> list[BlobInfo]:
        """Every blob under the prefix (List Blobs, paged by marker); SourceTooLarge past ``max_files``."""
        prefix = self.location.blob
        out: list[BlobInfo] = []
        marker = ""
        while True:
            query = [
                ("restype", "container"),
                ("comp", "list"),
                ("prefix", prefix),
                ("maxresults", str(self.page_size)),
            ]
            if marker:
                query.append(("marker", marker))
            with self._call("GET", "", query, {}, self.shown) as answer:
                body = answer.read(MAX_PAGE)
            root = document(body, self.shown, "a List Blobs document")
            for item in root.iter("Blob"):
                name_el = item.find("Name")
                name = (name_el.text or "") if name_el is not None else ""
                if name_el is not None and name_el.get("Encoded") == "true":
                    name = urllib.parse.unquote(name)
                size = item.findtext("Properties/Content-Length") or ""
                if name.endswith("/") and size == "0":
                    continue  # a folder marker
                if not name.startswith(prefix) or not size.isdigit():
                    raise SourceError(INVALID, f"{self.shown}: the listing names '{name[:120]}' outside the prefix")
                out.append(
                    BlobInfo(
                        name,
                        int(size),
                        item.findtext("Properties/Etag") or "",
                        item.findtext("Properties/Content-MD5") or None,
                        item.findtext("VersionId") or None,
                    )
                )
                if len(out) > max_files:
                    raise SourceError(TOO_LARGE, f"{self.shown} holds more than {max_files} blobs (the limit)")
            marker = root.findtext("NextMarker") or ""
            if not marker:
                return out

    def files(self, sha256: str | None, max_files: int, max_bytes: int) -> list[RemoteFile]:
        """What this location names, each file pinned (ChecksumRequired when nothing pins one)."""
        if not self.location.is_folder:
            info = self.head(self.location.blob)
            if info.size > max_bytes:
                raise SourceError(TOO_LARGE, f"{self.shown} is {info.size} bytes, over the limit of {max_bytes} bytes")
            return [self._pinned("", info, sha256)]
        if sha256:
            raise SourceError(INVALID, "source.sha256 pins one blob; a folder's blobs are pinned by their version ids")
        listed = self.list_folder(max_files)
        if not listed:
            raise SourceError(NOT_FOUND, f"{self.shown}: no blob under this prefix")
        total = sum(b.size for b in listed)
        if total > max_bytes:
            raise SourceError(TOO_LARGE, f"{self.shown} lists {total} bytes, over the limit of {max_bytes} bytes")
        out = []
        for item in listed:
            rel = safe_relative(item.name[len(self.location.blob) :])
            info = item if item.version_id else self.head(item.name)
            out.append(self._pinned(rel, info, None))
        return out

    def _pinned(self, rel: str, info: BlobInfo, sha256: str | None) -> RemoteFile:
        what = f"{self.location.base_shown}{info.name}"
        locator = (info.name, info.version_id, info.etag)
        if sha256:
            return RemoteFile(rel, info.size, sha256.lower(), "sha256", locator)
        if info.version_id:
            return RemoteFile(rel, info.size, None, f"azure-version {info.version_id}", locator)
        raise SourceError(
            CHECKSUM_REQUIRED,
            f"{what}: nothing pins its content: give source.sha256 (one blob), or enable blob versioning on the "
            "storage account (a Content-MD5 does not pin it)",
        )

    # ----------------------------------------------------------------------------------- transfer
    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        name, version, etag = file.locator
        query = [("versionid", version)] if version else []
        extra = {"x-ms-range": f"bytes={start}-{end}"}
        if etag and not version:
            extra["If-Match"] = etag  # a blob replaced mid-download fails (412), not mixes two contents
        what = f"{self.location.base_shown}{name}"
        with self._call("GET", name, query, extra, what) as answer:
            yield answer.ranged()


def _error(status: int, code: str, body: bytes, what: str, hint: str = _SECRET_HINT) -> SourceError:
    """A store's refusal in its own words (its error code, the first line of its message), nothing else."""
    fields = error_fields(body, "Code", "Message")
    code = code or fields["Code"]
    # the first line only: the rest is a request id, a time, and for a refused SAS the string it signed
    message = printable(fields["Message"].split("\n")[0], 160)
    code = printable(code, 60)
    said = f"{code}: {message}" if code and message else code or f"HTTP {status}"
    if status in (401, 403) or code in _UNAUTHORIZED_CODES:
        return SourceError(
            UNAUTHORIZED,
            f"{what}: the store refused the credentials ({said}); {hint}",
        )
    if status == 404 or code in _NOT_FOUND_CODES:
        return SourceError(NOT_FOUND, f"{what}: not found ({said})")
    if status == 412 or code == "ConditionNotMet":
        return SourceError(UNAVAILABLE, f"{what}: the blob changed during the download ({said}); retried")
    if status >= 500 or status in (408, 429) or code in ("ServerBusy", "OperationTimedOut"):
        return SourceError(UNAVAILABLE, f"{what}: the store is unavailable ({said}); retried")
    return SourceError(INVALID, f"{what}: the store refused the request ({said})")
