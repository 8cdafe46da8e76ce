"""InferenceServer → the NetworkPolicy in front of its pods. Pure.

Default deny, then: the HTTP and gRPC ports from pods of the server's own namespace, from the operator's
pods (it reads every replica's repository index) and from whatever ``spec.networkPolicy.allowFrom`` adds
(NetworkPolicyPeers: other namespaces, pods, IP blocks); the metrics port only from the monitoring
namespaces the operator was told (``--monitoring-namespace``, the chart's ``networkPolicy.monitoringNamespaces``).
A pool that scales to zero (``autoscaling.minReplicas: 0``) also lets in the pods of KEDA's HTTP add-on
interceptor (``--interceptor-namespace`` and ``--interceptor-pod-labels``, the chart's
``keda.httpAddon.interceptor``) -- those pods only, not their namespace: whoever reaches the interceptor
still needs the pool's token, which such a pool must have (the CRD's rule).
The kubelet's probes come from the node, which NetworkPolicy always lets through.

Egress is closed too (``--pool-egress-policy``, on by default): a pool's pods may reach DNS
(``--dns-namespace-labels``/``--dns-pod-labels``) and the networks the admin names (``--pool-egress-cidr``),
nothing else -- not the cloud metadata endpoint, not the API server, not other pods. A Python, TorchScript
or SavedModel model runs its author's code inside the pod; this is what keeps that code from calling out.
Whether a policy is enforced is up to the cluster's network plugin (a plain ``bridge`` CNI enforces none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.server_types import InferenceServerSpec

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class PolicyContext:
    """Who besides the server's namespace may call it: the operator (its namespace and pod labels) and the
    monitoring namespaces that scrape metrics."""

    operator_namespace: str | None = None
    operator_labels: Mapping[str, str] = field(default_factory=dict)
    monitoring_namespaces: Sequence[str] = ()
    #: whether the policy closes egress too, and what it then lets out: DNS and the admin's networks
    egress: bool = True
    dns_namespace_labels: Mapping[str, str] = field(default_factory=lambda: {NAMESPACE_NAME_LABEL: "kube-system"})
    dns_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    egress_cidrs: Sequence[str] = ()
    #: KEDA's HTTP add-on interceptor, which forwards requests to pools that scale to zero
    interceptor_namespace: str = "keda"
    interceptor_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "http-add-on", "app.kubernetes.io/component": "interceptor"}
    )


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def enabled(spec: InferenceServerSpec) -> bool:
    return spec.network_policy.enabled


def network_policy(
    spec: InferenceServerSpec,
    ports: Mapping[str, int],
    selector: Mapping[str, str],
    metadata: Mapping[str, Any],
    context: PolicyContext,
) -> dict[str, Any]:
    callers: list[dict[str, Any]] = [{"podSelector": {}}]  # the server's own namespace
    if context.operator_namespace:
        operator: dict[str, Any] = _namespace(context.operator_namespace)
        if context.operator_labels:
            operator["podSelector"] = {"matchLabels": dict(context.operator_labels)}
        callers.append(operator)
    if spec.autoscaling is not None and spec.autoscaling.min_replicas == 0:
        interceptor = _namespace(context.interceptor_namespace)
        interceptor["podSelector"] = {"matchLabels": dict(context.interceptor_labels)}
        callers.append(interceptor)
    callers += [dict(peer) for peer in spec.network_policy.allow_from or ()]
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
    policy: dict[str, Any] = {
        "podSelector": {"matchLabels": dict(selector)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    if context.egress:
        policy["policyTypes"] = ["Ingress", "Egress"]
        policy["egress"] = egress_rules(context)
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": dict(metadata), "spec": policy}


def egress_rules(context: PolicyContext) -> list[dict[str, Any]]:
    """DNS (UDP and TCP 53 to the cluster's DNS pods), then each network the admin opened, any port."""
    rules: list[dict[str, Any]] = [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": dict(context.dns_namespace_labels)},
                    "podSelector": {"matchLabels": dict(context.dns_pod_labels)},
                }
            ],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
    ]
    if context.egress_cidrs:
        rules.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in context.egress_cidrs]})
    return rules
