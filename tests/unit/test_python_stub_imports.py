"""A stub process runs under a model's own interpreter (``EXECUTION_ENV_PATH``), where kubeinfer and its
dependencies are not installed: every module it imports must need only the standard library, numpy and
other modules of the same kind. Follows the stub's imports from ``stub_boot.py`` through the package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import kubeinfer.server.backends.python as package

FOLDER = Path(package.__file__).parent
ALLOWED_TOP_LEVEL = set(sys.stdlib_module_names) | {"numpy", "__future__", "_kubeinfer_python_backend"}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(absolute top-level names, sibling modules) that ``path`` imports, at any depth of its code."""
    absolute: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            absolute.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                absolute.add((node.module or "").split(".")[0])
            elif node.level == 1:
                if node.module:
                    siblings.add(node.module.split(".")[0])
                else:
                    siblings.update(alias.name for alias in node.names)
            else:
                absolute.add(f"<relative import beyond the package: {'.' * node.level}{node.module}>")
    return absolute, siblings


def test_the_stub_imports_only_the_standard_library_numpy_and_stub_safe_siblings() -> None:
    seen: set[str] = set()
    todo = ["stub_boot", "stub"]
    offenders: dict[str, set[str]] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        absolute, siblings = _imports(FOLDER / f"{name}.py")
        bad = absolute - ALLOWED_TOP_LEVEL
        if bad:
            offenders[name] = bad
        todo += [s for s in siblings if (FOLDER / f"{s}.py").exists()]
    assert not offenders, offenders
    # the modules the stub needs, so a change that drops one from the walk is noticed
    assert {"stub", "ipc", "context", "loader", "runner", "pb_request", "pb_types", "pb_metrics"} <= seen
    assert "triton_python_backend_utils" in seen
    # and none of the server-side ones
    assert not seen & {"backend", "inprocess", "bridge", "stub_process", "stub_instance", "envs"}
