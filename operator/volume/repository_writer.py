"""Writes a rendered model into a server's repository folder, following the server's atomic-write contract.

See ``kubeinfer.server.repository.layout``: everything is built under dot-names, fsynced, and renamed
into place by ``kubeinfer.server.repository.publish``; a new version goes in before the config that may
select it (config last); removals rename to a dot-name first. Every artifact of a sync is fetched and
checked before anything visible changes, so a failed download, checksum or ONNX check leaves what is
served untouched.

Symlink-proof (``kubeinfer.server.repository.confined``): a tenant may write its own namespace folder
while the operator works in it. So every folder is opened once, walked from the volume root's
descriptor one component at a time without following a symlink, and every mkdir, create, rename and
delete is made relative to a held descriptor. Staging (and the deletion of retired folders) happens in
``<root>/.kubeinfer-staging/<server folder>/``, outside every namespace folder, where no tenant reaches
(a namespace's own claim mounts only ``<root>/<namespace>/``); the finished folder is renamed from there
into the server folder (one filesystem). Stale leftovers of a crashed writer, there or (from older
operators) beside the model, are removed at the start of every sync.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.server.config import ConfigError, check_file_name
from kubeinfer.server.config.platforms import backend_for, model_is_folder
from kubeinfer.server.repository import confined, publish
from kubeinfer.server.repository.layout import CONFIG_FILE, check_model_name, is_version_dir_name
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.vocabulary.errors import InvalidArgument

from ..api.model_types import Source
from ..sources import archives, artifacts
from ..sources.artifacts import ArtifactError
from ..sources.fetch import Fetch, Fetcher
from ..sources.onnx_check import DEFAULT_CHECK_TIMEOUT, check_onnx
from ..sources.store_sources import StoreSources, is_store_uri
from .rendered import RenderedModel

#: dot-named record of where a version folder's file came from (the server ignores dot files)
SOURCE_MARKER = ".kubeinfer-source.json"
#: a folder model's archive while it is unpacked beside the folder (removed before the version is published)
ARCHIVE_FILE = ".kubeinfer-archive"
#: the operator's own folder at the volume root: staging and deletion happen here, mirroring server folders
STAGING_DIR = ".kubeinfer-staging"
#: bytes of a source marker read back (a real one is a few hundred: the source's uri or path and sha256). A
#: tenant writes its folders too: a larger marker (a sparse file of any size costs it nothing) is stale, and the
#: version is written again without it being read
MAX_MARKER_BYTES = 64 << 10
#: entries listed of one folder on the volume (a server folder holds one per model, a model folder one per
#: version). A tenant can fill its folders with millions at no cost; past this a sync is refused with
#: TooManyEntries naming the folder, rather than holding (and walking) the listing whole on every resync
MAX_FOLDER_ENTRIES = 100_000


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


def _entries(fd: int, out: list[object], prefix: str, limit: int) -> list[tuple[str, bool]]:
    """Append (name, mode, inode, size, ctime) of each entry of the open folder ``fd`` to ``out``; returns
    (name, is a real folder) for each. ``confined.OverLimit`` past ``limit`` entries."""
    found = []
    with os.scandir(fd) as it:
        listed: list[os.DirEntry[str]] = []
        for entry in it:
            if len(listed) >= limit:
                raise confined.OverLimit(f"the folder holds more than {limit} entries")
            listed.append(entry)
        for entry in sorted(listed, key=lambda e: e.name):
            st = entry.stat(follow_symlinks=False)
            out.append((prefix, entry.name, st.st_mode, st.st_ino, st.st_size, st.st_ctime_ns))
            found.append((entry.name, stat.S_ISDIR(st.st_mode)))
    return found


def _listed(fd: int, shown: Path, limit: int) -> list[str]:
    """The names in the open folder ``fd`` (``shown`` on the volume), at most ``limit``: more is the
    condition TooManyEntries, never a listing held whole."""
    try:
        return confined.names(fd, limit)
    except confined.OverLimit:
        raise ArtifactError(
            "TooManyEntries",
            f"'{shown}' holds more than {limit} entries, more than the operator lists of one folder; "
            "remove what does not belong there",
        ) from None


def _rejected(exc: confined.Refused, base: Path) -> ArtifactError:
    """A refused walk as a PathRejected condition naming the path on the volume."""
    return ArtifactError(
        "PathRejected", exc.describe(f"'{base / exc.path}'").replace("only real files and folders are used here", _REAL)
    )


_REAL = "the operator writes only real files and folders"


@dataclass
class _Place:
    """Descriptors for one server folder: the volume root, the folder, and its mirror in the staging area."""

    rel: Path
    root: int
    server: int
    staging: int

    def close(self) -> None:
        for fd in (self.staging, self.server, self.root):
            os.close(fd)


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
        max_entries: int = MAX_FOLDER_ENTRIES,
        stores: StoreSources | None = None,
        ambient_s3_namespaces: tuple[str, ...] = (),
        ambient_gcs_namespaces: tuple[str, ...] = (),
        ambient_azure_namespaces: tuple[str, ...] = (),
    ) -> None:
        self.root = root.resolve()
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.timeout = timeout
        #: one connection pool and one set of egress rules for every download (see fetch.py)
        self.fetcher = fetcher or Fetcher(timeout=timeout)
        #: s3:// and oci:// sources, under the same egress rules as the https downloads
        self.stores = stores or StoreSources(
            StoreClient(
                self.fetcher.policy,
                self.fetcher.hosts,
                timeout=self.fetcher.timeout,
                ca_file=self.fetcher.ca_file,
                resolve=self.fetcher.resolve,
            ),
            deadline=self.fetcher.deadline,
            ambient_s3_namespaces=ambient_s3_namespaces,
            ambient_gcs_namespaces=ambient_gcs_namespaces,
            ambient_azure_namespaces=ambient_azure_namespaces,
        )
        self.check_timeout = check_timeout
        self._listings: dict[tuple[str, Path], tuple[float, list[str]]] = {}
        self._listing_guard = threading.Lock()

    # -------------------------------------------------------------------------------------- paths
    def server_dir(self, namespace: str, subpath: str, create: bool = True) -> Path:
        """The folder ``subpath`` (relative to the volume) of a server in ``namespace``.

        Tenant isolation on the shared volume: objects of a namespace write only below
        ``<root>/<namespace>/``, so ``subpath`` must start with that folder; no component may be empty,
        '.', '..' or hidden, and none may be a symlink (the folders are walked and made by descriptor).
        A missing folder is fine without ``create``.
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
        with self._root() as root:
            try:
                os.close(confined.open_dir(root, rel, create=create))
            except confined.Refused:
                raise ArtifactError("PathRejected", f"repository folder '{subpath}' passes through a symlink") from None
            except FileNotFoundError:
                if create:
                    raise
            except NotADirectoryError:
                raise ArtifactError("PathRejected", f"repository folder '{subpath}' is not a folder") from None
        return self.root / rel

    def namespace_dir(self, server_dir: Path) -> Path:
        """``<root>/<namespace>`` of a folder ``server_dir`` returned (always below it)."""
        return self.root / server_dir.relative_to(self.root).parts[0]

    @contextmanager
    def _root(self) -> Iterator[int]:
        with confined.opened(confined.open_root(self.root)) as fd:
            yield fd

    @contextmanager
    def _place(self, server_dir: Path) -> Iterator[_Place]:
        """Open ``server_dir`` (no symlink on the way) and its staging mirror (made if missing, 0700)."""
        rel = server_dir.relative_to(self.root)
        root = confined.open_root(self.root)
        try:
            server = confined.open_dir(root, rel)
        except confined.Refused as exc:
            os.close(root)
            raise _rejected(exc, Path()) from None
        except BaseException:
            os.close(root)
            raise
        try:
            staging = confined.open_dir(root, Path(STAGING_DIR) / rel, create=True, mode=0o700)
        except BaseException as exc:
            os.close(server)
            os.close(root)
            if isinstance(exc, confined.Refused):
                raise _rejected(exc, Path()) from None
            raise
        place = _Place(rel, root, server, staging)
        try:
            yield place
        finally:
            place.close()

    def _model_dir(self, place: _Place, name: str) -> int | None:
        """The model folder, opened; None when missing. Refuses a symlink there or at a version folder or
        config.pbtxt inside it, with a message that says what to remove (the descriptors make the writes
        safe whatever is planted later; this says why a sync cannot go on)."""
        shown = place.rel / name
        kind = confined.kind_of(place.server, name)
        if kind == "":
            return None
        if kind == "symlink":
            raise ArtifactError("PathRejected", f"'{shown}' is a symlink; the operator writes only real folders")
        if kind != "dir":
            raise ArtifactError("PathRejected", f"'{shown}' is not a folder; remove it")
        try:
            fd = confined.open_dir(place.server, name)
        except confined.Refused as exc:
            raise _rejected(exc, place.rel) from None
        except NotADirectoryError:
            raise ArtifactError(
                "PathRejected", f"'{shown}' is a symlink; the operator writes only real folders"
            ) from None
        except FileNotFoundError:
            return None
        try:
            for entry in _listed(fd, shown, self.max_entries):
                if (is_version_dir_name(entry) or entry == CONFIG_FILE) and confined.kind_of(fd, entry) == "symlink":
                    raise ArtifactError("PathRejected", f"'{shown}/{entry}' is a symlink; remove it ({_REAL})")
        except BaseException:
            os.close(fd)
            raise
        return fd

    # ----------------------------------------------------------------------------------- inspection
    def versions_on_disk(self, server_dir: Path, name: str) -> list[int]:
        with self._root() as root:
            try:
                fd = confined.open_dir(root, server_dir.relative_to(self.root) / name)
            except (OSError, confined.Refused):
                return []
            with confined.opened(fd):
                try:
                    return self._versions(fd)
                except confined.OverLimit:  # over the listing cap: the sync's condition says so
                    return []

    def fingerprint(self, server_dir: Path, name: str) -> tuple[object, ...] | None:
        """What a sync of ``server_dir/name`` would look at, cheaply: every entry of the model folder and of its
        version folders with its kind, inode, size and change time (never following a symlink; the change time
        moves with any write, rename or ``utime``). Equal fingerprints: the folder was not touched in between,
        so a sync would change nothing. None when the folder cannot be walked (missing, a symlink on the way).
        """
        return self.snapshot(server_dir, name)[1]

    def snapshot(self, server_dir: Path, name: str) -> tuple[list[int], tuple[object, ...] | None]:
        """``versions_on_disk`` and ``fingerprint`` from one walk of the model folder (what a render leaves is
        looked at once: a walk from the volume's root is several opens)."""
        rel = server_dir.relative_to(self.root) / name
        out: list[object] = []
        versions: list[int] = []
        try:
            with self._root() as root, confined.opened(confined.open_dir(root, rel)) as model_fd:
                st = os.fstat(model_fd)
                out.append((st.st_ino, st.st_ctime_ns))
                for entry, kind in _entries(model_fd, out, "", self.max_entries):
                    if kind and is_version_dir_name(entry):
                        versions.append(int(entry))
                        with confined.opened(confined.open_dir(model_fd, entry)) as version_fd:
                            _entries(version_fd, out, entry, self.max_entries)
        except (OSError, confined.Refused):
            return [], None
        return sorted(versions), tuple(out)

    def _versions(self, model_fd: int) -> list[int]:
        """The version folders of the open model folder (``confined.OverLimit`` past ``max_entries`` entries)."""
        return sorted(
            int(n)
            for n in confined.names(model_fd, self.max_entries)
            if is_version_dir_name(n) and confined.kind_of(model_fd, n) == "dir"
        )

    def _hidden_entries(self, where: str, place: _Place, fd: int) -> list[str]:
        """Dot-names in a server folder (``where`` "server") or its staging mirror ("staging"), listed at most
        once per LISTING_TTL for all its models.

        A resync checks every model for leftovers; listing a folder of N models for each of them costs
        O(N²). A leftover seen a moment late is removed next time;
        one already gone is a no-op (each model's own staging happens under its lock, after this).
        """
        now = time.monotonic()
        key = (where, place.rel)
        with self._listing_guard:
            hit = self._listings.get(key)
        if hit is not None and now - hit[0] < LISTING_TTL:
            return hit[1]
        shown = Path(STAGING_DIR) / place.rel if where == "staging" else place.rel
        names = [n for n in _listed(fd, shown, self.max_entries) if n.startswith(".")]
        with self._listing_guard:
            self._listings[key] = (now, names)
        return names

    def clean_stale(self, server_dir: Path, name: str) -> list[str]:
        """Delete leftovers of an interrupted write of this model (see ``_clean_stale``)."""
        with self._place(server_dir) as place:
            return self._clean_stale(place, name)

    def _clean_stale(self, place: _Place, name: str) -> list[str]:
        """Delete leftovers of an interrupted write of this model: staged, tmp and deleting dot-names of the
        model in the staging mirror and of its versions and config in the mirror's model folder; and, from
        operators that staged beside the model, the same names in the server and model folders."""
        removed = []
        staging_rel = Path(STAGING_DIR) / place.rel
        for where, fd, shown in (("staging", place.staging, staging_rel), ("server", place.server, place.rel)):
            for entry in self._hidden_entries(where, place, fd):
                if publish.leftover_of(entry) == name:
                    publish.remove_tree(fd, entry)
                    removed.append(str(shown / entry))
        for fd, shown in ((place.staging, staging_rel), (place.server, place.rel)):
            if confined.kind_of(fd, name) != "dir":
                continue
            try:
                model_fd = confined.open_dir(fd, name)
            except (OSError, confined.Refused):
                continue
            with confined.opened(model_fd):
                for entry in _listed(model_fd, shown / name, self.max_entries):
                    owner = publish.leftover_of(entry)
                    if owner is not None and (is_version_dir_name(owner) or owner == CONFIG_FILE):
                        publish.remove_tree(model_fd, entry)
                        removed.append(str(shown / name / entry))
        return removed

    # -------------------------------------------------------------------------------------- staging
    def _fetch(
        self, source: Source, dest_fd: int, place: _Place, fetch: Fetch, version: int, archive: bool = False
    ) -> None:
        """Fill the open staged file ``dest_fd``: a download (after the namespace's quota, the egress rules that
        need no connection and a download slot), or a copy of a file in the namespace's folder. Its bytes and
        seconds go to ``fetch.fetched`` (waiting for a download slot is not part of them).

        An ``archive`` (to be unpacked) from the namespace's folder takes a download slot too: unpacking is
        long work of a worker thread like a download, and must not escape the namespace's share of them."""
        namespace = place.rel.parts[0]
        fetch.check_quota(namespace)
        if archive and source.path:
            fetch.take_slot(namespace)
        started = time.monotonic()
        if source.uri:
            self.fetcher.precheck(source.uri, namespace)  # refusals that need no connection, no slot
            headers = fetch.headers(source.credentials_secret, source.uri) if source.credentials_secret else None
            fetch.take_slot(namespace)
            started = time.monotonic()
            with os.fdopen(os.dup(dest_fd), "wb") as out:
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
            try:
                ns_fd = confined.open_dir(place.root, namespace)
            except confined.Refused as exc:
                raise _rejected(exc, Path()) from None
            with confined.opened(ns_fd):
                size = artifacts.copy_from_volume(
                    ns_fd,
                    source.path,
                    source.sha256,
                    dest_fd,
                    namespace=namespace,
                    max_bytes=self.max_bytes,
                    cancelled=fetch.cancelled,
                )
            fetch.count(namespace, size)  # charged after the copy (at most max_bytes over, then removed)
        fetch.fetched.append((version, os.fstat(dest_fd).st_size, time.monotonic() - started))

    def _stage_version(self, folder: int, model: RenderedModel, version: int, place: _Place, fetch: Fetch) -> None:
        """Fill an (invisible) version folder, open as ``folder``: the model file and the source marker."""
        source = model.versions[version]
        if model.filename:
            check_file_name_for_writer(model.filename)
            try:
                if is_store_uri(source.uri):
                    self._fill_from_store(folder, model, source, version, place, fetch)
                elif model_is_folder(model.config):
                    self._stage_folder(folder, model.filename, source, version, place, fetch)
                else:
                    with confined.opened(confined.create_new(folder, model.filename)) as dest:
                        self._fetch(source, dest, place, fetch, version)
            except ArtifactError as exc:
                raise ArtifactError(exc.reason, f"version {version}: {exc.message}", version) from None
            except OSError as exc:  # the volume is full, read-only, gone: a condition, not a crashed handler
                raise ArtifactError(
                    "WriteFailed",
                    f"version {version}: writing {model.filename} to the repository volume failed: "
                    f"{exc.strerror or exc}; free space on the volume or fix its permissions",
                    version,
                ) from None
        # not fsynced: the server never reads it, and one a crash left empty or torn is read as stale
        # (``_version_current``), so the version is fetched again; one fsync less per version written
        publish.write_file(folder, SOURCE_MARKER, json.dumps(source.as_dict(), sort_keys=True), durable=False)
        publish.fsync_dir(folder)

    def _fill_from_store(
        self, folder: int, model: RenderedModel, source: Source, version: int, place: _Place, fetch: Fetch
    ) -> None:
        """An s3:// or oci:// source fills the version folder (``store_sources``)."""
        namespace = place.rel.parts[0]
        fetch.check_quota(namespace)
        self.stores.precheck(source, namespace)  # refusals that need no connection, no slot
        started = time.monotonic()
        served = self.stores.fill(
            source,
            folder,
            model.filename,
            model_is_folder(model.config),
            namespace=namespace,
            fetch=fetch,
            max_bytes=self.max_bytes,
        )
        fetch.fetched.append((version, served.size, time.monotonic() - started))
        fetch.served[version] = served.pinned

    def _stage_folder(self, folder: int, name: str, source: Source, version: int, place: _Place, fetch: Fetch) -> None:
        """A folder model (a SavedModel): its source is a tar archive, fetched beside the folder under a dot-name,
        unpacked into ``name`` (``archives``: within the download's byte limit and deadline, stopped when the
        model goes away) and removed."""
        archive = ARCHIVE_FILE
        with confined.opened(confined.create_new(folder, archive)) as packed:
            self._fetch(source, packed, place, fetch, version, archive=True)
            os.mkdir(name, 0o755, dir_fd=folder)
            with confined.opened(confined.open_dir(folder, name)) as dest:
                shown = f"source.{'uri' if source.uri else 'path'} '{source.uri or source.path}'"
                size = archives.unpack(
                    packed,
                    dest,
                    shown=shown,
                    max_bytes=self.max_bytes,
                    cancelled=fetch.cancelled,
                    deadline=time.monotonic() + self.fetcher.deadline,  # as long as a download may take
                )
        os.unlink(archive, dir_fd=folder)
        fetch.count(place.rel.parts[0], size)  # the unpacked files are on the volume too

    def _version_current(self, model_fd: int, model: RenderedModel, version: int) -> bool:
        try:
            with confined.opened(confined.open_dir(model_fd, str(version))) as folder:
                recorded = json.loads(confined.read_bytes(folder, SOURCE_MARKER, max_bytes=MAX_MARKER_BYTES))
                if recorded != model.versions[version].as_dict():
                    return False
                kind = "dir" if model_is_folder(model.config) else "file"
                return not model.filename or confined.kind_of(folder, model.filename) == kind
        except (OSError, ValueError, confined.Refused):
            return False

    def _check(self, model: RenderedModel, files: dict[int, tuple[int, str]], shown: Path) -> None:
        """ONNX check of each version's file, ``(folder descriptor, relative path)``, read through its descriptor."""
        if backend_for(model.config) != "onnxruntime":
            return
        problems: list[str] = []
        for version, (folder, rel) in sorted(files.items()):
            try:
                fd = confined.open_file(folder, rel)
            except confined.Refused as exc:
                raise _rejected(exc, shown) from None
            with confined.opened(fd):
                problems += check_onnx(fd, model.config, version, name=rel, timeout=self.check_timeout)
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
        """Make ``server_dir/<model>`` match ``model``; all-or-nothing for the fetches and checks.

        Whatever goes wrong on the volume is an ArtifactError (a condition), never a crashed handler: a
        rename that meets an entry someone planted meanwhile is ``WriteFailed``, a symlink ``PathRejected``.
        """
        fetch = fetch or Fetch()
        check_model_name_for_writer(model.name)
        try:
            return self._sync(server_dir, model, on_stage, fetch)
        except confined.Refused as exc:
            raise _rejected(exc, server_dir.relative_to(self.root)) from None
        except OSError as exc:
            raise ArtifactError(
                "WriteFailed",
                f"writing model '{model.name}' into '{server_dir.relative_to(self.root)}' failed: "
                f"{exc.strerror or exc}; it is retried (check the volume's space and permissions, and that "
                "nothing else writes the model's folder)",
            ) from None

    def _sync(
        self, server_dir: Path, model: RenderedModel, on_stage: Callable[[int], None] | None, fetch: Fetch
    ) -> SyncResult:
        with self._place(server_dir) as place:
            model_fd = self._model_dir(place, model.name)
            if model_fd is None:
                result = SyncResult(cleaned=self._clean_stale(place, model.name))
                self._create_model(place, model, on_stage, fetch)
                result.created_model = True
                result.added_versions = sorted(model.versions)
                return result
            with confined.opened(model_fd):
                result = SyncResult(cleaned=self._clean_stale(place, model.name))
                mirror = confined.open_dir(place.staging, model.name, create=True, mode=0o700)
                with confined.opened(mirror):
                    self._update_model(place, model_fd, mirror, model, result, on_stage, fetch)
            return result

    def _update_model(
        self,
        place: _Place,
        model_fd: int,
        mirror: int,
        model: RenderedModel,
        result: SyncResult,
        on_stage: Callable[[int], None] | None,
        fetch: Fetch,
    ) -> None:
        """Stage changed versions in ``mirror`` (the model's staging folder), check, publish, config last."""
        stale = [v for v in sorted(model.versions) if not self._version_current(model_fd, model, v)]
        # a config.pbtxt longer than the rendered one differs from it: replaced without being read (a tenant's
        # sparse file of any size costs nothing here)
        wanted = len(model.config_text.encode("utf-8"))
        try:
            old_text: str | None = confined.read_bytes(model_fd, CONFIG_FILE, max_bytes=wanted).decode("utf-8")
        except FileNotFoundError:
            old_text = None
        except confined.Refused as exc:
            raise _rejected(exc, place.rel / model.name) from None
        except (OSError, UnicodeDecodeError):
            old_text = ""  # unreadable or larger: replace it
        config_changed = old_text != model.config_text
        staged: dict[int, str] = {}
        try:
            for version in stale:
                name, folder = publish.stage_dir(mirror, str(version))
                staged[version] = name
                with confined.opened(folder):
                    self._stage_version(folder, model, version, place, fetch)
                if on_stage:
                    on_stage(version)
            if (staged or config_changed) and model.filename:
                files = {
                    v: (mirror, f"{staged[v]}/{model.filename}") if v in staged else (model_fd, f"{v}/{model.filename}")
                    for v in model.versions
                }
                self._check(model, files, place.rel / model.name)
        except BaseException:
            for name in staged.values():
                publish.remove_tree(mirror, name)
            raise
        for version, name in sorted(staged.items()):
            if publish.publish_dir(mirror, name, model_fd, str(version), trash_fd=mirror):
                result.replaced_versions.append(version)
            else:
                result.added_versions.append(version)
        if config_changed:  # config last: the versions it may select are already in place
            publish.replace_file(model_fd, CONFIG_FILE, model.config_text, tmp_fd=mirror)
            result.config_changed = True
        for version in self._versions(model_fd):
            if version not in model.versions:
                publish.retire(model_fd, str(version), trash_fd=mirror)
                result.removed_versions.append(version)

    def _create_model(
        self, place: _Place, model: RenderedModel, on_stage: Callable[[int], None] | None, fetch: Fetch
    ) -> None:
        staged, staging = publish.stage_dir(place.staging, model.name)
        try:
            with confined.opened(staging):
                for version in sorted(model.versions):
                    os.mkdir(str(version), 0o755, dir_fd=staging)
                    with confined.opened(confined.open_dir(staging, str(version))) as folder:
                        self._stage_version(folder, model, version, place, fetch)
                    if on_stage:
                        on_stage(version)
                if model.filename:
                    files = {v: (staging, f"{v}/{model.filename}") for v in model.versions}
                    self._check(model, files, Path(STAGING_DIR) / place.rel / staged)
                publish.write_file(staging, CONFIG_FILE, model.config_text)
            publish.publish_dir(place.staging, staged, place.server, model.name, trash_fd=place.staging)
        except BaseException:
            publish.remove_tree(place.staging, staged)
            raise

    def remove_model(self, server_dir: Path, name: str) -> bool:
        """Retire ``server_dir/name`` (moved into the staging area, then deleted); False when there is none.

        Whatever has the name is moved as it is: a symlink planted there is removed, never what it points to.
        """
        check_model_name_for_writer(name)
        try:
            with self._place(server_dir) as place:
                try:
                    self._clean_stale(place, name)
                except ArtifactError as exc:
                    if exc.reason != "TooManyEntries":
                        raise
                    # a folder over the listing cap keeps its leftovers; the model goes all the same
                if confined.exists(place.staging, name):  # the model's staging mirror
                    publish.retire(place.staging, name)
                if not confined.exists(place.server, name):
                    return False
                publish.retire(place.server, name, trash_fd=place.staging)
                return True
        except FileNotFoundError:
            return False
