"""The ``triton_python_backend_utils`` API (Triton's python_backend), implemented over kubeinfer.

Same names and call shapes as NVIDIA's module, so a Triton ``model.py`` runs unchanged: ``Tensor``,
``InferenceRequest`` (incoming requests and BLS calls via ``exec``/``async_exec``), ``InferenceResponse``,
``TritonError``, ``TritonModelException``, ``get_input_tensor_by_name``, ``get_output_config_by_name``,
``triton_string_to_numpy``, ``Logger``. Tensors live in host memory (numpy): models run in-process, so
handing a tensor over is a reference, never a copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ...vocabulary.registry_view import RegistryView
    from ...vocabulary.types import InferenceRequest as CoreRequest

_log = logging.getLogger("kubeinfer.python_model")

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

_TYPE_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# Triton's numeric TRITONSERVER_DataType codes, used by triton_to_numpy_type / numpy_to_triton_type
_CODES = {
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


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` → ``numpy.float32``."""
    return _TYPE_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _CODES[data_type]


def numpy_to_triton_type(data_type: Any) -> int | None:
    dt = np.dtype(data_type)
    if dt.kind in ("S", "U", "O"):
        return 13
    for code, np_type in _CODES.items():
        if np_type is not np.object_ and np.dtype(np_type) == dt:
            return code
    return None


