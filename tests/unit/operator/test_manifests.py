"""InferenceServer spec → Deployment and Service (autoscaling objects: test_autoscaling.py)."""

from __future__ import annotations

import re

import pytest
from kubeinfer.operator.api import server_spec
from kubeinfer.operator.api.server_types import InferenceServerSpec
from kubeinfer.operator.servers import manifests, network_policy


def _container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_deployment_from_issue_example(server_body):
    dep = manifests.deployment(server_body, "kubeinfer-repository")
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep)
    assert dep["metadata"]["ownerReferences"][0] == {
        "apiVersion": "serving.kubeinfer.io/v1alpha1",
        "kind": "InferenceServer",
        "name": "gpu-pool",
        "uid": "1234-uid",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert c["image"] == "registry.example.com/kubeinfer-server:0.1.0"
    assert "--model-control-mode=poll" in c["args"]
    assert "--model-repository=/models" in c["args"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    repo_mount = next(m for m in c["volumeMounts"] if m["name"] == "model-repository")
    assert repo_mount == {
        "name": "model-repository",
        "mountPath": "/models",
        "subPath": "gpu-pool",  # the claim reaches only <volume>/ml/
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-repository"]["persistentVolumeClaim"] == {
        "claimName": "kubeinfer-repository",
        "readOnly": True,
    }
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http", "scheme": "HTTP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http", "scheme": "HTTP"}
    assert not [a for a in c["args"] if "auth" in a or "tls" in a or "ssl" in a]
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    # the kubelet waits for the preStop drain, then the server's whole --shutdown-timeout, then a margin
    assert "--shutdown-timeout=30" in c["args"]
    assert "--connection-drain-seconds=3" in c["args"]  # keep-alive clients move before the drain
    # gRPC channels pinned to a pod that left the endpoints reconnect elsewhere during the preStop drain
    assert "--grpc-max-connection-age=5000" in c["args"]
    assert pod["terminationGracePeriodSeconds"] == 10 + 3 + 30 + 5
    # Prometheus finds the pods by the conventional annotations
    assert dep["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8002",
        "prometheus.io/path": "/metrics",
    }


def test_server_flags_ports_and_scheduling(server_body):
    spec = server_body["spec"]
    spec["server"] = {
        "httpPort": 9000,
        "metricsPort": 9100,
        "pollIntervalSeconds": 2,
        "logLevel": "debug",
        "shutdownTimeoutSeconds": 120,
        "extraArgs": ["--x=1"],
    }
    spec["drainSeconds"] = 3
    spec["podAnnotations"] = {"prometheus.io/scrape": "false", "team": "vision"}
    spec["nodeSelector"] = {"gpu": "a100"}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    spec["sharedMemorySize"] = "2Gi"
    spec["probes"] = {"startup": {"failureThreshold": 120}}
    dep = manifests.deployment(server_body, "kubeinfer-repository")
    c = _container(dep)
    assert c["args"][1:] == [
        "--http-port=9000",
        "--grpc-port=8001",
        "--metrics-port=9100",
        "--model-control-mode=poll",
        "--repository-poll-secs=2",
        "--shutdown-timeout=120",
        "--connection-drain-seconds=3",
        "--grpc-max-connection-age=1000",
        "--log-level=debug",
        "--allow-external-op-libraries=false",  # a pool's default (issue #37)
        "--x=1",
    ]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 3 + 3 + 120 + 5
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9100"
    assert annotations["prometheus.io/scrape"] == "false"  # the user's annotations win
    assert annotations["team"] == "vision"
    assert c["ports"][0] == {"name": "http", "containerPort": 9000, "protocol": "TCP"}
    assert c["startupProbe"]["failureThreshold"] == 120
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["sizeLimit"] == "2Gi"


def test_subpath_is_inside_the_namespace_folder(server_body):
    """Tenant isolation: repository.subPath is relative to <volume>/<namespace>/ (what the pods' claim reaches),
    default the server's name; the operator writes to <volume>/<namespace>/<subPath>."""
    server_body["spec"]["repository"]["subPath"] = "team/pool"
    mount = _container(manifests.deployment(server_body, "kubeinfer-repository"))["volumeMounts"][0]
    assert mount["subPath"] == "team/pool"
    assert manifests.repository_subpath("ml", "gpu-pool", server_body["spec"]) == "ml/team/pool"
    del server_body["spec"]["repository"]["subPath"]
    mount = _container(manifests.deployment(server_body, "kubeinfer-repository"))["volumeMounts"][0]
    assert mount["subPath"] == "gpu-pool"
    assert manifests.repository_subpath("ml", "gpu-pool", server_body["spec"]) == "ml/gpu-pool"


def test_service_ports_are_named(server_body):
    svc = manifests.service(server_body)
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, "http"),
        ("grpc", 8001, "grpc"),
        ("metrics", 8002, "metrics"),
    ]
    assert svc["spec"]["selector"] == {**manifests.selector_labels("gpu-pool"), manifests.POOL_UID_LABEL: "1234-uid"}


