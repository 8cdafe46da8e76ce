"""What the local cluster's scripts and scripts/images.py share: progress lines on stderr, a cache folder an
environment variable may move, a file lock, and a folder built once (atomically, under that lock)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def progress(prefix: str) -> Callable[[str], None]:
    """A ``log(msg)`` that writes ``[prefix] msg`` to stderr (stdout carries the scripts' results)."""

    def log(msg: str) -> None:
        print(f"[{prefix}] {msg}", file=sys.stderr, flush=True)

    return log


def cache_folder(env_var: str, default_name: str) -> Path:
    """``$env_var`` if set, else ``~/.cache/<default_name>``."""
    default = Path.home() / ".cache" / default_name
    return Path(os.environ.get(env_var) or default).expanduser()


@contextlib.contextmanager
def flock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created with its folder if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(target: Path, lock: Path, make: Callable[[Path], None]) -> bool:
    """Make the folder ``target`` unless it is complete: ``make(tmp)`` fills a fresh sibling folder, which gets a
    ``.complete`` marker and is renamed into place, all under the file lock ``lock``. An interrupted build is never
    reused, and of two processes the second waits and finds the first one's. Returns whether it built now."""
    done = target / ".complete"
    if done.exists():
        return False
    with flock(lock):
        if done.exists():  # someone else built it while we waited
            return False
        tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            make(tmp)
            (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True
