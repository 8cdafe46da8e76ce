"""Kubernetes I/O: the API client the operator writes with, the lean per-model writes, Events, the
leader Lease, the InferenceModel watch and kopf's in-memory indexes. The only wing that talks to the API server.
"""
