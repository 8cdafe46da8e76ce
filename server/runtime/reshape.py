"""Config ``reshape``: the shape a model sees differs from the shape its clients see, for every backend.

Triton's model configuration ("Reshape"): an input's ``dims`` is the shape clients send and
``reshape.shape`` the shape the model receives; an output's ``reshape.shape`` is the shape the model
produces and ``dims`` the shape the server reports and returns. Triton core applies both, not the backends
(``InferenceRequest::Normalize`` for inputs, ``InferenceResponse::Output::Reshape`` for outputs), so a
Python, PyTorch, TensorRT, ONNX or TensorFlow model behaves alike; here ``ModelVersion`` applies them, after
validating a request against ``dims`` and before checking an answer against them.

The batch dimension (``max_batch_size > 0``) stays in front, untouched. Variable sizes (-1) carry over in
order, as Triton's: the k-th -1 of the target shape takes the size the k-th -1 of the source shape had in
the tensor (config validation made sure the fixed sizes between them hold the same counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import pb
from ..vocabulary.errors import BackendError, InvalidArgument


def reshaped(shape: Sequence[int], source: Sequence[int], target: Sequence[int], batching: bool) -> list[int]:
    """``shape`` (a tensor of config shape ``source``, batch first when ``batching``) as ``target`` says.

    Raises ValueError when ``shape`` does not have ``source``'s rank.
    """
    skip = 1 if batching else 0
    item = shape[skip:]
    if len(item) != len(source):
        raise ValueError(f"{list(shape)} does not have the rank of {([-1] if batching else []) + list(source)}")
    variable = [s for s, d in zip(item, source, strict=True) if d == -1]
    if len(variable) != sum(1 for d in target if d == -1):
        raise ValueError(f"{list(source)} and {list(target)} differ in their variable-size dimensions")
    sizes = iter(variable)
    return list(shape[:skip]) + [next(sizes) if d == -1 else d for d in target]


class Reshaper:
    """The reshapes of one model version's config, precomputed; empty (falsy) when it has none."""

    def __init__(self, config: pb.ModelConfig) -> None:
        self.name = config.name
        self.batching = config.max_batch_size > 0
        #: input name → (dims, reshape.shape): clients' shape → the model's
        self.inputs = {t.name: (list(t.dims), list(t.reshape.shape)) for t in config.input if t.HasField("reshape")}
        #: output name → (reshape.shape, dims): the model's shape → clients'
        self.outputs = {t.name: (list(t.reshape.shape), list(t.dims)) for t in config.output if t.HasField("reshape")}

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    def model_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A validated request's inputs in the shapes the model takes (views, no copy)."""
        if not self.inputs:
            return inputs
        out = dict(inputs)
        for name, (dims, shape) in self.inputs.items():
            array = out.get(name)
            if array is None:  # an optional input left out
                continue
            try:
                out[name] = array.reshape(reshaped(array.shape, dims, shape, self.batching))
            except ValueError:
                # only a request that skipped validation gets here (a warm-up sample written in the model's shape)
                raise InvalidArgument(
                    f"input '{name}' for model '{self.name}' has shape {list(array.shape)}, which cannot be "
                    f"reshaped from dims {dims} to reshape {shape}"
                ) from None
        return out

    def client_outputs(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A model's outputs in the shapes its clients get; BackendError when one cannot be (the model
        produced another shape than its config's ``reshape`` says)."""
        if not self.outputs:
            return outputs
        out = dict(outputs)
        for name, (shape, dims) in self.outputs.items():
            array = out.get(name)
            if not isinstance(array, np.ndarray):  # not asked for
                continue
            try:
                out[name] = array.reshape(reshaped(array.shape, shape, dims, self.batching))
            except ValueError:
                expected = ([-1] if self.batching else []) + shape
                raise BackendError(
                    f"model '{self.name}' returned output '{name}' with shape {list(array.shape)}, but its "
                    f"configuration says {expected} (reshape), served as dims {dims}"
                ) from None
        return out
