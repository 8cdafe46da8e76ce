"""The InferenceServer CRD: a pool of kubeinfer-server pods over one repository folder."""

from __future__ import annotations

from typing import Any

from kubeinfer.server.config.platforms import BUILTIN_BACKENDS

from . import CONDITIONS, crd
from .server_spec import (
    CONNECTION_DRAIN_SECONDS,
    DEFAULT_CONCURRENCY,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_IDLE_SECONDS,
    DEFAULT_POLL_SECONDS,
    DEFAULT_PORTS,
    DEFAULT_SHM,
    EXIT_MARGIN_SECONDS,
    POD_START_PHASES,
    PROBE_DEFAULTS,
    RESERVED_FLAG_PATTERN,
    SHUTDOWN_SECONDS,
)
from .server_spec import MODEL_CACHE_SCHEMA as MODEL_CACHE
from .server_spec import SESSION_AFFINITY_SCHEMA as SESSION_AFFINITY


def _s(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _i(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "format": "int32", "description": description, **extra}


_QUANTITY = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}


def _probe(what: str, *, periodSeconds: int, timeoutSeconds: int, failureThreshold: int) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"Timing of the {what} (the path is fixed by the server).",
        "properties": {
            "initialDelaySeconds": _i("Seconds before the first probe.", minimum=0),
            "periodSeconds": _i(f"Seconds between probes (default {periodSeconds}).", minimum=1),
            "timeoutSeconds": _i(f"Seconds before a probe times out (default {timeoutSeconds}).", minimum=1),
            "failureThreshold": _i(
                f"Failed probes in a row that count as failure (default {failureThreshold}).", minimum=1
            ),
        },
    }


#: the three ports as the server will use them, each defaulted as the server does (CEL)
_PORTS = "[" + ", ".join(f"has(self.{k}Port) ? self.{k}Port : {v}" for k, v in DEFAULT_PORTS.items()) + "]"

_PROMQL_DURATION = "^([0-9]+(ms|s|m|h|d|w|y))+$"

