"""A cloud model repository (``--model-repository=s3://...``, ``gs://...``, ``as://...``) as Triton reads one: a
local copy per model.

Triton copies a remote model into a local folder before loading it. The server does the same with the shared
downloader: ``sync`` lists the repository (one paged listing of its prefix, through the scheme's
``RepositoryStore``, repository_stores.py), groups the objects by model folder, and brings each model whose objects
changed (paths, sizes, change tags: ETags, generations) into the local mirror: downloaded into a staging folder
beside it, then swapped in by two renames, so a scan sees either the old model or the new one. The registry then
serves the mirror like any local repository; in poll mode every poll syncs first, so a model changed in the store
is reloaded by the next poll, and one deleted from it is unloaded.

Credentials and endpoints are read as Triton reads them (repository_stores.py). The administrator names the
repository, so the egress guard here admits every address; connections still go through it, with its deadlines.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from .client import StoreClient
from .egress import AddressPolicy
from .errors import SourceError
from .guard import deadline_scope
from .repository_stores import (
    COPY_DEADLINE,
    RepositoryStore,
    RepositoryUnavailable,
    StoredObject,
    check_uri,
    open_store,
)
from .transfer import Limits, RemoteFile, download
from .uris import safe_relative

__all__ = ["CloudRepository", "RepositoryUnavailable", "check_uri"]

log = logging.getLogger("kubeinfer.sources.mirror")
#: objects one repository may list (a model store, not a data lake)
MAX_OBJECTS = 1_000_000
#: bytes the mirror may hold (the node's disk is the real bound)
MAX_BYTES = 1 << 42
#: one model's sync may take this long
DEADLINE = COPY_DEADLINE
_EVERYWHERE = AddressPolicy(allowed=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")))


def _signature(objects: list[StoredObject]) -> tuple[tuple[str, int, str], ...]:
    return tuple(sorted((o.path, o.size, o.tag) for o in objects))


class CloudRepository:
    """The local mirror of one cloud repository."""

    def __init__(
        self,
        uri: str,
        local: Path,
        *,
        client: StoreClient | None = None,
        store: RepositoryStore | None = None,
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self.uri = uri.rstrip("/") + "/"
        self.local = local
        self.client = client or StoreClient(_EVERYWHERE)
        try:
            self.store = store or open_store(uri, self.client, env)
        except BaseException:
            self.client.close()
            raise
        self._seen: dict[str, tuple[tuple[str, int, str], ...]] = {}
        local.mkdir(parents=True, exist_ok=True)

    def _listing(self) -> dict[str, list[StoredObject]]:
        """Model folder -> its objects (paths relative to the model's folder), from one listing of the repository."""
        models: dict[str, list[StoredObject]] = {}
        for item in self.store.list_objects(MAX_OBJECTS):
            if "/" not in item.path:
                continue  # a file beside the model folders: Triton ignores it too
            try:
                safe_relative(item.path)
            except SourceError:
                log.warning("skipping object %r of %s: not a plain relative path", item.path, self.uri)
                continue
            name, rel = item.path.split("/", 1)
            if rel:
                models.setdefault(name, []).append(dataclasses.replace(item, path=rel))
        return models

    def sync(self, names: list[str] | None = None) -> list[str]:
        """Bring the mirror in line with the repository (only ``names`` when given); the models changed."""
        listing = self._listing()
        wanted = set(listing) if names is None else {n for n in names if n in listing}
        changed = []
        for name in sorted(wanted):
            signature = _signature(listing[name])
            if self._seen.get(name) == signature and (self.local / name).is_dir():
                continue
            self._fetch_model(name, listing[name])
            self._seen[name] = signature
            changed.append(name)
        gone = [n for n in list(self._seen) if n not in listing and (names is None or n in names)]
        for name in gone:
            shutil.rmtree(self.local / name, ignore_errors=True)
            del self._seen[name]
            changed.append(name)
        if changed:
            log.info("cloud repository %s: synced %s", self.uri, ", ".join(changed))
        return changed

    def _fetch_model(self, name: str, objects: list[StoredObject]) -> None:
        staging = self.local / f".staging-{name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        started = time.monotonic()
        limits = Limits(max_bytes=MAX_BYTES, deadline_at=started + DEADLINE)
        reader = self.store.reader()
        try:
            with deadline_scope(started + DEADLINE):
                for item in objects:
                    target = staging / item.path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    file = RemoteFile(item.path, item.size, None, "none", item.locator)
                    fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                    try:
                        download(reader, file, fd, limits, f"{self.uri}{name}/{item.path}")
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
