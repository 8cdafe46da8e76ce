"""``spec.autoscaling`` → what scales an InferenceServer: a KEDA ScaledObject, or a plain autoscaling/v2 HPA.

Both scale the InferenceServer itself through its scale subresource; the operator then sets the
Deployment's replicas. Which one (``spec.autoscaling.autoscaler``):

* ``KEDA`` -- a ScaledObject with one Prometheus trigger whose PromQL query comes from the signal
  below; KEDA creates HPA ``keda-hpa-<name>`` and serves it the value through its external metrics
  API. ``Auto`` (the default) picks KEDA when the cluster serves ``keda.sh/v1alpha1`` ScaledObjects.
* ``HPA`` -- the user says their cluster serves the metric through an adapter of their own
  (prometheus-adapter, ...): an HPA with the signal as a Pods/Resource metric, or
  ``spec.autoscaling.metrics`` verbatim.

Without KEDA and without ``autoscaler: HPA`` nothing is created (an HPA whose metric nothing serves
never scales) and the ``AutoscalingReady`` condition says what is missing.

The signals, over the pool's pods (``namespace`` and ``serving_kubeinfer_io_server`` labels: the
pod label ``serving.kubeinfer.io/server`` as Prometheus's ``labelmap`` or a PodMonitor's
``podTargetLabels`` write it):

================================  =================================================================  ============
signal (``target.metric``)        KEDA Prometheus query (``w`` = ``prometheus.window``)              metric type
================================  =================================================================  ============
QueueDurationPerRequest (µs)      sum(rate(nv_inference_queue_duration_us[w]))                        Value
                                  / (sum(rate(nv_inference_request_success[w])) > 0) or vector(0)
PendingRequests (per pod)         sum(nv_inference_pending_request_count) or vector(0)                AverageValue
CPU (% of the pod's CPU request)  sum(rate(process_cpu_seconds_total[w])) or vector(0);              AverageValue
                                  threshold = percent × request cores
GPU (% busy, NVML)                avg(nv_gpu_utilization) * 100 or vector(0)                          Value
================================  =================================================================  ============

``Value`` is the pool's average (the HPA scales by ratio: ``ceil(ready pods × value / target)``);
``AverageValue`` is a pool total the HPA divides by the target per pod.

**Scale to zero** (``minReplicas: 0``, KEDA only: an HPA never goes below one) needs KEDA's HTTP add-on
(v0.15+, ``http.keda.sh/v1beta1`` InterceptorRoutes): its interceptor holds each request while the pool
wakes, and its external scaler tells KEDA how many requests are in flight. The operator renders two
InterceptorRoutes -- ``<name>-http`` to the Service's ``http`` port and ``<name>-grpc`` (path
``/inference.GRPCInferenceService/``) to its ``grpc`` port, which the Service marks
``appProtocol: kubernetes.io/h2c`` so the interceptor speaks HTTP/2 to it -- for the hosts
``<name>.<namespace>[.svc[.cluster.local]]`` plus ``scaleToZero.hosts``, and adds one ``external-push``
trigger per route to the ScaledObject (``minReplicaCount: 0``, ``cooldownPeriod`` = ``idleSeconds``).
The ``ScaleToZero`` condition says whether that is in force and through which routes and hosts.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..api import API_VERSION, status
from ..api.server_types import Auth, Autoscaling, InferenceServerSpec, Prometheus, ScaleToZero, Target
from ..servers import manifests
from . import route_hosts as route_hosts_rules
from .route_hosts import RouteDomains

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
KEDA_API_VERSION = f"{KEDA_GROUP}/{KEDA_VERSION}"
CONDITION = "AutoscalingReady"
SCALE_TO_ZERO = "ScaleToZero"
HTTP_GROUP = "http.keda.sh"
HTTP_VERSION = "v1beta1"
ROUTES = "interceptorroutes"
HTTP_API_VERSION = f"{HTTP_GROUP}/{HTTP_VERSION}"
#: the external scaler's Service in the add-on's chart (release keda-add-ons-http in namespace keda)
DEFAULT_SCALER_ADDRESS = "keda-add-ons-http-external-scaler.keda:9090"
#: every KServe v2 gRPC method lives under this path
GRPC_PATH = "/inference.GRPCInferenceService/"


@dataclass(frozen=True)
class Signal:
    unit: str
    default: str
    metric_type: str  # KEDA trigger metricType
    hpa_metric: str  # the Pods metric an adapter serves under this name (HPA mode)


SIGNALS = {
    "QueueDurationPerRequest": Signal("µs", "5000", "Value", "nv_inference_queue_duration_us_per_request"),
    "PendingRequests": Signal("requests per pod", "10", "AverageValue", "nv_inference_pending_request_count"),
    "CPU": Signal("percent of the CPU request", "80", "AverageValue", ""),
    "GPU": Signal("percent", "80", "Value", "nv_gpu_utilization"),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(1000),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
}


class AutoscalingError(ValueError):
    """A spec the operator cannot turn into an autoscaler; ``reason`` goes into the condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (``2``, ``"500m"``, ``"1.5"``) as a number."""
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise AutoscalingError("InvalidTarget", f"'{value}' is not a number or Kubernetes quantity")
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except InvalidOperation:
        raise AutoscalingError("InvalidTarget", f"'{value}' is not a number or Kubernetes quantity") from None


def _number(d: Decimal) -> str:
    """Plain decimal text (KEDA parses thresholds as floats; no exponent)."""
    text = format(d.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def target(autoscaling: Autoscaling) -> tuple[str, Signal, Decimal]:
    t = autoscaling.target or Target()
    signal = SIGNALS[t.metric]
    value = quantity(signal.default if t.value is None else t.value)
    if value <= 0:
        raise AutoscalingError("InvalidTarget", f"autoscaling.target.value must be positive, got {value}")
    return t.metric, signal, value


def pool_selector(namespace: str, name: str) -> str:
    return f'namespace="{namespace}",{_label(manifests.SERVER_LABEL)}="{name}"'


def _label(pod_label: str) -> str:
    """How Prometheus names a pod label (labelmap / podTargetLabels): non [a-zA-Z0-9_] → ``_``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def cpu_request_cores(spec: InferenceServerSpec) -> Decimal:
    resources = spec.resources
    cpu = (resources.requests or {}).get("cpu") or (resources.limits or {}).get("cpu")
    if cpu is None:
        raise AutoscalingError(
            "NoCPURequest",
            "autoscaling on CPU utilisation needs spec.resources.requests.cpu (utilisation is usage / request)",
        )
    return quantity(cpu)


