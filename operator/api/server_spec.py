"""The InferenceServer spec's facts that its CRD states and the feature modules use: the pool's defaults, the
server flags the operator reserves, the schemas of ``modelCache`` and ``sessionAffinity``, the phases of a
pod's start. One home each: ``server_crd`` publishes them, ``servers``, ``traffic`` and ``replicas`` apply them."""

from __future__ import annotations

from typing import Any

from kubeinfer.server.vocabulary import server_defaults

#: the server's own defaults: the operator passes them unless the spec names others
DEFAULT_PORTS = server_defaults.DEFAULT_PORTS
DEFAULT_POLL_SECONDS = 5
DEFAULT_SHM = "1Gi"
DEFAULT_DRAIN_SECONDS = 10
#: the server's --shutdown-timeout: after preStop, in-flight and queued requests get this long to finish
SHUTDOWN_SECONDS = server_defaults.SHUTDOWN_TIMEOUT_SECONDS
#: the server's --connection-drain-seconds: after SIGTERM (the pod already left the endpoints during the preStop
#: drain) it keeps answering this long, sending keep-alive HTTP clients and gRPC channels pinned to it elsewhere
CONNECTION_DRAIN_SECONDS = 3
#: on top of drain + shutdown timeout before the kubelet kills: closing listeners, unloading, exiting
EXIT_MARGIN_SECONDS = 5
PROBE_DEFAULTS = {
    "liveness": {"periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3},
    "readiness": {"periodSeconds": 5, "timeoutSeconds": 1, "failureThreshold": 3},
    # 60 × 10 s = 10 minutes for the first models to load before liveness takes over
    "startup": {"periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 60},
}
#: spec.autoscaling.scaleToZero.idleSeconds when unset (KEDA's cooldownPeriod)
DEFAULT_IDLE_SECONDS = 300
#: spec.autoscaling.scaleToZero.concurrencyPerReplica when unset
DEFAULT_CONCURRENCY = 100

MODEL_CACHE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Load models on their first request instead of at start, within a memory budget per "
    "replica: before a load that would pass it, the least recently used idle models are unloaded (never one "
    "with requests in flight or a live sequence). Models not loaded still count as Ready (they serve on "
    "their next request, which waits for the load).",
    "properties": {
        "memoryBudget": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^[0-9]+(\.[0-9]+)?(k|M|G|T|Ki|Mi|Gi|Ti)?$",
            "description": "Host memory the loaded models of one replica may take (e.g. 4Gi; 0 or unset: "
            "no budget, models still load on demand). Keep it below the pod's memory limit minus the "
            "server's own (~150Mi plus the runtimes' start-up).",
        },
        "idleUnloadSeconds": {
            "type": "integer",
            "format": "int32",
            "minimum": 0,
            "description": "Unload a model no request used for this long (0 or unset: never).",
        },
        "loadTimeoutSeconds": {
            "type": "integer",
            "format": "int32",
            "minimum": 1,
            "description": "Longest a request waits for its model's load (and for room to load it), then "
            "503 / UNAVAILABLE (default 60).",
        },
    },
}

#: the server flags this field sets (refused in spec.server.extraArgs while modelCache is set)
MODEL_CACHE_FLAGS = (
    "--model-load-on-demand",
    "--model-cache-memory-budget",
    "--model-idle-unload-seconds",
    "--model-load-timeout",
)

#: server flags the operator sets or that would defeat what it sets (repository, control mode, listeners,
#: auth and TLS, drain timing, the platform team's pool policies): refused in spec.server.extraArgs, by a CEL
#: rule in the CRD and again here
RESERVED_FLAGS = (
    "--model-repository",
    "--model-store",
    "--model-control-mode",
    "--repository-poll-secs",
    "--load-model",
    "--host",
    "--http-address",
    "--grpc-address",
    "--metrics-address",
    "--http-port",
    "--grpc-port",
    "--metrics-port",
    "--allow-http",
    "--allow-grpc",
    "--allow-metrics",
    "--auth-token-file",
    "--http-tls-cert",
    "--http-tls-key",
    "--http-tls-client-ca",
    "--grpc-use-ssl",
    "--grpc-use-ssl-mutual",
    "--grpc-server-cert",
    "--grpc-server-key",
    "--grpc-root-cert",
    "--shutdown-timeout",
    "--exit-timeout-secs",
    "--connection-drain-seconds",
    "--grpc-max-connection-age",
    "--allowed-backends",
    "--allow-external-op-libraries",
    *MODEL_CACHE_FLAGS,
)
#: an argument that sets a reserved flag (``--flag`` or ``--flag=value``), as a regular expression (RE2 and re)
RESERVED_FLAG_PATTERN = "^(" + "|".join(f.replace("-", "[-]") for f in RESERVED_FLAGS) + ")(=.*)?$"

SESSION_AFFINITY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "enum": ["Auto", "ClientIP", "None"],
    "description": "Session affinity of the pool's Service. Auto (default): ClientIP while the pool serves a "
    "sequence (stateful) model, so every request of a sequence reaches the replica that holds its state, "
    "across reconnects; None otherwise. ClientIP: always. None: never (sequences may break across replicas).",
}

#: (status field, what it measures) in order
POD_START_PHASES = (
    ("created", "the pod object was created"),
    ("scheduled", "a node was chosen"),
    ("containerStarted", "the server container started (its image was ready)"),
    ("listening", "the server listened on its ports"),
    ("modelsReady", "the server's start-up model loads were done"),
)
