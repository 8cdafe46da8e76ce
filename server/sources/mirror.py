"""A cloud model repository (``--model-repository=s3://...``) as Triton reads one: a local copy per model.

Triton copies a remote model into a local folder before loading it. The server does the same with the shared
downloader: ``sync`` lists the repository (ListObjectsV2, paged), groups the objects by model folder, and
brings each model whose objects changed (keys, sizes, ETags) into the local mirror: downloaded into a staging
folder beside it, then swapped in by two renames, so a scan sees either the old model or the new one. The
registry then serves the mirror like any local repository; in poll mode every poll syncs first, so a model
changed in the bucket is reloaded by the next poll, and one deleted from it is unloaded.

Credentials as Triton takes them: ``TRITON_CLOUD_CREDENTIAL_PATH`` (a JSON file with an ``s3`` section of
credentials per path prefix: ``key_id``, ``secret_key``, ``session_token``, ``region``), else
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``/``AWS_DEFAULT_REGION``, else botocore's
default chain (profile, web identity, instance role). The administrator names the repository, so the egress
guard here admits every address; connections still go through it, with its deadlines.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from botocore.credentials import Credentials

from .client import StoreClient
from .egress import AddressPolicy
from .errors import NOT_FOUND, UNAUTHORIZED, SourceError
from .guard import deadline_scope
from .s3 import S3Endpoint, S3Source, ambient_credentials
from .transfer import Limits, RemoteFile, download
from .uris import parse_s3, safe_relative

log = logging.getLogger("kubeinfer.sources.mirror")
#: objects one repository may list (a model store, not a data lake)
MAX_OBJECTS = 1_000_000
#: bytes the mirror may hold (the node's disk is the real bound)
MAX_BYTES = 1 << 42
#: one model's sync may take this long
DEADLINE = 3600.0
_EVERYWHERE = AddressPolicy(allowed=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


class RepositoryUnavailable(Exception):
    """The repository cannot be read (Triton's words for it)."""


@dataclass(frozen=True)
class S3Settings:
    credentials: Credentials | None
    region: str | None


def s3_settings(uri: str, env: Mapping[str, str] = os.environ) -> S3Settings:
    """Credentials and region for ``uri``, in Triton's order (see the module's docstring)."""
    path = env.get("TRITON_CLOUD_CREDENTIAL_PATH")
    if path:
        try:
            section = json.loads(Path(path).read_text()).get("s3") or {}
        except (OSError, ValueError, AttributeError) as exc:
            raise RepositoryUnavailable(f"failed to read TRITON_CLOUD_CREDENTIAL_PATH '{path}': {exc}") from None
        prefixes = [p for p in section if isinstance(p, str) and uri.startswith(p)]
        if prefixes:
            entry = section[max(prefixes, key=len)] or {}
            key, secret = entry.get("key_id", ""), entry.get("secret_key", "")
            creds = Credentials(key, secret, entry.get("session_token") or None) if key and secret else None
            return S3Settings(creds, entry.get("region") or None)
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        token = env.get("AWS_SESSION_TOKEN") or None
        return S3Settings(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], token), region)
    return S3Settings(ambient_credentials(), region)  # refreshable (web identity, instance role): botocore renews it


class CloudRepository:
    """The local mirror of one cloud repository."""

    def __init__(self, uri: str, local: Path, *, client: StoreClient | None = None, settings: S3Settings | None = None):
        self.uri = uri.rstrip("/") + "/"
        self.local = local
        location = parse_s3(self.uri)
        settings = settings or s3_settings(uri)
        endpoint = S3Endpoint.of(location, None, settings.region, None)
        self.client = client or StoreClient(_EVERYWHERE)
        self.source = S3Source(self.client, location, endpoint, settings.credentials, namespace="")
        self._seen: dict[str, tuple[tuple[str, int, str], ...]] = {}
        local.mkdir(parents=True, exist_ok=True)

    def _listing(self) -> dict[str, list[tuple[str, int, str]]]:
        """Model folder -> its objects (relative path, size, ETag), from one paged listing of the repository."""
        try:
            objects = self.source.list_folder(MAX_OBJECTS)
        except SourceError as exc:
            if exc.reason in (UNAUTHORIZED, NOT_FOUND):
                raise RepositoryUnavailable(
                    f"Unable to create S3 filesystem client. Check account credentials. Exception: "
                    f"'{exc.reason}' Message: '{exc.message}'"
                ) from None
            raise RepositoryUnavailable(f"failed to list {self.uri}: {exc.message}") from None
        models: dict[str, list[tuple[str, int, str]]] = {}
        prefix = self.source.location.key
        for item in objects:
            rel = item.key[len(prefix) :]
            if "/" not in rel:
                continue  # a file beside the model folders: Triton ignores it too
            try:
                safe_relative(rel)
            except SourceError:
                log.warning("skipping object %r: not a plain relative path", item.key)
                continue
            name = rel.split("/", 1)[0]
            models.setdefault(name, []).append((rel.split("/", 1)[1], item.size, item.etag))
        return models

    def sync(self, names: list[str] | None = None) -> list[str]:
        """Bring the mirror in line with the repository (only ``names`` when given); the models changed."""
        listing = self._listing()
        wanted = set(listing) if names is None else {n for n in names if n in listing}
        changed = []
        for name in sorted(wanted):
            objects = tuple(sorted(o for o in listing[name] if o[0]))
            if self._seen.get(name) == objects and (self.local / name).is_dir():
                continue
            self._fetch_model(name, objects)
            self._seen[name] = objects
            changed.append(name)
        gone = [n for n in list(self._seen) if n not in listing and (names is None or n in names)]
        for name in gone:
            shutil.rmtree(self.local / name, ignore_errors=True)
            del self._seen[name]
            changed.append(name)
        if changed:
            log.info("cloud repository %s: synced %s", self.uri, ", ".join(changed))
        return changed

    def _fetch_model(self, name: str, objects: tuple[tuple[str, int, str], ...]) -> None:
        staging = self.local / f".staging-{name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        started = time.monotonic()
        limits = Limits(max_bytes=MAX_BYTES, deadline_at=started + DEADLINE)
        prefix = self.source.location.key + name + "/"
        try:
            with deadline_scope(started + DEADLINE):
                for rel, size, _ in objects:
                    if rel.endswith("/"):
                        (staging / rel).mkdir(parents=True, exist_ok=True)
                        continue
                    target = staging / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    file = RemoteFile(rel, size, None, "none", (prefix + rel, None))
                    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                    try:
                        download(self.source, file, fd, limits, f"{self.uri}{name}/{rel}")
                    finally:
                        os.close(fd)
            old = self.local / f".old-{name}-{uuid.uuid4().hex[:8]}"
            current = self.local / name
            if current.exists():
                current.rename(old)
            staging.rename(current)
            shutil.rmtree(old, ignore_errors=True)
        except SourceError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise RepositoryUnavailable(f"failed to copy model '{name}' from {self.uri}: {exc.message}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    def close(self) -> None:
        self.client.close()


def check_uri(uri: str) -> None:
    """A cloud repository URI's form, before anything starts (ValueError with the reason)."""
    try:
        location = parse_s3(uri)
    except SourceError as exc:
        raise ValueError(f"--model-repository '{uri}': {exc.message}") from None
    if location.key and not location.is_folder and "." in location.key.rsplit("/", 1)[-1]:
        raise ValueError(f"--model-repository '{uri}' names an object; name the repository's folder")
