"""Atomic publish into a model repository: build under a dot-name, fsync, rename into place.

Every writer (the operator's repository writer, ``kubeinfer convert``) goes through these functions so
that the contract in ``layout`` holds the same way everywhere: the server never sees a half-written
file or folder, and what was renamed into place survives a power cut (file and folder fsyncs).

One naming convention for what is not published yet: ``.<final name>.<kind>-<hex>`` with kind
``staging`` (a folder being built), ``tmp`` (a file being written) or ``deleting`` (a retired folder
being removed). The server ignores dot-names; ``leftover_of`` lets a writer's cleanup find the debris of
an interrupted write and tell which model, version or file it belonged to.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path

STAGING, TMP, DELETING = "staging", "tmp", "deleting"
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(staging|tmp|deleting)-[0-9a-f]+$")


def hidden_name(name: str, kind: str) -> str:
    """A fresh dot-name for ``name`` while it is being staged, written or deleted."""
    return f".{name}.{kind}-{secrets.token_hex(4)}"


def leftover_of(entry: str) -> str | None:
    """The final name a staging/tmp/deleting leftover belongs to; None for anything else."""
    m = _LEFTOVER.match(entry)
    return m["name"] if m else None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: str | bytes) -> None:
    """Write and fsync one file (inside a staged folder, or as the tmp of ``replace_file``)."""
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def stage_dir(parent: Path, name: str) -> Path:
    """A new, empty, invisible folder in ``parent`` that will become ``parent/name``."""
    staged = parent / hidden_name(name, STAGING)
    staged.mkdir()
    return staged


def publish_dir(staged: Path, target: Path) -> bool:
    """Rename the filled ``staged`` folder to ``target``; an existing ``target`` is retired. True if replaced.

    The old folder is renamed away just before the new one goes in and deleted only after, so the gap
    in which ``target`` is missing is two renames long.
    """
    fsync_dir(staged)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(hidden_name(target.name, DELETING))
        os.rename(target, old)
    try:
        os.rename(staged, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        remove_tree(old)
    return old is not None


def replace_file(target: Path, data: str | bytes) -> None:
    """Write ``target`` atomically: a fsynced tmp file next to it, ``os.replace``, then the folder fsync."""
    tmp = target.with_name(hidden_name(target.name, TMP))
    try:
        write_file(tmp, data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def retire(path: Path) -> None:
    """Unpublish: rename to a dot-name (the server stops seeing it at once), then delete."""
    hidden = path.with_name(hidden_name(path.name, DELETING))
    os.rename(path, hidden)
    fsync_dir(path.parent)
    remove_tree(hidden)
