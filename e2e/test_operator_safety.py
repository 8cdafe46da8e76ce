"""End-to-end: what the operator reports and refuses, on the real control plane with real servers.

One operator for the module, with a resync period far longer than any test (600 s), so every
status change seen here comes from a change handler or its follow-up rechecks, never the timer:

* Ready only once the server serves the *config* that was rendered (an explicit-mode server loads
  only when told, so the in-between state is stable and observable), Normal events;
* status per replica, read from the EndpointSlices of the server's Service (two real servers on
  this machine's non-loopback address, listed in hand-made EndpointSlices that name two real pods of the
  pool: the operator reads only endpoints whose pods its Deployment's ReplicaSets control);
* each namespace's repository claim: the one the operator provides (a PersistentVolume on its
  namespace's folder of the NFS export, bound by the controller manager) and the check of claims named in
  a spec (the whole volume, other storage, a missing claim are refused);
* private downloads: credentials from a labelled Secret, only to the hosts it names, https only, no
  downgrading redirects.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import onnx
import pytest
from onnx import TensorProto
from test_operator import API, Files

from tests.support import processes
from tests.support.https import ScriptedServer, make_ca_and_cert
from tests.support.models import unary
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
MANUAL = "manual"  # explicit-mode server: loads only when told
SERVER_LABEL = "serving.kubeinfer.io/server"


def host_ip() -> str | None:
    """A local IPv4 address outside 127.0.0.0/8 (EndpointSlices refuse loopback addresses)."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    return next((a for a in out if "." in a and not a.startswith("127.")), None)


