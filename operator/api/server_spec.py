"""The InferenceServer spec's facts that its CRD states and the feature modules use: the pool's defaults, the
server flags the operator reserves, the phases of a pod's start. One home each: the typed spec
(``server_types``) and ``server_crd`` publish them, ``servers``, ``traffic`` and ``replicas`` apply them."""

from __future__ import annotations

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
#: spec.autoscaling.pollingIntervalSeconds when unset (KEDA's pollingInterval)
DEFAULT_POLLING_SECONDS = 15
#: spec.autoscaling.prometheus.window when unset: the range of the rate() in the signal's queries
DEFAULT_WINDOW = "1m"
#: spec.autoscaling.target.metric when unset
DEFAULT_SIGNAL = "QueueDurationPerRequest"
#: spec.autoscaling.prometheus.metricType when unset: how the HPA uses a custom query's value
DEFAULT_METRIC_TYPE = "AverageValue"
#: keys of spec.auth's Secrets when unset: the bearer token, the client CA certificate
TOKEN_KEY = "token"
CA_KEY = "ca.crt"

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

#: (status field, what it measures) in order
POD_START_PHASES = (
    ("created", "the pod object was created"),
    ("scheduled", "a node was chosen"),
    ("containerStarted", "the server container started (its image was ready)"),
    ("listening", "the server listened on its ports"),
    ("modelsReady", "the server's start-up model loads were done"),
)
