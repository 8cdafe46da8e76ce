"""The kopf wiring: which handlers, indexes and background loops a ``Reconciler`` runs under kopf.

InferenceServers use kopf's change handlers (create, update, resume) and are put back at once when a user
edits an object they own. InferenceModels are not kopf's (the Reconciler watches them, ``model_watch.py``).
kopf's indexes keep InferenceServers and their EndpointSlices in memory; both kinds are resynced by threads
of our own rather than by kopf timers.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf

from ..api import GROUP, VERSION
from ..kube.client import SERVERS
from ..servers import manifests
from .reconciler import Reconciler

log = logging.getLogger("kubeinfer.operator")


def register(reconciler: Reconciler, registry: kopf.OperatorRegistry) -> None:
    """Attach the handlers to ``registry`` (a fresh one per operator, so tests can build their own)."""
    # a fresh registry lacks kopf's default logins: the pod's service account, else $KUBECONFIG
    kopf.on.login(registry=registry, id="service-account")(kopf.login_with_service_account)
    kopf.on.login(registry=registry, id="kubeconfig")(kopf.login_with_kubeconfig)
    server: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=SERVERS, registry=registry)

    def on_server(body: kopf.Body, **_: Any) -> None:
        reconciler.parts.handler_context = contextvars.copy_context()
        reconciler.reconcile_server(body)

    def on_owned(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        owner = (body.get("metadata", {}).get("labels") or {}).get(manifests.SERVER_LABEL)
        if owner and namespace:
            reconciler.reconcile_server_named(namespace, owner)

    for decorator in (kopf.on.create, kopf.on.update, kopf.on.resume):
        decorator(**server, id=f"server-{decorator.__name__}", backoff=10)(on_server)
    # InferenceModels are not kopf's: the Reconciler watches them (model_watch.py), see reconciler.py
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
                    context = reconciler.parts.handler_context
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
        reconciler.records.attached = True
        reconciler.start()

    def finish(**_: Any) -> None:
        reconciler.close()

    kopf.on.startup(registry=registry, id="indexes-attach")(start)
    kopf.on.cleanup(registry=registry, id="reconciler-close")(finish)
