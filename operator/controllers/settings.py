"""The operator's settings (``OperatorConfig``): what its command line (``cli.py``) decides, in one object the
reconciles read, so tests and benchmarks build an operator without parsing flags.

Each setting that has a flag carries it as field metadata (``flag``: its name, help, how one value is parsed
and how the values become the setting), and ``cli.build_parser`` builds the flags from those: a default is
written once, here, and the flag shows it. A setting the chart exposes names its value there (``chart``), and
``settings_copies`` writes that value's default and schema into the chart, and every setting's flag into the
docs, from it. The leader election's timings (``LeaseTimings``) are settings too, for their chart values. What
only the command line decides (kubeconfig, whether to elect a leader, logging) and the NetworkPolicy context
(``network_policy.PolicyContext``, whose defaults the flags read) stay in ``cli``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from kubeinfer.server.sources.egress import HostRules, IPNetwork, parse_networks

from ..api.pool_defaults import parse_backends
from ..servers import network_policy
from ..sources.artifacts import DEFAULT_MAX_BYTES
from ..sources.fetch import DEFAULT_DEADLINE
from ..sources.onnx_check import DEFAULT_CHECK_TIMEOUT
from ..traffic.autoscaling import DEFAULT_SCALER_ADDRESS
from ..traffic.route_hosts import RouteDomains
from ..volume.tenant_volumes import DEFAULT_CLAIM

#: the environment variable that adds --server-endpoint values (comma-separated)
ENDPOINTS_ENV = "KUBEINFER_SERVER_ENDPOINTS"


@dataclass(frozen=True)
class ChartValue:
    """A setting the chart exposes as one value whose default is the setting's: its path in values.yaml and the
    bounds the chart's schema puts on it. ``settings_copies`` writes the value's default into values.yaml and its
    schema (type, default, bounds, the flag's help as description) into values.schema.json from these."""

    #: "SECTION.key" in values.yaml (the chart's deployment.yaml passes it to the flag)
    path: str
    #: JSON schema bounds (None: none)
    minimum: float | None = None
    exclusive_minimum: float | None = None


@dataclass(frozen=True)
class Flag:
    """How one setting is given on the command line."""

    name: str
    help: str
    #: one flag value → what the parser keeps; a ValueError is the user's mistake, its text the message
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    #: the flag may be given more than once: the parser keeps the list of values
    repeatable: bool = False
    #: what the parser kept → the setting (default: as kept)
    convert: Callable[[Any], Any] | None = None
    #: the environment variable whose value is the flag's default when it is set
    env: str | None = None
    #: where the chart (helm/kubeinfer) exposes the setting; None: it does not (or only in its own words)
    chart: ChartValue | None = None

    @property
    def dest(self) -> str:
        """The parsed arguments' attribute (argparse's spelling of the flag name)."""
        return self.name.removeprefix("--").replace("-", "_")


def flag(name: str, help: str, *, default: Any = MISSING, default_factory: Any = MISSING, **how: Any) -> Any:
    """A setting with a flag (``Flag``'s fields as keywords); without a default the flag is required."""
    return field(default=default, default_factory=default_factory, metadata={"flag": Flag(name, help, **how)})


def endpoint(value: str) -> tuple[str, str]:
    """``NAMESPACE/SERVER=http(s)://HOST:PORT`` (--server-endpoint, $KUBEINFER_SERVER_ENDPOINTS)."""
    key, sep, url = value.partition("=")
    if not sep or key.count("/") != 1 or not url.startswith(("http://", "https://")):
        raise ValueError(f"expected NAMESPACE/SERVER=http(s)://HOST:PORT, got '{value}'")
    return key, url


def _quota(value: str) -> tuple[str, int]:
    namespace, sep, size = value.partition("=")
    if not sep or not namespace or not size.isdigit():
        raise ValueError(f"expected NAMESPACE=BYTES, got '{value}'")
    return namespace, int(size)


def _checked(parse: Callable[[list[str]], object]) -> Callable[[str], str]:
    """A flag value kept as given once ``parse`` accepts it alone (the values are parsed together later)."""

    def check(value: str) -> str:
        parse([value])
        return value

    return check


#: a CIDR flag value (a bare address is a /32 or /128), checked and kept as given
cidr = _checked(parse_networks)


def _namespaces(values: Iterable[str]) -> tuple[str, ...]:
    """``NAMESPACE[,NAMESPACE...]`` flags, repeatable."""
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())


