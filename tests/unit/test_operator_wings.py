"""The operator's imports point down its wings (``kubeinfer.operator.wings``): read from the source with ``ast``,
lazy imports and ``TYPE_CHECKING`` blocks included, as ``test_layers`` reads the server's."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kubeinfer.operator import wings

from tests.unit.test_layers import ROOT, imports_of

OPERATOR = ROOT / "operator"


def wing_of(module: str) -> str | None:
    """The wing (or top-level module) of a ``kubeinfer.operator`` module; None for other modules."""
    parts = module.split(".")
    if parts[:2] != ["kubeinfer", "operator"] or len(parts) < 3:
        return None
    return parts[2]


def _module(path: Path) -> str:
    rel = path.relative_to(OPERATOR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["kubeinfer", "operator", *parts])


def problems(found: Iterable[tuple[str, str, str]]) -> list[str]:
    """What is wrong with (importing wing, imported wing, file) edges."""
    out = []
    for src, dst, where in found:
        if src == dst or src in wings.TOP:
            continue
        if dst in wings.TOP:
            out.append(f"{where}: wing {src} imports the top-level module {dst}")
            continue
        try:
            s, d = wings.floor_of(src), wings.floor_of(dst)
        except KeyError as unknown:
            out.append(f"{where}: {unknown} is on no floor of kubeinfer.operator.wings")
            continue
        if d > s:
            out.append(f"{where}: {src} (floor {s}) imports {dst} (floor {d})")
        elif d == s:
            out.append(f"{where}: {src} imports {dst}, a wing on its own floor")
    return sorted(out)


def edges() -> set[tuple[str, str, str]]:
    found = set()
    for path in sorted(OPERATOR.rglob("*.py")):
        src = wing_of(_module(path))
        assert src is not None
        for name in imports_of(path):
            dst = wing_of(name)
            if dst is not None:
                found.add((src, dst, str(path.relative_to(ROOT))))
    return found


def test_operator_imports_point_down_its_wings() -> None:
    assert problems(edges()) == []


def test_every_operator_folder_is_a_wing_and_every_module_sits_in_one() -> None:
    folders = {p.name for p in OPERATOR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {w for floor in wings.FLOORS for w in floor}
    assert {p.stem for p in OPERATOR.glob("*.py")} == set(wings.TOP)


def test_the_check_catches_upward_sideways_and_unknown_imports() -> None:
    found = problems(
        {
            ("api", "traffic", "a.py"),
            ("kube", "sources", "k.py"),
            ("models", "volume", "m.py"),
            ("models", "nowhere", "n.py"),
            ("servers", "cli", "s.py"),
            ("cli", "controllers", "c.py"),
        }
    )
    assert found == [
        "a.py: api (floor 0) imports traffic (floor 4)",
        "k.py: kube imports sources, a wing on its own floor",
        "n.py: 'nowhere' is on no floor of kubeinfer.operator.wings",
        "s.py: wing servers imports the top-level module cli",
    ]


def test_the_architecture_doc_has_the_current_wings_table() -> None:
    """The table is generated (``python -m kubeinfer.operator.wings``); an edit of the map without it is caught."""
    doc = (ROOT / wings.DOC).read_text(encoding="utf-8")
    assert wings.with_table(doc) == doc, "run: python -m kubeinfer.operator.wings"
    table = wings.markdown_table()
    assert all(f"`operator/{wing}/`" in table for floor in wings.FLOORS for wing in floor)
