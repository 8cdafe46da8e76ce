"""Runs Triton ``model.py`` files in-process: one ``TritonPythonModel`` object per instance thread.

Why in-process: tensors are handed over by reference (no copy through shared memory as with Triton's
stub processes; see benchmarks/python_backend_isolation.py), and BLS calls go straight to the registry
on the server loop. The trade-off is isolation: a model shares the server's interpreter, GIL and
crash fate. Each instance imports ``model.py`` under its own module name, so module-level state is
per instance as it is with Triton's one-process-per-instance design.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from ...config import ConfigError, config_from_dict, config_to_dict, pb
from ...vocabulary import errors
from ...vocabulary.registry_view import RegistryView
from ..base import Backend, BackendInstance, Batch, InstanceSpec, RequestResult
from . import triton_python_backend_utils as pb_utils

# existing Triton models do `import triton_python_backend_utils as pb_utils`
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

_module_ids = itertools.count()

_ERROR_TYPES: dict[int, type[errors.ServerError]] = {
    pb_utils.TritonError.INVALID_ARG: errors.InvalidArgument,
    pb_utils.TritonError.NOT_FOUND: errors.NotFound,
    pb_utils.TritonError.UNAVAILABLE: errors.Unavailable,
    pb_utils.TritonError.UNSUPPORTED: errors.Unsupported,
    pb_utils.TritonError.ALREADY_EXISTS: errors.AlreadyExists,
    pb_utils.TritonError.CANCELLED: errors.Cancelled,
}


def load_model_class(model_file: Path, label: str) -> type:
    """Import ``model_file`` as a fresh module and return its ``TritonPythonModel`` class."""
    if not model_file.is_file():
        raise ConfigError(f"python model file {model_file} not found")
    module_name = f"_kubeinfer_python_model_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(module_name, model_file)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # SyntaxError, ImportError, anything model.py raises at import
        raise ConfigError(f"{label}: importing {model_file.name} failed: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, "TritonPythonModel", None)
    if not isinstance(cls, type):
        raise ConfigError(f"{label}: {model_file.name} defines no class TritonPythonModel")
    return cls


class PythonBackend(Backend):
    name: ClassVar[str] = "python"

    def __init__(
        self, config: pb.ModelConfig, version_path: Path, version: int, context: RegistryView | None = None
    ) -> None:
        super().__init__(config, version_path, version, context)
        if context is not None:
            pb_utils._bind(context, context.loop)

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Let the model's optional ``auto_complete_config`` staticmethod fill inputs/outputs/batching."""
        model_file = cls.model_path(config, version_path)
        model_cls = load_model_class(model_file, f"model '{config.name}'")
        hook = getattr(model_cls, "auto_complete_config", None)
        if hook is None:
            return
        helper = pb_utils.ModelConfig(config_to_dict(config))
        try:
            hook(helper)
        except Exception as exc:
            raise ConfigError(
                f"model '{config.name}': auto_complete_config failed: {type(exc).__name__}: {exc}"
            ) from None
        completed = config_from_dict(helper.as_dict())
        config.CopyFrom(completed)

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        return PythonInstance(self, spec)


class PythonInstance(BackendInstance):
    def __init__(self, backend: PythonBackend, spec: InstanceSpec) -> None:
        config = backend.config
        self.model_name = config.name
        self.version = backend.version
        model_cls = load_model_class(backend.model_file(), f"model '{config.name}'")
        self.model = model_cls()
        self.output_names = [t.name for t in config.output]
        self._loop: asyncio.AbstractEventLoop | None = None  # the instance's own loop for async execute
        args = {
            "model_config": json.dumps(config_to_dict(config)),
            "model_instance_kind": spec.kind,
            "model_instance_name": f"{spec.name}_{spec.index}",
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(backend.version_path.parent),
            "model_version": str(backend.version),
            "model_name": config.name,
        }
        init = getattr(self.model, "initialize", None)
        if init is not None:
            try:
                self._call(init, args)
            except Exception as exc:
                raise ConfigError(f"model '{config.name}': initialize failed: {type(exc).__name__}: {exc}") from None

    def _call(self, fn: Any, *args: Any) -> Any:
        """Call a model method; coroutine functions run on this instance's private loop."""
        if inspect.iscoroutinefunction(fn):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(fn(*args))
        return fn(*args)

    def execute(self, batch: Batch) -> list[RequestResult]:
        t0 = time.perf_counter_ns()
        requests = [
            pb_utils.InferenceRequest(
                model_name=self.model_name,
                inputs=[pb_utils.Tensor(n, a) for n, a in r.inputs.items()],
                requested_output_names=r.requested_outputs if r.requested_outputs is not None else self.output_names,
                model_version=self.version,
                request_id=r.id,
                timeout=r.timeout_us,
                parameters={k: v for k, v in r.parameters.items() if isinstance(v, (str, int, float, bool))},
            )
            for r in batch.requests
        ]
        t1 = time.perf_counter_ns()
        try:
            responses = self._call(self.model.execute, requests)
        except Exception as exc:  # Triton semantics: execute raising fails every request of this call
            error = errors.BackendError(
                f"model '{self.model_name}' execute failed: {type(exc).__name__}: {_message(exc)}"
            )
            return [error] * len(requests)
        t2 = time.perf_counter_ns()
        if not isinstance(responses, (list, tuple)) or len(responses) != len(requests):
            got = len(responses) if isinstance(responses, (list, tuple)) else type(responses).__name__
            error = errors.BackendError(
                f"model '{self.model_name}' execute returned {got} responses for {len(requests)} requests; "
                "return one InferenceResponse per request"
            )
            return [error] * len(requests)
        results = [self._result(resp, req) for resp, req in zip(responses, batch.requests, strict=True)]
        t3 = time.perf_counter_ns()
        batch.timings.compute_input_ns = t1 - t0
        batch.timings.compute_infer_ns = t2 - t1
        batch.timings.compute_output_ns = t3 - t2
        return results

    def _result(self, response: Any, request: Any) -> RequestResult:
        if not isinstance(response, pb_utils.InferenceResponse):
            return errors.BackendError(
                f"model '{self.model_name}' returned {type(response).__name__}, expected pb_utils.InferenceResponse"
            )
        if response.has_error():
            err = response.error()
            assert err is not None
            return _ERROR_TYPES.get(err.code(), errors.BackendError)(f"model '{self.model_name}': {err.message()}")
        wanted = request.requested_outputs
        outputs: dict[str, np.ndarray] = {}
        for t in response.output_tensors():
            if wanted is not None and t.name() not in wanted:
                continue
            array = t.as_numpy()
            if array.dtype == np.object_ and array.size:
                array = np.vectorize(_to_bytes, otypes=[object])(array)
            outputs[t.name()] = array
        if wanted is not None:
            missing = [n for n in wanted if n not in outputs]
            if missing:
                return errors.BackendError(
                    f"model '{self.model_name}' did not return requested output(s): {', '.join(missing)}"
                )
        return outputs

    def close(self) -> None:
        fin = getattr(self.model, "finalize", None)
        try:
            if fin is not None:
                self._call(fin)
        finally:
            if self._loop is not None:
                self._loop.close()


def _message(exc: Exception) -> str:
    return exc.message() if isinstance(exc, pb_utils.TritonModelException) else str(exc)


def _to_bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8")