@dataclass
class OperatorConfig:
    repository_root: Path = flag(
        "--repository-root",
        "where the model repository volume is mounted; servers' subPaths are folders below it",
        parse=Path,
    )
    #: the PVC mounted at repository_root, and its namespace; servers whose claim is bound to other
    #: storage are refused (claim None: not checked; namespace None: claim names compared)
    claim_name: str | None = flag(
        "--claim-name",
        "the PVC mounted at --repository-root: the operator provides each namespace a claim on its folder of "
        "it, and refuses servers' claims that reach beyond their namespace's folder (without it: nothing is "
        "provided or checked, for development)",
        default=None,
    )
    claim_namespace: str | None = flag(
        "--claim-namespace",
        "namespace of --claim-name and of the operator's pods (default $POD_NAMESPACE)",
        default=None,
        env="POD_NAMESPACE",
    )
    #: namespaces to watch (empty: all)
    namespaces: list[str] = flag(
        "--namespace", "watch only this namespace (repeatable; default all)", default_factory=list, repeatable=True
    )
    #: the claim the operator provides in each namespace (servers that name none mount it)
    tenant_claim: str = flag(
        "--tenant-claim-name",
        "the PersistentVolumeClaim the operator provides in each namespace with InferenceServers that name "
        "no claim: bound to a PersistentVolume it makes that reaches only <volume>/<namespace>/",
        default=DEFAULT_CLAIM,
    )
    #: backends of pools whose spec.allowedBackends is unset (None: every backend)
    default_allowed_backends: tuple[str, ...] | None = flag(
        "--default-allowed-backends",
        "the backends a pool allows when its spec.allowedBackends is unset (default: every backend; the chart "
        "sets the backends whose models are not code: python, pytorch and tensorflow run the model author's code)",
        default=None,
        parse=parse_backends,
        metavar="BACKEND[,BACKEND...]",
    )
    #: image prefixes InferenceServers may run (empty: any)
    server_image_prefixes: list[str] = flag(
        "--server-image-prefix",
        "InferenceServers may run only images starting with this (repeatable; default any image)",
        default_factory=list,
        repeatable=True,
    )
    resync_seconds: float = flag(
        "--resync-seconds",
        "timer interval that repairs drift and refreshes status",
        default=30.0,
        parse=float,
        chart=ChartValue("operator.resyncSeconds", exclusive_minimum=0),
    )
    #: "namespace/server" → base URL of that server's HTTP endpoint (replaces its EndpointSlices)
    server_endpoints: dict[str, str] = flag(
        "--server-endpoint",
        f"read this server's repository index at URL, not its Service (repeatable; also ${ENDPOINTS_ENV})",
        default_factory=dict,
        parse=endpoint,
        metavar="NS/SERVER=URL",
        repeatable=True,
        convert=dict,
    )
    max_artifact_bytes: int = flag(
        "--max-artifact-bytes",
        "largest model file to download or copy",
        default=DEFAULT_MAX_BYTES,
        parse=int,
        chart=ChartValue("operator.maxArtifactBytes", minimum=1),
    )
    fetch_timeout: float = flag(
        "--fetch-timeout",
        "seconds without progress before a download fails",
        default=60.0,
        parse=float,
        chart=ChartValue("operator.fetchTimeoutSeconds", exclusive_minimum=0),
    )
    #: longest a download may take from its first byte sent to its last received
    fetch_deadline: float = flag(
        "--fetch-deadline",
        "longest a download may take in all, in seconds: a server that sends a byte a minute is stopped here "
        "(--fetch-timeout bounds each read on top)",
        default=DEFAULT_DEADLINE,
        parse=float,
        chart=ChartValue("artifacts.fetchDeadlineSeconds", exclusive_minimum=0),
    )
    fetch_proxy: str | None = flag(
        "--fetch-proxy",
        "HTTP(S) proxy for model downloads (proxy environment variables are not used); the proxy must "
        "refuse non-public destinations itself: the operator cannot see where it connects",
        default=None,
    )
    #: networks downloads may reach although they are not public, and networks they may never reach
    allowed_networks: tuple[IPNetwork, ...] = flag(
        "--allowed-network",
        "a non-public network downloads may reach anyway, e.g. an in-cluster model store (repeatable; "
        "default: public addresses only)",
        default=(),
        parse=cidr,
        metavar="CIDR",
        repeatable=True,
        convert=parse_networks,
    )
    blocked_networks: tuple[IPNetwork, ...] = flag(
        "--blocked-network",
        "a network downloads may never reach, e.g. a Service or Pod CIDR in public address space "
        "(repeatable; wins over --allowed-network)",
        default=(),
        parse=cidr,
        metavar="CIDR",
        repeatable=True,
        convert=parse_networks,
    )
    #: namespaces whose s3:// sources without a credentialsSecret may use the operator's own AWS credentials
    #: (botocore's chain: web identity / IRSA, instance role); "*": every namespace; empty: none
    ambient_s3_namespaces: tuple[str, ...] = flag(
        "--ambient-s3-credentials",
        "namespaces whose s3:// sources without source.credentialsSecret are signed with the operator's own "
        "AWS credentials (botocore's chain: web identity token / IRSA, instance role); '*' is every namespace. "
        "Default: none (such a source is fetched anonymously)",
        default=(),
        metavar="NAMESPACE[,NAMESPACE...]",
        repeatable=True,
        convert=_namespaces,
    )
    #: namespaces whose gs:// sources without a credentialsSecret may use the operator's own Google credentials
    #: (workload identity), toward storage.googleapis.com only; "*": every namespace; empty: none
    ambient_gcs_namespaces: tuple[str, ...] = flag(
        "--ambient-gcs-credentials",
        "namespaces whose gs:// sources without source.credentialsSecret use the operator's own Google "
        "credentials (workload identity's metadata server, or GOOGLE_APPLICATION_CREDENTIALS), toward "
        "https://storage.googleapis.com only; '*' is every namespace. Default: none (fetched anonymously)",
        default=(),
        metavar="NAMESPACE[,NAMESPACE...]",
        repeatable=True,
        convert=_namespaces,
    )
    #: namespaces whose az:// sources without a credentialsSecret may use the operator's own Azure identity
    #: (workload identity), toward <account>.blob.core.windows.net only; "*": every namespace; empty: none
    ambient_azure_namespaces: tuple[str, ...] = flag(
        "--ambient-azure-credentials",
        "namespaces whose az:// sources without source.credentialsSecret use the operator's own Azure "
        "credentials (Microsoft Entra Workload ID: AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE), "
        "toward https://<account>.blob.core.windows.net only; '*' is every namespace. Default: none (fetched "
        "anonymously)",
        default=(),
        metavar="NAMESPACE[,NAMESPACE...]",
        repeatable=True,
        convert=_namespaces,
    )
    #: per-namespace host allow-lists ("*": every other namespace; none: any public host)
    allowed_hosts: HostRules = flag(
        "--allowed-hosts",
        "the hosts a namespace may download from (repeatable; '*.example.com' matches below it; NAMESPACE "
        "'*' is every namespace without a list of its own; default: any public host)",
        default_factory=HostRules,
        parse=_checked(HostRules.parse),
        metavar="NAMESPACE=HOST[,HOST...]",
        repeatable=True,
        convert=HostRules.parse,
    )
    #: domains each namespace's scale-to-zero host names must be under (none: own Service names only)
    route_domains: RouteDomains = flag(
        "--route-domains",
        "domains under which a namespace's scale-to-zero pools may claim host names on the shared interceptor "
        "(repeatable; NAMESPACE '*' is every namespace without a list of its own, and '{namespace}' in a domain "
        "stands for the namespace; default: none, a pool is routed its own Service names only)",
        default_factory=RouteDomains,
        parse=_checked(RouteDomains.parse),
        metavar="NAMESPACE=DOMAIN[,DOMAIN...]",
        repeatable=True,
        convert=RouteDomains.parse,
    )
    #: downloads at once per namespace and overall (0: no limit)
    downloads_per_namespace: int = flag(
        "--downloads-per-namespace",
        "downloads one namespace may run at once (0: no limit); more wait with the condition Queued and are "
        "retried within seconds, their threads given back",
        default=2,
        parse=int,
        chart=ChartValue("artifacts.downloadsPerNamespace", minimum=0),
    )
    downloads_total: int = flag(
        "--downloads-total",
        "downloads the operator runs at once in all (0: no limit); keep it below --workers",
        default=4,
        parse=int,
        chart=ChartValue("artifacts.downloadsTotal", minimum=0),
    )
    #: threads that run model reconciles (the operator's --workers)
    workers: int = flag(
        "--workers",
        "threads that run model reconciles (and kopf's handler threads: deletes, servers); downloads never take "
        "more than --downloads-total of them",
        default=8,
        parse=int,
        chart=ChartValue("operator.workers", minimum=2),
    )
    #: bytes a namespace's folder may hold (0: no quota), and per-namespace exceptions
    namespace_quota_bytes: int = flag(
        "--namespace-quota-bytes",
        "bytes a namespace's folder on the volume may hold; a model that would pass it gets the "
        "condition QuotaExceeded (0: no quota)",
        default=0,
        parse=int,
    )
    namespace_quotas: dict[str, int] = flag(
        "--namespace-quota",
        "the quota of one namespace, replacing --namespace-quota-bytes for it (repeatable; 0: none)",
        default_factory=dict,
        parse=_quota,
        metavar="NAMESPACE=BYTES",
        repeatable=True,
        convert=dict,
    )
    onnx_check_timeout: float = flag(
        "--onnx-check-timeout",
        "seconds the check of one ONNX file against its config may take before the file is refused (the check "
        "reads only the graph's inputs and outputs, never the weights)",
        default=DEFAULT_CHECK_TIMEOUT,
        parse=float,
        chart=ChartValue("artifacts.onnxCheckTimeoutSeconds", exclusive_minimum=0),
    )
    fetch_ca_file: str | None = flag(
        "--fetch-ca-file",
        "CA bundle trusted for https model downloads, replacing the system's (private stores)",
        default=None,
    )
    unload_timeout: float = flag(
        "--unload-timeout",
        "longest wait for a server to unload a deleted model before its finalizer is released",
        default=120.0,
        parse=float,
        chart=ChartValue("operator.unloadTimeoutSeconds", minimum=0),
    )
    #: Prometheus that KEDA ScaledObjects query when spec.autoscaling.prometheus.serverAddress is unset
    prometheus_url: str | None = flag(
        "--prometheus-url",
        "Prometheus that KEDA ScaledObjects query, e.g. http://prometheus-server.monitoring.svc:9090 "
        "(an InferenceServer's spec.autoscaling.prometheus.serverAddress overrides it)",
        default=None,
    )
    #: KEDA's HTTP add-on external scaler (host:port) that scale-to-zero ScaledObjects name
    http_scaler_address: str = flag(
        "--keda-http-scaler-address",
        "host:port of KEDA's HTTP add-on external scaler, named by the ScaledObjects of pools with "
        "minReplicas 0 (default %(default)s, the add-on chart's Service)",
        default=DEFAULT_SCALER_ADDRESS,
    )
    index_timeout: float = 5.0
    #: who the servers' NetworkPolicies let in besides their own namespace (its flags: ``cli``)
    policy: network_policy.PolicyContext = field(default_factory=network_policy.PolicyContext)

    @property
    def index_max_age(self) -> float:
        """How old a replica's index may be for a resync: ~six reads per resync period, 1-10 s."""
        return min(10.0, max(1.0, self.resync_seconds / 6))


