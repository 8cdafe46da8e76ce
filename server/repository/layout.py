"""The repository layout and its atomic-write contract, shared by the server (reader) and the operator
and ``kubeinfer convert`` (writers).

Layout: ``<repo>/<model>/config.pbtxt`` and ``<repo>/<model>/<version>/<model file>``.

Atomic-write contract (what a writer must follow, and what poll mode relies on):

* every file or folder whose name starts with ``.`` is ignored, at the repository level and inside a
  model folder, so writers stage under dot-names and ``rename`` into place;
* a version folder (numeric, no leading zero) counts only once its model file exists;
* a new model is staged whole as ``.<model>.staging-*`` and renamed to ``<repo>/<model>``;
* a new version is staged as ``.<version>.staging-*`` and renamed to ``<repo>/<model>/<version>``, then
  the config is replaced (config last) by renaming a written and fsynced ``.config.pbtxt.tmp-*`` over it;
* what a reader uses (model files, configs) is fsynced before its rename, and each folder a name was added
  to after it; a writer's own dot-named records (the operator's ``.kubeinfer-source.json``) may skip the
  fsync when losing one in a crash only makes the writer redo its work;
* removal renames to a dot-name first, then deletes;
* staged folders and tmp files live beside their target, or in a folder of the writer's own on the same
  filesystem (the operator: ``<volume>/.kubeinfer-staging/``, where no tenant reaches);
* all of it through folder descriptors (``confined``, ``publish``): nothing a writer creates, renames or
  deletes is reached by a path that a symlink swapped in meanwhile could redirect.

Readers (the server) open a model folder beneath the repository root and read through it
(``model_files``): symlinks count only while they stay inside the repository.

The index reports, per serving version, ``config_digest`` of the config.pbtxt bytes it was loaded
from: a writer compares it with the digest of what it wrote to know the server serves that config. With
models on demand (the server's model cache) a model that is not loaded has one row, without a version,
whose reason is ``NOT_LOADED``: it serves on its next request.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..config import MAX_FILE_NAME_BYTES, ConfigError
from ..vocabulary.errors import InvalidArgument

CONFIG_FILE = "config.pbtxt"
#: the index's reason for a repository model the server loads on its first request (the model cache)
NOT_LOADED = "not loaded: loads on its first request (model cache)"
MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def check_model_name(name: str) -> None:
    """Reject names that could escape the repository (``..``, separators), are hidden or too long for a folder."""
    if len(name.encode("utf-8")) > MAX_FILE_NAME_BYTES:
        raise InvalidArgument(
            f"invalid model name '{name[:40]}...' ({len(name.encode('utf-8'))} bytes): "
            f"a model name is a folder name, at most {MAX_FILE_NAME_BYTES} bytes"
        )
    if not name or "/" in name or "\\" in name or name in (".", "..") or not MODEL_NAME.match(name):
        raise InvalidArgument(
            f"invalid model name '{name}': use letters, digits, '_', '-' and '.', without path separators"
        )


def config_digest(text: bytes) -> str:
    """Identity of a config.pbtxt's bytes (see the module docstring)."""
    return hashlib.sha1(text).hexdigest()


def is_version_dir_name(name: str) -> bool:
    return name.isdigit() and not name.startswith("0")


class PathEscape(ConfigError):
    """A path (through a symlink) leads outside the folder it must stay in."""


def resolve_inside(root: Path, path: Path, what: str, inside: str = "the model repository") -> Path:
    """``path`` with every symlink resolved, provided the result stays inside ``root`` (resolved too).

    A check by name (``op_library_path`` uses it to say early what is wrong with an entry); what is then
    read goes through ``model_files``, whose descriptor walk is the guarantee. Symlinks that stay inside
    are fine.
    """
    try:
        real_root = root.resolve()
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise PathEscape(f"{what} cannot be resolved: {exc}") from None
    if real != real_root and not real.is_relative_to(real_root):
        try:
            shown: Path | str = path.relative_to(root)
        except ValueError:
            shown = path.name
        raise PathEscape(f"{what} '{shown}' leads outside {inside} through a symlink; symlinks must stay inside it")
    return real


def op_library_path(model_dir: Path, entry: str) -> Path:
    """Where one ``model_operations.op_library_filename`` entry leads: the real file to load.

    A library is code the server runs, so it must be either this model's own file or one from outside
    the repository (the server image), never another model's (on a shared volume, another tenant's):

    * a file name (``check_op_library_filename`` has checked its form) names a file in the model's
      folder; symlinks must stay inside that folder;
    * an absolute path (symlinks resolved) must not lead into the repository, except into this model's
      own folder (Triton users write ``/models/<model>/libcustom.so``).

    Raises ConfigError (``PathEscape`` for a symlink leading out) with the entry in the message.
    """
    field = f"model_operations op_library_filename '{entry}'"
    if entry.startswith("/"):
        try:
            real = Path(entry).resolve()
            real_model = model_dir.resolve()
            real_repo = model_dir.parent.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise ConfigError(f"{field} cannot be resolved: {exc}") from None
        if real.is_relative_to(real_repo) and not real.is_relative_to(real_model):
            raise ConfigError(
                f"{field} leads into the model repository outside this model's folder: a library must be "
                "this model's own file (name it without a path, in the model's folder) or one outside the "
                "repository (e.g. in the server image)"
            )
    else:
        what = "model_operations op_library_filename"
        real = resolve_inside(model_dir, model_dir / entry, what, inside="the model's folder")
    if not real.is_file():
        where = "in the model's folder" if not entry.startswith("/") else "on the server"
        raise ConfigError(f"{field}: no such file {where}")
    return real
