"""Fair shares of the operator among namespaces: download slots and a byte quota on the volume.

kopf runs every handler in a small pool of worker threads. Without a cap, one namespace's slow
downloads (a server that sends a byte a minute) hold every thread and nothing else reconciles; with
it, a download over its namespace's share is not started: the model says ``Queued`` and kopf retries
it later, the thread goes back to the pool. The quota bounds what one namespace's models take on the
shared volume; its usage is measured by walking the namespace's folder at most once per ``ttl``
seconds and counted in between (a resync of unchanged models never walks anything). The walk goes
from folder descriptor to folder descriptor and never through a symlink, however the tenant swaps
its folders meanwhile (``folder_bytes``).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.server.repository.confined import open_dir, open_root, opened
from kubeinfer.server.repository.layout import PathEscape

from .artifacts import ArtifactError


class DownloadGate:
    """At most ``per_namespace`` downloads of one namespace and ``total`` overall at a time; never waits."""

    def __init__(self, per_namespace: int, total: int) -> None:
        self.per_namespace = per_namespace
        self.total = total
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, namespace: str) -> None:
        """Take a slot, or raise ArtifactError('Queued') saying which limit is reached."""
        with self._lock:
            mine = self._running.get(namespace, 0)
            if self.per_namespace > 0 and mine >= self.per_namespace:
                raise ArtifactError(
                    "Queued",
                    f"namespace '{namespace}' already runs {mine} downloads, the operator's limit per namespace; "
                    "this one starts when one of them ends",
                )
            if self.total > 0 and sum(self._running.values()) >= self.total:
                raise ArtifactError(
                    "Queued",
                    f"the operator already runs {self.total} downloads, its overall limit; "
                    "this one starts when one of them ends",
                )
            self._running[namespace] = mine + 1

    def release(self, namespace: str) -> None:
        with self._lock:
            left = self._running.get(namespace, 0) - 1
            if left > 0:
                self._running[namespace] = left
            else:
                self._running.pop(namespace, None)

    def running(self, namespace: str | None = None) -> int:
        with self._lock:
            return sum(self._running.values()) if namespace is None else self._running.get(namespace, 0)


#: entries (files and folders) a walk of a namespace's folder looks at: far more than its models and uploads
#: hold (a SavedModel is tens of files), and a bound on what a tenant that fills its folder with millions of
#: empty files makes the operator walk, once a ``ttl``, for every namespace with a quota
MAX_WALK_ENTRIES = 1_000_000


#: folder levels a walk goes down below the namespace's folder: far deeper than models and uploads nest (a
#: Python environment's site-packages is about ten); the walk holds one descriptor per level, so a folder
#: nested thousands deep cannot make it run out of them
MAX_WALK_DEPTH = 64


def folder_bytes(folder: Path, max_entries: int = MAX_WALK_ENTRIES) -> int | None:
    """Apparent size of the regular files below ``folder``; None when it holds more than ``max_entries``
    entries or folders nested deeper than ``MAX_WALK_DEPTH`` (the walk stops there).

    Whoever writes the namespace's folder (its uploads) can swap a folder for a symlink to anywhere (``/``,
    another namespace's folder) while the walk runs; a walk by path would then count, and list, what is
    there. So the walk is confined as the repository's readers are (``server/repository/confined.py``): a
    symlink is one entry, never followed or counted; each folder is opened relative to its parent's
    descriptor with ``O_NOFOLLOW`` (one swapped since its parent was listed is refused and left out) and
    listed through its own descriptor (one moved after it was opened is read where it is now). The
    namespace's folder itself is opened the same way below the root's: a symlink there counts nothing.
    """
    fresh: int | None
    try:
        with opened(open_root(folder.parent)) as parent:
            fresh = open_dir(parent, folder.name)
    except (PathEscape, FileNotFoundError, NotADirectoryError, PermissionError):
        return 0  # missing, not a folder, or a symlink: nothing of the namespace's is there
    total = 0
    seen = 0
    #: from the namespace's folder down to where the walk is: each level's descriptor and subfolders left
    levels: list[tuple[int, list[str]]] = []
    try:
        while fresh is not None or levels:
            if fresh is not None:  # a folder just opened: list it whole before going down (one listing open)
                levels.append((fresh, []))
                fresh = None
                if len(levels) > MAX_WALK_DEPTH + 1:
                    return None
                with os.scandir(levels[-1][0]) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > max_entries:
                            return None
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                levels[-1][1].append(entry.name)
                                continue
                            info = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(info.st_mode):
                            total += info.st_size
            here, subfolders = levels[-1]
            if not subfolders:
                os.close(levels.pop()[0])
                continue
            try:
                fresh = open_dir(here, subfolders.pop())
            except (PathEscape, FileNotFoundError, NotADirectoryError, PermissionError):
                fresh = None  # swapped for a symlink or a file, or removed, since its parent was listed
    finally:
        for fd, _ in levels:
            os.close(fd)
    return total


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


@dataclass
class _Usage:
    #: None: the folder holds more than ``max_entries`` entries, its usage is unknown
    measured: int | None
    at: float
    #: bytes written since the walk (published, or staged and not yet settled)
    added: int = 0


@dataclass
class NamespaceQuota:
    """Bytes a namespace's folder ``<root>/<namespace>`` may hold (0: no limit).

    Usage is the folder's apparent size (uploads included: it is the namespace's share of the volume),
    walked at most once per ``ttl`` seconds per namespace, plus what the operator wrote since. A
    removed model is seen at the next walk; between walks the figure is off by at most what was
    written or removed meanwhile.
    """

    root: Path
    default: int = 0
    overrides: Mapping[str, int] = field(default_factory=dict)
    ttl: float = 60.0
    max_entries: int = MAX_WALK_ENTRIES

    def __post_init__(self) -> None:
        self._usage: dict[str, _Usage] = {}
        self._lock = threading.Lock()
        self.walks = 0

    def limit(self, namespace: str) -> int:
        return self.overrides.get(namespace, self.default)

    def usage(self, namespace: str) -> int:
        """Bytes the namespace's folder holds; ArtifactError('QuotaExceeded') when it holds more entries than a
        walk looks at (unknown usage counts as over: nothing more is written until entries are removed)."""
        if not self.limit(namespace):
            return 0
        now = time.monotonic()
        with self._lock:
            seen = self._usage.get(namespace)
            if seen is not None and now - seen.at < self.ttl:
                return self._used(namespace, seen)
        measured = folder_bytes(self.root / namespace, self.max_entries)  # outside the lock: a walk may take a while
        with self._lock:
            self.walks += 1
            seen = self._usage[namespace] = _Usage(measured, now)  # staged files are on disk: the walk saw them
            return self._used(namespace, seen)

    def _used(self, namespace: str, seen: _Usage) -> int:
        if seen.measured is None:
            raise ArtifactError(
                "QuotaExceeded",
                f"namespace '{namespace}' has more than {self.max_entries} files and folders (or folders nested "
                f"deeper than {MAX_WALK_DEPTH}) on the repository volume, more than the operator counts for its "
                "quota; nothing was written: remove files (uploads, models) from its folder",
            )
        return seen.measured + seen.added

    def check(self, namespace: str, more: int = 0) -> None:
        """Raise ArtifactError('QuotaExceeded') when ``more`` bytes would put the namespace over its quota."""
        limit = self.limit(namespace)
        if not limit:
            return
        used = self.usage(namespace)
        if used + more > limit:
            need = f"; this version needs {_size(more)} more" if more else ""
            raise ArtifactError(
                "QuotaExceeded",
                f"namespace '{namespace}' uses {_size(used)} of its {_size(limit)} quota on the repository "
                f"volume{need}; nothing was written: delete models or uploads, or ask for a larger quota",
            )

    def add(self, namespace: str, nbytes: int) -> None:
        """Count ``nbytes`` written (or being written) for ``namespace``; refuse past the quota."""
        if not self.limit(namespace):
            return
        self.check(namespace, nbytes)
        with self._lock:
            seen = self._usage.get(namespace)
            if seen is not None:
                seen.added += nbytes

    def forget(self, namespace: str, nbytes: int) -> None:
        """Bytes counted by ``add`` that were thrown away (a failed sync removed its staging)."""
        with self._lock:
            seen = self._usage.get(namespace)
            if seen is not None:
                seen.added = max(0, seen.added - nbytes)
