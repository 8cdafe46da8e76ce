"""``repository.confined``: walks beneath a folder descriptor that planted or swapped symlinks cannot redirect."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.server.repository import confined, publish
from kubeinfer.server.repository.confined import DOTDOT, LOOP, OUTSIDE, SYMLINK, Refused

PATH = ["a", "b", "c", "f.txt"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``<tmp>/root/a/b/c/f.txt`` (ours) and ``<tmp>/outside/a/b/c/f.txt`` (someone else's, same shape)."""
    for top, text in (("root", "ours"), ("outside", "theirs")):
        (tmp_path / top / "a" / "b" / "c").mkdir(parents=True)
        (tmp_path / top / "a" / "b" / "c" / "f.txt").write_text(text)
    return tmp_path


@pytest.fixture
def root(tree: Path) -> Iterator[int]:
    fd = confined.open_root(tree / "root")
    yield fd
    os.close(fd)


def _swap_for_link(tree: Path, depth: int, target: str | Path) -> Path:
    """Replace component ``depth`` of PATH under root with a symlink to ``target``; returns the link."""
    link = tree / "root" / Path(*PATH[: depth + 1])
    link.rename(link.with_name(link.name + ".real"))
    os.symlink(target, link)
    return link


@pytest.mark.parametrize("depth", range(len(PATH)))
def test_without_follow_a_symlink_at_any_component_is_refused(tree: Path, root: int, depth: int) -> None:
    assert confined.read_bytes(root, "/".join(PATH)) == b"ours"
    _swap_for_link(tree, depth, tree / "outside" / Path(*PATH[: depth + 1]))
    with pytest.raises(Refused) as info:
        confined.read_bytes(root, "/".join(PATH))
    assert info.value.kind == SYMLINK and info.value.at == "/".join(PATH[: depth + 1])
    # even a link that stays inside: the operator's writes take real folders only
    (tree / "root" / Path(*PATH[: depth + 1])).unlink()
    os.symlink(Path(*PATH[: depth + 1]).name + ".real", tree / "root" / Path(*PATH[: depth + 1]))
    with pytest.raises(Refused):
        confined.read_bytes(root, "/".join(PATH))


@pytest.mark.parametrize("depth", range(len(PATH)))
def test_with_follow_links_inside_are_taken_and_links_out_refused(tree: Path, root: int, depth: int) -> None:
    name = PATH[depth]
    link = _swap_for_link(tree, depth, f"{name}.real")  # relative, inside
    assert confined.read_bytes(root, "/".join(PATH), follow=True) == b"ours"
    link.unlink()
    os.symlink(link.with_name(name + ".real"), link)  # absolute, inside
    assert confined.read_bytes(root, "/".join(PATH), follow=True) == b"ours"
    for target in (
        tree / "outside" / Path(*PATH[: depth + 1]),
        "../" * (depth + 1) + "../outside/" + "/".join(PATH[: depth + 1]),
    ):
        link.unlink()
        os.symlink(target, link)
        with pytest.raises(Refused) as info:
            confined.read_bytes(root, "/".join(PATH), follow=True)
        assert info.value.kind == OUTSIDE
        assert "leads outside the model repository through a symlink" in str(info.value)


def test_loops_dotdot_and_the_root_itself(tree: Path, root: int) -> None:
    os.symlink("loop", tree / "root" / "loop")
    with pytest.raises(Refused) as info:
        confined.read_bytes(root, "loop", follow=True)
    assert info.value.kind == LOOP
    with pytest.raises(Refused) as info:
        confined.read_bytes(root, "../outside/a/b/c/f.txt", follow=True)
    assert info.value.kind == DOTDOT and "through a symlink" not in str(info.value)
    assert confined.read_bytes(root, "a/../a/b/./c/f.txt") == b"ours"
    os.symlink(tree / "root", tree / "root" / "a" / "top")  # a link back to the root is inside
    assert confined.read_bytes(root, "a/top/a/b/c/f.txt", follow=True) == b"ours"
    with pytest.raises(OSError) as err:
        confined.open_file(root, "a/b", follow=True)
    assert err.value.errno == errno.EISDIR
    with pytest.raises(ValueError):
        confined.open_beneath(root, "/etc/passwd")


