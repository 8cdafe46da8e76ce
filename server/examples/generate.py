"""Builds the example model repository: bundled configs plus generated ONNX files.

``python -m kubeinfer.server.examples.generate DIR`` writes it to DIR; the server's default
repository is the same thing, built once under ``~/.cache/kubeinfer``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import pb
from ..config.platforms import BY_PLATFORM, model_filename
from ..repository import confined, publish
from . import models, python_models

CONFIGS = Path(__file__).parent / "model_repository"
ONNX_FILE = BY_PLATFORM["onnxruntime_onnx"].model_filename
PYTHON_FILE = model_filename(pb.ModelConfig(backend="python"))
#: model → {version: builder}; a builder returns an ONNX model, a model.py source text, or None (the empty
#: version folder Triton expects of an ensemble)
VERSIONS: dict[str, dict[int, Callable[[], Any]]] = {
    "cifar10_resnet": {1: lambda: models.resnet18_cifar(seed=0)},
    "add_sub": {1: lambda: models.add_sub(16), 2: lambda: models.add_sub(16)},
    "preprocessor": {1: lambda: python_models.source("preprocessor")},
    "postprocessor": {1: lambda: python_models.source("postprocessor")},
    "cifar10_pipeline": {1: lambda: None},
    # toy text models for the generate endpoints and the OpenAI-compatible frontend (server/openai)
    "tiny_lm": {1: lambda: python_models.source("tiny_lm")},
    "tiny_embedding": {1: lambda: python_models.source("tiny_embedding")},
}


def write_repository(target: Path) -> Path:
    """Write the example repository to ``target`` atomically (``repository.publish``: staged, fsynced, renamed)."""
    target = target.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with confined.opened(confined.open_root(target.parent)) as parent:
        staged, staging = publish.stage_dir(parent, target.name)
        try:
            with confined.opened(staging):
                for model, versions in VERSIONS.items():
                    shutil.copytree(CONFIGS / model, target.parent / staged / model)
                    for version, build in versions.items():
                        os.mkdir(f"{model}/{version}", 0o755, dir_fd=staging)
                        artifact = build()
                        if artifact is None:
                            continue
                        with confined.opened(confined.open_dir(staging, f"{model}/{version}")) as folder:
                            if isinstance(artifact, str):
                                publish.write_file(folder, PYTHON_FILE, artifact)
                            else:
                                publish.write_file(folder, ONNX_FILE, artifact.SerializeToString())
            publish.publish_dir(parent, staged, parent, target.name)
        except BaseException:
            publish.remove_tree(parent, staged)
            raise
    return target


def _content_digest() -> str:
    """Changes whenever a bundled config, model source or the model list changes (not only the version)."""
    h = hashlib.sha1(repr(sorted((m, sorted(v)) for m, v in VERSIONS.items())).encode())
    here = Path(__file__).parent
    for path in sorted(here.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".pbtxt") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(here)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def default_repository() -> Path:
    cache = Path(os.environ.get("KUBEINFER_CACHE", Path.home() / ".cache" / "kubeinfer"))
    target = cache / f"example-repository-{__version__}-{_content_digest()}"
    if not target.exists():
        write_repository(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", type=Path, help="folder to write the repository to (replaced if present)")
    args = parser.parse_args()
    print(write_repository(args.target))


if __name__ == "__main__":
    main()
