"""The few Kubernetes API calls the operator makes (kopf watches; this module writes).

Owned objects are written with server-side apply under one field manager (``force``), so a user's
edit to a field the operator manages is put back on the next reconcile, while fields the operator
does not manage are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, cast

import kubernetes
from kubernetes.client import ApiClient, AppsV1Api, AutoscalingV2Api, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from .api import GROUP, VERSION

FIELD_MANAGER = "kubeinfer-operator"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
MODELS = "inferencemodels"
SERVERS = "inferenceservers"
#: kinds of other projects' custom resources the operator applies → their plural
CUSTOM_KINDS = {"ScaledObject": "scaledobjects"}


def load_config(kubeconfig: str | None) -> None:
    """In-cluster service account when there is one and no kubeconfig is given, else the kubeconfig."""
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # kopf's own login reads it too
        kubernetes.config.load_kube_config(config_file=kubeconfig)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config()
    else:
        kubernetes.config.load_kube_config()


def is_temporary(exc: ApiException) -> bool:
    """Conflicts, throttling and server-side failures are worth a retry; 4xx spec errors are not."""
    return exc.status in (409, 429) or (exc.status or 0) >= 500 or exc.status == 0


class Kube:
    def __init__(self, api_client: ApiClient | None = None) -> None:
        self.client = api_client or ApiClient()
        self.core = CoreV1Api(self.client)
        self.apps = AppsV1Api(self.client)
        self.autoscaling = AutoscalingV2Api(self.client)
        self.custom = CustomObjectsApi(self.client)

    # ------------------------------------------------------------------------------ owned objects
    def apply(self, manifest: Mapping[str, Any]) -> Any:
        kind, body = manifest["kind"], dict(manifest)
        name, ns = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        if kind in CUSTOM_KINDS:
            group, version = manifest["apiVersion"].split("/")
            return self.custom.patch_namespaced_custom_object(
                group, version, ns, CUSTOM_KINDS[kind], name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type=APPLY,
            )  # fmt: skip
        patch = {
            "Deployment": self.apps.patch_namespaced_deployment,
            "Service": self.core.patch_namespaced_service,
            "HorizontalPodAutoscaler": self.autoscaling.patch_namespaced_horizontal_pod_autoscaler,
        }.get(kind)
        if patch is None:
            raise ValueError(f"cannot apply {kind}")
        return patch(name, ns, body, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY)

    def delete_hpa(self, namespace: str, name: str) -> bool:
        try:
            self.autoscaling.delete_namespaced_horizontal_pod_autoscaler(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def hpa_owned_by(self, namespace: str, name: str, uid: str) -> bool:
        hpa = self.read_hpa(namespace, name)
        return hpa is not None and any(ref.get("uid") == uid for ref in hpa["metadata"].get("ownerReferences") or ())

    def read_hpa(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The HPA as plain JSON (camelCase, like every other object the operator reads), or None."""
        try:
            hpa = self.autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], self.client.sanitize_for_serialization(hpa))

    def resource_served(self, group: str, version: str, plural: str) -> bool:
        """Whether the API serves ``group/version`` ``plural`` (discovery: no RBAC needed)."""
        try:
            listing = self.custom.get_api_resources(group, version)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.name == plural for r in listing.resources or ())

    def get_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any], self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def delete_custom(self, group: str, version: str, plural: str, namespace: str, name: str) -> bool:
        try:
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # ----------------------------------------------------------------------------- custom objects
    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get_custom(GROUP, VERSION, plural, namespace, name)

    def list_in(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        listing = cast(dict[str, Any], self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural))
        return list(listing["items"])

    def list_all(self, plural: str, namespaces: list[str]) -> list[dict[str, Any]]:
        """Objects in the given namespaces, or cluster-wide when none are given."""
        if namespaces:
            return [item for ns in namespaces for item in self.list_in(plural, ns)]
        listing = cast(dict[str, Any], self.custom.list_cluster_custom_object(GROUP, VERSION, plural))
        return list(listing["items"])

    def patch_status(self, plural: str, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, {"status": dict(status)}, _content_type=MERGE
            )
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report on
                raise
