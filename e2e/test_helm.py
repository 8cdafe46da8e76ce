"""The Helm chart: values schema, kubeconform of every rendered manifest, least-privilege RBAC checked by the
apiserver, and the real operator reconciling under exactly the chart's RBAC and the restricted pod security level."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support import processes
from tests.support.operator_logs import problems, without_terminating_namespaces
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeinfer"
API = "serving.kubeinfer.io/v1alpha1"

#: every optional part of the chart switched on
EVERYTHING = [
    "--set", "replicaCount=2",
    "--set", "repository.create=true",
    "--set", "repository.storageClassName=nfs",
    "--set", "keda.enabled=true",
    "--set", "keda.prometheusAddress=http://prometheus-server.monitoring.svc:9090",
    "--set", "keda.httpAddon.enabled=true",
    "--set", "keda.httpAddon.scalerAddress=keda-add-ons-http-external-scaler.keda:9090",
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "monitoring.podMonitor.labels.release=prometheus",
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "imagePullSecrets[0].name=regcred",
    "--set", "serviceAccount.annotations.team=ml",
    "--set", "podAnnotations.team=ml",
    "--set", "nodeSelector.pool=system",
    "--set", "tolerations[0].key=dedicated",
    "--set", "tolerations[0].operator=Exists",
    "--set", "tolerations[0].effect=NoSchedule",
    "--set", "operator.extraArgs[0]=--log-level=debug",
    "--set", "rbac.secretNamespaces={team-a}",
    "--set", "networkPolicy.monitoringNamespaces={monitoring}",
    "--set", "operator.serverImagePrefixes={registry.example.com/ml/}",
    "--set", "keda.httpAddon.hostDomains.team-a={team-a.example.com}",
    "--set", "keda.httpAddon.interceptor.namespace=keda-http",
    "--set", "networkPolicy.pools.egressCIDRs={203.0.113.0/24}",
    "--set", "operator.defaultAllowedBackends={onnxruntime,python}",
    "--set", "repository.volumeRoot.hostPath=/srv/models",
]  # fmt: skip
NAMESPACED = ["--set", "operator.watchNamespaces={team-a,team-b}"]


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _kinds(docs: list[dict]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def test_lint(helm) -> None:
    for values in ([], EVERYTHING, EVERYTHING + NAMESPACED):
        proc = helm("lint", str(CHART), "--strict", *values)
        assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "replicaCount=0"], "replicaCount"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "operator.watchNamespaces={Team_A}"], "watchNamespaces"),
        (["--set", "keda.prometheusAddress=prometheus:9090"], "prometheusAddress"),
        (["--set", "monitoring.podMonitor.interval=fast"], "interval"),
        (["--set", "resources.limits.memory=lots"], "memory"),
        (["--set", "securityContext.runAsUser=-1"], "runAsUser"),
        (["--set", "operator.logLevel=verbose"], "logLevel"),
        (["--set", "replicaCoutn=2"], "replicaCoutn"),  # a typo is an error, not a silent default
        (["--set", "keda.enable=true"], "enable"),
        (["--set", "keda.httpAddon.scalerAddress=http://scaler"], "scalerAddress"),  # host:port, not a URL
    ],
)
def test_values_schema_refuses_bad_values(helm, values, message) -> None:
    proc = helm("template", "ki", str(CHART), *values, check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr


def test_template_renders_operator_with_leader_election(helm) -> None:
    docs = _docs(helm("template", "ki", str(CHART), "-n", "ops", "--set", "replicaCount=2").stdout)
    assert _kinds(docs) == [
        *["ClusterRole"] * 3, *["ClusterRoleBinding"] * 2, "ConfigMap",  # the Grafana dashboard
        "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
        *["Role"] * 2, *["RoleBinding"] * 2, "ServiceAccount",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",  # the operator's PersistentVolumes
    ]  # fmt: skip
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert "--leader-election" in c["args"] and "--lease-duration=15" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"  # answered by waiting followers too
    # the claim check and the namespaces' claims: PersistentVolumes (cluster-scoped), the operator's own claim
    volumes_role = next(
        d for d in docs if d["metadata"]["name"] == "ki-kubeinfer-volumes" and d["kind"] == "ClusterRole"
    )
    assert volumes_role["rules"] == [
        {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "create", "delete"]}
    ]
    assert "--tenant-claim-name=kubeinfer-repository" in c["args"]
    assert "--operator-pod-labels=app.kubernetes.io/name=kubeinfer-operator,app.kubernetes.io/instance=ki" in c["args"]
    assert dep["spec"]["template"]["metadata"]["labels"] == {
        "app.kubernetes.io/name": "kubeinfer-operator",
        "app.kubernetes.io/instance": "ki",
    }  # what --operator-pod-labels tells the servers' NetworkPolicies
    own = next(d for d in docs if d["metadata"]["name"] == "ki-kubeinfer-own-claim" and d["kind"] == "Role")
    assert own["metadata"]["namespace"] == "ops"
    assert own["rules"][0]["resourceNames"] == ["kubeinfer-models"] and own["rules"][0]["verbs"] == ["get"]
    assert "--repository-root=/var/lib/kubeinfer/models" in c["args"]
    assert "--claim-name=kubeinfer-models" in c["args"]
    assert "--max-artifact-bytes=21474836480" in c["args"]
    assert not any(a.startswith("--prometheus-url") for a in c["args"])
    # the "restricted" pod security standard
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "kubeinfer-models"
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # models outlive the release
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    assert c["image"] == "kubeinfer-operator:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    existing = _docs(helm("template", "ki", str(CHART), "--set", "repository.create=false").stdout)
    assert not any(d["kind"] == "PersistentVolumeClaim" for d in existing)
    refused = helm(
        "template", "ki", str(CHART), "--set", "replicaCount=2", "--set", "leaderElection=false", check=False
    )
    assert refused.returncode != 0 and "needs leaderElection" in refused.stderr


def test_every_option_renders(helm) -> None:
    docs = _docs(helm("template", "ki", str(CHART), "-n", "ops", *EVERYTHING).stdout)
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) >= {"PersistentVolumeClaim", "PodMonitor", "ServiceMonitor", "ClusterRole"}
    args = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--prometheus-url=http://prometheus-server.monitoring.svc:9090" in args
    assert "--monitoring-namespace=monitoring" in args
    assert "--server-image-prefix=registry.example.com/ml/" in args
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "ki-kubeinfer-operator")
    keda_rules = [r for r in role["rules"] if r["apiGroups"] == ["keda.sh"]]
    assert keda_rules == [
        {"apiGroups": ["keda.sh"], "resources": ["scaledobjects"], "verbs": ["get", "create", "patch", "delete"]}
    ]
    http_rules = [r for r in role["rules"] if r["apiGroups"] == ["http.keda.sh"]]
    verbs = ["get", "list", "create", "patch", "delete"]  # list: a host another route holds is a conflict
    assert http_rules == [{"apiGroups": ["http.keda.sh"], "resources": ["interceptorroutes"], "verbs": verbs}]
    assert "--keda-http-scaler-address=keda-add-ons-http-external-scaler.keda:9090" in args
    # issue #37: host domains, the interceptor's pods, pool egress, code backends, the volume policy's root
    for arg in (
        "--route-domains=team-a=team-a.example.com",
        "--interceptor-namespace=keda-http",
        "--interceptor-pod-labels=app.kubernetes.io/component=interceptor,app.kubernetes.io/name=http-add-on",
        "--pool-egress-policy=true",
        "--pool-egress-cidr=203.0.113.0/24",
        "--dns-namespace-labels=kubernetes.io/metadata.name=kube-system",
        "--dns-pod-labels=k8s-app=kube-dns",
        "--default-allowed-backends=onnxruntime,python",
    ):
        assert arg in args, (arg, args)
    policy = by_kind["ValidatingAdmissionPolicy"]
    rules = [v["expression"] for v in policy["spec"]["validations"]]
    assert any("'/srv/models/' + variables.ns" in r for r in rules), rules
    assert by_kind["ValidatingAdmissionPolicyBinding"]["spec"]["policyName"] == policy["metadata"]["name"]
    pm = by_kind["PodMonitor"]
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["podTargetLabels"] == ["serving.kubeinfer.io/server"]
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    namespaced = _docs(helm("template", "ki", str(CHART), "-n", "ops", *EVERYTHING, *NAMESPACED).stdout)
    # cluster scope only for PersistentVolumes (the claim check, the namespaces' volumes) and the Secret reader
    # that only RoleBindings in rbac.secretNamespaces bind
    cluster_roles = {d["metadata"]["name"]: d["rules"] for d in namespaced if d["kind"] == "ClusterRole"}
    assert cluster_roles == {
        "ki-kubeinfer-volumes": [
            {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "create", "delete"]}
        ],
        "ki-kubeinfer-secret-reader": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    cluster_bindings = [d["roleRef"]["name"] for d in namespaced if d["kind"] == "ClusterRoleBinding"]
    assert cluster_bindings == ["ki-kubeinfer-volumes"]
    secret_bindings = [
        (d["metadata"]["namespace"], d["roleRef"]["name"])
        for d in namespaced
        if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"
    ]
    assert secret_bindings == [("team-a", "ki-kubeinfer-secret-reader")]
    roles = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in namespaced if d["kind"] == "Role"}
    assert roles == {("team-a", "ki-kubeinfer-operator"), ("team-b", "ki-kubeinfer-operator"),
                     ("ops", "ki-kubeinfer-leader-election"), ("ops", "ki-kubeinfer-own-claim")}  # fmt: skip
    pm = next(d for d in namespaced if d["kind"] == "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


#: every rule the operator's (Cluster)Role grants in a watched namespace, exactly (keda.enabled=false)
NAMESPACED_RULES = [
    {"apiGroups": ["serving.kubeinfer.io"], "resources": ["inferencemodels", "inferenceservers"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["serving.kubeinfer.io"], "resources": ["inferencemodels/status", "inferenceservers/status"],
     "verbs": ["patch"]},
    {"apiGroups": ["serving.kubeinfer.io"], "resources": ["inferenceservers/finalizers"], "verbs": ["update"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch", "create", "patch"]},
    {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch", "create", "patch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
     "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]  # fmt: skip


@pytest.mark.parametrize("scope", ["cluster-wide", "namespaced"])
def test_rbac_grants_exactly_these_verbs(helm, scope) -> None:
    """Least privilege, rule by rule: no Secret in any namespace's Role, PersistentVolumes only in their own
    ClusterRole, cluster scope beyond that only for kopf's namespace and CRD watches in a cluster-wide install."""
    values = NAMESPACED if scope == "namespaced" else []
    docs = _docs(helm("template", "ki", str(CHART), "-n", "ops", *values).stdout)
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d["rules"] for d in docs
             if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    kopf_cluster = [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    ]
    expected = {
        ("ClusterRole", None, "ki-kubeinfer-volumes"): [
            {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "create", "delete"]}
        ],
        ("ClusterRole", None, "ki-kubeinfer-secret-reader"): [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
        ],
        ("Role", "ops", "ki-kubeinfer-own-claim"): [
            {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "resourceNames": ["kubeinfer-models"],
             "verbs": ["get"]}
        ],
        ("Role", "ops", "ki-kubeinfer-leader-election"): [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
        ],
    }  # fmt: skip
    if scope == "namespaced":
        expected |= {("Role", ns, "ki-kubeinfer-operator"): NAMESPACED_RULES for ns in ("team-a", "team-b")}
    else:
        expected[("ClusterRole", None, "ki-kubeinfer-operator")] = NAMESPACED_RULES + kopf_cluster
    assert roles == expected
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert not [b for b in bindings if b["roleRef"]["name"] == "ki-kubeinfer-secret-reader"]  # nobody opted in


