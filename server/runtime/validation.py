"""Checks an inference request against its model's config before it is queued."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import pb
from ..vocabulary import datatypes, tensors
from ..vocabulary.errors import BackendError, InvalidArgument
from ..vocabulary.types import InferenceRequest


class RequestValidator:
    """Precomputed per model version, so the hot path is a few dict lookups."""

    def __init__(self, config: pb.ModelConfig, checks_outputs: bool = True) -> None:
        """``checks_outputs`` False: ``check_outputs`` lets every output through (Triton's python backend
        hands over the datatype and shape ``execute`` returned)."""
        self.name = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {
            t.name: (datatypes.from_config(pb.DataType.Name(t.data_type)), list(t.dims), t.optional)
            for t in config.input
        }
        self.outputs = {t.name for t in config.output}
        #: what each output must look like, in its ``dims`` (an output with a ``reshape`` is checked once
        #: ``runtime.reshape`` made it so)
        self.output_specs = {
            t.name: (datatypes.from_config(pb.DataType.Name(t.data_type)).v2, list(t.dims))
            for t in config.output
            if checks_outputs and t.dims and t.data_type != pb.TYPE_INVALID
        }
        self.required = [n for n, (_, _, optional) in self.inputs.items() if not optional]
        #: ``accepts``' tables: numpy dtype and dims per input and output (dims as a tuple, -1 = any size)
        self._batching = self.max_batch_size > 0
        self._input_checks = {n: (_numpy(dtype.v2), tuple(dims)) for n, (dtype, dims, _) in self.inputs.items()}
        self._output_checks = {n: (_numpy(v2), tuple(dims)) for n, (v2, dims) in self.output_specs.items()}

    def _prefix(self, request: InferenceRequest) -> str:
        return f"[request id: {request.id or '<id_unknown>'}] "

    def validate(self, request: InferenceRequest) -> None:
        """Raise InvalidArgument (Triton's texts) unless ``request`` fits the model's inputs and outputs."""
        if not self.accepts(request):
            self.check(request)

    def accepts(self, request: InferenceRequest) -> bool:
        """True when ``request`` is certainly valid: every declared input, in its exact numpy dtype and
        shape, and only known outputs asked for. False leaves the verdict (and the error text) to ``check``.

        A few comparisons per input instead of ``check``'s lists and type lookups (README 'Performance
        against Triton and MLServer').
        """
        inputs = request.inputs
        if len(inputs) != len(self._input_checks):  # optional inputs left out: check decides
            return False
        batch = 0
        for name, array in inputs.items():
            spec = self._input_checks.get(name)
            if spec is None or array.dtype != spec[0]:
                return False
            shape = array.shape
            if self._batching:
                if not shape or not 1 <= shape[0] <= self.max_batch_size or (batch and shape[0] != batch):
                    return False
                batch = shape[0]
                shape = shape[1:]
            if shape != spec[1] and not _fits(shape, spec[1]):
                return False
        wanted = request.requested_outputs
        return wanted is None or not self.outputs or all(out in self.outputs for out in wanted)

    def check(self, request: InferenceRequest) -> None:
        """The full validation, raising the first problem found with Triton's error text."""
        if not self.inputs:  # a model without declared inputs (python model that auto-completes nothing)
            return
        batch = None
        for name, array in request.inputs.items():
            spec = self.inputs.get(name)
            if spec is None:
                raise InvalidArgument(
                    f"{self._prefix(request)}unexpected inference input '{name}' for model '{self.name}'; "
                    f"expected inputs: {', '.join(self.inputs)}"
                )
            dtype, dims, _ = spec
            got = datatypes.from_numpy(array.dtype)
            if got.v2 != dtype.v2:
                raise InvalidArgument(
                    f"{self._prefix(request)}inference input '{name}' data-type is '{got.v2}', but model "
                    f"'{self.name}' expects '{dtype.v2}'"
                )
            shape = list(array.shape)
            if self.max_batch_size > 0:
                if not shape:
                    raise InvalidArgument(
                        f"{self._prefix(request)}input '{name}' for model '{self.name}' needs a batch "
                        f"dimension: expected shape {[-1] + dims}, got {shape}"
                    )
                if batch is None:
                    batch = shape[0]
                elif shape[0] != batch:
                    raise InvalidArgument(
                        f"{self._prefix(request)}inputs of one request must share the batch size: input "
                        f"'{name}' has {shape[0]}, another has {batch}"
                    )
                if shape[0] < 1 or shape[0] > self.max_batch_size:
                    raise InvalidArgument(
                        f"{self._prefix(request)}inference request batch-size must be <= "
                        f"{self.max_batch_size} for '{self.name}', got {shape[0]}"
                    )
                item = shape[1:]
                expected = [-1] + dims
            else:
                item = shape
                expected = dims
            if len(item) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, item, strict=False)):
                raise InvalidArgument(
                    f"{self._prefix(request)}unexpected shape for input '{name}' for model '{self.name}'. "
                    f"Expected {expected}, got {shape}"
                )
        missing = [n for n in self.required if n not in request.inputs]
        if missing:
            raise InvalidArgument(
                # Triton core's text (infer_request.cc), checked against Triton 2.51
                f"{self._prefix(request)}expected {len(self.required)} inputs but got {len(request.inputs)} "
                f"inputs for model '{self.name}'. Got input(s) {_names(request.inputs)}, but missing required "
                f"input(s) {_names(missing)}. Please provide all required input(s)."
            )
        if request.requested_outputs is not None and self.outputs:
            for out in request.requested_outputs:
                if out not in self.outputs:
                    raise InvalidArgument(
                        f"{self._prefix(request)}unexpected inference output '{out}' for model "
                        f"'{self.name}'; outputs are: {', '.join(sorted(self.outputs))}"
                    )


