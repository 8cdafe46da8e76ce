"""End-to-end: real control plane, real ``kubeinfer-operator`` process, real ``kubeinfer-server`` process.

The repository volume is a local folder (the operator's ``--repository-root``); a server process
polls ``<root>/<namespace>/gpu-pool`` (the InferenceServer's subPath, inside its namespace's folder) and
the operator reads that server's repository index for status (``--server-endpoint``). Model files come
from an HTTP server on 127.0.0.1 or from ``<namespace>/uploads/`` on the "volume". Each test uses its
own model names.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from kubeinfer.operator.api.model_crd import SOURCE_URI_PATTERN
from onnx import TensorProto

from tests.support import processes
from tests.support.models import unary
from tests.support.server import ServerProcess, free_port, start_server
from tests.support.specs import server_spec
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
SERVER = "gpu-pool"
#: an Azure Blob URL in KServe's form
AZURE_BLOB = "https://acct.blob.core.windows.net/models/m/model.onnx"
#: a pool whose server polls its folder only once an hour: what it serves, it loaded when the operator asked
LAZY = "lazy-pool"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------ fixtures


class Files(http.server.SimpleHTTPRequestHandler):
    """Serves uploads/; /slow/ trickles the file out over ~6 s (to kill the operator mid-fetch), /slower/ over ~60 s."""

    def do_GET(self) -> None:
        prefix = next((p for p in ("/slow/", "/slower/") if self.path.startswith(p)), None)
        if prefix is None:
            return super().do_GET()
        data = (Path(self.directory) / self.path.removeprefix(prefix)).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        step = max(1, len(data) // (30 if prefix == "/slow/" else 300))
        try:
            for i in range(0, len(data), step):
                self.wfile.write(data[i : i + step])
                self.wfile.flush()
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the operator gave up on the download

    def log_message(self, *args: Any) -> None:
        pass


class Operator:
    def __init__(
        self,
        cluster: Any,
        root: Path,
        namespace: str,
        server: ServerProcess,
        log_dir: Path,
        lazy: ServerProcess | None = None,
    ) -> None:
        self.args = [
            sys.executable, "-m", "kubeinfer.operator",
            "--kubeconfig", cluster.kubeconfig,
            "--repository-root", str(root),
            "--namespace", namespace,
            "--resync-seconds", "2",
            "--fetch-timeout", "10",
            "--allowed-network", "127.0.0.0/8",  # the test's file server; downloads reach public addresses only
            "--unload-timeout", "30",
            "--server-endpoint", f"{namespace}/{SERVER}={server.base_url}",
        ]  # fmt: skip
        if lazy is not None:
            self.args += ["--server-endpoint", f"{namespace}/{LAZY}={lazy.base_url}"]
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc:
            processes.stop(self.proc)

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in sorted(self.log_dir.glob("operator-*.log")))


class Env:
    """Everything a test needs: kubectl in the test namespace, the volume, the servers, the operator."""

    def __init__(
        self,
        cluster: Any,
        namespace: str,
        root: Path,
        base_url: str,
        server: ServerProcess,
        op: Operator,
        lazy: ServerProcess | None = None,
    ):
        self.cluster, self.ns, self.root, self.base_url, self.server, self.operator, self.lazy = (
            cluster, namespace, root, base_url, server, op, lazy,
        )  # fmt: skip
        self.uploads = root / namespace / "uploads"
        self.repo = root / namespace / SERVER
        #: where the operator stages and deletes for that folder: outside every namespace folder
        self.staging = root / ".kubeinfer-staging" / namespace / SERVER

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.ns, *args, check=check, input=input)

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def condition(self, name: str, ctype: str = "Ready") -> dict[str, Any]:
        obj = self.get("inferencemodel", name) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def wait_condition(self, name: str, status: str, reason: str | None = None, timeout: float = 60) -> dict:
        def check() -> dict | None:
            c = self.condition(name)
            return c if c.get("status") == status and (reason is None or c.get("reason") == reason) else None

        try:
            return wait_for_cluster(f"{name} Ready={status} {reason or ''}", check, timeout)
        except BaseException:
            print(self.operator.log())
            raise

    def model(self, name: str, versions: list[dict], server: str = SERVER, **extra: Any) -> dict[str, Any]:
        spec = {
            "server": server,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "dynamicBatching": {"maxQueueDelayMicroseconds": 1000},
            "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
            "versions": versions,
            **extra,
        }
        return {"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": name}, "spec": spec}

    def uri_version(self, version: int, file: str, sha: str | None = None, slow: bool | str = False) -> dict:
        prefix = f"/{slow}" if isinstance(slow, str) else "/slow" if slow else ""
        return {
            "version": version,
            "source": {"uri": f"{self.base_url}{prefix}/{file}", "sha256": sha or sha256(self.uploads / file)},
        }

    def index(self, model: str) -> dict[str, str]:
        entries = httpx.post(f"{self.server.base_url}/v2/repository/index", json={}, timeout=5).json()
        return {e.get("version", ""): e.get("state", "") for e in entries if e["name"] == model}

    def visible(self, model: str) -> list[str]:
        """What the server sees in a model folder (dot-names are staging/retiring, invisible to it)."""
        return sorted(p.name for p in (self.repo / model).iterdir() if not p.name.startswith("."))

    def leftovers(self) -> list[str]:
        """Dot-names of unfinished work, beside the models or in the operator's staging folder."""
        found = [p for folder in (self.repo, self.staging) if folder.is_dir() for p in folder.rglob(".*")]
        return sorted(str(p.relative_to(self.root)) for p in found if ".kubeinfer-source" not in p.name)

    def staged(self, model: str) -> list[Path]:
        """``model``'s folders being staged right now (in the operator's staging folder)."""
        if not self.staging.is_dir():
            return []
        return [p for p in self.staging.iterdir() if p.name.startswith(f".{model}.staging-")]

    def delete_model(self, name: str) -> None:
        self.kubectl("delete", "inferencemodel", name, "--wait=true", "--timeout=60s")


