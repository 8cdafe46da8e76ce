"""The Reconciler's decisions that the e2e suite cannot reach cheaply, with its Kubernetes client injected.

``FakeKube`` keeps objects in dicts and records every write; the repository is a real folder, written by
the real RepositoryWriter. Covered: a failed render is not repeated by the resync timer before its
backoff expires (and is on a spec change); a model that moves to another server or subPath is removed
from the old folder; the HPA goes when ``spec.autoscaling`` goes (only one this server owns); a server
whose claim is not the operator's storage gets no models written. Lease loss: tests/unit/operator/
test_leader.py.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import kopf
import onnx
import pytest
from kubeinfer.operator.controllers import model_reconcile
from kubeinfer.operator.controllers.reconciler import Reconciler
from kubeinfer.operator.controllers.settings import OperatorConfig
from kubeinfer.operator.kube.client import MODELS, SERVERS
from kubeinfer.operator.models import failures, render_memo
from kubeinfer.operator.models.failures import FAILURE_BACKOFF
from kubeinfer.operator.models.render import render_versions
from kubeinfer.operator.servers import pod_start
from kubeinfer.server.sources.egress import parse_networks
from kubernetes.client.exceptions import ApiException
from onnx import TensorProto

from tests.support.hostile import HostileServer, send
from tests.support.models import unary
from tests.support.server import start_server
from tests.support.specs import server_spec
from tests.support.waiting import wait_for

NS = "team"


class FakeKube:
    """The calls the Reconciler and its Autoscaler make, on in-memory objects."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural or kind, ns, name)
        self.core: dict[tuple[str, str, str | None], dict[str, Any]] = {}  # (kind, name, ns) → object
        self.applied: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.statuses: list[tuple[str, str, dict[str, Any]]] = []
        self.stop = SimpleNamespace(set=lambda: None)
        self.slices: list[dict[str, Any]] = []
        self.pod_list: list[dict[str, Any]] = []
        self.replica_set_list: list[dict[str, Any]] = []

    # InferenceServers / InferenceModels
    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((plural, namespace, name)))

    def list_in(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (p, ns, _), o in self.objects.items() if p == plural and ns == namespace]

    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append((plural, name, copy.deepcopy(dict(status))))
        if (plural, namespace, name) in self.objects:
            self.objects[(plural, namespace, name)]["status"] = copy.deepcopy(dict(status))

    def read_core(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return copy.deepcopy(self.core.get((kind, name, namespace)))

    def create_core(self, manifest: Mapping[str, Any]) -> None:
        body = copy.deepcopy(dict(manifest))
        key = (body["kind"], body["metadata"]["name"], body["metadata"].get("namespace"))
        self.core.setdefault(key, body)
        self.created.append(body)

    def delete_core(self, kind: str, name: str) -> None:
        self.core.pop((kind, name, None), None)

    def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        self.deleted.append((kind, namespace, name))
        return self.objects.pop((kind, namespace, name), None) is not None

    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.slices)  # none by default: no replica runs, which most tests do not look at

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pod_list)

    def deployments(self, namespace: str, name: str) -> list[dict[str, Any]]:
        found = copy.deepcopy(self.objects.get(("Deployment", namespace, name)))
        if found is None:
            return []
        found["metadata"]["uid"] = f"dep-{name}"  # what the API server gives the applied Deployment
        return [found]

    def replica_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.replica_set_list)

    # owned objects
    def apply(self, manifest: Mapping[str, Any]) -> Any:
        body = copy.deepcopy(dict(manifest))
        self.applied.append(body)
        self.objects[(body["kind"], body["metadata"]["namespace"], body["metadata"]["name"])] = body
        available = SimpleNamespace(type="Available", status="True", reason="MinimumReplicasAvailable", message="")
        return SimpleNamespace(status=SimpleNamespace(replicas=1, ready_replicas=1, conditions=[available]))

    def read_hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(("HorizontalPodAutoscaler", namespace, name)))

    def hpa_owned_by(self, namespace: str, name: str, uid: str) -> bool:
        hpa = self.read_hpa(namespace, name)
        return hpa is not None and any(ref.get("uid") == uid for ref in hpa["metadata"].get("ownerReferences") or ())

    def delete_hpa(self, namespace: str, name: str) -> bool:
        self.deleted.append(("HorizontalPodAutoscaler", namespace, name))
        return self.objects.pop(("HorizontalPodAutoscaler", namespace, name), None) is not None

    def resource_served(self, group: str, version: str, plural: str) -> bool:
        return False  # no KEDA in this cluster

    def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        raise AssertionError("ScaledObjects are never read without KEDA")


class Clock:
    """``time`` of the modules whose clock decides when a render runs again: the failure backoff, the render memo."""

    def __init__(self) -> None:
        self.now = 10_000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Events the Reconciler posts, as (type, reason, message) (kopf posts them only inside an operator)."""
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(
        kopf, "event", lambda _obj, *, type, reason, message="", **_: posted.append((type, reason, message))
    )
    monkeypatch.setattr(
        kopf, "warn", lambda _obj, *, reason, message="", **_: posted.append(("Warning", reason, message))
    )
    return posted


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    for module in (failures, render_memo, model_reconcile):
        monkeypatch.setattr(module, "time", c)
    return c


@pytest.fixture
def root(tmp_path: Path) -> Path:
    uploads = tmp_path / NS / "uploads"
    uploads.mkdir(parents=True)
    onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
    return tmp_path


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube()


@pytest.fixture
def reconciler(root: Path, kube: FakeKube, events: list[Any]) -> Iterator[Reconciler]:
    # downloads may reach this machine (127.0.0.1:9 answers "connection refused": a temporary failure)
    config = OperatorConfig(repository_root=root, allowed_networks=parse_networks(["127.0.0.0/8"]))
    r = Reconciler(config, kube)  # type: ignore[arg-type]
    yield r
    r.close()


def add_server(kube: FakeKube, name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "serving.kubeinfer.io/v1alpha1",
        "kind": "InferenceServer",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
        "spec": server_spec(**{"repository": {"claimName": "models"}, "autoscaling": None, **spec}),
    }
    kube.objects[(SERVERS, NS, name)] = body
    return copy.deepcopy(body)


def model(server: str, path: str = "uploads/relu.onnx", generation: int = 1) -> dict[str, Any]:
    body = {
        "apiVersion": "serving.kubeinfer.io/v1alpha1",
        "kind": "InferenceModel",
        "metadata": {"name": "m", "namespace": NS, "uid": "uid-m", "generation": generation},
        "spec": {
            "server": server,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "versions": [{"version": 1, "source": {"path": path}}],
        },
    }
    return body


def condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def own(kube: FakeKube, server: str, *pods: dict[str, Any]) -> None:
    """Make ``pods`` the pool's own, as the controllers would: controlled by a ReplicaSet (with its
    pod-template-hash) that the server's Deployment (``FakeKube.deployments``) controls."""
    owner = {"kind": "InferenceServer", "name": server, "uid": f"uid-{server}", "controller": True}
    kube.objects.setdefault(("Deployment", NS, server), {"metadata": {"name": server, "ownerReferences": [owner]}})
    kube.replica_set_list = [
        {
            "metadata": {
                "name": f"{server}-abc12",
                "uid": f"rs-{server}",
                "labels": {"pod-template-hash": "abc12"},
                "ownerReferences": [{"kind": "Deployment", "name": server, "uid": f"dep-{server}", "controller": True}],
            }
        }
    ]
    for pod in pods:
        meta = pod["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), "pod-template-hash": "abc12"}
        meta["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": f"{server}-abc12", "uid": f"rs-{server}", "controller": True}
        ]


