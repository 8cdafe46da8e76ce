"""The ``triton_python_backend_utils`` API (Triton's python_backend), implemented over kubeinfer.

Same names, call shapes and error texts as the module a Triton 2.51 stub gives ``model.py`` (read
from a running Triton, see the README's Python backend table), so a Triton model runs unchanged:
``Tensor``, ``InferenceRequest`` (incoming requests with ``get_response_sender()`` and
``is_cancelled()``; BLS with ``exec``/``async_exec``, decoupled too), ``InferenceResponse``,
``InferenceResponseSender``, ``TritonError``, ``TritonModelException``, ``MetricFamily``/``Metric``,
``Logger``, ``ModelConfig`` (auto-complete), the tensor/config lookup helpers, ``get_model_dir``,
``is_model_ready``, ``load_model``/``unload_model`` and the ``TRITONSERVER_*`` constants.

Tensors live in host memory (numpy). Everything that needs the server goes through the host
(``context``): the stub's channel, or the registry itself for a model run in the server's process.

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from . import context
from .pb_metrics import Metric, MetricFamily
from .pb_request import InferenceRequest, InferenceResponseSender, InferenceTrace, ResponseSender
from .pb_types import TYPE_CODES, InferenceResponse, Logger, Tensor, TritonError, TritonModelException
from .pb_types import numpy_to_triton_type as numpy_to_triton_type

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "ResponseSender",
    "Tensor",
    "TritonError",
    "TritonModelException",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
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


class PreferredMemory:
    """Where BLS outputs should live; every tensor is host memory here, so it is accepted and ignored."""

    def __init__(self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` → ``numpy.float32``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return TYPE_CODES.get(data_type)


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """BYTES elements as 4-byte little-endian lengths, each followed by its bytes, in C order."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts += [struct.pack("<I", len(data)), data]
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    values = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        values.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    return np.array(values, dtype=np.object_)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for t in inference_request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for t in inference_response.output_tensors():
        if t.name() == name:
            return t
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    tensors: list[dict[str, Any]] = model_config.get("input", [])
    for t in tensors:
        if t.get("name") == name:
            return t
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    tensors: list[dict[str, Any]] = model_config.get("output", [])
    for t in tensors:
        if t.get("name") == name:
            return t
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


def get_model_dir() -> str:
    """The version folder of the model whose code calls it (``<repository>/<model>/<version>``)."""
    instance = context.current()
    if instance is None:
        raise TritonModelException("get_model_dir() is only available inside a model's code")
    return str(instance.version_dir)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    host = context.host()
    return bool(host is not None and host.is_model_ready(model_name, str(model_version or "")))


def load_model(model_name: str, config: str = "", files: object = None) -> None:
    """Load or reload ``model_name`` (explicit model control mode only), ``config`` (JSON) overriding its
    config.pbtxt; returns once it is loaded. As Triton 2.51's, errors are ``TritonModelException``
    ``Failed to load model: Failed to process the request for model '<instance>', message: <why>``.

    ``files`` (Triton writes them into a temporary model folder) are refused, as the repository API
    refuses ``file:`` parameters: this server loads only what is in its repository.
    """
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
        )
    # Triton's keys are "file:<path in the model folder>"; load_with_parameters refuses them by name
    parameters: dict[str, Any] = {"file:" + str(path).removeprefix("file:"): "" for path in files or {}}
    if config:
        parameters["config"] = config
    _model_control("load", model_name, parameters, False)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Stop serving ``model_name`` (explicit model control mode only). Returns without waiting for it to
    drain and unload, as Triton's, so a model may unload itself; a model that is not loaded is no error."""
    _model_control("unload", model_name, {}, unload_dependents)


def _model_control(action: str, name: str, parameters: dict[str, Any], unload_dependents: bool) -> None:
    """Ask the server to load or unload ``name``; blocks the model's thread until it answers."""
    host = context.host()
    if host is None:
        raise TritonModelException(f"{action}_model() is only available inside a model served by kubeinfer")
    try:
        host.model_control(action, name, parameters, unload_dependents)
    except context.ControlRefused as exc:
        instance = context.current()
        where = instance.instance_name if instance is not None else ""
        raise TritonModelException(
            f"Failed to {action} model: Failed to process the request for model '{where}', message: {exc}"
        ) from None


class ModelConfig:
    """The object ``TritonPythonModel.auto_complete_config`` gets and must return.

    Rules and messages as Triton 2.51's ``triton_python_backend_utils.ModelConfig``: the config may gain
    inputs/outputs (``name``, ``data_type``, ``dims``, inputs also ``optional``), a ``max_batch_size``
    (not below the configured one), a dynamic batcher (unless another scheduler is set), and
    ``model_transaction_policy {decoupled}`` (not changed once set).
    """

    def __init__(self, model_config: dict[str, Any] | str) -> None:
        self._model_config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = self._model_config["max_batch_size"]
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function for "
                f"model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        found = next((s for s in ("sequence_batching", "ensemble_scheduling") if s in self._model_config), None)
        if found is not None:
            raise ValueError(
                f"Configuration specified scheduling_choice as '{found}', but auto-complete-config function for "
                f"model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
            )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, ("name", "data_type", "dims"))

    def _add(self, kind: str, tensor: dict[str, Any], valid: tuple[str, ...]) -> None:
        model = self._name
        for key in tensor:
            if key not in valid:
                allowed = (
                    "'name', 'data_type', 'dims' and 'optional'"
                    if kind == "input"
                    else ("'name', 'data_type' and 'dims'")
                )
                raise ValueError(
                    f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{model}' contains "
                    f"property other than {allowed}."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model '{model}' is missing "
                    f"'{key}' property."
                )
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            data_type = current.get("data_type", "TYPE_INVALID")
            if data_type != "TYPE_INVALID" and data_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects datatype {data_type} for {kind} "
                    f"'{tensor['name']}', model provides {tensor['data_type']}"
                )
            dims = [int(d) for d in current.get("dims", [])]
            if dims and dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{model}', tensor '{tensor['name']}': the model expects dims {list(tensor['dims'])} "
                    f"but the model configuration specifies dims {dims}"
                )
            if kind == "input" and "optional" in current and "optional" in tensor:
                if current["optional"] != tensor["optional"]:
                    raise ValueError(
                        f"model '{model}', tensor '{tensor['name']}': the model expects optional "
                        f"{tensor['optional']} but the model configuration specifies optional {current['optional']}"
                    )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        model = self._name
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{model}' contains "
                    "property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{model}', which is "
                    f"already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
