"""The InferenceServer controller: its folder and claim, the owned Deployment, Service, NetworkPolicy and
autoscaler, and a status that says whether the pool serves and how its pods started.

Idempotent: it runs on every change (kopf's change handlers), on edits to the owned objects, and at each
resync; a refused spec or an unusable claim applies nothing and says why in the conditions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from ..api import status
from ..api.pool_defaults import pool_body
from ..api.server_status import AutoscalingStatus, InferenceServerStatus
from ..api.server_types import InferenceServerSpec
from ..api.typed import as_body, parse
from ..kube.client import SERVERS, is_temporary
from ..kube.events import namespace_terminating
from ..replicas import pool_pods
from ..replicas.replica_http import AnswerError
from ..replicas.server_access import ServerAccess
from ..servers import image_policy, manifests, network_policy, pod_start
from ..sources.artifacts import ArtifactError
from ..traffic import sequence_routing
from ..traffic.autoscaling import Autoscaler
from .reconcile_parts import ReconcileParts, kopf_ref

log = logging.getLogger("kubeinfer.operator")
#: a server's start-up timeline: a few timestamps (bytes), and the seconds the whole read may take
STARTUP_MAX_BYTES = 64 << 10
STARTUP_DEADLINE = 2.0


class ServerController:
    """Reconciles InferenceServers with the collaborators it is handed (``parts``)."""

    def __init__(self, parts: ReconcileParts) -> None:
        self.parts = parts
        config = self.config = parts.config
        self.kube, self.lookup, self.reader, self.access = parts.kube, parts.lookup, parts.reader, parts.access
        #: uid -> the server's lock (a resync and a change of the same server do not write at once)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.autoscaler = Autoscaler(
            parts.kube,
            config.prometheus_url,
            http_scaler_address=config.http_scaler_address,
            route_domains=config.route_domains,
        )
        #: (namespace, server) -> pod uid -> the complete start-up timelines of its pods (``_pod_starts``)
        self._pod_timelines: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}

    def reconcile_server(self, body: Mapping[str, Any]) -> None:
        try:
            self._reconcile_server(body)
        except ApiException as exc:
            if not namespace_terminating(exc):
                raise
            # the namespace's deletion removes the InferenceServer too: nothing to make, nothing to retry
            meta = body["metadata"]
            log.info("InferenceServer %s/%s: its namespace is being deleted", meta["namespace"], meta["name"])

    def _reconcile_server(self, body: Mapping[str, Any]) -> None:
        meta, raw = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        # parsed once per reconcile, with the operator's pool defaults; every part below reads this
        spec = InferenceServerSpec.from_body(pool_body(body, self.config.default_allowed_backends))
        with self._lock(meta["uid"]):
            conds: list[status.Condition] = []
            claim = self._repository_condition(ns, name, raw, conds)
            refused = self._refused_spec(spec)
            if refused:
                conds.append(status.Condition("SpecAccepted", False, refused[0], refused[1]))
            listed = self.parts.model_bodies(ns)
            scaling: list[status.Condition] = []
            scaling_status: dict[str, Any] | None = None
            dep = None
            if claim is None or refused:
                conds.append(
                    status.Condition(
                        "Available",
                        False,
                        "NotApplied",
                        "the pods' spec was not applied: "
                        + ("the InferenceServer spec is refused" if refused else "no usable repository claim"),
                    )
                )
            else:
                dep, scaling, scaling_status = self._apply_owned(body, spec, claim, listed, conds)
            replicas = ready = 0
            if dep is not None:
                replicas = dep.status.replicas or 0
                ready = dep.status.ready_replicas or 0
                conds.append(_available(dep, ready, spec))
            ok = all(c.status for c in conds)
            conds.append(
                status.Condition(
                    "Ready",
                    ok,
                    "Serving" if ok else "NotReady",
                    "" if ok else "; ".join(c.message for c in conds if not c.status),
                )
            )
            conds += scaling  # reported beside Ready, not in it: the pool serves either way
            prev = body.get("status") or {}
            models = sorted(m["metadata"]["name"] for m in listed if m.get("spec", {}).get("server") == name)
            pods = self._pod_starts(ns, name, meta["uid"], raw) if dep is not None else None
            new = InferenceServerStatus(
                observed_generation=meta.get("generation"),
                conditions=tuple(status.conditions(conds, prev.get("conditions"), meta.get("generation", 0))),
                replicas=replicas,
                ready_replicas=ready,
                selector=manifests.selector_string(name),
                models=tuple(models),
                model_count=len(models),
                endpoint=manifests.service_endpoint(ns, name, spec)["http"],
                repository_claim=claim,
                autoscaling=parse(AutoscalingStatus, scaling_status) if scaling_status else None,
                pods=tuple(pods) if pods is not None else None,
            )
            # every field, unset ones as null: the merge patch removes what an earlier status said
            self.parts.patch_status(SERVERS, ns, name, prev, as_body(new, nulls=True))

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    def reconcile_server_named(self, namespace: str, name: str) -> None:
        body = self.lookup.server(namespace, name)
        if body is not None and not body["metadata"].get("deletionTimestamp"):
            self.reconcile_server(body)

    def _repository_condition(
        self, ns: str, name: str, spec: Mapping[str, Any], conds: list[status.Condition]
    ) -> str | None:
        """``RepositoryReady`` into ``conds``; the claim the pods mount, or None when there is no usable one."""
        try:
            subpath, _ = self.parts.server_dir(ns, name, spec)
            claim = self.parts.claim(ns, name, spec)
        except (ArtifactError, OSError) as exc:
            msg = exc.message if isinstance(exc, ArtifactError) else str(exc)
            conds.append(status.Condition("RepositoryReady", False, "RepositoryUnusable", msg))
            return None
        conds.append(
            status.Condition(
                "RepositoryReady", True, "FolderReady", f"models go to {subpath}; pods mount claim '{claim}'"
            )
        )
        return claim

    def _apply_owned(
        self,
        body: Mapping[str, Any],
        spec: InferenceServerSpec,
        claim: str,
        listed: list[Mapping[str, Any]],
        conds: list[status.Condition],
    ) -> tuple[Any, list[status.Condition], dict[str, Any] | None]:
        """Apply the Deployment, Service, NetworkPolicy and autoscaler; (the Deployment, or None when the API
        server refused the spec: said in ``conds``; the autoscaling conditions and status)."""
        name = body["metadata"]["name"]
        try:
            dep = self.kube.apply(manifests.deployment(body, claim, spec))
            stateful = sequence_routing.sequence_models(listed, name)
            by_uid = self._all_pods_carry_uid(body)
            affinity = sequence_routing.affinity(spec, stateful)
            self.kube.apply(manifests.service(body, affinity, by_uid=by_uid, spec=spec))
            self._apply_network_policy(body, spec)
            scaling, scaling_status = self.autoscaler.reconcile(body, spec)
        except ApiException as exc:
            if is_temporary(exc):
                raise kopf.TemporaryError(f"applying owned objects: {exc.reason}", delay=5) from None
            message = f"the API server refused the pods' spec: {exc.body or exc.reason}; fix the InferenceServer spec"
            kopf.warn(kopf_ref(body), reason="ApplyFailed", message=message)
            conds.append(status.Condition("Available", False, "ApplyFailed", message))
            return None, [], None
        return dep, scaling, scaling_status

    def _all_pods_carry_uid(self, body: Mapping[str, Any]) -> bool:
        """Whether the Service may select on the pool's uid label: every pod of the pool carries it (true of a
        new pool; a pool made before the label gets it on every pod by the rollout the new template starts,
        and until then its Service keeps selecting by name, or the old pods would stop getting requests).
        Once true it stays true: every later pod comes from a template with the label."""
        meta = body["metadata"]
        try:
            members = self.parts.pool_members(meta["namespace"], meta["name"], meta["uid"], max_age=pool_pods.MIN_AGE)
        except Exception as exc:  # the pods are unknown: the selector every pod of the pool matches
            log.warning("listing the pods of InferenceServer %s/%s failed: %s", meta["namespace"], meta["name"], exc)
            return False
        return members.all_carry(manifests.POOL_UID_LABEL, str(meta["uid"]))

    def _pod_starts(self, ns: str, name: str, uid: str, spec: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """``status.pods``: how each pod of the pool started (``pod_start``); a pod's server is asked for its
        side of it (``GET /v2/kubeinfer/startup``) until its timeline is complete, never again after. Only the
        pool's provably own pods (``pool_pods``: listed moments ago, for the Service's selector)."""
        try:
            pods = list(self.parts.pool_members(ns, name, uid, max_age=pool_pods.MIN_AGE).pods.values())
        except Exception as exc:  # the status says nothing about pods rather than fail the reconcile
            log.warning("listing the pods of InferenceServer %s/%s failed: %s", ns, name, exc)
            return None
        known = self._pod_timelines.get((ns, name), {})
        urls: dict[str, str] | None = None
        access = self.access.for_server(ns, name, spec)
        out: dict[str, dict[str, Any]] = {}
        for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            entry = known.get(meta["uid"])
            if entry is None:
                if urls is None:
                    urls = {e.name: e.url for e in self.parts.endpoints(ns, name, uid)[0]}
                url = urls.get(meta["name"])
                startup = self._startup(url, access) if url and isinstance(access, ServerAccess) else None
                entry = pod_start.pod_timeline(pod, startup)
            out[meta["uid"]] = entry
        self._pod_timelines[(ns, name)] = {uid: e for uid, e in out.items() if pod_start.complete(e)}
        return list(out.values())

    def _startup(self, url: str, access: ServerAccess) -> dict[str, Any] | None:
        """A server's start-up timeline, or None (not answering yet, or a server without the route)."""
        try:
            answer = self.reader.client_for(access).exchange(
                "GET",
                f"{access.url(url)}/v2/kubeinfer/startup",
                headers=access.headers,
                max_bytes=STARTUP_MAX_BYTES,
                deadline=STARTUP_DEADLINE,
            )
            data = answer.json() if answer.status == 200 else None
        except (AnswerError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _refused_spec(self, spec: InferenceServerSpec) -> tuple[str, str] | None:
        """(reason, message) when the operator will not run this pool as specified (the CRD's CEL rules refuse
        most of it first; this holds for objects admitted by an older CRD, and for the operator's own flags)."""
        reserved = manifests.reserved_extra_args(spec)
        if reserved:
            return (
                "ExtraArgsRefused",
                f"server.extraArgs {reserved} set flags the operator sets; use the InferenceServer's own fields",
            )
        prefixes = self.config.server_image_prefixes
        if not image_policy.allowed(spec.image, prefixes):
            return (
                "ImageRefused",
                f"image '{spec.image}' is not one this operator runs (--server-image-prefix: {', '.join(prefixes)})",
            )
        return None

    def _apply_network_policy(self, body: Mapping[str, Any], spec: InferenceServerSpec) -> None:
        name = body["metadata"]["name"]
        if network_policy.enabled(spec):
            self.kube.apply(
                network_policy.network_policy(
                    spec,
                    manifests.ports(spec),
                    manifests.selector_labels(name),
                    manifests.metadata(body),
                    self.config.policy,
                )
            )
        else:
            self.kube.delete_owned("NetworkPolicy", body["metadata"]["namespace"], name, body["metadata"]["uid"])


def _available(dep: Any, ready: int, spec: InferenceServerSpec) -> status.Condition:
    """``Available`` as the pool's Deployment reports it."""
    available = next((c for c in dep.status.conditions or () if c.type == "Available"), None)
    return status.Condition(
        "Available",
        available is not None and available.status == "True",
        (available.reason if available else None) or "Pending",
        (available.message if available else None) or f"{ready}/{spec.replicas} pods ready",
    )
