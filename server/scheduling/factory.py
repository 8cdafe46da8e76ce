"""Chooses a model version's scheduler from its config, as Triton does."""

from __future__ import annotations

from ..config import pb
from ..vocabulary.registry_view import RegistryView
from .base import Scheduler
from .default import DefaultScheduler
from .instance_pool import InstancePool


def make_scheduler(config: pb.ModelConfig, pool: InstancePool | None, registry: RegistryView) -> Scheduler:
    """``ensemble_scheduling`` → ensemble, ``dynamic_batching`` → batcher, otherwise request by request."""
    choice = config.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling":
        from .ensemble import EnsembleScheduler

        return EnsembleScheduler(config, registry)
    assert pool is not None
    if choice == "dynamic_batching":
        from .dynamic_batcher import DynamicBatcher

        return DynamicBatcher(pool, config)
    return DefaultScheduler(pool, config.max_batch_size)
