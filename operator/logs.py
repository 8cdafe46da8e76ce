"""Log levels for the retries the operator expects.

kopf logs every ``TemporaryError`` at ERROR and posts it as a Warning event. Waiting for a server to
unload a deleted model is a retry by design (once a second, so the finalizer goes as soon as the
server is done), not an error: this filter turns those records into INFO before kopf's handlers see
them, so they are neither logged as errors nor posted as events.
"""

from __future__ import annotations

import logging

#: text of the TemporaryError raised while a deleted model is still loaded on a server
UNLOAD_WAIT = "waiting for the server to unload"


class ExpectedRetries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and UNLOAD_WAIT in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install() -> None:
    """Attach the filter to kopf's per-object logger (idempotent)."""
    target = logging.getLogger("kopf.objects")
    if not any(isinstance(f, ExpectedRetries) for f in target.filters):
        target.addFilter(ExpectedRetries())
