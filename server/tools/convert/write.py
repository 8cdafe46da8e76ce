"""Writing the converted version into the repository under its atomic-write contract (``repository.publish``)."""

from __future__ import annotations

import os

from ...repository import confined, publish
from ...repository.layout import CONFIG_FILE
from .layout import CALIBRATION_CACHE, PLAN_FILE, Layout
from .options import ConvertOptions


def write_model(options: ConvertOptions, layout: Layout, plan: bytes, cache: bytes | None, config_text: str) -> None:
    """Stage under dot-names, fsync and rename into place (``repository.publish``); the config is replaced last."""
    with confined.opened(confined.open_root(options.repository)) as repo:
        if not confined.exists(repo, options.name):
            staged, staging = publish.stage_dir(repo, options.name)
            try:
                with confined.opened(staging):
                    os.mkdir(str(options.version), 0o755, dir_fd=staging)
                    with confined.opened(confined.open_dir(staging, str(options.version))) as folder:
                        _write_version(folder, plan, cache)
                    publish.write_file(staging, CONFIG_FILE, config_text)
                publish.publish_dir(repo, staged, repo, options.name)
            except BaseException:
                publish.remove_tree(repo, staged)
                raise
            return
        with confined.opened(confined.open_dir(repo, options.name)) as model:
            staged, staging = publish.stage_dir(model, str(options.version))
            try:
                with confined.opened(staging):
                    _write_version(staging, plan, cache)
                publish.publish_dir(model, staged, model, str(options.version))
            except BaseException:
                publish.remove_tree(model, staged)
                raise
            publish.replace_file(model, CONFIG_FILE, config_text)


def _write_version(folder: int, plan: bytes, cache: bytes | None) -> None:
    publish.write_file(folder, PLAN_FILE, plan)
    if cache is not None:
        publish.write_file(folder, CALIBRATION_CACHE, cache)
    publish.fsync_dir(folder)
