"""Reads a Triton-style model repository from disk (no loading, no state); see ``layout`` for the rules."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError, ConfigParseError, check_file_names, parse_config_text, pb
from ..config.platforms import MODEL_FILENAMES, detect, model_filename, model_is_folder, platform_undecided
from . import confined
from .config_name import config_files
from .layout import CONFIG_FILE, MODEL_NAME, PathEscape, config_digest, is_version_dir_name
from .model_files import ModelFolder


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
    #: the folder is not there (removed from the repository), as opposed to there but unusable
    missing: bool = False
    #: changes when the config text changes
    config_digest: str = ""
    #: per version, changes when any file in the version folder changes
    version_digests: dict[int, str] = field(default_factory=dict)
    #: config.pbtxt as parsed, before anything was filled in: hand it back to ``read_model`` (``parsed``) to
    #: skip the parse while the bytes stay the same
    parsed: ParsedConfig | None = None


@dataclass(frozen=True)
class ParsedConfig:
    """A config.pbtxt's digest and the config parsed from those bytes (never changed once made)."""

    digest: str
    config: pb.ModelConfig


def infer_platform(config: pb.ModelConfig, folder: ModelFolder) -> None:
    """Without platform/backend (or with backend "tensorflow" alone), pick one from the model files found
    (Triton's auto-complete)."""
    if not platform_undecided(config):
        return
    for version in sorted(n for n in confined.names(folder.fd) if is_version_dir_name(n)):
        try:
            fd = confined.open_dir(folder.root, version, follow=True, start=(folder.fd, folder.name))
        except (OSError, PathEscape):
            continue
        with confined.opened(fd):
            candidates = [n for n in confined.names(fd) if n in MODEL_FILENAMES]
        files, folders = _kinds(folder, version, candidates)
        found = detect(files, folders, backend=config.backend)
        if found is not None:
            if found.platform:
                config.platform = found.platform
            else:
                config.backend = found.backend
            return


def _kinds(folder: ModelFolder, version: str, names: list[str]) -> tuple[set[str], set[str]]:
    """Which of ``names`` in a version folder are plain files and which are folders (symlinks followed while
    they stay inside the repository). One that cannot be opened (a symlink leading out, no permission) counts
    as both: the platform its name implies is picked and the load says what is wrong with it."""
    files, folders = set(), set()
    for name in names:
        try:
            fd = confined.open_beneath(folder.root, f"{version}/{name}", follow=True, start=(folder.fd, folder.name))
        except (OSError, PathEscape):
            files.add(name)
            folders.add(name)
            continue
        with confined.opened(fd):
            mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            folders.add(name)
        elif stat.S_ISREG(mode):
            files.add(name)
    return files, folders


def _digest_dir(fd: int) -> str:
    """Names, sizes and modification times of everything in an open version folder (symlinked files: their
    target's, so a poll notices when a shared file changes)."""
    h = hashlib.sha1()
    for root, dirs, files, root_fd in os.fwalk(".", dir_fd=fd):
        dirs.sort()
        for f in sorted(files):
            try:
                st = os.stat(f, dir_fd=root_fd)
            except OSError:
                continue
            h.update(f"{os.path.normpath(os.path.join(root, f))}:{st.st_size}:{st.st_mtime_ns}\n".encode())
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


def read_model(
    repo: Path,
    name: str,
    override: pb.ModelConfig | None = None,
    parsed: ParsedConfig | None = None,
    config_name: str = "",
) -> ModelSource:
    """Parse one model folder; errors are recorded on the result, never raised.

    Everything is read through descriptors (``model_files``): the folder, config.pbtxt, the version
    folders and their model files are opened beneath the repository root, symlinks taken only while
    they stay inside it. ``parsed``: what an earlier read returned (``ModelSource.parsed``); when
    config.pbtxt's bytes have the same digest, that parse is copied instead of parsing the text again
    (protobuf's text parser is most of a poll's CPU for an unchanged folder). ``config_name``:
    ``--model-config-name``; ``configs/<config_name>.pbtxt`` is read instead of config.pbtxt where it
    exists (``config_name``), and its bytes are the config digest a poll compares.
    """
    path = repo / name
    source = ModelSource(name=name, path=path, config=None)
    try:
        folder = ModelFolder(repo, name)
    except PathEscape as exc:
        source.error = str(exc)
        return source
    except OSError as exc:
        source.error = f"model folder '{name}' not found in the repository"
        source.missing = isinstance(exc, (FileNotFoundError, NotADirectoryError))
        return source
    try:
        with folder:
            _read_model(folder, source, override, parsed, config_name)
    except PathEscape as exc:
        source.config = None
        source.versions.clear()
        source.version_digests.clear()
        source.error = str(exc)
    return source


