"""Runs an ensemble (``platform: "ensemble"``): a graph of steps, each a request to another model.

A step starts as soon as every ensemble tensor it reads exists, so independent steps run in parallel
(one asyncio task each). Each step goes through ``registry.infer``, i.e. the member's own scheduler,
so it is batched with the member's other traffic. ``input_map``/``output_map`` keys are the member's
tensor names and values the ensemble's (Triton's convention). An ensemble serves only while every
member is ready; errors name the failing step.

With model namespacing the lifecycle sets each step's ``model_namespace`` to the ensemble's own repository
(as Triton does when it connects the dependency graph); a step then asks the registry for
``<repository>/<member>`` (``repository.roots.identifier``): the member of the ensemble's repository, else
the only model of that name. Without it the namespace is empty and a step names its member as written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from ..config import pb
from ..repository.roots import identifier
from ..vocabulary.errors import InternalError, ServerError, Unavailable
from ..vocabulary.registry_view import RegistryView
from ..vocabulary.types import InferenceRequest
from .base import Scheduler


@dataclass(frozen=True)
class Step:
    index: int
    model_name: str
    #: "" = latest (Triton's model_version -1)
    model_version: str
    #: member input name → ensemble tensor
    input_map: dict[str, str]
    #: member output name → ensemble tensor
    output_map: dict[str, str]
    #: what the registry is asked for: the member's name, or ``<namespace>/<name>`` with a namespace
    target: str = ""

    @property
    def label(self) -> str:
        version = self.model_version or "latest"
        return f"step {self.index} ('{self.model_name}' version {version})"


class EnsembleScheduler(Scheduler):
    def __init__(self, config: pb.ModelConfig, registry: RegistryView) -> None:
        self.name = config.name
        self.registry = registry
        self.steps = [
            Step(
                index=i,
                model_name=s.model_name,
                model_version="" if s.model_version <= 0 else str(s.model_version),
                input_map=dict(s.input_map),
                output_map=dict(s.output_map),
                target=identifier(s.model_namespace, s.model_name) if s.model_namespace else s.model_name,
            )
            for i, s in enumerate(config.ensemble_scheduling.step)
        ]
        self.input_names = {t.name for t in config.input}
        self.output_names = [t.name for t in config.output]
        self._running = 0

    @property
    def pending(self) -> int:
        return self._running

    def unready_member(self) -> str | None:
        """Why the ensemble cannot serve now (a member not ready), or None. A member the server loads on its
        request (the model cache) counts as ready: its step's request loads it."""
        for step in self.steps:
            try:
                self.registry.resolve(step.target, step.model_version)
            except ServerError as exc:
                if self.registry.loads_on_demand(step.target):
                    continue
                return f"ensemble '{self.name}' is not ready: member '{step.model_name}' of {step.label}: {exc}"
        return None

    def ready(self) -> bool:
        return self.unready_member() is None

    async def submit(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        reason = self.unready_member()
        if reason is not None:
            raise Unavailable(reason)
        self._running += 1
        try:
            tensors = await self._run_graph(request)
        finally:
            self._running -= 1
        wanted = request.requested_outputs if request.requested_outputs is not None else self.output_names
        return {n: tensors[n] for n in wanted}

    async def _run_graph(self, request: InferenceRequest) -> dict[str, np.ndarray]:
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        # optional ensemble inputs the client left out count as present-but-empty: steps run without them
        absent = self.input_names - tensors.keys()
        waiting = list(self.steps)
        running: dict[asyncio.Task[dict[str, np.ndarray]], Step] = {}
        try:
            while waiting or running:
                for step in [s for s in waiting if all(t in tensors or t in absent for t in s.input_map.values())]:
                    waiting.remove(step)
                    task = asyncio.create_task(self._run_step(step, request, tensors))
                    running[task] = step
                if not running:
                    stuck = waiting[0]
                    missing = [t for t in stuck.input_map.values() if t not in tensors and t not in absent]
                    raise InternalError(
                        f"ensemble '{self.name}' {stuck.label} cannot run: no step produced {', '.join(missing)}"
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    outputs = task.result()  # raises the step's (already labelled) error
                    for member_name, ensemble_name in step.output_map.items():
                        if member_name not in outputs:
                            raise InternalError(
                                f"ensemble '{self.name}' {step.label} did not return output '{member_name}'"
                            )
                        tensors[ensemble_name] = outputs[member_name]
        finally:
            for task in running:
                task.cancel()
        return tensors

    async def _run_step(
        self, step: Step, request: InferenceRequest, tensors: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        sub = InferenceRequest(
            model_name=step.target,
            model_version=step.model_version,
            inputs={m: tensors[t] for m, t in step.input_map.items() if t in tensors},
            requested_outputs=list(step.output_map),
            id=request.id,
            parameters=request.parameters,
            priority=request.priority,
            timeout_us=request.timeout_us,
        )
        try:
            response = await self.registry.infer(sub)
        except ServerError as exc:
            # same error class (so the same HTTP/gRPC status), message naming the step
            labelled = type(exc)(f"ensemble '{self.name}' {step.label} failed: {exc.message}")
            raise labelled from exc
        return response.outputs
