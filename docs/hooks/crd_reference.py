"""MkDocs hook: the CRD reference pages, generated from crds/*.yaml at every build.

The CRDs' OpenAPI schemas (written by ``python -m kubeinfer.operator.api.crds``) are the one home of every
field's type, limits, rules and description; a hand-written reference would be a copy that drifts. So the
site's "CRD reference" pages are rendered here, as the site is built, and never stored in docs/.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
#: the site path of each generated page, by the CRD's kind (mkdocs.yml's nav names these)
PAGE = "crd-reference/{kind}.md"

Schema = dict[str, Any]


def _cell(text: str) -> str:
    """A table cell: one line, no column break, and ``<volume>`` shown rather than taken for an HTML tag. Only
    outside code spans: Markdown shows a code span's text as it is, and the table reads no column break in it."""
    parts = " ".join(text.split()).split("`")
    parts[::2] = [html.escape(part, quote=False).replace("|", "\\|") for part in parts[::2]]
    return "`".join(parts)


def _limits(node: Schema) -> list[str]:
    """The schema's constraints in words: what the API server enforces besides the type."""
    found = []
    if "enum" in node:
        found.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    for key, word in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("maxProperties", "keys ≤"),
    ):
        if key in node and not isinstance(node[key], bool):
            found.append(f"{word} {node[key]}")
    if node.get("exclusiveMinimum") is True and "minimum" in node:
        found[-1:] = [f"> {node['minimum']}"]
    if "pattern" in node:
        found.append(f"pattern `{node['pattern']}`")
    if "x-kubernetes-list-map-keys" in node:
        found.append("keyed by " + ", ".join(f"`{k}`" for k in node["x-kubernetes-list-map-keys"]))
    for rule in node.get("x-kubernetes-validations", []):
        found.append(f"rule: {rule.get('message', rule['rule'])}")
    return found


def _type(node: Schema) -> str:
    kind = str(node.get("type", "any"))
    if kind == "array" and "items" in node:
        return f"[]{_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    return kind + (f" ({node['format']})" if "format" in node else "")


def _rows(node: Schema, path: str, required: bool, out: list[str]) -> None:
    """One table row per field, depth first, then the fields of its objects, list items and map values."""
    if path:
        notes = ("**required**. " if required else "") + node.get("description", "")
        limits = _limits(node)
        text = _cell(notes) + ("<br>" + "; ".join(_cell(x) for x in limits) if limits else "")
        out.append(f"| `{path}` | {_cell(_type(node))} | {text} |")
    inner = node
    suffix = ""
    while inner.get("type") == "array" and "items" in inner:
        inner, suffix = inner["items"], suffix + "[]"
    if isinstance(inner.get("additionalProperties"), dict):
        inner, suffix = inner["additionalProperties"], suffix + ".<key>"
    needed = set(inner.get("required", []))
    for name, child in (inner.get("properties") or {}).items():
        _rows(child, f"{path}{suffix}.{name}" if path else name, name in needed, out)


def render(crd: Schema, source: str) -> str:
    """The reference page of one CRD (read from ``source``): names, printer columns, then spec and status field
    by field."""
    spec = crd["spec"]
    names = spec["names"]
    lines = [
        f"# {names['kind']}",
        "",
        f"Generated from `{source}` when the site is built (`docs/hooks/crd_reference.py`); `kubectl explain "
        f"{names['singular']}.spec` shows the same text on a cluster.",
        "",
        "| | |",
        "|---|---|",
        f"| API group | `{spec['group']}` |",
        f"| scope | {spec['scope']} |",
        f"| names | `{names['plural']}`, `{names['singular']}`"
        + "".join(f", `{n}`" for n in names.get("shortNames", []))
        + " |",
    ]
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        lines += ["", f"## {version['name']}", ""]
        if schema.get("description"):
            lines += [_cell(schema["description"]), ""]
        columns = version.get("additionalPrinterColumns", [])
        if columns:
            lines += ["`kubectl get` columns (`-o wide` adds those of priority 1):", ""]
            lines += ["| column | from |", "|---|---|"]
            lines += [f"| {_cell(c['name'])} | `{_cell(c['jsonPath'])}` |" for c in columns]
        for part in ("spec", "status"):
            if part not in schema.get("properties", {}):
                continue
            node = schema["properties"][part]
            lines += ["", f"### {part}", ""]
            if node.get("description"):
                lines += [_cell(node["description"]), ""]
            lines += [f"- {_cell(x)}" for x in _limits(node)] + [""]
            rows: list[str] = []
            _rows(node, "", False, rows)
            lines += ["| field | type | meaning |", "|---|---|---|", *rows]
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Adds one generated page per CRD file (an absent crds/ folder is an error, not an empty reference)."""
    paths = sorted(CRDS.glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no CRDs in {CRDS}")
    for path in paths:
        crd = yaml.safe_load(path.read_text())
        page = PAGE.format(kind=crd["spec"]["names"]["singular"])
        files.append(File.generated(config, page, content=render(crd, str(path.relative_to(ROOT)))))
    return files
