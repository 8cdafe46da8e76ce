"""The pre-commit hooks (.pre-commit-config.yaml) run the same static checks as scripts/test."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: arguments that only differ because pre-commit passes file names (scripts/test checks the whole tree)
FILE_SELECTION = {".", "--force-exclude"}


def _command(line: str) -> tuple[str, ...]:
    return tuple(w for w in shlex.split(line) if w not in FILE_SELECTION)


def scripts_test_checks() -> set[tuple[str, ...]]:
    """The commands between scripts/test's "static checks" comment and the next blank line."""
    lines = (ROOT / "scripts" / "test").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# the static checks"))
    checks: set[tuple[str, ...]] = set()
    for line in lines[start + 1 :]:
        if not line.strip() or line.startswith(("paths=", "if ", "exec ")):
            break
        checks.add(_command(line))
    return checks


def test_pre_commit_hooks_are_the_checks_of_scripts_test() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    checks = scripts_test_checks()
    assert len(checks) >= 4, checks  # protos, ruff check, ruff format, mypy
    assert {_command(hook["entry"]) for hook in hooks} == checks