class TritonError(Exception):
    """An error a model returns in a response (``InferenceResponse(error=...)``) or gets from BLS."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return self._message


class TritonModelException(Exception):
    """Raised by models to fail the requests of the current ``execute`` call."""

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
        """Host tensors only (numpy ≥ 1.22 reads DLPack producers)."""
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
        self._parameters = parameters or {}

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)


class _BlsBinding:
    """How BLS requests reach the server: its registry and the event loop it runs on (set at load)."""

    registry: RegistryView | None = None
    loop: asyncio.AbstractEventLoop | None = None


_bls = _BlsBinding()


def _bind(registry: RegistryView, loop: asyncio.AbstractEventLoop | None) -> None:
    """Called by the Python backend when it loads a model (not part of Triton's API)."""
    _bls.registry = registry
    _bls.loop = loop


class InferenceRequest:
    """An incoming request (in ``execute``) or a BLS request to any loaded model (``exec``)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_version: int = -1,
        correlation_id: int | str = 0,
        request_id: str = "",
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
        **_: Any,
    ) -> None:
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names) if requested_output_names is not None else None
        self._model_version = model_version
        self._correlation_id = correlation_id
        self._request_id = request_id
        self._flags = flags
        self._timeout = timeout
        if isinstance(parameters, str):
            parameters = json.loads(parameters) if parameters else {}
        self._parameters = parameters or {}

    # ---- accessors Triton offers on incoming requests -------------------------------------
    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return list(self._requested or [])

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def model_name(self) -> str:
        return self._model_name

    def model_version(self) -> int:
        return self._model_version

    def flags(self) -> int:
        return self._flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        return False

    # ---- BLS --------------------------------------------------------------------------------
    def _core_request(self) -> CoreRequest:
        from ...vocabulary.types import InferenceRequest as CoreRequest

        return CoreRequest(
            model_name=self._model_name,
            model_version="" if self._model_version in (-1, None) else str(self._model_version),
            inputs={t.name(): t.as_numpy() for t in self._inputs},
            requested_outputs=self._requested,
            id=self._request_id,
            parameters=dict(self._parameters),
            timeout_us=int(self._timeout or 0),
        )

    def _submit(self) -> Any:
        """Schedule the call on the server loop; returns a concurrent.futures.Future."""
        registry, loop = _bls.registry, _bls.loop
        if registry is None or loop is None:
            raise TritonModelException("BLS is only available inside a model served by kubeinfer")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise TritonModelException("BLS exec() must not be called on the server's event loop")
        return asyncio.run_coroutine_threadsafe(_call(registry, self._core_request()), loop)

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run the request through its model's scheduler (batched with other traffic); blocks."""
        if decoupled:
            raise TritonModelException("decoupled BLS calls are not supported by kubeinfer")
        return self._submit().result()

    def async_exec(self, decoupled: bool = False) -> Awaitable[InferenceResponse]:
        """Awaitable form of ``exec`` for ``async def execute``."""
        if decoupled:
            raise TritonModelException("decoupled BLS calls are not supported by kubeinfer")
        return asyncio.wrap_future(self._submit())


async def _call(registry: RegistryView, request: CoreRequest) -> InferenceResponse:
    from ...vocabulary.errors import ServerError

    try:
        response = await registry.infer(request)
    except ServerError as exc:
        return InferenceResponse(error=TritonError(exc.message, _code_of(exc)))
    except Exception as exc:  # a failing callee must surface as an error response, as in Triton
        return InferenceResponse(error=TritonError(f"{type(exc).__name__}: {exc}"))
    return InferenceResponse(output_tensors=[Tensor(n, a) for n, a in response.outputs.items()])


def _code_of(exc: Exception) -> int:
    from ...vocabulary import errors

    for cls, code in (
        (errors.InvalidArgument, TritonError.INVALID_ARG),
        (errors.NotFound, TritonError.NOT_FOUND),
        (errors.Unavailable, TritonError.UNAVAILABLE),
        (errors.Unsupported, TritonError.UNSUPPORTED),
        (errors.AlreadyExists, TritonError.ALREADY_EXISTS),
        (errors.Cancelled, TritonError.CANCELLED),
    ):
        if isinstance(exc, cls):
            return code
    return TritonError.INTERNAL


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for t in model_config.get("input", []):
        if t.get("name") == name:
            return t
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for t in model_config.get("output", []):
        if t.get("name") == name:
            return t
    return None


class ModelConfig:
    """The ``auto_complete_model_config`` object handed to ``TritonPythonModel.auto_complete_config``."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = model_config
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        if not isinstance(max_batch_size, int) or max_batch_size < 0:
            raise ValueError(f"max_batch_size must be a non-negative int, got {max_batch_size!r}")
        current = int(self._config.get("max_batch_size") or 0)
        if current not in (0, max_batch_size):
            raise ValueError(f"configuration specified max_batch_size {current}, but the model sets {max_batch_size}")
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if "sequence_batching" in self._config:
            raise ValueError("configuration specifies sequence batching; dynamic batching cannot be set too")
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        if not isinstance(tensor, dict) or "name" not in tensor:
            raise ValueError(f"model {kind} must be a dict with a 'name', got {tensor!r}")
        allowed = {
            "name",
            "data_type",
            "dims",
            "optional",
            "format",
            "reshape",
            "label_filename",
            "is_shape_tensor",
            "allow_ragged_batch",
        }
        unknown = set(tensor) - allowed
        if unknown:
            raise ValueError(f"model {kind} '{tensor['name']}' has unknown keys: {', '.join(sorted(unknown))}")
        for existing in self._config[kind]:
            if existing.get("name") != tensor["name"]:
                continue
            for key in ("data_type", "dims"):
                if key in tensor and key in existing and _norm(existing[key]) != _norm(tensor[key]):
                    raise ValueError(
                        f"{kind} '{tensor['name']}' has {key} {existing[key]} in the configuration but "
                        f"{tensor[key]} in the model"
                    )
                if key in tensor and key not in existing:
                    existing[key] = tensor[key]
            return
        self._config[kind].append(dict(tensor))

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)


def _norm(value: Any) -> Any:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else value


class Logger:
    """``pb_utils.Logger.log_info(...)``: goes to the server log."""

    @staticmethod
    def log(message: str, level: int = logging.INFO) -> None:
        _log.log(level, "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        _log.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        _log.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        _log.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        _log.debug("%s", message)