def keda_trigger(namespace: str, name: str, spec: InferenceServerSpec, server_address: str) -> dict[str, Any]:
    """The Prometheus trigger: the signal's query (or ``prometheus.query``) and its threshold."""
    autoscaling = _autoscaling(spec)
    prom = autoscaling.prometheus or Prometheus()
    metric, signal, value = target(autoscaling)
    sel = pool_selector(namespace, name)
    w = prom.window
    metric_type = signal.metric_type
    threshold = value
    if prom.query:
        query = prom.query
        metric_type = prom.metric_type
        trigger_name = "custom-query"
    elif metric == "QueueDurationPerRequest":
        query = (
            f"sum(rate(nv_inference_queue_duration_us{{{sel}}}[{w}])) / "
            f"(sum(rate(nv_inference_request_success{{{sel}}}[{w}])) > 0) or vector(0)"
        )
        trigger_name = "queue-duration-per-request"
    elif metric == "PendingRequests":
        query = f"sum(nv_inference_pending_request_count{{{sel}}}) or vector(0)"
        trigger_name = "pending-requests"
    elif metric == "CPU":
        query = f"sum(rate(process_cpu_seconds_total{{{sel}}}[{w}])) or vector(0)"
        threshold = value / 100 * cpu_request_cores(spec)
        trigger_name = "cpu-utilization"
    else:  # GPU
        query = f"avg(nv_gpu_utilization{{{sel}}}) * 100 or vector(0)"
        trigger_name = "gpu-utilization"
    return {
        "type": "prometheus",
        "name": trigger_name,
        "metricType": metric_type,
        "metadata": {
            "serverAddress": server_address,
            "query": query,
            "threshold": _number(threshold),
            "ignoreNullValues": "true",
        },
    }


