"""What the repository writer writes: a rendered model (config text and each version's source)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubeinfer.server.config import pb

from ..api.model_types import Source


@dataclass(frozen=True)
class RenderedModel:
    """Everything the repository writer needs: the config text and each version's source."""

    name: str
    config: pb.ModelConfig
    config_text: str
    filename: str | None
    versions: dict[int, Source] = field(default_factory=dict)
