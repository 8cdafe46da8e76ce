"""The InferenceServer spec as typed classes: each field's JSON name, description, bounds, CEL rules and default
in one place. ``server_crd`` generates the CRD's spec schema from them (``typed.schema_of``);
``InferenceServerSpec.from_body`` reads a custom object's spec into them, defaults applied.

Defaults named in descriptions come from ``server_spec`` (the operator's) and the server's own vocabulary, so a
description never states a default the operator does not apply. Fields whose absence means something other
than a fixed default (the operator's default backends, the autoscaler owning the pool, the namespace's claim)
stay ``None`` when unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Literal

from kubeinfer.server.config.platforms import BUILTIN_BACKENDS

from . import server_spec
from .typed import Quantity, parse, resolve, spec_field

#: the three ports as the server will use them, each defaulted as the server does (CEL)
_PORTS = "[" + ", ".join(f"has(self.{k}Port) ? self.{k}Port : {v}" for k, v in server_spec.DEFAULT_PORTS.items()) + "]"
_PROMQL_DURATION = "^([0-9]+(ms|s|m|h|d|w|y))+$"


@dataclass(frozen=True, kw_only=True)
class LocalObjectReference:
    SCHEMA_KEY_ORDER: ClassVar[tuple[str, ...]] = ("type", "properties")

    name: str = spec_field("name", "Secret name.", required=True)


@dataclass(frozen=True, kw_only=True)
class Toleration:
    key: str | None = spec_field("key", "Taint key.", default=None)
    operator: Literal["Exists", "Equal"] | None = spec_field("operator", "Exists or Equal.", default=None)
    value: str | None = spec_field("value", "Taint value.", default=None)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = spec_field(
        "effect", "Taint effect.", default=None
    )
    toleration_seconds: int | None = spec_field(
        "tolerationSeconds", "How long a NoExecute taint is tolerated.", default=None, format="int64"
    )


@dataclass(frozen=True, kw_only=True)
class Resources:
    limits: Mapping[str, Quantity] | None = spec_field(
        "limits", "Resource limits (GPUs are requested with nvidia.com/gpu).", default=None
    )
    requests: Mapping[str, Quantity] | None = spec_field("requests", "Resource requests.", default=None)


@dataclass(frozen=True, kw_only=True)
class Repository:
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {
            "rule": "!has(self.subPath) || !self.subPath.matches('(^|/)[.]')",
            "message": "repository.subPath must not contain '.', '..' or hidden (dot-named) components",
        },
    )

    claim_name: str | None = spec_field(
        "claimName",
        "A PersistentVolumeClaim in this namespace that reaches exactly this namespace's folder of the "
        "operator's repository volume (<volume>/<namespace>/). Default: the claim the operator provides "
        "(kubeinfer-repository, read-only, made on first use). A claim that reaches the whole volume, or "
        "other storage, is refused (condition RepositoryReady).",
        default=None,
        minLength=1,
    )
    #: unset: the InferenceServer's name
    sub_path: str | None = spec_field(
        "subPath",
        "Folder of this server's repository inside this namespace's folder of the volume "
        "(<volume>/<namespace>/<subPath>); default <name>.",
        default=None,
        pattern="^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        maxLength=1024,
    )


@dataclass(frozen=True, kw_only=True)
class TokenSecret:
    name: str = spec_field("name", "Secret name.", required=True, minLength=1)
    key: str = spec_field(
        "key", f"Key holding the token (default {server_spec.TOKEN_KEY}).", default=server_spec.TOKEN_KEY, minLength=1
    )


@dataclass(frozen=True, kw_only=True)
class ClientCASecret:
    name: str = spec_field("name", "Secret name.", required=True, minLength=1)
    key: str = spec_field(
        "key",
        f"Key holding the CA certificate (default {server_spec.CA_KEY}).",
        default=server_spec.CA_KEY,
        minLength=1,
    )


@dataclass(frozen=True, kw_only=True)
class Tls:
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {
            "rule": "!has(self.clientCASecret) || has(self.operatorCertificateSecret)",
            "message": "auth.tls.clientCASecret needs auth.tls.operatorCertificateSecret "
            "(the operator reads every replica's repository index)",
        },
    )

    certificate_secret: str = spec_field(
        "certificateSecret",
        "A kubernetes.io/tls Secret (tls.crt, tls.key) the server presents; its ca.crt, if any, "
        "is what the operator verifies the server with.",
        required=True,
        minLength=1,
    )
    client_ca_secret: ClientCASecret | None = spec_field(
        "clientCASecret",
        "Require client certificates signed by this CA (mTLS). Probes then ask "
        "the plain metrics port (the kubelet has no client certificate).",
        default=None,
    )
    operator_certificate_secret: str | None = spec_field(
        "operatorCertificateSecret",
        "A kubernetes.io/tls Secret with the client certificate the operator presents (required with clientCASecret).",
        default=None,
        minLength=1,
    )


@dataclass(frozen=True, kw_only=True)
class Auth:
    token_secret: TokenSecret | None = spec_field(
        "tokenSecret",
        "Secret holding the bearer token every call except the health checks must send "
        "(Authorization: Bearer <token>). An emptied or deleted token refuses every call.",
        default=None,
    )
    tls: Tls | None = spec_field("tls", "HTTPS and gRPC TLS.", default=None)


@dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    enabled: bool = spec_field("enabled", "Render the policy (default true).", default=True)
    allow_from: tuple[Mapping[str, Any], ...] | None = spec_field(
        "allowFrom",
        "More callers of the HTTP and gRPC ports (networking/v1 NetworkPolicyPeer: "
        "namespaceSelector, podSelector, ipBlock).",
        default=None,
    )


@dataclass(frozen=True, kw_only=True)
class ServerFlags:
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {
            "rule": f"{_PORTS}.all(p, {_PORTS}.exists_one(q, q == p))",
            "message": "httpPort, grpcPort and metricsPort must differ",
        },
    )

    http_port: int = spec_field(
        "httpPort",
        f"HTTP/REST port (default {server_spec.DEFAULT_PORTS['http']}).",
        default=server_spec.DEFAULT_PORTS["http"],
        minimum=1,
        maximum=65535,
    )
    grpc_port: int = spec_field(
        "grpcPort",
        f"gRPC port (default {server_spec.DEFAULT_PORTS['grpc']}).",
        default=server_spec.DEFAULT_PORTS["grpc"],
        minimum=1,
        maximum=65535,
    )
    metrics_port: int = spec_field(
        "metricsPort",
        f"Prometheus metrics port (default {server_spec.DEFAULT_PORTS['metrics']}).",
        default=server_spec.DEFAULT_PORTS["metrics"],
        minimum=1,
        maximum=65535,
    )
    poll_interval_seconds: int = spec_field(
        "pollIntervalSeconds",
        f"Repository poll interval in seconds (--repository-poll-secs, default {server_spec.DEFAULT_POLL_SECONDS}).",
        default=server_spec.DEFAULT_POLL_SECONDS,
        minimum=1,
    )
    #: unset: the server's own default (info); the operator passes no flag
    log_level: Literal["debug", "info", "warning", "error"] | None = spec_field(
        "logLevel", "Log level (default info).", default=None
    )
    shutdown_timeout_seconds: int = spec_field(
        "shutdownTimeoutSeconds",
        "Seconds in-flight and queued requests get after SIGTERM (--shutdown-timeout, default "
        f"{server_spec.SHUTDOWN_SECONDS}); terminationGracePeriodSeconds is drainSeconds + this + "
        f"{server_spec.CONNECTION_DRAIN_SECONDS + server_spec.EXIT_MARGIN_SECONDS}.",
        default=server_spec.SHUTDOWN_SECONDS,
        minimum=1,
    )
    extra_args: tuple[str, ...] = spec_field(
        "extraArgs",
        "Extra command-line flags appended to the server's arguments. Flags the operator "
        "sets (repository, control mode, listeners and ports, auth and TLS, drain timing, allowed "
        "backends and op libraries) are refused.",
        default=(),
        maxItems=64,
        items={"maxLength": 1024},
        validations=[
            {
                "rule": f"self.all(a, !a.matches('{server_spec.RESERVED_FLAG_PATTERN}'))",
                "message": "server.extraArgs must not set a flag the operator sets (repository, control "
                "mode, listeners, ports, auth/TLS, drain timing, allowed backends, op libraries): use the "
                "InferenceServer's own fields",
            }
        ],
    )


@dataclass(frozen=True, kw_only=True)
class Target:
    metric: Literal["QueueDurationPerRequest", "PendingRequests", "CPU", "GPU"] = spec_field(
        "metric",
        "QueueDurationPerRequest: average µs a request waited in the scheduler queue, over the pool "
        "(default target 5000); PendingRequests: requests waiting in the queues, per pod (default "
        "10); CPU: CPU use in percent of the pod's CPU request (default 80); GPU: GPU busy percent "
        "from NVML (default 80).",
        default=server_spec.DEFAULT_SIGNAL,
    )
    #: unset: the metric's default target (``traffic.autoscaling``)
    value: Quantity | None = spec_field(
        "value", "Target: µs, requests per pod, or percent, by metric (a number or quantity).", default=None
    )


@dataclass(frozen=True, kw_only=True)
class Prometheus:
    #: unset: the operator's --prometheus-url
    server_address: str | None = spec_field(
        "serverAddress",
        "Prometheus URL, e.g. http://prometheus-server.monitoring.svc:9090 (default: the operator's "
        "--prometheus-url). It must scrape the server pods and keep their serving.kubeinfer.io/server "
        "label (labelmap or podTargetLabels) and namespace.",
        default=None,
        pattern="^https?://",
    )
    window: str = spec_field(
        "window",
        f"Range of the rate() in the queries (default {server_spec.DEFAULT_WINDOW}).",
        default=server_spec.DEFAULT_WINDOW,
        pattern=_PROMQL_DURATION,
    )
    query: str | None = spec_field(
        "query",
        "A PromQL query of your own instead of the signal's (its value is compared to target.value).",
        default=None,
    )
    metric_type: Literal["AverageValue", "Value"] = spec_field(
        "metricType",
        "How the HPA uses a custom query's value: AverageValue (a total divided by the target per "
        "pod; default) or Value (a pool average scaled by ratio).",
        default=server_spec.DEFAULT_METRIC_TYPE,
    )


@dataclass(frozen=True, kw_only=True)
class ScaleToZero:
    idle_seconds: int = spec_field(
        "idleSeconds",
        f"Seconds without requests (and with the signal at zero) before the pool scales to zero "
        f"(KEDA's cooldownPeriod; default {server_spec.DEFAULT_IDLE_SECONDS}).",
        default=server_spec.DEFAULT_IDLE_SECONDS,
        minimum=0,
    )
    hosts: tuple[str, ...] = spec_field(
        "hosts",
        "More Host names the interceptor routes to this pool, besides the Service's "
        "<name>.<namespace>[.svc[.cluster.local]].",
        default=(),
        items={"minLength": 1, "maxLength": 253},
        maxItems=16,
        key_order=("type", "description", "items"),
    )
    concurrency_per_replica: int = spec_field(
        "concurrencyPerReplica",
        f"In-flight requests per replica the add-on's scaler aims at (default {server_spec.DEFAULT_CONCURRENCY}).",
        default=server_spec.DEFAULT_CONCURRENCY,
        minimum=1,
    )


@dataclass(frozen=True, kw_only=True)
class Autoscaling:
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {
            "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
            "message": "autoscaling.minReplicas must not exceed maxReplicas",
        },
        {
            "rule": "!has(self.minReplicas) || self.minReplicas > 0 || !has(self.autoscaler) "
            "|| self.autoscaler != 'HPA'",
            "message": "autoscaling.minReplicas 0 needs KEDA and its HTTP add-on: an HPA never scales to zero",
        },
        {
            "rule": "!has(self.scaleToZero) || (has(self.minReplicas) && self.minReplicas == 0)",
            "message": "autoscaling.scaleToZero is used only with minReplicas 0",
        },
        {
            "rule": "!has(self.metrics) || (has(self.autoscaler) && self.autoscaler == 'HPA')",
            "message": "autoscaling.metrics is only used with autoscaler: HPA "
            "(KEDA scales on target or prometheus.query)",
        },
        {
            "rule": "!has(self.prometheus) || !has(self.prometheus.query) || has(self.target)",
            "message": "autoscaling.prometheus.query needs target.value (the threshold of the query's value)",
        },
    )

    min_replicas: int = spec_field(
        "minReplicas",
        "Fewest replicas (default 1). 0: the pool scales to zero when idle and the first request wakes it; "
        "needs KEDA and KEDA's HTTP add-on v0.15+ (requests go through its interceptor, see scaleToZero).",
        default=1,
        minimum=0,
    )
    max_replicas: int = spec_field("maxReplicas", "Most replicas.", required=True, minimum=1)
    autoscaler: Literal["Auto", "KEDA", "HPA"] = spec_field(
        "autoscaler",
        "Auto (default): KEDA when keda.sh/v1alpha1 ScaledObjects are served, else nothing and the "
        "AutoscalingReady condition says why; KEDA: a ScaledObject; HPA: a plain autoscaling/v2 HPA whose "
        "metric an adapter in your cluster serves (prometheus-adapter or similar).",
        default="Auto",
    )
    #: unset: the default signal (``traffic.autoscaling``)
    target: Target | None = spec_field(
        "target", "The signal and its target (default: QueueDurationPerRequest at 5000 µs).", default=None
    )
    prometheus: Prometheus | None = spec_field(
        "prometheus", "Where and how KEDA queries the signal (autoscaler KEDA).", default=None
    )
    polling_interval_seconds: int = spec_field(
        "pollingIntervalSeconds",
        f"How often KEDA checks its trigger (default {server_spec.DEFAULT_POLLING_SECONDS}).",
        default=server_spec.DEFAULT_POLLING_SECONDS,
        minimum=1,
    )
    scale_to_zero: ScaleToZero | None = spec_field(
        "scaleToZero",
        "With minReplicas 0: KEDA's HTTP add-on routes the pool's HTTP and gRPC requests "
        "through its interceptor, which holds them while the pool scales from zero (InterceptorRoutes "
        "<name>-http and <name>-grpc; the ScaleToZero condition says when it is in force).",
        default=None,
    )
    metrics: tuple[Mapping[str, Any], ...] | None = spec_field(
        "metrics", "autoscaler HPA: autoscaling/v2 MetricSpec list, used instead of target.", default=None
    )
    behavior: Mapping[str, Any] | None = spec_field(
        "behavior",
        "autoscaling/v2 HPA behavior (scale-up/down policies and stabilization windows); KEDA passes it to its HPA.",
        default=None,
    )


@dataclass(frozen=True, kw_only=True)
class ModelCache:
    #: unset or 0: no budget (models still load on demand)
    memory_budget: Quantity | None = spec_field(
        "memoryBudget",
        "Host memory the loaded models of one replica may take (e.g. 4Gi; 0 or unset: "
        "no budget, models still load on demand). Keep it below the pod's memory limit minus the "
        "server's own (~150Mi plus the runtimes' start-up).",
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$",
        key_order=("x-kubernetes-int-or-string", "anyOf", "pattern"),
    )
    #: unset or 0: never
    idle_unload_seconds: int | None = spec_field(
        "idleUnloadSeconds",
        "Unload a model no request used for this long (0 or unset: never).",
        default=None,
        minimum=0,
        key_order=("type", "format", "minimum"),
    )
    #: unset: the server's default (60)
    load_timeout_seconds: int | None = spec_field(
        "loadTimeoutSeconds",
        "Longest a request waits for its model's load (and for room to load it), then 503 / UNAVAILABLE (default 60).",
        default=None,
        minimum=1,
        key_order=("type", "format", "minimum"),
    )


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Timing of one probe; its defaults depend on which probe (``server_spec.PROBE_DEFAULTS``), so the field
    that holds it supplies them (``nested_defaults``) and its descriptions name them."""

    #: unset: the kubelet's default (0)
    initial_delay_seconds: int | None = spec_field(
        "initialDelaySeconds", "Seconds before the first probe.", default=None, minimum=0
    )
    period_seconds: int = spec_field("periodSeconds", "Seconds between probes (default {periodSeconds}).", minimum=1)
    timeout_seconds: int = spec_field(
        "timeoutSeconds", "Seconds before a probe times out (default {timeoutSeconds}).", minimum=1
    )
    failure_threshold: int = spec_field(
        "failureThreshold", "Failed probes in a row that count as failure (default {failureThreshold}).", minimum=1
    )