def _autoscaling(spec: InferenceServerSpec) -> Autoscaling:
    """``spec.autoscaling`` of a pool the caller knows has one."""
    if spec.autoscaling is None:
        raise ValueError("the InferenceServer has no spec.autoscaling")
    return spec.autoscaling


def scales_to_zero(autoscaling: Autoscaling) -> bool:
    return autoscaling.min_replicas == 0


def scale_to_zero_refusal(spec: InferenceServerSpec) -> AutoscalingError | None:
    """Why a pool may not scale to zero through the shared interceptor (the CRD's CEL rules say the same; this
    holds for objects an older CRD admitted): without a token anyone who reaches the interceptor reaches the
    pool, and the interceptor cannot speak TLS to it."""
    auth = spec.auth or Auth()
    if auth.tls:
        return AutoscalingError(
            "ScaleToZeroNeedsPlainText",
            "minReplicas 0 cannot be used with auth.tls: KEDA's HTTP add-on interceptor speaks plain HTTP and h2c "
            "to the pool; use minReplicas 1 or more, or terminate TLS in front of the interceptor",
        )
    if not auth.token_secret:
        return AutoscalingError(
            "ScaleToZeroNeedsToken",
            "minReplicas 0 needs auth.tokenSecret: requests come through KEDA's shared HTTP add-on interceptor, "
            "which any pod that reaches it can call, so the pool's own token must keep other callers out",
        )
    return None


def route_hosts(namespace: str, name: str, autoscaling: Autoscaling) -> list[str]:
    """Host names the interceptor routes to the pool: ``scaleToZero.hosts``, then the Service's DNS names."""
    extra = autoscaling.scale_to_zero.hosts if autoscaling.scale_to_zero else ()
    own = [f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
    return list(dict.fromkeys([*extra, *own]))


def route_names(name: str) -> dict[str, str]:
    """Service port → the InterceptorRoute that reaches it."""
    return {"http": f"{name}-http", "grpc": f"{name}-grpc"}


def interceptor_routes(
    body: Mapping[str, Any], hosts: list[str] | None = None, spec: InferenceServerSpec | None = None
) -> list[dict[str, Any]]:
    """The add-on's routes to the pool's HTTP and gRPC ports (gRPC by its path prefix, under the same hosts);
    ``hosts`` are the names the pool may have (``checked_hosts``), default all it asks for; ``spec``: the body's,
    typed (parsed here when the caller does not hold it)."""
    meta, autoscaling = body["metadata"], _autoscaling(spec or InferenceServerSpec.from_body(body))
    ns, name = meta["namespace"], meta["name"]
    if hosts is None:
        hosts = route_hosts(ns, name, autoscaling)
    per_replica = (autoscaling.scale_to_zero or ScaleToZero()).concurrency_per_replica
    routes = []
    for port, route in route_names(name).items():
        rule: dict[str, Any] = {"hosts": hosts}
        if port == "grpc":
            rule["paths"] = [{"value": GRPC_PATH}]
        routes.append(
            {
                "apiVersion": HTTP_API_VERSION,
                "kind": "InterceptorRoute",
                "metadata": {
                    "name": route,
                    "namespace": ns,
                    "labels": manifests.labels(name),
                    "ownerReferences": [manifests.owner_reference(body)],
                },
                "spec": {
                    "target": {"service": name, "portName": port},
                    "rules": [rule],
                    "scalingMetric": {"concurrency": {"targetValue": per_replica}},
                },
            }
        )
    return routes


def http_triggers(name: str, scaler_address: str) -> list[dict[str, Any]]:
    """One ``external-push`` trigger per route: the add-on's scaler reports its in-flight requests."""
    return [
        {
            "type": "external-push",
            "name": f"{port}-requests",
            "metadata": {"scalerAddress": scaler_address, "interceptorRoute": route},
        }
        for port, route in route_names(name).items()
    ]


def scaled_object(
    body: Mapping[str, Any],
    server_address: str,
    scaler_address: str | None = None,
    spec: InferenceServerSpec | None = None,
) -> dict[str, Any]:
    """The ScaledObject; ``scaler_address``: the HTTP add-on's external scaler (needed for minReplicas 0);
    ``spec``: the body's, typed (parsed here when the caller does not hold it)."""
    meta = body["metadata"]
    spec = spec or InferenceServerSpec.from_body(body)
    autoscaling = _autoscaling(spec)
    hpa_config: dict[str, Any] = {"name": keda_hpa_name(meta["name"])}
    if autoscaling.behavior:
        hpa_config["behavior"] = dict(autoscaling.behavior)
    triggers = [keda_trigger(meta["namespace"], meta["name"], spec, server_address)]
    zero: dict[str, Any] = {}
    if scales_to_zero(autoscaling):
        if not scaler_address:
            raise AutoscalingError("NoHTTPScaler", "minReplicas 0 needs the HTTP add-on's external scaler address")
        triggers += http_triggers(meta["name"], scaler_address)
        zero["cooldownPeriod"] = (autoscaling.scale_to_zero or ScaleToZero()).idle_seconds
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": manifests.labels(meta["name"]),
            # KEDA copies the ScaledObject's labels onto its HPA; that HPA is KEDA's, not ours
            "annotations": {"scaledobject.keda.sh/hpa-excluded-labels": "app.kubernetes.io/managed-by"},
            "ownerReferences": [manifests.owner_reference(body)],
        },
        "spec": {
            "scaleTargetRef": {"apiVersion": API_VERSION, "kind": "InferenceServer", "name": meta["name"]},
            "minReplicaCount": autoscaling.min_replicas,
            "maxReplicaCount": autoscaling.max_replicas,
            "pollingInterval": autoscaling.polling_interval_seconds,
            **zero,
            "advanced": {"horizontalPodAutoscalerConfig": hpa_config},
            "triggers": triggers,
        },
    }


