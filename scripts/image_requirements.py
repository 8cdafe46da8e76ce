"""Print the requirements of some of kubeinfer's extras, one per line, read from pyproject.toml.

The images install only what their role needs (the ``server`` or ``operator`` extra, plus e.g. ``gpu``),
because the plain dependency list is the union of both; they install these first, from pyproject.toml
alone, so that a source change reuses that layer. The server role takes ONNX Runtime from ``cpu`` unless
``gpu`` is asked for: only one of onnxruntime and onnxruntime-gpu may be installed in one environment.
Usage (stdlib only, Python 3.11+; runs in the build):

    python image_requirements.py --pyproject pyproject.toml server gpu,pytorch
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def role_extras(extras: list[str]) -> list[str]:
    """``extras`` plus ``cpu`` for a server without ``gpu`` (its ONNX Runtime)."""
    if "server" in extras and "gpu" not in extras and "cpu" not in extras:
        return [*extras, "cpu"]
    return extras


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    extras = role_extras(extras)
    table = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    unknown = [e for e in extras if e not in table]
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; {pyproject} has {sorted(table)}")
    out: list[str] = []
    for extra in extras:
        out += [r for r in table[extra] if r not in out]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pyproject", type=Path, default=PYPROJECT)
    ap.add_argument("extras", nargs="+", help="extras, as arguments or comma-separated")
    args = ap.parse_args(argv)
    print("\n".join(requirements([e for a in args.extras for e in a.split(",") if e], args.pyproject)))


if __name__ == "__main__":
    main()
