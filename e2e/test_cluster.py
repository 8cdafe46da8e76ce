"""End-to-end checks of the local control plane itself (no mocks).

They exercise the real kube-apiserver / controller-manager / scheduler / kwok started
by the ``cluster`` fixture (see conftest.py and e2e/cluster/).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.support.waiting import wait_for_cluster

CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"
GPU = "nvidia.com/gpu"


def pinned(module_dir: str, module: str) -> str:
    text = (CLUSTER_DIR / module_dir / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.M)
    assert m, f"{module} not pinned in e2e/cluster/{module_dir}/go.mod"
    return m.group(1)


@pytest.fixture
def namespace(cluster):
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    # The serviceaccount controller (KCM) must create the default SA before pods are admitted.
    wait_for_cluster(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# ----------------------------------------------------------------------------- versions


def test_kubectl_and_server_report_pinned_version(cluster):
    want = pinned("k8s", "k8s.io/kubernetes")
    v = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert v["clientVersion"]["gitVersion"] == want
    assert v["serverVersion"]["gitVersion"] == want
    major, minor = want.lstrip("v").split(".")[:2]
    assert (v["serverVersion"]["major"], v["serverVersion"]["minor"]) == (major, minor)
    assert v["serverVersion"]["gitTreeState"] == "clean"


def test_helm_reports_pinned_version(cluster):
    want = pinned("helm", "helm.sh/helm/v3")
    out = cluster.helm("version", "--short").stdout.strip()
    assert out.split("+")[0] == want, out
    # helm must talk to the cluster too: listing releases goes through the apiserver.
    assert cluster.helm("list", "--all-namespaces").returncode == 0


def test_tools_on_path_come_from_bin_dir(cluster):
    first = cluster.env["PATH"].split(os.pathsep)[0]
    assert first == cluster.bin_dir
    for tool in ("kubectl", "helm"):
        assert (Path(first) / tool).is_file()
    assert cluster.env["KUBECONFIG"] == cluster.kubeconfig


# ----------------------------------------------------------------------------- nodes & workloads


def test_fake_gpu_node_is_ready(cluster):
    table = cluster.kubectl("get", "nodes", "-l", "type=kwok", "--no-headers").stdout
    assert re.search(r"^\S+\s+Ready\s", table, re.M), table
    nodes = cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == 1
    node = nodes[0]
    assert node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["status"]["capacity"][GPU] == "8"
    assert node["status"]["allocatable"][GPU] == "8"
    for res in ("cpu", "memory", "pods"):
        assert res in node["status"]["capacity"]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert not [t for t in node["spec"].get("taints", []) if t["key"] == "node.kubernetes.io/not-ready"]


def test_gpu_deployment_runs_and_is_garbage_collected(cluster, namespace):
    ns = namespace
    manifest = textwrap.dedent(f"""\
        apiVersion: apps/v1
        kind: Deployment
        metadata:
          name: gpu-echo
          namespace: {ns}
        spec:
          replicas: 2
          selector:
            matchLabels: {{app: gpu-echo}}
          template:
            metadata:
              labels: {{app: gpu-echo}}
            spec:
              nodeSelector:
                nvidia.com/gpu.present: "true"
              containers:
              - name: server
                image: registry.invalid/kubeinfer/echo:0
                resources:
                  requests: {{cpu: 100m, memory: 64Mi, {GPU}: 1}}
                  limits: {{{GPU}: 1}}
        """)
    cluster.kubectl("apply", "-f", "-", input=manifest)

    def available():
        d = cluster.kubectl_json("get", "deployment", "gpu-echo", "-n", ns)
        return d["status"].get("availableReplicas", 0) == 2 and d

    def describe():
        return cluster.kubectl("get", "deployment,replicasets,pods", "-n", ns, "-o", "wide", check=False).stdout

    wait_for_cluster("2 available replicas", available, timeout=180, describe=describe)

    rs = cluster.kubectl_json("get", "replicasets", "-n", ns, "-l", "app=gpu-echo")["items"]
    assert len(rs) == 1
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    pods = cluster.kubectl_json("get", "pods", "-n", ns, "-l", "app=gpu-echo")["items"]
    assert len(pods) == 2
    for p in pods:
        assert p["status"]["phase"] == "Running"
        assert p["spec"]["nodeName"], "pod was not scheduled"
        assert p["metadata"]["ownerReferences"][0]["name"] == rs[0]["metadata"]["name"]
        assert p["spec"]["containers"][0]["resources"]["limits"][GPU] == "1"
    node = cluster.kubectl_json("get", "node", pods[0]["spec"]["nodeName"])
    assert node["metadata"]["labels"].get("type") == "kwok"

    cluster.kubectl("delete", "deployment", "gpu-echo", "-n", ns, "--wait=false")

    def collected():
        left = cluster.kubectl("get", "replicasets,pods", "-n", ns, "-l", "app=gpu-echo", "-o", "name").stdout
        return left.strip() == "" or None

    wait_for_cluster("ReplicaSet and Pods to be garbage-collected", collected, timeout=180, describe=describe)


def test_gpu_capacity_is_enforced_by_scheduler(cluster, namespace):
    """A pod asking for more GPUs than the node has stays Pending (FailedScheduling)."""
    manifest = textwrap.dedent(f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: too-greedy, namespace: {namespace}}}
        spec:
          containers:
          - name: c
            image: registry.invalid/x:0
            resources: {{limits: {{{GPU}: 9}}}}
        """)
    cluster.kubectl("apply", "-f", "-", input=manifest)

    def unschedulable():
        p = cluster.kubectl_json("get", "pod", "too-greedy", "-n", namespace)
        conds = [c for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled"]
        return conds and conds[0]["status"] == "False" and conds[0].get("reason") == "Unschedulable" and p

    p = wait_for_cluster("PodScheduled=False/Unschedulable", unschedulable, timeout=120)
    assert not p["spec"].get("nodeName")
    msg = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"][0].get("message", "")
    assert f"Insufficient {GPU}" in msg, msg


# ----------------------------------------------------------------------------- CRDs & RBAC

CRD = textwrap.dedent("""\
    apiVersion: apiextensions.k8s.io/v1
    kind: CustomResourceDefinition
    metadata:
      name: widgets.e2e.kubeinfer.dev
    spec:
      group: e2e.kubeinfer.dev
      scope: Namespaced
      names: {plural: widgets, singular: widget, kind: Widget}
      versions:
      - name: v1
        served: true
        storage: true
        schema:
          openAPIV3Schema:
            type: object
            required: [spec]
            properties:
              spec:
                type: object
                required: [model]
                properties:
                  model: {type: string, minLength: 1}
                  replicas: {type: integer, minimum: 1, maximum: 8}
    """)


def test_crd_is_served_and_validates(cluster, namespace, tmp_path):
    crd = tmp_path / "crd.yaml"
    crd.write_text(CRD)
    cluster.kubectl("apply", "-f", str(crd))
    try:
        cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.e2e.kubeinfer.dev", "--timeout=60s")
        wait_for_cluster(
            "widgets in discovery",
            lambda: "widgets" in cluster.kubectl("api-resources", "--api-group=e2e.kubeinfer.dev", check=False).stdout,
            timeout=60,
        )

        good = tmp_path / "good.yaml"
        good.write_text(
            f"apiVersion: e2e.kubeinfer.dev/v1\nkind: Widget\nmetadata: {{name: ok, namespace: {namespace}}}\n"
            "spec: {model: llama, replicas: 2}\n"
        )
        cluster.kubectl("apply", "-f", str(good))
        got = cluster.kubectl_json("get", "widget", "ok", "-n", namespace)
        assert got["spec"] == {"model": "llama", "replicas": 2}

        bad = tmp_path / "bad.yaml"
        bad.write_text(
            f"apiVersion: e2e.kubeinfer.dev/v1\nkind: Widget\nmetadata: {{name: bad, namespace: {namespace}}}\n"
            "spec: {replicas: 0}\n"
        )
        r = cluster.kubectl("apply", "-f", str(bad), check=False)
        assert r.returncode != 0, r.stdout
        assert "is invalid" in r.stderr, r.stderr
        assert "spec.replicas" in r.stderr and "should be greater than or equal to 1" in r.stderr, r.stderr
        assert "spec.model: Required value" in r.stderr, r.stderr
        assert cluster.kubectl("get", "widget", "bad", "-n", namespace, check=False).returncode != 0
    finally:
        cluster.kubectl("delete", "-f", str(crd), "--wait=false", check=False)


def test_rbac_is_enforced(cluster, namespace):
    sa = f"system:serviceaccount:{namespace}:default"
    r = cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", sa, check=False)
    assert r.stdout.strip() == "no", r.stdout + r.stderr
    r = cluster.kubectl("get", "pods", "-n", namespace, "--as", sa, check=False)
    assert r.returncode != 0 and "Forbidden" in r.stderr, r.stderr
    cluster.kubectl(
        "create",
        "rolebinding",
        "sa-view",
        "--clusterrole=view",
        f"--serviceaccount={namespace}:default",
        "-n",
        namespace,
    )
    wait_for_cluster(
        "RBAC grant to take effect",
        lambda: (
            cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace, "--as", sa, check=False).stdout.strip()
            == "yes"
        ),
        timeout=30,
    )