def counting_syncs(reconciler: Reconciler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the models the writer was asked to sync (a render that fetches and writes)."""
    calls: list[str] = []
    sync = reconciler.writer.sync_model

    def counted(server_dir: Path, rendered: Any, **kw: Any) -> Any:
        calls.append(rendered.name)
        return sync(server_dir, rendered, **kw)

    monkeypatch.setattr(reconciler.writer, "sync_model", counted)
    return calls


# ---- a failed render waits out its backoff on the resync timer -------------------------------------------
def test_failed_render_is_retried_by_the_timer_only_after_its_backoff(
    reconciler: Reconciler, kube: FakeKube, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_server(kube, "pool")
    body = model("pool", path="uploads/missing.onnx")
    syncs = counting_syncs(reconciler, monkeypatch)

    first = reconciler.reconcile_model(body, recheck=False)
    assert first is not None
    assert condition(first, "Ready")["reason"] == "PathNotFound"
    assert "missing.onnx" in condition(first, "Ready")["message"]
    assert syncs == ["m"]

    # resyncs within the first backoff report the remembered failure without touching the source
    clock.now += FAILURE_BACKOFF[0] - 1
    held = reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert held is not None and condition(held, "Ready")["reason"] == "PathNotFound"
    assert syncs == ["m"]

    # once it expired the timer tries again, and the next backoff is twice as long
    clock.now += 2
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m", "m"]
    clock.now += 2 * FAILURE_BACKOFF[0] - 1
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m", "m"]
    clock.now += 2
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m", "m", "m"]

    # a change handler always renders, backoff or not
    reconciler.reconcile_model(body, recheck=False)
    assert syncs == ["m", "m", "m", "m"]


def test_a_new_generation_renders_at_once_and_a_fixed_source_clears_the_failure(
    reconciler: Reconciler, kube: FakeKube, root: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_server(kube, "pool")
    syncs = counting_syncs(reconciler, monkeypatch)
    reconciler.reconcile_model(model("pool", path="uploads/missing.onnx"), recheck=False)
    assert syncs == ["m"]

    fixed = model("pool", generation=2)  # the user fixed the path: a timer tick of the new generation renders
    new = reconciler.reconcile_model(fixed, from_timer=True, recheck=False)
    assert syncs == ["m", "m"]
    assert new is not None and condition(new, "Rendered")["status"] == "True"
    assert (root / NS / "pool" / "m" / "1" / "model.onnx").is_file()

    # and with the failure forgotten, the next tick does not wait out a backoff: a folder that drifted is
    # repaired at once (an unchanged one is not even looked at again, see the test below)
    (root / NS / "pool" / "m" / "1" / "model.onnx").unlink()
    fixed["status"] = new
    reconciler.reconcile_model(fixed, from_timer=True, recheck=False)
    assert syncs == ["m", "m", "m"]
    assert (root / NS / "pool" / "m" / "1" / "model.onnx").is_file()


def test_a_resync_with_nothing_changed_renders_nothing_and_writes_nothing(
    reconciler: Reconciler, kube: FakeKube, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resync of an unchanged model: no render, no sync, no write on the volume, no status write; any
    change to its folder (a file touched, removed, added; a version folder replaced) brings the render back."""
    add_server(kube, "pool")
    body = model("pool")
    body["status"] = reconciler.reconcile_model(body, recheck=False)
    syncs = counting_syncs(reconciler, monkeypatch)
    renders = []
    monkeypatch.setattr(
        model_reconcile, "render_versions", lambda *a, **k: renders.append(a[0]) or render_versions(*a, **k)
    )
    folder = root / NS / "pool" / "m"

    def snapshot() -> list[tuple[str, int, int]]:
        return sorted((str(p), p.stat().st_ino, p.stat().st_ctime_ns) for p in [folder, *folder.rglob("*")])

    before, writes = snapshot(), len(kube.statuses)
    for _ in range(3):
        assert reconciler.reconcile_model(body, from_timer=True, recheck=False) == body["status"]
    assert (syncs, renders, len(kube.statuses), snapshot()) == ([], [], writes, before)

    model_file = folder / "1" / "model.onnx"
    drifts = [
        lambda: model_file.write_bytes(model_file.read_bytes()),  # same bytes, written again
        lambda: os.utime(model_file, (0, 0)),  # times set back: the change time still moves
        lambda: (folder / "1" / "extra.txt").write_text("x"),
        lambda: (folder / "config.pbtxt").unlink(),
    ]
    for i, drift in enumerate(drifts, 1):
        drift()
        reconciler.reconcile_model(body, from_timer=True, recheck=False)
        assert len(syncs) == i, f"drift {i} was not looked at"
        reconciler.reconcile_model(body, from_timer=True, recheck=False)
        assert len(syncs) == i, f"after drift {i} the next resync rendered again"
    assert (folder / "config.pbtxt").is_file()
    # a change of the server's spec (a new generation) renders again too
    server = kube.objects[(SERVERS, NS, "pool")]
    server["metadata"]["generation"] = 2
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert len(syncs) == len(drifts) + 1


def test_rechecks_right_after_a_render_take_the_folder_as_it_left_it(
    reconciler: Reconciler, kube: FakeKube, root: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rechecks after a render only read the replicas: within RECHECK_TRUST seconds of the render they do
    not walk the folder again, so a drift meanwhile is left to the resync, which renders it back."""
    add_server(kube, "pool")
    body = model("pool")
    body["status"] = reconciler.reconcile_model(body, recheck=False)
    syncs = counting_syncs(reconciler, monkeypatch)
    walks: list[str] = []
    real_snapshot = reconciler.writer.snapshot
    monkeypatch.setattr(reconciler.writer, "snapshot", lambda d, n: walks.append(n) or real_snapshot(d, n))
    (root / NS / "pool" / "m" / "config.pbtxt").unlink()
    recheck = {"from_timer": True, "recheck": False, "trust": model_reconcile.RECHECK_TRUST}
    assert reconciler.reconcile_model(body, **recheck) == body["status"]
    assert (syncs, walks) == ([], [])
    # a render older than the rechecks' window is looked at, as is every resync's
    clock.now += model_reconcile.RECHECK_TRUST + 1
    reconciler.reconcile_model(body, **recheck)
    assert len(syncs) == 1 and (root / NS / "pool" / "m" / "config.pbtxt").is_file()
    (root / NS / "pool" / "m" / "config.pbtxt").unlink()
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert len(syncs) == 2 and (root / NS / "pool" / "m" / "config.pbtxt").is_file()


def test_a_temporary_fetch_failure_is_retried_by_kopf_with_growing_delays(
    reconciler: Reconciler, kube: FakeKube, clock: Clock
) -> None:
    add_server(kube, "pool")
    body = model("pool")
    body["spec"]["versions"][0]["source"] = {"uri": "http://127.0.0.1:9/relu.onnx", "sha256": "0" * 64}
    delays = []
    for retry in (0, 3, 10):
        with pytest.raises(kopf.TemporaryError) as info:
            reconciler.reconcile_model(body, retry=retry, recheck=False)
        delays.append(info.value.delay)
    assert delays == [failures.backoff(0), failures.backoff(3), failures.backoff(10)] == [5.0, 40.0, 300.0]
    (_, _, status) = kube.statuses[-1]
    assert condition(status, "Ready")["reason"] == "FetchFailed"


# ---- fair shares: download slots and the namespace quota --------------------------------------------------
def test_a_download_over_its_namespaces_share_is_queued_and_gives_its_thread_back(
    reconciler: Reconciler,
    kube: FakeKube,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    events: list[tuple[str, str, str]],
) -> None:
    add_server(kube, "pool")
    body = model("pool")
    body["spec"]["versions"][0]["source"] = {"uri": "http://127.0.0.1:9/relu.onnx", "sha256": "0" * 64}
    for _ in range(reconciler.config.downloads_per_namespace):
        reconciler.gate.acquire(NS)  # two slow downloads of this namespace hold its share
    syncs = counting_syncs(reconciler, monkeypatch)
    with pytest.raises(kopf.TemporaryError) as info:  # the handler returns its thread; kopf comes back soon
        reconciler.reconcile_model(body, recheck=False)
    assert failures.QUEUE_RETRY / 2 <= info.value.delay <= failures.QUEUE_RETRY * 1.5
    (_, _, status) = kube.statuses[-1]
    assert condition(status, "Rendered")["reason"] == "Queued"
    assert f"namespace '{NS}' already runs 2 downloads" in condition(status, "Ready")["message"]
    # waiting is not a failure: the next timer tick tries again at once, without a failure backoff
    with pytest.raises(kopf.TemporaryError):
        reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m", "m"]
    # another namespace is not held up by this one's share
    assert reconciler.gate.running("other") == 0
    # a URI refused without connecting (the metadata endpoint) is refused at once, not queued
    metadata = model("pool")
    metadata["metadata"]["uid"] = "uid-metadata"
    metadata["spec"]["versions"][0]["source"] = {"uri": "http://169.254.169.254/latest/", "sha256": "0" * 64}
    refused = reconciler.reconcile_model(metadata, recheck=False)
    assert refused is not None and condition(refused, "Ready")["reason"] == "AddressRefused"
    reconciler.gate.release(NS)
    with pytest.raises(kopf.TemporaryError) as info:  # now it runs: connection refused, a temporary failure
        reconciler.reconcile_model(body, recheck=False)
    assert "the connection could not be made" in str(info.value)
    assert reconciler.gate.running(NS) == 1  # the render gave its slot back


def test_a_failed_render_tried_again_while_the_slots_are_busy_keeps_its_failure(
    reconciler: Reconciler, kube: FakeKube, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The e2e drill's hostile namespace: models that failed (here: nothing listens) are tried again by the
    resync; when slow downloads hold the namespace's slots the status keeps the failure rather than flipping
    to Queued, and no quick retry is asked for (models waiting since their apply take the slots first)."""
    add_server(kube, "pool")
    body = model("pool")
    body["spec"]["versions"][0]["source"] = {"uri": "http://127.0.0.1:9/relu.onnx", "sha256": "0" * 64}
    with pytest.raises(kopf.TemporaryError):
        reconciler.reconcile_model(body, recheck=False)
    assert condition(kube.statuses[-1][2], "Rendered")["reason"] == "FetchFailed"
    for _ in range(reconciler.config.downloads_per_namespace):
        reconciler.gate.acquire(NS)
    clock.now += FAILURE_BACKOFF[0] + 1  # past the failure's backoff: the resync renders again
    syncs = counting_syncs(reconciler, monkeypatch)
    again = reconciler.reconcile_model(body, from_timer=True, recheck=False)  # no TemporaryError: no quick retry
    assert syncs == ["m"], "the resync did not try again"
    assert again is not None and condition(again, "Rendered")["reason"] == "FetchFailed"
    assert "the connection could not be made" in condition(again, "Rendered")["message"]
    # a model that never failed still says Queued and is retried soon
    fresh = model("pool")
    fresh["metadata"]["uid"] = "uid-fresh"
    fresh["spec"]["versions"][0]["source"] = {"uri": "http://127.0.0.1:9/other.onnx", "sha256": "1" * 64}
    with pytest.raises(kopf.TemporaryError):
        reconciler.reconcile_model(fresh, recheck=False)
    assert condition(kube.statuses[-1][2], "Rendered")["reason"] == "Queued"


def test_a_resync_tick_does_not_wait_for_a_render_in_progress(
    reconciler: Reconciler, kube: FakeKube, events: list[tuple[str, str, str]]
) -> None:
    """A slow download holds its object's lock; the timer of that object skips its tick instead of holding
    a second worker thread behind it. A change handler still waits its turn."""
    add_server(kube, "pool")
    body = model("pool")
    lock = reconciler.lock(body["metadata"]["uid"])
    with lock:
        assert reconciler.reconcile_model(body, from_timer=True, recheck=False) is None
        assert kube.statuses == []
        waited = threading.Thread(target=reconciler.reconcile_model, args=(body,), kwargs={"recheck": False})
        waited.start()
        waited.join(0.5)
        assert waited.is_alive() and kube.statuses == []
    waited.join(30)
    assert kube.statuses and condition(kube.statuses[-1][2], "Rendered")["status"] == "True"


def test_a_model_over_its_namespaces_quota_writes_nothing_and_others_go_on(
    kube: FakeKube, root: Path, clock: Clock, events: list[tuple[str, str, str]]
) -> None:
    uploads = root / NS / "uploads"
    used = sum(p.stat().st_size for p in uploads.iterdir())
    config = OperatorConfig(
        repository_root=root, namespace_quota_bytes=used + 10, namespace_quotas={"roomy": 10 * used}
    )
    r = Reconciler(config, kube)  # type: ignore[arg-type]
    try:
        add_server(kube, "pool")
        status = r.reconcile_model(model("pool"), recheck=False)
        assert status is not None
        ready = condition(status, "Ready")
        assert ready["reason"] == "QuotaExceeded", ready
        assert f"namespace '{NS}' uses" in ready["message"] and "quota on the repository volume" in ready["message"]
        assert not (root / NS / "pool" / "m").exists()
        assert [p.name for p in (root / NS / "pool").iterdir()] == []  # no staging left either
        # another namespace with room renders
        (root / "roomy" / "uploads").mkdir(parents=True)
        (root / "roomy" / "uploads" / "relu.onnx").write_bytes((uploads / "relu.onnx").read_bytes())
        server = add_server(kube, "pool")
        server["metadata"]["namespace"] = "roomy"
        kube.objects[(SERVERS, "roomy", "pool")] = server
        other = model("pool")
        other["metadata"].update(namespace="roomy", uid="uid-roomy")
        done = r.reconcile_model(other, recheck=False)
        assert done is not None and condition(done, "Rendered")["status"] == "True"
        assert (root / "roomy" / "pool" / "m" / "1" / "model.onnx").is_file()
    finally:
        r.close()


# ---- a model that moves leaves nothing behind -------------------------------------------------------------
def test_a_model_moved_to_another_server_is_removed_from_the_old_folder(
    reconciler: Reconciler, kube: FakeKube, root: Path, events: list[tuple[str, str, str]]
) -> None:
    add_server(kube, "pool-a")
    add_server(kube, "pool-b", repository={"claimName": "models", "subPath": "shared/b"})
    body = model("pool-a")
    status = reconciler.reconcile_model(body, recheck=False)
    assert status is not None and status["repositoryPath"] == f"{NS}/pool-a/m"
    old = root / NS / "pool-a" / "m"
    assert (old / "1" / "model.onnx").is_file()
    assert ("Normal", "Rendered", "created the model with versions [1]") in events

    moved = model("pool-b", generation=2)
    moved["status"] = status
    status = reconciler.reconcile_model(moved, recheck=False)
    assert status is not None and status["repositoryPath"] == f"{NS}/shared/b/m"
    assert (root / NS / "shared" / "b" / "m" / "1" / "model.onnx").is_file()
    assert not old.exists(), "the old server would keep serving the model"
    assert sorted(p.name for p in (root / NS / "pool-a").iterdir()) == []  # no staging or retired leftovers


def test_a_model_moved_within_a_server_by_a_new_sub_path_is_removed_from_the_old_folder(
    reconciler: Reconciler, kube: FakeKube, root: Path
) -> None:
    add_server(kube, "pool")
    status = reconciler.reconcile_model(model("pool"), recheck=False)
    assert status is not None and status["repositoryPath"] == f"{NS}/pool/m"

    add_server(kube, "pool", repository={"claimName": "models", "subPath": "v2"})
    again = model("pool")
    again["status"] = status
    status = reconciler.reconcile_model(again, from_timer=True, recheck=False)
    assert status is not None and status["repositoryPath"] == f"{NS}/v2/m"
    assert not (root / NS / "pool" / "m").exists()
    assert (root / NS / "v2" / "m" / "1" / "model.onnx").is_file()


def test_deleting_a_model_removes_its_folder(reconciler: Reconciler, kube: FakeKube, root: Path) -> None:
    add_server(kube, "pool")
    body = model("pool")
    body["status"] = reconciler.reconcile_model(body, recheck=False)
    assert (root / NS / "pool" / "m").is_dir()
    reconciler.delete_model(body, runtime_seconds=0)  # no replica runs: nothing to wait for
    assert not (root / NS / "pool" / "m").exists()


# ---- the HPA goes with spec.autoscaling ------------------------------------------------------------------
HPA_AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 4,
    "autoscaler": "HPA",
    "target": {"metric": "PendingRequests", "value": "8"},
}


def test_removing_spec_autoscaling_deletes_the_servers_hpa(reconciler: Reconciler, kube: FakeKube) -> None:
    body = add_server(kube, "pool", autoscaling=HPA_AUTOSCALING)
    reconciler.reconcile_server(body)
    assert ("HorizontalPodAutoscaler", NS, "pool") in kube.objects
    (_, _, status) = kube.statuses[-1]
    assert status["autoscaling"]["autoscaler"] == "HPA"

    body = add_server(kube, "pool")  # spec.autoscaling removed
    body["status"] = status
    reconciler.reconcile_server(body)
    assert kube.deleted == [("HorizontalPodAutoscaler", NS, "pool")]
    assert ("HorizontalPodAutoscaler", NS, "pool") not in kube.objects
    (_, _, status) = kube.statuses[-1]
    assert status["autoscaling"] is None
    assert not any(c["type"] == "AutoscalingReady" for c in status["conditions"])


def test_an_hpa_the_server_does_not_own_is_left_alone(reconciler: Reconciler, kube: FakeKube) -> None:
    """Same name, another owner (the user's own HPA): never deleted."""
    kube.objects[("HorizontalPodAutoscaler", NS, "pool")] = {
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "pool", "namespace": NS, "ownerReferences": [{"uid": "someone-else"}]},
    }
    reconciler.reconcile_server(add_server(kube, "pool"))
    assert kube.deleted == []
    assert ("HorizontalPodAutoscaler", NS, "pool") in kube.objects


