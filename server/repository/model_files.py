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

Shared libraries are the exception: ``dlopen`` takes a path it has seen before for the library it loaded
then (glibc matches loaded objects by name first), and ``/proc/self/fd/N`` names another file once N is
reused. ``library`` copies the bytes read through the descriptor into a private temporary folder under a
name used once, and hands that path over.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import confined
from .layout import PathEscape

MODEL_FOLDER = "the model's folder"
REPOSITORY = "the model repository"

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
        self._guard = threading.Lock()

    def __enter__(self) -> ModelFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._guard:
            pins, self._pins = list(self._pins.values()), {}
            libraries, self._libraries = self._libraries, None
        for fd in pins:
            os.close(fd)
        if libraries is not None:  # what dlopen mapped stays mapped
            shutil.rmtree(libraries, ignore_errors=True)
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

    def read(self, relative: str, what: str, *, own: bool = True) -> bytes:
        """The bytes of ``relative``; ``PathEscape`` for a symlink leading out, ``OSError`` when unreadable."""
        with confined.opened(self._open(relative, what, own)) as fd:
            return confined.read_fd(fd)

    def pin(self, relative: str, what: str, *, own: bool = True, directory: bool = False) -> Path:
        """A ``/proc/self/fd/N`` path for ``relative``, opened once and held until ``close``."""
        key = (relative, directory)
        with self._guard:
            fd = self._pins.get(key)
            if fd is None:
                fd = self._pins[key] = self._open(relative, what, own, directory)
        return confined.fd_path(fd)

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