# ----------------------------------------------------------------------------- up / down


def test_up_is_idempotent(cluster):
    r = cluster.script("up", "--json", "--hold", str(os.getpid()))
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)
    assert again["started"] is False
    assert again["server"] == cluster.server
    assert again["kubeconfig"] == cluster.kubeconfig
    assert again["pids"] == cluster.info["pids"]
    e = cluster.script("env")
    assert e.returncode == 0, e.stderr
    assert f"export KUBECONFIG={cluster.kubeconfig}" in e.stdout
    assert f"export PATH={cluster.bin_dir}:" in e.stdout


def _node_leftovers(node: dict, run_dir: Path) -> list[str]:
    """What a stopped real node left on the host: its namespace, veth, routes, cgroups, mounts, sockets."""
    left = []
    if Path(f"/run/netns/{node['netns']}").exists():
        left.append(f"netns {node['netns']}")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if f"kih{node['rid']}" in line]
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    left += [f"route {r}" for r in routes.splitlines() if r.startswith((node["pod_cidr"], node["service_cidr"]))]
    for ctl in Path("/sys/fs/cgroup").iterdir():
        if (ctl / node["cgroup_root"].lstrip("/")).exists():
            left.append(f"cgroup {ctl.name}{node['cgroup_root']}")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    left += [f"mount {m.split()[4]}" for m in mounts if str(run_dir) in m.split()[4]]
    if Path(node["containerd_socket"]).parent.exists():
        left.append(f"socket dir {Path(node['containerd_socket']).parent}")
    return left


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_second_cluster_on_free_ports_release_and_down(cluster, tmp_path):
    """A second cluster in another run folder gets other ports; ``release`` stops it when the
    last holder lets go; ``down`` stops exactly its processes and leaves the session's cluster alone."""
    env = dict(os.environ, KUBEINFER_CLUSTER_RUN=str(tmp_path / "run"))
    me = str(os.getpid())
    other = subprocess.Popen(["sleep", "600"])
    try:
        r = cluster.script("up", "--json", "--hold", me, env=env, timeout=600)
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        try:
            assert info["started"] is True
            assert info["server"] != cluster.server
            assert not set(info["ports"].values()) & set(cluster.info["ports"].values())
            second = cluster.from_info(info)
            nodes = second.kubectl("get", "nodes", "-o", "name").stdout.split()
            if info["node"]:  # its own real node, in its own network namespace, on other addresses
                assert sorted(nodes) == ["node/kubeinfer-node-0", "node/kwok-gpu-node-0"]
                if cluster.node:
                    assert info["node"]["netns"] != cluster.node["netns"]
                    assert info["node"]["pod_cidr"] != cluster.node["pod_cidr"]
                    assert info["service_cidr"] != cluster.info["service_cidr"]
            else:
                assert nodes == ["node/kwok-gpu-node-0"]
            assert all(not _gone(pid) for pid in info["pids"].values())

            # two holders: releasing one keeps it running; the last release stops it.
            r2 = cluster.script("up", "--json", "--hold", str(other.pid), env=env, timeout=120)
            assert r2.returncode == 0 and json.loads(r2.stdout)["started"] is False, r2.stderr
            assert cluster.script("release", "--hold", me, env=env).returncode == 0
            assert cluster.script("env", env=env).returncode == 0, "released while another holder was alive"
            other.kill()
            other.wait()
            assert cluster.script("release", "--hold", me, env=env).returncode == 0  # prunes the dead holder
            for name, pid in info["pids"].items():
                assert _gone(pid), f"{name} (pid {pid}) still running after the last release"
            assert cluster.script("env", env=env).returncode == 1
            if info["node"]:
                assert _node_leftovers(info["node"], tmp_path / "run") == []

            # a plain `up` (a person) then `down`.
            r3 = cluster.script("up", "--json", env=env, timeout=600)
            assert r3.returncode == 0, r3.stderr
            info = json.loads(r3.stdout)
            assert info["started"] is True
            assert cluster.script("release", "--hold", me, env=env).returncode == 0
            assert cluster.script("env", env=env).returncode == 0, "release stopped a cluster started without --hold"
        finally:
            d = cluster.script("down", env=env, timeout=120)
        assert d.returncode == 0, d.stderr
        for name, pid in info["pids"].items():
            assert _gone(pid), f"{name} (pid {pid}) still running after down"
        assert cluster.script("env", env=env).returncode == 1
        if info["node"]:
            assert _node_leftovers(info["node"], tmp_path / "run") == []
    finally:
        other.kill()
    # ... and the session's cluster is untouched.
    for name, pid in cluster.info["pids"].items():
        assert not _gone(pid), f"stopping the second cluster stopped the first one's {name}"
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
