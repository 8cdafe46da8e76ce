"""The local cluster's real worker node: real containers from our images, probes, logs, exec, cluster DNS,
ClusterIP Services reachable from the host through kube-proxy, and a hostPath PersistentVolume.

Everything here runs in real pods on the kubelet that ``e2e/cluster/up`` starts beside the kwok GPU node.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespace(cluster):
    name = f"e2e-node-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
        timeout=60,
    )
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def describe_pods(cluster, ns: str):
    return lambda: cluster.kubectl("describe", "pods", "-n", ns, check=False).stdout[-4000:]


def test_real_node_is_ready_beside_the_kwok_gpu_node(cluster, node):
    n = cluster.kubectl_json("get", "node", node["name"])
    info = n["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert info["kubeletVersion"] == cluster.kubectl_json("version")["serverVersion"]["gitVersion"]
    assert info["kernelVersion"] == Path("/proc/sys/kernel/osrelease").read_text().strip()  # a real kernel: ours
    ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    addresses = {a["type"]: a["address"] for a in n["status"]["addresses"]}
    assert addresses["InternalIP"] == node["node_ip"]
    # CPU pods land here: the fake GPU node is tainted; GPU pods get the toleration automatically
    kwok = cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"][0]
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in kwok["spec"]["taints"]
    sc = cluster.kubectl_json("get", "storageclass", node["storage_class"])
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"


def test_pod_probes_logs_exec_dns_and_cluster_ip_from_the_host(cluster, node, images, namespace):
    """The server image in a Deployment behind a Service: readiness probe, logs, exec, DNS, ClusterIP."""
    ns = namespace
    manifest = textwrap.dedent(f"""\
        apiVersion: apps/v1
        kind: Deployment
        metadata: {{name: web, namespace: {ns}}}
        spec:
          replicas: 1
          selector: {{matchLabels: {{app: web}}}}
          template:
            metadata: {{labels: {{app: web}}}}
            spec:
              securityContext: {{runAsNonRoot: true, seccompProfile: {{type: RuntimeDefault}}}}
              containers:
              - name: web
                image: {images["server"]}
                command: [python3, -u, -m, http.server, "8080", --directory, /opt/kubeinfer]
                ports: [{{name: http, containerPort: 8080}}]
                readinessProbe: {{httpGet: {{path: /bin/, port: http}}, periodSeconds: 1}}
                resources: {{requests: {{cpu: 50m, memory: 64Mi}}}}
                securityContext:
                  readOnlyRootFilesystem: true
                  allowPrivilegeEscalation: false
                  capabilities: {{drop: [ALL]}}
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: web, namespace: {ns}}}
        spec:
          selector: {{app: web}}
          ports: [{{name: http, port: 80, targetPort: http}}]
        """)
    cluster.kubectl("apply", "-f", "-", input=manifest)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=180s", timeout=200)
    pod = cluster.kubectl_json("get", "pods", "-n", ns, "-l", "app=web")["items"][0]
    assert pod["spec"]["nodeName"] == node["name"]
    assert pod["status"]["podIP"].startswith(node["pod_cidr"].rsplit(".", 2)[0] + ".")
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"

    # the container runs as the image's non-root user
    out = cluster.kubectl("exec", "-n", ns, "deploy/web", "--", "id", "-u").stdout
    assert out.strip() == "1000"

    # ClusterIP from the host, through kube-proxy's rules in the node's network namespace
    svc = cluster.kubectl_json("get", "service", "web", "-n", ns)
    ip = svc["spec"]["clusterIP"]
    r = httpx.get(f"http://{ip}/bin/", timeout=10)
    assert r.status_code == 200 and "kubeinfer-server" in r.text

    # cluster DNS and Service routing from inside a pod
    probe = (
        "import socket, urllib.request; "
        f"print(socket.gethostbyname('web.{ns}.svc.cluster.local')); "
        "print(urllib.request.urlopen('http://web/bin/', timeout=10).status)"
    )
    out = cluster.kubectl("exec", "-n", ns, "deploy/web", "--", "python3", "-c", probe).stdout.split()
    assert out == [ip, "200"], out

    # the host's requests show up in the container's log
    logs = wait_for(
        "the GET in the pod's log",
        lambda: "GET /bin/" in (s := cluster.kubectl("logs", "-n", ns, "deploy/web").stdout) and s,
        timeout=30,
    )
    assert '"GET /bin/ HTTP/1.1" 200' in logs


def test_claim_binds_a_host_folder_that_the_pod_writes(cluster, node, images, namespace):
    ns = namespace
    manifest = textwrap.dedent(f"""\
        apiVersion: v1
        kind: PersistentVolumeClaim
        metadata: {{name: data, namespace: {ns}}}
        spec:
          accessModes: [ReadWriteMany]
          resources: {{requests: {{storage: 1Gi}}}}
        ---
        apiVersion: v1
        kind: Pod
        metadata: {{name: writer, namespace: {ns}}}
        spec:
          restartPolicy: Never
          securityContext: {{runAsNonRoot: true, runAsUser: 1000}}
          containers:
          - name: w
            image: {images["server"]}
            command: [sh, -c, "echo written-by-pod > /data/hello.txt"]
            volumeMounts: [{{name: data, mountPath: /data}}]
          volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
        """)
    cluster.kubectl("apply", "-f", "-", input=manifest)

    def succeeded():
        p = cluster.kubectl_json("get", "pod", "writer", "-n", ns)
        assert p["status"].get("phase") != "Failed", json.dumps(p["status"])[:2000]
        return p["status"].get("phase") == "Succeeded"

    wait_for("the writer pod to succeed", succeeded, timeout=120, describe=describe_pods(cluster, ns))
    pvc = cluster.kubectl_json("get", "pvc", "data", "-n", ns)
    assert pvc["spec"]["storageClassName"] == node["storage_class"]  # the default class
    pv = cluster.kubectl_json("get", "pv", pvc["spec"]["volumeName"])
    folder = Path(pv["spec"]["hostPath"]["path"])
    assert folder.parent == Path(node["volumes"])
    assert (folder / "hello.txt").read_text() == "written-by-pod\n"
