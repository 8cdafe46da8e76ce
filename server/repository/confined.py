"""Filesystem work beneath a directory file descriptor that no planted or swapped symlink can redirect.

Checking a path and then using it by name (``lstat`` then ``open``, ``resolve`` then ``read``) leaves a
gap in which whoever can write a folder on the way swaps a component for a symlink, and the use lands
elsewhere. Here nothing is used by name from a shared root: a relative path is walked one component at
a time from a directory file descriptor, each component opened with ``O_NOFOLLOW`` relative to the
previous one, and every later ``mkdir``, ``open``, ``rename`` and delete is made relative to the
descriptor of the folder it happens in. A folder renamed or swapped meanwhile cannot redirect what was
already opened; a symlink appearing on the way is seen as one.

Two ways of meeting a symlink:

* ``follow=False`` (the operator's writes and ``source.path`` copies): a symlink anywhere is refused;
* ``follow=True`` (the server's reads): a symlink is read (``readlinkat``) and its target walked the
  same way, one component at a time from descriptors already held, so it is taken only as long as it
  stays beneath the root; an absolute target counts when it names a place beneath the root's real path
  (Triton users write ``/models/<model>/...``). A repository that shares files between its models
  through symlinks keeps working; one that leads out is refused however the links are swapped.

Why the walk and not ``openat2(RESOLVE_BENEATH)`` (Linux 5.6+): it refuses absolute symlinks that stay
inside (above), it is not there on every kernel a cluster runs, and the walk's extra system calls
cost little next to a model load or a download (``benchmarks/confined_walk.py`` measures both). One code
path everywhere.

Errors: ``Refused`` (a ``PathEscape``) names the path asked for and the component that was refused;
callers turn it into their own message (``describe``). ``OverLimit`` (an ``OSError``) is a file over a
reader's ``max_bytes`` or a folder over a lister's ``limit``. Other ``OSError``s pass through.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .layout import PathEscape

#: symlinks followed in one walk before giving up (the kernel's own limit)
MAX_LINKS = 40
_CLOEXEC = os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
#: opening what may be a FIFO planted where a file belongs must not block
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC

SYMLINK, OUTSIDE, LOOP, DOTDOT = "symlink", "outside", "loop", "dotdot"


class Refused(PathEscape):
    """A walk that would pass a symlink (``SYMLINK``), leave the root through one (``OUTSIDE``) or through a
    '..' of the path itself (``DOTDOT``), or not end (``LOOP``)."""

    def __init__(self, kind: str, path: str, at: str) -> None:
        self.kind = kind
        #: the relative path that was asked for, and the component (relative to the root) refused
        self.path = path
        self.at = at
        super().__init__(self.describe(f"'{path}'"))

    def describe(self, what: str, inside: str = "the model repository") -> str:
        """One sentence naming ``what`` (e.g. "version 1 model file 'm/1/model.onnx'") and what is wrong."""
        if self.kind == SYMLINK:
            where = "is a symlink" if self.at == self.path else f"passes through the symlink '{self.at}'"
            return f"{what} {where}; only real files and folders are used here"
        if self.kind == OUTSIDE:
            return f"{what} leads outside {inside} through a symlink; symlinks must stay inside it"
        if self.kind == DOTDOT:
            return f"{what} leads outside {inside}"
        return f"{what} cannot be resolved: too many levels of symbolic links"


class OverLimit(OSError):
    """A file larger than a reader's ``max_bytes``, or a folder with more entries than a lister's ``limit``: refused
    before it is held in memory whole. Whoever writes a folder can make a sparse file of any size, or a folder of
    millions of entries, at no cost; an ``OSError``, so a caller that treats an unreadable file as stale does the
    same with this one."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EFBIG, message)


def parts_of(relative: str | Path) -> list[str]:
    """The components of a relative path; '.' and empty ones dropped (a walk handles '..' itself)."""
    text = str(relative)
    if text.startswith("/"):
        raise ValueError(f"'{text}' is not a relative path")
    return [p for p in text.split("/") if p not in ("", ".")]


