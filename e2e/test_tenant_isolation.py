"""Issue 15 part 1 end to end: one namespace cannot touch another's models on the shared repository volume.

Real control plane, one real operator watching two namespaces (attacker A, victim B), one real server
per namespace polling its folder of the volume (``<root>/<ns>/gpu-pool``). B serves a Python model
(OUT = 2 * IN). Every escape A tries -- the reproduced one (``defaultModelFilename`` walking into B's
folder), label files, ``source.path`` and ``repository.subPath`` naming B's folder, symlinks planted on
the volume, a forged ``status.repositoryPath`` -- is refused by the API server (CEL rules) or by the
operator with a condition, and after each one B's model file is byte for byte the same and B's server
still answers 2 * IN.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support import processes
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
API = "serving.kubeinfer.io/v1alpha1"
POOL = "gpu-pool"

DOUBLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * %s for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for out in outputs]
"""


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Tenants:
    cluster: Any
    root: Path
    a: str
    b: str
    servers: dict[str, ServerProcess]
    operator: subprocess.Popen[bytes]
    operator_log: Path
    victim_digest: str = ""

    def kubectl(self, ns: str, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", ns, *args, check=check, input=input)

    def apply(self, ns: str, obj: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess:
        return self.kubectl(ns, "apply", "-f", "-", input=json.dumps(obj), check=check)

    def get(self, ns: str, kind: str, name: str) -> dict[str, Any]:
        proc = self.kubectl(ns, "get", kind, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    def condition(self, ns: str, name: str, ctype: str = "Ready") -> dict[str, Any]:
        conds = (self.get(ns, "inferencemodel", name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == ctype), {})

    def wait_condition(self, ns: str, name: str, status: str, reason: str | None = None) -> dict[str, Any]:
        def check() -> dict | None:
            c = self.condition(ns, name)
            return c if c.get("status") == status and (reason is None or c.get("reason") == reason) else None

        try:
            return wait_for_cluster(f"{ns}/{name} Ready={status} {reason or ''}", check, 90)
        except BaseException:
            print(self.operator_log.read_text(errors="replace")[-8000:])
            raise

    def victim_file(self) -> Path:
        return self.root / self.b / POOL / "victim" / "1" / "model.py"

    def assert_victim_intact(self) -> None:
        assert digest(self.victim_file()) == self.victim_digest
        assert sorted(p.name for p in (self.root / self.b / POOL / "victim").iterdir() if p.name[0] != ".") == [
            "1",
            "config.pbtxt",
        ]
        x = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
        client = httpclient.InferenceServerClient(self.servers[self.b].http_url)
        inp = httpclient.InferInput("IN", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("victim", [inp]).as_numpy("OUT"), 2 * x)
        client.close()


def python_model(name: str, path: str, **extra: Any) -> dict[str, Any]:
    spec = {
        "server": POOL,
        "backend": "python",
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": {"path": path}}],
        **extra,
    }
    return {"apiVersion": API, "kind": "InferenceModel", "metadata": {"name": name}, "spec": spec}


def pool(name: str = POOL, **repository: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceServer",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.example.com/kubeinfer-server:0.1.0",
            "repository": {"claimName": "models", **repository},
        },
    }


@pytest.fixture(scope="module")
def tenants(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    suffix = uuid.uuid4().hex[:6]
    a, b = f"e2e-tenant-a-{suffix}", f"e2e-tenant-b-{suffix}"
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    root = tmp_path_factory.mktemp("shared-volume")
    logs = tmp_path_factory.mktemp("tenant-logs")
    servers: dict[str, ServerProcess] = {}
    for ns, factor in ((a, 666), (b, 2)):
        cluster.kubectl("create", "namespace", ns)
        (root / ns / "uploads").mkdir(parents=True)
        (root / ns / POOL).mkdir()
        (root / ns / "uploads" / "model.py").write_text(DOUBLE % factor)
        servers[ns] = start_server(
            root / ns / POOL, "--model-control-mode", "poll", "--repository-poll-secs", "1", log_dir=logs
        )
    log_path = logs / "operator.log"
    args = [
        sys.executable, "-m", "kubeinfer.operator",
        "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root),
        "--namespace", a, "--namespace", b,
        "--resync-seconds", "2",
        "--unload-timeout", "20",
        "--server-endpoint", f"{a}/{POOL}={servers[a].base_url}",
        "--server-endpoint", f"{b}/{POOL}={servers[b].base_url}",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    t = Tenants(cluster, root, a, b, servers, operator, log_path)
    try:
        for ns in (a, b):
            t.apply(ns, pool())
        t.apply(b, python_model("victim", "uploads/model.py"))
        t.wait_condition(b, "victim", "True")
        t.victim_digest = digest(t.victim_file())
        t.assert_victim_intact()
        yield t
    finally:
        for ns in (a, b):
            t.kubectl(
                ns, "delete", "inferencemodels,inferenceservers", "--all", "--wait=true", "--timeout=60s", check=False
            )
        processes.stop(operator)
        for ns in (a, b):
            cluster.release_finalizers(ns)
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            servers[ns].terminate()


def _victim_path(t: Tenants) -> str:
    return f"../../../../{t.b}/{POOL}/victim/1/model.py"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("reported", "must be one file name in the model's folder"),
        ("absolute", "must be one file name in the model's folder"),
        ("dotdot", "must be one file name in the model's folder"),
        ("label", "must be one file name in the model's folder"),
        ("op-library", "must be one file name in the model's folder"),
        ("source-path", "must not contain '..'"),
        ("subpath", "must not contain '.', '..' or hidden"),
    ],
)
def test_escapes_in_the_spec_are_refused_by_the_apiserver(tenants: Tenants, kind: str, message: str) -> None:
    t = tenants
    if kind == "reported":  # the reproduced attack: A's python model file written over B's live model.py
        obj = python_model("attack", "uploads/model.py", defaultModelFilename=_victim_path(t))
    elif kind == "absolute":
        obj = python_model("attack", "uploads/model.py", defaultModelFilename=f"/models/{t.b}/victim/1/model.py")
    elif kind == "dotdot":
        obj = python_model("attack", "uploads/model.py", defaultModelFilename="..")
    elif kind == "label":
        obj = python_model("attack", "uploads/model.py")
        obj["spec"]["outputs"][0]["labelFilename"] = f"../../{t.b}/uploads/model.py"
    elif kind == "op-library":
        obj = python_model("attack", "uploads/model.py", modelOperations={"opLibraryFilename": [f"../../{t.b}/lib.so"]})
    elif kind == "source-path":
        obj = python_model("attack", f"../{t.b}/uploads/model.py")
    else:
        obj = pool("intruder", subPath=f"../{t.b}/{POOL}")
    proc = t.apply(t.a, obj, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    t.assert_victim_intact()


def test_op_libraries_in_the_spec_are_a_file_name_or_an_absolute_path(tenants: Tenants) -> None:
    """The CRD's rule for modelOperations.opLibraryFilename, checked by the API server (server-side dry run)."""
    t = tenants
    cases = [
        (["/opt/custom/libcustomops.so", "libmine.so"], True),
        (["sub/libcustomops.so"], False),
        ([".hidden.so"], False),
        (["/opt/custom/lib\ncustomops.so"], False),
    ]
    for libraries, accepted in cases:
        obj = python_model("ops", "uploads/model.py", modelOperations={"opLibraryFilename": libraries})
        proc = t.kubectl(t.a, "apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
        if accepted:
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode != 0, libraries
            assert "or an absolute path to a library outside the model repository" in proc.stderr, proc.stderr
    assert not t.get(t.a, "inferencemodel", "ops")


def test_file_names_in_the_spec_are_limited_in_bytes_not_characters(tenants: Tenants) -> None:
    """255 is the file system's limit in bytes (NAME_MAX) and the server's; 128 'é' are 128 characters but
    256 bytes: refused by the API server (dry run), where 127 of them (254 bytes) pass."""
    t = tenants
    for name, accepted in (("é" * 127, True), ("é" * 128, False)):
        for where in ("label", "op-library"):
            obj = python_model("bytes", "uploads/model.py")
            if where == "label":
                obj["spec"]["outputs"][0]["labelFilename"] = name
            else:
                obj["spec"]["modelOperations"] = {"opLibraryFilename": [name]}
            proc = t.kubectl(t.a, "apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
            if accepted:
                assert proc.returncode == 0, (where, proc.stderr)
            else:
                assert proc.returncode != 0, where
                expected = "at most 255 bytes long in UTF-8" if where == "label" else "absolute path to a library"
                assert expected in proc.stderr, (where, proc.stderr)
    assert not t.get(t.a, "inferencemodel", "bytes")


def test_extra_args_may_not_set_the_operators_flags(tenants: Tenants) -> None:
    """The CRD's rule for server.extraArgs, checked by the API server (server-side dry run): a tenant cannot
    point its pool at another repository, switch auth off or open the control API through extra flags."""
    t = tenants
    for args, accepted in (
        (["--log-verbose=1", "--exit-on-error=true"], True),
        (["--model-repository=/"], False),
        (["--auth-token-file", "/dev/null"], False),
        (["--model-control-mode=explicit"], False),
        (["--allowed-backends=python"], False),
        (["--grpc-use-ssl=false"], False),
    ):
        obj = pool("args")
        obj["spec"]["server"] = {"extraArgs": args}
        proc = t.kubectl(t.a, "apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)
        if accepted:
            assert proc.returncode == 0, proc.stderr
        else:
            assert proc.returncode != 0, args
            assert "server.extraArgs must not set a flag the operator sets" in proc.stderr, proc.stderr
    assert not t.get(t.a, "inferenceserver", "args")


def test_a_subpath_naming_another_namespace_stays_inside_its_own(tenants: Tenants) -> None:
    """subPath is relative to the namespace's folder: 'B/gpu-pool' written from A lands in A/B/gpu-pool."""
    t = tenants
    t.apply(t.a, pool("intruder", subPath=f"{t.b}/{POOL}"))
    obj = python_model("victim", "uploads/model.py")
    obj["spec"]["server"] = "intruder"
    t.apply(t.a, obj)
    wait_for_cluster(
        "the model rendered into A's own folder",
        lambda: (
            (t.get(t.a, "inferencemodel", "victim").get("status") or {}).get("repositoryPath")
            == f"{t.a}/{t.b}/{POOL}/victim"
        ),
    )
    dep = wait_for_cluster("Deployment", lambda: t.get(t.a, "deployment", "intruder"))
    mounts = dep["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    mount = next(m for m in mounts if m["name"] == "model-repository")
    # the pods mount A's own claim (it reaches only <volume>/A/): "B/gpu-pool" inside it is A/B/gpu-pool
    assert mount["subPath"] == f"{t.b}/{POOL}"
    assert (t.root / t.a / t.b / POOL / "victim" / "1" / "model.py").read_text() == DOUBLE % 666
    t.assert_victim_intact()
    t.kubectl(t.a, "delete", "inferencemodel", "victim", "--wait=true", "--timeout=60s")
    t.kubectl(t.a, "delete", "inferenceserver", "intruder")


def test_source_paths_through_symlinks_into_another_namespace_are_refused(tenants: Tenants) -> None:
    t = tenants
    os.symlink(t.root / t.b / "uploads" / "model.py", t.root / t.a / "uploads" / "theirs.py")
    os.symlink(t.root / t.b, t.root / t.a / "neighbour")
    cases = {"file-link": "uploads/theirs.py", "folder-link": f"neighbour/{POOL}/victim/1/model.py"}
    for name, path in cases.items():
        t.apply(t.a, python_model(name, path))
    for name in cases:
        cond = t.wait_condition(t.a, name, "False", "PathRejected")
        assert "passes through the symlink" in cond["message"], cond
        assert not (t.root / t.a / POOL / name).exists()
    t.assert_victim_intact()
    for name in cases:
        t.kubectl(t.a, "delete", "inferencemodel", name, "--wait=true", "--timeout=60s")


def test_a_planted_model_folder_symlink_is_neither_written_through_nor_served(tenants: Tenants) -> None:
    t = tenants
    link = t.root / t.a / POOL / "victim"
    os.symlink(t.root / t.b / POOL / "victim", link)
    try:
        t.apply(t.a, python_model("victim", "uploads/model.py"))
        cond = t.wait_condition(t.a, "victim", "False", "PathRejected")
        assert "is a symlink" in cond["message"], cond
        # A's server does not serve B's model through the link either
        rows = wait_for_cluster(
            "A's server reports the linked folder",
            lambda: [
                r
                for r in httpclient.InferenceServerClient(t.servers[t.a].http_url).get_model_repository_index()
                if r["name"] == "victim" and "leads outside" in r.get("reason", "")
            ],
        )
        assert rows[0]["state"] == "UNAVAILABLE"
        t.assert_victim_intact()
        t.kubectl(t.a, "delete", "inferencemodel", "victim", "--wait=true", "--timeout=60s")
        assert (t.root / t.b / POOL / "victim").is_dir()  # deleting A's model removed at most the link
        t.assert_victim_intact()
    finally:
        if link.is_symlink():
            link.unlink()


def test_a_forged_status_repository_path_never_deletes_another_namespaces_model(tenants: Tenants) -> None:
    t = tenants
    t.apply(t.a, python_model("victim", "uploads/model.py"))
    t.wait_condition(t.a, "victim", "True")
    own = f"{t.a}/{POOL}/victim"
    assert t.get(t.a, "inferencemodel", "victim")["status"]["repositoryPath"] == own
    for forged in (f"{t.b}/{POOL}/victim", f"{t.a}/../{t.b}/{POOL}/victim"):
        t.kubectl(
            t.a, "patch", "inferencemodel", "victim", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"repositoryPath": forged}}),
        )  # fmt: skip
        # the next reconcile reads the forged value as "where the model was" and writes its own back
        wait_for_cluster(
            "the operator to reconcile past the forged path",
            lambda: t.get(t.a, "inferencemodel", "victim")["status"]["repositoryPath"] == own,
        )
        t.assert_victim_intact()
    assert "ignoring status.repositoryPath" in t.operator_log.read_text(errors="replace")
    t.kubectl(t.a, "delete", "inferencemodel", "victim", "--wait=true", "--timeout=60s")
    t.assert_victim_intact()
