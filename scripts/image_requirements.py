"""Print the requirements of some of kubeinfer's extras, one per line, from the installed metadata.

The images install the project with ``pip install --no-deps .`` and then only what their role needs
(``server`` or ``operator``, plus e.g. ``gpu``), because the plain dependency list is the union of both.
The server role takes ONNX Runtime from ``cpu`` unless ``gpu`` is asked for: only one of onnxruntime and
onnxruntime-gpu may be installed in one environment.
Usage: ``python image_requirements.py server gpu,pytorch`` (extras as arguments or comma-separated;
stdlib only; runs inside the image build).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def role_extras(extras: list[str]) -> list[str]:
    """``extras`` plus ``cpu`` for a server without ``gpu`` (its ONNX Runtime)."""
    if "server" in extras and "gpu" not in extras and "cpu" not in extras:
        return [*extras, "cpu"]
    return extras


def requirements(extras: list[str], dist: str = "kubeinfer") -> list[str]:
    extras = role_extras(extras)
    known: set[str] = set(importlib.metadata.metadata(dist).get_all("Provides-Extra") or [])
    unknown = [e for e in extras if e not in known]
    if unknown:
        raise SystemExit(f"unknown extra(s) {unknown}; {dist} provides {sorted(known)}")
    out: list[str] = []
    for req in importlib.metadata.requires(dist) or []:
        spec, _, marker = req.partition(";")
        m = EXTRA.search(marker)
        if m and m.group(1) in extras:
            rest = EXTRA.sub("", marker).strip(" ()")
            rest = re.sub(r"^\s*and\s+|\s+and\s*$", "", rest).strip()
            line = spec.strip() + (f"; {rest}" if rest else "")
            if line not in out:
                out.append(line)
    return out


if __name__ == "__main__":
    print("\n".join(requirements([e for arg in sys.argv[1:] for e in arg.split(",") if e])))