@dataclass(frozen=True)
class LeaseTimings:
    """The leader election's timings (client-go's: retry period < renew deadline < duration). Only the command line
    reads them (``cli`` hands them to ``kube.leader.LeaseElector``); they are settings so that their flags and the
    chart's ``lease`` values come from one default."""

    duration: float = flag(
        "--lease-duration",
        "seconds a follower waits after the leader's last renewal (on its own clock) before it takes over",
        default=15.0,
        parse=float,
        chart=ChartValue("lease.durationSeconds", exclusive_minimum=0),
    )
    renew_deadline: float = flag(
        "--lease-renew-deadline",
        "the leader stops when it could not renew for this long, in seconds",
        default=10.0,
        parse=float,
        chart=ChartValue("lease.renewDeadlineSeconds", exclusive_minimum=0),
    )
    retry_period: float = flag(
        "--lease-retry-period",
        "seconds between lease attempts",
        default=2.0,
        parse=float,
        chart=ChartValue("lease.retryPeriodSeconds", exclusive_minimum=0),
    )


#: the classes of settings with flags, in the order the command line and the copies list them
SETTINGS: tuple[type, ...] = (OperatorConfig, LeaseTimings)


def flags(cls: type = OperatorConfig) -> Iterator[tuple[dataclasses.Field[Any], Flag]]:
    """The settings of ``cls`` that have a flag, in the order of the fields."""
    for f in dataclasses.fields(cls):
        if "flag" in f.metadata:
            yield f, f.metadata["flag"]


def every_flag() -> Iterator[tuple[dataclasses.Field[Any], Flag]]:
    """The settings of every class in ``SETTINGS`` that have a flag."""
    for cls in SETTINGS:
        yield from flags(cls)


def flag_default(f: dataclasses.Field[Any], how: Flag) -> Any:
    """What the parser keeps when the flag is not given: no value of a repeatable flag, else the environment
    variable's value when it is set, else the setting's default (MISSING: the flag is required)."""
    if how.repeatable:
        return []
    if how.env is not None and how.env in os.environ:
        return os.environ[how.env]
    return f.default_factory() if f.default_factory is not MISSING else f.default


def from_flags(parsed: Mapping[str, Any], cls: type = OperatorConfig) -> dict[str, Any]:
    """``cls``'s keywords (``OperatorConfig``'s by default) from the parsed flags (argparse's ``vars(args)``)."""
    out = {}
    for f, how in flags(cls):
        value = parsed[how.dest]
        out[f.name] = how.convert(value) if how.convert is not None else value
    return out
