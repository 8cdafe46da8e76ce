"""The backend interface: a factory per model version and one instance per execution slot."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..config import pb
from ..config.platforms import model_filename
from ..vocabulary.errors import BackendError
from ..vocabulary.registry_view import RegistryView
from ..vocabulary.types import ExecutionTimings

if TYPE_CHECKING:
    from ..vocabulary.types import InferenceRequest


@dataclass(frozen=True)
class InstanceSpec:
    """Where one instance runs: ``kind`` is "CPU" or "GPU" (KIND_AUTO already resolved)."""

    #: the instance group's name
    name: str
    kind: str
    device_id: int = 0
    index: int = 0
    #: total instances of this model version (backends size thread pools with it)
    total: int = 1
    #: Triton's instance name, ``<group name>_<index in the group>`` (``model_instance_name``, error texts)
    instance_name: str = ""


@dataclass
class Batch:
    """Requests executed together; their inputs have equal shapes apart from the batch dim."""

    requests: list[InferenceRequest]
    max_batch_size: int
    timings: ExecutionTimings = field(default_factory=ExecutionTimings)
    #: indices of filler requests (the sequence batcher's idle slots): executed, never answered or counted
    fillers: frozenset[int] = frozenset()
    #: rows of each request (``InferenceRequest.batch_size``), given by a scheduler that counted them already
    rows: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [r.batch_size(self.max_batch_size) for r in self.requests]

    @property
    def size(self) -> int:
        return sum(self.rows)


#: result for one request: its outputs, or the error that request alone failed with; ``None`` when
#: the request's responses went to ``request.stream`` (decoupled models); or a ``Future`` of one of
#: those when the backend answers after ``execute`` returned (Python models' response senders): the
#: instance is free for the next batch while the request waits for its answer
RequestResult = dict[str, np.ndarray] | Exception | None | Future[Any]


class Rescheduled(BackendError):
    """The model released the request with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: the backend's result
    for it. The iterative sequence batcher (``sequence_batching { iterative_sequence: true }``) executes the
    same request again; any other scheduler answers it with this error (Triton fails the release so)."""

    def __init__(self, model: str) -> None:
        super().__init__(
            "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but the scheduler of model "
            f"'{model}' does not reschedule requests: set sequence_batching {{ iterative_sequence: true }}"
        )


class BackendInstance(ABC):
    """One execution slot (session, engine context, Python model object).

    ``execute`` is called from the instance's own thread, never concurrently on one instance; an instance
    that sets ``may_run_on_loop`` may also be called on the event loop's thread (scheduling.instance_pool
    does so for executions too short to be worth a thread hand-off). Never set it for code that calls back
    into the loop and waits (BLS), which would deadlock there.
    """

    may_run_on_loop: ClassVar[bool] = False
    #: an instance whose work happens elsewhere (a Python model's stub process) may offer
    #: ``start(batch, done)`` and the loop it must be called on (``async_loop``): it sends the batch off and
    #: returns; ``done(results)`` is called once, on that loop, when the answer is read. The instance pool
    #: then uses no thread for it, and starts the next batch from within ``done``
    async_loop: Any = None

    @abstractmethod
    def execute(self, batch: Batch) -> list[RequestResult]:
        """Run ``batch`` and return one result per request, in order."""

    def close(self) -> None:
        """Release the instance's resources (sessions, device memory)."""

    def ready(self) -> bool:
        """Whether the instance can execute now (a Python model's stub process may be restarting)."""
        return True

    def unready_reason(self) -> str:
        """Why it is not ready ("" when it is)."""
        return ""

    def when_ready(self, callback: Callable[[], None]) -> bool:
        """Call ``callback`` (on the event loop) once the instance can execute again and return True, or
        return False when it can now. The instance pool keeps a restarting instance out of rotation so."""
        return False


class TensorBackendInstance(BackendInstance):
    """For backends that run one tensor dict: concatenates the batch and slices results back."""

    @abstractmethod
    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """Execute the model once on batched inputs."""

    output_names: list[str]

    def execute(self, batch: Batch) -> list[RequestResult]:
        t0 = time.perf_counter_ns()
        requests = batch.requests
        if len(requests) == 1:
            inputs = requests[0].inputs
        else:
            names = requests[0].inputs.keys()
            inputs = {n: np.concatenate([r.inputs[n] for r in requests]) for n in names}
        wanted = self._wanted_outputs(requests)
        t1 = time.perf_counter_ns()
        outputs = self.run(inputs, wanted)
        t2 = time.perf_counter_ns()
        results: list[RequestResult]
        if len(requests) == 1:
            results = [outputs]
        else:
            results = []
            start = 0
            for rows in batch.rows:
                # views into the batched output: no copy per request
                results.append({n: a[start : start + rows] for n, a in outputs.items()})
                start += rows
        t3 = time.perf_counter_ns()
        batch.timings.compute_input_ns = t1 - t0
        batch.timings.compute_infer_ns = t2 - t1
        batch.timings.compute_output_ns = t3 - t2
        return results

    def _wanted_outputs(self, requests: list[InferenceRequest]) -> list[str]:
        names: set[str] = set()
        for r in requests:
            if r.requested_outputs is None:
                return self.output_names
            names.update(r.requested_outputs)
        return [n for n in self.output_names if n in names]


class Backend(ABC):
    """Factory for one model version's instances. Registered under ``kubeinfer.backends``."""

    #: the ``backend`` name in config.pbtxt
    name: ClassVar[str]
    #: model file name for a backend the platform table (``config.platforms``) does not know
    default_filename: ClassVar[str] = ""
    #: whether the backend loads ``model_operations.op_library_filename`` (Triton: onnxruntime only); the
    #: runtime warns that the field is ignored for every other backend
    loads_op_libraries: ClassVar[bool] = False
    #: those libraries, resolved and checked (``repository.layout.op_library_path``); set by the runtime
    #: before the first ``create_instance``
    op_libraries: Sequence[Path] = ()
    #: whether the runtime holds each output to the datatype and dims its config gives (a 500 when they
    #: differ); False where Triton hands over what the model returned (its python backend)
    checks_outputs: ClassVar[bool] = True

    def __init__(
        self, config: pb.ModelConfig, version_path: Path, version: int, context: RegistryView | None = None
    ) -> None:
        """``context`` is the registry as backends may use it (BLS); None outside a server."""
        self.config = config
        self.version_path = version_path
        self.version = version
        self.context = context

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Fill what the config leaves out from the model file (inputs, outputs, max_batch_size)."""

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Raise ConfigError when the config contradicts the model file."""

    @classmethod
    def model_path(cls, config: pb.ModelConfig, version_path: Path) -> Path:
        """The model file of one version folder: ``default_model_filename``, else the platform table's.

        A name for messages and for finding the file; a backend reads it through
        ``repository.model_files.pinned(path)``: during a load, the descriptor the runtime opened beneath
        the repository, so a symlink swapped in after the check cannot redirect the read."""
        return version_path / (model_filename(config) or cls.default_filename)

    def model_file(self) -> Path:
        return self.model_path(self.config, self.version_path)

    @abstractmethod
    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        """Load one instance; may be slow, runs off the event loop."""
