"""The local cluster's shared build scaffolding (e2e/cluster/localcluster/scaffold.py) and what a running cluster's
recipe hash covers (supervisor.py). The builds themselves run in CI's Go stage and the e2e suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.cluster.localcluster import scaffold, supervisor

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_is_built_once_and_then_found(tmp_path: Path) -> None:
    calls: list[Path] = []

    def make(out: Path) -> None:
        calls.append(out)
        (out / "binary").write_text("built")

    target = tmp_path / "bin-abc"
    assert scaffold.build_once(target, tmp_path / ".lock", make) is True
    assert scaffold.build_once(target, tmp_path / ".lock", make) is False
    assert len(calls) == 1 and calls[0] != target  # built beside the target, then renamed into place
    assert (target / "binary").read_text() == "built" and (target / ".complete").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "bin-abc"]


def test_an_interrupted_build_leaves_nothing_that_is_reused(tmp_path: Path) -> None:
    def broken(out: Path) -> None:
        (out / "half").write_text("partial")
        raise RuntimeError("go build failed")

    target = tmp_path / "bin-abc"
    with pytest.raises(RuntimeError, match="go build failed"):
        scaffold.build_once(target, tmp_path / ".lock", broken)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]  # no temporary folder left behind
    assert scaffold.build_once(target, tmp_path / ".lock", lambda out: (out / "ok").write_text("")) is True
    assert (target / "ok").exists() and not (target / "half").exists()


def test_a_target_without_its_completion_marker_is_built_again(tmp_path: Path) -> None:
    target = tmp_path / "bin-abc"
    (target / "stale").mkdir(parents=True)  # e.g. copied by hand, or from before the marker existed
    assert scaffold.build_once(target, tmp_path / ".lock", lambda out: (out / "fresh").write_text("")) is True
    assert (target / "fresh").exists() and not (target / "stale").exists()


def test_the_cache_folder_follows_its_environment_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEINFER_TEST_CACHE", str(tmp_path / "c"))
    assert scaffold.cache_folder("KUBEINFER_TEST_CACHE", "kubeinfer-x") == tmp_path / "c"
    monkeypatch.delenv("KUBEINFER_TEST_CACHE")
    assert scaffold.cache_folder("KUBEINFER_TEST_CACHE", "kubeinfer-x") == Path.home() / ".cache" / "kubeinfer-x"


def test_the_recipe_of_a_running_cluster_covers_what_starts_it_but_not_the_add_ons() -> None:
    """``up`` restarts a running cluster whose recipe hash differs: an edit to the control plane or node code must
    change it, an edit to an add-on (started on a running cluster) must not."""
    here = ROOT / "e2e" / "cluster"
    names = {str(p.relative_to(here)) for p in supervisor.recipe_files()}
    assert {"cluster.py", "localcluster/control_plane.py", "localcluster/supervisor.py"} <= names
    assert {"localcluster/node/configs.py", "localcluster/binaries.py", "localcluster/pki.py"} <= names
    assert not {n for n in names if "addons" in n}
    assert supervisor.recipe_hash(True) != supervisor.recipe_hash(False)
