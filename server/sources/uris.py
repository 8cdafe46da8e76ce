"""Source URIs as typed locations: ``s3://``, ``gs://``, ``oci://``, ``hf://`` (and http(s), which the operator's
fetch keeps).

Pure functions: what a URI names, checked before any connection. The forms follow the peers' so a manifest
moves over unchanged: ``s3://bucket/key`` and ``s3://bucket/prefix/`` (KServe's ``storageUri``), Triton's
``s3://host:port/bucket/path`` for a local S3 store, ``gs://bucket/object`` and ``gs://bucket/prefix/`` (KServe's and
gsutil's), ``oci://registry/repository:tag`` and ``@sha256:...``
(KServe's modelcars, ORAS artifacts), ``hf://org/repo[@revision][/path]`` (huggingface_hub's own ``hf://``
form for a model repository: a file, a folder ending in '/', or the whole repository), and
``az://account/container/blob`` or ``.../prefix/`` (Azure Blob Storage, the form KServe's AWS-style URIs take),
and KServe's ``https://<account>.blob.core.windows.net/<container>/<path>``, read as the same ``az://`` location.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from .errors import INVALID, SourceError

#: S3's bucket-name rules (3-63 characters, lower-case letters, digits, dots and hyphens)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
#: the OCI distribution spec's repository name and tag grammar
_REPOSITORY = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?$")
#: a Hub repository id's two parts (huggingface_hub's validate_repo_id: letters, digits, '-', '_', '.', at most
#: 96 characters, neither starting nor ending with '-' or '.')
_HF_NAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9_])?$")
#: a branch, tag or commit (git's ref names, narrowed to what the Hub's revisions use)
_HF_REVISION = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._\-/]{0,254}$")
#: the revisions that contain '/' and stand unquoted in a URI (pull requests, the Hub's conversions)
_HF_SPECIAL_REVISION = re.compile(r"^refs/(?:pr/[0-9]+|convert/[A-Za-z0-9_.\-]+)(?=/|$)")
#: huggingface_hub's type prefixes other than models/: not model repositories
_HF_OTHER_TYPES = ("datasets", "spaces", "kernels", "buckets")
#: Cloud Storage's bucket names: 3-63 characters (up to 222 with dots, each dot-separated part at most 63),
#: lower-case letters, digits, '-', '_' and '.', starting and ending with a letter or digit
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._\-]{1,220}[a-z0-9]$")
STORE_SCHEMES = ("s3", "gs", "oci", "hf", "az")
#: what the server reads as a cloud model repository (Triton's --model-repository=s3://..., gs://..., as://...)
CLOUD_SCHEMES = ("s3", "gs", "as")


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
class GcsLocation:
    bucket: str
    #: the object's name, or the prefix (ending in "/") of a folder; "" is the whole bucket
    name: str

    @property
    def is_folder(self) -> bool:
        return self.name == "" or self.name.endswith("/")

    @property
    def shown(self) -> str:
        return f"gs://{self.bucket}/{self.name}"


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


@dataclass(frozen=True)
class HfLocation:
    #: "namespace/name" of a model repository
    repo: str
    #: the branch, tag or commit asked for ("main" unless the URI names one); resolved to a commit per fetch
    revision: str
    #: a file of the repository, a folder ending in "/", or "" for the whole repository
    path: str

    @property
    def is_folder(self) -> bool:
        return self.path == "" or self.path.endswith("/")

    @property
    def shown(self) -> str:
        return f"hf://{self.repo}@{self.revision}/{self.path}"


#: an Azure storage account's name (3-24 lower-case letters and digits) and a container's (3-63: lower-case
#: letters, digits, single hyphens between them)
_AZ_ACCOUNT = re.compile(r"^[a-z0-9]{3,24}$")
_AZ_CONTAINER = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}$")


@dataclass(frozen=True)
class AzureLocation:
    """``az://account/container/blob``: a blob, a prefix ending in "/", or "" for the whole container."""

    account: str
    container: str
    blob: str

    @property
    def is_folder(self) -> bool:
        return self.blob == "" or self.blob.endswith("/")

    @property
    def base_shown(self) -> str:
        return f"az://{self.account}/{self.container}/"

    @property
    def shown(self) -> str:
        return f"{self.base_shown}{self.blob}"


#: an Azure Blob URL as KServe's storageUri takes it, read as ``az://<account>/<container>/<path>`` (with its
#: credentials, folders and version pins); one with a query or fragment (a pre-signed SAS URL) stays a plain https
#: download. The CRD's validation quotes this pattern.
AZURE_BLOB_URL_PATTERN = r"^https://[a-z0-9]{3,24}\.blob\.core\.windows\.net/[^?#]+$"
_AZURE_BLOB_URL = re.compile(AZURE_BLOB_URL_PATTERN)


def scheme_of(uri: str) -> str:
    return uri.partition("://")[0].lower() if "://" in uri else ""


def store_scheme(uri: str) -> str:
    """The store that serves ``uri`` (one of STORE_SCHEMES), or "" for a plain http(s) download or a volume path."""
    if _AZURE_BLOB_URL.match(uri):
        return "az"
    scheme = scheme_of(uri)
    return scheme if scheme in STORE_SCHEMES else ""


