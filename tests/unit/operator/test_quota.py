"""Download slots per namespace and the namespace quota (operator/sources/quota.py), on a real folder."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.sources.quota import DownloadGate, NamespaceQuota, folder_bytes


def test_gate_caps_each_namespace_and_the_total() -> None:
    gate = DownloadGate(per_namespace=2, total=3)
    gate.acquire("a")
    gate.acquire("a")
    with pytest.raises(ArtifactError) as err:
        gate.acquire("a")
    assert err.value.reason == "Queued" and "namespace 'a' already runs 2 downloads" in err.value.message
    gate.acquire("b")
    with pytest.raises(ArtifactError, match="already runs 3 downloads, its overall limit"):
        gate.acquire("c")
    gate.release("a")
    gate.acquire("c")
    assert (gate.running("a"), gate.running("b"), gate.running("c"), gate.running()) == (1, 1, 1, 3)
    for ns in ("a", "b", "c"):
        gate.release(ns)
    assert gate.running() == 0
    unlimited = DownloadGate(0, 0)
    for _ in range(50):
        unlimited.acquire("a")


def test_gate_under_threads_never_exceeds_its_caps() -> None:
    gate = DownloadGate(per_namespace=2, total=3)
    peak = {"a": 0, "all": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(16)

    def worker(ns: str) -> None:
        barrier.wait()
        for _ in range(200):
            try:
                gate.acquire(ns)
            except ArtifactError:
                continue
            with lock:
                peak["a"] = max(peak["a"], gate.running("a"))
                peak["all"] = max(peak["all"], gate.running())
            gate.release(ns)

    threads = [threading.Thread(target=worker, args=("a" if i % 2 else f"n{i}",)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak["a"] <= 2 and peak["all"] <= 3 and gate.running() == 0


def test_fetch_holds_one_slot_per_sync_and_gives_it_back() -> None:
    gate = DownloadGate(per_namespace=1, total=0)
    fetch = Fetch(gate=gate)
    fetch.take_slot("a")
    fetch.take_slot("a")  # the second download of the same sync: the same slot
    assert gate.running("a") == 1
    with pytest.raises(ArtifactError, match="Queued|already runs"):
        Fetch(gate=gate).take_slot("a")
    fetch.finish(succeeded=False)
    assert gate.running("a") == 0


def _fill(folder: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(b"x" * size)


def test_folder_bytes_counts_files_not_links(tmp_path: Path) -> None:
    _fill(tmp_path / "ns", {"uploads/a.onnx": 100, "pool/m/1/model.onnx": 50, "pool/.m.staging-1/1/x": 7})
    (tmp_path / "elsewhere").mkdir()
    _fill(tmp_path / "elsewhere", {"big": 10_000})
    (tmp_path / "ns" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "ns" / "file-link").symlink_to(tmp_path / "elsewhere" / "big")
    assert folder_bytes(tmp_path / "ns") == 157
    assert folder_bytes(tmp_path / "missing") == 0


def test_quota_counts_between_walks_and_walks_once_per_ttl(tmp_path: Path) -> None:
    _fill(tmp_path / "a", {"uploads/m.onnx": 600})
    quota = NamespaceQuota(tmp_path, default=1000, overrides={"free": 0}, ttl=3600)
    quota.check("a", 400)  # exactly at the limit: fine
    with pytest.raises(ArtifactError) as err:
        quota.check("a", 401)
    assert err.value.reason == "QuotaExceeded"
    assert "namespace 'a' uses 600 bytes of its 1000 bytes quota" in err.value.message
    assert "this version needs 401 bytes more" in err.value.message
    quota.add("a", 300)
    with pytest.raises(ArtifactError, match="uses 900 bytes"):
        quota.add("a", 200)
    quota.forget("a", 300)  # a failed sync removed what it staged
    quota.add("a", 350)
    for _ in range(100):
        quota.usage("a")
    assert quota.walks == 1  # one walk, then counted
    quota.check("free", 10**15)  # no quota: never refused, never walked
    assert quota.walks == 1


def test_quota_walks_again_after_its_ttl(tmp_path: Path) -> None:
    _fill(tmp_path / "a", {"m": 10})
    quota = NamespaceQuota(tmp_path, default=1000, ttl=0.0)
    assert quota.usage("a") == 10
    _fill(tmp_path / "a", {"n": 20})
    assert quota.usage("a") == 30 and quota.walks == 2
