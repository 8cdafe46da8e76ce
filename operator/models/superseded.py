"""Has an InferenceModel been deleted or changed since its render began? Asked between a download's chunks.

kopf queues an object's next event (its deletion, a new spec) behind the handler that is running, and a
model's work queue runs one reconcile per object at a time, so a multi-minute download would hold the
finalizer, or delay the new spec, until it ends. With the model watch attached the newest object is in
memory (no API call); before, the object is read at most every ``CANCEL_POLL`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from ..api import GROUP, VERSION
from ..kube.client import MODELS, Kube

#: seconds between checks, during a long fetch, that the object was not deleted or changed meanwhile
CANCEL_POLL = 3.0
log = logging.getLogger("kubeinfer.operator")


def superseded(
    kube: Kube,
    models: Mapping[str, Mapping[str, Any]] | None,
    namespace: str,
    name: str,
    uid: str,
    generation: int,
    stopped: Callable[[], bool] | None,
) -> Callable[[], bool]:
    """A check for the fetch to poll; ``models`` (uid -> newest object, kept by the watch) or None: read
    from the API. ``stopped`` (the resync pass ending) cancels too."""
    if models is not None:

        def seen() -> bool:
            if stopped is not None and stopped():
                return True
            now = models.get(uid)
            meta = (now or {}).get("metadata") or {}
            return now is None or bool(meta.get("deletionTimestamp")) or meta.get("generation") != generation

        return seen

    state = {"checked": time.monotonic(), "verdict": False}

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
                kube.custom.get_namespaced_custom_object(
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
