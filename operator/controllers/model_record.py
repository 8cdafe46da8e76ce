"""One record per InferenceModel: everything the operator keeps about a model between its reconciles, in one
place, so that forgetting a model (it was deleted) is one removal and nothing about it outlives it.

Before, each of these lived in a map of its own (uid -> generation queued, uid -> render memo, uid -> lock,
...), and a deleted model had to be removed from each; one missed map was a leak per deleted model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..models.failures import RenderFailures
from ..models.render_memo import RenderMemo
from ..traffic.rollout import RolloutWindow


@dataclass
class ModelRecord:
    """What this process knows of one model (by uid)."""

    #: held by whoever writes for the model (a reconcile, its deletion): one at a time per model
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: the newest object its watch events brought (None: none yet, e.g. a reconcile called directly)
    body: dict[str, Any] | None = None
    #: the generation queued for a reconcile, and the generation whose reconcile finished
    wanted: int | None = None
    handled: int | None = None
    #: failed reconciles of the queued generation in a row (the work queue's backoff)
    retries: int = 0
    #: when this process first saw the model being deleted (the unload wait counts from there)
    deleting_since: float | None = None
    #: the last render that succeeded, for a resync to skip the next one (``render_memo.py``)
    rendered: RenderMemo | None = None
    #: status.coldStart.render of the last render that changed the folder: kept here, not only in the status,
    #: because the status written right after a render may be deferred (``ModelController._nudged``)
    render_record: dict[str, Any] | None = None
    #: what a render changed, while its status write waits for the replicas: said in the Ready event that
    #: follows, so a create costs one event, not a Rendered and a Ready event
    render_note: str | None = None
    #: the last failed render and its backoff (``failures.py``)
    failures: RenderFailures = field(default_factory=RenderFailures)
    #: the canary's numbers over the rollout window, with weights (``rollout.py``)
    rollout: RolloutWindow = field(default_factory=RolloutWindow)


class ModelRecords:
    """The records by uid; thread-safe (the watch, the work queue, the rechecker and the resync use them)."""

    def __init__(self) -> None:
        self._records: dict[str, ModelRecord] = {}
        self._guard = threading.Lock()
        #: the newest object of each model, as a mapping (uid -> body) for whoever reads them
        self.bodies = ModelBodies(self)
        #: bodies are kept from the model watch's events (False until the operator starts: then they are read)
        self.attached = False
        #: the bodies hold every model (set once the watch listed every namespace)
        self.complete = False

    def get(self, uid: str) -> ModelRecord | None:
        with self._guard:
            return self._records.get(uid)

    def of(self, uid: str) -> ModelRecord:
        """The model's record, made if it has none."""
        with self._guard:
            record = self._records.get(uid)
            if record is None:
                record = self._records[uid] = ModelRecord()
            return record

    def forget(self, uid: str) -> None:
        """The model is gone: everything about it goes."""
        with self._guard:
            self._records.pop(uid, None)

    def with_bodies(self) -> list[tuple[str, dict[str, Any]]]:
        """(uid, newest object) of every model with one, at this moment."""
        with self._guard:
            records = list(self._records.items())
        return [(uid, r.body) for uid, r in records if r.body is not None]


class ModelBodies(Mapping[str, dict[str, Any]]):
    """uid -> the newest object of the model, read from the records (the record keeps the one copy)."""

    def __init__(self, records: ModelRecords) -> None:
        self._records = records

    def __getitem__(self, uid: str) -> dict[str, Any]:
        record = self._records.get(uid)
        body = None if record is None else record.body
        if body is None:
            raise KeyError(uid)
        return body

    def __iter__(self) -> Iterator[str]:
        return iter([uid for uid, _ in self._records.with_bodies()])

    def __len__(self) -> int:
        return len(self._records.with_bodies())
