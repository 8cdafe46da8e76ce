"""Issue 27 part 2 on real pods: a pool of 3 replicas with ``spec.modelCache`` whose budget fits about 5 of
its 20 models serves requests to all 20 in turn with 0 failures.

The operator runs on the host (its own claim on a hostPath volume of the real node) and renders 20
InferenceModels (ONNX, each a random 1 MiB weight, so every answer says which model computed it) for a pool
of 3 pods of this tree's server image with ``modelCache: {memoryBudget, loadTimeoutSeconds}``. Every model
is Ready before any is loaded (ON_DEMAND on each replica); then 3 rounds of requests through the Service
to all 20 in turn (tritonclient HTTP, connections spread over the replicas): every answer right, none
failed, and the replicas' metrics count evictions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient

from tests.support.host_operator import HostOperator, InNamespace, host_operator, matmul_model, pool_server
from tests.support.models import matmul
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

POOL = "cache-pool"
SIZE = 512  # 1 MiB of weight per model; a load measured ~1.1 MiB in tests/integration/test_model_cache.py
MODELS = 20
BUDGET = "6Mi"  # about 5 of them


@dataclass
class Pool(InNamespace):
    op: HostOperator
    weights: dict[str, np.ndarray]

    def describe(self) -> str:
        out = self.kubectl("get", "isrv,im,pods", "-o", "wide", check=False).stdout
        return out + "\n--- operator:\n" + self.op.log.read_text(errors="replace")[-5000:]

    def pod_ips(self) -> list[str]:
        pods = self.get("pods")["items"]
        return [
            p["status"]["podIP"] for p in pods if p["status"].get("podIP") and p["metadata"]["name"].startswith(POOL)
        ]


@pytest.fixture(scope="module")
def pool(cluster: Any, node: dict, images: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    assert images["info"]["images"][0]["role"] == "server"
    with host_operator(cluster, node, "e2e-cache", tmp_path_factory.mktemp("model-cache")) as op:
        uploads = op.uploads()
        weights = {}
        for i in range(MODELS):
            model, weight = matmul(SIZE, seed=i)
            onnx.save(model, uploads / f"m{i:02d}.onnx")
            weights[f"m{i:02d}"] = weight
        p = Pool(cluster, op.ns, op, weights)
        p.apply(pool_server(POOL, images, replicas=3, modelCache={"memoryBudget": BUDGET, "loadTimeoutSeconds": 60}))
        models = [matmul_model(name, POOL, SIZE) for name in weights]
        p.apply({"apiVersion": "v1", "kind": "List", "items": models})
        yield p


def test_every_model_is_ready_before_any_loads(pool: Pool) -> None:
    def all_ready() -> list | None:
        items = pool.get("inferencemodels").get("items") or []
        ready = [
            m
            for m in items
            if any(
                c["type"] == "Ready" and c["status"] == "True" for c in (m.get("status") or {}).get("conditions") or []
            )
            and ((m.get("status") or {}).get("versionStates") or [{}])[0].get("readyReplicas") == 3
        ]
        return ready if len(ready) == MODELS else None

    ready = wait_for_cluster("20 models Ready on 3 replicas", all_ready, 600, describe=pool.describe)
    states = {m["metadata"]["name"]: m["status"]["versionStates"][0]["state"] for m in ready}
    assert set(states.values()) == {"ON_DEMAND"}, states
    message = next(c["message"] for c in ready[0]["status"]["conditions"] if c["type"] == "Ready")
    assert "loaded on demand: now on 0 of 3 replicas" in message, message
    pod = pool.get("deployment", POOL)["spec"]["template"]["spec"]["containers"][0]
    assert "--model-cache-memory-budget=6Mi" in pod["args"] and "--model-load-on-demand=true" in pod["args"]


def test_twenty_models_in_turn_with_zero_failures(pool: Pool) -> None:
    ip = pool.get("service", POOL)["spec"]["clusterIP"]
    rng = np.random.default_rng(3)
    failures: list[str] = []
    ok = 0
    # six keep-alive connections, each placed by kube-proxy on a replica of its choosing
    clients = [httpclient.InferenceServerClient(f"{ip}:8000", network_timeout=90) for _ in range(6)]
    try:
        for _round in range(3):
            for k, (name, weight) in enumerate(pool.weights.items()):
                x = rng.standard_normal((1, SIZE), dtype=np.float32)
                inp = httpclient.InferInput("IN", [1, SIZE], "FP32")
                inp.set_data_from_numpy(x)
                try:
                    out = clients[k % len(clients)].infer(name, [inp]).as_numpy("OUT")
                except Exception as exc:  # every failure is counted
                    failures.append(f"{name}: {str(exc)[:200]}")
                    continue
                if np.allclose(out, x @ weight, rtol=1e-3, atol=1e-2):
                    ok += 1
                else:
                    failures.append(f"{name}: wrong answer")
    finally:
        for c in clients:
            c.close()
    evictions = loads = 0.0
    loaded = []
    for pod_ip in pool.pod_ips():
        for line in httpx.get(f"http://{pod_ip}:8002/metrics", timeout=10).text.splitlines():
            if line.startswith("kubeinfer_model_cache_evictions{") and 'reason="budget"' in line:
                evictions += float(line.rsplit(" ", 1)[1])
            elif line.startswith("kubeinfer_model_cache_loads{"):
                loads += float(line.rsplit(" ", 1)[1])
            elif line.startswith("kubeinfer_model_cache_loaded_models "):
                loaded.append(int(float(line.rsplit(" ", 1)[1])))
    print(
        f"\n[model cache pool] 3 replicas, budget {BUDGET} each, {MODELS} models, {3 * MODELS} requests: "
        f"{ok} right, {len(failures)} failed; loads {loads:.0f}, evictions {evictions:.0f}, loaded now per "
        f"replica {loaded}"
    )
    assert failures == [] and ok == 3 * MODELS
    assert evictions > 0
    assert len(loaded) == 3 and all(n <= 6 for n in loaded), loaded
