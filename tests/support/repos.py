"""Builds model repositories for tests from the example models."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import onnx
from kubeinfer.server.examples import models

_RESNET_CACHE: dict[int, bytes] = {}


def resnet_bytes(seed: int = 0) -> bytes:
    if seed not in _RESNET_CACHE:
        _RESNET_CACHE[seed] = models.resnet18_cifar(seed=seed).SerializeToString()
    return _RESNET_CACHE[seed]


def write_model(repo: Path, name: str, config: str, versions: dict[int, bytes | onnx.ModelProto]) -> Path:
    """Write ``<repo>/<name>/config.pbtxt`` and ``<version>/model.onnx`` files."""
    model_dir = repo / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(textwrap.dedent(config))
    for version, model in versions.items():
        vdir = model_dir / str(version)
        vdir.mkdir(exist_ok=True)
        data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        (vdir / "model.onnx").write_bytes(data)
    return model_dir


#: Triton-style Python models written for these tests (config.pbtxt + 1/model.py each); they run
#: unchanged on Triton 2.51, which is how their expected behaviour was checked
PYTHON_MODELS = Path(__file__).parent / "python_models"


def copy_python_models(repo: Path, *names: str) -> Path:
    """Copy the named models (all when none are named) from ``tests/support/python_models`` into ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    for source in sorted(PYTHON_MODELS.iterdir()):
        if source.is_dir() and (not names or source.name in names) and (source / "config.pbtxt").is_file():
            shutil.copytree(source, repo / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def copy_example_repository(target: Path) -> Path:
    from kubeinfer.server.examples.generate import write_repository

    return write_repository(target)


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
