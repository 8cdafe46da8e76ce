"""The tenant drill (issue #37): one hostile namespace and two good ones on the real node, one operator for all three.

The operator is a host process (this tree's code, the chart's defaults for byte limits, download slots and
workers, resync every 3 s) with its own claim on a hostPath volume of the real node; every pool is real pods of
this tree's server image. Before the drill each good namespace has a pool of one replica up, and the hostile one a
pool of one replica with ``spec.modelCache`` (a budget for about 2 of its 4 models). Then, in this order:

* the hostile namespace applies, at once, everything issue #37 names:

  - **the fake replica**: a pod with every label of the hostile pool's real pod but the ReplicaSet's hash (so
    it is among the pool Service's ready endpoints), answering every request with 150 MB of JSON;
  - **two archive bombs** as SavedModel archives on its uploads folder: 32 GiB of zeros in one entry (32 MB of
    gzip), and a 16 MiB pax header (a few KiB of gzip);
  - **a sparse 50 GB file**, twice: as an ONNX model's ``source.path``, and planted over a rendered model's
    ``config.pbtxt`` and source record once the operator wrote them;
  - **a folder of 200,000 entries**: a model's folder in its own folder on the volume, filled before the model
    is applied. Twice the operator's listing cap (``MAX_FOLDER_ENTRIES``, 100,000) rather than a million: past
    the cap the operator lists no further whatever the count, and empty files cost this 2-core VM 25 µs each
    when idle and 170-215 µs while other suites run (200,000 took 34-43 s in the runs; the time is printed), so a
    million would take minutes to create and as long again to delete;
  - **a host-name grab**: a scale-to-zero pool (KEDA's HTTP add-on, as ``e2e/test_scale_to_zero.py`` runs it)
    asking the shared interceptor for the good namespaces' Service names;
  - **a model-cache thrasher**: a client cycling round-robin through the hostile pool's 4 models at up to 20
    requests a second, so that a request for a model not loaded must unload another one to load it;

* right after, each good namespace applies 10 small ONNX models (``source.path`` on its uploads folder).

Throughout (at least 30 s), a client sends tritonclient requests through the good pools' Services (health probes until a
namespace has a Ready model, then inferences round-robin over its Ready models, each answer checked). Asserted
and printed: every good model Ready within 60 s of its apply; 0 failed requests; the operator process never
exits (it is never restarted) and its peak RSS stays under 400 MB; each hostile object ends in the condition (or
the refusal) that names its rule, the fake replica receives no request, and the thrasher is refused by
``--model-cache-swaps-per-minute`` (no more than 60 unloads a minute).

Left out on purpose: the server reads a model's ``config.pbtxt`` whole, without a size limit, so the sparse file
planted in a *served* pool's model folder would make that pool's server read 50 GB into memory; it is planted
here in a pool with no replica, where only the operator reads it.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import shutil
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from kubeinfer.operator.servers import manifests
from kubeinfer.operator.volume.repository_writer import MAX_FOLDER_ENTRIES, SOURCE_MARKER
from onnx import TensorProto

from tests.support import drills, posing
from tests.support.archive_bombs import pax_tgz, zeros_tgz
from tests.support.host_operator import HostOperator, InNamespace, host_operator, pool_server
from tests.support.models import matmul, unary
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

API = "serving.kubeinfer.io/v1alpha1"
#: the served pool of each namespace
POOL = "pool"
#: the hostile namespace's pool without replicas: the models whose files are the attack
STASH = "stash"
GRAB = "grabber"
GOOD_MODELS = 10
#: seconds a good model may take from its apply to Ready
BUDGET = 60.0
#: the operator's resident set size must stay under this (bytes)
RSS_LIMIT = 400_000_000
#: the chart's default --max-artifact-bytes (the operator runs with it)
MAX_BYTES = 20 << 30
#: entries of the crowded folder: twice the listing cap
ENTRIES = 2 * MAX_FOLDER_ENTRIES
SPARSE = 50 * 10**9
THRASH_MODELS = 4
#: 1 MiB of weight per thrashed model; the hostile pool's budget fits about two of them
THRASH_SIZE = 512
CACHE_BUDGET = "3Mi"
#: the fastest the thrasher sends (requests a second): 20 swaps a second against a limit of 60 a minute
THRASH_RATE = 20.0
TOKEN = "e2e-drill-token"
#: the drill lasts at least this long from the hostile apply (ten resyncs of the operator with the fake replica
#: among the endpoints, the thrasher refused most of the time), the good traffic running throughout
DRILL_SECONDS = 30.0
#: the server's default --model-cache-swaps-per-minute
SWAPS_PER_MINUTE = 60


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}


def with_reason(obj: dict[str, Any], reason: str) -> dict[str, Any] | None:
    """The object's condition whose reason is ``reason`` (any type), or None."""
    return next((c for c in conditions(obj).values() if c.get("reason") == reason), None)


