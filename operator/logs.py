"""Log levels for the retries the operator expects.

kopf logs every ``TemporaryError`` at ERROR and posts it as a Warning event. Waiting for a server to
unload a deleted model is a retry by design (once a second, so the finalizer goes as soon as the
server is done), not an error: this filter turns those records into INFO before kopf's handlers see
them, so they are neither logged as errors nor posted as events.

kopf also logs every handler's success at INFO, the periodic resync included: one line per model per
interval, which buries what happened among hundreds of models. Those ticks become DEBUG (shown with
``--log-level debug``); a tick that changes something logs its own line.
"""

from __future__ import annotations

import logging

#: text of the TemporaryError raised while a deleted model is still loaded on a server
UNLOAD_WAIT = "waiting for the server to unload"
#: kopf's line for a resync tick that went through (kopf renders the handler as "Timer '<id>'")
RESYNC_TICK = "Timer 'model-resync' succeeded."


class ExpectedRetries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and UNLOAD_WAIT in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
        elif record.levelno == logging.INFO and record.getMessage() == RESYNC_TICK:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            # the logger let it through as INFO: now it passes only where DEBUG is wanted
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def install() -> None:
    """Attach the filter to kopf's per-object logger (idempotent)."""
    target = logging.getLogger("kopf.objects")
    if not any(isinstance(f, ExpectedRetries) for f in target.filters):
        target.addFilter(ExpectedRetries())
