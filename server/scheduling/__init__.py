"""Schedulers decide when and with whom a request executes: one per model version.

``default`` runs request by request, ``dynamic_batcher`` forms batches (Triton's dynamic_batching),
``ensemble`` runs a graph of steps through the other models' schedulers.
"""
