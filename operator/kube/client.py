"""The few Kubernetes API calls the operator makes (kopf watches; this module writes).

Owned objects are written with server-side apply under one field manager (``force``), so a user's
edit to a field the operator manages is put back on the next reconcile, while fields the operator
does not manage are left alone.

Every call has a timeout and is retried with exponential backoff (0.2 s doubling to 5 s, for up to
``retry_seconds``) when the API server is unreachable, restarting (connection refused/reset, 5xx),
throttling (429) or reports a conflict (409): a kube-apiserver restart in the middle of a reconcile
delays it instead of failing it. Spec errors (other 4xx) are raised at once.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar, cast

import kubernetes
import orjson
import urllib3
from kubernetes.client import (
    ApiClient,
    AppsV1Api,
    AutoscalingV2Api,
    CoreV1Api,
    CustomObjectsApi,
    DiscoveryV1Api,
    NetworkingV1Api,
)
from kubernetes.client.exceptions import ApiException

from ..api import GROUP, VERSION
from . import lean_writes

FIELD_MANAGER = "kubeinfer-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
MODELS = "inferencemodels"
SERVERS = "inferenceservers"
#: kinds of other projects' custom resources the operator applies → their plural
CUSTOM_KINDS = {"ScaledObject": "scaledobjects", "InterceptorRoute": "interceptorroutes"}
#: (connect, read) seconds for one API request
REQUEST_TIMEOUT = (5.0, 30.0)
TIMEOUT: dict[str, Any] = {"_request_timeout": REQUEST_TIMEOUT}
log = logging.getLogger("kubeinfer.operator.kube.client")
F = TypeVar("F", bound=Callable[..., Any])


def load_config(kubeconfig: str | None, connections: int | None = None) -> None:
    """In-cluster service account when there is one and no kubeconfig is given, else the kubeconfig.

    ``connections``: the API connections kept open, at least one per thread that calls the API at once (the
    client's default is 5 per CPU: with fewer, each call over it opens, and pays a TLS handshake for, a
    connection of its own that is thrown away afterwards).
    """
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it too
        kubernetes.config.load_kube_config(config_file=kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config()
    else:
        kubernetes.config.load_kube_config()
    if connections:
        config = kubernetes.client.Configuration.get_default_copy()
        config.connection_pool_maxsize = max(config.connection_pool_maxsize or 0, connections)
        kubernetes.client.Configuration.set_default(config)


def is_temporary(exc: ApiException) -> bool:
    """Conflicts, throttling and server-side failures are worth a retry; 4xx spec errors are not."""
    return exc.status in (409, 429) or (exc.status or 0) >= 500 or exc.status == 0


def transient(exc: BaseException) -> bool:
    """An error that a retry of the same request may not see (the API server restarting, a conflict)."""
    if isinstance(exc, ApiException):
        return is_temporary(exc)
    return isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError))


def retried(fn: F) -> F:
    """Retry a ``Kube`` method on transient errors, with backoff, for up to ``self.retry_seconds``."""

    @functools.wraps(fn)
    def call(self: Kube, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.2
        while True:
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                if not transient(exc) or time.monotonic() + delay > deadline or self.stop.is_set():
                    raise
                what = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__
                self.retries += 1
                log.info("%s: %s; retrying in %.1fs", fn.__name__, what, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, 5.0)

    return cast(F, call)


class Kube:
    def __init__(self, api_client: ApiClient | None = None, retry_seconds: float = 60.0) -> None:
        self.client = api_client or ApiClient()
        self.retry_seconds = retry_seconds
        #: set on shutdown: no more waiting between retries
        self.stop = threading.Event()
        self.retries = 0
        self.core = CoreV1Api(self.client)
        self.apps = AppsV1Api(self.client)
        self.autoscaling = AutoscalingV2Api(self.client)
        self.custom = CustomObjectsApi(self.client)
        self.discovery = DiscoveryV1Api(self.client)
        self.networking = NetworkingV1Api(self.client)

    # ------------------------------------------------------------------------------ owned objects
    @retried
    def apply(self, manifest: Mapping[str, Any]) -> Any:
        kind, body = manifest["kind"], dict(manifest)
        name, ns = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        if kind in CUSTOM_KINDS:
            group, version = manifest["apiVersion"].split("/")
            return self.custom.patch_namespaced_custom_object(
                group, version, ns, CUSTOM_KINDS[kind], name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type=APPLY, **TIMEOUT,
            )  # fmt: skip
        patch = {
            "Deployment": self.apps.patch_namespaced_deployment,
            "Service": self.core.patch_namespaced_service,
            "HorizontalPodAutoscaler": self.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
        }.get(kind)
        if patch is None:
            raise ValueError(f"cannot apply {kind}")
        return patch(name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, **TIMEOUT)

    @retried
    def delete_hpa(self, namespace: str, name: str) -> bool:
        try:
            self.autoscaling.delete_namespaced_horizontal_pod_autoscaler(name, namespace, **TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    @retried
    def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete a NetworkPolicy the operator made for ``owner_uid`` (switched off in the spec); another's
        object of the same name is left alone."""
        if kind != "NetworkPolicy":
            raise ValueError(f"cannot delete {kind}")
        try:
            found = self.networking.read_namespaced_network_policy(name, namespace, **TIMEOUT)
            refs = (found.metadata.owner_references if found.metadata else None) or ()
            if not any(ref.uid == owner_uid for ref in refs):
                return False
            self.networking.delete_namespaced_network_policy(name, namespace, **TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def hpa_owned_by(self, namespace: str, name: str, uid: str) -> bool:
        hpa = self.read_hpa(namespace, name)
        return hpa is not None and any(ref.get("uid") == uid for ref in hpa["metadata"].get("ownerReferences") or ())

    @retried
    def read_hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The HPA as plain JSON (camelCase, like every other object the operator reads), or None."""
        try:
            hpa = self.autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace, **TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], self.client.sanitize_for_serialization(hpa))

    @retried
    def resource_served(self, group: str, version: str, plural: str) -> bool:
        """Whether the API serves ``group/version`` ``plural`` (discovery: no RBAC needed)."""
        try:
            listing = self.custom.get_api_resources(group, version, **TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.name == plural for r in listing.resources or ())

    @retried
    def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(group, version, namespace, plural, name, **TIMEOUT),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    @retried
    def list_custom(self, group: str, version: str, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        """Every object of a custom resource in ``namespace``, or in the whole cluster (None)."""
        if namespace is None:
            listing = self.custom.list_cluster_custom_object(group, version, plural, **TIMEOUT)
        else:
            listing = self.custom.list_namespaced_custom_object(group, version, namespace, plural, **TIMEOUT)
        return list(cast(dict[str, Any], listing)["items"])

    @retried
    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name, **TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # ----------------------------------------------------------------------------- custom objects
    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_custom(GROUP, VERSION, plural, namespace, name)

    @retried
    def list_in(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        listing = cast(
            dict[str, Any], self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **TIMEOUT)
        )
        return list(listing["items"])

    def list_all(self, plural: str, namespaces: list[str]) -> list[dict[str, Any]]:
        """Objects in the given namespaces, or cluster-wide when none are given."""
        if namespaces:
            return [item for ns in namespaces for item in self.list_in(plural, ns)]
        listing = cast(dict[str, Any], self._list_cluster(plural))
        return list(listing["items"])

    @retried
    def list_models(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """Every InferenceModel (of ``namespace``, or of the cluster), and the resourceVersion to watch from."""
        listing = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, MODELS, **TIMEOUT)
            if namespace
            else self.custom.list_cluster_custom_object(GROUP, VERSION, MODELS, **TIMEOUT),
        )
        return list(listing["items"]), str(listing["metadata"]["resourceVersion"])

    def watch_models(
        self, namespace: str | None, resource_version: str, timeout: int = 300
    ) -> Iterator[dict[str, Any]]:
        """The watch events of InferenceModels from ``resource_version`` (dicts with ``type`` and ``object``, each
        decoded once), until the API server ends the stream (after ``timeout`` seconds)."""
        kwargs: dict[str, Any] = dict(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            _preload_content=False,
            _request_timeout=(5.0, timeout + 60.0),
        )
        response: Any = (
            self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, MODELS, **kwargs)
            if namespace
            else self.custom.list_cluster_custom_object(GROUP, VERSION, MODELS, **kwargs)
        )
        try:
            rest = b""
            for chunk in response.stream(amt=None, decode_content=False):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line.strip():
                        yield orjson.loads(line)
        finally:
            response.release_conn()

    def set_finalizers(self, namespace: str, name: str, finalizers: list[str], resource_version: str) -> bool:
        """Replace an InferenceModel's finalizers, if it is still at ``resource_version``; False when it changed
        meanwhile (409: try again with the newer object) or is gone."""
        return self._set_finalizers(namespace, name, finalizers, resource_version)

    @retried
    def _set_finalizers(self, namespace: str, name: str, finalizers: list[str], resource_version: str) -> bool:
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": resource_version}}
        try:
            lean_writes.send(self.client, "PATCH", _custom_path(namespace, MODELS, name), body, MERGE, REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status in (404, 409):  # gone, or changed since: not retried here
                return False
            raise
        return True

    @retried
    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{lean_writes.segment(namespace)}/events"
        lean_writes.send(self.client, "POST", path, event, lean_writes.JSON, REQUEST_TIMEOUT)

    @retried
    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            # the object the API answers with is not needed: read, not decoded (the bulk of a status write's CPU)
            path = _custom_path(namespace, plural, name) + "/status"
            lean_writes.send(self.client, "PATCH", path, {"status": status}, MERGE, REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise

    @retried
    def _list_cluster(self, plural: str) -> Any:
        return self.custom.list_cluster_custom_object(GROUP, VERSION, plural, **TIMEOUT)

    # ------------------------------------------------------------------------------ core objects
    @retried
    def read_core(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A PersistentVolumeClaim, PersistentVolume or Secret as a plain dict (API field names); None if absent."""
        read = {
            "PersistentVolumeClaim": self.core.read_namespaced_persistent_volume_claim,
            "Secret": self.core.read_namespaced_secret,
        }.get(kind)
        obj: Any
        try:
            if kind == "PersistentVolume":
                obj = self.core.read_persistent_volume(name, **TIMEOUT)
            elif read is not None and namespace:
                obj = read(name, namespace, **TIMEOUT)
            else:
                raise ValueError(f"cannot read {kind}")
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], self.client.sanitize_for_serialization(obj))

    @retried
    def create_core(self, manifest: Mapping[str, Any]) -> None:
        """Create a PersistentVolume or PersistentVolumeClaim (made once, never patched: their specs are
        immutable once bound); one that exists already is left as it is."""
        kind, ns = manifest["kind"], manifest["metadata"].get("namespace")
        try:
            if kind == "PersistentVolume":
                body: Any = dict(manifest)  # the client serializes plain dicts as they are
                self.core.create_persistent_volume(body, field_manager=FIELD_MANAGER, **TIMEOUT)
            elif kind == "PersistentVolumeClaim" and ns:
                claim: Any = dict(manifest)
                self.core.create_namespaced_persistent_volume_claim(ns, claim, field_manager=FIELD_MANAGER, **TIMEOUT)
            else:
                raise ValueError(f"cannot create {kind}")
        except ApiException as exc:
            if exc.status != 409 or "AlreadyExists" not in str(exc.body):
                raise

    @retried
    def delete_core(self, kind: str, name: str) -> None:
        """Delete a PersistentVolume (the operator's own, Released); absent is fine."""
        if kind != "PersistentVolume":
            raise ValueError(f"cannot delete {kind}")
        try:
            self.core.delete_persistent_volume(name, **TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def server_slices(self, namespaces: list[str]) -> list[dict[str, Any]]:
        """The EndpointSlices of the Services of InferenceServers (the operator's label), in the given namespaces
        or cluster-wide."""
        scopes: list[str | None] = list(namespaces) or [None]
        return [s for ns in scopes for s in self._server_slices(ns)]

    @retried
    def _server_slices(self, namespace: str | None) -> list[dict[str, Any]]:
        selector = "serving.kubeinfer.io/server"
        listing = (
            self.discovery.list_namespaced_endpoint_slice(namespace, label_selector=selector, **TIMEOUT)
            if namespace
            else self.discovery.list_endpoint_slice_for_all_namespaces(label_selector=selector, **TIMEOUT)
        )
        listing = self.client.sanitize_for_serialization(listing)
        return list(cast(dict[str, Any], listing).get("items") or [])

    @retried
    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of ``namespace`` that match the label ``selector`` (an InferenceServer's pool)."""
        listing = self.core.list_namespaced_pod(namespace, label_selector=selector, **TIMEOUT)
        listing = self.client.sanitize_for_serialization(listing)
        return list(cast(dict[str, Any], listing).get("items") or [])

    @retried
    def deployments(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The Deployment named ``name`` in ``namespace`` as a list of none or one (``list`` needs no ``get``)."""
        listing = self.apps.list_namespaced_deployment(namespace, field_selector=f"metadata.name={name}", **TIMEOUT)
        listing = self.client.sanitize_for_serialization(listing)
        return list(cast(dict[str, Any], listing).get("items") or [])

    @retried
    def replica_sets(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The ReplicaSets of ``namespace`` that match the label ``selector`` (an InferenceServer's pool)."""
        listing = self.apps.list_namespaced_replica_set(namespace, label_selector=selector, **TIMEOUT)
        listing = self.client.sanitize_for_serialization(listing)
        return list(cast(dict[str, Any], listing).get("items") or [])

    @retried
    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """The EndpointSlices of a Service (label kubernetes.io/service-name)."""
        listing = self.discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}", **TIMEOUT
        )
        listing = self.client.sanitize_for_serialization(listing)
        return list(cast(dict[str, Any], listing).get("items") or [])


def _custom_path(namespace: str, plural: str, name: str) -> str:
    """The path of one of our custom objects (``plural``: inferencemodels, inferenceservers)."""
    seg = lean_writes.segment
    return f"/apis/{GROUP}/{VERSION}/namespaces/{seg(namespace)}/{plural}/{seg(name)}"
