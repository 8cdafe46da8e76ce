"""InferenceServers and EndpointSlices from kopf's in-memory indexes, so a resync of an unchanged model costs
no API call; before the indexes are attached (and in tests that run no kopf) they are read from the API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .client import SERVERS, Kube


class Lookup:
    """InferenceServers and EndpointSlices from kopf's indexes once attached, else from the API."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.indices: Mapping[str, Any] | None = None

    def values(self, index: str, key: tuple[str, str]) -> list[Any] | None:
        if self.indices is None or index not in self.indices:
            return None
        for _ in range(3):  # the store may change under a worker thread's iteration
            try:
                return list(self.indices[index].get(key, ()))
            except RuntimeError:
                continue
        return None

    def server(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.values("servers", (namespace, name))
        if found is None:
            return self.kube.get(SERVERS, namespace, name)
        return found[0] if found else None

    def slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        found = self.values("endpointslices", (namespace, service))
        return self.kube.endpoint_slices(namespace, service) if found is None else found
