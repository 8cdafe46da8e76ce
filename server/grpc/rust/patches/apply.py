#!/usr/bin/env python3
"""Lay out the patched crates Cargo.toml's ``[patch.crates-io]`` points at: ``server/grpc/rust/patched/<crate>``.

    python3 server/grpc/rust/patches/apply.py

Each entry of ``PATCHES`` is a crate as published on crates.io (the ``.crate`` file cargo downloads, checked
against the checksum crates.io lists for it) plus a small diff from this folder (README.md says what each
fixes and when to drop it). The folder is generated, git-ignored, and laid out again only when the crate, its
checksum or the diff changed (a stamp file says which); setup.py runs this before cargo builds the extension,
and scripts/cargo before the checks. A diff that no longer applies (its context lines are not in the crate's
source) is an error naming the file: the crate moved on, so look whether it fixed the bug. Stdlib only.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CRATE_DIR = HERE.parent
OUT = CRATE_DIR / "patched"


@dataclass(frozen=True)
class Patch:
    crate: str
    version: str
    #: sha256 of the .crate file, as crates.io's index (and Cargo.lock) lists it
    checksum: str
    diffs: tuple[str, ...]


PATCHES = (
    Patch(
        "h2",
        "0.4.20",
        "7d29020232d6aa3fb1daca64c1127cf662cf97f254ae16c18c05b8ab635fc118",
        ("h2-window-update-after-goaway.patch",),
    ),
)


class PatchError(RuntimeError):
    pass


def cargo_home() -> Path:
    return Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")


def cached_crate(patch: Patch) -> bytes | None:
    """The .crate file from cargo's download cache, if one there has the published checksum."""
    for path in sorted((cargo_home() / "registry" / "cache").glob(f"*/{patch.crate}-{patch.version}.crate")):
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == patch.checksum:
            return data
    return None


def fetch(patch: Patch) -> bytes:
    """The .crate file, downloaded by cargo (which checks it against the registry's checksum) when not cached."""
    data = cached_crate(patch)
    if data is not None:
        return data
    cargo = find_cargo()
    with tempfile.TemporaryDirectory(prefix="kubeinfer-fetch-") as tmp:
        manifest = Path(tmp) / "Cargo.toml"
        manifest.write_text(
            f'[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n[lib]\npath = "lib.rs"\n'
            f'[dependencies]\n{patch.crate} = "={patch.version}"\n'
        )
        (Path(tmp) / "lib.rs").write_text("")
        done = subprocess.run([cargo, "fetch", "--manifest-path", str(manifest)], capture_output=True, text=True)
        if done.returncode != 0:
            raise PatchError(f"cargo fetch of {patch.crate} {patch.version} failed:\n{done.stderr[-3000:]}")
    data = cached_crate(patch)
    if data is None:
        raise PatchError(f"{patch.crate}-{patch.version}.crate with sha256 {patch.checksum} is not in cargo's cache")
    return data


def apply_diff(root: Path, diff: str, name: str) -> None:
    """Apply a unified diff whose hunks each match exactly one place (their context and removed lines)."""
    files: list[tuple[str, list[list[str]]]] = []
    for line in diff.splitlines():
        if line.startswith("+++ "):
            files.append((line[4:].split("\t")[0].removeprefix("b/"), []))
        elif line.startswith("@@"):
            files[-1][1].append([])
        elif files and files[-1][1] and line[:1] in (" ", "-", "+", ""):
            files[-1][1][-1].append(line)
    for path, hunks in files:
        target = root / path
        text = target.read_text()
        for hunk in hunks:
            old = "".join(line[1:] + "\n" for line in hunk if line[:1] in (" ", "-", ""))
            new = "".join(line[1:] + "\n" for line in hunk if line[:1] in (" ", "+", ""))
            if text.count(old) != 1:
                raise PatchError(
                    f"{name} does not apply to {path}: the crate changed there (has it fixed the bug? see "
                    f"{(HERE / 'README.md').relative_to(CRATE_DIR.parents[2])})"
                )
            text = text.replace(old, new)
        target.write_text(text)


def stamp(patch: Patch) -> str:
    diffs = {name: hashlib.sha256((HERE / name).read_bytes()).hexdigest() for name in patch.diffs}
    return json.dumps({"crate": patch.crate, "version": patch.version, "checksum": patch.checksum, "diffs": diffs})


def lay_out(patch: Patch) -> bool:
    """``patched/<crate>``; True when it was (re)written."""
    dest = OUT / patch.crate
    marker = dest / ".kubeinfer-patched"
    want = stamp(patch)
    if marker.exists() and marker.read_text() == want:
        return False
    data = fetch(patch)
    with tempfile.TemporaryDirectory(prefix=f".{patch.crate}-", dir=OUT) as tmp:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            if hasattr(tarfile, "data_filter"):  # 3.10.12+, 3.11.4+: no paths outside tmp, no odd files
                tf.extractall(tmp, filter="data")
            else:
                tf.extractall(tmp)
        unpacked = Path(tmp) / f"{patch.crate}-{patch.version}"
        for name in patch.diffs:
            apply_diff(unpacked, (HERE / name).read_text(), name)
        (unpacked / ".kubeinfer-patched").write_text(want)
        shutil.rmtree(dest, ignore_errors=True)
        unpacked.rename(dest)
    return True


def find_cargo() -> str:
    found = shutil.which(os.environ.get("CARGO", "cargo"))
    if found is None and (cargo_home() / "bin" / "cargo").exists():
        found = str(cargo_home() / "bin" / "cargo")
    if found is None:
        raise PatchError("cargo is not on PATH")
    return found


def main() -> int:
    OUT.mkdir(exist_ok=True)
    try:
        with open(OUT / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two builds of this checkout at once lay it out once
            for patch in PATCHES:
                if lay_out(patch):
                    print(f"patches/apply.py: laid out {patch.crate} {patch.version} + {', '.join(patch.diffs)}")
    except PatchError as exc:
        print(f"patches/apply.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