@pytest.mark.parametrize("options", ["defaults", "everything", "everything-namespaced"])
def test_rendered_manifests_validate_with_kubeconform(helm, kubeconform, crd_schemas, options) -> None:
    """Every manifest the chart renders, CRDs included, against the cluster's Kubernetes version (schemas
    generated offline from the pinned k8s.io/kubernetes module's OpenAPI) and the CRDs' schemas."""
    values = {"defaults": [], "everything": EVERYTHING, "everything-namespaced": EVERYTHING + NAMESPACED}[options]
    rendered = helm("template", "ki", str(CHART), "-n", "ops", "--include-crds", *values).stdout
    proc = kubeconform.validate(rendered, crd_schemas)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, json.dumps(report["resources"], indent=1)
    summary = report["summary"]
    assert summary["invalid"] == summary["errors"] == summary["skipped"] == 0
    assert summary["valid"] == len(_docs(rendered))


def test_chart_and_its_package_carry_the_crds(helm, tmp_path) -> None:
    """The chart's crds/ are links to the tree's one copy (crds/): Helm follows them from the chart folder, and
    ``helm package`` writes the files themselves into the .tgz, so an install from either gets the CRDs."""
    names = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert names and all((CHART / "crds" / name).is_symlink() for name in names)
    want = {name: (ROOT / "crds" / name).read_text() for name in names}
    helm("package", str(CHART), "-d", str(tmp_path))
    (package,) = tmp_path.glob("kubeinfer-*.tgz")
    with tarfile.open(package) as tgz:
        members = {m.name: m for m in tgz.getmembers() if m.name.startswith("kubeinfer/crds/")}
        assert sorted(members) == [f"kubeinfer/crds/{name}" for name in names]
        for name in names:
            member = members[f"kubeinfer/crds/{name}"]
            assert member.isfile(), f"{member.name} is packaged as a link, not as the file"
            reader = tgz.extractfile(member)
            assert reader is not None
            assert reader.read().decode() == want[name]
    # what ``helm install`` creates: the chart's CRD files, which ``helm show crds`` prints one after the other in
    # file-name order, each followed by a newline (no document separator: not a YAML stream to parse)
    expected = "".join(want[name] + "\n" for name in names)
    for chart in (CHART, package):
        assert helm("show", "crds", str(chart)).stdout == expected, chart


