"""Imports point down: the layer map in ``kubeinfer/server/__init__.py``, read from the source with ``ast``.

Every import counts, including ones inside functions and ``if TYPE_CHECKING:`` blocks: a lazy import
upward is still an upward dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: top-level unit of kubeinfer.server → layer (a unit may import its own layer and the ones below)
SERVER_LAYERS = {
    "": 0,  # kubeinfer.server itself: __version__ and SERVER_NAME only
    "vocabulary": 1,
    "config": 1,
    "repository": 1,
    "sources": 1,
    "backends": 2,
    "scheduling": 3,
    "runtime": 4,
    "observability": 4,
    "http": 5,
    "grpc": 5,
    "openai": 5,
    "sharedmemory": 5,
    "app": 6,
    "cli": 6,
    "__main__": 6,
    "tools": 6,
    "examples": 6,
}
#: the operator stands apart and may use only the bottom layer of the server
OPERATOR_MAY_IMPORT = {"", "vocabulary", "config", "repository", "sources"}
#: front ends translate wire formats and call the runtime; they never reach past it
FORBIDDEN = {
    (front, lower) for front in ("http", "grpc", "openai", "sharedmemory") for lower in ("backends", "scheduling")
}


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["kubeinfer", *rel.parts]
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(path: Path) -> Iterator[str]:
    """Absolute names of the kubeinfer modules ``path`` imports."""
    module, is_package = _module_name(path)
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` only mod
            names = [target] + [f"{target}.{a.name}" for a in node.names if _is_module(f"{target}.{a.name}")]
        else:
            continue
        yield from (n for n in names if n == "kubeinfer" or n.startswith("kubeinfer."))


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[:1] != ["kubeinfer"] or len(parts) < 2:
        return False
    path = ROOT.joinpath(*parts[1:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def unit_of(module: str) -> str | None:
    """``server:<unit>`` / ``operator`` for a kubeinfer module name, None for anything else."""
    parts = module.split(".")
    if parts[:2] == ["kubeinfer", "operator"]:
        return "operator"
    if parts[:2] == ["kubeinfer", "server"]:
        return "server:" + (parts[2] if len(parts) > 2 else "")
    return None


def edges() -> set[tuple[str, str, str]]:
    """(importer unit, imported unit, importing file) for every cross-unit import under server/ and operator/."""
    found = set()
    for folder in ("server", "operator"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith("_pb2.py"):
                continue
            src = unit_of(_module_name(path)[0])
            assert src is not None
            for name in imports_of(path):
                dst = unit_of(name)
                if dst is None or dst == src:
                    continue
                found.add((src, dst, str(path.relative_to(ROOT))))
    return found


def violations(found: Iterable[tuple[str, str, str]]) -> list[str]:
    problems = []
    graph: dict[str, set[str]] = {}
    for src, dst, where in found:
        graph.setdefault(src, set()).add(dst)
        s, d = src.partition(":")[2], dst.partition(":")[2]
        if src == "operator":
            if dst != "operator" and d not in OPERATOR_MAY_IMPORT:
                problems.append(f"{where}: the operator imports server.{d}, above the vocabulary layer")
            continue
        if dst == "operator":
            problems.append(f"{where}: the server imports the operator")
            continue
        if s not in SERVER_LAYERS or d not in SERVER_LAYERS:
            problems.append(f"{where}: package '{s if s not in SERVER_LAYERS else d}' has no layer in SERVER_LAYERS")
            continue
        if SERVER_LAYERS[d] > SERVER_LAYERS[s]:
            problems.append(f"{where}: {s} (layer {SERVER_LAYERS[s]}) imports {d} (layer {SERVER_LAYERS[d]})")
        if (s, d) in FORBIDDEN:
            problems.append(f"{where}: front end {s} imports {d}")
    problems += [f"package cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return sorted(problems)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_imports_point_down() -> None:
    assert violations(edges()) == []


def test_every_server_package_has_a_layer() -> None:
    units = {p.name for p in (ROOT / "server").iterdir() if (p / "__init__.py").exists()}
    units |= {p.stem for p in (ROOT / "server").glob("*.py") if p.stem != "__init__"}
    assert units - SERVER_LAYERS.keys() == set()


def test_the_check_catches_upward_imports_cycles_and_front_ends_reaching_backends() -> None:
    bad = {
        ("server:backends", "server:runtime", "b.py"),
        ("server:runtime", "server:backends", "r.py"),
        ("server:http", "server:backends", "h.py"),
        ("operator", "server:runtime", "o.py"),
    }
    found = violations(bad)
    assert "b.py: backends (layer 2) imports runtime (layer 4)" in found
    assert "h.py: front end http imports backends" in found
    assert "o.py: the operator imports server.runtime, above the vocabulary layer" in found
    assert any(p.startswith("package cycle: ") and "server:backends" in p for p in found)