#: a config.pbtxt is a few KiB (a large ensemble's, tens): a bigger one is refused from its size, never read --
#: a tenant who can write a served folder (hostPath volumes) could plant a sparse file of any size for free
MAX_CONFIG_BYTES = 16 << 20


def _read_config(folder: ModelFolder, config_name: str) -> tuple[str, bytes | None, str]:
    """(file, its bytes, why it cannot be read) of the config the model uses: the first of ``config_files``
    that exists, else (config.pbtxt, None, ""). A file that is there but cannot be read is the model's
    failure, not a reason to read the next one: Triton, too, uses a custom config once it exists."""
    for relative in config_files(config_name):
        try:
            return relative, folder.read(relative, relative, own=False, max_bytes=MAX_CONFIG_BYTES), ""
        except (FileNotFoundError, NotADirectoryError):  # NotADirectory: a file named configs
            continue
        except OSError as exc:
            return relative, None, f"cannot read {relative}: {exc.strerror or exc}"
    return CONFIG_FILE, None, ""


def _read_model(
    folder: ModelFolder,
    source: ModelSource,
    override: pb.ModelConfig | None,
    parsed: ParsedConfig | None,
    config_name: str = "",
) -> None:
    name, path = source.name, source.path
    if override is not None:
        config = pb.ModelConfig()
        config.CopyFrom(override)
        source.config_digest = config_digest(config.SerializeToString(deterministic=True))
    else:
        relative, text, unreadable = _read_config(folder, config_name)
        if unreadable:
            source.error = unreadable
            return
        if text is not None:
            digest = source.config_digest = config_digest(text)
            if parsed is None or parsed.digest != digest:
                try:
                    parsed = ParsedConfig(digest, parse_config_text(text.decode("utf-8"), relative))
                except UnicodeDecodeError as exc:
                    source.error = f"cannot read {relative}: {exc}"
                    return
                except ConfigParseError as exc:
                    # a custom config's failure in Triton's words (filesystem ReadTextProto), and where
                    source.error = (
                        f"failed to read text proto from {path / relative}: {exc.detail}"
                        if relative != CONFIG_FILE
                        else str(exc)
                    )
                    return
                except ConfigError as exc:
                    source.error = str(exc)
                    return
            source.parsed = parsed
            config = pb.ModelConfig()
            config.CopyFrom(parsed.config)  # what follows fills in the copy
        else:
            config = pb.ModelConfig()
            source.config_digest = "none"
    if not config.name:
        config.name = name
    try:
        check_file_names(config)  # before any file name is joined to a folder
        infer_platform(config, folder)
    except (ConfigError, OSError) as exc:
        source.error = str(exc)
        return
    source.config = config
    filename = model_filename(config)
    #: a SavedModel is a folder: the version counts once that folder is there
    open_model = confined.open_dir if model_is_folder(config) else confined.open_file
    start = (folder.fd, name)
    for entry in confined.names(folder.fd):
        if not is_version_dir_name(entry):
            continue
        version = int(entry)
        try:
            fd = confined.open_dir(folder.root, entry, follow=True, start=start)
        except confined.Refused as exc:
            raise PathEscape(exc.describe(f"version folder {version} '{name}/{entry}'")) from None
        except OSError:
            continue  # not a folder
        with confined.opened(fd):
            if filename:
                try:
                    os.close(open_model(folder.root, f"{entry}/{filename}", follow=True, start=start))
                except confined.Refused as exc:
                    shown = f"{name}/{entry}/{filename}"
                    raise PathEscape(exc.describe(f"version {version} model file '{shown}'")) from None
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    continue  # incomplete version folder: not there yet, as far as we are concerned
                except OSError:
                    pass  # there but unreadable (permissions): the load says why
            source.versions[version] = path / entry
            source.version_digests[version] = _digest_dir(fd)
