"""Issue 27 part 5 on real pods: sequences (stateful models) served by an InferenceServer of 2 replicas.

The operator runs on the host (its own claim on a hostPath volume of the real node); the pool runs 2 pods
of this tree's server image on the real node, with the operator's gRPC connection recycling on
(``--grpc-max-connection-age``, half of ``drainSeconds``: 2 s here). The model is the ONNX accumulator of
tests/integration/test_sequence_batching.py (OUTPUT = running sum of the sequence's INPUTs, the state kept
by the server). Clients call through the Service's ClusterIP, each step a second or so after the last:

* gRPC: one tritonclient channel (it reconnects after every GOAWAY);
* HTTP with a keep-alive connection (tritonclient.http);
* HTTP with a new connection per request (what a connection pool or a plain ``requests.post`` does).

1. ``spec.sessionAffinity: None`` (no remedy): steps that land on the other replica fail with Triton's
   "must specify the START flag" (or a wrong sum): what breaks, measured and printed;
2. the default (``Auto``): the pool's Service gets ``sessionAffinity: ClientIP`` (the model's
   ``SequenceRouting`` condition says so) and every step of every sequence is right, over all three clients.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.operator.models.render import config_to_spec
from kubeinfer.server.config import parse_config_text

from tests.integration.test_sequence_batching import ZERO_STATE, accumulator_onnx, onnx_config
from tests.support.host_operator import InNamespace, host_operator
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
POOL = "seq-pool"
MODEL = "acc"
STEPS = 5
PAUSE = 1.0  # seconds between the steps of a sequence (the model keeps a sequence 10 s idle)
SEQUENCES = 6  # per client


@dataclass
class Pool(InNamespace):
    root: Path
    log: Path
    images: dict

    def condition(self, name: str, ctype: str) -> dict[str, Any]:
        conds = (self.get("inferencemodel", name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def describe(self) -> str:
        out = self.kubectl("get", "isrv,im,pods,svc", "-o", "wide", check=False).stdout
        model = self.get("inferencemodel", MODEL)
        return (
            f"{out}\n--- {MODEL}: {json.dumps(model.get('status'))}\n--- operator:\n"
            + self.log.read_text(errors="replace")[-6000:]
        )

    def server(self, **spec: Any) -> None:
        self.apply(
            {
                "apiVersion": API,
                "kind": "InferenceServer",
                "metadata": {"name": POOL},
                "spec": {
                    # this build's own tag: another tree's build may retag the plain name meanwhile
                    "image": self.images["info"]["images"][0]["hash_ref"],
                    "imagePullPolicy": "IfNotPresent",
                    "replicas": 2,
                    "drainSeconds": 4,  # --grpc-max-connection-age=2000: channels recycle every ~2 s
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                    "server": {"pollIntervalSeconds": 1},
                    "probes": {"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1}},
                    **spec,
                },
            }
        )

    def cluster_ip(self) -> str:
        return str(self.get("service", POOL)["spec"]["clusterIP"])


@pytest.fixture(scope="module")
def pool(cluster: Any, node: dict, images: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    assert images["info"]["images"][0]["role"] == "server"
    with host_operator(cluster, node, "e2e-seq", tmp_path_factory.mktemp("sequence-replicas")) as op:
        p = Pool(cluster, op.ns, op.root, op.log, images)
        uploads = op.root / op.ns / "uploads"
        uploads.mkdir(parents=True, exist_ok=True)
        onnx.save(accumulator_onnx(), uploads / "acc.onnx")
        p.server(sessionAffinity="None")
        spec = config_to_spec(parse_config_text(onnx_config(MODEL, "direct { }", ZERO_STATE, idle_us=10_000_000)))
        spec.update(server=POOL, versions=[{"version": 1, "source": {"path": "uploads/acc.onnx"}}])
        p.apply({"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": MODEL}, "spec": spec})

        def on_both() -> dict | None:
            states = (p.get("inferencemodel", MODEL).get("status") or {}).get("versionStates") or []
            ok = p.condition(MODEL, "Ready").get("status") == "True"
            return states[0] if ok and states and states[0].get("readyReplicas") == 2 else None

        wait_for_cluster("the sequence model Ready on 2 replicas", on_both, 300, describe=p.describe)
        yield p


# ---- the clients ------------------------------------------------------------------------------------------


def _grpc_step(client: Any, value: int, sid: int, start: bool, end: bool) -> int:
    inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(MODEL, [inp], sequence_id=sid, sequence_start=start, sequence_end=end, client_timeout=30)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _http_step(client: Any, value: int, sid: int, start: bool, end: bool) -> int:
    inp = httpclient.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(MODEL, [inp], sequence_id=sid, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def _fresh_step(url: str, value: int, sid: int, start: bool, end: bool) -> int:
    """One request on a connection of its own (``Connection: close``), as a pool of connections spreads them."""
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": {"sequence_id": sid, "sequence_start": start, "sequence_end": end},
    }
    r = httpx.post(f"http://{url}/v2/models/{MODEL}/infer", json=body, headers={"Connection": "close"}, timeout=30)
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code} {r.json().get('error')}")
    return int(next(o for o in r.json()["outputs"] if o["name"] == "OUTPUT")["data"][0])


def _run(pool: Pool, base: int) -> dict[str, tuple[int, list[str]]]:
    """Every client's sequences at once; per client (steps answered right, what went wrong)."""
    ip = pool.cluster_ip()
    results: dict[str, tuple[int, list[str]]] = {}

    def client_loop(kind: str, offset: int) -> None:
        if kind == "grpc":
            client: Any = grpcclient.InferenceServerClient(f"{ip}:8001")
            step = lambda *a: _grpc_step(client, *a)  # noqa: E731
        elif kind == "http-keepalive":
            client = httpclient.InferenceServerClient(f"{ip}:8000", connection_timeout=10, network_timeout=30)
            step = lambda *a: _http_step(client, *a)  # noqa: E731
        else:
            client = None
            step = lambda *a: _fresh_step(f"{ip}:8000", *a)  # noqa: E731
        ok, problems = 0, []
        try:
            for k in range(SEQUENCES):
                sid = base + offset + k
                total = 0
                for i in range(STEPS):
                    total += i + 1
                    try:
                        got = step(i + 1, sid, i == 0, i == STEPS - 1)
                    except Exception as exc:  # every failure is counted, the sequence goes on
                        problems.append(f"sequence {sid} step {i}: {str(exc)[:160]}")
                    else:
                        if got == total:
                            ok += 1
                        else:
                            problems.append(f"sequence {sid} step {i}: sum {got}, expected {total}")
                    time.sleep(PAUSE)
        finally:
            if client is not None:
                client.close()
        results[kind] = (ok, problems)

    threads = [
        threading.Thread(target=client_loop, args=(kind, 100 * n))
        for n, kind in enumerate(("grpc", "http-keepalive", "http-fresh"))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def _report(title: str, results: dict[str, tuple[int, list[str]]]) -> str:
    lines = [f"[sequences across 2 replicas] {title}:"]
    for kind, (ok, problems) in sorted(results.items()):
        lines.append(f"  {kind}: {ok} of {SEQUENCES * STEPS} steps right, {len(problems)} wrong")
        lines += [f"    {p}" for p in problems[:3]]
    return "\n".join(lines)


def test_1_without_affinity_sequences_break_across_replicas(pool: Pool) -> None:
    """What breaks: the model's condition says so, and steps reaching the other replica fail."""
    cond = pool.condition(MODEL, "SequenceRouting")
    assert cond.get("status") == "False" and cond.get("reason") == "NoAffinity", cond
    assert pool.get("service", POOL)["spec"].get("sessionAffinity") == "None"
    results = _run(pool, base=1000)
    print("\n" + _report("spec.sessionAffinity None", results))
    # a new connection per request lands on either replica: a sequence of 5 steps stays on one with
    # probability 1/16, so 6 sequences all staying is (1/16)^6
    assert results["http-fresh"][1], results
    unknown = [p for p in results["http-fresh"][1] + results["grpc"][1] if "START flag" in p or "sum" in p]
    assert unknown, results


def test_2_client_affinity_keeps_every_sequence_on_its_replica(pool: Pool) -> None:
    pool.server()  # sessionAffinity: Auto (the default)

    def sticky() -> dict | None:
        spec = pool.get("service", POOL)["spec"]
        return spec if spec.get("sessionAffinity") == "ClientIP" else None

    svc = wait_for_cluster("the Service's ClientIP affinity", sticky, 60, describe=pool.describe)
    assert svc["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 30  # 2 x 10 s idle, at least 30
    wait_for_cluster(
        "SequenceRouting ClientAffinity",
        lambda: pool.condition(MODEL, "SequenceRouting").get("reason") == "ClientAffinity",
        60,
        describe=pool.describe,
    )
    results = _run(pool, base=2000)
    print("\n" + _report("spec.sessionAffinity Auto (ClientIP)", results))
    for kind, (ok, problems) in results.items():
        assert problems == [] and ok == SEQUENCES * STEPS, (kind, problems)
    # both replicas are still serving (the affinity pins clients, not the pool)
    pods = json.loads(pool.kubectl("get", "pods", "-l", f"app.kubernetes.io/instance={POOL}", "-o", "json").stdout)
    assert sum(1 for p in pods["items"] if p["status"].get("phase") == "Running") == 2
