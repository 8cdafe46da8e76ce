"""``s3://`` sources: AWS S3 and S3-compatible stores (MinIO, Ceph, SeaweedFS), through the guarded client.

botocore does what it is for: the credential chain (when the operator's admin enables it) and SigV4
signing (``botocore.auth.S3SigV4Auth`` on a ``botocore.awsrequest.AWSRequest``). It never sends: each
signed request goes out through ``client.StoreClient``, so an S3 endpoint a tenant names is checked like
any URL. Listings use ListObjectsV2 (paged, bounded); a file is pinned by the spec's sha256, the object's
whole-object SHA-256 checksum, or its version id, in that order.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import contextlib
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from .client import Answer, StoreClient
from .errors import (
    CHECKSUM_REQUIRED,
    INVALID,
    NOT_FOUND,
    TOO_LARGE,
    UNAUTHORIZED,
    UNAVAILABLE,
    SourceError,
    printable,
)
from .guard import current_deadline, same_deadline
from .transfer import RangeAnswer, RemoteFile
from .uris import S3Location, safe_relative
from .xmldoc import MAX_PAGE, document, error_fields

DEFAULT_REGION = "us-east-1"
#: HEAD requests of a folder's objects in flight at once (each learns one object's checksum and version)
HEAD_PARALLEL = 16
_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
#: S3 error codes that mean "who you are was refused" (the rest of 403s too)
_UNAUTHORIZED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                       "InvalidToken", "TokenRefreshRequired", "AuthorizationHeaderMalformed"}  # fmt: skip


@dataclass(frozen=True)
class S3Endpoint:
    """Where the bucket is reached: the store's base URL, its region, and the addressing style."""

    url: httpx.URL
    region: str
    path_style: bool

    @classmethod
    def of(cls, location: S3Location, endpoint: str | None, region: str | None, path_style: bool | None) -> S3Endpoint:
        """AWS by default (virtual-hosted style), a named endpoint (path style unless told), or Triton's host:port."""
        region = region or DEFAULT_REGION
        if endpoint:
            url = httpx.URL(endpoint)
            if url.scheme not in ("http", "https") or not url.host or url.query or url.path not in ("", "/"):
                raise SourceError(INVALID, "source.endpoint must be a store's base URL, http(s)://host[:port]")
            return cls(url, region, True if path_style is None else path_style)
        if location.hostport:  # Triton: s3://host:port/bucket/path is a local or private S3, over http
            return cls(httpx.URL(f"{location.hostport_scheme}://{location.hostport}"), region, True)
        return cls(httpx.URL(f"https://s3.{region}.amazonaws.com"), region, bool(path_style))

    @property
    def host(self) -> str:
        return self.url.host


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    version_id: str | None = None
    sha256: str | None = None
    #: the listing's ETag: what the server's mirror compares to notice a changed object
    etag: str = ""