def infer(url: str, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(url=url)
    inp = httpclient.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUT")


@pytest.fixture(scope="module")
def env(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ns = f"e2e-op-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", ns)
    root = tmp_path_factory.mktemp("volume")
    uploads = root / ns / "uploads"
    uploads.mkdir(parents=True)
    for name, op in (("relu.onnx", "Relu"), ("neg.onnx", "Neg"), ("abs.onnx", "Abs")):
        onnx.save(unary(name, op, TensorProto.FLOAT, ["batch", 4]), uploads / name)
    onnx.save(unary("wide", "Relu", TensorProto.FLOAT, ["batch", 6]), uploads / "wide.onnx")
    os.symlink(uploads / "relu.onnx", uploads / "link.onnx")
    (root / ns / SERVER).mkdir()
    handler = lambda *a: Files(*a, directory=str(uploads))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    logs = tmp_path_factory.mktemp("logs")
    server = start_server(
        root / ns / SERVER, "--model-control-mode", "poll", "--repository-poll-secs", "1", log_dir=logs
    )
    (root / ns / LAZY).mkdir()
    lazy = start_server(
        root / ns / LAZY, "--model-control-mode", "poll", "--repository-poll-secs", "3600", log_dir=logs
    )
    op = Operator(cluster, root, ns, server, logs, lazy)
    op.start()
    e = Env(cluster, ns, root, f"http://127.0.0.1:{httpd.server_address[1]}", server, op, lazy)
    e.apply(
        {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": SERVER},
            "spec": server_spec(server={"pollIntervalSeconds": 1}),
        }
    )
    try:
        yield e
    finally:
        e.kubectl("delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=60s", check=False)
        op.stop()
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        server.terminate()
        lazy.terminate()
        httpd.shutdown()


# --------------------------------------------------------------------------------------------- tests


def test_server_pool_objects_and_drift_repair(env: Env) -> None:
    dep = wait_for_cluster("Deployment", lambda: env.get("deployment", SERVER))
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.example.com/kubeinfer-server:0.1.0"
    assert "--model-control-mode=poll" in c["args"] and "--repository-poll-secs=1" in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    mount = next(m for m in c["volumeMounts"] if m["name"] == "model-repository")
    # the pods mount their namespace's claim (it reaches only <volume>/<namespace>/): the subPath is inside it
    assert (mount["mountPath"], mount["subPath"], mount["readOnly"]) == ("/models", SERVER, True)
    assert next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["medium"] == "Memory"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "InferenceServer"
    svc = wait_for_cluster("Service", lambda: env.get("service", SERVER))
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    hpa = wait_for_cluster("HPA", lambda: env.get("hpa", SERVER))
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": API, "kind": "InferenceServer", "name": SERVER}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_queue_duration_us_per_request"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 8)
    wait_for_cluster(
        "InferenceServer status",
        lambda: (env.get("inferenceserver", SERVER) or {}).get("status", {}).get("selector"),
    )
    # nothing outside the cluster to clean up: no finalizer that would block deletion without the operator
    assert not env.get("inferenceserver", SERVER)["metadata"].get("finalizers")
    # a user edit to an owned object is put back
    env.kubectl("set", "image", f"deployment/{SERVER}", "server=evil:latest")
    env.kubectl("delete", "service", SERVER)
    wait_for_cluster(
        "image reconciled back",
        lambda: (
            env.get("deployment", SERVER)["spec"]["template"]["spec"]["containers"][0]["image"]
            == "registry.example.com/kubeinfer-server:0.1.0"
        ),
    )
    wait_for_cluster("Service recreated", lambda: env.get("service", SERVER))


