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

        batcher = DynamicBatcher(pool, config)
        # rate limited: a slot granted its resources later wakes the batcher, and a granted slot stays
        # reserved while requests wait in its queue (``InstancePool._return_unused``)
        pool.demand = lambda: bool(batcher.queue)
        pool.on_free = lambda: batcher._wake.set() if batcher._wake is not None else None
        return batcher
    if choice == "sequence_batching":
        from .sequence_batcher import SequenceBatcher

        return SequenceBatcher(pool, config, model_dir)
    return DefaultScheduler(pool, config.max_batch_size)
