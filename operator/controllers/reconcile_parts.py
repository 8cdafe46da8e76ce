"""What the InferenceServer and InferenceModel controllers share: the clients and the volume, the records of
the models, the pools' folders and claims, their replicas, status writes and events.

Built once by the ``Reconciler`` (``reconciler.py``) and handed to the server controller
(``server_reconcile.py``) and the model controller (``model_reconcile.py``): they are given these parts,
they do not inherit them, so each holds only the state of its own job.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import kopf
from kubeinfer.server.sources.egress import AddressPolicy

from ..api import status
from ..kube.client import MODELS, Kube
from ..kube.events import EventPoster
from ..kube.lookup import Lookup
from ..replicas.indexes import Endpoint, IndexReader, endpoints_from_slices
from ..replicas.pool_pods import Members, PoolPods
from ..replicas.server_access import AccessBook
from ..servers.manifests import ServerSpec, repository_subpath, selector_string, typed_spec
from ..sources.fetch import Fetcher
from ..sources.quota import DownloadGate, NamespaceQuota
from ..volume.claims import ClaimCheck
from ..volume.repository_writer import RepositoryWriter
from ..volume.tenant_volumes import TenantVolumes
from .model_record import ModelRecords
from .settings import OperatorConfig

#: checks of models after a change that run at once (each may write a status: at 1,000 models rendered at
#: once, the time to Ready is that many status writes)
RECHECK_THREADS = 8
log = logging.getLogger("kubeinfer.operator")


class ReconcileParts:
    """The collaborators of both controllers, and the state they share (the models' records, the poster)."""

    def __init__(self, config: OperatorConfig, kube: Kube) -> None:
        self.config = config
        self.kube = kube
        self.writer = RepositoryWriter(
            config.repository_root,
            max_bytes=config.max_artifact_bytes,
            timeout=config.fetch_timeout,
            fetcher=Fetcher(
                AddressPolicy(config.allowed_networks, config.blocked_networks),
                config.allowed_hosts,
                timeout=config.fetch_timeout,
                deadline=config.fetch_deadline,
                proxy=config.fetch_proxy,
                ca_file=config.fetch_ca_file,
            ),
            check_timeout=config.onnx_check_timeout,
            ambient_s3_namespaces=config.ambient_s3_namespaces,
            ambient_gcs_namespaces=config.ambient_gcs_namespaces,
            ambient_azure_namespaces=config.ambient_azure_namespaces,
        )
        self.gate = DownloadGate(config.downloads_per_namespace, config.downloads_total)
        self.quota = NamespaceQuota(self.writer.root, config.namespace_quota_bytes, dict(config.namespace_quotas))
        self.reader = IndexReader(config.index_timeout)
        #: the pods each pool's endpoints must be (the operator talks to no other: ``pool_pods``)
        self.pool_pods = PoolPods(kube)
        self.claims = ClaimCheck(lambda *a: self.kube.read_core(*a), config.claim_name, config.claim_namespace)
        self.volumes = TenantVolumes(kube, self.claims, config.tenant_claim)
        self.access = AccessBook(lambda ns, name: self.kube.read_core("Secret", name, ns))
        self.lookup = Lookup(kube)
        #: what the operator keeps per InferenceModel, one record each (``model_record.py``)
        self.records = ModelRecords()
        #: uid -> the newest InferenceModel object seen (from its watch events, once ``records.attached``)
        self.models = self.records.bodies
        #: events about models (once started; before, kopf's event helpers, as in the unit tests)
        self.poster: EventPoster | None = None
        #: a kopf handler's context, for threads of our own that post events (set by the handlers)
        self.handler_context: contextvars.Context | None = None
        #: status patches written and skipped (unchanged), for the benchmark and the logs
        self.status_writes = 0
        self.status_skips = 0

    def endpoints(self, namespace: str, server: str, uid: str | None = None) -> tuple[list[Endpoint], str]:
        """The server's replicas: the endpoints of its Service whose pods are provably its own (``pool_pods``;
        ``--server-endpoint`` replaces them), or why there are none. ``uid``: the InferenceServer's, when the
        caller has it (else it is looked up)."""
        override = self.config.server_endpoints.get(f"{namespace}/{server}")
        if override:
            return [Endpoint(override.rstrip("/"), override.rstrip("/"))], ""
        try:
            found = endpoints_from_slices(self.lookup.slices(namespace, server))
        except Exception as exc:
            return [], f"cannot list the EndpointSlices of Service '{namespace}/{server}': {exc}"
        if not found:
            return [], f"InferenceServer '{server}' has no running replicas (its Service has no endpoints)"
        if uid is None:
            body = self.lookup.server(namespace, server)
            uid = str(body["metadata"].get("uid") or "") if body else ""
        try:
            proven, ignored = self.pool_pods.check(namespace, server, uid, selector_string(server), found)
        except Exception as exc:
            return [], f"cannot list the pods of InferenceServer '{server}' to check its replicas: {exc}"
        if not proven:
            return [], (
                f"InferenceServer '{server}' has no running replicas (the {len(ignored)} endpoints of its Service "
                "are not pods of its Deployment)"
            )
        return proven, ""

    def pool_members(self, namespace: str, server: str, uid: str, max_age: float | None = None) -> Members:
        """The pool's provably own pods (``pool_pods``), listed at most ``max_age`` seconds ago."""
        return self.pool_pods.members(namespace, server, uid, selector_string(server), max_age)

    def server_dir(self, namespace: str, server_name: str, spec: ServerSpec) -> tuple[str, Path]:
        """The pool's folder on the volume (made if missing), after its claim is known to reach no further
        than the namespace's folder."""
        self.claim(namespace, server_name, spec)
        subpath = repository_subpath(namespace, server_name, spec)
        return subpath, self.writer.server_dir(namespace, subpath)

    def claim(self, namespace: str, server_name: str, spec: ServerSpec) -> str:
        """The claim the pool's pods mount: the one it names (checked), else the operator's for the namespace."""
        claim = typed_spec(spec).repository.claim_name
        if claim:
            self.claims.check(namespace, server_name, claim)
            return str(claim)
        return self.volumes.provide(namespace)

    def patch_status(
        self, plural: str, namespace: str, name: str, prev: Mapping[str, Any], new: dict[str, Any]
    ) -> None:
        if not status.status_changed(prev, new):
            self.status_skips += 1
            return
        self.status_writes += 1
        self.kube.patch_status(plural, namespace, name, new)

    def model_bodies(self, namespace: str) -> list[Mapping[str, Any]]:
        """The namespace's InferenceModels: from memory once the model watch listed them all, else listed."""
        if self.records.complete:
            return [b for _, b in self.records.with_bodies() if b["metadata"].get("namespace") == namespace]
        return list(self.kube.list_in(MODELS, namespace))

    def event(self, body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """An event about an InferenceModel: posted in the background once started, else through kopf."""
        if self.poster is not None:
            self.poster.post(body, type, reason, message)
        elif type == "Normal":
            _normal(body, reason, message)
        else:
            kopf.warn(kopf_ref(body), reason=reason, message=message)


def _normal(body: Mapping[str, Any], reason: str, message: str) -> None:
    """A Normal event. (kopf.info obeys settings.posting.level, which stays at WARNING so kopf's own
    per-handler log lines are not posted; kopf.event is not filtered by level.)"""
    kopf.event(kopf_ref(body), type="Normal", reason=reason, message=message)


def kopf_ref(body: Mapping[str, Any]) -> kopf.Body:
    """kopf's event helpers take any object mapping with apiVersion, kind and metadata."""
    return cast(kopf.Body, body)