def test_without_keda_auto_creates_nothing_and_says_what_is_missing(reconciler: Reconciler, kube: FakeKube) -> None:
    body = add_server(kube, "pool", autoscaling={**HPA_AUTOSCALING, "autoscaler": "Auto"})
    reconciler.reconcile_server(body)
    assert [o["kind"] for o in kube.applied] == ["Deployment", "Service", "NetworkPolicy"]
    (_, _, status) = kube.statuses[-1]
    scaling = condition(status, "AutoscalingReady")
    assert (scaling["status"], scaling["reason"]) == ("False", "NoMetricsAdapter")
    assert condition(status, "Ready")["status"] == "True"  # the pool serves without autoscaling


# ---- a server whose claim is not the operator's storage gets nothing -------------------------------------
def pvc(volume: str) -> dict[str, Any]:
    return {"spec": {"volumeName": volume}, "status": {"phase": "Bound"}}


def pv(path: str) -> dict[str, Any]:
    return {"metadata": {"name": path}, "spec": {"nfs": {"server": "nfs.local", "path": path}}}


@pytest.fixture
def claimed(root: Path, kube: FakeKube, events: list[Any]) -> Iterator[Reconciler]:
    """The operator writes to PVC ops/models (NFS /exports/models)."""
    kube.core[("PersistentVolumeClaim", "models", "ops")] = pvc("pv-models")
    kube.core[("PersistentVolume", "pv-models", None)] = pv("/exports/models")
    config = OperatorConfig(repository_root=root, claim_name="models", claim_namespace="ops")
    r = Reconciler(config, kube)  # type: ignore[arg-type]
    yield r
    r.close()