@dataclass
class Stage:
    cluster: Any
    ns: str
    root: Path
    files_url: str
    https: ScriptedServer
    manual: ServerProcess
    operator: subprocess.Popen[bytes]
    log_path: Path
    pv_prefix: str

    @property
    def folder(self) -> Path:
        """The namespace's folder on the volume (servers' subPaths and sources' paths are relative to it)."""
        return self.root / self.ns

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.ns, *args, check=check, input=input)

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        proc = self.kubectl("get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def condition(self, kind: str, name: str, ctype: str) -> dict[str, Any]:
        conds = (self.get(kind, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def wait_condition(
        self, name: str, ctype: str, status: str, reason: str | None = None, text: str = "", timeout: float = 60
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            c = self.condition("inferencemodel", name, ctype)
            ok = c.get("status") == status and reason in (None, c.get("reason")) and text in c.get("message", "")
            return c if ok else None

        try:
            return wait_for_cluster(f"{name} {ctype}={status} {reason or ''} {text}", check, timeout)
        except BaseException:
            print(self.log_path.read_text(errors="replace")[-8000:])
            raise

    def model(self, name: str, server: str, versions: list[dict], **extra: Any) -> dict[str, Any]:
        spec = {
            "server": server,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "versions": versions,
            **extra,
        }
        return {"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": name}, "spec": spec}

    def server(self, name: str, claim: str | None = None, replicas: int = 0, **extra: Any) -> None:
        """An InferenceServer (the operator's claim unless ``claim``); no pods by default (the servers here are
        processes on this machine); ``extra``: more of its spec."""
        self.apply(
            {
                "apiVersion": API,
                "kind": "InferenceServer",
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "image": "registry.example.com/kubeinfer-server:0.1.0",
                    "repository": {"subPath": name, **({"claimName": claim} if claim else {})},
                    "server": {"pollIntervalSeconds": 1},
                    **extra,
                },
            }
        )

    def volume(self, claim: str, nfs_path: str) -> None:
        """A PersistentVolume on a (never mounted) NFS export, pre-bound to ``claim`` in this namespace."""
        pv = f"{self.pv_prefix}-{claim}"
        self.cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": pv},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany"],
                        "storageClassName": "",
                        "nfs": {"server": "nfs.example.internal", "path": nfs_path},
                        "claimRef": {"namespace": self.ns, "name": claim},
                    },
                }
            ),
        )
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
        )
        wait_for_cluster(f"PVC {claim} Bound", lambda: self.get("pvc", claim).get("status", {}).get("phase") == "Bound")

    def events(self, name: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
        return json.loads(out.stdout)["items"]


def load(server: ServerProcess, model: str) -> None:
    response = httpx.post(f"{server.base_url}/v2/repository/models/{model}/load", json={}, timeout=60)
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def stage(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    ns = f"e2e-opsafe-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", ns)
    root = tmp_path_factory.mktemp("volume")
    uploads = root / ns / "uploads"  # paths in specs are relative to the namespace's folder
    uploads.mkdir(parents=True)
    onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
    handler = lambda *a: Files(*a, directory=str(uploads))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    pki = tmp_path_factory.mktemp("pki")
    ca, cert, key = make_ca_and_cert(pki)
    https = ScriptedServer({}, tls=(cert, key))
    logs = tmp_path_factory.mktemp("logs")
    (root / ns / MANUAL).mkdir()
    manual = start_server(root / ns / MANUAL, "--model-control-mode", "explicit", log_dir=logs)
    log_path = logs / "operator.log"
    args = [
        sys.executable, "-m", "kubeinfer.operator",
        "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root),
        "--namespace", ns,
        "--resync-seconds", "600",
        "--claim-name", "models", "--claim-namespace", ns,
        "--server-endpoint", f"{ns}/{MANUAL}={manual.base_url}",
        "--fetch-ca-file", str(ca),
        "--fetch-timeout", "10",
        "--allowed-network", "127.0.0.0/8",  # the test's file servers; downloads reach public addresses only
        "--unload-timeout", "20",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    stage = Stage(
        cluster, ns, root, f"http://127.0.0.1:{httpd.server_address[1]}", https, manual, operator, log_path, ns
    )
    try:
        stage.volume("models", f"/exports/{ns}")
        stage.server(MANUAL)
        yield stage
    finally:
        stage.kubectl(
            "delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=60s", check=False
        )
        processes.stop(operator)
        cluster.release_finalizers(ns)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        pvs = cluster.kubectl("get", "pv", "-o", "name", check=False).stdout.split()
        pvs += cluster.kubectl(
            "get", "pv", "-o", "name", "-l", f"serving.kubeinfer.io/tenant-namespace={ns}", check=False
        ).stdout.split()
        for pv in pvs:
            if pv.startswith(f"persistentvolume/{ns}-") or pv.startswith("persistentvolume/kubeinfer-"):
                cluster.kubectl("delete", pv, "--wait=false", check=False)
        manual.terminate()
        https.close()
        httpd.shutdown()


# --------------------------------------------------------------------------------------------- tests


def test_ready_soon_after_rendering_and_only_once_the_config_is_loaded(stage: Stage) -> None:
    name = "cfg"
    body = stage.model(name, MANUAL, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
    stage.apply(body)
    stage.wait_condition(name, "Rendered", "True")
    stage.wait_condition(name, "Ready", "False", "Loading")  # an explicit-mode server loads only when told
    load(stage.manual, name)
    # the resync period is 600 s: only the rechecks that follow a render can see this
    stage.wait_condition(name, "Ready", "True", "Serving", timeout=45)
    normal = {(e["reason"], e["type"]) for e in stage.events(name)}
    assert {("Rendered", "Normal"), ("Ready", "Normal")} <= normal, normal

    # a config-only change: every version is still READY, but from the old config
    body["spec"]["maxBatchSize"] = 4
    stage.apply(body)
    cond = stage.wait_condition(name, "Ready", "False", "Loading", "new config of versions [1]")
    obj = stage.get("inferencemodel", name)
    assert cond["observedGeneration"] == obj["metadata"]["generation"] == 2
    assert obj["status"]["activeVersions"] == [1]
    assert stage.condition("inferencemodel", name, "Degraded")["status"] == "True"  # still serving the old config
    load(stage.manual, name)
    stage.wait_condition(name, "Ready", "True", "Serving", timeout=45)
    config = httpx.get(f"{stage.manual.base_url}/v2/models/{name}/config", timeout=10).json()
    assert config["max_batch_size"] == 4
    stage.kubectl("delete", "inferencemodel", name, "--wait=true", "--timeout=60s")


def test_status_counts_every_replica_behind_the_service(stage: Stage) -> None:
    ip = host_ip()
    if ip is None:
        pytest.skip("needs a non-loopback IPv4 address on this machine (EndpointSlices refuse 127.0.0.0/8)")
    pool, name = "replicated", "spread"
    # two real pods of the pool that no node takes (Pending: no address of their own); the two server processes
    # below stand in for them in hand-made EndpointSlices that name them, as the EndpointSlice controller would
    stage.server(pool, replicas=2, nodeSelector={"e2e.kubeinfer.io/no-such-node": "true"})
    selector = f"app.kubernetes.io/instance={pool},app.kubernetes.io/name=kubeinfer-server"

    def pods() -> list[dict[str, Any]] | None:
        out = stage.kubectl("get", "pods", "-l", selector, "-o", "json", check=False)
        items = json.loads(out.stdout)["items"] if out.returncode == 0 else []
        return items if len(items) == 2 else None

    targets = [
        {"kind": "Pod", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
        for p in wait_for_cluster("the pool's two pods", pods, 60)
    ]
    repo = stage.folder / pool
    repo.mkdir(exist_ok=True)  # the operator may have made it already
    logs = stage.log_path.parent
    a = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "1", log_dir=logs, host=ip)
    b = start_server(repo, "--model-control-mode", "explicit", log_dir=logs, host=ip)
    slices = []
    try:
        for replica, server, target in (("replica-a", a, targets[0]), ("replica-b", b, targets[1])):
            piece = {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{pool}-{replica}",
                    "labels": {
                        "kubernetes.io/service-name": pool,
                        "endpointslice.kubernetes.io/managed-by": "e2e.kubeinfer.io",
                        SERVER_LABEL: pool,
                    },
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": server.http_port, "protocol": "TCP"}],
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "targetRef": target}],
            }
            stage.apply(piece)
            slices.append(piece)
        stage.apply(stage.model(name, pool, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
        # replica a (poll mode) loads it, replica b (explicit mode) does not: not Ready
        cond = stage.wait_condition(name, "Ready", "False", "Loading", "version 1 on 1 of 2 replicas")
        assert "waiting for versions [1]" in cond["message"]
        (row,) = stage.get("inferencemodel", name)["status"]["versionStates"]
        assert (row["version"], row["replicas"], row["readyReplicas"]) == (1, 2, 1)
        load(b, name)
        stage.wait_condition(name, "Ready", "True", "Serving", "on 2 replicas", timeout=45)
        (row,) = stage.get("inferencemodel", name)["status"]["versionStates"]
        assert (row["replicas"], row["readyReplicas"], row["state"]) == (2, 2, "READY")

        # a replica taken out of the Service (not ready) no longer counts, whatever it serves
        slices[1]["endpoints"][0]["conditions"]["ready"] = False
        stage.apply(slices[1])
        assert httpx.post(f"{b.base_url}/v2/repository/models/{name}/unload", json={}, timeout=30).status_code == 200
        body = stage.model(name, pool, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}])
        body["spec"]["maxBatchSize"] = 4  # a real change: rendered, reloaded by a only
        stage.apply(body)
        stage.wait_condition(name, "Ready", "True", "Serving", timeout=60)
        cond = stage.condition("inferencemodel", name, "Ready")
        assert "on 2 replicas" not in cond["message"]
        (row,) = stage.get("inferencemodel", name)["status"]["versionStates"]
        assert (row["replicas"], row["readyReplicas"]) == (1, 1)
        stage.kubectl("delete", "inferencemodel", name, "--wait=true", "--timeout=60s")
    finally:
        for piece in slices:
            stage.kubectl("delete", "endpointslice", piece["metadata"]["name"], check=False)
        a.terminate()
        b.terminate()
        stage.kubectl("delete", "inferenceserver", pool, check=False)


def test_each_namespace_gets_a_claim_on_its_own_folder_and_broader_claims_are_refused(stage: Stage) -> None:
    """The operator's volume is the NFS export /exports/<ns> (PVC ``models``); this namespace's folder is
    /exports/<ns>/<ns>. A server naming no claim gets the operator's, bound by the controller manager to a
    read-only PersistentVolume on that folder; a claim on the whole export, on other storage or missing is
    refused with a condition and gets no models; an admin's claim on the namespace's folder is accepted."""
    ns = stage.ns
    stage.volume("alias", f"/exports/{ns}/")  # another PV and claim name on the whole export
    stage.volume("elsewhere", f"/exports/{ns}-other")
    stage.volume("mine", f"/exports/{ns}/{ns}")  # exactly this namespace's folder
    stage.server("provided-pool")
    stage.server("alias-pool", claim="alias")
    stage.server("other-pool", claim="elsewhere")
    stage.server("no-claim-pool", claim="missing")
    stage.server("mine-pool", claim="mine")

    def repository_ready(server: str) -> dict[str, Any]:
        return wait_for_cluster(
            f"{server} RepositoryReady",
            lambda: stage.condition("inferenceserver", server, "RepositoryReady") or None,
        )

    provided = repository_ready("provided-pool")
    assert provided["status"] == "True" and "pods mount claim 'kubeinfer-repository'" in provided["message"]
    claim = wait_for_cluster(
        "the provided claim Bound",
        lambda: (c := stage.get("pvc", "kubeinfer-repository")).get("status", {}).get("phase") == "Bound" and c,
    )
    pv = json.loads(stage.cluster.kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json").stdout)
    assert pv["spec"]["nfs"] == {"server": "nfs.example.internal", "path": f"/exports/{ns}/{ns}", "readOnly": True}
    assert pv["spec"]["accessModes"] == ["ReadOnlyMany"] and claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert stage.get("inferenceserver", "provided-pool")["status"]["repositoryClaim"] == "kubeinfer-repository"

    whole = repository_ready("alias-pool")
    assert whole["status"] == "False" and "reaches the whole repository volume" in whole["message"]
    other = repository_ready("other-pool")
    assert other["status"] == "False"
    assert (
        f"bound to volume '{stage.pv_prefix}-elsewhere' (NFS nfs.example.internal:/exports/{ns}-other)"
        in other["message"]
    )
    assert f"this namespace's models are in NFS nfs.example.internal:/exports/{ns}/{ns}" in other["message"]
    missing = repository_ready("no-claim-pool")
    assert missing["status"] == "False" and "'missing' does not exist" in missing["message"]
    assert repository_ready("mine-pool")["status"] == "True"

    stage.apply(stage.model("misplaced", "other-pool", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    stage.apply(stage.model("broad", "alias-pool", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    stage.wait_condition("misplaced", "Rendered", "False", "ClaimNotMounted")
    stage.wait_condition("broad", "Rendered", "False", "ClaimTooBroad")
    assert not (stage.folder / "other-pool").exists() and not (stage.folder / "alias-pool").exists()
    for name, pool in (("placed", "mine-pool"), ("provided", "provided-pool")):
        stage.apply(stage.model(name, pool, [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
        stage.wait_condition(name, "Rendered", "True")
        assert (stage.folder / pool / name / "1" / "model.onnx").is_file()
    stage.kubectl(
        "delete", "inferencemodel", "misplaced", "broad", "placed", "provided", "--wait=true", "--timeout=60s"
    )
    stage.kubectl(
        "delete", "inferenceserver", "provided-pool", "alias-pool", "other-pool", "no-claim-pool", "mine-pool"
    )


def test_private_downloads_use_only_a_labelled_secret_for_its_hosts_over_https(stage: Stage) -> None:
    data = (stage.folder / "uploads" / "relu.onnx").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    stage.https.routes["/private/relu.onnx"] = lambda auth: (
        (200, {}, data) if auth == "Bearer t0ken" else (401, {}, b"")
    )
    stage.https.routes["/downgrade"] = lambda _: (302, {"Location": f"{stage.files_url}/relu.onnx"}, b"")
    token = base64.b64encode(b"t0ken").decode()
    labelled = {"serving.kubeinfer.io/artifact-credentials": "true"}
    for secret, labels, hosts in (
        ("creds", labelled, "models.example.com,127.0.0.1"),
        ("plain", {}, "127.0.0.1"),
        ("elsewhere", labelled, "models.example.com"),  # labelled, but bound to another host
    ):
        stage.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": secret,
                    "labels": labels,
                    "annotations": {"serving.kubeinfer.io/artifact-hosts": hosts},
                },
                "data": {"token": token},
            }
        )
    private = f"{stage.https.url}/private/relu.onnx"
    cases = {
        "private": ({"uri": private, "sha256": sha, "credentialsSecret": "creds"}, "True", None),
        "unlabelled": ({"uri": private, "sha256": sha, "credentialsSecret": "plain"}, "False", "CredentialsRejected"),
        "wrong-host": (
            {"uri": private, "sha256": sha, "credentialsSecret": "elsewhere"},
            "False",
            "CredentialsRejected",
        ),
        "anonymous": ({"uri": private, "sha256": sha}, "False", "FetchFailed"),
        "downgrade": ({"uri": f"{stage.https.url}/downgrade", "sha256": sha}, "False", "RedirectRejected"),
        "nosecret": ({"uri": private, "sha256": sha, "credentialsSecret": "absent"}, "False", "CredentialsNotFound"),
    }
    for name, (source, _, _) in cases.items():
        stage.apply(stage.model(name, MANUAL, [{"version": 1, "source": source}]))
    for name, (_, status, reason) in cases.items():
        stage.wait_condition(name, "Rendered", status, reason)
    assert (stage.folder / MANUAL / "private" / "1" / "model.onnx").read_bytes() == data
    assert not (stage.folder / MANUAL / "unlabelled").exists()
    wrong_host = stage.condition("inferencemodel", "wrong-host", "Rendered")["message"]
    assert "Secret 'elsewhere' may not be sent to '127.0.0.1'" in wrong_host, wrong_host
    downgrade = stage.condition("inferencemodel", "downgrade", "Rendered")["message"]
    assert "redirects from https:// to http://" in downgrade
    assert ("/private/relu.onnx", "Bearer t0ken") in stage.https.seen.requests
    assert all(auth in (None, "Bearer t0ken") for _, auth in stage.https.seen.requests)
    # credentials over plain http never get past the API server
    body = stage.model("cleartext", MANUAL, [{"version": 1, "source": {"uri": f"{stage.files_url}/relu.onnx"}}])
    body["spec"]["versions"][0]["source"].update(sha256=sha, credentialsSecret="creds")
    refused = stage.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert refused.returncode != 0 and "credentialsSecret needs an https://" in refused.stderr
    stage.kubectl("delete", "inferencemodel", *cases, "--wait=true", "--timeout=60s")
