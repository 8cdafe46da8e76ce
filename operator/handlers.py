"""kopf handlers and the InferenceModel reconcile loop: one idempotent reconcile per object.

InferenceServers use kopf's change handlers (create/update/resume). InferenceModels, which come by the
thousand, do not: kopf's change handlers write their progress and a diff base onto every object (a patch,
and the watch event it causes, per model and change). A model's watch events only update an in-memory
copy of it (``Reconciler.models``) and put its uid in a work queue when its generation is new to this
process (created, changed, or first seen after a start); reconciles run in the queue's threads, one at a
time per object. kopf keeps the finalizer and runs the delete handler. A resync pass over the in-memory
copies replaces per-object timers, and a model whose generation, server and folder (its fingerprint:
names, inodes, sizes and change times) are what the last render left is not rendered or synced again:
only its status is refreshed from the servers' indexes.

A resync of an unchanged model costs no API call: servers and EndpointSlices come from kopf's
in-memory indexes (kept current by the watches), each server replica's repository index is read
once per ``index_max_age`` for all its models, and an unchanged status is not written. After a render
the operator asks poll-mode servers to look at the changed folders at once (``nudge``) instead of
waiting for their poll.

Handlers and reconciles are synchronous on purpose: they run in threads, so downloads, file writes and
the (blocking) kubernetes client never stall the event loop. A per-object lock keeps a resync and a change
of the same object from writing at once. Status is written explicitly, conditions as full lists, and only
when it changed.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import kopf
from kubeinfer.server.config import ConfigError
from kubeinfer.server.config.platforms import backend_for
from kubeinfer.server.config.version_policy import select_versions
from kubeinfer.server.repository.layout import config_digest
from kubernetes.client.exceptions import ApiException

from . import cold_start, manifests, network_policy, pod_start, sequence_routing, status
from .api import GROUP, VERSION
from .artifacts import DEFAULT_MAX_BYTES, ArtifactError
from .autoscaling import Autoscaler
from .claims import ClaimCheck
from .credentials import credential_headers
from .egress import AddressPolicy, HostRules, IPNetwork
from .events import EventPoster
from .fetch import DEFAULT_DEADLINE, Fetch, Fetcher
from .kube import MODELS, SERVERS, Kube, is_temporary
from .logs import UNLOAD_WAIT
from .model_watch import ModelWatch
from .nudge import Nudger
from .onnx_check import DEFAULT_CHECK_TIMEOUT
from .quota import DownloadGate, NamespaceQuota
from .recheck import Rechecker
from .render import DEFAULT_BACKENDS, render_model
from .replicas import Endpoint, IndexReader, endpoints_from_slices
from .repository_writer import RepositoryWriter
from .rollout import Rollouts, weights_in_force
from .server_access import PLAIN, AccessBook, ServerAccess
from .tenant_volumes import DEFAULT_CLAIM, TenantVolumes
from .workqueue import WorkQueue

#: backends whose models are code run by the server
CODE_BACKENDS = ("python", "pytorch")

#: artifact failures that may go away by themselves (network, a download slot); the rest wait for a spec change
TEMPORARY_REASONS = {"FetchFailed", "Queued"}
#: seconds (on average; spread by half either way, so queued models do not come back in step) before
#: kopf retries a model whose download waits for a slot
QUEUE_RETRY = 3.0
#: (first, longest) seconds before the resync timer retries a render that failed for the same generation
FAILURE_BACKOFF = (60.0, 900.0)
#: seconds between checks, during a long fetch, that the object was not deleted or changed meanwhile
CANCEL_POLL = 3.0
#: Ready reasons worth a quick recheck after a change (the server has yet to pick it up)
SETTLING = {"Loading", "ServerUnreachable", "ServerNotReady", "ServerUnavailable"}
#: held by every InferenceModel until its folder is removed and the servers unloaded it
FINALIZER = "serving.kubeinfer.io/finalizer"
#: seconds a deleted model's finalizer waits for the servers' answer to the poll request that unloads it
NUDGE_WAIT = 10.0
#: seconds after which a resync renders and syncs an unchanged model anyway (a check of the fingerprint's
#: premise: that nothing writes a model folder without changing its entries' change times)
FULL_CHECK_AFTER = 600.0
#: checks of models after a change that run at once (each may write a status: at 1,000 models rendered at
#: once, the time to Ready is that many status writes)
RECHECK_THREADS = 8
#: seconds a render's status write waits for the replicas' answer to its poll request (Rendered and Ready in
#: one write) before it is written anyway
NUDGE_STATUS_WAIT = 2.0
log = logging.getLogger("kubeinfer.operator")


@dataclass
class OperatorConfig:
    repository_root: Path
    resync_seconds: float = 30.0
    #: "namespace/server" → base URL of that server's HTTP endpoint (replaces its EndpointSlices)
    server_endpoints: dict[str, str] = field(default_factory=dict)
    max_artifact_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = 60.0
    fetch_proxy: str | None = None
    fetch_ca_file: str | None = None
    #: longest a download may take from its first byte sent to its last received
    fetch_deadline: float = DEFAULT_DEADLINE
    #: networks downloads may reach although they are not public, and networks they may never reach
    allowed_networks: tuple[IPNetwork, ...] = ()
    blocked_networks: tuple[IPNetwork, ...] = ()
    #: per-namespace host allow-lists ("*": every other namespace; none: any public host)
    allowed_hosts: HostRules = field(default_factory=HostRules)
    #: downloads at once per namespace and overall (0: no limit)
    downloads_per_namespace: int = 2
    downloads_total: int = 4
    #: bytes a namespace's folder may hold (0: no quota), and per-namespace exceptions
    namespace_quota_bytes: int = 0
    namespace_quotas: dict[str, int] = field(default_factory=dict)
    onnx_check_timeout: float = DEFAULT_CHECK_TIMEOUT
    #: the PVC mounted at repository_root, and its namespace; servers whose claim is bound to other
    #: storage are refused (claim None: not checked; namespace None: claim names compared)
    claim_name: str | None = None
    claim_namespace: str | None = None
    index_timeout: float = 5.0
    unload_timeout: float = 120.0
    #: namespaces to watch (empty: all)
    namespaces: list[str] = field(default_factory=list)
    #: Prometheus that KEDA ScaledObjects query when spec.autoscaling.prometheus.serverAddress is unset
    prometheus_url: str | None = None
    #: the claim the operator provides in each namespace (servers that name none mount it)
    tenant_claim: str = DEFAULT_CLAIM
    #: who the servers' NetworkPolicies let in besides their own namespace
    policy: network_policy.PolicyContext = field(default_factory=network_policy.PolicyContext)
    #: image prefixes InferenceServers may run (empty: any)
    server_image_prefixes: list[str] = field(default_factory=list)
    #: threads that run model reconciles (the operator's --workers)
    workers: int = 8

    @property
    def index_max_age(self) -> float:
        """How old a replica's index may be for a resync: ~six reads per resync period, 1-10 s."""
        return min(10.0, max(1.0, self.resync_seconds / 6))


