"""Which file holds a model's config: Triton's custom config names (``--model-config-name``).

Triton (23.x and later, core ``GetModelConfigFullPath``) reads ``<model>/configs/<name>.pbtxt`` when the
server was started with ``--model-config-name=<name>`` and that file exists, else ``<model>/config.pbtxt``,
else nothing (the model is auto-completed where its backend can). The choice is made again at every read
(each poll, each load), so adding or removing a custom config switches the model between the two, as in
Triton. One repository can so carry a config per kind of machine (``configs/h100.pbtxt``,
``configs/cpu.pbtxt``) and each server picks its own.

The name becomes part of a path, so it must be a plain name: Triton's documentation asks for no spaces,
and a ``/`` or a leading ``.`` would read a file outside ``configs/`` (Triton does not check; here such a
name is refused at start).
"""

from __future__ import annotations

import re

from .layout import CONFIG_FILE

#: the folder in a model's folder that holds its custom configs (Triton's ``kModelConfigFolder``)
CONFIGS_FOLDER = "configs"
#: a custom config file's extension (Triton's ``kPbTxtExtension``)
EXTENSION = ".pbtxt"
#: a file name's limit (NAME_MAX) less the extension
MAX_NAME_BYTES = 255 - len(EXTENSION)
_NOT_PLAIN = re.compile(r"[\s/\\\x00-\x1f\x7f]")


def check_config_name(name: str) -> None:
    """Raise ValueError unless ``name`` can be ``--model-config-name``: Triton's text for an empty one."""
    if not name:
        # Triton's command_line_parser.cc: "Error: empty argument for --model-config-name"
        raise ValueError("empty argument for --model-config-name")
    if _NOT_PLAIN.search(name) or name.startswith(".") or len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ValueError(
            f"--model-config-name {name[:80]!r} must be a plain name (no spaces, '/', '\\' or control characters, "
            f"not starting with '.', at most {MAX_NAME_BYTES} bytes): the server reads "
            f"{CONFIGS_FOLDER}/<name>{EXTENSION} in each model's folder"
        )


def custom_config_file(name: str) -> str:
    """``configs/<name>.pbtxt``, relative to a model's folder."""
    return f"{CONFIGS_FOLDER}/{name}{EXTENSION}"


def config_files(name: str) -> tuple[str, ...]:
    """The files a model's config is read from, first found wins (relative to the model's folder)."""
    return (custom_config_file(name), CONFIG_FILE) if name else (CONFIG_FILE,)