def keda_hpa_name(name: str) -> str:
    return f"keda-hpa-{name}"


def hpa_metrics(spec: InferenceServerSpec) -> list[dict[str, Any]]:
    """HPA mode: ``metrics`` verbatim, else the signal as the metric an adapter serves."""
    autoscaling = _autoscaling(spec)
    if autoscaling.metrics:
        return [dict(m) for m in autoscaling.metrics]
    metric, signal, value = target(autoscaling)
    if metric == "CPU":
        return [
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": int(value)}},
            }
        ]
    if metric == "GPU":
        value = value / 100  # nv_gpu_utilization is a 0-1 fraction
    return [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": signal.hpa_metric},
                "target": {"type": "AverageValue", "averageValue": _number(value)},
            },
        }
    ]


def hpa(body: Mapping[str, Any], spec: InferenceServerSpec | None = None) -> dict[str, Any]:
    """The plain HPA; ``spec``: the body's, typed (parsed here when the caller does not hold it)."""
    meta = body["metadata"]
    spec = spec or InferenceServerSpec.from_body(body)
    autoscaling = _autoscaling(spec)
    hpa_spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": API_VERSION, "kind": "InferenceServer", "name": meta["name"]},
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": hpa_metrics(spec),
    }
    if autoscaling.behavior:
        hpa_spec["behavior"] = dict(autoscaling.behavior)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": manifests.metadata(body),
        "spec": hpa_spec,
    }