def test_model_served_then_hot_reloaded_without_failed_requests(env: Env) -> None:
    name = "cifar"
    env.apply(env.model(name, [env.uri_version(1, "relu.onnx")]))
    ready = env.wait_condition(name, "True", "Serving")
    assert "[1]" in ready["message"]
    assert env.visible(name) == ["1", "config.pbtxt"]
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], dtype=np.float32)
    np.testing.assert_array_equal(infer(env.server.http_url, name, x), np.maximum(x, 0))
    obj = env.get("inferencemodel", name)
    st = obj["status"]
    assert st["activeVersions"] == [1] and st["targetVersions"] == [1]
    assert st["endpoint"] == {
        "http": f"{SERVER}.{env.ns}.svc:8000",
        "grpc": f"{SERVER}.{env.ns}.svc:8001",
        "model": name,
    }
    assert st["observedGeneration"] == obj["metadata"]["generation"]
    wait_for_cluster(
        "the InferenceServer lists the model",
        lambda: name in (env.get("inferenceserver", SERVER).get("status") or {}).get("models", []),
    )
    table = env.kubectl("get", "inferencemodels", name).stdout
    assert table.split("\n")[0].split()[:5] == ["NAME", "READY", "VERSIONS", "REPLICAS", "SERVER"]
    row = table.split("\n")[1].split()
    serving, found = map(int, row[3].split("/"))  # replicas serving it / replicas found
    assert row[:3] == [name, "True", "1"] and row[4] == SERVER and 0 < serving <= found, table

    failures: list[str] = []
    outputs: list[np.ndarray] = []
    stop = threading.Event()

    def client() -> None:
        c = httpclient.InferenceServerClient(url=env.server.http_url)
        while not stop.is_set():
            inp = httpclient.InferInput("IN", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            try:
                outputs.append(c.infer(name, [inp]).as_numpy("OUT"))
            except Exception as exc:  # every failure counts
                failures.append(repr(exc))

    thread = threading.Thread(target=client)
    thread.start()
    try:
        (env.uploads / "v2").mkdir(exist_ok=True)
        (env.uploads / "v2/model.onnx").write_bytes((env.uploads / "neg.onnx").read_bytes())
        obj["spec"]["versions"].append({"version": 2, "source": {"path": "uploads/v2/model.onnx"}})
        env.apply({"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": name}, "spec": obj["spec"]})
        wait_for_cluster(
            "version 2 active",
            lambda: (env.get("inferencemodel", name)["status"].get("activeVersions") == [2]
                     and env.condition(name)["status"] == "True"),
            timeout=60,
        )  # fmt: skip
        wait_for_cluster("requests answered by version 2", lambda: outputs and np.array_equal(outputs[-1], -x))
    finally:
        stop.set()
        thread.join(30)
    assert failures == []
    assert len(outputs) > 10
    assert env.visible(name) == ["1", "2", "config.pbtxt"]

    env.delete_model(name)
    assert not (env.repo / name).exists()
    wait_for_cluster("server unloaded the model", lambda: "READY" not in env.index(name).values())
    assert env.leftovers() == []