def check_outputs(validator: RequestValidator, outputs: dict[str, Any]) -> None:
    """A model's answer must match its configuration: a wrong shape or type is the model's error (500).

    An output in the configured numpy dtype with the configured dims passes with two comparisons;
    anything else is looked at closely (``_check_output``; README 'Performance against Triton and MLServer').
    """
    checks = validator._output_checks
    skip = 1 if validator._batching else 0
    for name, array in outputs.items():
        spec = checks.get(name)
        if spec is None or not isinstance(array, np.ndarray):
            continue
        shape = array.shape[skip:]
        if array.dtype == spec[0] and (shape == spec[1] or _fits(shape, spec[1])):
            continue
        _check_output(validator, name, array)


def _check_output(validator: RequestValidator, name: str, array: np.ndarray) -> None:
    """One output, in full: raises BackendError saying what differs from the configuration."""
    spec = validator.output_specs.get(name)
    if spec is not None:
        dtype, dims = spec
        shape = list(array.shape)
        item = shape[1:] if validator.max_batch_size > 0 else shape
        got = datatypes.from_numpy(array.dtype).v2 if array.dtype != np.object_ else "BYTES"
        if len(item) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, item, strict=False)):
            expected = ([-1] if validator.max_batch_size > 0 else []) + dims
            raise BackendError(
                f"model '{validator.name}' returned output '{name}' with shape {shape}, but its configuration "
                f"says {expected}"
            )
        if got != dtype:
            raise BackendError(
                f"model '{validator.name}' returned output '{name}' as {got}, but its configuration says {dtype}"
            )


def _numpy(v2: str) -> np.dtype[Any] | None:
    """The one numpy dtype ``accepts`` lets through for a wire type (BYTES: object arrays)."""
    return datatypes.from_v2(v2).numpy


def _fits(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """``shape`` matches ``dims``, where -1 in ``dims`` stands for any size."""
    return len(shape) == len(dims) and all(d == -1 or d == s for d, s in zip(dims, shape, strict=True))


def raw_binary_inputs(config: pb.ModelConfig, body: bytes | memoryview) -> dict[str, Any]:
    """The one input of a raw binary request (``Inference-Header-Content-Length: 0``), shape deduced.

    Triton's binary data extension ("Raw Binary Request", docs/protocol/extension_binary_data.md;
    ``InferenceRequest::Normalize`` in core/src/infer_request.cc): the model has exactly one input; at
    most one of its dims is variable (-1), and that dim is what the byte count implies; a BYTES input
    must have dims [1] and the whole body is its one element; a batching model gets batch size 1.
    Error texts are Triton's.
    """
    if len(config.input) != 1:
        raise InvalidArgument(
            "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} "
            f"inputs in '{config.name}' model configuration"
        )
    spec = config.input[0]
    shape: list[int] = [1] if config.max_batch_size > 0 else []
    dynamic = -1
    fixed = 1
    for d in spec.dims:
        if d == -1:
            if dynamic != -1:
                raise InvalidArgument(
                    f"[request id: <id_unknown>] The shape of the raw input '{spec.name}' can not be deduced "
                    "because there are more than one variable-sized dimension"
                )
            dynamic = len(shape)
        else:
            fixed *= d
        shape.append(d)
    dtype = datatypes.from_config(pb.DataType.Name(spec.data_type))
    if dtype.v2 == "BYTES":
        if dynamic != -1 or fixed != 1:
            raise InvalidArgument(
                f"[request id: <id_unknown>] For BYTE datatype raw input '{spec.name}', the model must have input "
                "shape [1]"
            )
        array = np.empty(1, dtype=object)
        array[0] = bytes(body)
        return {spec.name: array.reshape(shape)}
    if dynamic != -1:
        unit = fixed * dtype.itemsize
        shape[dynamic] = len(body) // unit if unit else 0
    return {spec.name: tensors.from_raw(spec.name, dtype.v2, shape, body)}


def _names(names: Any) -> str:
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"
