"""InferenceServer → Deployment and Service manifests (its HPA or ScaledObject: ``autoscaling``). Pure
functions of the custom object, read through its typed spec (``api.server_types``): the defaults are the
spec's, not restated here.

``ports``, ``service_endpoint`` and the repository paths also take the spec as the custom object's dict, parsed
on the way in, for the callers that do not hold the typed spec yet (the model controller, ``reconcile_parts``,
``render_memo``); that form goes when they do.

Each manifest is complete (the operator server-side-applies it), carries an owner reference to the
InferenceServer (deletion cascades through the garbage collector) and the labels the operator uses to
find what it owns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..api import API_VERSION
from ..api.server_spec import CONNECTION_DRAIN_SECONDS, EXIT_MARGIN_SECONDS, RESERVED_FLAGS
from ..api.server_types import InferenceServerSpec, Probe
from ..api.typed import as_body, parse
from ..replicas import server_auth
from . import model_cache

MODEL_REPOSITORY_MOUNT = "/models"
MANAGED_BY = "kubeinfer-operator"
SERVER_LABEL = "serving.kubeinfer.io/server"
#: on the pool's pods, the InferenceServer's uid: the Service selects on it (``service``), so a pod made with the
#: pool's older, name-based labels only is no replica of it (the operator trusts no pod for its labels anyway:
#: ``pool_pods``)
POOL_UID_LABEL = "serving.kubeinfer.io/pool-uid"


#: an InferenceServer's spec, typed or as the custom object's dict
ServerSpec = InferenceServerSpec | Mapping[str, Any]


def typed_spec(spec: ServerSpec) -> InferenceServerSpec:
    return spec if isinstance(spec, InferenceServerSpec) else parse(InferenceServerSpec, spec)


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "kubeinfer-server", "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), "app.kubernetes.io/managed-by": MANAGED_BY, SERVER_LABEL: name}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(name).items())


def pod_labels(body: Mapping[str, Any]) -> dict[str, str]:
    """The pods' labels: the pool's, and its uid's. Not in the Deployment's selector, which is immutable: the
    pools made before the uid label keep their selector, and their pods get the label at the next rollout."""
    meta = body["metadata"]
    return {**labels(meta["name"]), POOL_UID_LABEL: str(meta["uid"])}


def mount_subpath(name: str, spec: ServerSpec) -> str:
    """Folder of this server's repository inside its namespace's folder (``spec.repository.subPath``, default
    the server's name): the pods' claim reaches only ``<volume>/<namespace>/``, so this is their subPath."""
    return typed_spec(spec).repository.sub_path or name


def repository_subpath(namespace: str, name: str, spec: ServerSpec) -> str:
    """Folder of this server's repository inside the whole volume (the operator's view): ``<namespace>/<subPath>``.

    ``spec.repository.subPath`` is relative to the namespace's own folder, so no object can name
    another namespace's models (tenant isolation on the shared volume).
    """
    return f"{namespace}/{mount_subpath(name, spec)}"


def ports(spec: ServerSpec) -> dict[str, int]:
    flags = typed_spec(spec).server
    return {"http": flags.http_port, "grpc": flags.grpc_port, "metrics": flags.metrics_port}


def service_endpoint(namespace: str, name: str, spec: ServerSpec) -> dict[str, str]:
    p = ports(spec)
    host = f"{name}.{namespace}.svc"
    return {"http": f"{host}:{p['http']}", "grpc": f"{host}:{p['grpc']}"}


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceServer",
        "name": body["metadata"]["name"],
        "uid": body["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "labels": labels(meta["name"]),
        "ownerReferences": [owner_reference(body)],
    }


def reserved_extra_args(spec: InferenceServerSpec) -> list[str]:
    """The extraArgs that set a flag the operator owns (empty when there are none)."""
    return [a for a in spec.server.extra_args if a.split("=", 1)[0] in RESERVED_FLAGS]


def server_args(spec: InferenceServerSpec) -> list[str]:
    flags = spec.server
    p = ports(spec)
    args = [
        f"--model-repository={MODEL_REPOSITORY_MOUNT}",
        f"--http-port={p['http']}",
        f"--grpc-port={p['grpc']}",
        f"--metrics-port={p['metrics']}",
        "--model-control-mode=poll",
        f"--repository-poll-secs={flags.poll_interval_seconds}",
        f"--shutdown-timeout={shutdown_seconds(spec)}",
        f"--connection-drain-seconds={CONNECTION_DRAIN_SECONDS}",
    ]
    age = grpc_max_connection_age_seconds(spec)
    if age:
        args.append(f"--grpc-max-connection-age={age * 1000}")
    if flags.log_level:
        args.append(f"--log-level={flags.log_level}")
    args += server_auth.server_flags(spec)
    if spec.allowed_backends is not None:
        args.append(f"--allowed-backends={','.join(spec.allowed_backends)}")
    # a pool refuses op libraries from outside the model's folder unless it says otherwise (the standalone
    # server's default is Triton's, which loads them from anywhere)
    if not spec.allow_external_op_libraries:
        args.append("--allow-external-op-libraries=false")
    args += model_cache.server_flags(spec)
    reserved = set(reserved_extra_args(spec))
    return args + [a for a in flags.extra_args if a not in reserved]


def grpc_max_connection_age_seconds(spec: InferenceServerSpec) -> int:
    """Half the preStop drain: a gRPC channel pinned to a pod that left the Service's endpoints gets a graceful
    GOAWAY and reconnects to another replica while the pod still serves, before the server stops (whose
    not-yet-dispatched calls would end CANCELLED); it also spreads channels over new replicas. 0: none."""
    drain = spec.drain_seconds
    return max(1, drain // 2) if drain > 0 else 0


def shutdown_seconds(spec: InferenceServerSpec) -> int:
    return spec.server.shutdown_timeout_seconds


def termination_grace_seconds(spec: InferenceServerSpec) -> int:
    """preStop drain + the server's --connection-drain-seconds and --shutdown-timeout + a margin: the kubelet
    never kills a pod that is still finishing requests (a scale-down or rollout loses none)."""
    return spec.drain_seconds + CONNECTION_DRAIN_SECONDS + shutdown_seconds(spec) + EXIT_MARGIN_SECONDS


def pod_annotations(spec: InferenceServerSpec) -> dict[str, str]:
    """The conventional ``prometheus.io/*`` scrape annotations (Prometheus's own example ``kubernetes-pods``
    job and the community chart select pods by them), then the user's ``podAnnotations`` (which win)."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(ports(spec)["metrics"]),
        "prometheus.io/path": "/metrics",
        **{k: str(v) for k, v in (spec.pod_annotations or {}).items()},
    }


def _probe(probe: Probe, path: str, spec: InferenceServerSpec) -> dict[str, Any]:
    port, scheme = server_auth.probe_port_and_scheme(spec)
    timing = {
        "periodSeconds": probe.period_seconds,
        "timeoutSeconds": probe.timeout_seconds,
        "failureThreshold": probe.failure_threshold,
    }
    if probe.initial_delay_seconds is not None:
        timing["initialDelaySeconds"] = probe.initial_delay_seconds
    return {"httpGet": {"path": path, "port": port, "scheme": scheme}, **timing}


def _resources(spec: InferenceServerSpec) -> dict[str, Any]:
    """Quantities as strings, passed through. A GPU (extended resource) given only as a limit needs no
    request here: the API server defaults the request to the limit, and requires them equal."""
    given = (("limits", spec.resources.limits), ("requests", spec.resources.requests))
    return {k: {n: str(q) for n, q in v.items()} for k, v in given if v}


def _scheduling(spec: InferenceServerSpec) -> dict[str, Any]:
    """The pod's scheduling fields the spec sets, as the custom object states them."""
    given = {
        "nodeSelector": spec.node_selector,
        "tolerations": [as_body(t) for t in spec.tolerations],
        "affinity": spec.affinity,
        "imagePullSecrets": [as_body(s) for s in spec.image_pull_secrets],
    }
    return {k: v for k, v in given.items() if v}


def deployment(body: Mapping[str, Any], claim: str, spec: InferenceServerSpec | None = None) -> dict[str, Any]:
    """The pool's Deployment; its pods mount ``claim`` (which reaches only their namespace's folder of the
    volume) at ``spec.repository.subPath``, read-only. ``spec``: the body's, typed, with the operator's pool
    defaults (the controller parses it once per reconcile); parsed from ``body`` when not given."""
    meta = body["metadata"]
    spec = spec or InferenceServerSpec.from_body(body)
    name = meta["name"]
    secret_volumes, secret_mounts = server_auth.volumes_and_mounts(spec)
    drain = spec.drain_seconds
    container: dict[str, Any] = {
        "name": "server",
        "image": spec.image,
        "args": server_args(spec),
        "ports": [
            {"name": "http", "containerPort": ports(spec)["http"], "protocol": "TCP"},
            {"name": "grpc", "containerPort": ports(spec)["grpc"], "protocol": "TCP"},
            {"name": "metrics", "containerPort": ports(spec)["metrics"], "protocol": "TCP"},
        ],
        "resources": _resources(spec),
        "volumeMounts": [
            {
                "name": "model-repository",
                "mountPath": MODEL_REPOSITORY_MOUNT,
                "subPath": mount_subpath(name, spec),
                "readOnly": True,
            },
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "tmp", "mountPath": "/tmp"},
            *secret_mounts,
        ],
        "livenessProbe": _probe(spec.probes.liveness, "/v2/health/live", spec),
        "readinessProbe": _probe(spec.probes.readiness, "/v2/health/ready", spec),
        "startupProbe": _probe(spec.probes.startup, "/v2/health/ready", spec),
        # the endpoint is removed from the Service while the pod still serves; then SIGTERM drains
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(drain)]}}},
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "volumes": [
            {
                "name": "model-repository",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            },
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": str(spec.shared_memory_size)},
            },
            {"name": "tmp", "emptyDir": {}},
            *secret_volumes,
        ],
    }
    pod_spec.update(_scheduling(spec))
    template_meta: dict[str, Any] = {"labels": pod_labels(body), "annotations": pod_annotations(spec)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(body),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(name)},
            # never fewer serving pods than asked for during a rollout
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def service(
    body: Mapping[str, Any],
    affinity: Mapping[str, Any] | None = None,
    *,
    by_uid: bool = True,
    spec: InferenceServerSpec | None = None,
) -> dict[str, Any]:
    """The pool's Service; ``affinity``: a ``sessionAffinityConfig`` (ClientIP affinity, for sequence models:
    ``sequence_routing``), None for none. ``by_uid``: it selects on the pool's uid label too, which the caller
    turns on only once every pod of the pool carries it (a pool made before the label would otherwise serve
    from no pod until its rollout ends: ``server_reconcile``). ``spec``: the body's, typed (parsed when not
    given)."""
    name = body["metadata"]["name"]
    p = ports(spec or InferenceServerSpec.from_body(body))
    selector = selector_labels(name)
    if by_uid:
        selector[POOL_UID_LABEL] = str(body["metadata"]["uid"])
    service_spec: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [
            {"name": "http", "port": p["http"], "targetPort": "http", "protocol": "TCP"},
            # gRPC is HTTP/2 in clear text: the standard appProtocol tells proxies (KEDA's HTTP add-on, Gateway
            # implementations) to speak h2c to this port
            {
                "name": "grpc",
                "port": p["grpc"],
                "targetPort": "grpc",
                "protocol": "TCP",
                "appProtocol": "kubernetes.io/h2c",
            },
            {"name": "metrics", "port": p["metrics"], "targetPort": "metrics", "protocol": "TCP"},
        ],
        # set either way: server-side apply leaves a field the operator stops sending as it was
        "sessionAffinity": "ClientIP" if affinity else "None",
    }
    if affinity:
        service_spec["sessionAffinityConfig"] = dict(affinity)
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(body), "spec": service_spec}
