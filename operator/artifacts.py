"""Getting a version's model file: download (streamed, size-limited, sha256-checked) or copy from the volume.

Blocking I/O by design: the kopf handlers that call it are synchronous and run in kopf's thread pool,
so a multi-gigabyte download never stalls the event loop. Every failure is an ``ArtifactError`` whose
``reason`` lands in the InferenceModel's conditions and whose message says what to fix.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from kubeinfer.server.repository import confined

CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 20 << 30


class ArtifactError(Exception):
    """A version's file cannot be had or used; ``reason`` is CamelCase, ``message`` says what to fix."""

    def __init__(self, reason: str, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.version = version


def _fsync_write(handle: object) -> None:
    handle.flush()  # type: ignore[attr-defined]
    os.fsync(handle.fileno())  # type: ignore[attr-defined]


#: redirects followed per download (each checked: http(s) only, never from https down to http)
MAX_REDIRECTS = 5
SCHEMES = ("http", "https")
#: Secrets the operator may use as download credentials carry this label (set to "true")
CREDENTIALS_LABEL = "serving.kubeinfer.io/artifact-credentials"


def fetch_client(timeout: float = 60.0, proxy: str | None = None, ca_file: str | None = None) -> httpx.Client:
    """One client for all downloads: redirects handled by ``download``, nothing taken from the environment
    (no proxy variables, no SSL_CERT_FILE); ``proxy`` and ``ca_file`` are --fetch-proxy / --fetch-ca-file."""
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
    return httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False, proxy=proxy, verify=verify)


def credential_headers(secret: Mapping[str, Any], name: str) -> dict[str, str]:
    """HTTP headers from a Secret the user named in ``source.credentialsSecret``.

    The Secret must be labelled ``serving.kubeinfer.io/artifact-credentials: "true"`` (so naming a
    Secret cannot make the operator send one that was never meant for downloads) and hold ``token``
    (sent as ``Authorization: Bearer``), ``username`` and ``password`` (Basic), or ``authorization``
    (the header's full value).
    """
    labels = (secret.get("metadata") or {}).get("labels") or {}
    if labels.get(CREDENTIALS_LABEL) != "true":
        raise ArtifactError(
            "CredentialsRejected",
            f"Secret '{name}' is not labelled {CREDENTIALS_LABEL}=true; label it to allow its use for downloads",
        )
    data = {k: base64.b64decode(v).decode("utf-8", "replace").strip() for k, v in (secret.get("data") or {}).items()}
    if data.get("authorization"):
        return {"Authorization": data["authorization"]}
    if data.get("token"):
        return {"Authorization": f"Bearer {data['token']}"}
    if "username" in data and "password" in data:
        pair = base64.b64encode(f"{data['username']}:{data['password']}".encode()).decode()
        return {"Authorization": f"Basic {pair}"}
    raise ArtifactError(
        "CredentialsRejected",
        f"Secret '{name}' has none of the keys token, username+password, authorization",
    )


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host, url.port


