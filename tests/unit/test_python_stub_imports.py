"""A stub process runs under a model's own interpreter (``EXECUTION_ENV_PATH``), where kubeinfer and its
dependencies are not installed: every module it imports must need only the standard library, numpy and
other modules of the same kind. Follows the stub's imports from ``stub/stub_boot.py`` through the package
(``stub_boot`` imports the backend's folder as ``_kubeinfer_python_backend``, so a relative import may
reach up to that folder and no further)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import kubeinfer.server.backends.python as package

FOLDER = Path(package.__file__).parent
ALLOWED_TOP_LEVEL = set(sys.stdlib_module_names) | {"numpy", "__future__", "_kubeinfer_python_backend"}


def _module_file(dotted: str) -> Path | None:
    """The file of ``dotted`` (a module path relative to the backend's folder), None for a name in a module."""
    path = FOLDER.joinpath(*dotted.split(".")) if dotted else FOLDER
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(absolute top-level names, backend modules as dotted paths under the backend's folder) that ``module``
    imports, at any depth of its code; a package's ``__init__`` runs before any module in it."""
    path = _module_file(module)
    assert path is not None, module
    parts = module.split(".") if module else []
    package_parts = parts[:-1] if path.name != "__init__.py" else parts
    inner = {".".join(parts[:i]) for i in range(1, len(parts))}  # the packages that hold it
    absolute: set[str] = set()
    local: set[str] = {p for p in inner if p}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            absolute.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                absolute.add((node.module or "").split(".")[0])
                continue
            if node.level - 1 > len(package_parts):
                absolute.add(f"<relative import beyond the backend's folder: {'.' * node.level}{node.module}>")
                continue
            base = package_parts[: len(package_parts) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            if target:
                local.update(".".join(target.split(".")[:i]) for i in range(1, target.count(".") + 2))
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                if _module_file(sub) is not None:
                    local.add(sub)
    return absolute, local


def stub_imports() -> tuple[set[str], dict[str, set[str]]]:
    """(the backend's modules a stub process imports, offending imports by module)."""
    seen: set[str] = set()
    todo = ["", "stub.stub_boot", "stub.stub"]  # "": the backend's folder, which stub_boot imports first
    offenders: dict[str, set[str]] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        absolute, local = _imports(name)
        bad = absolute - ALLOWED_TOP_LEVEL
        if bad:
            offenders[name] = bad
        todo += sorted(local - seen)
    return seen, offenders


def test_the_stub_imports_only_the_standard_library_numpy_and_stub_safe_siblings() -> None:
    seen, offenders = stub_imports()
    assert not offenders, offenders
    # the modules the stub needs, so a change that drops one from the walk is noticed
    assert {
        "stub.stub",
        "ipc",
        "model_api.context",
        "stub.loader",
        "stub.runner",
        "model_api.pb_request",
        "model_api.pb_types",
        "model_api.pb_metrics",
        "model_api.triton_python_backend_utils",
    } <= seen
    # and none of the server-side ones
    assert not {name for name in seen if name.split(".")[0] == "server_side"}


def test_the_model_api_and_the_stub_never_import_the_server_side() -> None:
    """The split by audience holds: what a model sees and what the stub runs stand apart from the server end."""
    for sub in ("model_api", "stub"):
        for path in sorted((FOLDER / sub).glob("*.py")):
            module = f"{sub}.{path.stem}" if path.stem != "__init__" else sub
            _, local = _imports(module)
            assert not {name for name in local if name.split(".")[0] == "server_side"}, module


def test_the_walk_follows_relative_imports_across_subpackages() -> None:
    _, local = _imports("stub.stub")
    assert {"ipc", "model_api", "model_api.context", "stub.dumpable"} <= local