def hpa_observation(hpa_obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """currentReplicas, desiredReplicas, lastScaleTime and the metric values the HPA last saw."""
    if not hpa_obj:
        return {}
    st = hpa_obj.get("status") or {}
    out: dict[str, Any] = {
        "currentReplicas": st.get("currentReplicas", 0),
        "desiredReplicas": st.get("desiredReplicas", 0),
    }
    if st.get("lastScaleTime"):
        out["lastScaleTime"] = st["lastScaleTime"]
    values = []
    for m in st.get("currentMetrics") or ():
        kind = m.get("type", "")
        cur = (m.get(kind[:1].lower() + kind[1:]) or {}).get("current") or {}
        for key in ("averageValue", "value", "averageUtilization"):
            if key in cur:
                values.append(str(cur[key]))
                break
    if values:
        out["currentMetricValues"] = values
    cond = next((x for x in st.get("conditions") or () if x.get("type") == "ScalingActive"), None)
    if cond and cond.get("status") != "True":
        out["scalingActive"] = f"{cond.get('reason')}: {cond.get('message')}"
    return out


class Autoscaler:
    """Creates, switches and deletes the autoscaling object of each InferenceServer; reports on it."""

    def __init__(
        self,
        kube: Any,
        prometheus_url: str | None = None,
        discovery_ttl: float = 30.0,
        http_scaler_address: str = DEFAULT_SCALER_ADDRESS,
        route_domains: RouteDomains | None = None,
    ) -> None:
        self.kube = kube
        self.route_domains = route_domains or RouteDomains()
        self.prometheus_url = prometheus_url
        self.http_scaler_address = http_scaler_address
        self._ttl = discovery_ttl
        self._served: dict[str, tuple[float, bool]] = {}
        self._guard = threading.Lock()

    def _resource_served(self, group: str, version: str, plural: str) -> bool:
        """Discovery, remembered for ``discovery_ttl`` seconds."""
        key = f"{plural}.{group}/{version}"
        with self._guard:
            seen = self._served.get(key)
            if seen and time.monotonic() - seen[0] < self._ttl:
                return seen[1]
        served: bool = self.kube.resource_served(group, version, plural)
        with self._guard:
            self._served[key] = (time.monotonic(), served)
        return served

    def keda_installed(self) -> bool:
        return self._resource_served(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS)

    def http_addon_installed(self) -> bool:
        return self._resource_served(HTTP_GROUP, HTTP_VERSION, ROUTES)

    def choose(self, autoscaling: Autoscaling) -> str:
        """KEDA, HPA, or raises AutoscalingError saying why neither can be used."""
        wanted = autoscaling.autoscaler
        if wanted == "HPA":
            return "HPA"
        if self.keda_installed():
            return "KEDA"
        if wanted == "KEDA":
            raise AutoscalingError(
                "KEDANotInstalled",
                "autoscaler KEDA: this cluster does not serve keda.sh/v1alpha1 ScaledObjects; install KEDA",
            )
        raise AutoscalingError(
            "NoMetricsAdapter",
            "KEDA is not installed, so nothing would serve the autoscaling metric: install KEDA, or set "
            "spec.autoscaling.autoscaler: HPA if your cluster serves the metric through an adapter of its own",
        )

    def reconcile(
        self, body: Mapping[str, Any], spec: InferenceServerSpec | None = None
    ) -> tuple[list[status.Condition], dict[str, Any] | None]:
        """Apply or remove the autoscaling objects; return the conditions (AutoscalingReady, and ScaleToZero
        when minReplicas is 0) and ``status.autoscaling``. ``spec``: the body's, typed (the controller parses
        it once per reconcile; parsed here when not given)."""
        meta = body["metadata"]
        spec = spec or InferenceServerSpec.from_body(body)
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        autoscaling = spec.autoscaling
        if autoscaling is None:
            self._remove(ns, name, uid, keep=None)
            return [], None
        zero = scales_to_zero(autoscaling)
        routes: list[dict[str, Any]] = []
        host_problems: list[tuple[str, str]] = []
        try:
            mode = self.choose(autoscaling)
            refusal = scale_to_zero_refusal(spec) if zero else None
            if refusal is not None:
                raise refusal
            if zero and mode != "KEDA":
                raise AutoscalingError(
                    "ScaleToZeroNeedsKEDA", "minReplicas 0 needs KEDA and its HTTP add-on: an HPA never scales to zero"
                )
            if zero and not self.http_addon_installed():
                raise AutoscalingError(
                    "HTTPAddonNotInstalled",
                    "minReplicas 0: this cluster does not serve http.keda.sh/v1beta1 InterceptorRoutes; install "
                    "KEDA's HTTP add-on (v0.15 or later), or set minReplicas to 1 or more",
                )
            if mode == "KEDA":
                address = (autoscaling.prometheus or Prometheus()).server_address or self.prometheus_url
                if not address:
                    raise AutoscalingError(
                        "NoPrometheus",
                        "KEDA needs a Prometheus to query: set spec.autoscaling.prometheus.serverAddress "
                        "or the operator's --prometheus-url (chart value keda.prometheusAddress)",
                    )
                obj = scaled_object(body, address, self.http_scaler_address if zero else None, spec)
                if zero:
                    hosts, host_problems = self.checked_hosts(body, spec)
                    routes = interceptor_routes(body, hosts, spec)
            else:
                obj = hpa(body, spec)
        except AutoscalingError as exc:
            self._remove(ns, name, uid, keep=None)
            return self._refused(zero, exc.reason, exc.message)
        try:
            for route in routes:  # before the ScaledObject whose triggers name them
                self.kube.apply(route)
            self.kube.apply(obj)
        except ApiException as exc:
            if exc.status == 403 and mode == "KEDA":
                what = "InterceptorRoutes (keda.httpAddon.enabled=true)" if routes else "ScaledObjects"
                msg = (
                    f"the operator may not manage KEDA {what} (forbidden): install the chart with "
                    "keda.enabled=true" + (" and keda.httpAddon.enabled=true" if routes else "")
                    + ", or set spec.autoscaling.autoscaler: HPA"
                )  # fmt: skip
                return self._refused(zero, "Forbidden", msg)
            if exc.status == 422 or exc.status == 400:
                return self._refused(zero, "Invalid", f"the API server refused an object: {exc.body or exc.reason}")
            raise
        self._remove(ns, name, uid, keep=mode, keep_routes=bool(routes))
        return self._observe(ns, name, mode, obj, routes, host_problems)

    def checked_hosts(
        self, body: Mapping[str, Any], spec: InferenceServerSpec | None = None
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """The host names the pool's routes get, and why each name it asked for and does not get was left out:
        a name its namespace may not route (``route_hosts.refusal``), or one another route already claims."""
        meta, autoscaling = body["metadata"], _autoscaling(spec or InferenceServerSpec.from_body(body))
        ns, name = meta["namespace"], meta["name"]
        domains = self.route_domains.domains(ns)
        problems: list[tuple[str, str]] = []  # (condition reason, message)
        wanted: list[str] = []
        for host in route_hosts(ns, name, autoscaling):
            why = route_hosts_rules.refusal(ns, host, domains)
            if why is None:
                wanted.append(route_hosts_rules.normal(host))
            else:
                problems.append(("HostRefused", f"host {why}"))
        taken = route_hosts_rules.claimed_elsewhere(self._routes_around(ns), meta["uid"])
        hosts = []
        for host in dict.fromkeys(wanted):
            if host in taken:
                problems.append(("HostConflict", f"host '{host}' is already routed by InterceptorRoute {taken[host]}"))
            else:
                hosts.append(host)
        if not hosts:
            why = "; ".join(text for _, text in problems)
            raise AutoscalingError("HostConflict", f"no host name is left to route to the pool: {why}")
        return hosts, problems

    def _routes_around(self, namespace: str) -> list[dict[str, Any]]:
        """Every InterceptorRoute the operator may list: cluster-wide, else (a namespaced install) its namespace's."""
        try:
            return list(self.kube.list_custom(HTTP_GROUP, HTTP_VERSION, ROUTES, None))
        except ApiException as exc:
            if exc.status != 403:
                raise
        return list(self.kube.list_custom(HTTP_GROUP, HTTP_VERSION, ROUTES, namespace))

    @staticmethod
    def _refused(zero: bool, reason: str, message: str) -> tuple[list[status.Condition], dict[str, Any]]:
        conds = [status.Condition(CONDITION, False, reason, message)]
        if zero:
            conds.append(status.Condition(SCALE_TO_ZERO, False, reason, message))
        return conds, {"autoscaler": "None"}

    def _remove(self, ns: str, name: str, uid: str, keep: str | None, keep_routes: bool = False) -> None:
        """Delete the autoscaling objects this server owns, except the kind ``keep`` (and its routes)."""
        if keep != "HPA" and self.kube.hpa_owned_by(ns, name, uid):
            self.kube.delete_hpa(ns, name)
        if not keep_routes and self.http_addon_installed():
            for route in route_names(name).values():
                self._delete_owned(HTTP_GROUP, HTTP_VERSION, ROUTES, ns, route, uid)
        if keep == "KEDA" or not self.keda_installed():
            return
        self._delete_owned(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, name, uid)

    def _delete_owned(self, group: str, version: str, plural: str, ns: str, name: str, uid: str) -> None:
        try:
            obj = self.kube.get_custom(group, version, plural, ns, name)
        except ApiException as exc:
            if exc.status == 403:  # no rights on them: the operator cannot have made one
                return
            raise
        if obj and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
            self.kube.delete_custom(group, version, plural, ns, name)

    def _observe(
        self,
        ns: str,
        name: str,
        mode: str,
        obj: Mapping[str, Any],
        routes: list[dict[str, Any]],
        host_problems: list[tuple[str, str]] | None = None,
    ) -> tuple[list[status.Condition], dict[str, Any]]:
        hpa_name = keda_hpa_name(name) if mode == "KEDA" else name
        report: dict[str, Any] = {
            "autoscaler": mode,
            "kind": obj["kind"],
            "name": name,
            "hpa": hpa_name,
            **hpa_observation(self.kube.read_hpa(ns, hpa_name)),
        }
        if mode == "KEDA":
            trigger = obj["spec"]["triggers"][0]
            report["query"] = trigger["metadata"]["query"]
            report["threshold"] = trigger["metadata"]["threshold"]
            zero = self._observe_routes(ns, routes, obj, report, host_problems or []) if routes else []
            live = self.kube.get_custom(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, name) or {}
            ready = _ready(live)
            if ready is None or ready.get("status") != "True":
                why = (ready or {}).get("message") or "KEDA has not reconciled the ScaledObject yet"
                return [status.Condition(CONDITION, False, "ScaledObjectNotReady", why), *zero], report
            how = f"KEDA scales through HPA {hpa_name}" + (" and to zero when idle" if routes else "")
            return [status.Condition(CONDITION, True, "ScaledObjectReady", how), *zero], report
        if "scalingActive" in report:
            return [status.Condition(CONDITION, False, "MetricUnavailable", report["scalingActive"])], report
        return [status.Condition(CONDITION, True, "HPAReady", f"HPA {hpa_name} scales the pool")], report

    def _observe_routes(
        self,
        ns: str,
        routes: list[dict[str, Any]],
        obj: Mapping[str, Any],
        report: dict[str, Any],
        host_problems: list[tuple[str, str]],
    ) -> list[status.Condition]:
        """``status.autoscaling.scaleToZero`` and the ScaleToZero condition: in force once the add-on's
        operator has reconciled both routes (their Ready condition); False while a host name the pool asks for
        is refused or taken (the other names are routed all the same)."""
        hosts = routes[0]["spec"]["rules"][0]["hosts"]
        names = [r["metadata"]["name"] for r in routes]
        report["scaleToZero"] = {
            "routes": names,
            "hosts": hosts,
            "idleSeconds": obj["spec"]["cooldownPeriod"],
            "scalerAddress": self.http_scaler_address,
        }
        if host_problems:
            reason = "HostConflict" if any(r == "HostConflict" for r, _ in host_problems) else "HostRefused"
            return [status.Condition(SCALE_TO_ZERO, False, reason, "; ".join(text for _, text in host_problems))]
        for route in names:
            live = self.kube.get_custom(HTTP_GROUP, HTTP_VERSION, ROUTES, ns, route) or {}
            ready = _ready(live)
            if ready is None or ready.get("status") != "True":
                why = (ready or {}).get("message") or "the HTTP add-on's operator has not reconciled it yet"
                return [status.Condition(SCALE_TO_ZERO, False, "RouteNotReady", f"InterceptorRoute {route}: {why}")]
        ports = ", ".join(f"{r['metadata']['name']} → port {r['spec']['target']['portName']}" for r in routes)
        msg = (
            f"after {obj['spec']['cooldownPeriod']}s without requests the pool scales to zero; requests through "
            f"KEDA's HTTP add-on interceptor for host {hosts[0]} wake it ({ports})"
        )
        return [status.Condition(SCALE_TO_ZERO, True, "InterceptorRoutesReady", msg)]


def _ready(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((x for x in (obj.get("status") or {}).get("conditions") or () if x.get("type") == "Ready"), None)
