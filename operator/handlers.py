"""kopf handlers: one idempotent reconcile per kind, from create/update/resume and a periodic resync.

Handlers are synchronous on purpose: kopf runs them in its thread pool, so downloads, file writes
and the (blocking) kubernetes client never stall the event loop. A per-object lock keeps a timer
and a change handler of the same object from writing at once. Status is written explicitly (no
handler return values), conditions as full lists.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import kopf
from kubeinfer.server.config import ConfigError
from kubeinfer.server.config.version_policy import select_versions
from kubernetes.client.exceptions import ApiException

from . import manifests, status
from .api import GROUP, VERSION
from .artifacts import DEFAULT_MAX_BYTES, ArtifactError
from .autoscaling import Autoscaler
from .kube import MODELS, SERVERS, Kube, is_temporary
from .render import DEFAULT_BACKENDS, render_model
from .repository_writer import RepositoryWriter

#: artifact failures that may go away by themselves (network); the rest wait for a spec change
TEMPORARY_REASONS = {"FetchFailed"}
#: (first, longest) seconds before the resync timer retries a render that failed for the same generation
FAILURE_BACKOFF = (60.0, 900.0)
log = logging.getLogger("kubeinfer.operator")


@dataclass
class OperatorConfig:
    repository_root: Path
    resync_seconds: float = 30.0
    #: "namespace/server" → base URL of that server's HTTP endpoint (overrides the Service address)
    server_endpoints: dict[str, str] = field(default_factory=dict)
    max_artifact_bytes: int = DEFAULT_MAX_BYTES
    fetch_timeout: float = 60.0
    #: the PVC mounted at repository_root; servers naming another claim are refused (None: not checked)
    claim_name: str | None = None
    index_timeout: float = 5.0
    unload_timeout: float = 120.0
    #: namespaces to watch (empty: all)
    namespaces: list[str] = field(default_factory=list)
    #: Prometheus that KEDA ScaledObjects query when spec.autoscaling.prometheus.serverAddress is unset
    prometheus_url: str | None = None


@dataclass(frozen=True)
class _Failure:
    generation: int
    error: tuple[str, str]
    version: int | None
    delay: float
    retry_at: float


def backoff(retry: int) -> float:
    return float(min(300, 5 * 2 ** min(retry, 6)))


class Reconciler:
    def __init__(self, config: OperatorConfig, kube: Kube) -> None:
        self.config = config
        self.kube = kube
        self.writer = RepositoryWriter(
            config.repository_root, max_bytes=config.max_artifact_bytes, timeout=config.fetch_timeout
        )
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._failures: dict[str, _Failure] = {}
        self.autoscaler = Autoscaler(kube, config.prometheus_url)

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(uid, threading.Lock())

    # ---------------------------------------------------------------------------------- helpers
    def index_url(self, namespace: str, server: str, spec: Mapping[str, Any]) -> str:
        override = self.config.server_endpoints.get(f"{namespace}/{server}")
        if override:
            return override.rstrip("/")
        return f"http://{server}.{namespace}.svc:{manifests.ports(spec)['http']}"

    def read_index(self, base_url: str) -> list[dict[str, Any]]:
        response = httpx.post(f"{base_url}/v2/repository/index", json={}, timeout=self.config.index_timeout)
        response.raise_for_status()
        return list(response.json())

    def _server_dir(self, namespace: str, server_name: str, spec: Mapping[str, Any]) -> tuple[str, Path]:
        claim = (spec.get("repository") or {}).get("claimName")
        if self.config.claim_name and claim != self.config.claim_name:
            raise ArtifactError(
                "ClaimNotMounted",
                f"InferenceServer '{server_name}' uses PVC '{claim}', but the operator writes to PVC "
                f"'{self.config.claim_name}'; use that claim in spec.repository.claimName",
            )
        subpath = manifests.repository_subpath(namespace, server_name, spec)
        return subpath, self.writer.server_dir(namespace, subpath)

    # ----------------------------------------------------------------------------------- servers
    def reconcile_server(self, body: Mapping[str, Any], logger: logging.Logger | None = None) -> None:
        meta, spec = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock(meta["uid"]):
            conds: list[status.Condition] = []
            try:
                subpath, _ = self._server_dir(ns, name, spec)
                conds.append(status.Condition("RepositoryReady", True, "FolderReady", f"models go to {subpath}"))
            except (ArtifactError, OSError) as exc:
                msg = exc.message if isinstance(exc, ArtifactError) else str(exc)
                conds.append(status.Condition("RepositoryReady", False, "RepositoryUnusable", msg))
            scaling: status.Condition | None = None
            scaling_status: dict[str, Any] | None = None
            try:
                dep = self.kube.apply(manifests.deployment(body))
                self.kube.apply(manifests.service(body))
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
            models = sorted(
                m["metadata"]["name"] for m in self.kube.list_in(MODELS, ns) if m.get("spec", {}).get("server") == name
            )
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
            self.kube.patch_status(
                SERVERS,
                ns,
                name,
                {
                    "observedGeneration": meta.get("generation"),
                    "conditions": status.conditions(conds, prev.get("conditions"), meta.get("generation", 0)),
                    "replicas": replicas,
                    "readyReplicas": ready,
                    "selector": manifests.selector_string(name),
                    "models": models,
                    "endpoint": manifests.service_endpoint(ns, name, spec)["http"],
                    "autoscaling": scaling_status,
                },
            )

    def reconcile_server_named(self, namespace: str, name: str) -> None:
        body = self.kube.get(SERVERS, namespace, name)
        if body is not None and not body["metadata"].get("deletionTimestamp"):
            self.reconcile_server(body)

    # ------------------------------------------------------------------------------------ models
    def reconcile_model(self, body: Mapping[str, Any], retry: int = 0, from_timer: bool = False) -> None:
        """Render, sync the repository, read the server's index, write status.

        A failed render is not repeated by the resync timer for the same generation until its
        backoff expires (a bad checksum would otherwise re-download the file every resync);
        spec changes and kopf's own retries always render.
        """
        meta, spec = body["metadata"], body["spec"]
        ns, name, generation = meta["namespace"], meta["name"], meta.get("generation", 0)
        prev = body.get("status") or {}
        with self._lock(meta["uid"]):
            obs = status.ModelObservation(generation=generation, target=[], rendered=[])
            temporary: str | None = None
            server_name = spec["server"]
            server = self.kube.get(SERVERS, ns, server_name)
            if server is None:
                obs.render_error = (
                    "ServerNotFound",
                    f"InferenceServer '{server_name}' does not exist in namespace '{ns}'; create it or fix spec.server",
                )
            else:
                sspec = server["spec"]
                obs.endpoint = {**manifests.service_endpoint(ns, server_name, sspec), "model": name}
                server_dir: Path | None = None
                held = self._held_failure(meta["uid"], generation) if from_timer else None
                try:
                    subpath, server_dir = self._server_dir(ns, server_name, sspec)
                    rendered = render_model(name, spec, sspec.get("backends") or DEFAULT_BACKENDS, server_name)
                    obs.target = select_versions(rendered.config, rendered.versions)
                    if held:
                        obs.render_error, obs.failed_version = held
                    else:
                        result = self.writer.sync_model(server_dir, rendered)
                        obs.repository_path = f"{subpath}/{name}"
                        self._forget_old_location(ns, name, prev.get("repositoryPath"), obs.repository_path)
                        if result.changed:
                            kopf.info(_ref(body), reason="Rendered", message=_describe(result))
                except ConfigError as exc:
                    obs.render_error = ("InvalidSpec", str(exc))
                except ArtifactError as exc:
                    obs.render_error = (exc.reason, exc.message)
                    obs.failed_version = exc.version
                    if exc.reason in TEMPORARY_REASONS:
                        temporary = exc.message
                if not held:
                    self._remember_failure(meta["uid"], generation, obs)
                if server_dir is not None:
                    obs.rendered = self.writer.versions_on_disk(server_dir, name)
                url = self.index_url(ns, server_name, sspec)
                try:
                    obs.states = status.version_states(self.read_index(url), name)
                except (httpx.HTTPError, ValueError) as exc:
                    obs.index_error = (
                        f"cannot read the repository index of InferenceServer '{server_name}' at {url}: {exc}"
                    )
            new = status.model_status(obs, prev)
            self._post_events(body, prev, new)
            self.kube.patch_status(MODELS, ns, name, new)
            if temporary:
                raise kopf.TemporaryError(temporary, delay=backoff(retry))

    def _held_failure(self, uid: str, generation: int) -> tuple[tuple[str, str], int | None] | None:
        with self._locks_guard:
            failure = self._failures.get(uid)
        if failure and failure.generation == generation and time.monotonic() < failure.retry_at:
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
        if server_dir.is_dir():
            self.writer.remove_model(server_dir, old_path.name)

    @staticmethod
    def _post_events(body: Mapping[str, Any], prev: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """One event per change of the Ready condition, not one per timer tick."""
        before: Mapping[str, Any] = next((c for c in prev.get("conditions") or () if c["type"] == "Ready"), {})
        after = next(c for c in new["conditions"] if c["type"] == "Ready")
        if (before.get("status"), before.get("reason"), before.get("message")) == (
            after["status"],
            after["reason"],
            after["message"],
        ):
            return
        if after["status"] == "True":
            kopf.info(_ref(body), reason="Ready", message=after["message"])
        elif after["reason"] not in ("Loading",):
            kopf.warn(_ref(body), reason=after["reason"], message=after["message"])

    def delete_model(self, body: Mapping[str, Any], runtime_seconds: float) -> None:
        """Remove the model folder, then hold the finalizer until the server has unloaded the model."""
        meta, spec = body["metadata"], body["spec"]
        ns, name = meta["namespace"], meta["name"]
        with self._lock(meta["uid"]):
            server = self.kube.get(SERVERS, ns, spec["server"])
            recorded = (body.get("status") or {}).get("repositoryPath")
            if server is not None:
                try:
                    _, server_dir = self._server_dir(ns, spec["server"], server["spec"])
                    self.writer.remove_model(server_dir, name)
                except ArtifactError:
                    pass
            self._forget_old_location(ns, name, recorded, "")
            if server is None:
                return
            try:
                states = status.version_states(
                    self.read_index(self.index_url(ns, spec["server"], server["spec"])), name
                )
            except (httpx.HTTPError, ValueError):
                return  # no server to wait for
            loaded = [s.version for s in states if s.state in ("READY", "LOADING", "UNLOADING")]
            if loaded and runtime_seconds < self.config.unload_timeout:
                raise kopf.TemporaryError(f"waiting for the server to unload versions {loaded}", delay=1)


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
    interval = reconciler.config.resync_seconds
    # a fresh registry lacks kopf's default logins: the pod's service account, else $KUBECONFIG
    kopf.on.login(registry=registry, id="service-account")(kopf.login_with_service_account)
    kopf.on.login(registry=registry, id="kubeconfig")(kopf.login_with_kubeconfig)
    model: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=MODELS, registry=registry)
    server: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=SERVERS, registry=registry)

    def on_model(body: kopf.Body, retry: int, **_: Any) -> None:
        reconciler.reconcile_model(body, retry)

    def on_model_timer(body: kopf.Body, **_: Any) -> None:
        if not body["metadata"].get("deletionTimestamp"):
            reconciler.reconcile_model(body, from_timer=True)

    def on_model_delete(body: kopf.Body, runtime: Any, **_: Any) -> None:
        reconciler.delete_model(body, runtime.total_seconds())

    def on_server(body: kopf.Body, **_: Any) -> None:
        reconciler.reconcile_server(body)

    def on_owned(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(manifests.SERVER_LABEL)
        if owner and namespace:
            reconciler.reconcile_server_named(namespace, owner)

    for decorator, fn, kw, kind in (
        (kopf.on.create, on_model, model, "model"),
        (kopf.on.update, on_model, model, "model"),
        (kopf.on.resume, on_model, model, "model"),
        (kopf.on.create, on_server, server, "server"),
        (kopf.on.update, on_server, server, "server"),
        (kopf.on.resume, on_server, server, "server"),
    ):
        decorator(**kw, id=f"{kind}-{decorator.__name__}", backoff=10)(fn)
    kopf.on.delete(**model, id="model-delete", backoff=2)(on_model_delete)
    kopf.timer(**model, id="model-resync", interval=interval, initial_delay=interval)(on_model_timer)
    register_server_resync(reconciler, registry)
    # user edits to (or deletion of) owned objects are put back at once, not at the next resync
    owned = {"app.kubernetes.io/managed-by": manifests.MANAGED_BY}
    for resource in (
        ("apps", "v1", "deployments"),
        ("v1", "services"),
        ("autoscaling", "v2", "horizontalpodautoscalers"),
    ):
        kopf.on.event(*resource, id=f"owned-{resource[-1]}", labels=owned, registry=registry)(on_owned)


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
                    reconciler.reconcile_server(body)
                except Exception as exc:
                    log.warning(
                        "resync of InferenceServer %s/%s failed: %s",
                        body["metadata"]["namespace"],
                        body["metadata"]["name"],
                        exc,
                    )

    def start(**_: Any) -> None:
        # the copied context carries kopf's event-posting queue into the thread
        threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True, name="server-resync").start()

    def finish(**_: Any) -> None:
        stop.set()

    kopf.on.startup(registry=registry, id="server-resync-start")(start)
    kopf.on.cleanup(registry=registry, id="server-resync-stop")(finish)