def credentials_from(data: dict[str, str]) -> Credentials:
    """Static keys from a Secret's data, under KServe's and the AWS CLI's names."""
    key = data.get("AWS_ACCESS_KEY_ID") or data.get("accessKeyId") or ""
    secret = data.get("AWS_SECRET_ACCESS_KEY") or data.get("secretAccessKey") or ""
    if not key or not secret:
        raise SourceError(UNAUTHORIZED, "the credentials Secret needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    token = data.get("AWS_SESSION_TOKEN") or data.get("sessionToken") or None
    return Credentials(key, secret, token)


def ambient_credentials() -> Credentials | None:
    """The process's own AWS credentials from botocore's chain (environment, web identity token / IRSA, container
    and instance roles), refreshed by botocore; None when the chain finds none. Its own calls (STS, the
    instance metadata service) are botocore's, to AWS's fixed endpoints: no tenant names those addresses."""
    import botocore.session

    found: Credentials | None = botocore.session.get_session().get_credentials()
    return found


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


class S3Source:
    """One ``s3://`` location: what it lists, and ranged reads of its objects."""

    def __init__(
        self,
        client: StoreClient,
        location: S3Location,
        endpoint: S3Endpoint,
        credentials: Credentials | None,
        namespace: str,
    ) -> None:
        self.client = client
        self.location = location
        self.endpoint = endpoint
        self.credentials = credentials
        self.namespace = namespace
        self.shown = f"s3://{location.bucket}/{location.key}"

    # ------------------------------------------------------------------------------------ requests
    def _url(self, key: str, query: list[tuple[str, str]]) -> httpx.URL:
        base = self.endpoint.url
        port = f":{base.port}" if base.port else ""
        path = "/" + urllib.parse.quote(key, safe="/-_.~")
        if self.endpoint.path_style:
            host, path = base.host, f"/{self.location.bucket}{path}"
        else:
            host = f"{self.location.bucket}.{base.host}"
        text = f"{base.scheme}://{host}{port}{path}"
        if query:
            text += "?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query))
        return httpx.URL(text)

    def _headers(self, method: str, url: httpx.URL, extra: dict[str, str]) -> dict[str, str]:
        if self.credentials is None:
            return dict(extra)
        request = AWSRequest(method=method, url=str(url), headers=dict(extra))
        S3SigV4Auth(self.credentials, "s3", self.endpoint.region).add_auth(request)
        return {k: v for k, v in request.headers.items()}

    @contextlib.contextmanager
    def _call(
        self,
        method: str,
        key: str,
        query: list[tuple[str, str]],
        extra: dict[str, str],
        what: str,
        direct: bool = False,
    ) -> Iterator[Answer]:
        url = self._url(key, query)
        headers = self._headers(method, url, extra)
        with self.client.request(method, url, headers, namespace=self.namespace, where=what, direct=direct) as answer:
            if answer.status >= 300 and method == "HEAD":
                status = answer.status
            elif answer.status >= 300:
                raise _error(answer.status, answer.read(64 << 10), what)
            else:
                yield answer
                return
        # a HEAD's refusal has no body: the same request as a one-byte GET gets the store's words for it
        with self._call("GET", key, query, {"Range": "bytes=0-0"}, what):
            pass
        raise _error(status, b"", what)

    # ------------------------------------------------------------------------------------- listing
    def head(self, key: str) -> ObjectInfo:
        what = f"s3://{self.location.bucket}/{key}"
        with self._call("HEAD", key, [], {"x-amz-checksum-mode": "ENABLED"}, what) as answer:
            headers = answer.headers
            size = headers.get("content-length", "")
            if not size.isdigit():
                raise SourceError(UNAVAILABLE, f"{what}: the store gave no size for the object")
            return ObjectInfo(
                key,
                int(size),
                _version(headers.get("x-amz-version-id")),
                _sha256_of(headers.get("x-amz-checksum-sha256"), headers.get("x-amz-checksum-type")),
            )

    def list_folder(self, max_files: int) -> list[ObjectInfo]:
        """Every object under the prefix (folder markers left out); SourceTooLarge past ``max_files``."""
        prefix = self.location.key
        out: list[ObjectInfo] = []
        token: str | None = None
        while True:
            query = [("list-type", "2"), ("prefix", prefix), ("max-keys", "1000")]
            if token:
                query.append(("continuation-token", token))
            with self._call("GET", "", query, {}, self.shown) as answer:
                body = answer.read(MAX_PAGE)
            root = document(body, self.shown, "an S3 document")
            for item in root.iter(f"{_NS}Contents"):
                key = item.findtext(f"{_NS}Key") or ""
                size = item.findtext(f"{_NS}Size") or ""
                if key.endswith("/") and size == "0":
                    continue  # a folder marker the consoles create
                if not key.startswith(prefix) or not size.isdigit():
                    raise SourceError(INVALID, f"{self.shown}: the listing names '{key[:120]}' outside the prefix")
                out.append(ObjectInfo(key, int(size), etag=(item.findtext(f"{_NS}ETag") or "").strip('"')))
                if len(out) > max_files:
                    raise SourceError(TOO_LARGE, f"{self.shown} holds more than {max_files} objects (the limit)")
            truncated = (root.findtext(f"{_NS}IsTruncated") or "").lower() == "true"
            token = root.findtext(f"{_NS}NextContinuationToken")
            if not truncated or not token:
                return out

    def files(self, sha256: str | None, max_files: int, max_bytes: int) -> list[RemoteFile]:
        """What this location names, each file pinned (ChecksumRequired when nothing pins one)."""
        if not self.location.is_folder:
            info = self.head(self.location.key)
            return [self._pinned("", info, sha256)]
        if sha256:
            raise SourceError(
                INVALID, "source.sha256 pins one file; a folder's objects are pinned by their own checksums or versions"
            )
        listed = self.list_folder(max_files)
        if not listed:
            raise SourceError(NOT_FOUND, f"{self.shown}: no object under this prefix")
        total = sum(o.size for o in listed)
        if total > max_bytes:
            raise SourceError(TOO_LARGE, f"{self.shown} lists {total} bytes, over the limit of {max_bytes} bytes")
        rels = [safe_relative(item.key[len(self.location.key) :]) for item in listed]
        return [self._pinned(rel, info, None) for rel, info in zip(rels, self._heads(listed), strict=True)]

    def _heads(self, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """A HEAD of each listed object (its checksum and version are not in the listing), HEAD_PARALLEL at once
        under the caller's deadline; the first refusal stops the rest."""
        deadline = current_deadline()

        def head(item: ObjectInfo) -> ObjectInfo:
            with same_deadline(deadline):
                return self.head(item.key)

        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(HEAD_PARALLEL, len(listed)), thread_name_prefix="head"
        )
        try:
            return list(pool.map(head, listed))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _pinned(self, rel: str, info: ObjectInfo, sha256: str | None) -> RemoteFile:
        what = f"s3://{self.location.bucket}/{info.key}"
        if sha256:
            return RemoteFile(rel, info.size, sha256.lower(), "sha256", (info.key, info.version_id))
        if info.sha256:
            return RemoteFile(rel, info.size, info.sha256, "s3-checksum", (info.key, info.version_id))
        if info.version_id:
            return RemoteFile(rel, info.size, None, f"s3-version {info.version_id}", (info.key, info.version_id))
        raise SourceError(
            CHECKSUM_REQUIRED,
            f"{what}: nothing pins its content: give source.sha256, upload it in one part with a SHA-256 "
            "checksum (aws s3api put-object --checksum-algorithm SHA256 --checksum-sha256 ...; "
            "aws s3 cp --checksum-algorithm SHA256 for files under the multipart threshold), "
            "or enable versioning on the bucket",
        )

    # ----------------------------------------------------------------------------------- transfer
    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        key, version = file.locator
        query = [("versionId", version)] if version else []
        what = f"s3://{self.location.bucket}/{key}"
        with self._call("GET", key, query, {"Range": f"bytes={start}-{end}"}, what, direct=True) as answer:
            yield answer.ranged()


def _version(value: str | None) -> str | None:
    return value if value and value != "null" else None


def _sha256_of(value: str | None, kind: str | None) -> str | None:
    """The hex of a whole-object SHA-256 checksum (a multipart's checksum of checksums pins nothing here)."""
    if not value or "-" in value or (kind and kind.upper() != "FULL_OBJECT"):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _error(status: int, body: bytes, what: str) -> SourceError:
    """A store's refusal in its own words (code and message), nothing else of the answer."""
    fields = error_fields(body, "Code", "Message")
    code, message = printable(fields["Code"], 60), printable(fields["Message"], 160)
    said = f"{code}: {message}" if code and message else code or f"HTTP {status}"
    if status in (401, 403) or code in _UNAUTHORIZED_CODES:
        return SourceError(
            UNAUTHORIZED,
            f"{what}: the store refused the credentials ({said}); check the credentials Secret and its policy",
        )
    if status == 404 or code in ("NoSuchBucket", "NoSuchKey", "NoSuchVersion"):
        return SourceError(NOT_FOUND, f"{what}: not found ({said})")
    if status >= 500 or status in (408, 429) or code == "SlowDown":
        return SourceError(UNAVAILABLE, f"{what}: the store is unavailable ({said}); retried")
    return SourceError(INVALID, f"{what}: the store refused the request ({said})")