def download(
    uri: str,
    sha256: str,
    dest: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    timeout: float = 60.0,
    client: httpx.Client | None = None,
    headers: Mapping[str, str] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Stream ``uri`` into ``dest``; raise ArtifactError on HTTP errors, oversize or a checksum mismatch.

    Only http(s); redirects are followed up to MAX_REDIRECTS, never to another scheme and never from
    https to http; ``headers`` (credentials) go to the uri's own origin only, not to a redirect
    target elsewhere. ``cancelled`` is polled between chunks (the object is being deleted).
    """
    if not sha256:
        raise ArtifactError("ChecksumRequired", f"{uri}: a remote source needs source.sha256")
    url = httpx.URL(uri)
    if url.scheme not in SCHEMES:
        raise ArtifactError("SchemeRejected", f"source.uri '{uri}' must be http:// or https://")
    if headers and url.scheme != "https":
        raise ArtifactError("CredentialsRejected", f"credentials are only sent over https, not to {uri}")
    own = client is None
    http = client or fetch_client(timeout)
    digest = hashlib.sha256()
    size = 0
    try:
        for _ in range(MAX_REDIRECTS + 1):
            sent = dict(headers or {}) if _origin(url) == _origin(httpx.URL(uri)) else {}
            with http.stream("GET", url, headers=sent) as response:
                if response.is_redirect:
                    target = url.join(response.headers.get("location", ""))
                    if target.scheme not in SCHEMES or (url.scheme == "https" and target.scheme != "https"):
                        raise ArtifactError(
                            "RedirectRejected",
                            f"{uri} redirects from {url.scheme}:// to {target.scheme}://, which the operator refuses",
                        )
                    url = target
                    continue
                if response.status_code != 200:
                    raise ArtifactError(
                        "FetchFailed", f"GET {uri} returned HTTP {response.status_code}; check source.uri"
                    )
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > max_bytes:
                    raise ArtifactError(
                        "TooLarge", f"{uri} is {declared} bytes, over the operator's limit of {max_bytes} bytes"
                    )
                with open(dest, "wb") as out:
                    for chunk in response.iter_bytes():  # as received: cancellation is checked often
                        if cancelled is not None and cancelled():
                            raise ArtifactError("Cancelled", f"download of {uri} cancelled")
                        size += len(chunk)
                        if size > max_bytes:
                            raise ArtifactError(
                                "TooLarge", f"{uri} is larger than the operator's limit of {max_bytes} bytes"
                            )
                        digest.update(chunk)
                        out.write(chunk)
                    _fsync_write(out)
                break
        else:
            raise ArtifactError("FetchFailed", f"{uri} redirects more than {MAX_REDIRECTS} times")
    except httpx.HTTPError as exc:
        raise ArtifactError(
            "FetchFailed", f"cannot download {uri}: {type(exc).__name__}: {exc}; check source.uri"
        ) from None
    finally:
        if own:
            http.close()
    actual = digest.hexdigest()
    if actual != sha256.lower():
        raise ArtifactError(
            "ChecksumMismatch",
            f"{uri} has sha256 {actual} but source.sha256 is {sha256}; fix source.sha256 or source.uri",
        )
    return size


def volume_file(root_fd: int, relative: str, namespace: str) -> int:
    """The regular file ``relative`` names inside the namespace's folder ``root_fd``, opened for reading.

    Refuses '..', absolute paths and symlinks anywhere on the way: the file is reached by the confined
    walk (``kubeinfer.server.repository.confined``) one component at a time with ``O_NOFOLLOW``, so a
    component swapped for a symlink while the copy starts is refused, never followed.
    """
    rel = Path(relative)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in relative:
        raise ArtifactError(
            "PathRejected",
            f"source.path '{relative}' must be relative to this namespace's folder on the repository volume "
            f"('{namespace}/'), without '..'",
        )
    try:
        return confined.open_file(root_fd, relative)
    except confined.Refused as exc:
        raise ArtifactError(
            "PathRejected",
            f"source.path '{relative}' passes through the symlink '{exc.at}'; give the real path of the file",
        ) from None
    except FileNotFoundError:
        raise ArtifactError(
            "PathNotFound",
            f"source.path '{relative}' does not exist in this namespace's folder on the repository volume "
            f"('{namespace}/{relative}')",
        ) from None
    except (IsADirectoryError, NotADirectoryError):
        raise ArtifactError("PathRejected", f"source.path '{relative}' is not a regular file") from None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ArtifactError("PathRejected", f"source.path '{relative}' is not a regular file") from None
        raise ArtifactError("PathRejected", f"source.path '{relative}' cannot be used: {exc.strerror}") from None


def copy_from_volume(
    root_fd: int,
    relative: str,
    sha256: str | None,
    dest_fd: int,
    *,
    namespace: str,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cancelled: Callable[[], bool] | None = None,
) -> int:
    """Copy a file of the namespace's folder ``root_fd`` into the open staged file ``dest_fd``, checking
    sha256 when given; ``dest_fd`` is written from its start and fsynced, and stays open."""
    digest = hashlib.sha256()
    size = 0
    with confined.opened(volume_file(root_fd, relative, namespace)) as src:
        while chunk := os.read(src, CHUNK):
            if cancelled is not None and cancelled():
                raise ArtifactError("Cancelled", f"copy of source.path '{relative}' cancelled")
            size += len(chunk)
            if size > max_bytes:
                raise ArtifactError(
                    "TooLarge", f"source.path '{relative}' is larger than the limit of {max_bytes} bytes"
                )
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dest_fd, view) :]
        os.fsync(dest_fd)
    if sha256 and digest.hexdigest() != sha256.lower():
        raise ArtifactError(
            "ChecksumMismatch",
            f"source.path '{relative}' has sha256 {digest.hexdigest()} but source.sha256 is {sha256}",
        )
    return size
