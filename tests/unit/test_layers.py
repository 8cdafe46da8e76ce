"""Imports point down: the layer map of ``kubeinfer.server.layers``, checked against the source read with ``ast``.

Every import counts, including ones inside functions and ``if TYPE_CHECKING:`` blocks: a lazy import
upward is still an upward dependency. The helpers (``imports_of``, ``unit_of``, ``edges``, ``violations``,
``cycles``) take the map as arguments where it matters, so another map (the operator's) can reuse them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Set
from pathlib import Path

from kubeinfer.server import layers
from kubeinfer.server.layers import FORBIDDEN, OPERATOR_MAY_IMPORT, SERVER_LAYERS

ROOT = Path(__file__).resolve().parents[2]


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


def violations(
    found: Iterable[tuple[str, str, str]],
    server_layers: Mapping[str, int] = SERVER_LAYERS,
    operator_may_import: Set[str] = OPERATOR_MAY_IMPORT,
    forbidden: Set[tuple[str, str]] = FORBIDDEN.keys(),
) -> list[str]:
    """What is wrong with the import edges ``found`` under the given map (by default the server's)."""
    problems = []
    graph: dict[str, set[str]] = {}
    for src, dst, where in found:
        graph.setdefault(src, set()).add(dst)
        s, d = src.partition(":")[2], dst.partition(":")[2]
        if src == "operator":
            if dst != "operator" and d not in operator_may_import:
                problems.append(f"{where}: the operator imports server.{d}, above the vocabulary layer")
            continue
        if dst == "operator":
            problems.append(f"{where}: the server imports the operator")
            continue
        if s not in server_layers or d not in server_layers:
            problems.append(f"{where}: package '{s if s not in server_layers else d}' has no layer in SERVER_LAYERS")
            continue
        if server_layers[d] > server_layers[s]:
            problems.append(f"{where}: {s} (layer {server_layers[s]}) imports {d} (layer {server_layers[d]})")
        if (s, d) in forbidden:
            problems.append(f"{where}: front end {s} imports {d}")
    problems += [f"package cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return sorted(problems)


def cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Every cycle of ``graph`` (node → the nodes it imports), found by depth-first search."""
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


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


def test_the_architecture_doc_has_the_current_layer_table() -> None:
    """The table is generated (``python -m kubeinfer.server.layers``); an edit of the map without it is caught."""
    doc = (ROOT / layers.DOC).read_text(encoding="utf-8")
    assert layers.with_table(doc) == doc, "run: python -m kubeinfer.server.layers"
    assert layers.markdown_table() in doc


def test_the_generated_table_follows_the_map() -> None:
    table = layers.markdown_table()
    for unit, number in SERVER_LAYERS.items():
        assert any(
            f"| {number}. " in row and (f"`server/{unit}" if unit else "`server/__init__.py`") in row
            for row in table.splitlines()
        ), unit
    stale = "<!-- layers:begin (generated by python -m kubeinfer.server.layers; edit server/layers.py) -->\nold\n<!-- layers:end -->"
    assert layers.with_table(f"intro\n{stale}\ntail") == f"intro\n{layers.BEGIN}\n{table}\n{layers.END}\ntail"
