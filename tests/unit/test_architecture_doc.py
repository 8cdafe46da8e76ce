"""docs/architecture.md names the file behind each part: every path it names must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_every_file_the_architecture_doc_names_exists() -> None:
    paths = set(re.findall(r"`((?:server|operator|tests|e2e|scripts)/[\w./]+)`", DOC.read_text()))
    assert len(paths) > 20, paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_readme_links_the_architecture_doc() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
