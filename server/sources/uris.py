"""Source URIs as typed locations: ``s3://``, ``oci://`` (and http(s), which the operator's fetch keeps).

Pure functions: what a URI names, checked before any connection. The forms follow the peers' so a manifest
moves over unchanged: ``s3://bucket/key`` and ``s3://bucket/prefix/`` (KServe's ``storageUri``), Triton's
``s3://host:port/bucket/path`` for a local S3 store, ``oci://registry/repository:tag`` and ``@sha256:...``
(KServe's modelcars, ORAS artifacts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import INVALID, SourceError

#: S3's bucket-name rules (3-63 characters, lower-case letters, digits, dots and hyphens)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
#: the OCI distribution spec's repository name and tag grammar
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?$")
STORE_SCHEMES = ("s3", "oci")
#: what the server reads as a cloud model repository (Triton's --model-repository=s3://...)
CLOUD_SCHEMES = ("s3",)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    #: the object's key, or the prefix (ending in "/") of a folder; "" is the whole bucket
    key: str
    #: "host:port" from Triton's ``s3://host:port/bucket/path`` form (the store's address), else None
    hostport: str | None = None
    #: the scheme Triton's form names (``s3://https://host:port/...``); plain ``host:port`` is http
    hostport_scheme: str = "http"

    @property
    def is_folder(self) -> bool:
        return self.key == "" or self.key.endswith("/")


@dataclass(frozen=True)
class OciLocation:
    #: registry host[:port] as written (docker.io is not guessed: name it)
    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """The manifest reference: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"


def scheme_of(uri: str) -> str:
    return uri.partition("://")[0].lower() if "://" in uri else ""


def is_cloud(uri: str) -> bool:
    return scheme_of(uri) in CLOUD_SCHEMES


def parse_s3(uri: str) -> S3Location:
    rest = uri[len("s3://") :]
    scheme = "http"
    for named in ("http://", "https://"):  # Triton's s3://https://host:port/bucket/path
        if rest.startswith(named):
            scheme, rest = named[:-3], rest[len(named) :]
    first, _, key = rest.partition("/")
    hostport = None
    if _HOSTPORT.match(first):  # Triton's s3://host:port/bucket/path
        hostport = first
        first, _, key = key.partition("/")
    elif rest != uri[len("s3://") :]:
        raise SourceError(INVALID, "s3://http(s)://... needs host:port before the bucket (Triton's form)")
    if not _BUCKET.match(first) or ".." in first:
        raise SourceError(INVALID, f"'{first}' in the s3:// URI is not a bucket name (S3's naming rules)")
    _check_key(key)
    return S3Location(first, key, hostport, scheme)


def parse_oci(uri: str) -> OciLocation:
    rest = uri[len("oci://") :]
    registry, slash, path = rest.partition("/")
    if not slash or not registry or not path:
        raise SourceError(INVALID, "an oci:// URI is oci://<registry>/<repository>:<tag> or @sha256:<digest>")
    digest = tag = None
    if "@" in path:
        path, _, digest = path.partition("@")
        if not _DIGEST.match(digest):
            raise SourceError(INVALID, f"'{digest[:80]}' is not a sha256 digest (sha256:<64 hex digits>)")
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
        if not _TAG.match(tag):
            raise SourceError(INVALID, f"'{tag[:80]}' is not an OCI tag")
    if not _REPOSITORY.match(path) or len(path) > 255:
        raise SourceError(INVALID, f"'{path[:80]}' is not an OCI repository name (lower-case, '/'-separated)")
    if tag is None and digest is None:
        raise SourceError(INVALID, "an oci:// URI needs a :tag or an @sha256: digest ('latest' is not assumed)")
    return OciLocation(registry.lower(), path, tag, digest)


def _check_key(key: str) -> None:
    parts = [p for p in key.split("/") if p]
    if any(p in (".", "..") for p in parts) or "\0" in key or key.startswith("/"):
        raise SourceError(INVALID, "the object key must not contain '.' or '..' segments or start with '/'")
    if len(key.encode()) > 1024:
        raise SourceError(INVALID, "the object key is longer than S3's 1024 bytes")


def safe_relative(path: str, *, limit_depth: int = 32) -> str:
    """``path`` (from a listing or a manifest) as a relative path that stays inside the version folder.

    Refuses absolute paths, '.', '..', empty segments, NUL and backslashes, and deeper than ``limit_depth``:
    a name the store gives is a tenant's name and must not choose where on the volume a file goes.
    """
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(p in ("", ".", "..") for p in parts)
        or any(len(p.encode()) > 255 for p in parts)
    ):
        raise SourceError(INVALID, f"the source lists '{path[:120]}', which is not a plain relative path")
    if len(parts) > limit_depth:
        raise SourceError(INVALID, f"the source lists '{path[:120]}', deeper than {limit_depth} folders")
    return path
