"""Checks an inference request against its model's config before it is queued."""

from __future__ import annotations

from ..config import pb
from ..vocabulary import datatypes
from ..vocabulary.errors import InvalidArgument
from ..vocabulary.types import InferenceRequest


class RequestValidator:
    """Precomputed per model version, so the hot path is a few dict lookups."""

    def __init__(self, config: pb.ModelConfig) -> None:
        self.name = config.name
        self.max_batch_size = config.max_batch_size
        self.inputs = {
            t.name: (datatypes.from_config(pb.DataType.Name(t.data_type)), list(t.dims), t.optional)
            for t in config.input
        }
        self.outputs = {t.name for t in config.output}
        self.required = [n for n, (_, _, optional) in self.inputs.items() if not optional]

    def _prefix(self, request: InferenceRequest) -> str:
        return f"[request id: {request.id or '<id_unknown>'}] "

    def validate(self, request: InferenceRequest) -> None:
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
                f"{self._prefix(request)}expected {len(self.required)} inputs but got {len(request.inputs)} "
                f"inputs for model '{self.name}'; missing: {', '.join(missing)}"
            )
        if request.requested_outputs is not None and self.outputs:
            for out in request.requested_outputs:
                if out not in self.outputs:
                    raise InvalidArgument(
                        f"{self._prefix(request)}unexpected inference output '{out}' for model "
                        f"'{self.name}'; outputs are: {', '.join(sorted(self.outputs))}"
                    )