def test_checksum_mismatch_keeps_serving_version_1(env: Env) -> None:
    name = "checksum"
    env.apply(env.model(name, [env.uri_version(1, "relu.onnx")]))
    env.wait_condition(name, "True")
    body = env.model(name, [env.uri_version(1, "relu.onnx"), env.uri_version(2, "neg.onnx", sha="0" * 64)])
    env.apply(body)
    cond = env.wait_condition(name, "False", "ChecksumMismatch")
    assert "version 2" in cond["message"] and "fix source.sha256" in cond["message"]
    assert env.condition(name, "Degraded")["status"] == "True"
    assert env.visible(name) == ["1", "config.pbtxt"]
    wait_for_cluster("no staging leftovers", lambda: env.leftovers() == [])
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(infer(env.server.http_url, name, x), x)  # still relu, version 1
    events = env.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}").stdout
    assert "ChecksumMismatch" in events
    env.delete_model(name)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"versions": [{"version": 1, "source": {"path": "a.onnx"}}, {"version": 1, "source": {"path": "b.onnx"}}]},
         "version numbers must be unique"),
        ({"dynamicBatching": {"preferredBatchSize": [64]}}, "preferredBatchSize entries must not exceed maxBatchSize"),
        ({"versions": [{"version": 1, "source": {"uri": "https://x/m.onnx"}}]}, "source.uri needs source.sha256"),
        (
            {"versions": [{"version": 1, "source": {"uri": f"{AZURE_BLOB}?sv=2024&sig=x"}}]},
            "source.uri needs source.sha256",
        ),
        ({"versions": [{"version": 1, "source": {"path": "../../etc/passwd"}}]}, "must not contain '..'"),
        (
            {"versions": [{"version": 1, "source": {"uri": "ftp://x/m.onnx", "sha256": "a" * 64}}]},
            f"should match '{SOURCE_URI_PATTERN}'",
        ),
        ({"inputs": [{"name": "IN", "dataType": "FP99", "dims": [4]}]}, "Unsupported value: \"FP99\""),
        ({"inputs": [{"name": "IN", "dataType": "FP32", "dims": [0]}]}, "a dimension is a positive size or -1"),
        ({"versionPolicy": {"latest": {"numVersions": 1}, "all": {}}}, "set at most one of latest, all, specific"),
        ({"maxBatchSize": -1}, "should be greater than or equal to 0"),
    ],
)  # fmt: skip
def test_invalid_objects_are_rejected_by_the_apiserver(env: Env, change: dict, message: str) -> None:
    body = env.model("invalid", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    body["spec"].update(change)
    proc = env.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_an_azure_blob_url_needs_no_sha256(env: Env) -> None:
    """KServe's https://<account>.blob.core.windows.net form is read as az:// (a blob version pins it): the
    apiserver's rule that an http(s) source.uri needs a sha256 lets it through (a pre-signed one is refused above)."""
    body = env.model("azure-url", [{"version": 1, "source": {"uri": AZURE_BLOB}}])
    proc = env.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(body), check=False)
    assert proc.returncode == 0, proc.stderr


