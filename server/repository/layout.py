"""The repository layout and its atomic-write contract, shared by the server (reader) and the operator
and ``kubeinfer convert`` (writers).

Layout: ``<repo>/<model>/config.pbtxt`` and ``<repo>/<model>/<version>/<model file>``.

Atomic-write contract (what a writer must follow, and what poll mode relies on):

* every file or folder whose name starts with ``.`` is ignored, at the repository level and inside a
  model folder, so writers stage under dot-names and ``rename`` into place;
* a version folder (numeric, no leading zero) counts only once its model file exists;
* a new model is staged whole as ``<repo>/.<model>.staging-*`` and renamed to ``<repo>/<model>``;
* a new version is staged as ``<repo>/<model>/.<version>.staging-*`` and renamed, then the config is
  replaced (config last) via ``.config.pbtxt.tmp-*`` and ``os.replace``;
* removal renames to a dot-name first, then deletes.
"""

from __future__ import annotations

import re

from ..vocabulary.errors import InvalidArgument

CONFIG_FILE = "config.pbtxt"
MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def check_model_name(name: str) -> None:
    """Reject names that could escape the repository (``..``, separators) or are hidden."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or not MODEL_NAME.match(name):
        raise InvalidArgument(
            f"invalid model name '{name}': use letters, digits, '_', '-' and '.', without path separators"
        )


def is_version_dir_name(name: str) -> bool:
    return name.isdigit() and not name.startswith("0")
