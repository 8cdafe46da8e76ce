"""Where a converted version goes in the repository: ``<repo>/<model>/<version>/model.plan``, its INT8
calibration cache next to it and ``<repo>/<model>/config.pbtxt``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...config.platforms import BY_PLATFORM
from ...repository.layout import CONFIG_FILE

if TYPE_CHECKING:
    from .options import ConvertOptions

PLAN_FILE = BY_PLATFORM["tensorrt_plan"].model_filename
CALIBRATION_CACHE = "calibration.cache"


@dataclass(frozen=True)
class Layout:
    model_dir: Path
    version_dir: Path
    plan: Path
    config: Path
    calibration_cache: Path


def plan_layout(options: ConvertOptions) -> Layout:
    model_dir = options.repository / options.name
    version_dir = model_dir / str(options.version)
    return Layout(
        model_dir, version_dir, version_dir / PLAN_FILE, model_dir / CONFIG_FILE, version_dir / CALIBRATION_CACHE
    )
