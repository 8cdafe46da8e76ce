"""``s3://``, ``gs://``, ``az://``, ``oci://`` and ``hf://`` sources onto the volume: the shared downloader
(``kubeinfer.server.sources``) fills a staged version folder, under the namespace's download slot, quota, deadline
and the operator's limits.

What a source names becomes the version folder: one object is the model file (for a folder model, a tar
archive of it, as with https); an S3 or Cloud Storage prefix's objects, an ORAS artifact's files and a Hugging Face
repository folder's files keep their relative paths (an ONNX model with external data, a SavedModel, a multi-file Python
model); a modelcar image's layer is unpacked (its ``/models`` folder, KServe's layout). The whole size is
checked from the listing or the manifest before the first byte, and nothing is written outside the staged
folder.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass

import httpx
from kubeinfer.server.repository import confined
from kubeinfer.server.sources import errors as source_errors
from kubeinfer.server.sources.azure import PUBLIC_ENDPOINT, AzureBlobSource, account_url, public_url
from kubeinfer.server.sources.azure import credential_from as azure_credential_from
from kubeinfer.server.sources.azure_identity import IdentityFactory, ambient_identity
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.errors import SourceError
from kubeinfer.server.sources.gcs import GcsSource, gcs_endpoint
from kubeinfer.server.sources.gcs import ambient_credentials as gcs_ambient_credentials
from kubeinfer.server.sources.gcs import credentials_from as gcs_credentials_from
from kubeinfer.server.sources.hf import HfSource, hub_endpoint
from kubeinfer.server.sources.oci import OciSource
from kubeinfer.server.sources.s3 import S3Endpoint, S3Source, ambient_credentials, credentials_from
from kubeinfer.server.sources.transfer import Limits, RemoteFile, download
from kubeinfer.server.sources.uris import (
    as_store_uri,
    parse_az,
    parse_gs,
    parse_hf,
    parse_oci,
    parse_s3,
    store_scheme,
)

from ..api.model_types import Source
from . import archives
from .artifacts import ArtifactError
from .fetch import Fetch

#: files one source may bring into a version folder
MAX_FILES = 10_000
#: names the operator keeps in a version folder for itself; a source may not bring them
RESERVED_PREFIX = ".kubeinfer"
#: a modelcar layer while it is unpacked (removed before the version is published)
LAYER_FILE = ".kubeinfer-layer"
#: a folder's small files (one part each) downloaded at once; larger files run their parts in parallel instead
FILES_PARALLEL = 8

Store = S3Source | GcsSource | OciSource | HfSource | AzureBlobSource


def is_store_uri(uri: str | None) -> bool:
    return bool(uri) and store_scheme(uri or "") != ""


@dataclass(frozen=True)
class Served:
    """What a version was fetched as: the pins, for the status (``oci-digest sha256:...``, ``s3-checksum``,
    ``gcs-generation <n>``, ``hf-commit <sha>``)."""

    pinned: str
    files: int
    size: int


def _artifact_error(exc: SourceError) -> ArtifactError:
    return ArtifactError(exc.reason, exc.message)


class StoreSources:
    def __init__(
        self,
        client: StoreClient,
        *,
        deadline: float,
        max_files: int = MAX_FILES,
        part_size: int | None = None,
        parallel: int | None = None,
        ambient_s3_namespaces: tuple[str, ...] = (),
        ambient_gcs_namespaces: tuple[str, ...] = (),
        ambient_azure_namespaces: tuple[str, ...] = (),
        azure_identity: IdentityFactory = ambient_identity,
        azure_public: str = PUBLIC_ENDPOINT,
    ) -> None:
        self.client = client
        #: namespaces allowed the operator's own AWS credentials (``--ambient-s3-credentials``)
        self.ambient_s3_namespaces = ambient_s3_namespaces
        #: namespaces allowed the operator's own Google credentials, workload identity (``--ambient-gcs-credentials``)
        self.ambient_gcs_namespaces = ambient_gcs_namespaces
        #: namespaces allowed the operator's own Azure identity, workload identity (``--ambient-azure-credentials``),
        #: that identity (made once, on first use), and the accounts' public endpoint it is sent to (``{account}``)
        self.ambient_azure_namespaces = ambient_azure_namespaces
        self.azure_identity = azure_identity
        self.azure_public = azure_public
        self.deadline = deadline
        self.max_files = max_files
        self.part_size = part_size
        self.parallel = parallel

    # ------------------------------------------------------------------------------------- opening
    def _open(self, source: Source, namespace: str, fetch: Fetch) -> Store:
        uri = source.uri or ""
        if store_scheme(uri) == "hf":
            location_hf = parse_hf(uri)
            hub = hub_endpoint(source.endpoint)
            token = None
            if source.credentials_secret:
                if hub.scheme == "http":
                    raise SourceError(
                        source_errors.REFUSED, "a Hub token is not sent over plain http (source.endpoint http://)"
                    )
                token = fetch.secret_data(source.credentials_secret, hub.host).get("token")
                if not token:
                    raise SourceError(
                        source_errors.UNAUTHORIZED, "the credentials Secret of an hf:// source needs the key token"
                    )
            return HfSource(self.client, location_hf, namespace, endpoint=str(hub), token=token, deadline=self.deadline)
        if store_scheme(uri) == "s3":
            location = parse_s3(uri)
            endpoint = S3Endpoint.of(location, source.endpoint, source.region, source.path_style)
            credentials = None
            if source.credentials_secret:
                credentials = credentials_from(fetch.secret_data(source.credentials_secret, endpoint.host))
            elif namespace in self.ambient_s3_namespaces or "*" in self.ambient_s3_namespaces:
                credentials = ambient_credentials()
            return S3Source(self.client, location, endpoint, credentials, namespace)
        if store_scheme(uri) == "gs":
            return self._open_gs(source, namespace, fetch)
        if store_scheme(uri) == "az":
            return self._open_az(source, namespace, fetch)
        location_oci = parse_oci(uri)
        plain = False
        if source.endpoint:
            url = httpx.URL(source.endpoint)
            if url.host.lower() != location_oci.registry.split(":")[0].lower():
                raise SourceError(
                    source_errors.INVALID, "source.endpoint of an oci:// source must name the URI's registry host"
                )
            plain = url.scheme == "http"
        secret = source.credentials_secret
        if secret and plain:
            raise SourceError(
                source_errors.REFUSED, "registry credentials are not sent over plain http (source.endpoint http://)"
            )

        def basic_for(host: str) -> tuple[str, str] | None:
            if not secret:
                return None
            data = fetch.secret_data(secret, host)
            if data.get("username") and data.get("password"):
                return data["username"], data["password"]
            if data.get("token"):
                return "<token>", data["token"]
            if data.get(".dockerconfigjson"):  # an image pull Secret (kubernetes.io/dockerconfigjson)
                return pull_secret_auth(data[".dockerconfigjson"], location_oci.registry)
            return None

        return OciSource(self.client, location_oci, namespace, plain_http=plain, basic_for=basic_for)

    def _open_gs(self, source: Source, namespace: str, fetch: Fetch) -> GcsSource:
        location_gs = parse_gs(source.uri or "")
        gcs = gcs_endpoint(source.endpoint)
        if source.credentials_secret:
            if gcs.scheme == "http":
                raise SourceError(
                    source_errors.REFUSED, "Google credentials are not sent over plain http (source.endpoint http://)"
                )
            # the access token goes to the endpoint: the Secret must list its host; the key's token_uri is the
            # Secret's own choice, admitted for the namespace by the egress rules when google-auth calls it
            key = gcs_credentials_from(fetch.secret_data(source.credentials_secret, gcs.host))
            return GcsSource(self.client, location_gs, namespace, endpoint=str(gcs), credentials=key)
        if namespace in self.ambient_gcs_namespaces or "*" in self.ambient_gcs_namespaces:
            if gcs != gcs_endpoint(None):
                # a bearer token of the operator's own identity goes to Google's endpoint only, never a tenant's
                raise SourceError(
                    source_errors.REFUSED,
                    "the operator's workload identity is used with https://storage.googleapis.com only: omit "
                    "source.endpoint, or give a credentialsSecret",
                )
            ambient, token_client = gcs_ambient_credentials()
            return GcsSource(
                self.client,
                location_gs,
                namespace,
                endpoint=str(gcs),
                credentials=ambient,
                token_client=token_client,
                token_namespace="",
            )
        return GcsSource(self.client, location_gs, namespace, endpoint=str(gcs))

    def _open_az(self, source: Source, namespace: str, fetch: Fetch) -> AzureBlobSource:
        location_az = parse_az(as_store_uri(source.uri or ""))
        base = account_url(location_az, source.endpoint, self.azure_public)
        endpoint = str(base)
        credential = None
        token = None
        if source.credentials_secret:
            # a SAS (given, or signed here with the account key: the key itself is never sent) goes to the endpoint
            credential = azure_credential_from(fetch.secret_data(source.credentials_secret, base.host))
        elif namespace in self.ambient_azure_namespaces or "*" in self.ambient_azure_namespaces:
            if base != public_url(location_az, self.azure_public):
                # a bearer token of the operator's own identity goes to the account's public endpoint only
                raise SourceError(
                    source_errors.REFUSED,
                    f"the operator's workload identity is used with {public_url(location_az, self.azure_public)} "
                    "only (the account's public blob endpoint): omit source.endpoint, or give a credentialsSecret",
                )
            token = self.azure_identity()
        return AzureBlobSource(
            self.client,
            location_az,
            namespace,
            endpoint=endpoint,
            credential=credential,
            lifetime=self.deadline,
            token=token,
        )

    def precheck(self, source: Source, namespace: str) -> None:
        """The refusals that need no connection (URI form, the endpoint's host rules), before a download slot."""
        try:
            uri = source.uri or ""
            if store_scheme(uri) == "s3":
                location = parse_s3(uri)
                endpoint = S3Endpoint.of(location, source.endpoint, source.region, source.path_style)
                self.client.admit(endpoint.url, namespace, "source.uri")
            elif store_scheme(uri) == "gs":
                parse_gs(uri)
                self.client.admit(gcs_endpoint(source.endpoint), namespace, "source.uri")
            elif store_scheme(uri) == "az":
                location_az = parse_az(as_store_uri(uri))
                self.client.admit(account_url(location_az, source.endpoint, self.azure_public), namespace, "source.uri")
            elif store_scheme(uri) == "hf":
                parse_hf(uri)
                self.client.admit(hub_endpoint(source.endpoint), namespace, "source.uri")
            else:
                location_oci = parse_oci(uri)
                self.client.admit(httpx.URL(f"https://{location_oci.registry}"), namespace, "source.uri")
        except SourceError as exc:
            raise _artifact_error(exc) from None

    # ------------------------------------------------------------------------------------- filling
    def fill(
        self,
        source: Source,
        version_fd: int,
        filename: str | None,
        folder_model: bool,
        *,
        namespace: str,
        fetch: Fetch,
        max_bytes: int,
    ) -> Served:
        """Fill the staged version folder ``version_fd`` from ``source``; ArtifactError on any failure."""
        try:
            return self._fill(source, version_fd, filename, folder_model, namespace, fetch, max_bytes)
        except SourceError as exc:
            raise _artifact_error(exc) from None

    def _fill(
        self,
        source: Source,
        version_fd: int,
        filename: str | None,
        folder_model: bool,
        namespace: str,
        fetch: Fetch,
        max_bytes: int,
    ) -> Served:
        store = self._open(source, namespace, fetch)
        fetch.take_slot(namespace)
        started = time.monotonic()
        if isinstance(store, S3Source | GcsSource | AzureBlobSource):
            files = store.files(source.sha256, self.max_files, max_bytes)
        elif isinstance(store, HfSource):
            if source.sha256:
                raise SourceError(
                    source_errors.INVALID, "an hf:// source is pinned by its commit and LFS sha256s, not source.sha256"
                )
            files = store.files(self.max_files, max_bytes)
        else:
            if source.sha256:
                raise SourceError(source_errors.INVALID, "an oci:// source is pinned by its digests, not source.sha256")
            files = store.files(self.max_files, max_bytes)
        total = sum(f.size for f in files)
        if total > max_bytes:
            raise SourceError(source_errors.TOO_LARGE, f"{store.shown}: {total} bytes, over the limit of {max_bytes}")
        fetch.check_quota(namespace, total)
        counting = threading.Lock()  # several files may be downloading at once

        def count(n: int) -> None:
            with counting:
                fetch.count(namespace, n)

        limits = Limits(
            max_bytes=max_bytes,
            deadline_at=started + self.deadline,
            cancelled=fetch.cancelled,
            on_bytes=count,
        )
        if self.part_size:
            limits.part_size = self.part_size
        if self.parallel:
            limits.parallel = self.parallel
        single = len(files) == 1 and files[0].path == "" and not files[0].unpack
        if single and not folder_model:  # one object: the model file itself
            _one(store, files[0], version_fd, filename or "model", limits, store.shown)
        elif single or (len(files) == 1 and files[0].unpack):  # an archive: a folder model's, or a modelcar layer
            self._unpack(store, files[0], version_fd, filename if folder_model else None, limits, fetch, namespace)
        else:
            dest = version_fd
            if folder_model and filename:
                os.mkdir(filename, 0o755, dir_fd=version_fd)
                dest = confined.open_dir(version_fd, filename)
            try:
                for file in files:
                    if file.path.split("/")[0].startswith(RESERVED_PREFIX):
                        raise SourceError(source_errors.INVALID, f"{store.shown} lists '{file.path}', a name kept")
                _place_all(store, files, dest, limits, store.shown)
            finally:
                if dest != version_fd:
                    os.close(dest)
        if filename and not folder_model and confined.kind_of(version_fd, filename) != "file":
            raise SourceError(
                source_errors.INVALID, f"{store.shown} has no file '{filename}' (the model file the config names)"
            )
        if isinstance(store, OciSource):
            pinned = f"oci-digest {store.digest}"
        elif isinstance(store, HfSource):
            pinned = f"hf-commit {store.commit}"
        else:
            pinned = _pins(files)
        return Served(pinned, len(files), total)

    def _unpack(
        self,
        store: Store,
        file: RemoteFile,
        version_fd: int,
        folder: str | None,
        limits: Limits,
        fetch: Fetch,
        namespace: str,
    ) -> None:
        with confined.opened(confined.create_new(version_fd, LAYER_FILE)) as packed:
            download(store, file, packed, limits, store.shown)
            if folder:
                os.mkdir(folder, 0o755, dir_fd=version_fd)
                dest = confined.open_dir(version_fd, folder)
            else:
                dest = os.dup(version_fd)
            with confined.opened(dest):
                size = archives.unpack(
                    packed,
                    dest,
                    shown=store.shown,
                    max_bytes=limits.max_bytes,
                    cancelled=fetch.cancelled,
                    deadline=limits.deadline_at,
                )
        os.unlink(LAYER_FILE, dir_fd=version_fd)
        fetch.count(namespace, size)


def pull_secret_auth(config: str, registry: str) -> tuple[str, str] | None:
    """(user, password) for ``registry`` from an image pull Secret's ``.dockerconfigjson`` (``auths`` keyed by
    the registry host, with ``username``/``password`` or ``auth``, base64 of ``user:password``), else None."""
    try:
        auths = json.loads(config).get("auths") or {}
    except (ValueError, AttributeError):
        raise SourceError(source_errors.UNAUTHORIZED, "the pull Secret's .dockerconfigjson is not JSON") from None
    for key in (registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/"):
        entry = auths.get(key) if isinstance(auths, dict) else None
        if not isinstance(entry, dict):
            continue
        if entry.get("username") and entry.get("password"):
            return str(entry["username"]), str(entry["password"])
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise SourceError(source_errors.UNAUTHORIZED, "the pull Secret's auth entry is not base64") from None
            return user, password
    return None


def _one(store: Store, file: RemoteFile, dir_fd: int, name: str, limits: Limits, shown: str) -> None:
    with confined.opened(confined.create_new(dir_fd, name)) as out:
        download(store, file, out, limits, shown)
        os.fsync(out)


def _place_all(store: Store, files: list[RemoteFile], root_fd: int, limits: Limits, shown: str) -> None:
    """Every file at its relative path under ``root_fd``: the small ones (a single part each) FILES_PARALLEL at
    once, then the large ones one by one (each runs its own parts in parallel); the first failure stops the rest."""
    small = [f for f in files if f.size <= limits.part_size]
    large = [f for f in files if f.size > limits.part_size]
    if len(small) > 1:
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(FILES_PARALLEL, len(small)), thread_name_prefix="file"
        )
        try:
            for _ in pool.map(lambda f: _placed(store, f, root_fd, limits, shown), small):
                pass
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        small = []
    for file in small + large:
        _placed(store, file, root_fd, limits, shown)


def _placed(store: Store, file: RemoteFile, root_fd: int, limits: Limits, shown: str) -> None:
    """``file`` at its relative path under ``root_fd``, making its folders (never following a link; another
    thread may be making the same folder)."""
    *folders, name = file.path.split("/")
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            if confined.kind_of(fd, folder) == "":
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o755, dir_fd=fd)
            nxt = confined.open_dir(fd, folder)
            os.close(fd)
            fd = nxt
        _one(store, file, fd, name, limits, f"{shown}{file.path}")
    finally:
        os.close(fd)


def _pins(files: list[RemoteFile]) -> str:
    kinds = sorted({f.pinned_by.split(" ")[0] for f in files})
    if len(files) == 1:
        return files[0].pinned_by + (f" sha256:{files[0].sha256}" if files[0].sha256 else "")
    return f"{len(files)} objects pinned by {' and '.join(kinds)}"
