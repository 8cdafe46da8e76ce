"""``oci://`` sources: ORAS artifacts and KServe-style modelcar images, from any OCI distribution registry.

The registry API (distribution spec v1.1) is small enough to speak directly over the guarded client, which
keeps every connection (the registry, its token realm, the CDN a blob redirects to) behind the egress guard;
the Python ORAS client sends through ``requests`` with no way to hand it that guard. Token auth follows the
spec's challenge: a 401 with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...`` is answered by a
token from the realm (basic credentials sent to it only when the credentials Secret allows that host), a
``Basic`` challenge by the Secret's user and password.

Content is pinned by digests: the manifest's (the URI's ``@sha256:`` or, for a tag, the digest of the bytes
received, which the status records) and each layer's, checked while streaming.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from .client import StoreClient
from .errors import CHECKSUM_MISMATCH, INVALID, NOT_FOUND, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, SourceError, printable
from .transfer import RangeAnswer, RemoteFile
from .uris import OciLocation, safe_relative

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
IMAGE_CONFIG = ("application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json")
TAR_LAYERS = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
)
TITLE = "org.opencontainers.image.title"
#: where a modelcar image keeps its model (KServe's convention)
MODELCAR_FOLDER = "models/"
MAX_MANIFEST = 4 << 20
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
_PARAM = re.compile(r'(\w+)="([^"]*)"')

#: (user, password) the credentials Secret allows for a host, else None
BasicFor = Callable[[str], "tuple[str, str] | None"]


class OciSource:
    """One ``oci://`` reference: its manifest resolved to files (artifact) or layers to unpack (modelcar)."""

    def __init__(
        self,
        client: StoreClient,
        location: OciLocation,
        namespace: str,
        *,
        plain_http: bool = False,
        basic_for: BasicFor | None = None,
    ) -> None:
        self.client = client
        self.location = location
        self.namespace = namespace
        self.base = httpx.URL(f"{'http' if plain_http else 'https'}://{location.registry}")
        self.basic_for = basic_for or (lambda host: None)
        self.shown = f"oci://{location.registry}/{location.repository}"
        self._authorization: str | None = None
        #: the manifest digest served (set by ``files``)
        self.digest: str | None = None

    # ------------------------------------------------------------------------------------------ auth
    def _basic(self, host: str) -> str | None:
        pair = self.basic_for(host)
        if pair is None:
            return None
        return "Basic " + base64.b64encode(f"{pair[0]}:{pair[1]}".encode()).decode()

    def _authorize(self, challenge: str, what: str) -> None:
        """Answer a 401's challenge: a bearer token from the realm, or basic credentials."""
        scheme, _, rest = challenge.partition(" ")
        params = dict(_PARAM.findall(rest))
        if scheme.lower() == "basic":
            self._authorization = self._basic(self.base.host)
            if self._authorization is None:
                raise SourceError(UNAUTHORIZED, f"{what}: the registry needs credentials (source.credentialsSecret)")
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise SourceError(UNAUTHORIZED, f"{what}: the registry asks for an authentication scheme not supported")
        realm = httpx.URL(params["realm"])
        query = {"scope": f"repository:{self.location.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        url = realm.copy_merge_params(query)
        basic = self._basic(realm.host)
        headers = {"Authorization": basic} if basic else {}
        with self.client.request("GET", url, headers, namespace=self.namespace, where=f"{what} (token)") as answer:
            body = answer.read(1 << 20)
            if answer.status in (401, 403):
                raise SourceError(UNAUTHORIZED, f"{what}: the registry's token service refused the credentials")
            if answer.status != 200:
                raise SourceError(UNAVAILABLE, f"{what}: the registry's token service answered HTTP {answer.status}")
        try:
            document = json.loads(body)
            token = document.get("token") or document.get("access_token")
        except (ValueError, AttributeError):
            token = None
        if not isinstance(token, str) or not token:
            raise SourceError(UNAVAILABLE, f"{what}: the registry's token service gave no token")
        self._authorization = f"Bearer {token}"

    @contextlib.contextmanager
    def _get(self, path: str, headers: dict[str, str], what: str, direct: bool = False) -> Iterator[Any]:
        """GET on the registry, answering one auth challenge; non-2xx answers become SourceErrors."""
        url = self.base.join(path)
        for attempt in range(2):
            sent = dict(headers)
            if self._authorization:
                sent["Authorization"] = self._authorization
            with self.client.request(
                "GET", url, sent, namespace=self.namespace, where=what, follow=True, direct=direct
            ) as answer:
                if answer.status == 401 and attempt == 0:
                    challenge = answer.header("www-authenticate") or ""
                    answer.read(64 << 10)
                    self._authorize(challenge, what)
                    continue
                if answer.status >= 300:
                    raise _error(answer.status, answer.read(64 << 10), what)
                yield answer
                return
        raise SourceError(UNAUTHORIZED, f"{what}: the registry refused the credentials")

    # -------------------------------------------------------------------------------------- manifest
    def _manifest(self, reference: str) -> tuple[str, dict[str, Any]]:
        what = f"{self.shown}@{reference}" if reference.startswith("sha256:") else f"{self.shown}:{reference}"
        path = f"/v2/{self.location.repository}/manifests/{urllib.parse.quote(reference, safe=':')}"
        with self._get(path, {"Accept": ACCEPT}, what) as answer:
            declared = answer.header("content-length") or ""
            if declared.isdigit() and int(declared) > MAX_MANIFEST:
                raise SourceError(TOO_LARGE, f"{what}: a manifest over {MAX_MANIFEST} bytes")
            body = answer.read(MAX_MANIFEST)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:
            raise SourceError(CHECKSUM_MISMATCH, f"{what}: the manifest received does not match its digest")
        try:
            manifest = json.loads(body)
        except ValueError:
            raise SourceError(INVALID, f"{what}: the manifest is not JSON") from None
        if not isinstance(manifest, dict):
            raise SourceError(INVALID, f"{what}: the manifest is not a JSON object")
        return digest, manifest

    def files(self, max_files: int, max_bytes: int) -> list[RemoteFile]:
        """The manifest's layers as files: an artifact's titled layers, or a modelcar's tar layers to unpack."""
        digest, manifest = self._manifest(self.location.reference)
        if manifest.get("mediaType") in (OCI_INDEX, DOCKER_LIST) or "manifests" in manifest:
            digest, manifest = self._manifest(_pick_platform(manifest, self.shown))
        self.digest = digest
        layers = manifest.get("layers")
        if not isinstance(layers, list) or not layers:
            raise SourceError(INVALID, f"{self.shown}: the manifest has no layers")
        if len(layers) > max_files:
            raise SourceError(TOO_LARGE, f"{self.shown}: {len(layers)} layers, over the limit of {max_files}")
        described = [_descriptor(layer, self.shown) for layer in layers]
        total = sum(size for _, size, _, _ in described)
        if total > max_bytes:
            raise SourceError(TOO_LARGE, f"{self.shown}: its layers are {total} bytes, over the limit of {max_bytes}")
        titled = [d for d in described if d[3]]
        config: dict[str, Any] = manifest["config"] if isinstance(manifest.get("config"), dict) else {}
        modelcar = not titled and all(d[2] in TAR_LAYERS for d in described) and config.get("mediaType") in IMAGE_CONFIG
        out = []
        for index, (layer_digest, size, _, title) in enumerate(described):
            if modelcar:  # unpacked by the caller (a single top folder, models/, is stripped)
                out.append(
                    RemoteFile(f"layer-{index}", size, layer_digest[7:], "oci-digest", (layer_digest, None), True)
                )
            elif title:
                rel = safe_relative(title)
                out.append(RemoteFile(rel, size, layer_digest[7:], "oci-digest", (layer_digest, None)))
        if not out:
            raise SourceError(INVALID, f"{self.shown}: no layer names a file ({TITLE}) and it is no modelcar image")
        if modelcar and len(out) > 1:
            raise SourceError(INVALID, f"{self.shown}: a modelcar image with {len(out)} layers (one is supported)")
        names = [f.path for f in out]
        if len(set(names)) != len(names):
            raise SourceError(INVALID, f"{self.shown}: two layers carry the same file name")
        return out

    # ------------------------------------------------------------------------------------- transfer
    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        digest = file.locator[0]
        what = f"{self.shown} layer {digest[:19]}"
        headers = {"Range": f"bytes={start}-{end}"}
        with self._get(f"/v2/{self.location.repository}/blobs/{digest}", headers, what, direct=True) as answer:
            yield answer.ranged()


def _descriptor(layer: Any, shown: str) -> tuple[str, int, str, str | None]:
    if not isinstance(layer, dict):
        raise SourceError(INVALID, f"{shown}: a layer is not a descriptor")
    digest, size, media_type = layer.get("digest"), layer.get("size"), layer.get("mediaType")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise SourceError(INVALID, f"{shown}: a layer's digest is not sha256:<hex> (only sha256 is accepted)")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SourceError(INVALID, f"{shown}: a layer has no valid size")
    annotations: dict[str, Any] = layer["annotations"] if isinstance(layer.get("annotations"), dict) else {}
    title = annotations.get(TITLE)
    return digest, size, str(media_type or ""), title if isinstance(title, str) and title else None


def _pick_platform(index: dict[str, Any], shown: str) -> str:
    """From an image index: the linux/amd64 manifest, else the only one."""
    entries = [m for m in index.get("manifests") or [] if isinstance(m, dict) and isinstance(m.get("digest"), str)]
    for entry in entries:
        platform = entry.get("platform") or {}
        if platform.get("os") == "linux" and platform.get("architecture") == "amd64":
            return str(entry["digest"])
    if len(entries) == 1:
        return str(entries[0]["digest"])
    raise SourceError(INVALID, f"{shown}: an image index without a linux/amd64 manifest")


def _error(status: int, body: bytes, what: str) -> SourceError:
    """A registry's refusal in its own words (the spec's error codes), nothing else of the answer."""
    said = f"HTTP {status}"
    with contextlib.suppress(ValueError, AttributeError, TypeError, IndexError):
        first = json.loads(body)["errors"][0]
        said = printable(f"{first.get('code', '')}: {first.get('message', '')}", 160)
    if status in (401, 403):
        return SourceError(UNAUTHORIZED, f"{what}: the registry refused the credentials ({said})")
    if status == 404:
        return SourceError(NOT_FOUND, f"{what}: not found ({said})")
    if status >= 500 or status == 429:
        return SourceError(UNAVAILABLE, f"{what}: the registry is unavailable ({said}); retried")
    return SourceError(INVALID, f"{what}: the registry refused the request ({said})")
