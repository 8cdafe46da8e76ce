"""Placeholder until the dynamic batcher lands: runs request by request."""
from .default import DefaultScheduler as _Default


class DynamicBatcher(_Default):
    def __init__(self, pool, config):  # type: ignore[no-untyped-def]
        super().__init__(pool, config.max_batch_size)
