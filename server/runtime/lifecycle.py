"""Model lifecycle states as the repository index reports them (Triton's ``ModelReadyState`` names).

A version goes LOADING → READY; a reload keeps the READY version serving until the new one is READY;
a retired version goes UNLOADING (draining) → UNAVAILABLE ("unloaded"); a failed load is UNAVAILABLE
with its reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum

from ..config import pb
from .model import ModelVersion


class ModelState(str, Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class VersionState:
    state: ModelState
    reason: str = ""


@dataclass
class ModelEntry:
    """Everything the registry knows about one model name."""

    name: str
    #: versions that serve requests; replaced as a whole, never mutated in place
    serving: dict[int, ModelVersion] = field(default_factory=dict)
    #: what the index reports per version; key 0 holds a model-level failure with no version
    states: dict[int, VersionState] = field(default_factory=dict)
    config: pb.ModelConfig | None = None
    config_digest: str = ""
    override: pb.ModelConfig | None = None
    #: digest per version of the last load attempt, failed or not (poll mode retries only on change)
    attempted: dict[int, str] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
