"""constraints.txt pins what the suite installs: scripts/lock writes it, scripts/test (so CI) and the
images install with it, so a fresh machine gets the versions we tested."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: the extras scripts/test installs, and the image roles (subsets of the plain dependencies); ``gpu`` is
#: left out: CI has no GPU to test those versions on
LOCKED_EXTRAS = ("server", "cpu", "operator", "dev", "pytorch", "tensorflow", "perf")


def lock_target() -> tuple[str, str]:
    """(Python version, platform) constraints.txt was resolved for, from the header scripts/lock writes."""
    m = re.search(r"for CPython (\d+\.\d+) on (\S+)", (ROOT / "constraints.txt").read_text())
    assert m, "constraints.txt has no 'for CPython X.Y on PLATFORM' header: write it with scripts/lock"
    return m.group(1), m.group(2)


def pins() -> dict[str, Version]:
    """name → pinned version, of the constraints.txt lines whose markers hold here."""
    out: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate():
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", f"constraints.txt pins exact versions only: {line}"
        name = canonicalize_name(req.name)
        assert name not in out, f"{name} is pinned twice for this interpreter"
        out[name] = Version(spec.version)
    return out


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in LOCKED_EXTRAS:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def test_every_requirement_is_pinned_within_its_range() -> None:
    pinned = pins()
    for req in project_requirements():
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req} is not in constraints.txt: run scripts/lock"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"constraints.txt pins {name}=={pinned[name]}, outside {req}: run scripts/lock"
        )


def test_the_environment_is_the_locked_one() -> None:
    """What this suite runs on is what constraints.txt says (scripts/test installs with it)."""
    python, target = lock_target()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if (here, sys.platform, platform.machine()) != (python, "linux", target.split("-", 1)[0]):
        pytest.skip(f"constraints.txt is for CPython {python} on {target}; this is {here} on {sys.platform}")
    drift = []
    for name, version in pins().items():
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            continue  # not needed here (another platform's, or an optional tool)
        if installed != version:
            drift.append(f"{name} {installed} (constraints.txt: {version})")
    assert not drift, "installed versions differ from constraints.txt (scripts/test installs it): " + ", ".join(drift)
