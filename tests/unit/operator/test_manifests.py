"""InferenceServer spec → Deployment and Service (autoscaling objects: test_autoscaling.py)."""

from __future__ import annotations

from kubeinfer.operator import manifests


def _container(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_deployment_from_issue_example(server_body):
    dep = manifests.deployment(server_body)
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
        "subPath": "ml/gpu-pool",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-repository"]["persistentVolumeClaim"]["claimName"] == "kubeinfer-models"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
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
    dep = manifests.deployment(server_body)
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
    """Tenant isolation: repository.subPath is relative to <volume>/<namespace>/, default the server's name."""
    server_body["spec"]["repository"]["subPath"] = "team/pool"
    mount = _container(manifests.deployment(server_body))["volumeMounts"][0]
    assert mount["subPath"] == "ml/team/pool"
    del server_body["spec"]["repository"]["subPath"]
    mount = _container(manifests.deployment(server_body))["volumeMounts"][0]
    assert mount["subPath"] == "ml/gpu-pool"


def test_service_ports_are_named(server_body):
    svc = manifests.service(server_body)
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, "http"),
        ("grpc", 8001, "grpc"),
        ("metrics", 8002, "metrics"),
    ]
    assert svc["spec"]["selector"] == manifests.selector_labels("gpu-pool")


def test_no_prestop_drain_means_no_grpc_connection_age(server_body):
    server_body["spec"]["drainSeconds"] = 0
    c = _container(manifests.deployment(server_body))
    assert not [a for a in c["args"] if a.startswith("--grpc-max-connection-age")]
    assert "lifecycle" not in c or c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "0"]