AUTOSCALING = {
    "type": "object",
    "description": "Scale the pool on an inference signal: a KEDA ScaledObject (Prometheus query) when the "
    "cluster serves KEDA, or an autoscaling/v2 HPA when autoscaler is HPA (your cluster serves the metric "
    "through its own adapter). Leave spec.replicas out of re-applied manifests: the autoscaler owns it.",
    "required": ["maxReplicas"],
    "properties": {
        "minReplicas": _i(
            "Fewest replicas (default 1). 0: the pool scales to zero when idle and the first request wakes it; "
            "needs KEDA and KEDA's HTTP add-on v0.15+ (requests go through its interceptor, see scaleToZero).",
            minimum=0,
        ),
        "maxReplicas": _i("Most replicas.", minimum=1),
        "autoscaler": _s(
            "Auto (default): KEDA when keda.sh/v1alpha1 ScaledObjects are served, else nothing and the "
            "AutoscalingReady condition says why; KEDA: a ScaledObject; HPA: a plain autoscaling/v2 HPA whose "
            "metric an adapter in your cluster serves (prometheus-adapter or similar).",
            enum=["Auto", "KEDA", "HPA"],
        ),
        "target": {
            "type": "object",
            "description": "The signal and its target (default: QueueDurationPerRequest at 5000 µs).",
            "properties": {
                "metric": _s(
                    "QueueDurationPerRequest: average µs a request waited in the scheduler queue, over the pool "
                    "(default target 5000); PendingRequests: requests waiting in the queues, per pod (default "
                    "10); CPU: CPU use in percent of the pod's CPU request (default 80); GPU: GPU busy percent "
                    "from NVML (default 80).",
                    enum=["QueueDurationPerRequest", "PendingRequests", "CPU", "GPU"],
                ),
                "value": {
                    **_QUANTITY,
                    "description": "Target: µs, requests per pod, or percent, by metric (a number or quantity).",
                },
            },
        },
        "prometheus": {
            "type": "object",
            "description": "Where and how KEDA queries the signal (autoscaler KEDA).",
            "properties": {
                "serverAddress": _s(
                    "Prometheus URL, e.g. http://prometheus-server.monitoring.svc:9090 (default: the operator's "
                    "--prometheus-url). It must scrape the server pods and keep their serving.kubeinfer.io/server "
                    "label (labelmap or podTargetLabels) and namespace.",
                    pattern="^https?://",
                ),
                "window": _s("Range of the rate() in the queries (default 1m).", pattern=_PROMQL_DURATION),
                "query": _s(
                    "A PromQL query of your own instead of the signal's (its value is compared to target.value)."
                ),
                "metricType": _s(
                    "How the HPA uses a custom query's value: AverageValue (a total divided by the target per "
                    "pod; default) or Value (a pool average scaled by ratio).",
                    enum=["AverageValue", "Value"],
                ),
            },
        },
        "pollingIntervalSeconds": _i("How often KEDA checks its trigger (default 15).", minimum=1),
        "scaleToZero": {
            "type": "object",
            "description": "With minReplicas 0: KEDA's HTTP add-on routes the pool's HTTP and gRPC requests "
            "through its interceptor, which holds them while the pool scales from zero (InterceptorRoutes "
            "<name>-http and <name>-grpc; the ScaleToZero condition says when it is in force).",
            "properties": {
                "idleSeconds": _i(
                    f"Seconds without requests (and with the signal at zero) before the pool scales to zero "
                    f"(KEDA's cooldownPeriod; default {DEFAULT_IDLE_SECONDS}).",
                    minimum=0,
                ),
                "hosts": {
                    "type": "array",
                    "description": "More Host names the interceptor routes to this pool, besides the Service's "
                    "<name>.<namespace>[.svc[.cluster.local]].",
                    "items": {"type": "string", "minLength": 1, "maxLength": 253},
                    "maxItems": 16,
                },
                "concurrencyPerReplica": _i(
                    f"In-flight requests per replica the add-on's scaler aims at (default {DEFAULT_CONCURRENCY}).",
                    minimum=1,
                ),
            },
        },
        "metrics": {
            "type": "array",
            "description": "autoscaler HPA: autoscaling/v2 MetricSpec list, used instead of target.",
            "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "behavior": {
            "type": "object",
            "description": "autoscaling/v2 HPA behavior (scale-up/down policies and stabilization windows); "
            "KEDA passes it to its HPA.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
    },
    "x-kubernetes-validations": [
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
    ],
}

INFERENCE_SERVER_SPEC = {
    "type": "object",
    "description": "A pool of kubeinfer-server pods serving one model repository folder.",
    "required": ["image"],
    "properties": {
        "replicas": _i("Number of server pods (the scale subresource; an HPA writes it).", minimum=0, default=1),
        "image": _s("Server container image.", minLength=1),
        "imagePullPolicy": _s("Image pull policy.", enum=["Always", "IfNotPresent", "Never"]),
        "imagePullSecrets": {
            "type": "array",
            "description": "Secrets for pulling the image.",
            "items": {
                "type": "object",
                "properties": {"name": _s("Secret name.")},
                "required": ["name"],
            },
        },
        "resources": {
            "type": "object",
            "description": "Container resources, e.g. limits: {nvidia.com/gpu: 1, memory: 16Gi}.",
            "properties": {
                "limits": {
                    "type": "object",
                    "description": "Resource limits (GPUs are requested with nvidia.com/gpu).",
                    "additionalProperties": _QUANTITY,
                },
                "requests": {
                    "type": "object",
                    "description": "Resource requests.",
                    "additionalProperties": _QUANTITY,
                },
            },
        },
        "nodeSelector": {
            "type": "object",
            "description": "Node labels the pods must match.",
            "additionalProperties": {"type": "string"},
        },
        "tolerations": {
            "type": "array",
            "description": "Pod tolerations (core/v1 Toleration), e.g. for GPU node taints.",
            "items": {
                "type": "object",
                "properties": {
                    "key": _s("Taint key."),
                    "operator": _s("Exists or Equal.", enum=["Exists", "Equal"]),
                    "value": _s("Taint value."),
                    "effect": _s("Taint effect.", enum=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
                    "tolerationSeconds": {
                        "type": "integer",
                        "format": "int64",
                        "description": "How long a NoExecute taint is tolerated.",
                    },
                },
            },
        },
        "affinity": {
            "type": "object",
            "description": "Pod affinity (core/v1 Affinity), passed through unchanged.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "podAnnotations": {
            "type": "object",
            "description": "Extra annotations on the server pods (e.g. for Prometheus scraping).",
            "additionalProperties": {"type": "string"},
        },
        "repository": {
            "type": "object",
            "description": "Where this pool's models live: <volume>/<namespace>/<subPath> of the operator's volume.",
            "properties": {
                "claimName": _s(
                    "A PersistentVolumeClaim in this namespace that reaches exactly this namespace's folder of the "
                    "operator's repository volume (<volume>/<namespace>/). Default: the claim the operator provides "
                    "(kubeinfer-repository, read-only, made on first use). A claim that reaches the whole volume, or "
                    "other storage, is refused (condition RepositoryReady).",
                    minLength=1,
                ),
                "subPath": _s(
                    "Folder of this server's repository inside this namespace's folder of the volume "
                    "(<volume>/<namespace>/<subPath>); default <name>.",
                    pattern="^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
                    maxLength=1024,
                ),
            },
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.subPath) || !self.subPath.matches('(^|/)[.]')",
                    "message": "repository.subPath must not contain '.', '..' or hidden (dot-named) components",
                }
            ],
        },
        "allowedBackends": {
            "type": "array",
            "description": "Backends whose models this pool may serve, a platform team's rule (default: all). "
            "Python and TorchScript models are code that runs in the server: leave python and pytorch out to "
            "keep tenants' code off the pool. A model needing another backend gets a condition and is not "
            "rendered; the servers refuse to load one (--allowed-backends).",
            "items": {"type": "string", "enum": list(BUILTIN_BACKENDS)},
            "x-kubernetes-list-type": "set",
        },
        "allowExternalOpLibraries": {
            "type": "boolean",
            "default": False,
            "description": "Whether a model's modelOperations.opLibraryFilename may name an absolute path outside "
            "the model's folder (Triton allows it). Default false on a pool: a model may load only libraries it "
            "ships in its own folder, so a tenant's model cannot make the server run code from elsewhere.",
        },
        "auth": {
            "type": "object",
            "description": "Authentication and TLS of the pool's HTTP and gRPC ports. The Secrets are mounted "
            "into the pods (rotations apply without a restart); the operator reads tokenSecret and "
            "operatorCertificateSecret for its own calls (grant it 'get' on Secrets in this namespace: the "
            "chart's rbac.secretNamespaces).",
            "properties": {
                "tokenSecret": {
                    "type": "object",
                    "description": "Secret holding the bearer token every call except the health checks must send "
                    "(Authorization: Bearer <token>). An emptied or deleted token refuses every call.",
                    "required": ["name"],
                    "properties": {
                        "name": _s("Secret name.", minLength=1),
                        "key": _s("Key holding the token (default token).", minLength=1),
                    },
                },
                "tls": {
                    "type": "object",
                    "description": "HTTPS and gRPC TLS.",
                    "required": ["certificateSecret"],
                    "properties": {
                        "certificateSecret": _s(
                            "A kubernetes.io/tls Secret (tls.crt, tls.key) the server presents; its ca.crt, if any, "
                            "is what the operator verifies the server with.",
                            minLength=1,
                        ),
                        "clientCASecret": {
                            "type": "object",
                            "description": "Require client certificates signed by this CA (mTLS). Probes then ask "
                            "the plain metrics port (the kubelet has no client certificate).",
                            "required": ["name"],
                            "properties": {
                                "name": _s("Secret name.", minLength=1),
                                "key": _s("Key holding the CA certificate (default ca.crt).", minLength=1),
                            },
                        },
                        "operatorCertificateSecret": _s(
                            "A kubernetes.io/tls Secret with the client certificate the operator presents "
                            "(required with clientCASecret).",
                            minLength=1,
                        ),
                    },
                    "x-kubernetes-validations": [
                        {
                            "rule": "!has(self.clientCASecret) || has(self.operatorCertificateSecret)",
                            "message": "auth.tls.clientCASecret needs auth.tls.operatorCertificateSecret "
                            "(the operator reads every replica's repository index)",
                        }
                    ],
                },
            },
        },
        "networkPolicy": {
            "type": "object",
            "description": "The NetworkPolicy the operator puts in front of the pods: HTTP and gRPC from this "
            "namespace, the operator and allowFrom; metrics from the monitoring namespaces the operator was told. "
            "Enforced only where the cluster's network plugin enforces NetworkPolicies.",
            "properties": {
                "enabled": {"type": "boolean", "description": "Render the policy (default true)."},
                "allowFrom": {
                    "type": "array",
                    "description": "More callers of the HTTP and gRPC ports (networking/v1 NetworkPolicyPeer: "
                    "namespaceSelector, podSelector, ipBlock).",
                    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            },
        },
        "backends": {
            "type": "array",
            "description": "Backends the server image provides; models needing another are refused. "
            f"Default: {', '.join(BUILTIN_BACKENDS)}.",
            "items": {"type": "string", "enum": list(BUILTIN_BACKENDS)},
            "x-kubernetes-list-type": "set",
        },
        "server": {
            "type": "object",
            "description": "kubeinfer-server flags.",
            "properties": {
                "httpPort": _i(f"HTTP/REST port (default {DEFAULT_PORTS['http']}).", minimum=1, maximum=65535),
                "grpcPort": _i(f"gRPC port (default {DEFAULT_PORTS['grpc']}).", minimum=1, maximum=65535),
                "metricsPort": _i(
                    f"Prometheus metrics port (default {DEFAULT_PORTS['metrics']}).", minimum=1, maximum=65535
                ),
                "pollIntervalSeconds": _i(
                    f"Repository poll interval in seconds (--repository-poll-secs, default {DEFAULT_POLL_SECONDS}).",
                    minimum=1,
                ),
                "logLevel": _s("Log level (default info).", enum=["debug", "info", "warning", "error"]),
                "shutdownTimeoutSeconds": _i(
                    "Seconds in-flight and queued requests get after SIGTERM (--shutdown-timeout, default "
                    f"{SHUTDOWN_SECONDS}); terminationGracePeriodSeconds is drainSeconds + this + "
                    f"{CONNECTION_DRAIN_SECONDS + EXIT_MARGIN_SECONDS}.",
                    minimum=1,
                ),
                "extraArgs": {
                    "type": "array",
                    "description": "Extra command-line flags appended to the server's arguments. Flags the operator "
                    "sets (repository, control mode, listeners and ports, auth and TLS, drain timing, allowed "
                    "backends and op libraries) are refused.",
                    "maxItems": 64,
                    "items": {"type": "string", "maxLength": 1024},
                    "x-kubernetes-validations": [
                        {
                            "rule": f"self.all(a, !a.matches('{RESERVED_FLAG_PATTERN}'))",
                            "message": "server.extraArgs must not set a flag the operator sets (repository, control "
                            "mode, listeners, ports, auth/TLS, drain timing, allowed backends, op libraries): use the "
                            "InferenceServer's own fields",
                        }
                    ],
                },
            },
            "x-kubernetes-validations": [
                {
                    "rule": f"{_PORTS}.all(p, {_PORTS}.exists_one(q, q == p))",
                    "message": "httpPort, grpcPort and metricsPort must differ",
                }
            ],
        },
        "autoscaling": AUTOSCALING,
        "modelCache": MODEL_CACHE,
        "sessionAffinity": SESSION_AFFINITY,
        "sharedMemorySize": {
            **_QUANTITY,
            "description": f"Size limit of the memory-backed /dev/shm (default {DEFAULT_SHM}): Python model stubs' "
            "shared memory (2 MiB per instance plus tensors in flight) and client shared-memory regions; counts "
            "against the pod's memory.",
        },
        "drainSeconds": _i(
            "Seconds the pod keeps serving after it is told to stop (preStop), before the server drains "
            f"(default {DEFAULT_DRAIN_SECONDS}).",
            minimum=0,
        ),
        "probes": {
            "type": "object",
            "description": "Probe timing: liveness /v2/health/live, readiness and startup /v2/health/ready.",
            "properties": {
                "liveness": _probe("liveness probe", **PROBE_DEFAULTS["liveness"]),
                "readiness": _probe("readiness probe", **PROBE_DEFAULTS["readiness"]),
                "startup": _probe("startup probe (sized for model loading)", **PROBE_DEFAULTS["startup"]),
            },
        },
    },
    "x-kubernetes-validations": [
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
    ],
}