def test_start_walks_from_a_subfolder_with_the_root_as_the_limit(tree: Path, root: int) -> None:
    (tree / "root" / "shared.txt").write_text("shared")
    os.symlink("../../shared.txt", tree / "root" / "a" / "b" / "link.txt")
    with confined.opened(confined.open_dir(root, "a")) as a:
        assert confined.read_bytes(root, "b/link.txt", follow=True, start=(a, "a")) == b"shared"
        with pytest.raises(Refused) as info:  # the same link, with the subfolder as the root
            confined.read_bytes(a, "b/link.txt", follow=True)
        assert info.value.kind == OUTSIDE


def test_fifos_and_devices_do_not_block_a_read(tree: Path, root: int) -> None:
    os.mkfifo(tree / "root" / "fifo")
    with pytest.raises(OSError):
        confined.open_file(root, "fifo")


def test_creating_folders_never_goes_through_a_symlink(tree: Path, root: int) -> None:
    fd = confined.open_dir(root, "new/deeper/deepest", create=True)
    os.close(fd)
    assert (tree / "root" / "new" / "deeper" / "deepest").is_dir()
    os.symlink(tree / "outside", tree / "root" / "evil")
    with pytest.raises(Refused):
        confined.open_dir(root, "evil/made-here", create=True)
    assert not (tree / "outside" / "made-here").exists()


def test_new_files_never_replace_or_follow_a_symlink(tree: Path, root: int) -> None:
    os.symlink(tree / "outside" / "planted.txt", tree / "root" / "planted.txt")
    with pytest.raises(FileExistsError):
        confined.write_new(root, "planted.txt", b"x")
    assert not (tree / "outside" / "planted.txt").exists()


def test_remove_tree_unlinks_planted_links_and_handles_deep_trees(tree: Path, root: int) -> None:
    (tree / "root" / ".m.deleting-00").mkdir()
    os.symlink(tree / "outside" / "a", tree / "root" / ".m.deleting-00" / "into-outside")
    # deeper than the interpreter's recursion limit and than the descriptors one may hold at once
    with confined.opened(confined.open_dir(root, ".m.deleting-00")) as fd:
        current = os.dup(fd)
        for _ in range(1500):
            os.mkdir("d", dir_fd=current)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
            os.close(current)
            current = deeper
        (Path(confined.real_path(current)) / "leaf.txt").write_text("x")
        os.close(current)
    publish.remove_tree(root, ".m.deleting-00")
    assert sorted(os.listdir(tree / "root")) == ["a"]
    assert (tree / "outside" / "a" / "b" / "c" / "f.txt").read_text() == "theirs"


def test_a_racing_thread_swapping_components_never_makes_a_walk_read_outside(tree: Path, root: int) -> None:
    """A thread swaps every component of the path for a symlink out of the root and back, as fast as it can:
    every read is either our bytes or refused, never the outside's."""
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for depth in range(len(PATH)):
                link = tree / "root" / Path(*PATH[: depth + 1])
                kept = link.with_name(link.name + ".kept")
                os.rename(link, kept)
                os.symlink(tree / "outside" / Path(*PATH[: depth + 1]), link)
                os.unlink(link)
                os.rename(kept, link)

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 2
    try:
        while time.monotonic() < deadline:
            for follow in (False, True):
                try:
                    data = confined.read_bytes(root, "/".join(PATH), follow=follow)
                    seen[data.decode()] = seen.get(data.decode(), 0) + 1
                except Refused as exc:
                    seen[exc.kind] = seen.get(exc.kind, 0) + 1
                except FileNotFoundError:
                    seen["missing"] = seen.get("missing", 0) + 1
    finally:
        stop.set()
        thread.join()
    assert "theirs" not in seen, seen
    assert seen.get("ours", 0) > 10 and seen.get(SYMLINK, 0) + seen.get(OUTSIDE, 0) > 10, seen
