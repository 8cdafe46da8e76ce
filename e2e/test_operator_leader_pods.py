"""End-to-end: the chart's operator Deployment with two replicas on the real node, liveness probed by the kubelet.

The kubelet probes ``/healthz`` on both pods (the chart's probe: 30 s initial delay, every 20 s, three
failures restart). A waiting follower must answer it: without that, it is restarted about 90 s after it
starts, forever. Killing the leader's pod hands the lease to the follower (after the lease expires, on
the follower's own clock); deleting a leader gracefully hands it over at once (the lease is released on
SIGTERM). No pod is ever restarted, and the leader of the moment reconciles.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeinfer"
API = "serving.kubeinfer.io/v1alpha1"
#: the chart's liveness probe gives up after initialDelay + failureThreshold × period
LIVENESS_DEADLINE = 30 + 3 * 20


def _pods(kubectl: Any, ns: str, release: str) -> dict[str, dict[str, Any]]:
    items = json.loads(
        kubectl("-n", ns, "get", "pods", "-l", f"app.kubernetes.io/instance={release}", "-o", "json").stdout
    )["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or ())


def test_two_operator_pods_hand_over_and_no_follower_is_restarted(cluster, node, images, kubectl, helm) -> None:
    suffix = uuid.uuid4().hex[:6]
    ops, team, release = f"e2e-lead-{suffix}", f"e2e-lead-team-{suffix}", f"lead{suffix}"
    lease = f"{release}-kubeinfer-operator"
    for ns in (ops, team):
        kubectl("create", "namespace", ns)
    repo, tag = images["operator"].rsplit(":", 1)

    def holder() -> str:
        obj = json.loads(kubectl("-n", ops, "get", "lease", lease, "-o", "json", check=False).stdout or "{}")
        return (obj.get("spec") or {}).get("holderIdentity") or ""

    def pod_of(identity: str) -> str | None:
        """Identities are '<hostname>-<random>', and a pod's hostname is its name."""
        return next((p for p in _pods(kubectl, ops, release) if identity.startswith(f"{p}-")), None)

    def describe() -> str:
        out = kubectl("-n", ops, "get", "pods,lease", "-o", "wide", check=False).stdout
        for p in _pods(kubectl, ops, release):
            out += kubectl("-n", ops, "logs", p, "--tail=30", check=False).stdout
        return out

    try:
        helm(
            "install", release, str(CHART), "-n", ops,
            "--set", "replicaCount=2",
            "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
            "--set", f"operator.watchNamespaces={{{team}}}",
            # a long lease: a graceful hand-over much faster than it proves the lease was released
            "--set", "lease.durationSeconds=45", "--set", "lease.renewDeadlineSeconds=30",
            "--set", "lease.retryPeriodSeconds=1",
        )  # fmt: skip
        wait_for(
            "two Ready operator pods and a leader",
            lambda: (
                len(pods := _pods(kubectl, ops, release)) == 2
                and all(_ready(p) for p in pods.values())
                and pod_of(holder())
            ),
            180,
            1,
            describe=describe,
        )
        leader = pod_of(holder())
        assert leader is not None
        follower = next(p for p in _pods(kubectl, ops, release) if p != leader)
        # the follower waits past the point where the kubelet would have restarted a silent one
        started = time.monotonic()
        wait_for(
            "the follower outliving the liveness deadline",
            lambda: time.monotonic() - started > LIVENESS_DEADLINE + 10,
            LIVENESS_DEADLINE + 30,
            5,
        )
        pods = _pods(kubectl, ops, release)
        assert _restarts(pods[follower]) == 0 and _ready(pods[follower]), describe()
        assert pod_of(holder()) == leader

        # the leader reconciles: an InferenceServer gets its Deployment
        server = {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": "pool", "namespace": team},
            "spec": {
                "image": "kubeinfer-server:absent",
                "replicas": 0,
            },
        }
        kubectl("apply", "-f", "-", input=json.dumps(server))
        wait_for(
            "the Deployment", lambda: kubectl("-n", team, "get", "deployment", "pool", check=False).returncode == 0
        )

        # killed: no release, the follower takes the lease once it expires on its own clock
        kubectl("-n", ops, "delete", "pod", leader, "--grace-period=0", "--force")
        wait_for("the follower leads", lambda: pod_of(holder()) == follower, 120, 1, describe=describe)
        # the Deployment's replacement becomes the new follower
        wait_for(
            "a replacement follower",
            lambda: len(pods := _pods(kubectl, ops, release)) == 2 and all(_ready(p) for p in pods.values()),
            120,
            1,
            describe=describe,
        )
        replacement = next(p for p in _pods(kubectl, ops, release) if p != follower)

        # deleted gracefully (SIGTERM): the lease is released, the replacement takes it at once
        kubectl("-n", ops, "delete", "pod", follower, "--wait=false")
        wait_for("the replacement leads", lambda: pod_of(holder()) == replacement, 20, 0.5, describe=describe)
        logs = kubectl("-n", ops, "logs", replacement).stdout
        assert "acquired lease" in logs
        kubectl("-n", team, "delete", "deployment", "pool")  # the new leader puts it back
        wait_for(
            "the Deployment repaired",
            lambda: kubectl("-n", team, "get", "deployment", "pool", check=False).returncode == 0,
            60,
        )
        pods = _pods(kubectl, ops, release)
        assert all(_restarts(p) == 0 for p in pods.values()), describe()
    finally:
        helm("uninstall", release, "-n", ops, check=False)
        for ns in (team, ops):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