def test_the_pods_carry_the_pools_uid_and_the_service_selects_on_it_once_all_do(server_body):
    """A tenant can put the pool's name labels on a pod of its own; the pool's uid label too only by reading it
    off the pool. The Deployment's selector (immutable) stays the name labels, so pools made before the uid label
    update in place; its pods get the uid label; the Service selects on it when told every pod has it."""
    dep = manifests.deployment(server_body, "kubeinfer-repository")
    assert dep["spec"]["selector"] == {"matchLabels": manifests.selector_labels("gpu-pool")}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels[manifests.POOL_UID_LABEL] == "1234-uid"
    assert manifests.selector_labels("gpu-pool").items() <= labels.items()
    assert manifests.POOL_UID_LABEL not in dep["metadata"]["labels"]  # the pods', not the owned objects'
    by_uid = manifests.service(server_body)["spec"]["selector"]
    assert by_uid == {**manifests.selector_labels("gpu-pool"), manifests.POOL_UID_LABEL: "1234-uid"}
    assert by_uid.items() <= labels.items()  # the Service selects the Deployment's pods
    by_name = manifests.service(server_body, by_uid=False)["spec"]["selector"]
    assert by_name == manifests.selector_labels("gpu-pool")


def test_no_prestop_drain_means_no_grpc_connection_age(server_body):
    server_body["spec"]["drainSeconds"] = 0
    c = _container(manifests.deployment(server_body, "kubeinfer-repository"))
    assert not [a for a in c["args"] if a.startswith("--grpc-max-connection-age")]
    assert "lifecycle" not in c or c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "0"]


def test_auth_mounts_the_secrets_and_turns_the_flags_on(server_body):
    server_body["spec"]["auth"] = {
        "tokenSecret": {"name": "pool-token", "key": "bearer"},
        "tls": {"certificateSecret": "pool-tls"},
    }
    dep = manifests.deployment(server_body, "c")
    c, pod = _container(dep), dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["auth-token"]["secret"] == {
        "secretName": "pool-token",
        "defaultMode": 0o440,
        "items": [{"key": "bearer", "path": "token"}],
    }
    assert volumes["tls"]["secret"]["secretName"] == "pool-tls"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["auth-token"] == {"name": "auth-token", "mountPath": "/var/run/kubeinfer/auth", "readOnly": True}
    assert "--auth-token-file=/var/run/kubeinfer/auth/token" in c["args"]
    tls = "/var/run/kubeinfer/tls"
    for flag in (f"--http-tls-cert={tls}/tls.crt", f"--http-tls-key={tls}/tls.key", "--grpc-use-ssl=true",
                 f"--grpc-server-cert={tls}/tls.crt", f"--grpc-server-key={tls}/tls.key"):  # fmt: skip
        assert flag in c["args"]
    assert not [a for a in c["args"] if "client-ca" in a or "mutual" in a]
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http", "scheme": "HTTPS"}


def test_client_certificates_move_the_probes_to_the_plain_metrics_port(server_body):
    server_body["spec"]["auth"] = {
        "tls": {"certificateSecret": "t", "clientCASecret": {"name": "ca"}, "operatorCertificateSecret": "op"}
    }
    c = _container(manifests.deployment(server_body, "c"))
    ca = "/var/run/kubeinfer/client-ca/ca.crt"
    assert {f"--http-tls-client-ca={ca}", "--grpc-use-ssl-mutual=true", f"--grpc-root-cert={ca}"} <= set(c["args"])
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics" and c[probe]["httpGet"]["scheme"] == "HTTP"


def test_extra_args_may_not_set_what_the_operator_sets(server_body):
    server_body["spec"]["server"] = {
        "extraArgs": ["--model-repository=/", "--auth-token-file", "/dev/null", "--log-verbose=1", "--http-port=1"]
    }
    assert manifests.reserved_extra_args(InferenceServerSpec.from_body(server_body)) == [
        "--model-repository=/",
        "--auth-token-file",
        "--http-port=1",
    ]
    pattern = re.compile(server_spec.RESERVED_FLAG_PATTERN)  # the CRD's CEL rule uses the same expression
    assert pattern.match("--grpc-use-ssl=false") and pattern.match("--allowed-backends")
    assert not pattern.match("--grpc-use-ssl-mutualx") and not pattern.match("--model-repository-extra")
    assert not pattern.match("--log-verbose=1")


def test_pool_policies_become_server_flags(server_body):
    server_body["spec"]["allowedBackends"] = ["onnxruntime", "tensorrt"]
    server_body["spec"]["allowExternalOpLibraries"] = False
    args = _container(manifests.deployment(server_body, "c"))["args"]
    assert "--allowed-backends=onnxruntime,tensorrt" in args
    assert "--allow-external-op-libraries=false" in args


