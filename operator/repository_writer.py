"""Writes a rendered model into a server's repository folder, following the server's atomic-write contract.

See ``kubeinfer.server.repository.layout``: everything is built under dot-names (which the server
ignores), fsynced, and renamed into place by ``kubeinfer.server.repository.publish``; a new version
goes in before the config that may select it (config last); removals rename to a dot-name first.
Every artifact of a sync is fetched and checked before anything visible changes, so a failed
download, checksum or ONNX check leaves what is served untouched. Stale dot-named leftovers of a
crashed writer are removed at the start of every sync.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.server.config import ConfigError, check_file_name
from kubeinfer.server.config.platforms import backend_for
from kubeinfer.server.repository import publish
from kubeinfer.server.repository.layout import (
    CONFIG_FILE,
    PathEscape,
    check_model_name,
    is_version_dir_name,
    resolve_inside,
)
from kubeinfer.server.vocabulary.errors import InvalidArgument

from . import artifacts
from .artifacts import ArtifactError
from .fetch import Fetch, Fetcher
from .onnx_check import DEFAULT_CHECK_TIMEOUT, check_onnx
from .render import RenderedModel, Source

#: dot-named record of where a version folder's file came from (the server ignores dot files)
SOURCE_MARKER = ".kubeinfer-source.json"


@dataclass
class SyncResult:
    created_model: bool = False
    added_versions: list[int] = field(default_factory=list)
    replaced_versions: list[int] = field(default_factory=list)
    removed_versions: list[int] = field(default_factory=list)
    config_changed: bool = False
    cleaned: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(
            self.created_model
            or self.added_versions
            or self.replaced_versions
            or self.removed_versions
            or self.config_changed
        )


def check_model_name_for_writer(name: str) -> None:
    try:
        check_model_name(name)
    except InvalidArgument as exc:
        raise ArtifactError("PathRejected", str(exc)) from None


def check_file_name_for_writer(name: str) -> None:
    """The config validator's file-name rule, again right where the name is joined to a folder."""
    try:
        check_file_name(name, "default_model_filename")
    except ConfigError as exc:
        raise ArtifactError("PathRejected", str(exc)) from None


#: seconds a server folder's listing of dot-names is shared between models' leftover checks
LISTING_TTL = 2.0


