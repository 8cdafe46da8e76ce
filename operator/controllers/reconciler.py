"""The operator's Reconciler: it owns the server controller and the model controller (composed, each handed
the parts they share: ``reconcile_parts.py``), the models' records, their watch events, work queue, resync
pass and finalizer, and delegates each reconcile to its controller.

InferenceModels come by the thousand, so they do not use kopf's change handlers (those write their
progress and a diff base onto every object: a patch, and the watch event it causes, per model and
change). A model's watch events only update an in-memory copy of it (``models``) and queue its uid when
its generation is new to this process (created, changed, or first seen after a start); reconciles run in
the queue's threads, one at a time per object. The operator keeps the finalizer (its delete waits until
the servers unloaded the model). A resync pass over the in-memory copies replaces per-object timers.

Reconciles are synchronous on purpose: they run in threads, so downloads, file writes and the (blocking)
kubernetes client never stall kopf's event loop. A per-object lock keeps a resync and a change of the
same object from writing at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any, cast

import kopf

from ..kube.client import SERVERS, Kube
from ..kube.events import EventPoster
from ..kube.model_watch import ModelWatch
from ..models.failures import backoff
from ..traffic.rollout import decision_lost
from .model_reconcile import NEEDS_RENDER, ModelController
from .model_record import ModelRecord
from .reconcile_parts import ReconcileParts, log
from .server_reconcile import ServerController
from .settings import OperatorConfig
from .workqueue import WorkQueue

#: held by every InferenceModel until its folder is removed and the servers unloaded it
FINALIZER = "serving.kubeinfer.io/finalizer"


class Reconciler:
    """The operator's two controllers run from the models' watch, work queue and resync pass (module docstring)."""

    def __init__(self, config: OperatorConfig, kube: Kube) -> None:
        #: the collaborators both controllers are handed: built once, shared
        self.parts = ReconcileParts(config, kube)
        self.server_controller = ServerController(self.parts)
        self.model_controller = ModelController(self.parts)
        #: what the kopf wiring, the command line and the tests use of the parts
        self.config, self.kube, self.lookup = config, kube, self.parts.lookup
        self.writer, self.gate = self.parts.writer, self.parts.gate
        #: what this process keeps per model (``model_record.py``); ``models``: uid -> its newest object
        self.records, self.models = self.parts.records, self.parts.models
        #: the controllers' entries, for the kopf handlers (``wiring.py``), the resync loops and the tests
        self.reconcile_server = self.server_controller.reconcile_server
        self.reconcile_server_named = self.server_controller.reconcile_server_named
        self.reconcile_model = self.model_controller.reconcile_model
        self.delete_model = self.model_controller.delete_model
        self.queue = WorkQueue(self._work, max(2, config.workers), name="reconcile")
        self.watch = ModelWatch(kube, config.namespaces, self.model_event, self._listed)

    # ------------------------------------------------------------------------------------- life cycle
    def start(self) -> None:
        """Start the threads, then watch the models once kopf's indexes hold what exists (a model reconciled
        before its server and the server's EndpointSlices are in them would get a wrong status)."""
        poster = self.parts.poster = EventPoster(self.kube)
        poster.start()
        self.model_controller.rechecker.start()
        self.queue.start()
        self.records.attached = True
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
            self.records.complete = True

    def close(self) -> None:
        """Stop the model watch, the work queue, the rechecker and retries, close the HTTP clients (idempotent)."""
        self.kube.stop.set()
        self.watch.stop()
        self.queue.stop()
        self.model_controller.close()
        if self.parts.poster is not None:
            self.parts.poster.stop()
        self.parts.reader.close()
        self.writer.fetcher.close()

    def lock(self, uid: str) -> threading.Lock:
        """The InferenceModel's lock: held by whoever writes for it (a reconcile, its deletion)."""
        return self.model_controller.lock(uid)

    def _forget(self, uid: str) -> None:
        """The model is gone: what the controller keeps of it, and its queued run."""
        self.model_controller.forget(uid)
        self.queue.discard(uid)

    # ------------------------------------------------------------------------- model events and queue
    def model_event(self, kind: str | None, body: Mapping[str, Any]) -> None:
        """A watch event of an InferenceModel (``kind`` None: listed). Cheap: it keeps the newest object and
        queues the uid when there is work: a generation new to this process, the finalizer to add, a deletion."""
        meta = body["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            self._forget(uid)
            return
        record = self.records.of(uid)
        known = record.body
        if known is not None and decision_lost(known, body):
            body = {**body, "status": known["status"]}  # the decision stays in force (rollout.decision_lost)
        record.body = dict(body)
        ours = FINALIZER in (meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            if ours:  # a render in progress sees the deletion and gives up (``superseded``); then the delete runs
                if record.deleting_since is None:
                    record.deleting_since = time.monotonic()
                self.queue.add(uid)
            return
        generation = meta.get("generation", 0)
        if not ours or record.wanted != generation:
            record.wanted = generation
            self.queue.add(uid)

    def _work(self, uid: Hashable) -> float | None:
        """One queued run for the newest object: its deletion, its finalizer, its reconcile. Returns when to run
        it again (a retry), or None."""
        key = cast(str, uid)
        record = self.records.get(key)
        body = None if record is None else record.body
        if record is None or body is None:
            return None
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            return self._finalize(key, record, body) if FINALIZER in finalizers else None
        if FINALIZER not in finalizers:
            # before anything is written: what is on the volume must outlive no InferenceModel
            if not self.kube.set_finalizers(ns, name, [*finalizers, FINALIZER], meta.get("resourceVersion") or ""):
                return 0.5  # changed meanwhile (or gone): again with the object the watch brings
        generation = meta.get("generation", 0)
        # a generation already reconciled is here again for a render the resync asked for
        resync = record.handled == generation
        retry = record.retries
        try:
            self.reconcile_model(body, retry, resync)
            if not resync and (body.get("spec") or {}).get("sequenceBatching") is not None:
                # its pool's Service gets session affinity now, not at the next resync (sequence_routing.py)
                self._in_handler_context(self.reconcile_server_named, ns, body["spec"]["server"])
        except kopf.TemporaryError as exc:
            record.retries = retry + 1
            return float(exc.delay or backoff(retry))
        except Exception as exc:
            log.warning("reconcile of InferenceModel %s/%s failed: %s", ns, name, exc)
            if resync:
                return None  # the next resync tries again
            record.retries = retry + 1
            return backoff(retry)
        record.retries = 0
        if self.records.get(key) is record:  # not deleted meanwhile
            record.handled = generation
        return None

    def _in_handler_context(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a copy of a kopf handler's context (kopf's event posting lives there)."""
        context = self.parts.handler_context
        return call(*args) if context is None else context.copy().run(call, *args)

    def resync_models(self, stopped: Callable[[], bool]) -> int:
        """One resync pass over every model (the resync timer): status refreshed, drift repaired. Models whose
        render is needed again are queued; returns how many."""
        queued = 0
        for uid, body in self.records.with_bodies():
            if stopped():
                break
            meta = body["metadata"]
            record = self.records.get(uid)
            handled = None if record is None else record.handled
            if meta.get("deletionTimestamp") or handled != meta.get("generation", 0):
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

    # --------------------------------------------------------------------------------------- deletion
    def _finalize(self, uid: str, record: ModelRecord, body: Mapping[str, Any]) -> float | None:
        """The delete handler, then the finalizer released; a retry delay while a server still has it loaded."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if record.deleting_since is None:
            record.deleting_since = time.monotonic()
        waited = time.monotonic() - record.deleting_since
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