def test_kubeconform_catches_what_it_should(kubeconform, crd_schemas) -> None:
    """The validation can fail: a typo'd field, a wrong type, a bad InferenceServer are all reported."""
    bad = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
         "spec": {"replicas": "two", "selector": {}, "template": {}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}, "automountToken": True},
        {"apiVersion": API, "kind": "InferenceServer", "metadata": {"name": "x"},
         "spec": {"image": "i", "repository": {"claimName": "c"}, "autoscaling": {"minReplicas": 1}}},
        {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
         "spec": {"podMetricsEndpoints": [{"port": 8002}]}},
    ]  # fmt: skip
    proc = kubeconform.validate("\n---\n".join(json.dumps(d) for d in bad), crd_schemas)
    report = json.loads(proc.stdout)
    assert proc.returncode != 0
    assert report["summary"]["invalid"] == len(bad), json.dumps(report["resources"], indent=1)


# ------------------------------------------------------------------------------------- in the cluster

#: (verb, resource) the operator must be able to do in a watched namespace
NEEDED = [
    ("watch", "inferencemodels.serving.kubeinfer.io"),
    ("patch", "inferencemodels.serving.kubeinfer.io"),  # finalizers
    ("patch", "inferencemodels.serving.kubeinfer.io/status"),
    ("patch", "inferenceservers.serving.kubeinfer.io/status"),
    ("update", "inferenceservers.serving.kubeinfer.io/finalizers"),
    ("create", "deployments.apps"),
    ("patch", "deployments.apps"),
    ("watch", "deployments.apps"),
    ("list", "replicasets.apps"),  # only the pods a pool's ReplicaSets control are its replicas
    ("patch", "services"),
    ("delete", "horizontalpodautoscalers.autoscaling"),
    ("get", "secrets"),  # rbac.secretNamespaces names the team's namespace here
    ("create", "events"),
    ("create", "persistentvolumeclaims"),  # the namespace's claim on its folder
    ("create", "persistentvolumes"),
    ("patch", "networkpolicies.networking.k8s.io"),
    ("list", "endpointslices.discovery.k8s.io"),  # status from every server replica
    ("watch", "endpointslices.discovery.k8s.io"),
    ("get", "persistentvolumeclaims"),  # the claim check
    ("get", "persistentvolumes"),
]
#: what it must not be able to do anywhere
FORBIDDEN = [
    ("list", "secrets"),
    ("watch", "secrets"),
    ("delete", "deployments.apps"),
    ("update", "deployments.apps"),
    ("delete", "services"),
    ("delete", "inferenceservers.serving.kubeinfer.io"),
    ("create", "pods"),
    ("create", "scaledobjects.keda.sh"),  # keda.enabled=false
    ("create", "interceptorroutes.http.keda.sh"),  # keda.httpAddon.enabled=false
]


