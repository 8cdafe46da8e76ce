"""The InferenceModels, listed once and then watched: every change is handed to ``on_event``.

kopf handles InferenceServers and the objects the operator owns; InferenceModels, which come by the
thousand, are watched here instead. kopf's per-event machinery (an object memory, body views, loggers,
cause detection, a finalizer and a diff base patched onto every object, progress annotations) costs
far more CPU per model and change than this, which costs one JSON decode per event. The finalizer and
the delete handling are the Reconciler's (``reconciler.py``).

One thread per watched namespace (or one for the whole cluster): a list gives every model and a
resourceVersion, then a watch from it; a watch that ends (the server's timeout) is resumed from the last
version seen (bookmarks keep it current), and one that expired (410 Gone) or failed lists again. Objects a
new list no longer has are handed on as deleted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("kubeinfer.operator.watch")

OnEvent = Callable[[str | None, dict[str, Any]], None]


class ModelWatch:
    """``kube``: ``list_models(namespace)`` and ``watch_models(namespace, resource_version)`` (kube.py);
    ``on_event(type, object)``: type None for listed objects (as kopf's listing), else the watch event's type;
    ``on_listed(namespace)``: after each complete list."""

    def __init__(
        self,
        kube: Any,
        namespaces: list[str],
        on_event: OnEvent,
        on_listed: Callable[[str | None], None] | None = None,
    ) -> None:
        self.kube = kube
        self.namespaces: list[str | None] = list(namespaces) or [None]
        self.on_event = on_event
        self.on_listed = on_listed
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: namespace -> uid -> namespace/name of the objects seen there (to tell what a new list lacks)
        self._seen: dict[str | None, dict[str, dict[str, Any]]] = {}
        self.listed: set[str | None] = set()

    def start(self) -> None:
        for namespace in self.namespaces:
            thread = threading.Thread(
                target=self._run, args=(namespace,), daemon=True, name=f"watch-models-{namespace or 'all'}"
            )
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Stop handing on events (a watch blocked in a read ends with its stream: the thread is a daemon)."""
        self._stop.set()

    def _run(self, namespace: str | None) -> None:
        delay = 0.5
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list(namespace)
                    delay = 0.5
                version = self._watch(namespace, version)
            except ApiException as exc:
                if exc.status != 410:
                    log.warning("watching InferenceModels%s: %s %s", _where(namespace), exc.status, exc.reason)
                    self._stop.wait(delay)
                    delay = min(delay * 2, 10.0)
                version = None  # expired, or failed: list again
            except Exception as exc:  # a dropped connection, an API server restart
                if self._stop.is_set():
                    return
                log.info("watch of InferenceModels%s ended (%s); listing again", _where(namespace), exc)
                self._stop.wait(delay)
                delay = min(delay * 2, 10.0)
                version = None

    def _list(self, namespace: str | None) -> str:
        items, version = self.kube.list_models(namespace)
        seen = self._seen.setdefault(namespace, {})
        now = {item["metadata"]["uid"]: item for item in items}
        for uid in [uid for uid in seen if uid not in now]:  # deleted while nobody watched
            gone = seen.pop(uid)
            if not self._stop.is_set():
                self.on_event("DELETED", gone)
        for uid, item in now.items():
            seen[uid] = _identity(item)
            if self._stop.is_set():
                break
            self.on_event(None, item)
        self.listed.add(namespace)
        if self.on_listed is not None:
            self.on_listed(namespace)
        return str(version)

    def _watch(self, namespace: str | None, version: str) -> str | None:
        """Hand on events until the stream ends; the version to resume from (None: list again)."""
        seen = self._seen.setdefault(namespace, {})
        for event in self.kube.watch_models(namespace, version):
            if self._stop.is_set():
                return None
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return None
                raise ApiException(status=obj.get("code"), reason=obj.get("message"))
            meta = obj.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            if kind == "BOOKMARK":
                continue
            if kind == "DELETED":
                seen.pop(str(meta.get("uid")), None)
            else:
                seen[str(meta.get("uid"))] = _identity(obj)
            self.on_event(kind, obj)
        return version


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    """What a DELETED event needs of an object the watch lost sight of."""
    meta = obj["metadata"]
    return {"metadata": {k: meta.get(k) for k in ("uid", "name", "namespace")}}


def _where(namespace: str | None) -> str:
    return f" in '{namespace}'" if namespace else ""