def test_a_server_on_other_storage_gets_no_models(claimed: Reconciler, kube: FakeKube, root: Path) -> None:
    kube.core[("PersistentVolumeClaim", "models", NS)] = pvc("pv-other")  # same claim name, other storage
    kube.core[("PersistentVolume", "pv-other", None)] = pv("/exports/other")
    server = add_server(kube, "pool")
    claimed.reconcile_server(server)
    (_, _, status) = kube.statuses[-1]
    repo = condition(status, "RepositoryReady")
    assert (repo["status"], repo["reason"]) == ("False", "RepositoryUnusable")
    assert "/exports/other" in repo["message"] and f"/exports/models/{NS}" in repo["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert kube.applied == [], "pods were given a claim that does not reach their namespace's folder"

    status = claimed.reconcile_model(model("pool"), recheck=False)
    assert status is not None
    assert condition(status, "Ready")["reason"] == "ClaimNotMounted"
    assert not (root / NS / "pool").exists(), "a model was written where the server's pods will never see it"


def test_a_claim_on_the_whole_volume_is_refused(claimed: Reconciler, kube: FakeKube, root: Path) -> None:
    """The set-up SECURITY.md once described (a claim on the whole volume in each namespace) is refused."""
    kube.core[("PersistentVolumeClaim", "models", NS)] = pvc("pv-models-2")  # another PV, same NFS export
    kube.core[("PersistentVolume", "pv-models-2", None)] = pv("/exports/models/")
    add_server(kube, "pool")
    status = claimed.reconcile_model(model("pool"), recheck=False)
    assert status is not None and condition(status, "Ready")["reason"] == "ClaimTooBroad"
    assert not (root / NS / "pool").exists()


def test_a_server_without_a_claim_gets_one_that_reaches_only_its_namespace(
    claimed: Reconciler, kube: FakeKube, root: Path
) -> None:
    body = add_server(kube, "nameless", repository={"subPath": "nameless"})
    status = claimed.reconcile_model(model("nameless"), recheck=False)
    assert status is not None and condition(status, "Rendered")["status"] == "True"
    assert (root / NS / "nameless" / "m" / "1" / "model.onnx").is_file()
    volume, claim = kube.created
    assert volume["kind"] == "PersistentVolume" and claim["kind"] == "PersistentVolumeClaim"
    assert volume["spec"]["nfs"] == {"server": "nfs.local", "path": f"/exports/models/{NS}", "readOnly": True}
    assert volume["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert (
        volume["spec"]["claimRef"]["namespace"] == NS
        and volume["spec"]["claimRef"]["name"] == claim["metadata"]["name"]
    )
    assert claim["metadata"]["namespace"] == NS and claim["spec"]["volumeName"] == volume["metadata"]["name"]
    claimed.reconcile_server(body)
    deployment = next(o for o in kube.applied if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "kubeinfer-repository", "readOnly": True}
    assert pod["containers"][0]["volumeMounts"][0]["subPath"] == "nameless"
    assert len(kube.created) == 2  # made once

    kube.core[("PersistentVolumeClaim", "pending", NS)] = {"spec": {}, "status": {"phase": "Pending"}}
    add_server(kube, "waiting", repository={"claimName": "pending"})
    status = claimed.reconcile_model(model("waiting"), recheck=False)
    assert status is not None and condition(status, "Ready")["reason"] == "ClaimNotBound"
    assert not (root / NS).joinpath("waiting").exists()


def test_a_server_in_a_namespace_being_deleted_is_left_alone(
    claimed: Reconciler, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server refuses every create in a namespace being deleted (403, NamespaceTerminating); the
    reconcile ends without an error (kopf would retry it, and log a traceback, until the namespace is gone)
    and without a status write; a 403 for want of a right still raises."""

    def refuse(cause: str) -> Any:
        def create_core(manifest: Mapping[str, Any]) -> None:
            exc = ApiException(status=403, reason="Forbidden")
            exc.body = json.dumps({"kind": "Status", "reason": "Forbidden", "details": {"causes": [{"reason": cause}]}})
            raise exc

        return create_core

    body = add_server(kube, "leaving", repository={"subPath": "leaving"})
    monkeypatch.setattr(kube, "create_core", refuse("NamespaceTerminating"))
    statuses = len(kube.statuses)
    claimed.reconcile_server(body)
    assert len(kube.statuses) == statuses and kube.applied == []
    monkeypatch.setattr(kube, "create_core", refuse("FieldValueForbidden"))
    with pytest.raises(ApiException):
        claimed.reconcile_server(body)


def test_a_server_with_a_claim_on_its_namespace_folder_gets_its_models(
    claimed: Reconciler, kube: FakeKube, root: Path
) -> None:
    kube.core[("PersistentVolumeClaim", "models", NS)] = pvc("pv-team")
    kube.core[("PersistentVolume", "pv-team", None)] = pv(f"/exports/models/{NS}/")
    add_server(kube, "pool")
    status = claimed.reconcile_model(model("pool"), recheck=False)
    assert status is not None and condition(status, "Rendered")["status"] == "True"
    assert (root / NS / "pool" / "m" / "1" / "model.onnx").is_file()


# ---- a platform team's pool rules ----------------------------------------------------------------------
def test_a_model_of_a_backend_the_pool_does_not_allow_is_not_rendered(
    reconciler: Reconciler, kube: FakeKube, root: Path
) -> None:
    add_server(kube, "pool", allowedBackends=["onnxruntime", "tensorrt"])
    code = model("pool")
    code["spec"] = {**code["spec"], "platform": None, "backend": "python"}
    del code["spec"]["platform"]
    status = reconciler.reconcile_model(code, recheck=False)
    assert status is not None
    ready = condition(status, "Ready")
    assert ready["reason"] == "BackendNotAllowed"
    assert "does not allow backend 'python'" in ready["message"] and "code" in ready["message"]
    assert not (root / NS / "pool" / "m").exists()
    status = reconciler.reconcile_model(model("pool"), recheck=False)  # an ONNX model on the same pool
    assert status is not None and condition(status, "Rendered")["status"] == "True"


def test_extra_args_that_defeat_the_operator_keep_the_pods_spec_unapplied(
    reconciler: Reconciler, kube: FakeKube
) -> None:
    body = add_server(kube, "pool", server={"extraArgs": ["--log-verbose=1", "--model-control-mode=explicit"]})
    reconciler.reconcile_server(body)
    assert kube.applied == []
    (_, _, status) = kube.statuses[-1]
    refused = condition(status, "SpecAccepted")
    assert (refused["status"], refused["reason"]) == ("False", "ExtraArgsRefused")
    assert "--model-control-mode=explicit" in refused["message"]
    assert condition(status, "Ready")["status"] == "False"


def test_images_outside_the_allowed_prefixes_are_not_run(root: Path, kube: FakeKube, events: list[Any]) -> None:
    r = Reconciler(OperatorConfig(repository_root=root, server_image_prefixes=["registry.internal/ml/"]), kube)  # type: ignore[arg-type]
    try:
        r.reconcile_server(add_server(kube, "pool", image="docker.io/evil/server:1"))
        assert kube.applied == []
        assert condition(kube.statuses[-1][2], "SpecAccepted")["reason"] == "ImageRefused"
        r.reconcile_server(add_server(kube, "pool2", image="registry.internal/ml/kubeinfer-server:0.1.0"))
        assert [o["kind"] for o in kube.applied] == ["Deployment", "Service", "NetworkPolicy"]
    finally:
        r.close()


# ---- the cold start's operator half ------------------------------------------------------------------------
def test_a_render_is_timed_in_the_status_and_kept_until_the_next(
    reconciler: Reconciler, kube: FakeKube, root: Path
) -> None:
    """status.coldStart.render: the bytes and seconds of the fetch, the rest of the sync; a later reconcile
    that changes nothing keeps it; spec.coldStartBudgetSeconds is the operator's, not the config's."""
    add_server(kube, "pool")
    body = model("pool")
    body["spec"]["coldStartBudgetSeconds"] = 30
    size = (root / NS / "uploads" / "relu.onnx").stat().st_size
    status = reconciler.reconcile_model(body, recheck=False)
    assert status is not None
    render = status["coldStart"]["render"]
    assert render["fetchedBytes"] == size
    assert render["artifacts"] == [{"version": 1, "bytes": size, "seconds": render["fetchSeconds"]}]
    assert render["fetchSeconds"] >= 0 and render["renderSeconds"] >= 0
    assert status["coldStart"]["replicas"] == []  # no replica runs here
    budget = condition(status, "ColdStartBudget")
    assert (budget["status"], budget["reason"]) == ("Unknown", "NotMeasured")
    assert "coldStart" not in (root / NS / "pool" / "m" / "config.pbtxt").read_text()
    # the status written right after a render may be deferred (replicas nudged to load it): the next
    # reconcile, from a status that never held the record, still has it
    unwritten = model("pool")
    unwritten["spec"]["coldStartBudgetSeconds"] = 30
    resynced = reconciler.reconcile_model(unwritten, from_timer=True, recheck=False)
    assert resynced is not None and resynced["coldStart"]["render"] == render
    # a new generation that renders the same files: nothing changed on the volume, the record stays
    body["status"] = status
    body["metadata"]["generation"] = 2
    body["spec"]["coldStartBudgetSeconds"] = 60
    again = reconciler.reconcile_model(body, recheck=False)
    assert again is not None and again["coldStart"]["render"] == render
    # without a budget there is no condition
    body["status"], body["metadata"]["generation"] = again, 3
    del body["spec"]["coldStartBudgetSeconds"]
    last = reconciler.reconcile_model(body, recheck=False)
    assert last is not None and "ColdStartBudget" not in {c["type"] for c in last["conditions"]}


def test_server_status_shows_how_each_pod_started(
    reconciler: Reconciler, kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status.pods: the pod's own phases from its status, the server's (listening, models ready) from the real
    server behind the pod's endpoint; a complete timeline is not asked for again."""
    repo = tmp_path / "serving"
    repo.mkdir()
    server = start_server(repo, log_dir=tmp_path)
    try:
        pod = {
            "metadata": {"name": "pool-0", "uid": "pod-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"}
                ],
                "containerStatuses": [{"name": "server", "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}],
            },
        }
        kube.pod_list = [pod, {**pod, "metadata": {**pod["metadata"], "name": "gone", "uid": "x",
                                                   "deletionTimestamp": "2026-01-01T00:00:09Z"}}]  # fmt: skip
        own(kube, "pool", *kube.pod_list)
        kube.slices = [
            {
                "ports": [{"name": "http", "port": server.http_port}],
                "endpoints": [
                    {
                        "addresses": ["127.0.0.1"],
                        "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "name": "pool-0", "uid": "pod-0"},
                    }
                ],
            }
        ]
        reconciler.reconcile_server(add_server(kube, "pool"))
        (_, _, status) = kube.statuses[-1]
        (entry,) = status["pods"]
        startup = httpx.get(f"{server.base_url}/v2/kubeinfer/startup").json()
        assert entry["name"] == "pool-0" and entry["created"] == "2026-01-01T00:00:00.000Z"
        assert entry["seconds"]["scheduled"] == 1.0 and entry["seconds"]["containerStarted"] == 1.0
        assert pod_start.complete(entry) and entry == pod_start.pod_timeline(pod, startup)
        # complete: the next reconcile does not ask the server again
        asked: list[str] = []
        monkeypatch.setattr(reconciler.server_controller, "_startup", lambda url, access: asked.append(url))
        reconciler.reconcile_server(add_server(kube, "pool"))
        assert asked == [] and kube.statuses[-1][2]["pods"] == [entry]
    finally:
        server.terminate()


def test_an_endpoint_whose_pod_the_pool_does_not_own_is_never_read(
    reconciler: Reconciler, kube: FakeKube, root: Path, tmp_path: Path
) -> None:
    """A pod with the pool's labels is in its Service's endpoints, but no ReplicaSet of the pool's Deployment
    controls it: the operator never calls it (here it would answer every call with 150 MB) and the model's
    status counts the real replica only."""
    folder = root / NS / "pool"
    folder.mkdir(parents=True)
    server = start_server(folder, "--model-control-mode", "poll", "--repository-poll-secs", "1", log_dir=tmp_path)
    huge = b"[" + b" " * (150 << 20) + b"]"
    paths = ("/v2/repository/index", "/v2/repository/poll", "/v2/models/m/stats", "/v2/kubeinfer/startup")
    posing = HostileServer(dict.fromkeys(paths, lambda h: send(h, 200, huge)))
    try:
        kube.slices = [
            {
                "ports": [{"name": "http", "port": port}],
                "endpoints": [
                    {
                        "addresses": ["127.0.0.1"],
                        "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "name": name, "uid": f"uid-{name}"},
                    }
                ],
            }
            for name, port in (("pool-0", server.http_port), ("posing", posing.port))
        ]
        labels = {"app.kubernetes.io/name": "kubeinfer-server", "app.kubernetes.io/instance": "pool"}
        real = {"metadata": {"name": "pool-0", "uid": "uid-pool-0", "labels": dict(labels)}}
        own(kube, "pool", real)
        kube.pod_list = [real, {"metadata": {"name": "posing", "uid": "uid-posing", "labels": dict(labels)}}]
        reconciler.reconcile_server(add_server(kube, "pool"))
        body = model("pool")
        kube.objects[(MODELS, NS, "m")] = body
        reconciler.reconcile_model(body, recheck=False)

        def ready() -> dict[str, Any] | None:
            new = reconciler.reconcile_model(body, from_timer=True, max_age=0.0, recheck=False)
            return new if new is not None and condition(new, "Ready")["status"] == "True" else None

        status = wait_for("the model Ready", ready, timeout=30, describe=lambda: kube.statuses[-1:])
        (row,) = status["versionStates"]
        assert (row["replicas"], row["readyReplicas"]) == (1, 1)
        plural, _, server_status = kube.statuses[0]
        assert plural == SERVERS and [p["name"] for p in server_status["pods"]] == ["pool-0"]  # status.pods
        assert posing.seen.paths == []
    finally:
        posing.close()
        server.terminate()


def test_the_service_selects_on_the_pool_uid_once_every_pod_carries_it(
    reconciler: Reconciler, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrading the operator: a pool made before the uid label has pods without it, so its Service keeps
    selecting by name (else those pods would get no requests until the rollout ends); once every pod of the
    pool carries the label, the Service selects on it. A new pool (no pods yet) selects on it at once."""
    from kubeinfer.operator.replicas import pool_pods

    monkeypatch.setattr(pool_pods, "MIN_AGE", 0.0)  # each reconcile lists the pods afresh

    def selector() -> dict[str, str]:
        return next(m for m in reversed(kube.applied) if m["kind"] == "Service")["spec"]["selector"]

    body = add_server(kube, "pool")
    reconciler.reconcile_server(body)
    assert selector()["serving.kubeinfer.io/pool-uid"] == "uid-pool"  # no pods: nothing to wait for

    old = {"metadata": {"name": "pool-old", "uid": "uid-old", "labels": {"app.kubernetes.io/instance": "pool"}}}
    new = {"metadata": {"name": "pool-new", "uid": "uid-new", "labels": {"serving.kubeinfer.io/pool-uid": "uid-pool"}}}
    kube.pod_list = [old, new]
    own(kube, "pool", *kube.pod_list)
    reconciler.reconcile_server(body)  # mid-rollout: an old pod without the label still serves
    assert "serving.kubeinfer.io/pool-uid" not in selector()
    kube.pod_list = [new]
    reconciler.reconcile_server(body)
    assert selector()["serving.kubeinfer.io/pool-uid"] == "uid-pool"
    # a pod with the pool's labels that no ReplicaSet of the pool controls changes nothing
    kube.pod_list = [new, {"metadata": {"name": "posing", "uid": "uid-posing", "labels": {}}}]
    reconciler.reconcile_server(body)
    assert selector()["serving.kubeinfer.io/pool-uid"] == "uid-pool"


# ---- events: one per model created, when the replicas load it at once ---------------------------------------
def test_a_model_ready_right_after_its_render_gets_one_event_that_says_both(
    reconciler: Reconciler, kube: FakeKube, root: Path, events: list[tuple[str, str, str]], tmp_path: Path
) -> None:
    """The replicas are asked to load the rendered folder at once, and the status waits for their answer: the
    render and the readiness are one Ready event (a bulk apply's event posts were a quarter of its CPU)."""
    folder = root / NS / "pool"
    folder.mkdir(parents=True)
    server = start_server(folder, "--model-control-mode", "poll", "--repository-poll-secs", "3600", log_dir=tmp_path)
    try:
        kube.slices = [
            {
                "ports": [{"name": "http", "port": server.http_port}],
                "endpoints": [
                    {
                        "addresses": ["127.0.0.1"],
                        "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "name": "pool-0", "uid": "pod-0"},
                    }
                ],
            }
        ]
        kube.pod_list = [{"metadata": {"name": "pool-0", "uid": "pod-0"}}]
        own(kube, "pool", *kube.pod_list)
        add_server(kube, "pool")
        body = model("pool")
        kube.objects[(MODELS, NS, "m")] = body  # what the recheck reads
        # the operator's start() also starts its watch, which this test has no use for
        reconciler.model_controller.rechecker.start()
        reconciler.reconcile_model(body)
        wait_for(
            "the Ready event",
            lambda: any(reason == "Ready" for _, reason, _ in events),
            timeout=30,
            describe=lambda: (events, [condition(s, "Ready") for _, _, s in kube.statuses]),
        )
        ready = [e for e in events if e[1] == "Ready"]
        assert len(ready) == 1 and ready[0][0] == "Normal", events
        assert ready[0][2].endswith("; rendered: created the model with versions [1]"), ready[0]
        assert "Rendered" not in {reason for _, reason, _ in events}, events
        assert condition(kube.statuses[-1][2], "Ready")["status"] == "True"
        assert [condition(s, "Ready")["reason"] for _, _, s in kube.statuses].count("Loading") == 0
    finally:
        server.terminate()


def test_a_watch_event_from_before_a_rollout_decision_keeps_the_decision(reconciler: Reconciler) -> None:
    """The watch may bring a status written before a rollout decision after the operator made it: the
    decided weights stay in force (the spec's would send a rolled-back canary traffic again)."""
    weights = [{"version": 1, "trafficPercent": 100}, {"version": 3, "trafficPercent": 0}]
    decided = {**model("pool"), "status": {"rollout": {"phase": "RolledBack", "generation": 1, "weights": weights}}}
    earlier = {**model("pool"), "status": {"rollout": {"phase": "Progressing", "generation": 1}}}
    reconciler.model_event("MODIFIED", decided)
    reconciler.model_event("MODIFIED", earlier)
    assert reconciler.models["uid-m"]["status"]["rollout"]["phase"] == "RolledBack"
    changed = model("pool", generation=2)  # a new spec: its own weights, whatever was decided before
    reconciler.model_event("MODIFIED", changed)
    assert "status" not in reconciler.models["uid-m"]


def test_a_deleted_model_leaves_nothing_behind(reconciler: Reconciler, kube: FakeKube, root: Path) -> None:
    """What the operator keeps about a model (its object, lock, render memo, generations) is one record, and
    the model's DELETED event removes it."""
    add_server(kube, "pool")
    body = model("pool")
    reconciler.model_event("ADDED", body)
    reconciler.reconcile_model(body, recheck=False)
    record = reconciler.records.get("uid-m")
    assert record is not None and record.body is not None and record.rendered is not None
    reconciler.model_event("DELETED", body)
    assert reconciler.records.get("uid-m") is None and "uid-m" not in reconciler.models


def test_forgetting_a_model_forgets_its_failure_backoff_and_rollout_window(
    reconciler: Reconciler, kube: FakeKube, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed render's backoff and the canary's window are in the model's record: the DELETED event's one
    removal takes them too, so a model made again under the same uid starts afresh (no backoff held over)."""
    add_server(kube, "pool")
    body = model("pool", path="uploads/missing.onnx")
    body["spec"]["versions"] = [
        {"version": 1, "source": {"path": "uploads/missing.onnx"}, "trafficPercent": 90},
        {"version": 2, "source": {"path": "uploads/missing.onnx"}, "trafficPercent": 10},
    ]
    syncs = counting_syncs(reconciler, monkeypatch)
    reconciler.model_event("ADDED", body)
    first = reconciler.reconcile_model(body, recheck=False)
    assert first is not None and condition(first, "Ready")["reason"] == "PathNotFound"
    record = reconciler.records.get("uid-m")
    assert record is not None and record.failures.of(1) is not None and record.rollout.generation == 1
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m"]  # held: within the failure's backoff
    reconciler.model_event("DELETED", body)
    assert reconciler.records.get("uid-m") is None
    reconciler.reconcile_model(body, from_timer=True, recheck=False)
    assert syncs == ["m", "m"]  # nothing held over: the resync renders again
    again = reconciler.records.get("uid-m")
    assert again is not None and again is not record and again.rollout.generation == 1


def test_a_model_deleted_during_its_reconcile_leaves_no_record(
    reconciler: Reconciler, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DELETED event comes while the reconcile is in the writer (a download): the reconcile's later steps
    (render memo, cold-start record, rollout window) write to the record it took, which went with the model, and
    do not make the model a new one that nobody would remove."""
    add_server(kube, "pool")
    body = model("pool", path="uploads/missing.onnx")
    body["spec"]["versions"] = [
        {"version": 1, "source": {"path": "uploads/missing.onnx"}, "trafficPercent": 90},
        {"version": 2, "source": {"path": "uploads/missing.onnx"}, "trafficPercent": 10},
    ]
    reconciler.model_event("ADDED", body)
    sync = reconciler.writer.sync_model

    def deleted_meanwhile(server_dir: Path, rendered: Any, **kw: Any) -> Any:
        reconciler.model_event("DELETED", body)
        return sync(server_dir, rendered, **kw)

    monkeypatch.setattr(reconciler.writer, "sync_model", deleted_meanwhile)
    reconciler.reconcile_model(body, recheck=False)
    assert reconciler.records.get("uid-m") is None
