"""How long one model version took to become servable, phase by phase: its cold start.

Measured where the work happens: the lifecycle's build (``load``: from reading the model's folder to every
instance loaded), the warm-up samples (``warmup``) and the version's first successful request
(``first_inference``: that request's own duration, which pays for what frameworks initialise lazily).
``load`` and ``warmup`` are disjoint and together are the build's wall clock.

The numbers go where readers already look: the repository index row of a serving version
(``cold_start``; the operator reads every replica's index on each resync, so the InferenceModel status gets
them without another request) and the histogram ``kubeinfer_model_load_duration_seconds{phase}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: phases in the order they happen
PHASES = ("load", "warmup", "first_inference")

#: called with (model, version, phase, seconds) once per phase of each load (the metrics)
PhaseHook = Callable[[str, str, str, float], None]


@dataclass
class ColdStart:
    """One version's cold start; times are wall-clock seconds since the epoch (comparable across replicas
    and with the operator's own records), durations are from a monotonic clock."""

    #: when the load began
    started_at: float
    load_seconds: float = 0.0
    warmup_seconds: float = 0.0
    #: when the first successful request was answered, and how long it took (None: none yet)
    first_inference_at: float | None = None
    first_inference_seconds: float | None = None

    @property
    def ready_at(self) -> float:
        return self.started_at + self.load_seconds + self.warmup_seconds

    def first_inference(self, seconds: float, at: float) -> bool:
        """Record the first successful request; False when one was recorded already."""
        if self.first_inference_seconds is not None:
            return False
        self.first_inference_seconds = seconds
        self.first_inference_at = at
        return True

    def as_row(self) -> dict[str, float]:
        """The index row's ``cold_start`` object (first inference only once there was one)."""
        row = {
            "started_at": round(self.started_at, 6),
            "load_seconds": round(self.load_seconds, 6),
            "warmup_seconds": round(self.warmup_seconds, 6),
            "ready_at": round(self.ready_at, 6),
        }
        if self.first_inference_seconds is not None and self.first_inference_at is not None:
            row["first_inference_at"] = round(self.first_inference_at, 6)
            row["first_inference_seconds"] = round(self.first_inference_seconds, 6)
        return row
