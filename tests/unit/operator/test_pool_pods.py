"""Which endpoints are a pool's own replicas (``pool_pods``), on plain objects as the API server returns them.

A pod is the pool's when its controller is a ReplicaSet, with the same pod-template-hash, that the pool's
current Deployment (named after the InferenceServer, controlled by its uid) controls. Labels alone prove
nothing: a tenant's pod with every label of the pool's pods is not a replica. The listing is shared by all of
a pool's models and made again only for a pod it has not seen, at most once per ``min_age``.
"""

from __future__ import annotations

import copy
from typing import Any

from kubeinfer.operator.replicas.indexes import Endpoint, endpoints_from_slices
from kubeinfer.operator.replicas.pool_pods import PoolPods, proven_pods

SERVER, SERVER_UID, DEP_UID = "pool", "server-uid", "dep-uid"
SELECTOR = "app.kubernetes.io/name=kubeinfer-server,app.kubernetes.io/instance=pool"
LABELS = {"app.kubernetes.io/name": "kubeinfer-server", "app.kubernetes.io/instance": SERVER}


def ref(kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller}


def deployment(uid: str = DEP_UID, owner: str = SERVER_UID, name: str = SERVER) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": [ref("InferenceServer", SERVER, owner)]}}


def replica_set(mark: str, uid: str, dep_uid: str = DEP_UID) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{SERVER}-{mark}",
            "uid": uid,
            "labels": {**LABELS, "pod-template-hash": mark},
            "ownerReferences": [ref("Deployment", SERVER, dep_uid)],
        }
    }


def pod(name: str, mark: str | None = "abc", rs_uid: str | None = "rs-abc", controller: bool = True) -> dict[str, Any]:
    labels = {**LABELS, **({"pod-template-hash": mark} if mark else {})}
    owners = [ref("ReplicaSet", f"{SERVER}-{mark}", rs_uid, controller)] if rs_uid else []
    return {"metadata": {"name": name, "uid": f"uid-{name}", "labels": labels, "ownerReferences": owners}}


def endpoint(name: str, ip: str) -> Endpoint:
    return Endpoint(f"http://{ip}:8000", name, True, f"uid-{name}")


# --------------------------------------------------------------------------------------------- the proof


def test_only_pods_of_the_pools_own_replica_sets_are_proven() -> None:
    deployments = [deployment()]
    sets = [
        replica_set("abc", "rs-abc"),
        replica_set("old", "rs-old"),  # an older template of the same Deployment (a rollout): still the pool's
        replica_set("evil", "rs-evil", dep_uid="someone-elses-deployment"),
    ]
    pods = [
        pod("real-1"),
        pod("real-old", "old", "rs-old"),
        pod("posing", rs_uid=None),  # every label of the pool's pods (the template hash too), no owner
        pod("posing-by-name", None, None),  # the labels the Service used to select on, no owner
        pod("other-rs", "evil", "rs-evil"),  # a ReplicaSet the pool's Deployment does not control
        pod("wrong-hash", "zzz", "rs-abc"),  # controlled by the pool's ReplicaSet, not from its template
        pod("not-controller", controller=False),  # an owner reference, but not its controller
        pod("no-hash", None, "rs-abc"),
    ]
    assert sorted(proven_pods(SERVER, SERVER_UID, deployments, sets, pods)) == ["real-1", "real-old"]


def test_the_deployment_must_be_the_current_pools() -> None:
    sets, pods = [replica_set("abc", "rs-abc")], [pod("real-1")]
    # a Deployment of an earlier InferenceServer of the same name (another uid), and one it does not control
    assert proven_pods(SERVER, SERVER_UID, [deployment(owner="earlier-uid")], sets, pods) == {}
    unowned = deployment()
    unowned["metadata"]["ownerReferences"][0]["controller"] = False
    assert proven_pods(SERVER, SERVER_UID, [unowned], sets, pods) == {}
    assert proven_pods(SERVER, SERVER_UID, [deployment(name="other")], sets, pods) == {}
    assert proven_pods(SERVER, "", [deployment(owner="")], sets, pods) == {}  # no server, nothing proven
    assert list(proven_pods(SERVER, SERVER_UID, [deployment()], sets, pods)) == ["real-1"]


