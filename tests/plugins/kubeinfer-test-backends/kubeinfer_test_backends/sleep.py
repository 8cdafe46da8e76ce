"""``backend: "sleep"``: waits ``sleep_ms`` per execution (GIL released), then echoes INPUT0.

Besides OUTPUT0 (a copy of INPUT0) every row reports which instance executed it (INSTANCE), how many
rows that execution held (BATCH) and the model-wide number of that execution, counted from 1 in the
order executions started (EXECUTION), so tests can see parallelism, batch formation and order from outside.

Config parameters ``load_ms``: each instance takes this long to load (a slow load, for the model cache);
``load_bytes``: each instance holds this much memory while loaded (a footprint, for the model cache).
Request parameters: ``sleep_ms`` overrides the config's for the execution (the batch sleeps for its
longest request); ``fail: true`` makes that request alone fail, as a model error would; ``gate: <dir>``
holds the execution until the file ``<dir>/open`` exists, after dropping one ``<dir>/entered-*`` file
when it starts: tests see "executing now" and decide when it ends (tests/support/sleep_models.Gate).
"""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from kubeinfer.server.backends.base import Backend, BackendInstance, Batch, InstanceSpec, RequestResult
from kubeinfer.server.config import pb
from kubeinfer.server.vocabulary.types import InferenceRequest

#: a gate nobody opens fails its execution instead of holding the instance forever
GATE_TIMEOUT_S = 120.0


class SleepBackend(Backend):
    name: ClassVar[str] = "sleep"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.executions = itertools.count(1)  # shared by the version's instances; next() is atomic

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        if not config.input:
            t = config.input.add(name="INPUT0", data_type=pb.TYPE_FP32)
            t.dims.append(-1)
        if not config.output:
            t = config.output.add(name="OUTPUT0", data_type=pb.TYPE_FP32)
            t.dims.append(-1)
            for name in ("INSTANCE", "BATCH", "EXECUTION"):
                config.output.add(name=name, data_type=pb.TYPE_INT32).dims.append(1)

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        load = self.config.parameters.get("load_ms")
        if load is not None and load.string_value:
            time.sleep(float(load.string_value) / 1000)
        p = self.config.parameters.get("sleep_ms")
        sleep_ms = float(p.string_value) if p is not None and p.string_value else 0.0
        instance = SleepInstance(spec, sleep_ms / 1000, self.config.max_batch_size, self.executions)
        held = self.config.parameters.get("load_bytes")
        if held is not None and held.string_value:
            instance.held = np.ones(int(held.string_value), np.uint8)  # touched: resident
        return instance


class SleepInstance(BackendInstance):
    def __init__(
        self, spec: InstanceSpec, sleep_s: float, max_batch_size: int, executions: itertools.count[int]
    ) -> None:
        self.index = spec.index
        self.sleep_s = sleep_s
        self.max_batch_size = max_batch_size
        self.executions = executions
        #: memory this instance holds while loaded (``load_bytes``)
        self.held: np.ndarray | None = None

    def execute(self, batch: Batch) -> list[RequestResult]:
        t0 = time.perf_counter_ns()
        execution = next(self.executions)
        _pass_gates(batch.requests)
        time.sleep(max(_sleep_s(r, self.sleep_s) for r in batch.requests))
        t1 = time.perf_counter_ns()
        rows = batch.size
        results: list[RequestResult] = []
        for r in batch.requests:
            if r.parameters.get("fail"):
                results.append(RuntimeError("the request asked the sleep model to fail"))
                continue
            n = r.batch_size(self.max_batch_size)
            shape = (n, 1) if self.max_batch_size > 0 else (1,)
            results.append(
                {
                    "OUTPUT0": np.array(r.inputs["INPUT0"], copy=True),
                    "INSTANCE": np.full(shape, self.index, dtype=np.int32),
                    "BATCH": np.full(shape, rows, dtype=np.int32),
                    "EXECUTION": np.full(shape, execution, dtype=np.int32),
                }
            )
        batch.timings.compute_infer_ns = t1 - t0
        return results


def _sleep_s(request: InferenceRequest, default: float) -> float:
    value = request.parameters.get("sleep_ms")
    return float(value) / 1000 if isinstance(value, (int, float)) else default


def _pass_gates(requests: list[InferenceRequest]) -> None:
    """Announce this execution at every gate its requests name, then wait until each is open."""
    gates = {Path(g) for r in requests if isinstance(g := r.parameters.get("gate"), str)}
    for gate in gates:
        (gate / f"entered-{uuid.uuid4().hex}").touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    for gate in gates:
        while not (gate / "open").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test gate {gate} was not opened within {GATE_TIMEOUT_S:.0f} s")
            time.sleep(0.005)
