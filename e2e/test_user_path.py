"""The user's path, for real: ``helm install`` → InferenceServer + InferenceModel → pods from our images on
the real node → tritonclient over HTTP and gRPC through the Service's ClusterIP.

Steps (one module sharing one installation; the installation and the served model are module fixtures,
``installed`` and ``served``, so steps 1-3 each run on their own; steps 4-7 go on from each other, in order):

1. ``helm install`` of the chart with its default values (only the watched namespace narrowed to this
   test's and a release name of its own, because other sessions share the cluster): the operator pod,
   from the locally built image, is Running and Ready, holds the leader Lease, and its claim is bound to
   a hostPath volume;
2. an InferenceServer (CPU pool, the locally built server image) and the example repository's CIFAR-10
   ResNet-18 as an InferenceModel whose version 1 the operator pod downloads over HTTP (sha256 checked)
   from a file server this test runs on the host; Ready with the served version;
3. tritonclient HTTP and gRPC through the Service's ClusterIP: the answers onnxruntime computes here;
4. version 2 (a file on the volume) added while 8 clients call through the Service: zero failures, the
   answers switch from version 1's to version 2's;
5. 2 replicas: both pods Ready and serving; the model's status counts both (read from every replica);
6. a pod deleted under load: the Service keeps answering (zero failures), the pod drains and exits
   cleanly within its grace period;
7. ``helm uninstall``: the operator is gone, the claim and the rendered models stay on the volume.
"""

from __future__ import annotations

import http.server
import inspect
import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from chart_release import CHART, EXAMPLES, Release, example_server, install_chart, ready, sha256, uninstall
from kubeinfer.server.examples import models

from tests.support.operator_logs import problems
from tests.support.waiting import wait_for, wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SERVER = "cpu-pool"
MODEL = "cifar10-resnet"
LABELS = "app.kubernetes.io/name=kubeinfer-server,app.kubernetes.io/instance=" + SERVER


@dataclass
class UserPath(Release):
    """What the steps share."""

    cluster: Any
    node: dict
    images: dict
    ns: str
    files_url: str
    #: unique: the chart's ClusterRole/Binding (PersistentVolumes) are named after the release, and other
    #: sessions may install the chart into the shared cluster at the same time
    release: str = "kubeinfer"
    volume: Path = Path()
    files: Path = Path()
    expected: dict[str, np.ndarray] = field(default_factory=dict)
    image: np.ndarray = field(default_factory=lambda: np.random.default_rng(7).random((1, 3, 32, 32), np.float32))

    def cluster_ip(self) -> str:
        return self.get("service", SERVER)["spec"]["clusterIP"]

    def condition(self, ctype: str = "Ready") -> dict:
        obj = self.get("inferencemodel", MODEL) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})

    def describe(self) -> str:
        out = self.kubectl("get", "inferenceservers,inferencemodels,deploy,pods,svc,pvc", "-o", "wide", check=False)
        op = self.kubectl("logs", f"deploy/{self.operator}", "--tail=40", check=False)
        model = self.get("inferencemodel", MODEL) or {}
        return f"{out.stdout}\n--- {MODEL} status: {json.dumps(model.get('status'))}\n--- operator:\n{op.stdout}"

    def server_pods(self) -> list[dict]:
        return (self.get("pods", selector=LABELS) or {}).get("items", [])


def server_default(dest: str) -> Any:
    """A kubeinfer-server flag's default, from its own parser."""
    from kubeinfer.server import cli

    params = inspect.signature(cli.build_parser).parameters
    parser = cli.build_parser(*([False] * sum(p.default is inspect.Parameter.empty for p in params.values())))
    return parser.get_default(dest)


def infer_http(url: str, image: np.ndarray, client: httpclient.InferenceServerClient | None = None):
    c = client or httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    inp = httpclient.InferInput("input", list(image.shape), "FP32")
    inp.set_data_from_numpy(image)
    result = c.infer(MODEL, [inp])
    return result.get_response()["model_version"], result.as_numpy("output")


def infer_grpc(url: str, image: np.ndarray, client: grpcclient.InferenceServerClient | None = None):
    c = client or grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("input", list(image.shape), "FP32")
    inp.set_data_from_numpy(image)
    result = c.infer(MODEL, [inp], client_timeout=30)
    return result.get_response().model_version, result.as_numpy("output")