def as_store_uri(uri: str) -> str:
    """``uri`` in its store's own scheme: an Azure Blob URL as ``az://account/container/path``, others unchanged."""
    if not _AZURE_BLOB_URL.match(uri):
        return uri
    host, _, path = uri[len("https://") :].partition("/")
    return f"az://{host.split('.', 1)[0]}/{urllib.parse.unquote(path)}"


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


def parse_gs(uri: str) -> GcsLocation:
    """``gs://bucket/object`` or ``gs://bucket/prefix/`` (a folder; ``gs://bucket/`` is the whole bucket)."""
    bucket, _, name = uri[len("gs://") :].partition("/")
    parts = bucket.split(".")
    if (
        not _GCS_BUCKET.match(bucket)
        or any(not p or len(p) > 63 for p in parts)
        or (len(bucket) > 63 and "." not in bucket)
        or bucket.startswith("goog")
    ):
        raise SourceError(INVALID, f"'{bucket[:80]}' in the gs:// URI is not a bucket name (Cloud Storage's rules)")
    if "\r" in name or "\n" in name:
        raise SourceError(INVALID, "the object name in a gs:// URI must not contain line breaks (Cloud Storage's rule)")
    _check_key(name)
    return GcsLocation(bucket, name)


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


def parse_hf(uri: str) -> HfLocation:
    """``hf://[models/]namespace/name[@revision][/path]``: a model repository of the Hugging Face Hub.

    The revision ends at the next '/' (a branch whose name has '/' is written with %2F, as huggingface_hub
    writes it), except the Hub's own ``refs/pr/<n>`` and ``refs/convert/<name>``."""
    rest = uri[len("hf://") :]
    parts = rest.split("/", 2)
    if parts[0] in _HF_OTHER_TYPES:
        raise SourceError(INVALID, f"hf://{parts[0]}/... is not a model repository (hf://<namespace>/<name>)")
    if parts[0] == "models":
        rest = rest[len("models/") :]
    namespace, slash, rest = rest.partition("/")
    name_end = min((i for i in (rest.find("@"), rest.find("/")) if i >= 0), default=len(rest))
    name, rest = rest[:name_end], rest[name_end:]
    if not slash or not _hf_name(namespace) or not _hf_name(name):
        raise SourceError(
            INVALID,
            "an hf:// URI is hf://<namespace>/<name>[@<revision>][/<path>] (a model repository's id: letters, "
            "digits, '-', '_' and '.')",
        )
    revision = "main"
    if rest.startswith("@"):
        rest = rest[1:]
        special = _HF_SPECIAL_REVISION.match(rest)
        end = special.end() if special else (rest.find("/") if "/" in rest else len(rest))
        revision, rest = urllib.parse.unquote(rest[:end]), rest[end:]
        if (
            not _HF_REVISION.match(revision)
            or ".." in revision
            or "//" in revision
            or revision.endswith(("/", ".lock", "."))
        ):
            raise SourceError(INVALID, f"'{revision[:80]}' in the hf:// URI is not a branch, tag or commit")
    path = rest[1:] if rest.startswith("/") else rest
    if rest and not rest.startswith("/"):
        raise SourceError(INVALID, "in an hf:// URI the path follows the repository (or its @revision) after '/'")
    segments = path.split("/")[:-1] if path.endswith("/") else path.split("/")
    if path and (any(p in ("", ".", "..") for p in segments) or "\\" in path or "\0" in path):
        raise SourceError(INVALID, "the path in an hf:// URI must not contain '.', '..' or empty segments")
    if len(path.encode()) > 1024:
        raise SourceError(INVALID, "the path in an hf:// URI is longer than 1024 bytes")
    return HfLocation(f"{namespace}/{name}", revision, path)


def parse_az(uri: str) -> AzureLocation:
    """``az://<account>/<container>/<blob>`` (or ``.../<prefix>/``, a folder): an Azure Blob Storage location, the
    account's endpoint ``https://<account>.blob.core.windows.net`` unless ``source.endpoint`` names another."""
    account, _, rest = uri[len("az://") :].partition("/")
    container, _, blob = rest.partition("/")
    if not _AZ_ACCOUNT.match(account):
        raise SourceError(
            INVALID, f"'{account[:80]}' in the az:// URI is not a storage account name (3-24 letters a-z, digits)"
        )
    if not _AZ_CONTAINER.match(container):
        raise SourceError(
            INVALID, f"'{container[:80]}' in the az:// URI is not a container name (Azure's naming rules)"
        )
    if "\\" in blob or any(c in blob for c in "\r\n"):
        raise SourceError(INVALID, "the blob name in an az:// URI must not contain backslashes or line breaks")
    _check_key(blob)
    return AzureLocation(account, container, blob)


def _hf_name(part: str) -> bool:
    return bool(_HF_NAME.match(part)) and "--" not in part and ".." not in part and not part.endswith(".git")


def _check_key(key: str) -> None:
    parts = [p for p in key.split("/") if p]
    if any(p in (".", "..") for p in parts) or "\0" in key or key.startswith("/"):
        raise SourceError(INVALID, "the object key must not contain '.' or '..' segments or start with '/'")
    if len(key.encode()) > 1024:
        raise SourceError(INVALID, "the object key is longer than the stores' 1024 bytes")


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
