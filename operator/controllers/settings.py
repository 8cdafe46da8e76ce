"""The operator's settings (``OperatorConfig``): what its command line (``cli.py``) decides, in one object the
reconciles read, so tests and benchmarks build an operator without parsing flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kubeinfer.server.sources.egress import HostRules, IPNetwork

from ..servers import network_policy
from ..sources.artifacts import DEFAULT_MAX_BYTES
from ..sources.fetch import DEFAULT_DEADLINE
from ..sources.onnx_check import DEFAULT_CHECK_TIMEOUT
from ..traffic.autoscaling import DEFAULT_SCALER_ADDRESS
from ..traffic.route_hosts import RouteDomains
from ..volume.tenant_volumes import DEFAULT_CLAIM


@dataclass
class OperatorConfig:
    repository_root: Path
    resync_seconds: float = 30.0
    #: "namespace/server" → base URL of that server's HTTP endpoint (replaces its EndpointSlices)
    server_endpoints: dict[str, str] = field(default_factory=dict)
    max_artifact_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = 60.0
    fetch_proxy: str | None = None
    fetch_ca_file: str | None = None
    #: longest a download may take from its first byte sent to its last received
    fetch_deadline: float = DEFAULT_DEADLINE
    #: networks downloads may reach although they are not public, and networks they may never reach
    allowed_networks: tuple[IPNetwork, ...] = ()
    blocked_networks: tuple[IPNetwork, ...] = ()
    #: per-namespace host allow-lists ("*": every other namespace; none: any public host)
    allowed_hosts: HostRules = field(default_factory=HostRules)
    #: namespaces whose s3:// sources without a credentialsSecret may use the operator's own AWS credentials
    #: (botocore's chain: web identity / IRSA, instance role); "*": every namespace; empty: none
    ambient_s3_namespaces: tuple[str, ...] = ()
    #: namespaces whose gs:// sources without a credentialsSecret may use the operator's own Google credentials
    #: (workload identity), toward storage.googleapis.com only; "*": every namespace; empty: none
    ambient_gcs_namespaces: tuple[str, ...] = ()
    #: namespaces whose az:// sources without a credentialsSecret may use the operator's own Azure identity
    #: (workload identity), toward <account>.blob.core.windows.net only; "*": every namespace; empty: none
    ambient_azure_namespaces: tuple[str, ...] = ()
    #: downloads at once per namespace and overall (0: no limit)
    downloads_per_namespace: int = 2
    downloads_total: int = 4
    #: bytes a namespace's folder may hold (0: no quota), and per-namespace exceptions
    namespace_quota_bytes: int = 0
    namespace_quotas: dict[str, int] = field(default_factory=dict)
    onnx_check_timeout: float = DEFAULT_CHECK_TIMEOUT
    #: the PVC mounted at repository_root, and its namespace; servers whose claim is bound to other
    #: storage are refused (claim None: not checked; namespace None: claim names compared)
    claim_name: str | None = None
    claim_namespace: str | None = None
    index_timeout: float = 5.0
    unload_timeout: float = 120.0
    #: namespaces to watch (empty: all)
    namespaces: list[str] = field(default_factory=list)
    #: Prometheus that KEDA ScaledObjects query when spec.autoscaling.prometheus.serverAddress is unset
    prometheus_url: str | None = None
    #: KEDA's HTTP add-on external scaler (host:port) that scale-to-zero ScaledObjects name
    http_scaler_address: str = DEFAULT_SCALER_ADDRESS
    #: domains each namespace's scale-to-zero host names must be under (none: own Service names only)
    route_domains: RouteDomains = field(default_factory=RouteDomains)
    #: the claim the operator provides in each namespace (servers that name none mount it)
    tenant_claim: str = DEFAULT_CLAIM
    #: who the servers' NetworkPolicies let in besides their own namespace
    policy: network_policy.PolicyContext = field(default_factory=network_policy.PolicyContext)
    #: backends of pools whose spec.allowedBackends is unset (None: every backend)
    default_allowed_backends: tuple[str, ...] | None = None
    #: image prefixes InferenceServers may run (empty: any)
    server_image_prefixes: list[str] = field(default_factory=list)
    #: threads that run model reconciles (the operator's --workers)
    workers: int = 8

    @property
    def index_max_age(self) -> float:
        """How old a replica's index may be for a resync: ~six reads per resync period, 1-10 s."""
        return min(10.0, max(1.0, self.resync_seconds / 6))