def _can(kubectl, sa: str, verb: str, resource: str, *where: str) -> bool:
    """``kubectl auth can-i``; ``resource/sub`` means a subresource (can-i would read it as a resource name)."""
    resource, _, sub = resource.partition("/")
    subresource = [f"--subresource={sub}"] if sub else []
    proc = kubectl("auth", "can-i", verb, resource, *subresource, *where, "--as", sa, check=False)
    return proc.stdout.strip() == "yes"


def _namespace(kubectl, name: str, restricted: bool = False) -> None:
    kubectl("create", "namespace", name)
    if restricted:
        kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


def _pods(kubectl, ns: str, selector: str) -> list[dict]:
    return json.loads(kubectl("-n", ns, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]


def _token_kubeconfig(cluster, kubectl, ns: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's service account (a TokenRequest token)."""
    token = kubectl("-n", ns, "create", "token", sa, "--duration=1h").stdout.strip()
    ca = Path(cluster.run_dir) / "pki" / "ca.crt"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": cluster.server, "certificate-authority": str(ca)}}],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    return path


@pytest.mark.parametrize("scope", ["namespaced", "cluster-wide"])
def test_operator_reconciles_under_the_charts_rbac(cluster, helm, kubectl, tmp_path, scope) -> None:
    """Install the chart, then run the real operator with the chart's service account token: an InferenceServer
    (with an HPA) becomes a Deployment, Service and HPA, status is written, and the apiserver refused nothing.
    Both namespaces enforce the "restricted" pod security standard, so the operator's pod and the server pods
    the operator renders are admitted only if they meet it."""
    suffix = uuid.uuid4().hex[:6]
    ops, team, other = f"e2e-ops-{suffix}", f"e2e-team-{suffix}", f"e2e-other-{suffix}"
    release = f"ki{suffix}"
    sa = f"{release}-kubeinfer-operator"
    user = f"system:serviceaccount:{ops}:{sa}"
    for ns in (ops, team, other):
        _namespace(kubectl, ns, restricted=True)
    # this tree's CRDs (helm leaves CRDs that exist alone, and the shared cluster may hold older ones)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    values = ["--set", f"rbac.secretNamespaces={{{team}}}"]
    values += ["--set", f"operator.watchNamespaces={{{team}}}"] if scope == "namespaced" else []
    proc = None
    try:
        # a volume for the chart's claim, so the claim check runs to the end under the chart's RBAC
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{release}-models"},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "nfs": {"server": "nfs.example.internal", "path": f"/exports/{release}"},
                "claimRef": {"namespace": ops, "name": "kubeinfer-models"},
            },
        }
        kubectl("apply", "-f", "-", input=json.dumps(pv))
        helm("install", release, str(CHART), "-n", ops, "--set", "repository.create=true", *values)
        # RBAC as the apiserver sees it
        for verb, resource in NEEDED:
            assert _can(kubectl, user, verb, resource, "-n", team), f"operator cannot {verb} {resource}"
        for verb, resource in FORBIDDEN:
            assert not _can(kubectl, user, verb, resource, "-n", team), f"operator may {verb} {resource}"
        # no Secret anywhere but where a namespace opted in
        assert not _can(kubectl, user, "get", "secrets", "-n", other)
        assert not _can(kubectl, user, "get", "secrets", "-n", ops)
        assert _can(kubectl, user, "update", "leases.coordination.k8s.io", "-n", ops)
        assert not _can(kubectl, user, "update", "leases.coordination.k8s.io", "-n", team)
        if scope == "namespaced":
            assert not _can(kubectl, user, "watch", "inferenceservers.serving.kubeinfer.io", "-n", other)
            assert not _can(kubectl, user, "list", "namespaces")
            bindings = json.loads(kubectl("get", "clusterrolebinding", "-o", "json").stdout)["items"]
            bound = [
                b["roleRef"]["name"] for b in bindings if any(s.get("name") == sa for s in b.get("subjects") or ())
            ]
            assert bound == [f"{release}-kubeinfer-volumes"], "a namespaced install binds only the PV role"
        else:
            assert _can(kubectl, user, "watch", "inferenceservers.serving.kubeinfer.io", "--all-namespaces")
        # the operator's pod was admitted in a "restricted" namespace (pod security rejects at pod creation)
        wait_for("the operator's pod", lambda: _pods(kubectl, ops, f"app.kubernetes.io/instance={release}"), 90)

        kc = _token_kubeconfig(cluster, kubectl, ops, sa, tmp_path / "sa.kubeconfig")
        root = tmp_path / "volume"
        root.mkdir()
        log_path = tmp_path / "operator.log"
        ns_args = ["--namespace", team] if scope == "namespaced" else []
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kubeinfer.operator", "--kubeconfig", str(kc), "--repository-root", str(root),
                 "--resync-seconds", "3", "--claim-name", "kubeinfer-models", "--claim-namespace", ops, *ns_args],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "KUBECONFIG": str(kc)},
            )  # fmt: skip
        server = {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": "pool", "namespace": team},
            "spec": {
                "image": "kubeinfer-server:test",
                "resources": {"requests": {"cpu": "100m"}},
                "autoscaling": {"autoscaler": "HPA", "maxReplicas": 3, "target": {"metric": "CPU", "value": 60}},
            },
        }
        kubectl("apply", "-f", "-", input=json.dumps(server))

        def status():
            obj = json.loads(kubectl("-n", team, "get", "inferenceserver", "pool", "-o", "json").stdout)
            st = obj.get("status") or {}
            return st if st.get("autoscaling", {}).get("autoscaler") == "HPA" and st.get("replicas") == 1 else None

        st = wait_for(
            "InferenceServer status from the operator",
            status,
            90,
            0.5,
            describe=lambda: (
                kubectl("-n", team, "get", "inferenceserver", "pool", "-o", "yaml").stdout
                + log_path.read_text()[-5000:]
            ),
        )
        assert st["endpoint"] == f"pool.{team}.svc:8000"

        # the operator read its own claim and volume, then made the team's volume and claim (on
        # /exports/<release>/<team>) under the chart's RBAC, and the controller manager bound them
        def repository_condition():
            obj = json.loads(kubectl("-n", team, "get", "inferenceserver", "pool", "-o", "json").stdout)
            conds = (obj.get("status") or {}).get("conditions") or []
            c = next((c for c in conds if c["type"] == "RepositoryReady"), {})
            return c if c.get("status") == "True" else None

        repo = wait_for("the namespace's claim", repository_condition, 90, 1)
        assert "pods mount claim 'kubeinfer-repository'" in repo["message"]
        claim = wait_for(
            "the namespace's claim Bound",
            lambda: (
                (c := json.loads(kubectl("-n", team, "get", "pvc", "kubeinfer-repository", "-o", "json").stdout))
                .get("status", {})
                .get("phase")
                == "Bound"
                and c
            ),
            60,
            0.5,
        )
        volume = json.loads(kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json").stdout)
        assert volume["spec"]["nfs"]["path"] == f"/exports/{release}/{team}"
        kubectl("-n", team, "get", "deployment/pool", "service/pool", "hpa/pool", "networkpolicy/pool")
        # the server pod passed the restricted pod security admission
        assert len(_pods(kubectl, team, "app.kubernetes.io/instance=pool")) == 1
        # switching autoscaling off deletes the HPA (the one delete the operator does here)
        kubectl("-n", team, "patch", "inferenceserver", "pool", "--type=json",
                "-p", '[{"op": "remove", "path": "/spec/autoscaling"}]')  # fmt: skip
        wait_for("HPA deleted", lambda: kubectl("-n", team, "get", "hpa", "pool", check=False).returncode != 0, 60, 0.5)
        # a cluster-wide operator also sees other tests' namespaces, some of them being deleted
        text = without_terminating_namespaces(log_path.read_text())
        assert "Forbidden" not in text and "forbidden" not in text, text[-5000:]
        found = problems(text, ("ERROR", "WARNING"))
        assert not found, "\n".join(found[-20:])
        assert proc.poll() is None, text[-5000:]
    finally:
        if proc is not None:
            processes.stop(proc)
        helm("uninstall", release, "-n", ops, check=False)
        for ns in (ops, team, other):
            kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kubectl("delete", "pv", f"{release}-models", "--wait=false", check=False)
        kubectl("delete", "pv", "-l", f"serving.kubeinfer.io/tenant-namespace={team}", "--wait=false", check=False)


def test_install_into_the_cluster(cluster, helm, kubectl) -> None:
    ns = f"e2e-helm-{uuid.uuid4().hex[:6]}"
    watched = [f"{ns}-a", f"{ns}-b"]  # a namespaced install puts a Role in each: they must exist
    release = "ki"
    try:
        for w in watched:
            _namespace(kubectl, w)
        helm(
            "install",
            release,
            str(CHART),
            "-n",
            ns,
            "--create-namespace",
            "--set",
            f"operator.watchNamespaces={{{','.join(watched)}}}",
        )
        for crd in ("inferencemodels", "inferenceservers"):
            kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
        dep = json.loads(kubectl("-n", ns, "get", "deployment", f"{release}-kubeinfer-operator", "-o", "json").stdout)
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--namespace=")] == [f"--namespace={w}" for w in watched]
        explained = kubectl("explain", "inferencemodel.spec.dynamicBatching").stdout
        assert "maxQueueDelayMicroseconds" in explained and "priorityQueuePolicy" in explained
        explained = kubectl("explain", "inferenceserver.spec.autoscaling.target").stdout
        assert "QueueDurationPerRequest" in explained
        status = json.loads(helm("status", release, "-n", ns, "-o", "json").stdout)
        assert status["info"]["status"] == "deployed"
        assert "kubectl explain inferenceserver.spec" in status["info"]["notes"]
        helm("uninstall", release, "-n", ns)
        gone = kubectl("-n", ns, "get", "deployment", f"{release}-kubeinfer-operator", check=False)
        assert gone.returncode != 0
    finally:
        helm("uninstall", release, "-n", ns, check=False)
        for n in (ns, *watched):
            kubectl("delete", "namespace", n, "--wait=false", check=False)


def test_operator_rendered_objects_validate_with_kubeconform(kubeconform) -> None:
    """What the operator applies (Deployment, Service, HPA, KEDA ScaledObject, NetworkPolicy) for a spec with
    every option (auth and TLS mounted included),
    against the cluster version's schemas and KEDA's CRD: a field typo in the operator fails here, not in a
    user's cluster."""
    from kubeinfer.operator.api.server_types import InferenceServerSpec
    from kubeinfer.operator.servers import manifests, network_policy
    from kubeinfer.operator.traffic import autoscaling

    from tests.support.specs import every_option_spec

    spec = every_option_spec()
    body = {"apiVersion": API, "kind": "InferenceServer", "spec": spec,
            "metadata": {"name": "gpu-pool", "namespace": "ml", "uid": "0e6a3b1c-uid", "generation": 1}}  # fmt: skip
    context = network_policy.PolicyContext("ops", {"app.kubernetes.io/name": "kubeinfer-operator"}, ["monitoring"])
    policy = network_policy.network_policy(
        InferenceServerSpec.from_body(body),
        manifests.ports(spec),
        manifests.selector_labels("gpu-pool"),
        manifests.metadata(body),
        context,
    )
    objects = [
        manifests.deployment(body, "kubeinfer-repository"),
        manifests.service(body),
        autoscaling.hpa(body),
        policy,
    ]
    for target in ({"metric": "QueueDurationPerRequest"}, {"metric": "CPU", "value": 70}, {"metric": "GPU"}):
        spec["autoscaling"] = {
            "maxReplicas": 4,
            "target": target,
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}},
        }
        objects.append(autoscaling.scaled_object(body, "http://prometheus.monitoring.svc:9090"))
        objects.append(
            autoscaling.hpa({**body, "spec": {**spec, "autoscaling": {**spec["autoscaling"], "autoscaler": "HPA"}}})
        )
    proc = kubeconform.validate("\n---\n".join(json.dumps(o) for o in objects))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, json.dumps(report["resources"], indent=1)
    assert report["summary"]["valid"] == len(objects)