def test_an_endpoint_is_proven_by_its_pods_name_and_uid() -> None:
    slices = [
        {
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [
                {"addresses": ["10.0.0.1"], "targetRef": {"kind": "Pod", "name": "real-1", "uid": "uid-real-1"}},
                {"addresses": ["10.0.0.2"], "targetRef": {"kind": "Pod", "name": "real-1", "uid": "another-pod"}},
                {"addresses": ["10.0.0.3"], "targetRef": {"kind": "Node", "name": "real-1", "uid": "uid-real-1"}},
                {"addresses": ["10.0.0.4"]},  # a hand-made slice naming no pod
            ],
        }
    ]
    found = endpoints_from_slices(slices)
    assert [e.pod_uid for e in found] == ["", "uid-real-1", "another-pod", ""]  # sorted by name, then URL
    lister = Lister([deployment()], [replica_set("abc", "rs-abc")], [pod("real-1")])
    proven, ignored = PoolPods(lister).check("ns", SERVER, SERVER_UID, SELECTOR, found)
    assert [e.url for e in proven] == ["http://10.0.0.1:8000"]
    assert len(ignored) == 3


# ------------------------------------------------------------------------------------- one listing per pool


class Lister:
    """Objects as the API server lists them, and the calls made (the three of one listing)."""

    def __init__(self, deployments: list[dict], sets: list[dict], pods: list[dict]) -> None:
        self.deployments_ = deployments
        self.sets = sets
        self.pod_list = pods
        self.calls: list[str] = []

    def deployments(self, namespace: str, name: str) -> list[dict[str, Any]]:
        self.calls.append("deployments")
        return copy.deepcopy(self.deployments_)

    def replica_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append("replicasets")
        return copy.deepcopy(self.sets)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append("pods")
        return copy.deepcopy(self.pod_list)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_pools_models_share_one_listing_and_a_new_pod_lists_again_at_most_every_min_age() -> None:
    lister = Lister([deployment()], [replica_set("abc", "rs-abc")], [pod("real-1"), pod("posing", rs_uid=None)])
    clock = Clock()
    pods = PoolPods(lister, max_age=30, min_age=2, clock=clock)
    endpoints = [endpoint("real-1", "10.0.0.1"), endpoint("posing", "10.0.0.9")]
    for _ in range(1000):  # a resync of 1,000 models of the pool
        proven, ignored = pods.check("ns", SERVER, SERVER_UID, SELECTOR, endpoints)
        assert [e.name for e in proven] == ["real-1"] and [e.name for e in ignored] == ["posing"]
    assert lister.calls == ["pods", "deployments", "replicasets"]  # one listing: three calls

    # a new replica: listed again at once (it counts as soon as it is proven), then not before min_age
    lister.pod_list.append(pod("real-2"))
    clock.now += 2.5
    more = [*endpoints, endpoint("real-2", "10.0.0.2"), endpoint("gone-too-fast", "10.0.0.3")]
    proven, _ = pods.check("ns", SERVER, SERVER_UID, SELECTOR, more)
    assert [e.name for e in proven] == ["real-1", "real-2"] and len(lister.calls) == 6
    clock.now += 1.0
    for _ in range(100):  # "gone-too-fast" is still unknown: no listing within min_age of the last
        pods.check("ns", SERVER, SERVER_UID, SELECTOR, more)
    assert len(lister.calls) == 6
    clock.now += 30  # max_age: listed again whatever the endpoints
    pods.check("ns", SERVER, SERVER_UID, SELECTOR, endpoints)
    assert len(lister.calls) == 9


def test_a_pool_recreated_under_the_same_name_is_listed_anew() -> None:
    lister = Lister([deployment()], [replica_set("abc", "rs-abc")], [pod("real-1")])
    pods = PoolPods(lister)
    assert pods.check("ns", SERVER, SERVER_UID, SELECTOR, [endpoint("real-1", "10.0.0.1")])[0]
    lister.deployments_ = [deployment(uid="dep-2", owner="server-uid-2")]
    assert not pods.check("ns", SERVER, "server-uid-2", SELECTOR, [endpoint("real-1", "10.0.0.1")])[0]


def test_whether_every_proven_pod_carries_a_label() -> None:
    real, old = pod("real-1"), pod("real-old", "old", "rs-old")
    real["metadata"]["labels"]["serving.kubeinfer.io/pool-uid"] = SERVER_UID
    posing = pod("posing", rs_uid=None)  # not proven: what it carries does not matter
    lister = Lister([deployment()], [replica_set("abc", "rs-abc"), replica_set("old", "rs-old")], [real, old, posing])
    members = PoolPods(lister).members("ns", SERVER, SERVER_UID, SELECTOR)
    assert not members.all_carry("serving.kubeinfer.io/pool-uid", SERVER_UID)  # the old pod lacks it
    lister.pod_list = [real, posing]
    members = PoolPods(lister).members("ns", SERVER, SERVER_UID, SELECTOR)
    assert members.all_carry("serving.kubeinfer.io/pool-uid", SERVER_UID)
    lister.pod_list = []
    assert PoolPods(lister).members("ns", SERVER, SERVER_UID, SELECTOR).all_carry("x", "y")  # a pool of no pods
