"""Configs served side by side by Triton 2.51 and kubeinfer to compare their normalised model configs.

``models/`` holds only the config.pbtxt files; ``write_repository`` adds the version folders (the
``recorder.py`` Python model, or the given model files for the other backends). ``triton-2.51.json`` is
what real Triton answered for each (``record.py`` made it; see its docstring), and what its Python stub
got in ``initialize``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubeinfer.server.config import load_config_file

HERE = Path(__file__).parent
MODELS = HERE / "models"
RECORD = HERE / "triton-2.51.json"
RECORDER = HERE / "recorder.py"

#: files of the non-Python backends' version folders
MODEL_FILES = {"onnxruntime_onnx": "model.onnx", "pytorch_libtorch": "model.pt", "tensorrt_plan": "model.plan"}
_BY_BACKEND = {"onnxruntime": "model.onnx", "pytorch": "model.pt", "tensorrt": "model.plan"}


def names() -> list[str]:
    return sorted(p.name for p in MODELS.iterdir() if (p / "config.pbtxt").is_file())


def model_file(name: str) -> str:
    """The file name a model's version folder holds: its config's, else by platform/backend, else
    by the model's name (``ort_*``, ``torch_*``, ``trt_*``; the rest are Python models)."""
    config = load_config_file(MODELS / name / "config.pbtxt")
    if config.platform == "ensemble":
        return ""
    if config.default_model_filename:
        return config.default_model_filename
    found = MODEL_FILES.get(config.platform) or _BY_BACKEND.get(config.backend)
    if found:
        return found
    prefix = name.split("_", 1)[0]
    return {"ort": "model.onnx", "torch": "model.pt", "trt": "model.plan"}.get(prefix, "model.py")


def write_repository(target: Path, models: Iterable[str], contents: Callable[[str, str], bytes]) -> Path:
    """Copy ``models`` into ``target`` with version folder 1; a ``.py`` model file is ``recorder.py``,
    any other is ``contents(model, file name)``."""
    for name in models:
        folder = target / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MODELS / name / "config.pbtxt", folder / "config.pbtxt")
        filename = model_file(name)
        if filename.endswith(".py"):
            shutil.copyfile(RECORDER, folder / "1" / filename)
        elif filename:
            (folder / "1" / filename).write_bytes(contents(name, filename))
    return target


def record() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(RECORD.read_text(encoding="utf-8"))
    return data