INFERENCE_SERVER_STATUS = {
    "type": "object",
    "description": "Observed state of the server pool.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "format": "int64",
            "description": "metadata.generation last reconciled.",
        },
        "conditions": CONDITIONS,
        "replicas": _i("Pods of the Deployment."),
        "readyReplicas": _i("Ready pods of the Deployment."),
        "selector": _s("Label selector of the pods (scale subresource)."),
        "models": {
            "type": "array",
            "description": "InferenceModels that name this server.",
            "items": {"type": "string"},
        },
        "modelCount": _i("How many InferenceModels name this server (the Models column of kubectl get)."),
        "endpoint": _s("host:port of the HTTP endpoint (the Service)."),
        "repositoryClaim": _s("The PersistentVolumeClaim the pods mount (reaches only this namespace's folder)."),
        "autoscaling": {
            "type": "object",
            "description": "The autoscaler the operator owns for this pool and what its HPA last saw.",
            "properties": {
                "autoscaler": _s(
                    "KEDA, HPA, or None (see the AutoscalingReady condition).", enum=["KEDA", "HPA", "None"]
                ),
                "kind": _s("Kind of the owned object: ScaledObject or HorizontalPodAutoscaler."),
                "name": _s("Name of the owned object (the InferenceServer's name)."),
                "hpa": _s("The HPA that scales the pool (keda-hpa-<name> under KEDA)."),
                "query": _s("The PromQL query KEDA evaluates."),
                "threshold": _s("The target the query's value is compared with."),
                "currentReplicas": _i("Replicas the HPA last observed."),
                "desiredReplicas": _i("Replicas the HPA last asked for."),
                "lastScaleTime": _s("When the HPA last changed the replica count.", format="date-time"),
                "currentMetricValues": {
                    "type": "array",
                    "description": "Metric values the HPA last read, as quantities.",
                    "items": {"type": "string"},
                },
                "scalingActive": _s("Why the HPA cannot compute a scale, when it cannot."),
                "scaleToZero": {
                    "type": "object",
                    "description": "minReplicas 0: how requests wake the pool (KEDA's HTTP add-on).",
                    "properties": {
                        "routes": {
                            "type": "array",
                            "description": "The InterceptorRoutes (HTTP port, gRPC port).",
                            "items": {"type": "string"},
                        },
                        "hosts": {
                            "type": "array",
                            "description": "Host names the interceptor routes to the pool.",
                            "items": {"type": "string"},
                        },
                        "idleSeconds": _i("Seconds idle before the pool scales to zero."),
                        "scalerAddress": _s("The add-on's external scaler that KEDA asks (operator setting)."),
                    },
                },
            },
        },
        "pods": {
            "type": "array",
            "description": "How each pod started: the time of each phase (created, scheduled, containerStarted, "
            "listening, modelsReady) and the seconds each took after the one before (operator/servers/pod_start.py).",
            "items": {
                "type": "object",
                "properties": {
                    "name": _s("Pod name."),
                    **{phase: _s(f"When {meaning}.", format="date-time") for phase, meaning in POD_START_PHASES},
                    "seconds": {
                        "type": "object",
                        "description": "Seconds from the phase before to this one, by phase.",
                        "additionalProperties": {"type": "number"},
                    },
                },
            },
        },
    },
}


def inference_server_crd() -> dict[str, Any]:
    # at a glance: how many replicas serve of how many wanted, what scales them, how many models, and why not
    # (the first False condition's reason: Ready=False always follows the condition that made it False)
    columns: list[dict[str, Any]] = [
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Available", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Available")].status'},
        {"name": "Autoscaler", "type": "string", "jsonPath": ".status.autoscaling.autoscaler"},
        {"name": "Models", "type": "integer", "jsonPath": ".status.modelCount"},
        {"name": "Problem", "type": "string", "jsonPath": '.status.conditions[?(@.status=="False")].reason'},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {"name": "Image", "type": "string", "priority": 1, "jsonPath": ".spec.image"},
    ]
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return crd(
        "InferenceServer",
        "inferenceservers",
        "isrv",
        INFERENCE_SERVER_SPEC,
        INFERENCE_SERVER_STATUS,
        columns,
        {"status": {}, "scale": scale},
    )