class Lookup:
    """InferenceServers and EndpointSlices from kopf's indexes once attached, else from the API."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.indices: Mapping[str, Any] | None = None

    def values(self, index: str, key: tuple[str, str]) -> list[Any] | None:
        if self.indices is None or index not in self.indices:
            return None
        for _ in range(3):  # the store may change under a worker thread's iteration
            try:
                return list(self.indices[index].get(key, ()))
            except RuntimeError:
                continue
        return None

    def server(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.values("servers", (namespace, name))
        if found is None:
            return self.kube.get(SERVERS, namespace, name)
        return found[0] if found else None

    def slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        found = self.values("endpointslices", (namespace, service))
        return self.kube.endpoint_slices(namespace, service) if found is None else found


@dataclass(frozen=True)
class _Failure:
    generation: int
    error: tuple[str, str]
    version: int | None
    delay: float
    retry_at: float


@dataclass(frozen=True)
class _Rendered:
    """What the last successful render of a model left, for resyncs that find nothing changed."""

    generation: int
    #: the server's identity and the parts of its spec a render depends on
    server: tuple[Any, ...]
    server_dir: Path
    fingerprint: tuple[object, ...]
    target: list[int]
    config_digest: str
    repository_path: str
    rendered: list[int]
    at: float


def _server_key(ns: str, name: str, server: Mapping[str, Any]) -> tuple[Any, ...]:
    spec, meta = server["spec"], server["metadata"]
    return (
        meta.get("uid"),
        meta.get("generation"),
        manifests.repository_subpath(ns, name, spec),
        (spec.get("repository") or {}).get("claimName"),
        tuple(spec.get("backends") or ()),
        tuple(spec.get("allowedBackends") or ()) if spec.get("allowedBackends") is not None else None,
    )


def backoff(retry: int) -> float:
    return float(min(300, 5 * 2 ** min(retry, 6)))


class Reconciler:
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
        )
        self.gate = DownloadGate(config.downloads_per_namespace, config.downloads_total)
        self.quota = NamespaceQuota(self.writer.root, config.namespace_quota_bytes, dict(config.namespace_quotas))
        self.reader = IndexReader(config.index_timeout)
        self.claims = ClaimCheck(lambda *a: self.kube.read_core(*a), config.claim_name, config.claim_namespace)
        self.volumes = TenantVolumes(kube, self.claims, config.tenant_claim)
        self.access = AccessBook(lambda ns, name: self.kube.read_core("Secret", name, ns))
        self.lookup = Lookup(kube)
        self.rechecker = Rechecker(self._recheck, threads=RECHECK_THREADS)
        self.nudger = Nudger(self.reader.client_for, self._nudged, full=max(2, config.workers))
        #: (replica URL, model name) -> recheck key of the model, while a poll request for it is on its way
        self._nudged_keys: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._failures: dict[str, _Failure] = {}
        #: uid -> the newest InferenceModel object seen (from its watch events); None until events are attached
        self.models: dict[str, dict[str, Any]] = {}
        self.models_attached = False
        #: ``models`` holds every model (set at the first resync pass: kopf delivered them all by then)
        self.models_complete = False
        #: uid -> generation queued for a reconcile, and the generation whose reconcile finished
        self._wanted: dict[str, int] = {}
        self._handled: dict[str, int] = {}
        self._retries: dict[str, int] = {}
        self._rendered: dict[str, _Rendered] = {}
        #: uid -> status.coldStart.render of the model's last render that changed its folder: kept here, not only
        #: in the status, because the status written right after a render may be deferred (``_nudged``)
        self._render_records: dict[str, dict[str, Any]] = {}
        #: (namespace, server) -> pod uid -> the complete start-up timelines of its pods (``_pod_starts``)
        self._pod_timelines: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        #: uid -> when this process first saw the model being deleted (the unload wait counts from there)
        self._deleting_since: dict[str, float] = {}
        self.queue = WorkQueue(self._work, max(2, config.workers), name="reconcile")
        #: events about models (once started; before, kopf's event helpers, as in the unit tests)
        self.poster: EventPoster | None = None
        self.watch = ModelWatch(kube, config.namespaces, self.model_event, self._listed)
        self.autoscaler = Autoscaler(kube, config.prometheus_url)
        #: weights between versions: numbers per version, spec.rollout's decisions (operator/rollout.py)
        self.rollouts = Rollouts(self.reader)
        #: a kopf handler's context, for threads of our own that post events (set by the handlers)
        self.handler_context: contextvars.Context | None = None
        #: status patches written and skipped (unchanged), for the benchmark and the logs
        self.status_writes = 0
        self.status_skips = 0

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    def _forget(self, uid: str) -> None:
        with self._locks_guard:
            self._locks.pop(uid, None)
            self._failures.pop(uid, None)
        self.rollouts.forget(uid)
        self.queue.discard(uid)
        for memo in (self.models, self._wanted, self._handled, self._retries, self._rendered, self._deleting_since):
            memo.pop(uid, None)
        self._render_records.pop(uid, None)

    def start(self) -> None:
        """Start the threads, then watch the models once kopf's indexes hold what exists (a model reconciled
        before its server and the server's EndpointSlices are in them would get a wrong status)."""
        self.poster = EventPoster(self.kube)
        self.poster.start()
        self.rechecker.start()
        self.queue.start()
        self.models_attached = True
        threading.Thread(target=self._watch_when_indexed, daemon=True, name="watch-start").start()

    def _watch_when_indexed(self, timeout: float = 60.0) -> None:
        try:
            servers = {
                (b["metadata"]["namespace"], b["metadata"]["name"])
                for b in self.kube.list_all(SERVERS, self.config.namespaces)
            }
            slices = {
                (b["metadata"]["namespace"], str((b["metadata"].get("labels") or {}).get("kubernetes.io/service-name")))
                for b in self.kube.server_slices(self.config.namespaces)
            }
        except Exception as exc:
            log.warning("listing InferenceServers and their EndpointSlices failed (%s): watching models anyway", exc)
            servers, slices = set(), set()
        deadline = time.monotonic() + timeout
        while not self.kube.stop.is_set() and time.monotonic() < deadline:
            missing = [k for k in servers if not self.lookup.values("servers", k)]
            missing += [k for k in slices if not self.lookup.values("endpointslices", k)]
            if not missing:
                break
            self.kube.stop.wait(0.1)
        else:
            if not self.kube.stop.is_set():
                log.warning("kopf's indexes lack %s after %.0fs: watching models anyway", missing[:3], timeout)
        if not self.kube.stop.is_set():
            self.watch.start()

    def _listed(self, namespace: str | None) -> None:
        if set(self.watch.namespaces) <= self.watch.listed:
            self.models_complete = True

    def close(self) -> None:
        """Stop the model watch, the work queue, the rechecker and retries, close the HTTP clients (idempotent)."""
        self.kube.stop.set()
        self.watch.stop()
        self.queue.stop()
        self.rechecker.stop()
        if self.poster is not None:
            self.poster.stop()
        self.nudger.close()
        self.reader.close()
        self.writer.fetcher.close()

    # ---------------------------------------------------------------------------------- helpers
    def endpoints(self, namespace: str, server: str) -> tuple[list[Endpoint], str]:
        """The server's replicas (``--server-endpoint`` replaces them), or why there are none."""
        override = self.config.server_endpoints.get(f"{namespace}/{server}")
        if override:
            return [Endpoint(override.rstrip("/"), override.rstrip("/"))], ""
        try:
            found = endpoints_from_slices(self.lookup.slices(namespace, server))
        except Exception as exc:
            return [], f"cannot list the EndpointSlices of Service '{namespace}/{server}': {exc}"
        if not found:
            return [], f"InferenceServer '{server}' has no running replicas (its Service has no endpoints)"
        return found, ""

    def observe(
        self,
        server: str,
        endpoints: list[Endpoint],
        model: str,
        max_age: float,
        every: bool = False,
        access: ServerAccess | str | None = None,
    ) -> list[status.ReplicaView]:
        """This model's version states on each ready replica (on every one when none is ready, or ``every``)."""
        chosen = endpoints if every else [e for e in endpoints if e.ready] or endpoints
        views = []
        for endpoint in chosen:
            if isinstance(access, str):  # the pool's auth Secrets cannot be read: say so for every replica
                views.append(status.ReplicaView(endpoint.name, endpoint.ready, None, access))
                continue
            read = self.reader.read(endpoint, max_age, access or PLAIN, model)
            error = ""
            if read.rows is None:
                error = (
                    f"cannot read the repository index of InferenceServer '{server}' at {endpoint.url}: {read.error}"
                )
            states = None if read.rows is None else status.version_states(read.rows_of(model), model)
            views.append(status.ReplicaView(endpoint.name, endpoint.ready, states, error))
        return views

    def _credentials(self, namespace: str) -> Callable[[str, str], dict[str, str]]:
        def lookup(name: str, host: str) -> dict[str, str]:
            try:
                secret = self.kube.read_core("Secret", name, namespace)
            except ApiException as exc:
                if exc.status == 403:
                    raise ArtifactError(
                        "CredentialsForbidden",
                        f"the operator may not read Secret '{namespace}/{name}': grant its service account "
                        "'get' on it (the Helm value rbac.secretNamespaces)",
                    ) from None
                raise
            if secret is None:
                raise ArtifactError(
                    "CredentialsNotFound", f"Secret '{name}' (source.credentialsSecret) does not exist in '{namespace}'"
                )
            return credential_headers(secret, name, host)

        return lookup

    def _server_dir(self, namespace: str, server_name: str, spec: Mapping[str, Any]) -> tuple[str, Path]:
        """The pool's folder on the volume (made if missing), after its claim is known to reach no further
        than the namespace's folder."""
        self._claim(namespace, server_name, spec)
        subpath = manifests.repository_subpath(namespace, server_name, spec)
        return subpath, self.writer.server_dir(namespace, subpath)

    def _claim(self, namespace: str, server_name: str, spec: Mapping[str, Any]) -> str:
        """The claim the pool's pods mount: the one it names (checked), else the operator's for the namespace."""
        claim = (spec.get("repository") or {}).get("claimName")
        if claim:
            self.claims.check(namespace, server_name, claim)
            return str(claim)
        return self.volumes.provide(namespace)

    def _patch_status(
        self, plural: str, namespace: str, name: str, prev: Mapping[str, Any], new: dict[str, Any]
    ) -> None:
        if not status.status_changed(prev, new):
            self.status_skips += 1
            return
        self.status_writes += 1
        self.kube.patch_status(plural, namespace, name, new)

    # ----------------------------------------------------------------------------------- servers
    def reconcile_server(self, body: Mapping[str, Any], logger: logging.Logger | None = None) -> None:
        meta, spec = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock(meta["uid"]):
            conds: list[status.Condition] = []
            claim: str | None = None
            try:
                subpath, _ = self._server_dir(ns, name, spec)
                claim = self._claim(ns, name, spec)
                conds.append(
                    status.Condition(
                        "RepositoryReady", True, "FolderReady", f"models go to {subpath}; pods mount claim '{claim}'"
                    )
                )
            except (ArtifactError, OSError) as exc:
                msg = exc.message if isinstance(exc, ArtifactError) else str(exc)
                conds.append(status.Condition("RepositoryReady", False, "RepositoryUnusable", msg))
            refused = self._refused_spec(spec)
            if refused:
                conds.append(status.Condition("SpecAccepted", False, refused[0], refused[1]))
            scaling: status.Condition | None = None
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
            listed = self.model_bodies(ns)
            if not (claim is None or refused):
                try:
                    dep = self.kube.apply(manifests.deployment(body, claim))
                    stateful = sequence_routing.sequence_models(listed, name)
                    self.kube.apply(manifests.service(body, sequence_routing.affinity(spec, stateful)))
                    self._apply_network_policy(body)
                    scaling, scaling_status = self.autoscaler.reconcile(body)
                except ApiException as exc:
                    if is_temporary(exc):
                        raise kopf.TemporaryError(f"applying owned objects: {exc.reason}", delay=5) from None
                    message = (
                        f"the API server refused the pods' spec: {exc.body or exc.reason}; fix the InferenceServer spec"
                    )
                    kopf.warn(_ref(body), reason="ApplyFailed", message=message)
                    conds.append(status.Condition("Available", False, "ApplyFailed", message))
                    dep = None
            replicas = ready = 0
            if dep is not None:
                replicas = dep.status.replicas or 0
                ready = dep.status.ready_replicas or 0
                available = next((c for c in dep.status.conditions or () if c.type == "Available"), None)
                conds.append(
                    status.Condition(
                        "Available",
                        available is not None and available.status == "True",
                        (available.reason if available else None) or "Pending",
                        (available.message if available else None) or f"{ready}/{spec.get('replicas', 1)} pods ready",
                    )
                )
            models = sorted(m["metadata"]["name"] for m in listed if m.get("spec", {}).get("server") == name)
            ok = all(c.status for c in conds)
            conds.append(
                status.Condition(
                    "Ready",
                    ok,
                    "Serving" if ok else "NotReady",
                    "" if ok else "; ".join(c.message for c in conds if not c.status),
                )
            )
            if scaling is not None:  # reported beside Ready, not in it: the pool serves either way
                conds.append(scaling)
            prev = body.get("status") or {}
            self._patch_status(
                SERVERS,
                ns,
                name,
                prev,
                {
                    "observedGeneration": meta.get("generation"),
                    "conditions": status.conditions(conds, prev.get("conditions"), meta.get("generation", 0)),
                    "replicas": replicas,
                    "readyReplicas": ready,
                    "selector": manifests.selector_string(name),
                    "models": models,
                    "endpoint": manifests.service_endpoint(ns, name, spec)["http"],
                    "repositoryClaim": claim,
                    "autoscaling": scaling_status,
                    "pods": self._pod_starts(ns, name, spec) if dep is not None else None,
                },
            )

    def _pod_starts(self, ns: str, name: str, spec: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        """``status.pods``: how each pod of the pool started (``pod_start``); a pod's server is asked for its
        side of it (``GET /v2/kubeinfer/startup``) until its timeline is complete, never again after."""
        try:
            pods = self.kube.pods(ns, manifests.selector_string(name))
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
                    urls = {e.name: e.url for e in self.endpoints(ns, name)[0]}
                url = urls.get(meta["name"])
                startup = self._startup(url, access) if url and isinstance(access, ServerAccess) else None
                entry = pod_start.pod_timeline(pod, startup)
            out[meta["uid"]] = entry
        self._pod_timelines[(ns, name)] = {uid: e for uid, e in out.items() if pod_start.complete(e)}
        return list(out.values())

    def _startup(self, url: str, access: ServerAccess) -> dict[str, Any] | None:
        """A server's start-up timeline, or None (not answering yet, or a server without the route)."""
        try:
            response = self.reader.client_for(access).get(
                f"{access.url(url)}/v2/kubeinfer/startup", headers=dict(access.headers), timeout=2.0
            )
            data = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _refused_spec(self, spec: Mapping[str, Any]) -> tuple[str, str] | None:
        """(reason, message) when the operator will not run this pool as specified (the CRD's CEL rules refuse
        most of it first; this holds for objects admitted by an older CRD, and for the operator's own flags)."""
        reserved = manifests.reserved_extra_args(spec)
        if reserved:
            return (
                "ExtraArgsRefused",
                f"server.extraArgs {reserved} set flags the operator sets; use the InferenceServer's own fields",
            )
        prefixes = self.config.server_image_prefixes
        if prefixes and not any(str(spec.get("image", "")).startswith(p) for p in prefixes):
            return (
                "ImageRefused",
                f"image '{spec.get('image')}' is not one this operator runs (--server-image-prefix: "
                f"{', '.join(prefixes)})",
            )
        return None

    def _apply_network_policy(self, body: Mapping[str, Any]) -> None:
        spec, name = body["spec"], body["metadata"]["name"]
        if network_policy.enabled(spec):
            self.kube.apply(
                network_policy.network_policy(
                    body,
                    manifests.ports(spec),
                    manifests.selector_labels(name),
                    manifests.metadata(body),
                    self.config.policy,
                )
            )
        else:
            self.kube.delete_owned("NetworkPolicy", body["metadata"]["namespace"], name, body["metadata"]["uid"])

    def reconcile_server_named(self, namespace: str, name: str) -> None:
        body = self.lookup.server(namespace, name)
        if body is not None and not body["metadata"].get("deletionTimestamp"):
            self.reconcile_server(body)

    # ------------------------------------------------------------------------------------ models
    def reconcile_model(
        self,
        body: Mapping[str, Any],
        retry: int = 0,
        from_timer: bool = False,
        cancelled: Callable[[], bool] | None = None,
        max_age: float | None = None,
        recheck: bool = True,
        render: bool = True,
    ) -> dict[str, Any] | None:
        """Render, sync the repository, read every replica's index, write status (if it changed).

        A failed render is not repeated by the resync for the same generation until its backoff expires
        (a bad checksum would otherwise re-download the file every resync); changes and retries always
        render. A resync (``from_timer``) of a model whose generation, server and folder are as its last
        render left them renders nothing; with ``render`` False it returns ``NEEDS_RENDER`` instead of
        rendering (the resync pass hands such models to the work queue). After a change the model is
        rechecked within seconds until Ready (``recheck``). Returns the status (None: skipped, cancelled).
        """
        meta, spec = body["metadata"], body["spec"]
        ns, name, generation, uid = meta["namespace"], meta["name"], meta.get("generation", 0), meta["uid"]
        prev = body.get("status") or {}
        # a resync of an object whose change is still rendering (a slow download) does not wait for it:
        # waiting would hold a second thread for as long as the download runs
        with _held(self._lock(uid), wait=not from_timer) as got:
            if not got:
                return None
            server_name = spec["server"]
            obs = status.ModelObservation(generation=generation, target=[], rendered=[], server=server_name)
            temporary: str | None = None
            delay = 0.0
            changed = nudged = False
            server = self.lookup.server(ns, server_name)
            endpoints: list[Endpoint] = []
            access: ServerAccess | str = PLAIN
            if server is None:
                obs.render_error = (
                    "ServerNotFound",
                    f"InferenceServer '{server_name}' does not exist in namespace '{ns}'; create it or fix spec.server",
                )
                self._rendered.pop(uid, None)
            else:
                sspec = server["spec"]
                obs.endpoint = {**manifests.service_endpoint(ns, server_name, sspec), "model": name}
                traffic = weights_in_force(spec, prev, generation)
                key = (*_server_key(ns, server_name, server), tuple(sorted(traffic.items())))
                memo = self._unchanged(uid, generation, key, ns, server_name, sspec, name, prev) if from_timer else None
                if memo is not None:
                    obs.target, obs.config_digest = memo.target, memo.config_digest
                    obs.repository_path, obs.rendered = memo.repository_path, memo.rendered
                elif not render:
                    return NEEDS_RENDER
                else:
                    changed, temporary, delay = self._render(body, obs, key, from_timer, retry, cancelled, traffic)
                    if obs.render_error and obs.render_error[0] == "Cancelled":
                        return None  # the object is going away: nothing to report
                endpoints, obs.index_error = self.endpoints(ns, server_name)
                access = self.access.for_server(ns, server_name, sspec)
                if changed and isinstance(access, ServerAccess) and endpoints:
                    nudged = self._nudge(endpoints, access, name, (ns, name, uid))
                age = self.config.index_max_age if max_age is None else max_age
                obs.replicas = self.observe(server_name, endpoints, name, age, access=access)
            new = status.model_status(obs, prev)
            self._cold_start(uid, spec, obs, prev, new)
            decided = self._canary(body, prev, new, endpoints, access)
            routing = sequence_routing.model_condition(spec, server["spec"]) if server is not None else None
            if routing is not None:
                new["conditions"] += status.conditions([routing], prev.get("conditions"), generation)
            ready = _condition(new, "Ready")
            if decided:
                # a rollout decision changes the weights in force: rendered again at once, from this status
                self._rendered.pop(uid, None)
                if uid in self.models:
                    self.models[uid] = {**self.models[uid], "status": new}
            elif nudged and ready.get("reason") == "Loading" and not temporary:
                # the replicas are loading it right now: one status write once they answered (``_nudged``),
                # "Rendered" and "Ready" together, rather than "Loading" now and "Ready" a moment later
                self.rechecker.schedule((ns, name, uid), context=self.handler_context, delay=NUDGE_STATUS_WAIT)
                return new
            self._post_events(body, prev, new)
            self._patch_status(MODELS, ns, name, prev, new)
            if decided or (recheck and (changed or not from_timer) and ready.get("reason") in SETTLING):
                self.rechecker.schedule((ns, name, uid), context=self.handler_context)
            if temporary:
                raise kopf.TemporaryError(temporary, delay=delay)
            return new

    def _cold_start(
        self,
        uid: str,
        spec: Mapping[str, Any],
        obs: status.ModelObservation,
        prev: Mapping[str, Any],
        new: dict[str, Any],
    ) -> None:
        """``status.coldStart`` and, with ``spec.coldStartBudgetSeconds``, the ``ColdStartBudget`` condition."""
        if obs.render_timing is not None:
            self._render_records[uid] = obs.render_timing
        render = self._render_records.get(uid)  # else the status keeps the one an earlier process wrote
        block = cold_start.status_block(render, obs.replicas, prev.get("coldStart"))
        new["coldStart"] = block
        budget = spec.get("coldStartBudgetSeconds")
        condition = cold_start.budget_condition(
            None if budget is None else float(budget),
            (block or {}).get("render"),
            (block or {}).get("replicas") or [],
        )
        if condition is not None:
            new["conditions"] += status.conditions([condition], prev.get("conditions"), obs.generation)

    def _canary(
        self,
        body: Mapping[str, Any],
        prev: Mapping[str, Any],
        new: dict[str, Any],
        endpoints: list[Endpoint],
        access: ServerAccess | str,
    ) -> bool:
        """Numbers per weighted version and spec.rollout's rule into ``new``; True when a decision was made."""
        meta, spec = body["metadata"], body["spec"]
        if not self.rollouts.tracked(spec) and not prev.get("versionTraffic") and not prev.get("rollout"):
            return False
        generation = meta.get("generation", 0)
        stamp = status.now()
        extra, decision = self.rollouts.extend(
            meta["uid"], spec, generation, prev, new, endpoints, meta["name"], access, stamp
        )
        if extra:
            new["conditions"] += status.conditions(extra, prev.get("conditions"), generation, stamp)
        if decision:
            phase = new["rollout"]["phase"]
            self.event(body, "Warning" if phase == "RolledBack" else "Normal", phase, decision)
        return decision is not None

    def _unchanged(
        self,
        uid: str,
        generation: int,
        key: tuple[Any, ...],
        ns: str,
        server_name: str,
        sspec: Mapping[str, Any],
        name: str,
        body_status: Mapping[str, Any] | None = None,
    ) -> _Rendered | None:
        """The last render, when nothing it depends on changed since: the generation, the server, the claim
        (checked again, from its cache) and the model folder's fingerprint."""
        memo = self._rendered.get(uid)
        if memo is None or memo.generation != generation or memo.server != key:
            return None
        if (body_status or {}).get("repositoryPath") not in (None, memo.repository_path):
            return None  # the status says it was elsewhere: a render looks (and removes it there if it is ours)
        if time.monotonic() - memo.at > FULL_CHECK_AFTER:
            return None
        try:
            self._claim(ns, server_name, sspec)
        except (ArtifactError, OSError):
            return None  # the render says why
        if self.writer.fingerprint(memo.server_dir, name) != memo.fingerprint:
            return None
        return memo

    def _render(
        self,
        body: Mapping[str, Any],
        obs: status.ModelObservation,
        key: tuple[Any, ...],
        from_timer: bool,
        retry: int,
        cancelled: Callable[[], bool] | None,
        traffic: Mapping[int, float],
    ) -> tuple[bool, str | None, float]:
        """Render and sync the model into its server's folder, filling ``obs``; returns (something changed,
        the message of a temporary failure to retry, its delay). A cancelled render (the object is going away)
        leaves ``obs.render_error`` ("Cancelled", ...)."""
        meta, spec = body["metadata"], body["spec"]
        ns, name, generation, uid = meta["namespace"], meta["name"], meta.get("generation", 0), meta["uid"]
        server_name = spec["server"]
        server = self.lookup.server(ns, server_name)
        assert server is not None
        sspec = server["spec"]
        prev = body.get("status") or {}
        changed = False
        temporary: str | None = None
        delay = 0.0
        server_dir: Path | None = None
        held = self._held_failure(uid, generation) if from_timer else None
        self._rendered.pop(uid, None)
        try:
            subpath, server_dir = self._server_dir(ns, server_name, sspec)
            rendered = render_model(
                name, spec, sspec.get("backends") or DEFAULT_BACKENDS, server_name, traffic=dict(traffic)
            )
            _check_backend_allowed(rendered, server_name, sspec)
            obs.target = select_versions(rendered.config, rendered.versions)
            obs.config_digest = config_digest(rendered.config_text.encode("utf-8"))
            if held:
                obs.render_error, obs.failed_version = held
            else:
                superseded = self._superseded(ns, name, uid, generation, cancelled)
                fetch = Fetch(self._credentials(ns), superseded, self.gate, self.quota)
                succeeded = False
                started = time.monotonic()
                try:
                    result = self.writer.sync_model(server_dir, rendered, fetch=fetch)
                    succeeded = True
                finally:
                    fetch.finish(succeeded)
                if result.changed:
                    obs.render_timing = cold_start.render_record(time.monotonic() - started, fetch.fetched)
                obs.repository_path = f"{subpath}/{name}"
                self._forget_old_location(ns, name, prev.get("repositoryPath"), obs.repository_path)
                if result.changed:
                    changed = True
                    self.event(body, "Normal", "Rendered", _describe(result))
        except ConfigError as exc:
            obs.render_error = ("InvalidSpec", str(exc))
        except ArtifactError as exc:
            if exc.reason == "Cancelled":
                obs.render_error = ("Cancelled", exc.message)
                obs.repository_path = ""
                return False, None, 0.0
            obs.render_error = (exc.reason, exc.message)
            obs.failed_version = exc.version
            earlier = self._failure_of(uid, generation) if exc.reason == "Queued" else None
            if earlier is not None:
                # a failed render tried again finds the namespace's download slots busy: the status keeps
                # saying why it failed (not "Queued"), and the resync tries again after the failure's backoff;
                # no retries every few seconds, so models waiting since their apply take the slots first
                obs.render_error, obs.failed_version = earlier
            elif exc.reason in TEMPORARY_REASONS:
                temporary = exc.message
                delay = QUEUE_RETRY * random.uniform(0.5, 1.5) if exc.reason == "Queued" else backoff(retry)
        if not held and (obs.render_error or ("",))[0] != "Queued":  # waiting is not a failure
            self._remember_failure(uid, generation, obs)
        if server_dir is not None:
            obs.rendered = self.writer.versions_on_disk(server_dir, name)
            if obs.render_error is None:
                fingerprint = self.writer.fingerprint(server_dir, name)
                if fingerprint is not None:
                    self._rendered[uid] = _Rendered(
                        generation,
                        key,
                        server_dir,
                        fingerprint,
                        obs.target,
                        obs.config_digest,
                        obs.repository_path,
                        obs.rendered,
                        time.monotonic(),
                    )
        return changed, temporary, delay

    def _nudge(self, endpoints: list[Endpoint], access: ServerAccess, name: str, key: tuple[str, str, str]) -> bool:
        """Ask the server's replicas to poll the model's folder now; it is rechecked as soon as they answer."""
        for endpoint in endpoints:
            self._nudged_keys[(endpoint.url, name)] = key
            self.nudger.nudge(endpoint.url, access, [name])
        return True

    def _nudged(
        self, url: str, access: ServerAccess, names: list[str], rows: dict[str, list[dict[str, Any]]] | None
    ) -> None:
        """A replica answered a poll request about ``names`` (``rows`` per name; None: it did not): their rows are
        fresh in the index cache and the models are rechecked now (without an answer: at the usual delays)."""
        if rows is not None:
            self.reader.update(url, access, rows)
        for name in names:
            key = self._nudged_keys.pop((url, name), None)
            if key is not None:
                self.rechecker.schedule(key, context=self.handler_context, delay=0.0 if rows is not None else None)

    def _superseded(
        self, namespace: str, name: str, uid: str, generation: int, stopped: Callable[[], bool] | None
    ) -> Callable[[], bool]:
        """For long fetches: has the object been deleted or changed since this render began?

        kopf queues an object's next event (its deletion, a new spec) behind the handler that is
        running, so a multi-minute download would hold the finalizer, or delay the new spec, until it
        ends. The fetch polls this between chunks; it reads the object at most every CANCEL_POLL s.
        """
        state = {"checked": time.monotonic(), "verdict": False}
        if self.models_attached:
            # the watch keeps the newest object in memory: no API call
            def seen() -> bool:
                if stopped is not None and stopped():
                    return True
                now = self.models.get(uid)
                meta = (now or {}).get("metadata") or {}
                return now is None or bool(meta.get("deletionTimestamp")) or meta.get("generation") != generation

            return seen

        def check() -> bool:
            if state["verdict"] or (stopped is not None and stopped()):
                return True
            if time.monotonic() - state["checked"] < CANCEL_POLL:
                return False
            state["checked"] = time.monotonic()
            body: dict[str, Any] | None
            try:  # one plain request, no retries: an API outage must not stall the download
                body = cast(
                    dict[str, Any],
                    self.kube.custom.get_namespaced_custom_object(
                        GROUP, VERSION, namespace, MODELS, name, _request_timeout=(2, 5)
                    ),
                )
            except ApiException as exc:
                body = {} if exc.status == 404 else None
            except Exception:
                body = None
            if body is None:
                return False
            meta = body.get("metadata") or {}
            gone = not meta or meta.get("uid") != uid or bool(meta.get("deletionTimestamp"))
            if gone or meta.get("generation") != generation:
                log.info(
                    "render of %s/%s generation %s cancelled: the object was %s",
                    namespace,
                    name,
                    generation,
                    "deleted" if gone else "changed",
                )
                state["verdict"] = True
            return bool(state["verdict"])

        return check

    def _recheck(self, key: Hashable) -> bool:
        """A follow-up after a change; True when no more are needed (Ready, failed for good, or gone)."""
        ns, name, uid = cast(tuple[str, str, str], key)
        body = self.models.get(uid) if self.models_attached else self.kube.get(MODELS, ns, name)
        if body is None or body["metadata"].get("uid") != uid or body["metadata"].get("deletionTimestamp"):
            return True
        new = self.reconcile_model(body, from_timer=True, max_age=0.5, recheck=False)
        return new is None or _condition(new, "Ready").get("reason") not in SETTLING

    # ------------------------------------------------------------------------- model events and queue
    def model_event(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """A watch event of an InferenceModel (``kind`` None: listed). Cheap: it keeps the newest object and
        queues the uid when there is work: a generation new to this process, the finalizer to add, a deletion."""
        meta = body["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            self._forget(uid)
            return
        self.models[uid] = dict(body)
        ours = FINALIZER in (meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            if ours:  # a render in progress sees the deletion and gives up (``_superseded``); then the delete runs
                self._deleting_since.setdefault(uid, time.monotonic())
                self.queue.add(uid)
            return
        generation = meta.get("generation", 0)
        if not ours or self._wanted.get(uid) != generation:
            self._wanted[uid] = generation
            self.queue.add(uid)

    def _work(self, uid: Hashable) -> float | None:
        """One queued run for the newest object: its deletion, its finalizer, its reconcile. Returns when to run
        it again (a retry), or None."""
        key = cast(str, uid)
        body = self.models.get(key)
        if body is None:
            return None
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            return self._finalize(key, body) if FINALIZER in finalizers else None
        if FINALIZER not in finalizers:
            # before anything is written: what is on the volume must outlive no InferenceModel
            if not self.kube.set_finalizers(ns, name, [*finalizers, FINALIZER], meta.get("resourceVersion") or ""):
                return 0.5  # changed meanwhile (or gone): again with the object the watch brings
        generation = meta.get("generation", 0)
        # a generation already reconciled is here again for a render the resync asked for
        resync = self._handled.get(key) == generation
        retry = self._retries.get(key, 0)
        try:
            self.reconcile_model(body, retry, resync)
            if not resync and (body.get("spec") or {}).get("sequenceBatching") is not None:
                # its pool's Service gets session affinity now, not at the next resync (sequence_routing.py)
                self._in_handler_context(self.reconcile_server_named, ns, body["spec"]["server"])
        except kopf.TemporaryError as exc:
            self._retries[key] = retry + 1
            return float(exc.delay or backoff(retry))
        except Exception as exc:
            log.warning("reconcile of InferenceModel %s/%s failed: %s", ns, name, exc)
            if resync:
                return None  # the next resync tries again
            self._retries[key] = retry + 1
            return backoff(retry)
        self._retries.pop(key, None)
        if key in self.models:
            self._handled[key] = generation
        return None

    def _in_handler_context(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a copy of a kopf handler's context (kopf's event posting lives there)."""
        context = self.handler_context
        return call(*args) if context is None else context.copy().run(call, *args)

    def _finalize(self, uid: str, body: Mapping[str, Any]) -> float | None:
        """The delete handler, then the finalizer released; a retry delay while a server still has it loaded."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        waited = time.monotonic() - self._deleting_since.setdefault(uid, time.monotonic())
        try:
            self.delete_model(body, waited)
        except kopf.TemporaryError as exc:  # waiting for the server to unload it: a retry by design, not an error
            log.info("InferenceModel %s/%s: %s", ns, name, exc)
            return float(exc.delay or 1.0)
        except Exception as exc:
            log.warning("deletion of InferenceModel %s/%s failed: %s; retrying", ns, name, exc)
            return 2.0
        rest = [f for f in meta.get("finalizers") or () if f != FINALIZER]
        if not self.kube.set_finalizers(ns, name, rest, meta.get("resourceVersion") or ""):
            return 0.2 if uid in self.models else None  # changed meanwhile: again; gone: done
        return None

    def resync_models(self, stopped: Callable[[], bool]) -> int:
        """One resync pass over every model (the resync timer): status refreshed, drift repaired. Models whose
        render is needed again are queued; returns how many."""
        queued = 0
        for uid, body in list(self.models.items()):
            if stopped():
                break
            meta = body["metadata"]
            if meta.get("deletionTimestamp") or self._handled.get(uid) != meta.get("generation", 0):
                continue  # being deleted, or its change is queued
            try:
                new = self.reconcile_model(body, 0, True, stopped, None, True, False)
            except Exception as exc:
                log.warning("resync of InferenceModel %s/%s failed: %s", meta["namespace"], meta["name"], exc)
                continue
            if new is NEEDS_RENDER:
                self.queue.add(uid)
                queued += 1
        return queued

    def model_bodies(self, namespace: str) -> list[Mapping[str, Any]]:
        """The namespace's InferenceModels: from memory once the model watch listed them all, else listed."""
        if self.models_complete:
            return [b for b in list(self.models.values()) if b["metadata"].get("namespace") == namespace]
        return list(self.kube.list_in(MODELS, namespace))

    def models_of(self, namespace: str, server: str) -> list[str]:
        """Names of the server's models."""
        return sorted(
            m["metadata"]["name"] for m in self.model_bodies(namespace) if (m.get("spec") or {}).get("server") == server
        )

    def _held_failure(self, uid: str, generation: int) -> tuple[tuple[str, str], int | None] | None:
        with self._locks_guard:
            failure = self._failures.get(uid)
        if failure and failure.generation == generation and time.monotonic() < failure.retry_at:
            return failure.error, failure.version
        return None

    def _failure_of(self, uid: str, generation: int) -> tuple[tuple[str, str], int | None] | None:
        """The last failed render of this generation (held or not), as (error, version)."""
        with self._locks_guard:
            failure = self._failures.get(uid)
        if failure and failure.generation == generation:
            return failure.error, failure.version
        return None

    def _remember_failure(self, uid: str, generation: int, obs: status.ModelObservation) -> None:
        with self._locks_guard:
            if obs.render_error is None:
                self._failures.pop(uid, None)
                return
            before = self._failures.get(uid)
            delay = FAILURE_BACKOFF[0]
            if before and before.generation == generation:
                delay = min(before.delay * 2, FAILURE_BACKOFF[1])
            self._failures[uid] = _Failure(
                generation, obs.render_error, obs.failed_version, delay, time.monotonic() + delay
            )

    def _forget_old_location(self, namespace: str, name: str, old: str | None, new: str) -> None:
        """The model moved (other server or subPath): remove it from where it was.

        ``old`` comes from the object's status, which whoever may write the status subresource can
        change: it is only acted on when it names this model inside this namespace's folder.
        """
        if not old or old == new:
            return
        old_path = Path(old)
        if old_path.name != name:
            log.warning(
                "ignoring status.repositoryPath %r of model %s/%s: not this model's folder", old, namespace, name
            )
            return
        try:
            server_dir = self.writer.server_dir(namespace, str(old_path.parent), create=False)
        except ArtifactError as exc:
            log.warning("ignoring status.repositoryPath %r of model %s/%s: %s", old, namespace, name, exc.message)
            return
        try:
            self.writer.remove_model(server_dir, old_path.name)
        except ArtifactError as exc:
            log.warning("cannot remove %r of model %s/%s: %s", old, namespace, name, exc.message)

    def _post_events(self, body: Mapping[str, Any], prev: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """One event per change of the Ready condition, not one per resync."""
        before: Mapping[str, Any] = _condition(prev, "Ready")
        after = _condition(new, "Ready")
        if (before.get("status"), before.get("reason"), before.get("message")) == (
            after["status"],
            after["reason"],
            after["message"],
        ):
            return
        if after["status"] == "True":
            self.event(body, "Normal", "Ready", after["message"])
        elif after["reason"] not in ("Loading",):
            self.event(body, "Warning", after["reason"], after["message"])

    def event(self, body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        """An event about an InferenceModel: posted in the background once started, else through kopf."""
        if self.poster is not None:
            self.poster.post(body, type, reason, message)
        elif type == "Normal":
            _normal(body, reason, message)
        else:
            kopf.warn(_ref(body), reason=reason, message=message)

    def delete_model(self, body: Mapping[str, Any], runtime_seconds: float) -> None:
        """Remove the model folder, then hold the finalizer until no replica of the server has it loaded."""
        meta, spec = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock(meta["uid"]):
            server = self.lookup.server(ns, spec["server"])
            recorded = (body.get("status") or {}).get("repositoryPath")
            if server is not None:
                try:
                    _, server_dir = self._server_dir(ns, spec["server"], server["spec"])
                    self.writer.remove_model(server_dir, name)
                except ArtifactError:
                    pass
            self._forget_old_location(ns, name, recorded, "")
            if server is not None:
                endpoints, _ = self.endpoints(ns, spec["server"])
                access = self.access.for_server(ns, spec["server"], server["spec"])
                answered: dict[str, list[dict[str, Any]]] = {}
                if isinstance(access, ServerAccess):
                    # the replicas unload it now, and say so, rather than at their next poll
                    tickets = {e.url: self.nudger.nudge(e.url, access, [name]) for e in endpoints}
                    deadline = time.monotonic() + NUDGE_WAIT
                    for url, (ticket,) in ((u, t) for u, t in tickets.items() if t):
                        rows = ticket.wait(max(0.0, deadline - time.monotonic()))
                        if rows is not None:
                            answered[url] = rows
                views = [
                    status.ReplicaView(e.name, e.ready, status.version_states(answered[e.url], name))
                    for e in endpoints
                    if e.url in answered
                ]
                rest = [e for e in endpoints if e.url not in answered]
                if rest:
                    views += self.observe(spec["server"], rest, name, max_age=0.5, every=True, access=access)
                loaded = sorted(
                    {s.version for v in views for s in v.states or () if s.state in ("READY", "LOADING", "UNLOADING")}
                )
                if loaded and runtime_seconds < self.config.unload_timeout:
                    raise kopf.TemporaryError(f"{UNLOAD_WAIT} versions {loaded}", delay=1)


#: reconcile_model(render=False) of a model that needs a render
NEEDS_RENDER: dict[str, Any] = {}


def _check_backend_allowed(model: Any, server: str, server_spec: Mapping[str, Any]) -> None:
    """The pool's spec.allowedBackends (a platform team's rule): a model of another backend is not rendered."""
    allowed = server_spec.get("allowedBackends")
    needed = backend_for(model.config)
    if allowed is not None and needed and needed not in allowed:
        code = " (Python and TorchScript models are code that runs in the server)" if needed in CODE_BACKENDS else ""
        raise ArtifactError(
            "BackendNotAllowed",
            f"InferenceServer '{server}' does not allow backend '{needed}'{code}: its spec.allowedBackends is "
            f"[{', '.join(allowed)}]; serve the model on another pool or ask the pool's owners",
        )


@contextlib.contextmanager
def _held(lock: threading.Lock, wait: bool) -> Iterator[bool]:
    """``lock`` taken (True), or not when ``wait`` is False and someone holds it (False)."""
    got = lock.acquire(blocking=wait)
    try:
        yield got
    finally:
        if got:
            lock.release()


def _condition(status_doc: Mapping[str, Any], ctype: str) -> Mapping[str, Any]:
    return next((c for c in status_doc.get("conditions") or () if c.get("type") == ctype), {})


def _normal(body: Mapping[str, Any], reason: str, message: str) -> None:
    """A Normal event. (kopf.info obeys settings.posting.level, which stays at WARNING so kopf's own
    per-handler log lines are not posted; kopf.event is not filtered by level.)"""
    kopf.event(_ref(body), type="Normal", reason=reason, message=message)


def _ref(body: Mapping[str, Any]) -> kopf.Body:
    """kopf's event helpers take any object mapping with apiVersion, kind and metadata."""
    return cast(kopf.Body, body)


def _describe(result: Any) -> str:
    parts = []
    if result.created_model:
        parts.append(f"created the model with versions {result.added_versions}")
    else:
        if result.added_versions:
            parts.append(f"added versions {result.added_versions}")
        if result.replaced_versions:
            parts.append(f"replaced versions {result.replaced_versions}")
        if result.removed_versions:
            parts.append(f"removed versions {result.removed_versions}")
        if result.config_changed:
            parts.append("updated config.pbtxt")
    return "; ".join(parts)


def register(reconciler: Reconciler, registry: kopf.OperatorRegistry) -> None:
    """Attach the handlers to ``registry`` (a fresh one per operator, so tests can build their own)."""
    # a fresh registry lacks kopf's default logins: the pod's service account, else $KUBECONFIG
    kopf.on.login(registry=registry, id="service-account")(kopf.login_with_service_account)
    kopf.on.login(registry=registry, id="kubeconfig")(kopf.login_with_kubeconfig)
    server: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=SERVERS, registry=registry)

    def on_server(body: kopf.Body, **_: Any) -> None:
        reconciler.handler_context = contextvars.copy_context()
        reconciler.reconcile_server(body)

    def on_owned(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(manifests.SERVER_LABEL)
        if owner and namespace:
            reconciler.reconcile_server_named(namespace, owner)

    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(**server, id=f"server-{decorator.__name__}", backoff=10)(on_server)
    # InferenceModels are not kopf's: the Reconciler watches them (model_watch.py), see the module docstring
    register_model_resync(reconciler, registry)
    register_server_resync(reconciler, registry)
    register_indexes(reconciler, registry)
    # user edits to (or deletion of) owned objects are put back at once, not at the next resync
    owned = {"app.kubernetes.io/managed-by": manifests.MANAGED_BY}
    for resource in (
        ("apps", "v1", "deployments"),
        ("v1", "services"),
        ("autoscaling", "v2", "horizontalpodautoscalers"),
        ("networking.k8s.io", "v1", "networkpolicies"),
    ):
        kopf.on.event(*resource, id=f"owned-{resource[-1]}", labels=owned, registry=registry)(on_owned)


def register_model_resync(reconciler: Reconciler, registry: kopf.OperatorRegistry) -> None:
    """The resync of every InferenceModel, one pass per period from a thread of our own (one kopf timer per
    object costs a task, a thread hop and kopf's bookkeeping per object and tick)."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def loop() -> None:
        while not stop.wait(reconciler.config.resync_seconds):
            started = time.monotonic()
            try:
                queued = reconciler.resync_models(stop.is_set)
            except Exception:  # never let one bad pass end the resyncs
                log.exception("resync of InferenceModels failed")
                continue
            log.debug(
                "resync of %d InferenceModels took %.2fs; %d queued for a render",
                len(reconciler.models),
                time.monotonic() - started,
                queued,
            )

    def start(**_: Any) -> None:
        thread = threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True, name="model-resync")
        threads.append(thread)
        thread.start()

    def finish(**_: Any) -> None:
        stop.set()
        for thread in threads:
            thread.join(10)

    kopf.on.startup(registry=registry, id="model-resync-start")(start)
    kopf.on.cleanup(registry=registry, id="model-resync-stop")(finish)


def register_server_resync(reconciler: Reconciler, registry: kopf.OperatorRegistry) -> None:
    """Periodic repair of InferenceServers from a thread of our own, not a kopf timer.

    kopf puts a finalizer on every object that has a timer; an InferenceServer has nothing outside
    the cluster to clean up, and a finalizer would block its deletion (and its namespace's)
    whenever the operator is not running.
    """
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(reconciler.config.resync_seconds):
            try:
                bodies = reconciler.kube.list_all(SERVERS, reconciler.config.namespaces)
            except Exception as exc:  # the API may be briefly unavailable; try at the next tick
                log.warning("listing InferenceServers failed: %s", exc)
                continue
            for body in bodies:
                if stop.is_set() or body["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    # in a kopf handler's context: events are posted through kopf's per-object queue
                    context = reconciler.handler_context
                    if context is None:
                        reconciler.reconcile_server(body)
                    else:
                        context.copy().run(reconciler.reconcile_server, body)
                except Exception as exc:
                    log.warning(
                        "resync of InferenceServer %s/%s failed: %s",
                        body["metadata"]["namespace"],
                        body["metadata"]["name"],
                        exc,
                    )

    threads: list[threading.Thread] = []

    def start(**_: Any) -> None:
        thread = threading.Thread(
            target=contextvars.copy_context().run, args=(loop,), daemon=True, name="server-resync"
        )
        threads.append(thread)
        thread.start()

    def finish(**_: Any) -> None:
        stop.set()
        for thread in threads:
            thread.join(10)  # a reconcile in progress finishes before the interpreter exits

    kopf.on.startup(registry=registry, id="server-resync-start")(start)
    kopf.on.cleanup(registry=registry, id="server-resync-stop")(finish)


def register_indexes(reconciler: Reconciler, registry: kopf.OperatorRegistry) -> None:
    """In-memory copies of InferenceServers and of their Services' EndpointSlices, kept by kopf's watches.

    The EndpointSlice controller copies a Service's labels onto its slices, so the operator's label
    selects exactly the slices of the Services it owns. The rechecker thread starts here too.
    """

    @kopf.index(GROUP, VERSION, SERVERS, id="servers", registry=registry)
    def servers(
        namespace: str | None, name: str, body: kopf.Body, **_: Any
    ) -> dict[tuple[str | None, str], dict[str, Any]]:
        return {(namespace, name): dict(body)}

    @kopf.index(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        id="endpointslices",
        labels={manifests.SERVER_LABEL: kopf.PRESENT},
        registry=registry,
    )
    def endpointslices(
        namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
    ) -> dict[tuple[str | None, str], dict[str, Any]] | None:
        service = labels.get("kubernetes.io/service-name")
        return {(namespace, service): dict(body)} if service else None

    def start(**kwargs: Any) -> None:
        reconciler.lookup.indices = {k: kwargs[k] for k in ("servers", "endpointslices") if k in kwargs}
        reconciler.models_attached = True
        reconciler.start()

    def finish(**_: Any) -> None:
        reconciler.close()

    kopf.on.startup(registry=registry, id="indexes-attach")(start)
    kopf.on.cleanup(registry=registry, id="reconciler-close")(finish)