# ------------------------------------------------------------------------------------------ load


@dataclass
class Load:
    """8 clients (4 HTTP, 4 gRPC) calling the model through the Service for as long as a step lasts."""

    path: UserPath
    stop: threading.Event = field(default_factory=threading.Event)
    ok: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def loop(self, protocol: str) -> None:
        ip = self.path.cluster_ip()
        if protocol == "http":
            client: Any = httpclient.InferenceServerClient(f"{ip}:8000", connection_timeout=10, network_timeout=30)
            call = infer_http
        else:
            client = grpcclient.InferenceServerClient(f"{ip}:8001")
            call = infer_grpc
        try:
            while not self.stop.is_set():
                try:
                    version, out = call("", self.path.image, client)
                except Exception as exc:  # every failure is counted
                    with self.lock:
                        self.failures.append(f"{protocol}: {exc}")
                    time.sleep(0.05)
                    continue
                want = self.path.expected.get(version)
                with self.lock:
                    if want is None or not np.allclose(out, want, rtol=1e-3, atol=1e-4):
                        self.failures.append(f"{protocol}: wrong answer from version {version!r}")
                    else:
                        self.ok[version] = self.ok.get(version, 0) + 1
        finally:
            client.close()

    def __enter__(self) -> Load:
        for i in range(8):
            t = threading.Thread(target=self.loop, args=("http" if i % 2 == 0 else "grpc",), daemon=True)
            t.start()
            self.threads.append(t)
        wait_for("the load's first answers", lambda: sum(self.counts().values()) >= 8, timeout=60)
        return self

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self.ok)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


# ------------------------------------------------------------------------------------------ fixture


class Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def expected_output(model_file: Path, image: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    return session.run(["output"], {"input": image})[0]


@pytest.fixture(scope="module")
def path(cluster, node, images, tmp_path_factory) -> Iterator[UserPath]:
    suffix = uuid.uuid4().hex[:6]
    ns = f"e2e-path-{suffix}"
    files = tmp_path_factory.mktemp("files")
    # the host as pods see it: the host end of the node's veth
    httpd = http.server.ThreadingHTTPServer((node["host_ip"], 0), lambda *a: Files(*a, directory=str(files)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    p = UserPath(
        cluster, node, images, ns, f"http://{node['host_ip']}:{httpd.server_address[1]}", f"kubeinfer-{suffix}"
    )
    for version, seed in (("1", 0), ("2", 1)):
        onnx.save(models.resnet18_cifar(seed=seed), files / f"cifar10-v{version}.onnx")
        p.expected[version] = expected_output(files / f"cifar10-v{version}.onnx", p.image)
    assert not np.allclose(p.expected["1"], p.expected["2"])  # answers tell the versions apart
    p.files = files
    try:
        yield p
    finally:
        uninstall(p)
        httpd.shutdown()


# ------------------------------------------------------------------------------------------ steps


@pytest.fixture(scope="module")
def installed(path: UserPath) -> UserPath:
    """Step 1's set-up: the chart installed with its default values, and the volume its claim is bound to."""
    # the test's file server runs on this machine, a private address: install_chart allows the host's address
    path.volume = install_chart(path)
    return path


@pytest.fixture(scope="module")
def served(installed: UserPath) -> UserPath:
    """Step 2's set-up: the example InferenceServer, and the example model with version 1 from the test's file
    server, Ready (what later steps serve from)."""
    path = installed
    path.apply(example_server(path.images["server"]))
    model = yaml.safe_load((EXAMPLES / "cifar10-resnet.yaml").read_text())
    v1 = path.files / "cifar10-v1.onnx"
    model["spec"]["versions"] = [{"version": 1, "source": {"uri": f"{path.files_url}/{v1.name}", "sha256": sha256(v1)}}]
    path.apply(model)

    def serving() -> dict | None:
        c = path.condition()
        return c if c.get("status") == "True" else None

    wait_for_cluster("InferenceModel Ready", serving, timeout=300, describe=path.describe)
    return path


def test_1_helm_install_runs_the_operator_image(installed: UserPath) -> None:
    path = installed
    dep = path.get("deployment", path.operator)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"kubeinfer-operator:{chart['appVersion']}" == path.images["operator"]
    pods = path.get("pods", selector="app.kubernetes.io/name=kubeinfer-operator")["items"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["spec"]["nodeName"] == path.node["name"]
    assert pod["status"]["phase"] == "Running" and ready(pod)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # liveness and readiness probes exist and pass (Ready above; liveness: no restarts, endpoint answers)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" and container["readinessProbe"]
    health = path.kubectl(
        "exec", pod["metadata"]["name"], "--", "python3", "-c",
        "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/healthz').status)",
    )  # fmt: skip
    assert health.stdout.strip() == "200"
    lease = wait_for_cluster(
        "the operator's leader Lease",
        lambda: (lease := path.get("lease", path.operator)) and lease["spec"].get("holderIdentity") and lease,
        timeout=60,
    )
    assert lease["spec"]["holderIdentity"].startswith(pod["metadata"]["name"])
    # the chart's claim, bound to a hostPath volume of the node: the test can look at what the operator writes
    pvc = path.get("pvc", "kubeinfer-models")
    assert pvc["status"]["phase"] == "Bound" and pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pv = path.cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    assert Path(pv["spec"]["hostPath"]["path"]) == path.volume and path.volume.is_dir()


def test_1b_the_sample_manifests_pass_the_apiservers_validation(installed: UserPath) -> None:
    """examples/kubernetes/*.yaml (the README's quick start) against the CRDs' schemas and CEL rules."""
    path = installed
    samples = sorted(EXAMPLES.glob("*.yaml"))
    assert {p.name for p in samples} >= {"inferenceserver.yaml", "inferenceserver-gpu.yaml", "cifar10-resnet.yaml"}
    for sample in samples:
        out = path.kubectl("apply", "--dry-run=server", "-f", str(sample)).stdout
        assert "(server dry run)" in out, out


def test_2_models_fetched_by_the_operator_pod_become_ready(served: UserPath) -> None:
    path = served
    v1 = path.files / "cifar10-v1.onnx"
    cond = path.condition()
    assert cond["status"] == "True" and cond["reason"] == "Serving", cond
    status = path.get("inferencemodel", MODEL)["status"]
    assert status["activeVersions"] == [1] and status["targetVersions"] == [1]
    rendered = path.volume / path.ns / SERVER / MODEL  # the InferenceServer's folder on the volume
    assert (rendered / "1" / "model.onnx").read_bytes() == v1.read_bytes()
    assert "cifar10-resnet" in (rendered / "config.pbtxt").read_text()
    pods = path.server_pods()
    assert len(pods) == 1 and ready(pods[0]) and pods[0]["spec"]["nodeName"] == path.node["name"]
    # the pod mounts the claim read-only: the kernel refuses a write, the rendered model is visible
    mount = next(m for m in pods[0]["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/models")
    assert mount["readOnly"] is True, mount
    # through the claim the operator provided in this namespace, on this namespace's folder only
    volume = next(v for v in pods[0]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "kubeinfer-repository"
    pvc = path.get("pvc", "kubeinfer-repository")
    pv = path.cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    assert Path(pv["spec"]["hostPath"]["path"]) == path.volume / path.ns
    probe = path.kubectl(
        "exec", pods[0]["metadata"]["name"], "--", "python3", "-c",
        "import os; print(sorted(os.listdir('/models'))); open('/models/written-by-a-pod', 'w')",
        check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and "Read-only file system" in probe.stderr, (probe.stdout, probe.stderr)
    assert MODEL in probe.stdout


def test_3_tritonclient_http_and_grpc_through_the_cluster_ip(served: UserPath) -> None:
    path = served
    ip = path.cluster_ip()
    http_client = httpclient.InferenceServerClient(f"{ip}:8000")
    assert http_client.is_server_ready() and http_client.is_model_ready(MODEL)
    meta = http_client.get_model_metadata(MODEL)
    assert meta["inputs"][0]["shape"] == [-1, 3, 32, 32] and meta["outputs"][0]["shape"] == [-1, 10]
    version, out = infer_http(f"{ip}:8000", path.image)
    assert version == "1"
    np.testing.assert_allclose(out, path.expected["1"], rtol=1e-3, atol=1e-4)
    version, out = infer_grpc(f"{ip}:8001", path.image)
    assert version == "1"
    np.testing.assert_allclose(out, path.expected["1"], rtol=1e-3, atol=1e-4)
    batch = np.random.default_rng(3).random((4, 3, 32, 32), np.float32)
    _, out = infer_grpc(f"{ip}:8001", batch)
    assert out.shape == (4, 10) and np.isfinite(out).all()


def test_3b_the_server_pods_image_carries_the_rust_grpc_transport(served: UserPath) -> None:
    """scripts/images builds the Rust gRPC transport on the host and ships it in the server image (CI requires
    it): the pod's python3 loads it. Which transport serves is the server's choice (``--grpc-transport``; its
    log names it)."""
    path = served
    server = next(i for i in path.images["info"]["images"] if i["role"] == "server")
    if not server.get("grpc_transport"):
        pytest.skip("the server image was built without the Rust gRPC transport (no cargo; scripts/images said why)")
    pod = path.server_pods()[0]["metadata"]["name"]
    code = "import kubeinfer.server.grpc.kubeinfer_grpc_transport as m; print(m.__file__)"
    probe = path.kubectl("exec", pod, "--", "python3", "-c", code, check=False)
    assert probe.returncode == 0, (probe.stdout, probe.stderr)
    assert probe.stdout.strip().startswith("/opt/kubeinfer/"), probe.stdout
    assert probe.stdout.strip().endswith("/kubeinfer_grpc_transport.abi3.so"), probe.stdout  # CPython's stable ABI


def test_3c_the_operators_pods_serve_grpc_on_the_rust_transport(served: UserPath) -> None:
    """``--grpc-transport auto`` (the default) picks the Rust transport when the image carries it and the
    configuration needs nothing it lacks (only gRPC TLS falls back); the operator's pods carry
    ``--grpc-max-connection-age``, which it serves. Step 3's tritonclient gRPC calls went through it."""
    path = served
    server = next(i for i in path.images["info"]["images"] if i["role"] == "server")
    if not server.get("grpc_transport"):
        pytest.skip("the server image was built without the Rust gRPC transport (no cargo; scripts/images said why)")
    for pod in path.server_pods():
        args = pod["spec"]["containers"][0]["args"]
        assert any(a.startswith("--grpc-max-connection-age") for a in args), args
        log = path.kubectl("logs", pod["metadata"]["name"]).stdout
        assert re.search(r"gRPC listening on \S+ \(Rust transport\)", log), log[-3000:]


def test_4_version_2_from_the_volume_under_load(served: UserPath) -> None:
    path = served
    # the user puts version 2 on the volume, under the namespace's folder, owned by the operator's user
    uploads = path.volume / path.ns / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    v2 = uploads / "cifar10-v2.onnx"
    v2.write_bytes((path.files / "cifar10-v2.onnx").read_bytes())
    for p in (uploads, v2):
        os.chown(p, 1000, 1000)
    model = path.get("inferencemodel", MODEL)
    versions = model["spec"]["versions"] + [{"version": 2, "source": {"path": "uploads/cifar10-v2.onnx"}}]
    with Load(path) as load:
        path.kubectl(
            "patch", "inferencemodel", MODEL, "--type=merge", "-p", json.dumps({"spec": {"versions": versions}})
        )

        def switched() -> bool:
            status = path.get("inferencemodel", MODEL)["status"]
            return status["activeVersions"] == [2] and load.counts().get("2", 0) >= 20

        wait_for_cluster("version 2 serving (latest-1 policy)", switched, timeout=300, describe=path.describe)
    assert load.failures == [], load.failures[:10]
    assert load.counts().get("1", 0) > 0 and load.counts()["2"] > 0, load.counts()
    assert path.condition()["status"] == "True"


def test_5_two_replicas_both_ready_and_serving(served: UserPath) -> None:
    path = served
    path.kubectl("scale", "inferenceserver", SERVER, "--replicas=2")

    def both_ready() -> list[dict] | None:
        pods = [p for p in path.server_pods() if not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == 2 and all(ready(p) for p in pods) else None

    pods = wait_for_cluster("2 Ready server pods", both_ready, timeout=300, describe=path.describe)
    for pod in pods:  # each replica itself serves the model (not only whichever the Service picks)
        version, out = infer_http(f"{pod['status']['podIP']}:8000", path.image)
        assert version == "2"
        np.testing.assert_allclose(out, path.expected["2"], rtol=1e-3, atol=1e-4)
    wait_for_cluster(
        "the InferenceServer's status to count 2 ready replicas",
        lambda: (path.get("inferenceserver", SERVER).get("status") or {}).get("readyReplicas") == 2,
        timeout=120,
        interval=1,
    )


def test_5b_the_model_status_counts_every_replica(served: UserPath) -> None:
    path = served

    def counted() -> dict | None:
        status = path.get("inferencemodel", MODEL)["status"]
        v2 = next((s for s in status.get("versionStates") or [] if s["version"] == 2), {})
        return status if v2.get("readyReplicas") == 2 and v2.get("replicas") == 2 else None

    status = wait_for_cluster("the model's status to count 2 replicas", counted, timeout=90)
    assert status["activeVersions"] == [2]


def test_6_deleting_a_pod_under_load_fails_no_request(served: UserPath) -> None:
    path = served
    dep = path.get("deployment", SERVER)
    spec = dep["spec"]["template"]["spec"]
    container = spec["containers"][0]
    # the grace period covers the preStop drain (endpoint removal), the server's connection drain and its own
    # shutdown timeout: the kubelet never kills a server still finishing requests
    args = container["args"]

    def flag(pattern: str, dest: str) -> float:
        given = [float(m.group(1)) for a in args if (m := re.fullmatch(rf"--(?:{pattern})=(\S+)", a))]
        return given[-1] if given else float(server_default(dest))

    shutdown_timeout = flag("shutdown-timeout|exit-timeout-secs", "shutdown_timeout")
    connection_drain = flag("connection-drain-seconds", "connection_drain_seconds")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    drain = int(pre_stop[-1]) if pre_stop[0] == "sleep" else 0
    assert spec["terminationGracePeriodSeconds"] >= drain + connection_drain + shutdown_timeout, (spec, args)

    victim = path.server_pods()[0]["metadata"]["name"]
    logs = subprocess.Popen(
        [str(Path(path.cluster.bin_dir) / "kubectl"), "-n", path.ns, "logs", "-f", victim],
        env=path.cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        with Load(path) as load:
            before = sum(load.counts().values())
            path.kubectl("delete", "pod", victim, "--wait=false")

            def replaced() -> bool:
                pods = path.server_pods()
                names = {p["metadata"]["name"] for p in pods}
                fresh = [p for p in pods if p["metadata"]["name"] != victim and ready(p)]
                return victim not in names and len(fresh) == 2

            wait_for_cluster("the pod gone and replaced", replaced, timeout=300, describe=path.describe)
            wait_for("answers after the replacement", lambda: sum(load.counts().values()) > before + 50, timeout=60)
        assert load.failures == [], load.failures[:10]
        out, _ = logs.communicate(timeout=60)
    finally:
        logs.kill()
    # the server drained and stopped on its own (SIGTERM after preStop), not killed at the deadline
    assert "shutting down: draining in-flight requests" in out, out[-3000:]
    assert "kubeinfer-server stopped" in out, out[-3000:]


def test_7_helm_uninstall_removes_the_operator_and_keeps_the_models(served: UserPath) -> None:
    path = served
    rendered = path.volume / path.ns / SERVER / MODEL
    before = {p.relative_to(rendered) for p in rendered.rglob("*")}
    # the whole path left nothing wrong in the operator pod's log (e.g. events posted from its resync thread)
    log = path.kubectl("logs", f"deploy/{path.operator}").stdout
    assert "Traceback" not in log and not problems(log), (problems(log), log[-5000:])
    path.cluster.helm("uninstall", path.release, "-n", path.ns, "--wait", "--timeout", "2m", timeout=150)
    wait_for_cluster(
        "the operator's pods gone",
        lambda: not (path.get("pods", selector="app.kubernetes.io/name=kubeinfer-operator") or {}).get("items"),
        timeout=120,
    )
    assert path.get("deployment", path.operator) is None
    assert path.get("pvc", "kubeinfer-models")["status"]["phase"] == "Bound"  # kept: helm.sh/resource-policy
    assert {p.relative_to(rendered) for p in rendered.rglob("*")} == before
    assert (rendered / "2" / "model.onnx").is_file() and (rendered / "config.pbtxt").is_file()
    # what the operator rendered keeps serving without it
    version, _ = infer_http(f"{path.cluster_ip()}:8000", path.image)
    assert version == "2"