def open_root(path: str | Path) -> int:
    """A descriptor for the root folder itself (a path the admin gave: its symlinks are followed)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)


def fd_path(fd: int) -> Path:
    """A path naming what ``fd`` has open, for libraries that take a path (``/proc/self/fd/N``).

    Opening it reopens that very file (or folder), wherever it was moved and whatever now has its old
    name; valid only in this process and while ``fd`` stays open.
    """
    return Path(f"/proc/self/fd/{fd}")


def real_path(fd: int) -> str:
    """Where ``fd`` is, as the kernel knows it now (for messages and for comparing absolute symlinks)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class _Walk:
    """One walk: a stack of folder descriptors from the root down to where the walk is."""

    def __init__(self, root_fd: int, relative: str | Path, follow: bool, start: tuple[int, str] | None) -> None:
        self.root_fd = root_fd
        self.asked = str(relative).strip("/") or "."
        self.pending = parts_of(relative)
        self.follow = follow
        self.stack: list[int] = []  # opened below the root (closed by ``close``)
        self.names: list[str] = []  # the components the stack stands for (messages)
        self.links = 0
        self.retries = 0
        self._root_real: str | None = None
        if start is not None:
            self.push(os.dup(start[0]), start[1])
            self.asked = f"{start[1]}/{self.asked}"

    @property
    def fd(self) -> int:
        return self.stack[-1] if self.stack else self.root_fd

    def at(self, name: str) -> str:
        return "/".join([*self.names, name])

    def close(self) -> None:
        while self.stack:
            os.close(self.stack.pop())
        self.names.clear()

    def up(self) -> None:
        if not self.stack:
            raise Refused(OUTSIDE if self.links else DOTDOT, self.asked, "..")
        os.close(self.stack.pop())
        self.names.pop()

    def push(self, fd: int, name: str) -> None:
        self.stack.append(fd)
        self.names.append(name)

    def link(self, name: str) -> None:
        """``name`` in the current folder is a symlink: refuse it, or queue its target's components."""
        if not self.follow:
            raise Refused(SYMLINK, self.asked, self.at(name))
        self.links += 1
        if self.links > MAX_LINKS:
            raise Refused(LOOP, self.asked, self.at(name))
        try:
            target = os.readlink(name, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOENT):  # swapped back to a real entry meanwhile: look again
                self.pending.insert(0, name)
                return
            raise
        if target.startswith("/"):
            if self._root_real is None:
                self._root_real = real_path(self.root_fd)
            root = self._root_real.rstrip("/")
            if target != root and not target.startswith(root + "/"):
                raise Refused(OUTSIDE, self.asked, self.at(name))
            self.close()
            target = target[len(root) :]
        self.pending[:0] = [p for p in target.split("/") if p not in ("", ".")]

    def next(self) -> str | None:
        """The next plain component to open, after taking every '..' on the way; None at the end."""
        while self.pending:
            name = self.pending.pop(0)
            if name == "..":
                self.up()
                continue
            return name
        return None

    def open(self, name: str, flags: int, mode: int) -> int | None:
        """``name`` opened beneath the current folder; None when it was a symlink that ``link`` took."""
        try:
            return os.open(name, flags | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                raise
            if _is_link(name, self.fd):
                self.link(name)
                return None
            if self.retries < MAX_LINKS:  # a link swapped back meanwhile: look again (bounded)
                self.retries += 1
                self.pending.insert(0, name)
                return None
            raise


def open_beneath(
    root_fd: int,
    relative: str | Path,
    flags: int = _READ,
    mode: int = 0o644,
    *,
    follow: bool = False,
    create_dirs: bool = False,
    dir_mode: int = 0o755,
    start: tuple[int, str] | None = None,
) -> int:
    """Open ``relative`` beneath ``root_fd`` (see the module docstring); returns a new descriptor.

    ``flags`` apply to the last component (``O_NOFOLLOW`` is always added); the folders on the way are
    opened as folders, and created (``mkdirat``, ``dir_mode``) when ``create_dirs`` (the last one too when
    ``flags`` hold ``O_DIRECTORY``). An empty path
    opens the root itself again. ``start`` (a descriptor beneath the root, and its path relative to the
    root) begins the walk there instead: the root stays the limit ('..' and symlinks may go up to it).
    Raises ``Refused``, or the ``OSError`` of the component that failed.
    """
    walk = _Walk(root_fd, relative, follow, start)
    try:
        while True:
            name = walk.next()
            if name is None:  # nothing asked, or '..' (or a symlink) brought the walk back to a folder
                if flags & os.O_CREAT:
                    raise IsADirectoryError(errno.EISDIR, f"'{walk.asked}' is a folder")
                return os.open(".", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC, dir_fd=walk.fd)
            if not walk.pending:  # the last component
                if create_dirs and flags & os.O_DIRECTORY:
                    try:
                        os.mkdir(name, dir_mode, dir_fd=walk.fd)
                    except FileExistsError:
                        pass
                fd = walk.open(name, flags, mode)
                if fd is not None:
                    return fd
                continue
            if create_dirs:
                try:
                    os.mkdir(name, dir_mode, dir_fd=walk.fd)
                except FileExistsError:
                    pass
            fd = walk.open(name, _DIR, 0)
            if fd is not None:
                walk.push(fd, name)
    finally:
        walk.close()


def open_dir(
    root_fd: int,
    relative: str | Path,
    *,
    follow: bool = False,
    create: bool = False,
    mode: int = 0o755,
    start: tuple[int, str] | None = None,
) -> int:
    """The folder ``relative`` beneath ``root_fd``; with ``create``, missing folders are made (``mode``)."""
    return open_beneath(root_fd, relative, _DIR, follow=follow, create_dirs=create, dir_mode=mode, start=start)


@contextmanager
def opened(fd: int) -> Iterator[int]:
    """``with opened(open_beneath(...)) as fd``: closes it afterwards."""
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(root_fd: int, relative: str | Path, *, follow: bool = False, start: tuple[int, str] | None = None) -> int:
    """A regular file beneath ``root_fd``, opened for reading; ``IsADirectoryError``/``OSError`` otherwise."""
    fd = open_beneath(root_fd, relative, _READ, follow=follow, start=start)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
            raise OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, f"'{relative}' is {kind}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int | None = None) -> bytes:
    """All of an open file from its start (``pread``: the descriptor's position stays), up to ``limit`` + 1."""
    chunks, offset = [], 0
    while True:
        want = 1 << 20 if limit is None else min(1 << 20, limit + 1 - offset)
        if want <= 0:
            break
        chunk = os.pread(fd, want, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_bytes(
    root_fd: int,
    relative: str | Path,
    *,
    follow: bool = False,
    start: tuple[int, str] | None = None,
    max_bytes: int | None = None,
) -> bytes:
    """The bytes of the regular file ``relative`` beneath ``root_fd``; ``OverLimit`` when it holds more than
    ``max_bytes`` (told by its size before anything is read, or by the read if it grows meanwhile)."""
    with opened(open_file(root_fd, relative, follow=follow, start=start)) as fd:
        if max_bytes is not None and os.fstat(fd).st_size > max_bytes:
            raise OverLimit(f"'{relative}' is larger than {max_bytes} bytes")
        data = read_fd(fd, max_bytes)
        if max_bytes is not None and len(data) > max_bytes:
            raise OverLimit(f"'{relative}' is larger than {max_bytes} bytes")
        return data


def write_new(dir_fd: int, name: str, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Create ``name`` in ``dir_fd`` (it must not exist: ``O_EXCL``, never through a symlink), write, fsync
    (unless not ``durable``)."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def create_new(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """A new empty file ``name`` in ``dir_fd``, open for reading and writing (``O_EXCL``, no symlink)."""
    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)


def fsync_dir(fd: int) -> None:
    os.fsync(fd)


def exists(dir_fd: int, name: str) -> bool:
    """Whether ``dir_fd`` holds an entry ``name`` (a symlink counts, whatever it points to)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def kind_of(dir_fd: int, name: str) -> str:
    """'dir', 'file', 'symlink', 'other' or '' (missing) for the entry ``name`` of ``dir_fd``, never followed."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def names(dir_fd: int, limit: int | None = None) -> list[str]:
    """The entry names of an open folder (``os.scandir`` on a descriptor: nothing re-resolved by path);
    ``OverLimit`` as soon as there are more than ``limit`` (the rest is never listed)."""
    with os.scandir(dir_fd) as it:
        if limit is None:
            return [e.name for e in it]
        found: list[str] = []
        for entry in it:
            if len(found) >= limit:
                raise OverLimit(f"the folder holds more than {limit} entries")
            found.append(entry.name)
        return found
