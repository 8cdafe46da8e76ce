"""Triton's logging extension: read and change the server's log settings while it runs.

Settings as Triton names them: ``log_file`` (string), ``log_info``, ``log_warning``, ``log_error``
(booleans), ``log_verbose_level`` (uint32; > 0 = debug) and ``log_format`` (``default`` or ``ISO8601``).
docs/protocol/extension_logging.md spells two of them ``log_warnings`` / ``log_errors``, but Triton 2.51
itself answers ``log_warning`` / ``log_error`` (checked side by side): answers use Triton's, and a POST
may use either spelling. A POST changes only the settings it names and answers
with all of them. The same values start from the command line (``--log-verbose``, ``--log-info``,
``--log-warning``, ``--log-error``, ``--log-format``, ``--log-file``).

They map onto Python's logging: the root logger's level is DEBUG when verbose, else INFO when
``log_info``, else WARNING when ``log_warning``, else ERROR when ``log_error``, else nothing is logged.
``log_file`` is read-only through the API, as in Triton since its fix of a client choosing where the server
writes (set it with ``--log-file``): a POST naming it is refused with Triton's words and status (501, gRPC
UNIMPLEMENTED), "log file location can not be updated through network protocol".
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

from ..vocabulary.errors import InvalidArgument, Unsupported

FORMATS = {
    "default": ("%(asctime)s %(levelname)s %(name)s: %(message)s", None),
    "ISO8601": ("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z"),
}
_UINT32_MAX = (1 << 32) - 1
#: the protocol document's spellings
_ALIASES = {"log_warnings": "log_warning", "log_errors": "log_error"}


@dataclass
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def level(self) -> int:
        if self.log_verbose_level > 0:
            return logging.DEBUG
        if self.log_info:
            return logging.INFO
        if self.log_warning:
            return logging.WARNING
        if self.log_error:
            return logging.ERROR
        return logging.CRITICAL + 10  # nothing


class LogControl:
    """Owns the process's logging configuration; applies changes at once."""

    def __init__(self, settings: LogSettings | None = None) -> None:
        self._settings = settings or LogSettings()
        self._lock = threading.Lock()
        self._handler: logging.Handler | None = None

    def configure(self) -> None:
        """Install the handler and level (at start)."""
        with self._lock:
            s = self._settings
            handler: logging.Handler = logging.FileHandler(s.log_file) if s.log_file else logging.StreamHandler()
            self._handler = handler
            root = logging.getLogger()
            root.handlers[:] = [handler]
            self._apply()

    def _apply(self) -> None:
        s = self._settings
        fmt, datefmt = FORMATS[s.log_format]
        if self._handler is not None:
            self._handler.setFormatter(logging.Formatter(fmt, datefmt))
        logging.getLogger().setLevel(s.level())

    def settings(self) -> dict[str, Any]:
        return asdict(self._settings)

    def update(self, updates: dict[str, Any]) -> dict[str, Any]:
        """Apply a POST (values already typed: bool / int / str); returns every setting."""
        new = LogSettings(**asdict(self._settings))
        for name, value in updates.items():
            name = _ALIASES.get(name, name)
            if value is None and name in asdict(new):  # gRPC's empty SettingValue: nothing to change
                continue
            if name in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise InvalidArgument(f"expecting a boolean value for log setting '{name}', got {value!r}")
                setattr(new, name, value)
            elif name == "log_verbose_level":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT32_MAX:
                    raise InvalidArgument(f"expecting an unsigned integer for log setting '{name}', got {value!r}")
                new.log_verbose_level = value
            elif name == "log_format":
                if not isinstance(value, str) or value not in FORMATS:
                    raise InvalidArgument(f"invalid log_format '{value}': the formats are {', '.join(FORMATS)}")
                new.log_format = value
            elif name == "log_file":
                if value is not None:  # Triton refuses any log_file, even the current one (its words and 501)
                    raise Unsupported("log file location can not be updated through network protocol")
            else:
                raise InvalidArgument(
                    f"unknown log setting '{name}': the settings are {', '.join(asdict(self._settings))}"
                )
        with self._lock:
            self._settings = new
            self._apply()
        return self.settings()
