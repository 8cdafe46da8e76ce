"""Atomic publish into a model repository: build under a dot-name, fsync, rename into place.

Every writer (the operator's repository writer, ``kubeinfer convert``, the example repository) goes
through these functions so that the contract in ``layout`` holds the same way everywhere: the server
never sees a half-written file or folder, and what was renamed into place survives a power cut (file
and folder fsyncs).

Every function works on directory file descriptors and names in them (``confined``): a folder is
opened once, and each create, rename and delete is made relative to its descriptor, never through a
path that someone could swap for a symlink in between. Staged folders, tmp files and retired folders may
live in another folder than their target (``trash``/``tmp`` descriptors; the operator keeps them in a
folder tenants cannot reach); ``rename`` between two folders of one filesystem is as atomic as within one.
After a rename only the folder that gained the published name is fsynced: the folder it left (a staging or
trash folder) can at worst show a dot-name again after a power cut, debris every writer's cleanup removes
(``leftover_of``) and the server never reads, so one fsync per publish is saved on the operator's create path.

One naming convention for what is not published yet: ``.<final name>.<kind>-<hex>`` with kind
``staging`` (a folder being built), ``tmp`` (a file being written) or ``deleting`` (a retired folder
being removed). The server ignores dot-names; ``leftover_of`` lets a writer's cleanup find the debris of
an interrupted write and tell which model, version or file it belonged to.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable

from . import confined

STAGING, TMP, DELETING = "staging", "tmp", "deleting"
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(staging|tmp|deleting)-[0-9a-f]+$")


def hidden_name(name: str, kind: str) -> str:
    """A fresh dot-name for ``name`` while it is being staged, written or deleted."""
    return f".{name}.{kind}-{secrets.token_hex(4)}"


def leftover_of(entry: str) -> str | None:
    """The final name a staging/tmp/deleting leftover belongs to; None for anything else."""
    m = _LEFTOVER.match(entry)
    return m["name"] if m else None


def fsync_dir(fd: int) -> None:
    os.fsync(fd)


def write_file(dir_fd: int, name: str, data: str | bytes, durable: bool = True) -> None:
    """Create, write and fsync the new file ``name`` in ``dir_fd`` (inside a staged folder, or a tmp). Not
    ``durable``: no fsync, for a file whose loss in a crash costs a redo and nothing else (its folder's fsync
    still keeps its name)."""
    confined.write_new(dir_fd, name, data.encode("utf-8") if isinstance(data, str) else data, durable=durable)


def remove_tree(dir_fd: int, name: str) -> None:
    """Delete ``name`` in ``dir_fd``: a folder with everything in it, or a file or symlink, never following one.

    Folders are emptied by descriptor, and a folder found inside is first renamed up into ``dir_fd`` (under
    a dot-name of the same owner, so ``leftover_of`` still finds it) and emptied there: at most two folders
    are open at a time however deep the tree, and a link planted inside is removed, never what it points
    to. Best effort, as ``rmtree(ignore_errors=True)``: what cannot be deleted stays for the next cleanup.
    """
    owner = leftover_of(name) or name
    pending = [name]
    while pending:
        entry = pending.pop()
        if confined.kind_of(dir_fd, entry) != "dir":
            _quietly(os.unlink, entry, dir_fd)
            continue
        try:
            fd = confined.open_dir(dir_fd, entry)
        except (OSError, confined.Refused):
            continue
        with confined.opened(fd):
            for inner in confined.names(fd):
                if confined.kind_of(fd, inner) == "dir":
                    moved = hidden_name(owner, DELETING)
                    try:
                        os.rename(inner, moved, src_dir_fd=fd, dst_dir_fd=dir_fd)
                        pending.append(moved)
                    except OSError:
                        pass
                else:
                    _quietly(os.unlink, inner, fd)
        _quietly(os.rmdir, entry, dir_fd)


def _quietly(remove: Callable[..., None], name: str, dir_fd: int) -> None:
    try:
        remove(name, dir_fd=dir_fd)
    except OSError:
        pass


def stage_dir(parent_fd: int, name: str, mode: int = 0o755) -> tuple[str, int]:
    """A new, empty, invisible folder in ``parent_fd`` that will become ``name``: its dot-name and a descriptor."""
    staged = hidden_name(name, STAGING)
    os.mkdir(staged, mode, dir_fd=parent_fd)
    return staged, confined.open_dir(parent_fd, staged)


def publish_dir(src_fd: int, staged: str, dst_fd: int, name: str, trash_fd: int | None = None) -> bool:
    """Rename the filled folder ``staged`` (in ``src_fd``) to ``name`` in ``dst_fd``. True if one was replaced.

    An existing ``name`` is renamed away (into ``trash_fd``, default ``dst_fd``) just before the new one
    goes in and deleted only after, so the gap in which ``name`` is missing is two renames long. Whatever
    is at ``name`` (a folder, a file, a symlink someone planted) is moved as it is, never followed.
    """
    with confined.opened(confined.open_dir(src_fd, staged)) as fd:
        os.fsync(fd)
    trash = dst_fd if trash_fd is None else trash_fd
    old = None
    if confined.exists(dst_fd, name):
        old = hidden_name(name, DELETING)
        os.rename(name, old, src_dir_fd=dst_fd, dst_dir_fd=trash)
    try:
        os.rename(staged, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
    except BaseException:
        if old is not None:
            os.rename(old, name, src_dir_fd=trash, dst_dir_fd=dst_fd)
        raise
    os.fsync(dst_fd)  # src and trash hold dot-names only: debris at worst (see above)
    if old is not None:
        remove_tree(trash, old)
    return old is not None


def replace_file(dir_fd: int, name: str, data: str | bytes, tmp_fd: int | None = None) -> None:
    """Write ``name`` in ``dir_fd`` atomically: a fsynced tmp file (in ``tmp_fd``, default ``dir_fd``), a
    rename over ``name`` (a symlink there is replaced, never followed), then the folder fsync."""
    where = dir_fd if tmp_fd is None else tmp_fd
    tmp = hidden_name(name, TMP)
    try:
        write_file(where, tmp, data)
        os.rename(tmp, name, src_dir_fd=where, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=where)
        except FileNotFoundError:
            pass
        raise
    os.fsync(dir_fd)


def retire(dir_fd: int, name: str, trash_fd: int | None = None) -> None:
    """Unpublish: rename ``name`` to a dot-name (into ``trash_fd``; the server stops seeing it at once), then delete."""
    trash = dir_fd if trash_fd is None else trash_fd
    hidden = hidden_name(name, DELETING)
    os.rename(name, hidden, src_dir_fd=dir_fd, dst_dir_fd=trash)
    os.fsync(dir_fd)  # the name is gone from where the server looks; the trash holds debris at worst
    remove_tree(trash, hidden)
