"""The quota walk is confined to the namespace's folder (operator/sources/quota.py ``folder_bytes``, issue 37).

Whoever writes a namespace's folder (its uploads) can plant symlinks, and swap a folder for one while the
operator walks it. The walk must count neither what a symlink points to nor anything outside the folder,
however the swap is timed: here it is made deterministically, between the listing of a folder and the
walk going down into its subfolder (the moment a walk by path would follow it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.quota import MAX_WALK_DEPTH, NamespaceQuota, folder_bytes

BIG = 1 << 20  # bytes outside the namespace's folder that must never be counted


def _fill(folder: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"x" * size)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "other-namespace"
    _fill(folder, {"secret/model.onnx": BIG, "top.bin": BIG})
    return folder


def test_a_symlink_to_an_outside_folder_is_one_entry_never_followed(tmp_path: Path, outside: Path) -> None:
    ns = tmp_path / "repo" / "ns"
    _fill(ns, {"uploads/a.onnx": 100, "pool/m/1/model.onnx": 50})
    (ns / "uploads" / "all").symlink_to(outside)
    (ns / "pool" / "m" / "1" / "weights").symlink_to(outside / "top.bin")
    assert folder_bytes(ns) == 150
    # 8 entries: uploads, a.onnx, all, pool, m, 1, model.onnx, weights (each link is one entry itself)
    assert folder_bytes(ns, max_entries=8) == 150
    assert folder_bytes(ns, max_entries=7) is None


def test_a_namespace_folder_that_is_a_symlink_counts_nothing(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "ns").symlink_to(outside)
    assert folder_bytes(tmp_path / "repo" / "ns") == 0
    assert NamespaceQuota(tmp_path / "repo", default=BIG).usage("ns") == 0


class _SwapWhenListed:
    """``os.scandir`` that runs ``swap`` once its first listing (the namespace's folder) is done: after the walk
    saw the subfolder as a folder, before it goes down into it."""

    def __init__(self, real: Any, swap: Any) -> None:
        self.real, self.swap = real, swap
        self.calls = 0

    def __call__(self, path: Any = ".") -> Any:
        entries = self.real(path)
        self.calls += 1
        if self.calls > 1:
            return entries
        listing = self

        class Listing:
            def __enter__(self) -> Listing:
                return self

            def __exit__(self, *exc: object) -> None:
                entries.close()

            def __iter__(self) -> Iterator[Any]:
                yield from entries
                listing.swap()

            def close(self) -> None:
                entries.close()

        return Listing()


def test_a_folder_swapped_for_a_symlink_mid_walk_is_not_followed(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = tmp_path / "repo" / "ns"
    _fill(ns, {"a.onnx": 100, "uploads/b.onnx": 10})

    swapped = []

    def swap() -> None:  # uploads/ becomes a symlink to another namespace's folder
        swapped.append(True)
        os.rename(ns / "uploads", tmp_path / "moved-away")
        (ns / "uploads").symlink_to(outside)

    hook = _SwapWhenListed(os.scandir, swap)
    monkeypatch.setattr(os, "scandir", hook)
    total = folder_bytes(ns)
    monkeypatch.undo()
    assert swapped == [True] and (ns / "uploads").is_symlink()  # the swap happened during the walk
    assert total == 100  # neither the outside folder (2 MiB) nor the moved one


def test_folders_nested_deeper_than_the_walk_goes_are_refused(tmp_path: Path) -> None:
    ns = tmp_path / "ns"
    deep = ns.joinpath(*["d"] * MAX_WALK_DEPTH)
    _fill(deep, {"f": 3})
    assert folder_bytes(ns) == 3  # exactly MAX_WALK_DEPTH levels below the namespace's folder
    _fill(deep / "d", {"f": 3})
    assert folder_bytes(ns) is None
    quota = NamespaceQuota(tmp_path, default=BIG, ttl=3600)
    with pytest.raises(ArtifactError, match=f"nested deeper than {MAX_WALK_DEPTH}"):
        quota.check("ns")
