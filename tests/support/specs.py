"""The sample InferenceServer spec (the one the issue and the README show), shared by unit and e2e tests."""

from __future__ import annotations

import copy
from typing import Any

_SERVER_SPEC: dict[str, Any] = {
    "replicas": 1,
    "image": "registry.example.com/kubeinfer-server:0.1.0",
    "resources": {"limits": {"nvidia.com/gpu": 1}},
    "repository": {"claimName": "kubeinfer-models", "subPath": "gpu-pool"},
    "autoscaling": {
        "minReplicas": 1,
        "maxReplicas": 8,
        "autoscaler": "HPA",
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "nv_inference_queue_duration_us_per_request"},
                    "target": {"type": "AverageValue", "averageValue": "5000"},
                },
            }
        ],
    },
}


def server_spec(**overrides: Any) -> dict[str, Any]:
    """A fresh copy of the sample ``gpu-pool`` spec, top-level keys replaced by ``overrides``."""
    return {**copy.deepcopy(_SERVER_SPEC), **overrides}


def every_option_spec() -> dict[str, Any]:
    """An InferenceServer spec that sets every option a pool's manifests render (scheduling, pull, probes,
    resources, auth with TLS, network policy): e2e/test_helm.py validates what the operator renders from it
    against the cluster's schemas, tests/unit/operator/test_server_types.py round-trips it."""
    return server_spec(
        server={"httpPort": 9000, "logLevel": "debug", "shutdownTimeoutSeconds": 60, "extraArgs": ["--x=1"]},
        nodeSelector={"gpu": "a100"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}]}}},
        imagePullSecrets=[{"name": "regcred"}],
        imagePullPolicy="IfNotPresent",
        podAnnotations={"team": "vision"},
        sharedMemorySize="2Gi",
        probes={"startup": {"failureThreshold": 120}},
        resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 1}},
        auth={
            "tokenSecret": {"name": "tok"},
            "tls": {"certificateSecret": "tls", "clientCASecret": {"name": "ca"}, "operatorCertificateSecret": "op"},
        },
        networkPolicy={"allowFrom": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]},
    )  # fmt: skip