def onnx_model(name: str, pool: str, path: str, dims: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {
            "server": pool,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 4,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [dims]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [dims]}],
            "versions": [{"version": 1, "source": {"path": path}}],
        },
    }


def saved_model(name: str, path: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceModel",
        "metadata": {"name": name},
        "spec": {
            "server": STASH,
            "platform": "tensorflow_savedmodel",
            "versions": [{"version": 1, "source": {"path": path}}],
        },
    }


def as_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


@dataclass
class Traffic:
    """Requests through the good pools' Services, in a thread: health probes while a namespace has no Ready model,
    then inferences round-robin over its Ready models (``ready``, filled by the test); every failure is kept."""

    services: dict[str, str]
    stop: threading.Event
    ready: dict[str, list[str]] = field(default_factory=dict)
    inferences: Counter[str] = field(default_factory=Counter)
    probes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        clients = {
            ns: httpclient.InferenceServerClient(address, connection_timeout=10, network_timeout=30)
            for ns, address in self.services.items()
        }
        rng = np.random.default_rng(0)
        turn = 0
        try:
            while not self.stop.is_set():
                for ns, client in clients.items():
                    names = list(self.ready.get(ns, ()))
                    what = f"{ns}: health probe"
                    try:
                        if not names:
                            if client.is_server_ready():
                                self.probes[ns] += 1
                            else:
                                self.failures.append(f"{what}: not ready")
                            continue
                        name = names[turn % len(names)]
                        what = f"{ns}/{name}"
                        x = rng.standard_normal((1, 4)).astype(np.float32)
                        inp = httpclient.InferInput("IN", [1, 4], "FP32")
                        inp.set_data_from_numpy(x)
                        out = client.infer(name, [inp]).as_numpy("OUT")
                        if out is not None and np.allclose(out, np.maximum(x, 0)):
                            self.inferences[ns] += 1
                        else:
                            self.failures.append(f"{what}: wrong answer {out!r} for {x!r}")
                    except Exception as exc:  # every failure is counted, whatever raised it
                        self.failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:300]}")
                turn += 1
                self.stop.wait(0.05)
        finally:
            for client in clients.values():
                client.close()


@dataclass
class Thrasher:
    """The hostile tenant's client: its pool's models round-robin, straight to its real replica (its Service also
    leads to the fake one), at most THRASH_RATE requests a second; counts the answers by kind."""

    url: str
    names: list[str]
    stop: threading.Event
    answers: Counter[str] = field(default_factory=Counter)
    other: list[str] = field(default_factory=list)

    def run(self) -> None:
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, THRASH_SIZE], "data": [0.5] * THRASH_SIZE}]}
        turn = 0
        with httpx.Client(timeout=60) as client:
            while not self.stop.wait(1 / THRASH_RATE):
                name = self.names[turn % len(self.names)]
                turn += 1
                try:
                    r = client.post(f"{self.url}/v2/models/{name}/infer", json=body)
                except httpx.HTTPError as exc:
                    self.answers[type(exc).__name__] += 1
                    continue
                if r.status_code == 200:
                    self.answers["answered"] += 1
                elif r.status_code == 503 and "--model-cache-swaps-per-minute" in r.text:
                    self.answers["refused by the swap limit"] += 1
                else:
                    self.answers[f"HTTP {r.status_code}"] += 1
                    self.other.append(r.text[:300])


