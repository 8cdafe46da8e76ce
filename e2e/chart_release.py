"""What the e2e tests that ``helm install`` the chart into a namespace of their own share (test_user_path.py,
test_store_sources.py): kubectl in that namespace, the install with the test's network allowed for downloads
(and the volume its models claim is bound to), the example InferenceServer from the locally built image, and the
teardown that leaves the shared cluster as it was.

Imported by module name, as e2e/test_operator_faults.py imports test_operator: pytest puts e2e/ (no
``__init__.py``) on ``sys.path`` for the tests it holds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeinfer"
EXAMPLES = ROOT / "examples" / "kubernetes"


class Release:
    """A test's namespace (``ns``) and the chart's release in it (``release``), on ``cluster`` (the e2e
    ``cluster`` fixture) and its real ``node``. Its subclasses are the tests' dataclasses, which set these."""

    cluster: Any
    node: dict
    ns: str
    release: str

    @property
    def operator(self) -> str:
        """The chart's Deployment and Lease name (its fullname: the release name, as it contains the chart's)."""
        return f"{self.release}-operator"

    def kubectl(self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120):
        return self.cluster.kubectl("-n", self.ns, *args, check=check, input=input, timeout=timeout)

    def get(self, kind: str, name: str = "", selector: str = "") -> Any:
        args = ["get", kind, *([name] if name else []), *(["-l", selector] if selector else []), "-o", "json"]
        proc = self.kubectl(*args, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def apply(self, obj: dict) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))


def install_chart(target: Release, *more: str) -> Path:
    """``helm install`` of the chart with its default values, but for the watched namespace (the test's) and
    ``artifacts.allowedNetworks`` (the host's address as pods reach it: the tests' servers listen on this
    machine, a private address, and downloads reach public ones only by default); ``more``: further helm
    arguments. The host folder of the volume the chart's claim is bound to (what the operator writes)."""
    target.cluster.helm(
        "install", target.release, str(CHART), "-n", target.ns, "--create-namespace",
        "--set", f"operator.watchNamespaces={{{target.ns}}}",
        "--set", f"artifacts.allowedNetworks={{{target.node['host_ip']}/32}}",
        *more,
        "--wait", "--timeout", "5m", timeout=330,
    )  # fmt: skip
    pvc = target.get("pvc", "kubeinfer-models")
    pv = target.cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    return Path(pv["spec"]["hostPath"]["path"])


def uninstall(target: Release, timeout: float = 120) -> None:
    """Teardown: the test's objects, the release and the namespace gone, whatever state they are in."""
    target.kubectl("delete", "inferencemodels,inferenceservers", "--all", "--wait=false", check=False)
    target.cluster.release_finalizers(target.ns)  # the operator may be gone already
    target.cluster.helm("uninstall", target.release, "-n", target.ns, check=False, timeout=timeout)
    target.cluster.kubectl("delete", "namespace", target.ns, "--wait=false", check=False)


def example_server(image: str, name: str | None = None) -> dict:
    """examples/kubernetes/inferenceserver.yaml (named ``name`` when given) on the locally built server ``image``,
    with small requests, a 2 GiB memory limit and a 1 s repository poll."""
    server = yaml.safe_load((EXAMPLES / "inferenceserver.yaml").read_text())
    if name:
        server["metadata"]["name"] = name
    server["spec"]["image"] = image
    server["spec"]["resources"] = {"requests": {"cpu": "200m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    server["spec"]["server"] = {"pollIntervalSeconds": 1}
    return server


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