def test_pools_refuse_external_op_libraries_unless_they_allow_them(server_body):
    """Issue #37 item 10: a pool's servers load op libraries only from the model's folder by default."""
    server_body["spec"].pop("allowExternalOpLibraries", None)
    assert "--allow-external-op-libraries=false" in _container(manifests.deployment(server_body, "c"))["args"]
    server_body["spec"]["allowExternalOpLibraries"] = True
    assert not any(
        a.startswith("--allow-external-op-libraries")
        for a in _container(manifests.deployment(server_body, "c"))["args"]
    )


def test_network_policy(server_body):
    context = network_policy.PolicyContext("kubeinfer-system", {"app.kubernetes.io/name": "op"}, ("monitoring",))
    server_body["spec"]["networkPolicy"] = {"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}
    policy = network_policy.network_policy(
        InferenceServerSpec.from_body(server_body),
        manifests.ports(server_body["spec"]),
        manifests.selector_labels("gpu-pool"),
        manifests.metadata(server_body),
        context,
    )
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": manifests.selector_labels("gpu-pool")}
    assert spec["policyTypes"] == ["Ingress", "Egress"]  # egress closed too (issue #37 item 7)
    serving, metrics = spec["ingress"]
    assert serving["from"] == [
        {"podSelector": {}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kubeinfer-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "op"}},
        },
        {"namespaceSelector": {"matchLabels": {"team": "a"}}},
    ]
    assert [p["port"] for p in serving["ports"]] == [8000, 8001]
    assert metrics == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 8002}],
    }
    no_monitoring = network_policy.network_policy(
        InferenceServerSpec.from_body(server_body),
        manifests.ports(server_body["spec"]),
        {},
        {},
        network_policy.PolicyContext(),
    )
    assert len(no_monitoring["spec"]["ingress"]) == 1  # metrics: nobody but the node's probes
    assert network_policy.enabled(InferenceServerSpec.from_body(server_body))
    server_body["spec"]["networkPolicy"]["enabled"] = False
    assert not network_policy.enabled(InferenceServerSpec.from_body(server_body))


def test_a_pool_at_zero_lets_in_the_interceptors_pods_only(server_body):
    """Issue #37 item 5: a pool that scales to zero admits the interceptor's pods (its namespace and labels),
    not every pod of the interceptor's namespace; a pool that does not scale to zero admits neither."""
    context = network_policy.PolicyContext(interceptor_namespace="keda-http", interceptor_labels={"c": "interceptor"})
    ports = manifests.ports(server_body["spec"])

    def callers() -> list:
        return network_policy.network_policy(InferenceServerSpec.from_body(server_body), ports, {}, {}, context)[
            "spec"
        ]["ingress"][0]["from"]

    assert callers() == [{"podSelector": {}}]
    server_body["spec"]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 2}
    assert callers() == [
        {"podSelector": {}},
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda-http"}},
            "podSelector": {"matchLabels": {"c": "interceptor"}},
        },
    ]


def test_pool_pods_reach_dns_and_the_admins_networks_only(server_body):
    """Issue #37 item 7: the pool's policy closes egress: DNS, then --pool-egress-cidr, nothing else (the cloud
    metadata endpoint, the API server, other pods); --pool-egress-policy=false leaves egress open."""
    ports = manifests.ports(server_body["spec"])
    context = network_policy.PolicyContext(egress_cidrs=("203.0.113.0/24",))
    spec = network_policy.network_policy(InferenceServerSpec.from_body(server_body), ports, {}, {}, context)["spec"]
    assert spec["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]},
    ]
    open_egress = network_policy.network_policy(
        InferenceServerSpec.from_body(server_body), ports, {}, {}, network_policy.PolicyContext(egress=False)
    )
    assert open_egress["spec"]["policyTypes"] == ["Ingress"] and "egress" not in open_egress["spec"]


def test_pool_pods_get_no_service_account_token(server_body):
    """Issue #37 item 7: no API credentials in a pool's pods for a model's code to read."""
    pod = manifests.deployment(server_body, "c")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_pools_without_allowed_backends_get_the_operators_default(server_body):
    """Issue #37 item 7: code backends are a pool's explicit opt-in where the admin set a default."""
    from kubeinfer.operator.api.pool_defaults import parse_backends, pool_body

    default = parse_backends("onnxruntime,tensorrt")
    args = _container(manifests.deployment(pool_body(server_body, default), "c"))["args"]
    assert "--allowed-backends=onnxruntime,tensorrt" in args
    server_body["spec"]["allowedBackends"] = ["onnxruntime", "python"]  # the pool's own list wins
    args = _container(manifests.deployment(pool_body(server_body, default), "c"))["args"]
    assert "--allowed-backends=onnxruntime,python" in args
    server_body["spec"].pop("allowedBackends")
    args = _container(manifests.deployment(pool_body(server_body, None), "c"))["args"]
    assert not any(a.startswith("--allowed-backends") for a in args)  # no default: every backend
    with pytest.raises(ValueError, match="unknown backend"):
        parse_backends("onnxruntime,shell")