@dataclass
class Drill:
    cluster: Any
    images: dict[str, Any]
    op: HostOperator
    evil: InNamespace
    good: list[InNamespace]
    http_addon: Any
    stop: threading.Event
    rss: list[int]
    crowd_seconds: float
    #: the sizes of planted's config.pbtxt and source record right after they were made sparse 50 GB files
    planted_sizes: list[int] = field(default_factory=list)

    def describe(self) -> str:
        out = [
            f"--- {ns.ns}\n" + ns.kubectl("get", "isrv,im,pods", "-o", "wide", check=False).stdout
            for ns in (self.evil, *self.good)
        ]
        return "\n".join(out) + "\n--- operator:\n" + self.op.log.read_text(errors="replace")[-6000:]

    def stash(self) -> Path:
        """The hostile stash pool's folder on the volume."""
        return self.op.root / self.evil.ns / STASH

    def alive(self) -> None:
        assert self.op.proc.poll() is None, "the operator exited\n" + self.describe()


def _crowd(folder: Path, n: int) -> float:
    """``n`` empty files in ``folder`` (made here); the seconds it took."""
    started = time.monotonic()
    folder.mkdir(parents=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            os.close(os.open(f"junk-{i:07d}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def drill(
    cluster: Any,
    node: dict[str, Any],
    images: dict[str, Any],
    http_addon: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Drill]:
    args = ("--prometheus-url", http_addon.prometheus_url, "--keda-http-scaler-address", http_addon.scaler_address)
    logs = tmp_path_factory.mktemp("tenant-drill")
    with host_operator(cluster, node, "e2e-drill", logs, args, others=("good-a", "good-b")) as op:
        stop = threading.Event()
        rss: list[int] = []
        threading.Thread(target=drills.sample_rss, args=(op.proc.pid, rss, stop), daemon=True).start()
        evil, good = InNamespace(cluster, op.ns), [InNamespace(cluster, ns) for ns in op.others]
        try:
            for ns in good:
                onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), op.uploads(ns.ns) / "relu.onnx")
                ns.apply(pool_server(POOL, images, replicas=1))
            uploads = op.uploads()
            thrashed = []
            for i in range(THRASH_MODELS):
                model, _ = matmul(THRASH_SIZE, seed=i)
                onnx.save(model, uploads / f"m{i}.onnx")
                thrashed.append(onnx_model(f"m{i}", POOL, f"uploads/m{i}.onnx", dims=THRASH_SIZE))
            cache = {"memoryBudget": CACHE_BUDGET, "loadTimeoutSeconds": 30}
            evil.apply(as_list([pool_server(POOL, images, replicas=1, modelCache=cache), *thrashed]))
            # the hostile tenant's files, made while the pods start
            onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
            zeros_tgz(uploads / "bomb-zeros.tgz", [("saved_model.pb", 32 << 30)])
            pax_tgz(uploads / "bomb-headers.tgz", 16 << 20)
            (uploads / "sparse.onnx").touch()
            os.truncate(uploads / "sparse.onnx", SPARSE)
            crowd_seconds = _crowd(op.root / op.ns / STASH / "crowded", ENTRIES)
            for ns in good:
                wait_for_cluster(
                    f"{ns.ns}/{POOL} serving through its Service",
                    functools.partial(_service_ready, ns),
                    300,
                    describe=lambda: evil.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout,
                )
            for m in thrashed:
                wait_for_cluster(
                    f"hostile model {m['metadata']['name']} Ready",
                    functools.partial(_ready, evil, m["metadata"]["name"]),
                    300,
                )
            yield Drill(cluster, images, op, evil, good, http_addon, stop, rss, crowd_seconds)
        finally:
            stop.set()
    shutil.rmtree(op.root, ignore_errors=True)  # the volume's folder: the crowded folder, the bombs, the uploads


