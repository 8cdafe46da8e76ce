"""InferenceServer → the NetworkPolicy in front of its pods. Pure.

Default deny, then: the HTTP and gRPC ports from pods of the server's own namespace, from the operator's
pods (it reads every replica's repository index) and from whatever ``spec.networkPolicy.allowFrom`` adds
(NetworkPolicyPeers: other namespaces, pods, IP blocks); the metrics port only from the monitoring
namespaces the operator was told (``--monitoring-namespace``, the chart's ``networkPolicy.monitoringNamespaces``).
The kubelet's probes come from the node, which NetworkPolicy always lets through. Whether a policy is
enforced is up to the cluster's network plugin (a plain ``bridge`` CNI enforces none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class PolicyContext:
    """Who besides the server's namespace may call it: the operator (its namespace and pod labels) and the
    monitoring namespaces that scrape metrics."""

    operator_namespace: str | None = None
    operator_labels: Mapping[str, str] = field(default_factory=dict)
    monitoring_namespaces: Sequence[str] = ()


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def enabled(spec: Mapping[str, Any]) -> bool:
    return bool((spec.get("networkPolicy") or {}).get("enabled", True))


def network_policy(
    body: Mapping[str, Any],
    ports: Mapping[str, int],
    selector: Mapping[str, str],
    metadata: Mapping[str, Any],
    context: PolicyContext,
) -> dict[str, Any]:
    spec = body["spec"]
    callers: list[dict[str, Any]] = [{"podSelector": {}}]  # the server's own namespace
    if context.operator_namespace:
        operator: dict[str, Any] = _namespace(context.operator_namespace)
        if context.operator_labels:
            operator["podSelector"] = {"matchLabels": dict(context.operator_labels)}
        callers.append(operator)
    callers += [dict(peer) for peer in (spec.get("networkPolicy") or {}).get("allowFrom") or ()]
    ingress: list[dict[str, Any]] = [
        {
            "from": callers,
            "ports": [{"protocol": "TCP", "port": ports["http"]}, {"protocol": "TCP", "port": ports["grpc"]}],
        }
    ]
    if context.monitoring_namespaces:
        ingress.append(
            {
                "from": [_namespace(ns) for ns in context.monitoring_namespaces],
                "ports": [{"protocol": "TCP", "port": ports["metrics"]}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": dict(metadata),
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
