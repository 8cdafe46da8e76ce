"""Reads a Triton-style model repository from disk (no loading, no state); see ``layout`` for the rules."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, check_file_names, load_config_file, pb
from ..config.platforms import detect, model_filename
from .layout import CONFIG_FILE, MODEL_NAME, PathEscape, config_digest, is_version_dir_name, resolve_inside


@dataclass
class ModelSource:
    """One model folder as found on disk: its parsed config and the version folders it offers."""

    name: str
    path: Path
    config: pb.ModelConfig | None
    #: complete version folders (model file present), by number
    versions: dict[int, Path] = field(default_factory=dict)
    #: why the model cannot be used at all (broken config), else ""
    error: str = ""
    #: changes when the config text changes
    config_digest: str = ""
    #: per version, changes when any file in the version folder changes
    version_digests: dict[int, str] = field(default_factory=dict)


def infer_platform(config: pb.ModelConfig, model_dir: Path) -> None:
    """Without platform/backend, pick one from the model files found (Triton's auto-complete)."""
    if config.platform or config.backend:
        return
    for version_dir in sorted(p for p in model_dir.iterdir() if is_version_dir_name(p.name)):
        found = detect({p.name for p in version_dir.iterdir()}) if version_dir.is_dir() else None
        if found is not None:
            if found.platform:
                config.platform = found.platform
            else:
                config.backend = found.backend
            return


def _digest_dir(path: Path) -> str:
    h = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            try:
                st = p.stat()
            except OSError:
                continue
            h.update(f"{p.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def model_names(repo: Path) -> list[str]:
    """The model folders in ``repo``; OSError when the repository itself cannot be listed."""
    entries = sorted(os.scandir(repo), key=lambda e: e.name)
    return [e.name for e in entries if not e.name.startswith(".") and e.is_dir() and MODEL_NAME.match(e.name)]


def list_model_names(repo: Path) -> list[str]:
    try:
        return model_names(repo)
    except OSError:
        return []


def read_model(repo: Path, name: str, override: pb.ModelConfig | None = None) -> ModelSource:
    """Parse one model folder; errors are recorded on the result, never raised."""
    path = repo / name
    source = ModelSource(name=name, path=path, config=None)
    if not path.is_dir():
        source.error = f"model folder '{name}' not found in the repository"
        return source
    try:
        _read_model(repo, source, override)
    except PathEscape as exc:
        source.config = None
        source.versions.clear()
        source.version_digests.clear()
        source.error = str(exc)
    return source


def _read_model(repo: Path, source: ModelSource, override: pb.ModelConfig | None) -> None:
    name, path = source.name, source.path
    resolve_inside(repo, path, "model folder")
    if override is not None:
        config = pb.ModelConfig()
        config.CopyFrom(override)
        source.config_digest = config_digest(config.SerializeToString(deterministic=True))
    else:
        config_path = path / CONFIG_FILE
        if config_path.exists():
            resolve_inside(repo, config_path, CONFIG_FILE)
            try:
                source.config_digest = config_digest(config_path.read_bytes())
                config = load_config_file(config_path)
            except (ConfigError, OSError) as exc:
                source.error = str(exc)
                return
        else:
            config = pb.ModelConfig()
            source.config_digest = "none"
    if not config.name:
        config.name = name
    try:
        check_file_names(config)  # before any file name is joined to a folder
        infer_platform(config, path)
    except (ConfigError, OSError) as exc:
        source.error = str(exc)
        return
    source.config = config
    filename = model_filename(config)
    for entry in os.scandir(path):
        if not (entry.is_dir() and is_version_dir_name(entry.name)):
            continue
        version = int(entry.name)
        vpath = Path(entry.path)
        resolve_inside(repo, vpath, f"version folder {version}")
        if filename and not (vpath / filename).exists():
            continue  # incomplete version folder: not there yet, as far as we are concerned
        if filename:
            resolve_inside(repo, vpath / filename, f"version {version} model file")
        source.versions[version] = vpath
        source.version_digests[version] = _digest_dir(vpath)