def _ready(ns: InNamespace, model: str) -> bool:
    return conditions(ns.get("inferencemodel", model)).get("Ready", {}).get("status") == "True"


def _service_ready(ns: InNamespace) -> bool:
    service = ns.get("service", POOL)
    if not service:
        return False
    try:
        return httpx.get(f"http://{service['spec']['clusterIP']}:8000/v2/health/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _real_pod(ns: InNamespace) -> dict[str, Any]:
    """The one pod of the namespace's served pool."""
    listed = json.loads(ns.kubectl("get", "pods", "-l", manifests.selector_string(POOL), "-o", "json").stdout)
    (pod,) = [p for p in listed["items"] if "pod-template-hash" in p["metadata"]["labels"]]
    return dict(pod)


def _hostile_objects(d: Drill, real: dict[str, Any]) -> list[dict[str, Any]]:
    labels = {k: v for k, v in real["metadata"]["labels"].items() if k != "pod-template-hash"}
    assert labels[manifests.POOL_UID_LABEL] == d.evil.get("inferenceserver", POOL)["metadata"]["uid"]
    a, b = (ns.ns for ns in d.good)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "grab-token"},
        "data": {"token": base64.b64encode(TOKEN.encode()).decode()},
    }
    grab = pool_server(
        GRAB, d.images,
        replicas=0,
        auth={"tokenSecret": {"name": "grab-token"}},
        autoscaling={
            "minReplicas": 0, "maxReplicas": 1, "target": {"metric": "PendingRequests", "value": "10"},
            "scaleToZero": {"idleSeconds": 15, "hosts": [f"{POOL}.{a}", f"{POOL}.{b}.svc.cluster.local"]},
        },
    )  # fmt: skip
    return [
        posing.pod("replica", labels, d.images["server"]),
        pool_server(STASH, d.images, replicas=0),
        saved_model("bomb-zeros", "uploads/bomb-zeros.tgz"),
        saved_model("bomb-headers", "uploads/bomb-headers.tgz"),
        onnx_model("sparse", STASH, "uploads/sparse.onnx"),
        onnx_model("crowded", STASH, "uploads/relu.onnx"),
        onnx_model("planted", STASH, "uploads/relu.onnx"),
        secret,
        grab,
    ]


def _plant(d: Drill) -> bool:
    """Once the operator wrote ``planted``'s folder: its config.pbtxt and source record made sparse 50 GB files."""
    folder = d.stash() / "planted"
    files = [folder / "config.pbtxt", folder / "1" / SOURCE_MARKER]
    if not all(f.is_file() for f in files):
        return False
    for f in files:
        os.truncate(f, SPARSE)
    d.planted_sizes = [f.stat().st_size for f in files]
    return True


def _rewritten(d: Drill) -> bool:
    folder = d.stash() / "planted"
    try:
        return all(f.stat().st_size < 4096 for f in (folder / "config.pbtxt", folder / "1" / SOURCE_MARKER))
    except OSError:  # between the operator's moves
        return False


