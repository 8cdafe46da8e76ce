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

from . import manifests, status
from .api import API_VERSION

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
SCALED_OBJECTS = "scaledobjects"
KEDA_API_VERSION = f"{KEDA_GROUP}/{KEDA_VERSION}"
DEFAULT_WINDOW = "1m"
DEFAULT_POLLING_SECONDS = 15
CONDITION = "AutoscalingReady"


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
DEFAULT_SIGNAL = "QueueDurationPerRequest"
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


def target(autoscaling: Mapping[str, Any]) -> tuple[str, Signal, Decimal]:
    t = autoscaling.get("target") or {}
    name = t.get("metric", DEFAULT_SIGNAL)
    signal = SIGNALS[name]
    value = quantity(t.get("value", signal.default))
    if value <= 0:
        raise AutoscalingError("InvalidTarget", f"autoscaling.target.value must be positive, got {value}")
    return name, signal, value


def pool_selector(namespace: str, name: str) -> str:
    return f'namespace="{namespace}",{_label(manifests.SERVER_LABEL)}="{name}"'


def _label(pod_label: str) -> str:
    """How Prometheus names a pod label (labelmap / podTargetLabels): non [a-zA-Z0-9_] → ``_``."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def cpu_request_cores(spec: Mapping[str, Any]) -> Decimal:
    resources = spec.get("resources") or {}
    cpu = (resources.get("requests") or {}).get("cpu") or (resources.get("limits") or {}).get("cpu")
    if cpu is None:
        raise AutoscalingError(
            "NoCPURequest",
            "autoscaling on CPU utilisation needs spec.resources.requests.cpu (utilisation is usage / request)",
        )
    return quantity(cpu)


def keda_trigger(namespace: str, name: str, spec: Mapping[str, Any], server_address: str) -> dict[str, Any]:
    """The Prometheus trigger: the signal's query (or ``prometheus.query``) and its threshold."""
    autoscaling = spec["autoscaling"]
    prom = autoscaling.get("prometheus") or {}
    metric, signal, value = target(autoscaling)
    sel = pool_selector(namespace, name)
    w = prom.get("window") or DEFAULT_WINDOW
    metric_type = signal.metric_type
    threshold = value
    if prom.get("query"):
        query = prom["query"]
        metric_type = prom.get("metricType", "AverageValue")
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


def scaled_object(body: Mapping[str, Any], server_address: str) -> dict[str, Any]:
    meta, spec = body["metadata"], body["spec"]
    autoscaling = spec["autoscaling"]
    hpa_config: dict[str, Any] = {"name": keda_hpa_name(meta["name"])}
    if autoscaling.get("behavior"):
        hpa_config["behavior"] = autoscaling["behavior"]
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
            "minReplicaCount": int(autoscaling.get("minReplicas", 1)),
            "maxReplicaCount": int(autoscaling["maxReplicas"]),
            "pollingInterval": int(autoscaling.get("pollingIntervalSeconds", DEFAULT_POLLING_SECONDS)),
            "advanced": {"horizontalPodAutoscalerConfig": hpa_config},
            "triggers": [keda_trigger(meta["namespace"], meta["name"], spec, server_address)],
        },
    }


def keda_hpa_name(name: str) -> str:
    return f"keda-hpa-{name}"


