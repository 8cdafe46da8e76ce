"""Kubernetes Events about InferenceModels, posted in the background (kopf posts those of the other kinds).

Events are best effort, as kopf's: a full queue or a failed post drops the event with a log line, never
slows a reconcile. A few threads post them, so a burst (a Rendered and a Ready event per model of a bulk
apply) goes out at the API server's pace.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import socket
import threading
from collections.abc import Mapping
from typing import Any

from ..api import GROUP, VERSION

COMPONENT = "kubeinfer-operator"
#: events waiting to be posted beyond which new ones are dropped
BACKLOG = 20_000
log = logging.getLogger("kubeinfer.operator.kube.events")


def namespace_terminating(exc: BaseException) -> bool:
    """The API server refused a create because the namespace is being deleted (403, reason Forbidden,
    cause NamespaceTerminating), not for want of a right."""
    if getattr(exc, "status", None) != 403:
        return False
    body = getattr(exc, "body", None) or ""
    return "NamespaceTerminating" in str(body) or "because it is being terminated" in str(body)


def event_body(obj: Mapping[str, Any], type: str, reason: str, message: str) -> dict[str, Any]:
    meta = obj["metadata"]
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": obj.get("kind") or "InferenceModel",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": type,
        "reason": reason,
        "message": message[:1024],  # as kopf: the API refuses longer messages
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": socket.gethostname(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventPoster:
    """``kube.create_event(namespace, body)`` from ``threads`` threads."""

    def __init__(self, kube: Any, threads: int = 2) -> None:
        self.kube = kube
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(BACKLOG)
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True, name=f"events-{i}") for i in range(threads)]
        self.posted = 0

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def post(self, obj: Mapping[str, Any], type: str, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait(event_body(obj, type, reason, message))
        except queue.Full:
            log.warning("dropped event %s on %s: %d events wait to be posted", reason, obj["metadata"]["name"], BACKLOG)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop after the posts in progress (what is still queued is dropped: events are best effort)."""
        self._stopped.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                event = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.kube.create_event(event["metadata"]["namespace"], event)
                self.posted += 1
            except Exception as exc:
                # a namespace being deleted refuses new objects: its models' last events have nowhere to go
                level = logging.DEBUG if namespace_terminating(exc) else logging.INFO
                log.log(level, "could not post event %s: %s", event["reason"], exc)
