"""Chooses a model version's scheduler from its config, as Triton does."""

from __future__ import annotations

from ..config import pb
from ..repository.model_files import ModelFolder
from ..vocabulary.registry_view import RegistryView
from .base import Scheduler
from .default import DefaultScheduler
from .instance_pool import InstancePool


def make_scheduler(
    config: pb.ModelConfig,
    pool: InstancePool | None,
    registry: RegistryView,
    model_dir: ModelFolder | None = None,
) -> Scheduler:
    """``ensemble_scheduling`` → ensemble, ``dynamic_batching`` → batcher, ``sequence_batching`` → sequence
    batcher (``model_dir`` holds its ``initial_state/`` files), otherwise request by request."""
    choice = config.WhichOneof("scheduling_choice")
    if choice == "ensemble_scheduling":
        from .ensemble import EnsembleScheduler

        return EnsembleScheduler(config, registry)
    assert pool is not None
    if choice == "dynamic_batching":
        from .dynamic_batcher import DynamicBatcher

        return DynamicBatcher(pool, config)
    if choice == "sequence_batching":
        from .sequence_batcher import SequenceBatcher

        return SequenceBatcher(pool, config, model_dir)
    return DefaultScheduler(pool, config.max_batch_size)