class RepositoryWriter:
    """File operations on ``<root>/<server subPath>/<model>``; blocking, call from a worker thread."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = artifacts.DEFAULT_MAX_BYTES,
        timeout: float = 60.0,
        fetcher: Fetcher | None = None,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ) -> None:
        self.root = root.resolve()
        self.max_bytes = max_bytes
        self.timeout = timeout
        #: one connection pool and one set of egress rules for every download (see fetch.py)
        self.fetcher = fetcher or Fetcher(timeout=timeout)
        self.check_timeout = check_timeout
        self._listings: dict[Path, tuple[float, list[str]]] = {}
        self._listing_guard = threading.Lock()

    # -------------------------------------------------------------------------------------- paths
    def server_dir(self, namespace: str, subpath: str, create: bool = True) -> Path:
        """The folder ``subpath`` (relative to the volume) of a server in ``namespace``.

        Tenant isolation on the shared volume: objects of a namespace write only below
        ``<root>/<namespace>/``, so ``subpath`` must start with that folder; no component may be empty,
        '.', '..' or hidden, and none may be a symlink (checked again after resolving, too).
        """
        rel = Path(subpath)
        if rel.is_absolute() or not rel.parts or any(p.startswith(".") for p in rel.parts) or "\\" in subpath:
            raise ArtifactError(
                "PathRejected",
                f"repository folder '{subpath}' must be a relative path without '.', '..' or hidden parts",
            )
        if rel.parts[0] != namespace or len(rel.parts) < 2:
            raise ArtifactError(
                "PathRejected",
                f"repository folder '{subpath}' is outside the folder of namespace '{namespace}' on the volume "
                f"('{namespace}/...'): a namespace's servers and models live only there",
            )
        current = self.root
        for part in rel.parts:
            current = current / part
            if current.is_symlink():
                raise ArtifactError("PathRejected", f"repository folder '{subpath}' passes through a symlink")
            if create and not current.exists():
                current.mkdir(mode=0o755)
        self._confine(self.root / namespace, current, f"repository folder '{subpath}'")
        return current

    def namespace_dir(self, server_dir: Path) -> Path:
        """``<root>/<namespace>`` of a folder ``server_dir`` returned (always below it)."""
        return self.root / server_dir.relative_to(self.root).parts[0]

    @staticmethod
    def _confine(root: Path, path: Path, what: str, inside: str = "its namespace's folder") -> Path:
        try:
            return resolve_inside(root, path, what, inside)
        except PathEscape as exc:
            raise ArtifactError("PathRejected", str(exc)) from None

    def _model_dir(self, server_dir: Path, name: str) -> Path:
        """``server_dir/name``, refusing a symlink there or at a version folder or config.pbtxt inside it.

        The operator owns these paths; a symlink planted by anyone with write access to the volume would
        make the renames and writes below land in another tenant's folder.
        """
        check_model_name_for_writer(name)
        model_dir = server_dir / name
        if model_dir.is_symlink():
            raise ArtifactError(
                "PathRejected",
                f"'{model_dir.relative_to(self.root)}' is a symlink; the operator writes only real folders",
            )
        if model_dir.is_dir():
            for entry in os.scandir(model_dir):
                if entry.is_symlink() and (is_version_dir_name(entry.name) or entry.name == CONFIG_FILE):
                    raise ArtifactError(
                        "PathRejected",
                        f"'{model_dir.relative_to(self.root)}/{entry.name}' is a symlink; remove it "
                        "(the operator writes only real files and folders)",
                    )
        self._confine(server_dir, model_dir, "model folder", "its server's folder")
        return model_dir

    # ----------------------------------------------------------------------------------- inspection
    def versions_on_disk(self, server_dir: Path, name: str) -> list[int]:
        model_dir = server_dir / name
        if not model_dir.is_dir():
            return []
        return sorted(int(e.name) for e in os.scandir(model_dir) if e.is_dir() and is_version_dir_name(e.name))

    def _hidden_entries(self, server_dir: Path) -> list[str]:
        """Dot-names in a server folder, listed at most once per LISTING_TTL for all its models.

        A resync checks every model for leftovers; listing a folder of N models for each of them costs
        O(N²) (0.8 ms per model at 1,000 models). A leftover seen a moment late is removed next time;
        one already gone is a no-op (each model's own staging happens under its lock, after this).
        """
        now = time.monotonic()
        with self._listing_guard:
            hit = self._listings.get(server_dir)
        if hit is not None and now - hit[0] < LISTING_TTL:
            return hit[1]
        try:
            names = [e.name for e in os.scandir(server_dir) if e.name.startswith(".")]
        except (FileNotFoundError, NotADirectoryError):
            names = []
        with self._listing_guard:
            self._listings[server_dir] = (now, names)
        return names

    def clean_stale(self, server_dir: Path, name: str) -> list[str]:
        """Delete dot-named leftovers of an interrupted write of this model."""
        removed = []
        candidates = [server_dir / e for e in self._hidden_entries(server_dir) if publish.leftover_of(e) == name]
        model_dir = server_dir / name
        if model_dir.is_dir() and not model_dir.is_symlink():
            for e in model_dir.iterdir():
                owner = publish.leftover_of(e.name)
                if owner is not None and (is_version_dir_name(owner) or owner == CONFIG_FILE):
                    candidates.append(e)
        for entry in candidates:
            publish.remove_tree(entry)
            removed.append(str(entry.relative_to(self.root)))
        return removed

    # -------------------------------------------------------------------------------------- staging
    def _fetch(self, source: Source, dest: Path, namespace_dir: Path, fetch: Fetch) -> None:
        namespace = namespace_dir.name
        fetch.check_quota(namespace)
        if source.uri:
            self.fetcher.precheck(source.uri, namespace)  # refusals that need no connection, no slot
            headers = fetch.headers(source.credentials_secret, source.uri) if source.credentials_secret else None
            fetch.take_slot(namespace)
            with open(dest, "wb") as out:
                self.fetcher.download(
                    source.uri,
                    source.sha256 or "",
                    out,
                    namespace=namespace,
                    max_bytes=self.max_bytes,
                    headers=headers,
                    cancelled=fetch.cancelled,
                    on_bytes=lambda n: fetch.count(namespace, n),
                )
                out.flush()
                os.fsync(out.fileno())
        elif source.path:
            size = artifacts.copy_from_volume(
                namespace_dir, source.path, source.sha256, dest, max_bytes=self.max_bytes, cancelled=fetch.cancelled
            )
            fetch.count(namespace, size)  # charged after the copy (at most max_bytes over, then removed)

    def _stage_version(
        self, folder: Path, model: RenderedModel, version: int, namespace_dir: Path, fetch: Fetch
    ) -> None:
        """Fill an (invisible) version folder: the model file and the source marker."""
        folder.mkdir(exist_ok=True)
        source = model.versions[version]
        if model.filename:
            check_file_name_for_writer(model.filename)
            try:
                self._fetch(source, folder / model.filename, namespace_dir, fetch)
            except ArtifactError as exc:
                raise ArtifactError(exc.reason, f"version {version}: {exc.message}", version) from None
            except OSError as exc:  # the volume is full, read-only, gone: a condition, not a crashed handler
                raise ArtifactError(
                    "WriteFailed",
                    f"version {version}: writing {model.filename} to the repository volume failed: "
                    f"{exc.strerror or exc}; free space on the volume or fix its permissions",
                    version,
                ) from None
        publish.write_file(folder / SOURCE_MARKER, json.dumps(source.as_dict(), sort_keys=True))
        publish.fsync_dir(folder)

    def _version_current(self, folder: Path, model: RenderedModel, version: int) -> bool:
        try:
            recorded = json.loads((folder / SOURCE_MARKER).read_text())
        except (OSError, ValueError):
            return False
        if recorded != model.versions[version].as_dict():
            return False
        return not model.filename or (folder / model.filename).is_file()

    def _check(self, model: RenderedModel, files: dict[int, Path]) -> None:
        if backend_for(model.config) != "onnxruntime":
            return
        problems = []
        for version, path in sorted(files.items()):
            problems += check_onnx(path, model.config, version, timeout=self.check_timeout)
        if problems:
            raise ArtifactError("ConfigMismatch", "; ".join(problems) + "; fix spec.inputs/outputs or the model file")

    # ----------------------------------------------------------------------------------------- sync
    def sync_model(
        self,
        server_dir: Path,
        model: RenderedModel,
        on_stage: Callable[[int], None] | None = None,
        fetch: Fetch | None = None,
    ) -> SyncResult:
        """Make ``server_dir/<model>`` match ``model``; all-or-nothing for the fetches and checks."""
        fetch = fetch or Fetch()
        model_dir = self._model_dir(server_dir, model.name)
        result = SyncResult(cleaned=self.clean_stale(server_dir, model.name))
        namespace_dir = self.namespace_dir(server_dir)
        if not model_dir.is_dir():
            self._create_model(server_dir, model, on_stage, fetch)
            result.created_model = True
            result.added_versions = sorted(model.versions)
            return result
        stale = [v for v in sorted(model.versions) if not self._version_current(model_dir / str(v), model, v)]
        config_path = model_dir / CONFIG_FILE
        old_text = config_path.read_text(encoding="utf-8") if config_path.exists() else None
        config_changed = old_text != model.config_text
        staged: dict[int, Path] = {}
        try:
            for version in stale:
                folder = publish.stage_dir(model_dir, str(version))
                staged[version] = folder
                self._stage_version(folder, model, version, namespace_dir, fetch)
                if on_stage:
                    on_stage(version)
            if staged or config_changed:
                files = {}
                if model.filename:
                    for v in model.versions:
                        folder = staged.get(v, model_dir / str(v))
                        files[v] = folder / model.filename
                self._check(model, files)
        except BaseException:
            for folder in staged.values():
                publish.remove_tree(folder)
            raise
        for version, folder in sorted(staged.items()):
            if publish.publish_dir(folder, model_dir / str(version)):
                result.replaced_versions.append(version)
            else:
                result.added_versions.append(version)
        if config_changed:  # config last: the versions it may select are already in place
            publish.replace_file(config_path, model.config_text)
            result.config_changed = True
        for version in self.versions_on_disk(server_dir, model.name):
            if version not in model.versions:
                publish.retire(model_dir / str(version))
                result.removed_versions.append(version)
        return result

    def _create_model(
        self, server_dir: Path, model: RenderedModel, on_stage: Callable[[int], None] | None, fetch: Fetch
    ) -> None:
        staging = publish.stage_dir(server_dir, model.name)
        try:
            for version in sorted(model.versions):
                self._stage_version(staging / str(version), model, version, self.namespace_dir(server_dir), fetch)
                if on_stage:
                    on_stage(version)
            if model.filename:
                self._check(model, {v: staging / str(v) / model.filename for v in model.versions})
            publish.write_file(staging / CONFIG_FILE, model.config_text)
            publish.publish_dir(staging, server_dir / model.name)
        except BaseException:
            publish.remove_tree(staging)
            raise

    def remove_model(self, server_dir: Path, name: str) -> bool:
        check_model_name_for_writer(name)
        self.clean_stale(server_dir, name)
        model_dir = server_dir / name
        if not model_dir.exists() and not model_dir.is_symlink():
            return False
        publish.retire(model_dir)
        return True
