"""What a model's last successful render left, so that a resync which finds nothing changed renders nothing.

Nothing changed when the model's generation, its server (identity and the parts of its spec a render
depends on, and the traffic weights in force) and its folder's fingerprint (entries' names, inodes, sizes
and change times) are as the render left them. Every ``FULL_CHECK_AFTER`` seconds a render runs anyway: a
check of the fingerprint's premise, that nothing writes a model folder without changing its change times.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api.server_types import InferenceServerSpec
from ..servers import manifests

#: seconds after which a resync renders and syncs an unchanged model anyway
FULL_CHECK_AFTER = 600.0


def server_key(ns: str, name: str, server: Mapping[str, Any], spec: InferenceServerSpec) -> tuple[Any, ...]:
    """The server's identity (``server``: its object) and the parts of its spec (typed) a render depends on."""
    meta = server["metadata"]
    return (
        meta.get("uid"),
        meta.get("generation"),
        manifests.repository_subpath(ns, name, spec),
        spec.repository.claim_name,
        spec.backends,
        spec.allowed_backends,
    )


@dataclass(frozen=True)
class RenderMemo:
    """What the last successful render of a model left, for resyncs that find nothing changed."""

    generation: int
    #: ``server_key`` and the traffic weights in force
    server: tuple[Any, ...]
    server_dir: Path
    fingerprint: tuple[object, ...]
    target: list[int]
    config_digest: str
    repository_path: str
    rendered: list[int]
    at: float

    def still_current(self, generation: int, key: tuple[Any, ...], recorded_path: str | None) -> bool:
        """Same generation and server, the status's folder is this one, and no full check is due (the claim
        and the folder's fingerprint are checked by the caller)."""
        if self.generation != generation or self.server != key:
            return False
        if recorded_path not in (None, self.repository_path):
            return False  # the status says it was elsewhere: a render looks (and removes it there if it is ours)
        return time.monotonic() - self.at <= FULL_CHECK_AFTER
