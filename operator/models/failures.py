"""When a model's failed render is tried again.

A failure that may go away by itself (the network, a download slot) is retried soon, by the work queue,
with growing delays. Any other failure waits for a change of the spec: the resync does not render that
generation again until the failure's backoff expires, which doubles each time, so a bad checksum is not
downloaded again every resync.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kubeinfer.server.sources.errors import TEMPORARY as TEMPORARY_SOURCE_REASONS

#: artifact failures that may go away by themselves (network, a download slot); the rest wait for a spec change
TEMPORARY_REASONS = {"FetchFailed", "Queued", *TEMPORARY_SOURCE_REASONS}
#: seconds (on average; spread by half either way, so queued models do not come back in step) before
#: kopf retries a model whose download waits for a slot
QUEUE_RETRY = 3.0
#: (first, longest) seconds before the resync timer retries a render that failed for the same generation
FAILURE_BACKOFF = (60.0, 900.0)

#: a render failure as the status reports it: ((reason, message), the version it concerns)
Failed = tuple[tuple[str, str], int | None]


def backoff(retry: int) -> float:
    """Seconds before the ``retry``-th retry of a temporary failure (or of a reconcile that raised)."""
    return float(min(300, 5 * 2 ** min(retry, 6)))


def retry_delay(reason: str, retry: int) -> float:
    """Seconds before a temporary failure is tried again: soon (spread) for a download slot, else backoff."""
    return QUEUE_RETRY * random.uniform(0.5, 1.5) if reason == "Queued" else backoff(retry)


@dataclass(frozen=True)
class Failure:
    generation: int
    error: tuple[str, str]
    version: int | None
    delay: float
    retry_at: float


class RenderFailures:
    """One model's last failed render. Held in the model's record (``controllers.model_record``) and used
    under the model's lock, so a model forgotten is its backoff forgotten."""

    def __init__(self) -> None:
        self.last: Failure | None = None

    def held(self, generation: int) -> Failed | None:
        """The failure of this generation while its backoff runs (the resync reports it, renders nothing)."""
        failure = self.last
        if failure and failure.generation == generation and time.monotonic() < failure.retry_at:
            return failure.error, failure.version
        return None

    def of(self, generation: int) -> Failed | None:
        """The last failed render of this generation (held or not), as (error, version)."""
        failure = self.last
        if failure and failure.generation == generation:
            return failure.error, failure.version
        return None

    def remember(self, generation: int, error: tuple[str, str] | None, version: int | None) -> None:
        """A render's outcome: a failure starts (or doubles) its backoff; a success (``error`` None) clears it."""
        if error is None:
            self.last = None
            return
        before = self.last
        delay = FAILURE_BACKOFF[0]
        if before and before.generation == generation:
            delay = min(before.delay * 2, FAILURE_BACKOFF[1])
        self.last = Failure(generation, error, version, delay, time.monotonic() + delay)
