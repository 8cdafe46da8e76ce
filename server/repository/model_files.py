"""What the server reads from a model's folder, opened once through a descriptor confined to the repository.

A model folder is opened beneath the repository root (``confined``: symlinks are taken only while they
stay inside), and every file the load reads is opened beneath that descriptor: config.pbtxt at scan
time; at load time the model file, label files, op libraries, warm-up data and initial-state files.
What is read is what the descriptor has open: a symlink swapped in after the check cannot redirect it.

Two limits: the repository (model files, version folders, label files: a repository may share them
between its models through symlinks) and the model's own folder (op libraries, ``warmup/`` and
``initial_state/`` files, which Triton looks for there).

Libraries that take a path (onnxruntime, torch, TensorRT, ``importlib``) get the descriptor's
``/proc/self/fd/N`` path through ``pinned``: while a version loads (``ModelFolder.loading``), a backend
asks ``pinned(<its model file's path>)`` and gets a path that opens exactly the file opened here; outside
a load (a tool, a test calling a backend directly) the path comes back unchanged.

A folder a library reads as a whole (a TensorFlow SavedModel: ``saved_model.pb``, ``variables/``,
``assets/``) gets ``pinned_tree``: every file in it opened here beneath the repository, and a private
folder (mode 0700, nobody else can change it) mirroring the tree whose files are symlinks to those
descriptors' ``/proc/self/fd/N``; the library opens the mirror, and every file it reads is one opened here.

Shared libraries are the exception: ``dlopen`` takes a path it has seen before for the library it loaded
then (glibc matches loaded objects by name first), and ``/proc/self/fd/N`` names another file once N is
reused. ``library`` copies the bytes read through the descriptor into a private temporary folder under a
name used once, and hands that path over.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import confined
from .layout import PathEscape

MODEL_FOLDER = "the model's folder"
REPOSITORY = "the model repository"

#: files and folder levels one ``pin_tree`` takes (a SavedModel holds a handful; a folder symlinked into
#: itself must not walk forever)
MAX_TREE_FILES = 10_000
MAX_TREE_DEPTH = 16

_loading: dict[str, tuple[ModelFolder, str]] = {}
_library_ids = itertools.count()
_loading_guard = threading.Lock()


class ModelFolder:
    """``<repository>/<name>``, opened beneath the repository root; ``close`` (or ``with``) releases it all."""

    def __init__(self, repository: Path, name: str) -> None:
        self.repository = repository
        self.name = name
        #: where the folder is, for messages and for what Triton hands Python models (``model_repository``)
        self.path = repository / name
        self.root = confined.open_root(repository)
        try:
            self.fd = confined.open_dir(self.root, name, follow=True)
        except confined.Refused as exc:
            os.close(self.root)
            raise PathEscape(exc.describe(f"model folder '{name}'")) from None
        except BaseException:
            os.close(self.root)
            raise
        self._pins: dict[tuple[str, bool], int] = {}
        self._libraries: str | None = None  # private temporary folder of ``library`` copies
        #: ``pin_tree`` mirrors by relative path: (private folder, the descriptors its symlinks name)
        self._trees: dict[str, tuple[str, list[int]]] = {}
        self._guard = threading.Lock()

    def __enter__(self) -> ModelFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._guard:
            pins, self._pins = list(self._pins.values()), {}
            libraries, self._libraries = self._libraries, None
            trees, self._trees = list(self._trees.values()), {}
        for fd in pins:
            os.close(fd)
        if libraries is not None:  # what dlopen mapped stays mapped
            shutil.rmtree(libraries, ignore_errors=True)
        for mirror, fds in trees:  # what a library read at load it keeps; the mirror goes
            shutil.rmtree(mirror, ignore_errors=True)
            for fd in fds:
                os.close(fd)
        if self.fd >= 0:
            os.close(self.fd)
            os.close(self.root)
            self.fd = -1

    # ------------------------------------------------------------------------------------- opening
    def _open(self, relative: str, what: str, own: bool, directory: bool = False) -> int:
        """``relative`` (to the model folder) opened beneath the model folder (``own``) or the repository."""
        try:
            if own:
                if directory:
                    return confined.open_dir(self.fd, relative, follow=True)
                return confined.open_file(self.fd, relative, follow=True)
            start = (self.fd, self.name)
            if directory:
                return confined.open_dir(self.root, relative, follow=True, start=start)
            return confined.open_file(self.root, relative, follow=True, start=start)
        except confined.Refused as exc:
            shown = relative if own else f"{self.name}/{relative}"
            raise PathEscape(exc.describe(f"{what} '{shown}'", MODEL_FOLDER if own else REPOSITORY)) from None

    def read(self, relative: str, what: str, *, own: bool = True, max_bytes: int | None = None) -> bytes:
        """The bytes of ``relative``; ``PathEscape`` for a symlink leading out, ``OSError`` when unreadable
        (``confined.OverLimit`` when it holds more than ``max_bytes``: told by its size, never read whole)."""
        with confined.opened(self._open(relative, what, own)) as fd:
            if max_bytes is not None and os.fstat(fd).st_size > max_bytes:
                raise confined.OverLimit(f"it is larger than {max_bytes} bytes")
            data = confined.read_fd(fd, max_bytes)
            if max_bytes is not None and len(data) > max_bytes:
                raise confined.OverLimit(f"it is larger than {max_bytes} bytes")
            return data

    def pin(self, relative: str, what: str, *, own: bool = True, directory: bool = False) -> Path:
        """A ``/proc/self/fd/N`` path for ``relative``, opened once and held until ``close``."""
        key = (relative, directory)
        with self._guard:
            fd = self._pins.get(key)
            if fd is None:
                fd = self._pins[key] = self._open(relative, what, own, directory)
        return confined.fd_path(fd)

    def pin_tree(self, relative: str, what: str) -> Path:
        """A private folder mirroring the folder ``relative`` (relative to the model folder, beneath the
        repository): its subfolders are real folders, its files symlinks to the ``/proc/self/fd/N`` of a
        descriptor opened here (held until ``close``). Symlinks in the tree are taken while they stay inside
        the repository, as everywhere; anything but files and folders (FIFOs, devices) is left out."""
        with self._guard:
            found = self._trees.get(relative)
        if found is not None:
            return Path(found[0])
        mirror = tempfile.mkdtemp(prefix="kubeinfer-model-tree-")
        fds: list[int] = []
        try:
            self._mirror(relative, what, Path(mirror), fds, 0)
        except BaseException:
            shutil.rmtree(mirror, ignore_errors=True)
            for fd in fds:
                os.close(fd)
            raise
        with self._guard:
            self._trees[relative] = (mirror, fds)
        return Path(mirror)

    def _mirror(self, relative: str, what: str, into: Path, fds: list[int], depth: int) -> None:
        start = (self.fd, self.name)

        def opened(path: str) -> int:
            try:
                return confined.open_beneath(self.root, path, follow=True, start=start)
            except confined.Refused as exc:
                raise PathEscape(exc.describe(f"{what} '{self.name}/{path}'", REPOSITORY)) from None

        with confined.opened(opened(relative)) as fd:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise NotADirectoryError(errno.ENOTDIR, f"'{self.name}/{relative}' is not a folder")
            entries = sorted(confined.names(fd))
        for name in entries:
            path = f"{relative}/{name}"
            fd = opened(path)
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                os.close(fd)
                if depth >= MAX_TREE_DEPTH:
                    raise OSError(errno.ELOOP, f"'{self.name}/{path}' is more than {MAX_TREE_DEPTH} folders deep")
                (into / name).mkdir(mode=0o700)
                self._mirror(path, what, into / name, fds, depth + 1)
            elif stat.S_ISREG(mode):
                fds.append(fd)
                if len(fds) > MAX_TREE_FILES:
                    raise OSError(errno.EMFILE, f"'{self.name}/{relative}' holds more than {MAX_TREE_FILES} files")
                os.set_blocking(fd, True)
                os.symlink(confined.fd_path(fd), into / name)
            else:
                os.close(fd)

    def library(self, relative: str, what: str) -> Path:
        """A path for ``dlopen``: a private copy, under a name never used before, of ``relative`` (a file in the
        model's folder) as read through its descriptor. It lasts until ``close``."""
        data = self.read(relative, what)
        with self._guard:
            if self._libraries is None:
                self._libraries = tempfile.mkdtemp(prefix="kubeinfer-op-libraries-")
            folder = self._libraries
        path = Path(folder) / f"{next(_library_ids)}-{Path(relative).name}"
        with confined.opened(confined.open_root(folder)) as fd:
            confined.write_new(fd, path.name, data, mode=0o500)
        return path

    def real_path(self) -> Path:
        """Where the folder is now (to tell whether an absolute path names a file inside it)."""
        return Path(confined.real_path(self.fd))

    # ------------------------------------------------------------------------------------- loading
    @contextmanager
    def loading(self, version_path: Path, version: int) -> Iterator[None]:
        """While a version loads, ``pinned`` answers for the files in ``version_path`` (this folder's
        ``<version>`` folder) with descriptors of this folder."""
        key = str(version_path)
        with _loading_guard:
            _loading[key] = (self, str(version))
        try:
            yield
        finally:
            with _loading_guard:
                if _loading.get(key, (None, ""))[0] is self:
                    del _loading[key]


def pinned_tree(path: Path) -> Path:
    """The path a library should open for the folder ``path`` in a version folder (a SavedModel): while that
    version loads, ``ModelFolder.pin_tree``'s mirror of it, else ``path`` itself.

    Raises ``PathEscape`` when a file in it leads out of the repository (the load fails with that reason).
    """
    with _loading_guard:
        found = _loading.get(str(path.parent))
    if found is None:
        return path
    folder, version = found
    return folder.pin_tree(f"{version}/{path.name}", f"version {version} model folder")


def pinned(path: Path, directory: bool = False) -> Path:
    """The path a library should open for ``path`` (a version folder's file, or with ``directory`` the
    version folder itself): its ``/proc/self/fd/N`` while that version loads, else ``path`` itself.

    Raises ``PathEscape`` when the file leads out of the repository (the load fails with that reason).
    """
    with _loading_guard:
        found = _loading.get(str(path if directory else path.parent))
    if found is None:
        return path
    folder, version = found
    if directory:
        return folder.pin(version, f"version folder {version}", own=False, directory=True)
    return folder.pin(f"{version}/{path.name}", f"version {version} model file", own=False)
