"""``pb_utils`` value types: Tensor, TritonError, TritonModelException, InferenceResponse, Logger.

Names, signatures and defaults follow Triton 2.51's ``c_python_backend_utils`` (read from its pybind
docstrings): ``TritonError(message, code=INTERNAL)``, ``InferenceResponse(output_tensors=[], error=None)``
(plus ``parameters``, which later Triton versions added), ``Logger.log(message, level=INFO)``. Tensors
are host numpy arrays (in a stub process, views of the shared memory the server wrote them to).

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import enum
import json
import logging
from typing import Any

import numpy as np

from . import context

_log = logging.getLogger("kubeinfer.python_model")

# Triton's numeric TRITONSERVER_DataType codes (triton_to_numpy_type / numpy_to_triton_type)
TYPE_CODES: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def numpy_to_triton_type(data_type: Any) -> int | None:
    dt = np.dtype(data_type)
    if dt.kind in ("S", "U", "O"):
        return 13
    for code, np_type in TYPE_CODES.items():
        if np_type is not np.object_ and np.dtype(np_type) == dt:
            return code
    return None


class _ErrorCode(enum.IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7


class TritonError(Exception):
    """An error a model puts in a response (``InferenceResponse(error=...)``) or gets back from BLS."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: int = _ErrorCode.INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        try:
            self._code = _ErrorCode(int(code))
        except ValueError:
            self._code = _ErrorCode.INTERNAL

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    def __str__(self) -> str:
        return self._message


class TritonModelException(Exception):
    """Raised by models to fail the requests of the current ``execute`` call, and by the API on misuse."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class Tensor:
    """A named host tensor. ``as_numpy`` returns the array itself (no copy)."""

    def __init__(self, name: str, data: Any) -> None:
        array = data if isinstance(data, np.ndarray) else np.asarray(data)
        if array.dtype.kind in ("U", "S"):
            array = array.astype(np.object_)
        self._name = name
        self._array = array

    @classmethod
    def from_numpy(cls, name: str, array: np.ndarray) -> Tensor:
        return cls(name, array)

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        """Host tensors only (numpy reads DLPack producers)."""
        return cls(name, np.from_dlpack(capsule))

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | str | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        if isinstance(error, str):
            error = TritonError(error)
        self._error = error
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters = dict(parameters or {})

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class _LogLevel(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LEVELS = {
    _LogLevel.INFO: logging.INFO,
    _LogLevel.WARNING: logging.WARNING,
    _LogLevel.ERROR: logging.ERROR,
    _LogLevel.VERBOSE: logging.DEBUG,
}


def log_line(level: int, message: str) -> None:
    """Where a ``Logger`` line goes: the host (the server log), else this process's logger."""
    host = context.host()
    if host is not None:
        host.log(int(level), str(message))
    else:
        _log.log(_LEVELS.get(_LogLevel(int(level)), logging.INFO), "%s", message)


class Logger:
    """``pb_utils.Logger.log_info(...)``: goes to the server log (logger ``kubeinfer.python_model``)."""

    LogLevel = _LogLevel
    INFO = _LogLevel.INFO
    WARNING = _LogLevel.WARNING
    ERROR = _LogLevel.ERROR
    VERBOSE = _LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = _LogLevel.INFO) -> None:
        log_line(_LogLevel(int(level)), message)

    @staticmethod
    def log_info(message: str) -> None:
        log_line(_LogLevel.INFO, message)

    @staticmethod
    def log_warn(message: str) -> None:
        log_line(_LogLevel.WARNING, message)

    @staticmethod
    def log_error(message: str) -> None:
        log_line(_LogLevel.ERROR, message)

    @staticmethod
    def log_verbose(message: str) -> None:
        log_line(_LogLevel.VERBOSE, message)
