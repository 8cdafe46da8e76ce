"""Shared fixtures for the end-to-end suite: a real local control plane.

Before the first test, if any collected test uses ``cluster``, the pinned binaries are
built (``e2e/cluster/build``; a cold build takes ~20 min on 2 cores, so it runs outside
the per-test timeout, with live output). ``cluster`` (session scope) then runs
``e2e/cluster/up`` once and stops the cluster at the end if, and only if, a pytest
session started it and no other session still uses it (a cluster that was already
running, e.g. from ``eval "$(e2e/cluster/up)"``, is reused and left running). If the
build or the start fails, every test using the fixture errors with the tool's output:
nothing is skipped.

Set ``KUBEINFER_CLUSTER_KEEP=1`` to leave the cluster running after the session
(faster reruns; stop it with ``e2e/cluster/down``). ``KUBEINFER_CLUSTER_CACHE`` / ``KUBEINFER_CLUSTER_RUN`` are passed
through to the script (see e2e/cluster/cluster.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CLUSTER_SCRIPT = Path(__file__).resolve().parent / "cluster" / "cluster.py"
ADDONS_SCRIPT = CLUSTER_SCRIPT.with_name("addons.py")
#: the add-ons the autoscaling tests need (see e2e/cluster/localcluster/addons/)
ADDONS = "prometheus,keda"
#: and the scale-to-zero tests: KEDA's HTTP add-on besides them
HTTP_ADDONS = f"{ADDONS},keda-http"
#: scripts/images.py, run as a module from the repository root (it imports e2e.cluster.localcluster from there)
ROOT = Path(__file__).resolve().parents[1]
IMAGES = [sys.executable, "-m", "scripts.images"]


class CommandFailed(AssertionError):
    """A kubectl/helm call that was expected to succeed did not."""


@dataclass
class Cluster:
    kubeconfig: str
    bin_dir: str
    run_dir: str
    server: str
    started: bool
    env: dict = field(repr=False)
    info: dict = field(repr=False, default_factory=dict)

    @property
    def node(self) -> dict | None:
        """The real worker node (``node_ip``, ``host_ip`` -- the host as pods reach it --, ``pod_cidr``,
        ``service_cidr``, ``containerd_socket``, ``volumes``, ...), or None for a kwok-only cluster."""
        return self.info.get("node")

    def run(
        self, tool: str, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        """Run a tool from the cluster's bin dir (``kubectl``, ``helm``, ...) with the cluster env."""
        cmd = [str(Path(self.bin_dir) / tool), *map(str, args)]
        proc = subprocess.run(cmd, env=self.env, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise CommandFailed(
                f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("kubectl", *args, **kw)

    def helm(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("helm", *args, **kw)

    def kubectl_json(self, *args: str, **kw):
        return json.loads(self.kubectl(*args, "-o", "json", **kw).stdout)

    def release_finalizers(self, namespace: str, kind: str = "inferencemodel") -> None:
        """Teardown: drop the finalizers of the ``kind`` objects left in ``namespace`` (their operator may be
        gone already), so that deleting the namespace does not hang on them."""
        listed = self.kubectl("-n", namespace, "get", kind, "-o", "json", check=False).stdout or "{}"
        for item in json.loads(listed).get("items", []):
            self.kubectl(
                "-n", namespace, "patch", kind, item["metadata"]["name"], "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False,
            )  # fmt: skip

    @staticmethod
    def script(*args: str, env: dict | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run e2e/cluster/cluster.py (``up``/``down``/``env``/``build``); pass ``env`` to target another run folder."""
        return run_cluster_script(*args, env=env, timeout=timeout)

    @classmethod
    def from_info(cls, info: dict) -> Cluster:
        """Build a handle from the JSON printed by ``up --json`` / ``env --json``."""
        return cluster_from_info(info)


def run_cluster_script(
    *args: str, env: dict | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def cluster_from_info(info: dict) -> Cluster:
    env = dict(os.environ)
    env["KUBECONFIG"] = info["kubeconfig"]
    env["PATH"] = info["bin_dir"] + os.pathsep + env.get("PATH", "")
    return Cluster(
        kubeconfig=info["kubeconfig"],
        bin_dir=info["bin_dir"],
        run_dir=info["run_dir"],
        server=info["server"],
        started=info["started"],
        env=env,
        info=info,
    )


_build_failure: str | None = None
_images_failure: str | None = None


def _stream(cmd: list[str], session: pytest.Session, cwd: Path | None = None) -> tuple[int, str]:
    """Run a long build outside any test (pytest-timeout counts fixture setup), output shown live."""
    capman = session.config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    lines: list[str] = []
    with ctx:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()
        rc = proc.wait()
    return rc, "".join(lines)[-20000:]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before any test runs when a collected test needs ``cluster``.

    A cold build takes far longer than the per-test timeout (pytest-timeout counts
    fixture setup), so it runs here, outside any test, with its output shown live.
    A failure is recorded and reported by the ``cluster`` fixture (tests error, nothing
    is skipped).
    """
    global _build_failure, _images_failure
    if session.config.option.collectonly:
        return
    needs = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    if needs & {"cluster", "kubeconform"}:
        # the metrics add-ons (KEDA: a 10-minute build) only when a collected test uses them
        wanted = HTTP_ADDONS if "http_addon" in needs else ADDONS if "metrics_stack" in needs else ""
        addons = ["--addons", wanted] if wanted else []
        rc, out = _stream([sys.executable, str(CLUSTER_SCRIPT), "build", *addons], session)
        if rc != 0:
            _build_failure = f"e2e/cluster/build failed (exit {rc}):\n{out}"
    if "images" in needs:
        # the image builds (cold: Debian base + both images, a few minutes) also run before any test
        rc, out = _stream([*IMAGES, "--no-load"], session, cwd=ROOT)
        if rc != 0:
            _images_failure = f"scripts/images failed (exit {rc}):\n{out}"


@pytest.fixture(scope="session")
def cluster():
    """The local control plane (etcd, kube-apiserver, KCM, scheduler, kwok GPU node)."""
    if _build_failure:
        pytest.fail(_build_failure, pytrace=False)
    keep = os.environ.get("KUBEINFER_CLUSTER_KEEP") == "1"
    # --hold registers this process as a user: concurrent sessions (other engineers, xdist
    # workers) share one cluster, and the last one out stops it -- only if a session started it.
    hold = [] if keep else ["--hold", str(os.getpid())]
    proc = run_cluster_script("up", "--json", *hold)
    if proc.returncode != 0:
        pytest.fail(
            f"e2e/cluster/up failed (exit {proc.returncode}):\n{proc.stderr[-20000:]}\n{proc.stdout[-2000:]}",
            pytrace=False,
        )
    sys.stderr.write(proc.stderr)
    c = cluster_from_info(json.loads(proc.stdout))
    yield c
    if not keep:
        rel = run_cluster_script("release", *hold)
        sys.stderr.write(rel.stderr)
        if rel.returncode != 0:
            sys.stderr.write(f"e2e/cluster/cluster.py release failed (exit {rel.returncode})\n")


@pytest.fixture(scope="session")
def node(cluster) -> dict:
    """The cluster's real worker node (see ``Cluster.node``); errors when the cluster has none."""
    if not cluster.node:
        pytest.fail(
            "the local cluster has no real worker node (KUBEINFER_CLUSTER_NODE=0, or not root); "
            "tests of real pods need one",
            pytrace=False,
        )
    return cluster.node


@pytest.fixture(scope="session")
def images(cluster, node) -> dict:
    """The server and operator images (``scripts/images``), built before the session and imported into the
    node's containerd: ``{"server": "kubeinfer-server:<version>", "operator": ..., "info": <--json output>}``."""
    if _images_failure:
        pytest.fail(_images_failure, pytrace=False)
    env = dict(os.environ, KUBEINFER_CLUSTER_RUN=cluster.run_dir)
    proc = subprocess.run([*IMAGES, "--json"], capture_output=True, text=True, env=env, cwd=ROOT)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"scripts/images failed (exit {proc.returncode}):\n{proc.stderr[-20000:]}", pytrace=False)
    info = json.loads(proc.stdout)
    if info.get("node") != node["name"]:
        pytest.fail(f"scripts/images did not load the images into {node['name']}:\n{proc.stderr}", pytrace=False)
    refs = {i["role"]: i["ref"] for i in info["images"]}
    return {**refs, "info": info}


@pytest.fixture(scope="session")
def kubectl(cluster):
    """``kubectl(*args, check=True, input=None, timeout=120) -> CompletedProcess``."""
    return cluster.kubectl


@pytest.fixture(scope="session")
def helm(cluster):
    """``helm(*args, check=True, input=None, timeout=120) -> CompletedProcess``."""
    return cluster.helm


def _start_addons(names: str) -> dict:
    """``up --json --addons names`` on the running cluster (starts what is missing; they stop with the
    cluster): its JSON, or the test fails with the script's output."""
    if _build_failure:
        pytest.fail(_build_failure, pytrace=False)
    hold = [] if os.environ.get("KUBEINFER_CLUSTER_KEEP") == "1" else ["--hold", str(os.getpid())]
    proc = run_cluster_script("up", "--json", "--addons", names, *hold)
    if proc.returncode != 0:
        pytest.fail(
            f"e2e/cluster/up --addons {names} failed (exit {proc.returncode}):\n{proc.stderr[-20000:]}", pytrace=False
        )
    return json.loads(proc.stdout)


@dataclass
class MetricsStack:
    """Prometheus and KEDA started by ``up --addons`` on the session's cluster (host processes)."""

    prometheus_url: str
    keda_version: str
    prometheus_version: str
    info: dict = field(repr=False)


@pytest.fixture(scope="session")
def metrics_stack(cluster) -> MetricsStack:
    """Prometheus scraping annotated pods and KEDA (operator + external metrics adapter) on ``cluster``.

    ``up --addons`` on the running cluster starts what is missing; the add-ons stop with the cluster.
    """
    info = _start_addons(ADDONS)
    addons = info["addons"]
    return MetricsStack(
        prometheus_url=addons["prometheus"]["url"],
        keda_version=addons["keda-operator"]["version"],
        prometheus_version=addons["prometheus"]["version"],
        info=info,
    )


@dataclass
class HTTPAddon:
    """KEDA's HTTP add-on (operator, external scaler, interceptor) beside Prometheus and KEDA, host processes."""

    prometheus_url: str
    #: the interceptor's proxy port, as the test client reaches it
    interceptor_url: str
    #: the external scaler, as KEDA (a host process) reaches it
    scaler_address: str
    version: str
    info: dict = field(repr=False)


@pytest.fixture(scope="session")
def http_addon(cluster) -> HTTPAddon:
    """``up --addons prometheus,keda,keda-http`` on the running cluster (starts what is missing)."""
    info = _start_addons(HTTP_ADDONS)
    addons = info["addons"]
    return HTTPAddon(
        prometheus_url=addons["prometheus"]["url"],
        interceptor_url=addons["keda-http-interceptor"]["url"],
        scaler_address=addons["keda-http-scaler"]["address"],
        version=addons["keda-http-interceptor"]["version"],
        info=info,
    )


@dataclass
class Kubeconform:
    """kubeconform and the offline JSON schemas built by ``e2e/cluster/build`` (see addons.py)."""

    binary: Path
    schemas: Path
    crd_schemas: Path
    kubernetes_version: str

    def validate(self, manifests: str, *extra_schema_dirs: Path) -> subprocess.CompletedProcess:
        """``kubeconform -strict -summary`` of YAML text against the cluster's version and the CRD schemas."""
        locations = [
            str(self.schemas),
            f"{self.crd_schemas}/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json",
        ]
        for d in extra_schema_dirs:
            locations.append(f"{d}/{{{{.Group}}}}/{{{{.ResourceKind}}}}_{{{{.ResourceAPIVersion}}}}.json")
        args = [
            str(self.binary),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            self.kubernetes_version,
        ]
        for loc in locations:
            args += ["-schema-location", loc]
        return subprocess.run([*args, "-"], input=manifests, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def kubeconform() -> Kubeconform:
    if _build_failure:
        pytest.fail(_build_failure, pytrace=False)
    proc = subprocess.run([sys.executable, str(ADDONS_SCRIPT), "kubeconform-dir"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"building kubeconform failed:\n{proc.stderr[-10000:]}", pytrace=False)
    d = Path(proc.stdout.strip())
    return Kubeconform(
        binary=d / "kubeconform",
        schemas=d / "schemas",
        crd_schemas=d / "crd-schemas",
        kubernetes_version=(d / "KUBERNETES_VERSION").read_text().strip(),
    )


@pytest.fixture(scope="session")
def crd_schemas(tmp_path_factory) -> Path:
    """kubeconform schemas of our own CRDs (crds/), generated now: they change with the code."""
    out = tmp_path_factory.mktemp("crd-schemas")
    crds = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "crds").glob("*.yaml"))
    proc = subprocess.run(
        [sys.executable, str(ADDONS_SCRIPT), "crd-schemas", str(out), *crds], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return out


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The drills' figures (tests/support/drills.py), shown for a pass too."""
    from tests.support import drills

    drills.write_summary(terminalreporter)