def test_a_hostile_namespace_beside_two_good_ones(drill: Drill) -> None:
    d = drill
    stop = threading.Event()
    services = {ns.ns: f"{ns.get('service', POOL)['spec']['clusterIP']}:8000" for ns in d.good}
    traffic = Traffic(services, stop)
    real = _real_pod(d.evil)
    thrasher = Thrasher(f"http://{real['status']['podIP']}:8000", [f"m{i}" for i in range(THRASH_MODELS)], stop)
    threads = [threading.Thread(target=t.run, daemon=True) for t in (traffic, thrasher)]
    threads[0].start()
    started = time.monotonic()

    # ---- the attack, and right after it the good namespaces' models
    d.evil.apply(as_list(_hostile_objects(d, real)))
    threads[1].start()
    applied: dict[str, float] = {}
    for ns in d.good:
        applied[ns.ns] = time.monotonic()
        ns.apply(as_list([onnx_model(f"good-{i}", POOL, "uploads/relu.onnx") for i in range(GOOD_MODELS)]))
    ready_after: dict[str, float] = {}
    planted = False
    while len(ready_after) < 2 * GOOD_MODELS and time.monotonic() - started < BUDGET + 30:
        d.alive()
        for ns in d.good:
            for m in ns.get("inferencemodels").get("items") or ():
                key = f"{ns.ns}/{m['metadata']['name']}"
                if key not in ready_after and conditions(m).get("Ready", {}).get("status") == "True":
                    ready_after[key] = time.monotonic() - applied[ns.ns]
                    traffic.ready.setdefault(ns.ns, []).append(m["metadata"]["name"])
        planted = planted or _plant(d)
        time.sleep(1.0)
    times = sorted(ready_after.values()) or [float("nan")]
    drills.note(
        f"tenant drill: {len(ready_after)}/{2 * GOOD_MODELS} good models Ready; seconds after their apply: "
        f"first {times[0]:.1f}, median {statistics.median(times):.1f}, last {times[-1]:.1f} (limit {BUDGET:.0f})"
    )
    assert len(ready_after) == 2 * GOOD_MODELS and times[-1] <= BUDGET, d.describe()

    # ---- each hostile object ends in the condition that names its rule
    seen_after: dict[str, float] = {}

    def reason(name: str, why: str, kind: str = "inferencemodel") -> str:
        """The message of the condition ``why`` the object ends in."""
        found = wait_for_cluster(
            f"{kind} {name}: {why}", lambda: with_reason(d.evil.get(kind, name), why), 120, describe=d.describe
        )
        assert found is not None
        seen_after[name] = time.monotonic() - started
        return str(found["message"])

    zeros = reason("bomb-zeros", "TooLarge")
    assert f"unpacks to more than the limit of {MAX_BYTES} bytes" in zeros and "'saved_model.pb'" in zeros, zeros
    headers = reason("bomb-headers", "TooLarge")
    assert "headers" in headers, headers
    sparse = reason("sparse", "TooLarge")
    assert f"source.path 'uploads/sparse.onnx' is larger than the operator's limit of {MAX_BYTES}" in sparse, sparse
    crowded = reason("crowded", "TooManyEntries")
    assert f"holds more than {MAX_FOLDER_ENTRIES} entries" in crowded, crowded
    grab = reason(GRAB, "HostRefused", "inferenceserver")
    for ns in d.good:
        assert f"is a Service name of namespace '{ns.ns}'" in grab, grab
    routes = json.loads(d.cluster.kubectl("get", "interceptorroutes", "-A", "-o", "json").stdout)["items"]
    routed = {h for r in routes for rule in r["spec"].get("rules") or () for h in rule.get("hosts") or ()}
    assert not {h for h in routed if any(ns.ns in h for ns in d.good)}, routed  # no route to a good Service name
    own = d.evil.get("interceptorroute", f"{GRAB}-http")["spec"]["rules"][0]["hosts"]
    assert own and all(h.startswith(f"{GRAB}.{d.evil.ns}") for h in own), own

    # the sparse config.pbtxt and source record are rewritten, never read (the operator's RSS says so below)
    planted = planted or wait_for_cluster("planted's files written", lambda: _plant(d), 60, describe=d.describe)
    assert d.planted_sizes == [SPARSE, SPARSE], d.planted_sizes
    wait_for_cluster("planted's sparse files rewritten", functools.partial(_rewritten, d), 60, describe=d.describe)
    seen_after["planted"] = time.monotonic() - started

    # the fake replica is among the Service's ready endpoints, seen by the operator, and never called
    fake = wait_for_cluster(
        "the fake replica running",
        lambda: d.evil.get("pod", "replica").get("status", {}).get("podIP"),
        120,
        describe=d.describe,
    )

    def fake_in_service() -> bool:
        slices = d.evil.get("endpointslices").get("items") or []
        return any(
            fake in (e.get("addresses") or ()) and (e.get("conditions") or {}).get("ready") is not False
            for s in slices
            if s["metadata"].get("labels", {}).get("kubernetes.io/service-name") == POOL
            for e in s.get("endpoints") or ()
        )

    wait_for_cluster("the fake replica among the pool Service's ready endpoints", fake_in_service, 60)
    ignored = f"InferenceServer {d.evil.ns}/{POOL}: ignoring endpoint http://{fake}:"
    wait_for_cluster(
        "the operator ignoring the fake replica", lambda: ignored in d.op.log.read_text(errors="replace"), 60
    )
    seen_after["replica"] = time.monotonic() - started
    # the thrasher meets the swap limit
    refused = "refused by the swap limit"
    wait_for_cluster("the thrasher refused by the swap limit", lambda: thrasher.answers[refused], 60)
    seen_after["thrasher"] = time.monotonic() - started
    while time.monotonic() - started < DRILL_SECONDS:  # the drill goes on: traffic, thrasher, resyncs
        d.alive()
        time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(60)
    duration = time.monotonic() - started
    d.alive()
    fake_requests = posing.requests_seen(d.evil.kubectl("logs", "replica", check=False).stdout)
    status = Path(f"/proc/{d.op.proc.pid}/status").read_text()
    hwm = int(next(x for x in status.splitlines() if x.startswith("VmHWM:")).split()[1]) * 1024
    peak = max([hwm, *d.rss])
    cache: Counter[str] = Counter()
    for line in httpx.get(f"http://{real['status']['podIP']}:8002/metrics", timeout=10).text.splitlines():
        if line.startswith("kubeinfer_model_cache_loads{"):
            cache["loads"] += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("kubeinfer_model_cache_evictions{") and 'reason="budget"' in line:
            cache["evictions"] += int(float(line.rsplit(" ", 1)[1]))

    drills.note(
        f"  good traffic through the Services over {duration:.0f} s: "
        + ", ".join(f"{ns}: {traffic.inferences[ns]} inferences + {traffic.probes[ns]} probes" for ns in services)
        + f"; failed {len(traffic.failures)}"
    )
    drills.note(
        f"  operator: exited 0 times (restarts 0), peak RSS {peak / 1e6:.0f} MB ({peak / (1 << 20):.0f} MiB; "
        f"{len(d.rss)} samples, limit {RSS_LIMIT / 1e6:.0f} MB)"
    )
    drills.note(
        f"  thrasher ({THRASH_MODELS} models, budget {CACHE_BUDGET}, up to {THRASH_RATE:.0f} requests/s): "
        f"{dict(thrasher.answers)}; the hostile replica's cache: {dict(cache)}"
    )
    drills.note(
        "  hostile objects in their conditions, seconds after the hostile apply: "
        + ", ".join(f"{name} {t:.1f}" for name, t in seen_after.items())
    )
    drills.note(f"  fake replica {fake}: {len(fake_requests)} requests received; the operator logged it ignored")
    drills.note(f"  bomb-zeros: {zeros}\n  bomb-headers: {headers}\n  sparse: {sparse}")
    drills.note(f"  crowded ({ENTRIES} entries, made in {d.crowd_seconds:.1f} s): {crowded}")
    drills.note(f"  planted: 50 GB config.pbtxt and {SOURCE_MARKER} rewritten unread\n  {GRAB}: {grab}")

    assert traffic.failures == [], traffic.failures[:20]
    assert all(traffic.inferences[ns] > 0 for ns in services), traffic.inferences
    assert peak < RSS_LIMIT, peak
    assert fake_requests == [], fake_requests
    assert not any(k.startswith("HTTP 5") and k != "HTTP 503" for k in thrasher.answers), thrasher.other[:5]
    # the thrasher's loads that unloaded another model: at most --model-cache-swaps-per-minute (60) a minute
    assert cache["evictions"] <= SWAPS_PER_MINUTE * math.ceil(duration / 60), (cache, thrasher.answers)
    assert "Traceback" not in d.op.log.read_text(errors="replace"), d.op.log.read_text(errors="replace")[-6000:]