def _probe_field(kind: str, what: str) -> Any:
    defaults = server_spec.PROBE_DEFAULTS[kind]
    return spec_field(
        kind,
        f"Timing of the {what} (the path is fixed by the server).",
        default_factory=partial(parse, Probe, None, defaults),
        nested_defaults=defaults,
    )


@dataclass(frozen=True, kw_only=True)
class Probes:
    liveness: Probe = _probe_field("liveness", "liveness probe")
    readiness: Probe = _probe_field("readiness", "readiness probe")
    startup: Probe = _probe_field("startup", "startup probe (sized for model loading)")


@dataclass(frozen=True, kw_only=True)
class InferenceServerSpec:
    DESCRIPTION: ClassVar[str] = "A pool of kubeinfer-server pods serving one model repository folder."
    VALIDATIONS: ClassVar[tuple[Mapping[str, str], ...]] = (
        {
            # the shared interceptor forwards whoever reaches it: the pool's own token is what keeps other
            # tenants out (autoscaling.scale_to_zero_refusal says the same for objects an older CRD admitted)
            "rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas "
            "> 0 || (has(self.auth) && has(self.auth.tokenSecret))",
            "message": "autoscaling.minReplicas 0 needs auth.tokenSecret: requests come through KEDA's shared "
            "HTTP add-on interceptor, which any pod that reaches it can call",
        },
        {
            "rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas "
            "> 0 || !has(self.auth) || !has(self.auth.tls)",
            "message": "autoscaling.minReplicas 0 cannot be used with auth.tls: KEDA's HTTP add-on interceptor "
            "speaks plain HTTP and h2c to the pool",
        },
    )

    replicas: int = spec_field(
        "replicas",
        "Number of server pods (the scale subresource; an HPA writes it).",
        default=1,
        emit_default=True,
        minimum=0,
    )
    image: str = spec_field("image", "Server container image.", required=True, minLength=1)
    #: unset: the kubelet's default (by the image's tag)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = spec_field(
        "imagePullPolicy", "Image pull policy.", default=None
    )
    image_pull_secrets: tuple[LocalObjectReference, ...] = spec_field(
        "imagePullSecrets", "Secrets for pulling the image.", default=()
    )
    resources: Resources = spec_field(
        "resources",
        "Container resources, e.g. limits: {nvidia.com/gpu: 1, memory: 16Gi}.",
        default_factory=Resources,
    )
    node_selector: Mapping[str, str] | None = spec_field(
        "nodeSelector", "Node labels the pods must match.", default=None
    )
    tolerations: tuple[Toleration, ...] = spec_field(
        "tolerations", "Pod tolerations (core/v1 Toleration), e.g. for GPU node taints.", default=()
    )
    affinity: Mapping[str, Any] | None = spec_field(
        "affinity", "Pod affinity (core/v1 Affinity), passed through unchanged.", default=None
    )
    pod_annotations: Mapping[str, str] | None = spec_field(
        "podAnnotations", "Extra annotations on the server pods (e.g. for Prometheus scraping).", default=None
    )
    repository: Repository = spec_field(
        "repository",
        "Where this pool's models live: <volume>/<namespace>/<subPath> of the operator's volume.",
        default_factory=Repository,
    )
    #: unset: the operator's --default-allowed-backends (``pool_defaults``), else every backend
    allowed_backends: tuple[str, ...] | None = spec_field(
        "allowedBackends",
        "Backends whose models this pool may serve, a platform team's rule (default: all). "
        "Python and TorchScript models are code that runs in the server: leave python and pytorch out to "
        "keep tenants' code off the pool. A model needing another backend gets a condition and is not "
        "rendered; the servers refuse to load one (--allowed-backends).",
        default=None,
        items={"enum": list(BUILTIN_BACKENDS)},
        list_type="set",
    )
    allow_external_op_libraries: bool = spec_field(
        "allowExternalOpLibraries",
        "Whether a model's modelOperations.opLibraryFilename may name an absolute path outside "
        "the model's folder (Triton allows it). Default false on a pool: a model may load only libraries it "
        "ships in its own folder, so a tenant's model cannot make the server run code from elsewhere.",
        default=False,
        emit_default=True,
        key_order=("type", "default"),
    )
    auth: Auth | None = spec_field(
        "auth",
        "Authentication and TLS of the pool's HTTP and gRPC ports. The Secrets are mounted "
        "into the pods (rotations apply without a restart); the operator reads tokenSecret and "
        "operatorCertificateSecret for its own calls (grant it 'get' on Secrets in this namespace: the "
        "chart's rbac.secretNamespaces).",
        default=None,
    )
    network_policy: NetworkPolicy = spec_field(
        "networkPolicy",
        "The NetworkPolicy the operator puts in front of the pods: HTTP and gRPC from this "
        "namespace, the operator and allowFrom; metrics from the monitoring namespaces the operator was told. "
        "Enforced only where the cluster's network plugin enforces NetworkPolicies.",
        default_factory=NetworkPolicy,
    )
    backends: tuple[str, ...] = spec_field(
        "backends",
        "Backends the server image provides; models needing another are refused. "
        f"Default: {', '.join(BUILTIN_BACKENDS)}.",
        default=tuple(BUILTIN_BACKENDS),
        items={"enum": list(BUILTIN_BACKENDS)},
        list_type="set",
    )
    server: ServerFlags = spec_field("server", "kubeinfer-server flags.", default_factory=ServerFlags)
    #: unset: replicas alone, no autoscaler
    autoscaling: Autoscaling | None = spec_field(
        "autoscaling",
        "Scale the pool on an inference signal: a KEDA ScaledObject (Prometheus query) when the "
        "cluster serves KEDA, or an autoscaling/v2 HPA when autoscaler is HPA (your cluster serves the metric "
        "through its own adapter). Leave spec.replicas out of re-applied manifests: the autoscaler owns it.",
        default=None,
    )
    #: unset: models load at start, as listed in the repository
    model_cache: ModelCache | None = spec_field(
        "modelCache",
        "Load models on their first request instead of at start, within a memory budget per "
        "replica: before a load that would pass it, the least recently used idle models are unloaded (never one "
        "with requests in flight or a live sequence). Models not loaded still count as Ready (they serve on "
        "their next request, which waits for the load).",
        default=None,
    )
    session_affinity: Literal["Auto", "ClientIP", "None"] = spec_field(
        "sessionAffinity",
        "Session affinity of the pool's Service. Auto (default): ClientIP while the pool serves a "
        "sequence (stateful) model, so every request of a sequence reaches the replica that holds its state, "
        "across reconnects; None otherwise. ClientIP: always. None: never (sequences may break across replicas).",
        default="Auto",
        key_order=("type", "enum"),
    )
    shared_memory_size: Quantity = spec_field(
        "sharedMemorySize",
        f"Size limit of the memory-backed /dev/shm (default {server_spec.DEFAULT_SHM}): Python model stubs' "
        "shared memory (2 MiB per instance plus tensors in flight) and client shared-memory regions; counts "
        "against the pod's memory.",
        default=server_spec.DEFAULT_SHM,
    )
    drain_seconds: int = spec_field(
        "drainSeconds",
        "Seconds the pod keeps serving after it is told to stop (preStop), before the server drains "
        f"(default {server_spec.DEFAULT_DRAIN_SECONDS}).",
        default=server_spec.DEFAULT_DRAIN_SECONDS,
        minimum=0,
    )
    probes: Probes = spec_field(
        "probes",
        "Probe timing: liveness /v2/health/live, readiness and startup /v2/health/ready.",
        default_factory=Probes,
    )

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> InferenceServerSpec:
        """The custom object's spec (``body`` is the whole object) as typed, defaults applied."""
        return parse(cls, body["spec"])


resolve(InferenceServerSpec)
