"""Which pods are provably an InferenceServer's own replicas: the only ones the operator talks to.

A Service selects pods by labels, and anyone who may create pods in the namespace can put those labels on
one: its address then shows up in the Service's EndpointSlices beside the real replicas. The operator reads
every endpoint's repository index (and statistics, start-up timeline, poll answers) and counts it as a
replica, so such a pod could make the operator read what it likes (an answer of 150 MB killed it) and lie
about what the pool serves. Labels prove nothing; ownership does, because only the controllers set it up
in a way the others agree with. A pod is the pool's when

* its controller (the ``ownerReference`` with ``controller: true``) is a ReplicaSet of the namespace,
* whose controller is the pool's current Deployment: the one named after the InferenceServer and
  controlled by it (its uid, so a Deployment of an earlier InferenceServer of the same name does not count),
* and the pod's ``pod-template-hash`` label is that ReplicaSet's (the ReplicaSet controller's own mark).

Endpoints whose pod is not proven (or whose slice names no pod) are ignored: not read, not counted.

Cost: three list calls per pool (its Deployment by name, its ReplicaSets and pods by the pool's labels),
shared by every model of the pool for ``max_age`` seconds; an endpoint naming a pod the last listing did
not see (a new replica) lists again, at most once per ``min_age`` seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .indexes import Endpoint

TEMPLATE_HASH = "pod-template-hash"
#: seconds a listing serves every model of the pool
MAX_AGE = 30.0
#: seconds between two listings of one pool, however many unknown pods its endpoints name
MIN_AGE = 2.0
#: pools kept beyond which those not listed for STALE_AFTER seconds are dropped; ignored endpoints logged
PRUNE_ABOVE = 256
STALE_AFTER = 600.0
WARNED_MAX = 4096
log = logging.getLogger("kubeinfer.operator")

Obj = Mapping[str, Any]


class PoolLister(Protocol):
    """The list calls the proof needs (``kube.Kube``)."""

    def deployments(self, namespace: str, name: str) -> list[dict[str, Any]]: ...

    def replica_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]: ...


def controller(obj: Obj) -> Obj | None:
    """The object's controller reference (at most one has ``controller: true``), or None."""
    return next((r for r in obj.get("metadata", {}).get("ownerReferences") or () if r.get("controller")), None)


def _controlled_by(obj: Obj, kind: str, uids: Collection[str]) -> bool:
    ref = controller(obj)
    return ref is not None and ref.get("kind") == kind and ref.get("uid") in uids


def proven_pods(
    server_name: str, server_uid: str, deployments: Iterable[Obj], replica_sets: Iterable[Obj], pods: Iterable[Obj]
) -> dict[str, Obj]:
    """The pods (by name) that are provably the pool's replicas: see the module's docstring."""
    if not server_uid:
        return {}
    current = {
        str(d["metadata"].get("uid"))
        for d in deployments
        if d["metadata"].get("name") == server_name and _controlled_by(d, "InferenceServer", {server_uid})
    }
    hashes: dict[str, str] = {}
    for rs in replica_sets:
        mark = (rs["metadata"].get("labels") or {}).get(TEMPLATE_HASH)
        if mark and _controlled_by(rs, "Deployment", current):
            hashes[str(rs["metadata"].get("uid"))] = mark
    out: dict[str, Obj] = {}
    for pod in pods:
        ref = controller(pod)
        if ref is None or ref.get("kind") != "ReplicaSet" or ref.get("uid") not in hashes:
            continue
        if (pod["metadata"].get("labels") or {}).get(TEMPLATE_HASH) == hashes[str(ref.get("uid"))]:
            out[pod["metadata"]["name"]] = pod
    return out


@dataclass(frozen=True)
class Members:
    """One listing of a pool: its proven pods by name, and every pod name the listing saw."""

    pods: Mapping[str, Obj]
    seen: frozenset[str]
    at: float

    def proves(self, endpoint: Endpoint) -> bool:
        """The endpoint names a proven pod, by name and uid (the EndpointSlice controller's targetRef has both)."""
        pod = self.pods.get(endpoint.name)
        return pod is not None and bool(endpoint.pod_uid) and endpoint.pod_uid == pod["metadata"].get("uid")

    def knows(self, endpoint: Endpoint) -> bool:
        """The listing saw the endpoint's pod (proven or not): listing again would say nothing new about it."""
        return not endpoint.pod_uid or endpoint.name in self.seen

    def all_carry(self, label: str, value: str) -> bool:
        """Every proven pod carries ``label: value`` (true of none)."""
        return all((p["metadata"].get("labels") or {}).get(label) == value for p in self.pods.values())


class PoolPods:
    """Proven pods per pool, listed at most once per ``max_age`` seconds and shared by all its models."""

    def __init__(
        self,
        kube: PoolLister,
        max_age: float = MAX_AGE,
        min_age: float = MIN_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.max_age = max_age
        self.min_age = min_age
        self.clock = clock
        self._cache: dict[tuple[str, str, str], Members] = {}
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        #: (namespace, pod uid) of ignored endpoints already logged
        self._warned: set[tuple[str, str]] = set()
        self.listings = 0  # for the tests and the benchmark

    def members(self, namespace: str, server: str, uid: str, selector: str, max_age: float | None = None) -> Members:
        """The pool's proven pods, listed at most ``max_age`` (default: the instance's) seconds ago; the pods and
        ReplicaSets are listed by ``selector`` (the pool's labels). Raises what the API calls raise."""
        key = (namespace, server, uid)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # concurrent models of one pool wait for one listing
            hit = self._cache.get(key)
            age = self.max_age if max_age is None else max_age
            if hit is not None and self.clock() - hit.at <= age:
                return hit
            at = self.clock()
            self.listings += 1
            pods = self.kube.pods(namespace, selector)
            proven = proven_pods(
                server, uid, self.kube.deployments(namespace, server), self.kube.replica_sets(namespace, selector), pods
            )
            seen = frozenset(str(p["metadata"].get("name")) for p in pods)
            found = self._cache[key] = Members(proven, seen, at)
        if len(self._cache) > PRUNE_ABOVE:
            self._prune()
        return found

    def check(
        self, namespace: str, server: str, uid: str, selector: str, endpoints: list[Endpoint]
    ) -> tuple[list[Endpoint], list[Endpoint]]:
        """(the endpoints of proven pods, the ignored ones); lists again when an endpoint names a pod the
        last listing did not see, unless that listing is younger than ``min_age``."""
        members = self.members(namespace, server, uid, selector)
        if not all(members.knows(e) for e in endpoints):
            members = self.members(namespace, server, uid, selector, max_age=self.min_age)
        proven = [e for e in endpoints if members.proves(e)]
        ignored = [e for e in endpoints if not members.proves(e)]
        for e in ignored:
            with self._guard:
                new = (namespace, e.pod_uid or e.url) not in self._warned
                if len(self._warned) > WARNED_MAX:
                    self._warned.clear()
                self._warned.add((namespace, e.pod_uid or e.url))
            if new:
                log.warning(
                    "InferenceServer %s/%s: ignoring endpoint %s (%s): not a pod of the pool's Deployment",
                    namespace,
                    server,
                    e.url,
                    e.name,
                )
        return proven, ignored

    def _prune(self) -> None:
        """Forget pools not listed for a while (deleted, or recreated under another uid)."""
        cutoff = self.clock() - STALE_AFTER
        with self._guard:
            for key in [k for k, m in self._cache.items() if m.at < cutoff]:
                self._cache.pop(key, None)
                self._locks.pop(key, None)