def test_specs_the_schema_cannot_catch(env: Env) -> None:
    env.apply(env.model("healthy", [env.uri_version(1, "relu.onnx")]))
    env.apply(
        {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": "cpu-pool"},
            "spec": {"image": "x", "backends": ["onnxruntime"], "repository": {"claimName": "c"}},
        }
    )
    cases = {
        "no-server": ({"server": "missing"}, "ServerNotFound", "InferenceServer 'missing' does not exist"),
        "no-backend": (
            {"server": "cpu-pool", "platform": "tensorrt_plan"},
            "InvalidSpec",
            "does not provide backend 'tensorrt'",
        ),
        "bad-dims": (
            {"inputs": [{"name": "IN", "dataType": "FP32", "dims": [1, 4]}]},
            "ConfigMismatch",
            "dims must not include the batch dimension",
        ),
        "unreachable": (
            {"versions": [{"version": 1, "source": {"uri": "http://127.0.0.1:9/m.onnx", "sha256": "a" * 64}}]},
            "FetchFailed",
            "cannot download http://127.0.0.1:9/m.onnx",
        ),
        "symlink": (
            {"versions": [{"version": 1, "source": {"path": "uploads/link.onnx"}}]},
            "PathRejected",
            "passes through the symlink 'uploads/link.onnx'",
        ),
    }
    for name, (change, _, _) in cases.items():
        body = env.model(name, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
        body["spec"].update(change)
        env.apply(body)
    for name, (_, reason, message) in cases.items():
        cond = env.wait_condition(name, "False", reason)
        assert message in cond["message"], cond
        assert not (env.repo / name).exists()
    wait_for_cluster("no staging leftovers", lambda: env.leftovers() == [])  # retries of 'unreachable' stage briefly
    # the healthy model becomes (or stays) Ready whatever its neighbours do; readiness is eventual
    env.wait_condition("healthy", "True")
    np.testing.assert_array_equal(infer(env.server.http_url, "healthy", np.ones((1, 4), np.float32)), np.ones((1, 4)))
    # fixing the spec heals it
    env.apply(env.model("bad-dims", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    env.wait_condition("bad-dims", "True")
    for name in [*cases, "healthy"]:
        env.delete_model(name)
    env.kubectl("delete", "inferenceserver", "cpu-pool")


def test_operator_killed_mid_render_converges(env: Env) -> None:
    name = "crashy"
    env.apply(env.model(name, [env.uri_version(1, "abs.onnx", slow=True)]))
    wait_for_cluster("staging folder", lambda: env.staged(name))
    env.operator.kill()
    assert not (env.repo / name).exists()
    assert env.leftovers()  # the crash left a partial, dot-named folder (invisible to the server)
    env.operator.start()
    env.wait_condition(name, "True", timeout=90)
    assert env.leftovers() == []
    x = np.array([[-1.0, 1.0, -2.0, 2.0]], dtype=np.float32)
    np.testing.assert_array_equal(infer(env.server.http_url, name, x), np.abs(x))
    env.delete_model(name)


def test_scale_and_delete_server_garbage_collects(env: Env) -> None:
    name = "tmp-pool"
    body = {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": name},
        "spec": {"image": "img:1", "repository": {"claimName": "c"}, "replicas": 1},
    }
    env.apply(body)
    wait_for_cluster("Deployment", lambda: env.get("deployment", name))
    env.kubectl("scale", "inferenceserver", name, "--replicas=3")
    wait_for_cluster("scaled Deployment", lambda: env.get("deployment", name)["spec"]["replicas"] == 3)
    wait_for_cluster(
        "status replicas",
        lambda: (env.get("inferenceserver", name).get("status") or {}).get("replicas") == 3,
    )
    assert env.get("hpa", name) is None
    body["spec"]["autoscaling"] = {"autoscaler": "HPA", "maxReplicas": 4, "target": {"metric": "CPU", "value": 60}}
    body["spec"]["replicas"] = 3
    env.apply(body)
    hpa = wait_for_cluster("HPA", lambda: env.get("hpa", name))
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    assert env.get("deployment", name)["metadata"]["ownerReferences"][0]["name"] == name
    env.kubectl("delete", "inferenceserver", name)
    for kind in ("deployment", "service", "hpa"):
        wait_for_cluster(f"{kind} garbage-collected", lambda kind=kind: env.get(kind, name) is None, timeout=90)


class Replica:
    """One operator replica with leader election and a liveness endpoint, probed like the kubelet would."""

    def __init__(self, env: Env, lease: str, folder: Path, index: int) -> None:
        self.port = free_port()
        self.log_path = folder / f"replica-{index}.log"
        args = [
            sys.executable, "-m", "kubeinfer.operator",
            "--kubeconfig", env.cluster.kubeconfig,
            "--repository-root", str(folder),
            "--namespace", f"{env.ns}-unused",
            "--leader-election", "--leader-election-namespace", env.ns, "--lease-name", lease,
            "--lease-duration", "6", "--lease-renew-deadline", "4", "--lease-retry-period", "1",
            "--liveness", f"http://127.0.0.1:{self.port}/healthz",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.probes = 0
        self.failures = 0  # consecutive failed probes now
        self.worst = 0  # most consecutive failures seen: the kubelet restarts at failureThreshold (3)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def identity(self) -> str | None:
        for line in self.log().splitlines():
            if "acquired lease" in line:
                return line.rsplit(" as ", 1)[-1].strip()
        return None

    def probe(self) -> None:
        """One liveness probe (1 s timeout). Probing starts with the first success (initialDelaySeconds)."""
        try:
            ok = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok:
            self.probes += 1
            self.failures = 0
        elif self.probes:
            self.failures += 1
            self.worst = max(self.worst, self.failures)


def test_leader_election_hands_over_and_never_restarts_a_follower(env: Env, tmp_path: Path) -> None:
    """Two replicas with liveness on (as the chart runs them): SIGTERM releases the lease (the follower
    takes over at once), SIGKILL makes the next follower wait for the lease to expire, and no waiting
    follower ever fails three liveness probes in a row (the kubelet would restart it)."""
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    replicas: list[Replica] = []
    stop = threading.Event()

    def kubelet() -> None:
        while not stop.wait(1.0):
            for r in list(replicas):
                if r.proc.poll() is None:
                    r.probe()

    def holder() -> str | None:
        obj = env.get("lease", lease)
        return obj and obj["spec"].get("holderIdentity")

    prober = threading.Thread(target=kubelet, daemon=True)
    prober.start()
    try:
        a = Replica(env, lease, tmp_path, 0)
        replicas.append(a)
        first = wait_for_cluster(
            "replica 0 holds the lease", lambda: holder() and a.identity() == holder() and holder()
        )
        b = Replica(env, lease, tmp_path, 1)
        replicas.append(b)
        wait_for_cluster("replica 1 waits as a follower", lambda: "waiting for lease" in b.log() and b.probes >= 2)
        assert holder() == first

        # SIGTERM: the leader exits within seconds and releases the lease; the follower takes it at once
        a.proc.send_signal(signal.SIGTERM)
        assert a.proc.wait(20) == 0, a.log()
        assert holder() != first  # released ("") or already taken over, never still the old leader
        assert "released lease" in a.log()
        second = wait_for_cluster(
            "replica 1 takes over", lambda: b.identity() and holder() == b.identity() and holder()
        )
        lease_obj = env.get("lease", lease)
        assert lease_obj["spec"]["leaseTransitions"] >= 1

        # SIGKILL: no release; the next follower waits for the lease to expire on its own clock
        c = Replica(env, lease, tmp_path, 2)
        replicas.append(c)
        wait_for_cluster("replica 2 waits as a follower", lambda: "waiting for lease" in c.log() and c.probes >= 2)
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(10)
        third = wait_for_cluster(
            "replica 2 takes over", lambda: c.identity() and holder() == c.identity() and holder(), 60
        )
        assert len({first, second, third}) == 3
        wait_for_cluster("the new leader's liveness (kopf's)", lambda: c.probes >= 3 and c.failures == 0)
        assert c.proc.poll() is None
        for r in replicas:
            assert r.worst < 3, f"replica {replicas.index(r)} failed {r.worst} probes in a row:\n{r.log()[-3000:]}"
        # a follower stopped while waiting exits at once too
        d = Replica(env, lease, tmp_path, 3)
        wait_for_cluster("replica 3 waits", lambda: "waiting for lease" in d.log())
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(20) == 0
        c.proc.send_signal(signal.SIGTERM)
        assert c.proc.wait(20) == 0, c.log()
        assert holder() in ("", None)
    finally:
        stop.set()
        prober.join(5)
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait(10)


def test_sigterm_stops_a_busy_operator_within_seconds(env: Env) -> None:
    names = [f"busy-{i}" for i in range(6)]
    for name in names:
        env.apply(env.model(name, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    wait_for_cluster("renders under way", lambda: any((env.repo / n).exists() for n in names))
    proc = env.operator.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, env.operator.log()
    env.operator.start()
    for name in names:
        env.wait_condition(name, "True", timeout=120)
    env.kubectl("delete", "inferencemodel", *names, "--wait=true", "--timeout=60s")


def test_deletes_finish_promptly_under_resync(env: Env) -> None:
    """The resync timer (every 2 s here) never holds a finalizer for long, nor does a long download."""
    slow = "longfetch"
    env.apply(env.model(slow, [env.uri_version(1, "abs.onnx", slow="slower")]))  # ~60 s download
    wait_for_cluster("download in progress", lambda: env.staged(slow))
    names = [f"bulk-{i}" for i in range(8)]
    for name in names:
        env.apply(env.model(name, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    for name in names:
        env.wait_condition(name, "True", timeout=120)
    # kopf's default would poll a busy timer every 60 s, and the download would hold the object ~60 s
    env.kubectl("delete", "inferencemodel", slow, *names, "--wait=true", "--timeout=30s")
    wait_for_cluster("no staging leftovers", lambda: env.leftovers() == [])
    assert not any((env.repo / n).exists() for n in [slow, *names])
    # the server unloads a deleted model when the operator asks it to poll; should the operator have to wait
    # for an unload after all, that is a retry by design, logged at INFO, not ERROR
    lines = [
        line
        for log in sorted(env.operator.log_dir.glob("operator-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "waiting for the server to unload" in line
    ]
    assert not [line for line in lines if " ERROR " in line], lines[:5]


def index_of(server: ServerProcess) -> dict[str, str]:
    """model -> state of its (only) version in the server's repository index."""
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {r["name"]: r.get("state", "") for r in rows}


def test_poll_mode_servers_load_what_was_rendered_without_waiting_for_their_poll(env: Env) -> None:
    """The lazy pool's server polls once an hour: every model it serves, it loaded because the operator asked
    it to poll those folders (POST /v2/repository/poll) right after rendering them; and it unloads them when
    their InferenceModels are deleted, before the finalizers are released."""
    env.apply(
        {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": LAZY},
            "spec": server_spec(repository={"claimName": "c", "subPath": LAZY}, autoscaling=None),
        }
    )
    names = [f"lazy-{i:02d}" for i in range(20)]
    models = [env.model(n, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}], server=LAZY) for n in names]
    for body in models:
        body["metadata"]["labels"] = {"batch": "lazy"}
    env.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": models}))
    started = time.monotonic()
    for name in names:
        env.wait_condition(name, "True", "Serving", timeout=120)
    print(f"\n20 models Ready on a server that never polled, {time.monotonic() - started:.1f}s after the apply")
    served = index_of(env.lazy)
    assert all(served.get(n) == "READY" for n in names), served
    x = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(infer(env.lazy.http_url, names[0], x), x)

    env.kubectl("delete", "inferencemodels", "-l", "batch=lazy", "--wait=true", "--timeout=60s")
    # released only once the server unloaded them: nothing of them is left in its index
    assert not set(names) & set(index_of(env.lazy)), index_of(env.lazy)
    assert "was removed from the repository: unloading the model" in env.lazy.log()
    assert [line for line in env.lazy.log().splitlines() if " ERROR " in line] == []
    env.kubectl("delete", "inferenceserver", LAZY)


def test_a_bulk_delete_logs_no_error_on_the_server(env: Env) -> None:
    """50 models deleted at once while the server polls every second: every one is an INFO unload on the
    server (its folder removed by the operator), never "model folder not found ... failed to load"."""
    names = [f"quiet-{i:02d}" for i in range(50)]
    models = [env.model(n, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]) for n in names]
    for body in models:
        body["metadata"]["labels"] = {"batch": "quiet"}
    env.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": models}))
    wait_for_cluster(
        "50 models READY on the server", lambda: all(index_of(env.server).get(n) == "READY" for n in names), 180
    )
    for name in names:
        env.wait_condition(name, "True", timeout=60)
    offset = len(env.server.log())
    env.kubectl("delete", "inferencemodels", "-l", "batch=quiet", "--wait=true", "--timeout=120s")
    assert not any((env.repo / n).exists() for n in names)
    assert not set(names) & set(index_of(env.server))
    time.sleep(2)  # two more polls of the server
    during = env.server.log()[offset:]
    assert [line for line in during.splitlines() if " ERROR " in line] == [], during[-3000:]
    assert during.count("was removed from the repository: unloading the model") == len(names)