def hpa_metrics(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """HPA mode: ``metrics`` verbatim, else the signal as the metric an adapter serves."""
    autoscaling = spec["autoscaling"]
    if autoscaling.get("metrics"):
        return [dict(m) for m in autoscaling["metrics"]]
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


def hpa(body: Mapping[str, Any]) -> dict[str, Any]:
    meta, spec = body["metadata"], body["spec"]
    autoscaling = spec["autoscaling"]
    hpa_spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": API_VERSION, "kind": "InferenceServer", "name": meta["name"]},
        "minReplicas": int(autoscaling.get("minReplicas", 1)),
        "maxReplicas": int(autoscaling["maxReplicas"]),
        "metrics": hpa_metrics(spec),
    }
    if autoscaling.get("behavior"):
        hpa_spec["behavior"] = autoscaling["behavior"]
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

    def __init__(self, kube: Any, prometheus_url: str | None = None, discovery_ttl: float = 30.0) -> None:
        self.kube = kube
        self.prometheus_url = prometheus_url
        self._ttl = discovery_ttl
        self._keda: tuple[float, bool] | None = None
        self._guard = threading.Lock()

    def keda_installed(self) -> bool:
        with self._guard:
            if self._keda and time.monotonic() - self._keda[0] < self._ttl:
                return self._keda[1]
        served: bool = self.kube.resource_served(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS)
        with self._guard:
            self._keda = (time.monotonic(), served)
        return served

    def choose(self, autoscaling: Mapping[str, Any]) -> str:
        """KEDA, HPA, or raises AutoscalingError saying why neither can be used."""
        wanted = autoscaling.get("autoscaler", "Auto")
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

    def reconcile(self, body: Mapping[str, Any]) -> tuple[status.Condition | None, dict[str, Any] | None]:
        """Apply or remove the autoscaling object; return the condition and ``status.autoscaling``."""
        meta, spec = body["metadata"], body["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        autoscaling = spec.get("autoscaling")
        if not autoscaling:
            self._remove(ns, name, uid, keep=None)
            return None, None
        try:
            mode = self.choose(autoscaling)
            if mode == "KEDA":
                address = (autoscaling.get("prometheus") or {}).get("serverAddress") or self.prometheus_url
                if not address:
                    raise AutoscalingError(
                        "NoPrometheus",
                        "KEDA needs a Prometheus to query: set spec.autoscaling.prometheus.serverAddress "
                        "or the operator's --prometheus-url (chart value keda.prometheusAddress)",
                    )
                obj = scaled_object(body, address)
            else:
                obj = hpa(body)
        except AutoscalingError as exc:
            self._remove(ns, name, uid, keep=None)
            return status.Condition(CONDITION, False, exc.reason, exc.message), {"autoscaler": "None"}
        try:
            self.kube.apply(obj)
        except ApiException as exc:
            if exc.status == 403 and mode == "KEDA":
                msg = (
                    "the operator may not manage KEDA ScaledObjects (forbidden): install the chart with "
                    "keda.enabled=true, or set spec.autoscaling.autoscaler: HPA"
                )
                return status.Condition(CONDITION, False, "Forbidden", msg), {"autoscaler": "None"}
            if exc.status == 422 or exc.status == 400:
                msg = f"the API server refused the {obj['kind']}: {exc.body or exc.reason}"
                return status.Condition(CONDITION, False, "Invalid", msg), {"autoscaler": "None"}
            raise
        self._remove(ns, name, uid, keep=mode)
        return self._observe(ns, name, mode, obj)

    def _remove(self, ns: str, name: str, uid: str, keep: str | None) -> None:
        """Delete the autoscaling objects this server owns, except the kind ``keep``."""
        if keep != "HPA" and self.kube.hpa_owned_by(ns, name, uid):
            self.kube.delete_hpa(ns, name)
        if keep == "KEDA" or not self.keda_installed():
            return
        try:
            obj = self.kube.get_custom(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, name)
        except ApiException as exc:
            if exc.status == 403:  # no rights on ScaledObjects: the operator cannot have made one
                return
            raise
        if obj and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or ()):
            self.kube.delete_custom(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, name)

    def _observe(
        self, ns: str, name: str, mode: str, obj: Mapping[str, Any]
    ) -> tuple[status.Condition, dict[str, Any]]:
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
            live = self.kube.get_custom(KEDA_GROUP, KEDA_VERSION, SCALED_OBJECTS, ns, name) or {}
            ready = next((x for x in (live.get("status") or {}).get("conditions") or () if x["type"] == "Ready"), None)
            if ready is None or ready.get("status") != "True":
                why = (ready or {}).get("message") or "KEDA has not reconciled the ScaledObject yet"
                return status.Condition(CONDITION, False, "ScaledObjectNotReady", why), report
            return status.Condition(CONDITION, True, "ScaledObjectReady", f"KEDA scales through HPA {hpa_name}"), report
        if "scalingActive" in report:
            return status.Condition(CONDITION, False, "MetricUnavailable", report["scalingActive"]), report
        return status.Condition(CONDITION, True, "HPAReady", f"HPA {hpa_name} scales the pool"), report
