"""The documentation: the MkDocs site builds with no broken link, and README.md stays a short front page
whose first command installs what its client snippet imports.

``mkdocs build --strict`` turns every warning into a failure, and mkdocs.yml's ``validation`` makes a link
to a missing page, a missing anchor, an absolute link and a page left out of the nav warnings (a missing
snippet include is an error of its own): so a docs edit that breaks a reference fails here with mkdocs's own
message. Not ``-q``: a quiet build does not count its warnings, and strict mode then passes anything.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: the issue's limit: what it is, the two commands, the cluster quick start and links; the rest is in docs/
README_MAX_LINES = 400


def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout}\n{run.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
    # the pages README.md includes (its intro and quick start) and SECURITY.md arrive in the site
    home = (tmp_path / "site" / "index.html").read_text()
    assert "kubeinfer-server" in home and "Quick start on the local cluster" in home
    assert "Reporting a vulnerability" in (tmp_path / "site" / "security" / "index.html").read_text()
    # the CRD reference is generated from crds/ (docs/hooks/crd_reference.py): every spec field has its row
    for crd_file in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        page = tmp_path / "site" / "crd-reference" / crd["spec"]["names"]["singular"] / "index.html"
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        missing = [name for name in spec["properties"] if f"<code>{name}</code>" not in page.read_text()]
        assert not missing, f"{page} lacks the spec fields {missing}"


def test_readme_is_a_short_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_links_lead_somewhere() -> None:
    """README.md is outside the site, so mkdocs does not check its links: every relative one names a file."""
    targets = re.findall(r"\]\(((?!https?://|#)[^)\s]+)\)", README.read_text())
    assert targets, "README.md links no file"
    missing = sorted(t for t in targets if not (ROOT / t.split("#")[0]).exists())
    assert not missing, f"README.md links files that do not exist: {missing}"


def _installed_by(names: list[str]) -> set[str]:
    """The distributions ``pip install`` of these requirement strings brings in, from the installed metadata
    (this venv has them all): each one's requirements, with the extras asked for, recursively."""
    todo = [Requirement(name) for name in names]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        key = f"{req.name.lower()}{sorted(req.extras)}"
        if key in seen:
            continue
        seen.add(key)
        for line in importlib.metadata.requires(req.name) or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in [*req.extras, ""]):
                todo.append(dep)
    return {key.split("[")[0] for key in seen}


def test_the_readme_snippet_runs_after_step_one() -> None:
    """The client snippet imports only what the README's first command installs (the project, plus what that
    command names beside it), so a reader can run it right after step 1."""
    text = README.read_text()
    step_one = next(line for line in text.splitlines() if line.startswith("python3 -m venv .venv && "))
    words = shlex.split(step_one.split("pip install", 1)[1].split("&&", 1)[0])
    assert words[:2] == ["-e", "."], step_one
    installed = _installed_by(["kubeinfer", *words[2:]])
    snippet = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    modules = set()
    for node in ast.walk(ast.parse(snippet)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    providers = importlib.metadata.packages_distributions()
    missing = {m: providers.get(m) for m in modules if not {d.lower() for d in providers.get(m, [])} & installed}
    assert modules and not missing, f"step 1 ({step_one!r}) does not install what the snippet imports: {missing}"


def test_the_figures_name_results_that_exist() -> None:
    """A measured figure in the docs names its results file under benchmarks/results/: each one is there."""
    pages = [README, ROOT / "SECURITY.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {name for page in pages for name in re.findall(r"benchmarks/results/[\w.*-]+", page.read_text())}
    assert len(named) > 10, named
    missing = sorted(name for name in named if not list(ROOT.glob(name)))
    assert not missing, f"the docs cite results files that do not exist: {missing}"
