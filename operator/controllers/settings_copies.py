"""The copies of the operator's settings outside Python, generated from ``settings.OperatorConfig``:

* a setting whose flag names a chart value (``settings.ChartValue``) gets its default written into
  ``helm/kubeinfer/values.yaml`` (between generated markers, one block per section) and its schema (type, default,
  bounds, the flag's help as description) into ``helm/kubeinfer/values.schema.json``; the chart's
  ``templates/deployment.yaml`` passes each such value to its flag;
* ``docs/operator.md`` gets the table of every setting's flag, chart value, default and help.

The default and the words are written once, on the setting. ``python -m kubeinfer.operator.controllers.settings_copies``
rewrites the three files; ``--check`` exits 1 when one is stale (``tests/unit/operator/test_settings_copies.py`` holds
the repository to it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubeinfer.server import layers

from . import settings

CHART = Path("helm") / "kubeinfer"
VALUES = CHART / "values.yaml"
SCHEMA = CHART / "values.schema.json"
DOC = Path("docs") / "operator.md"
COMMAND = "python -m kubeinfer.operator.controllers.settings_copies"
#: JSON schema types of the settings' Python types (the annotations are strings: ``from __future__ import annotations``)
_TYPES = {"int": "integer", "float": "number"}
_GIB = 1 << 30
_WIDTH = 118
#: help text characters Markdown would read as markup in a table cell
_MARKDOWN = {"|": "\\|", "*": "\\*", "<": "&lt;", ">": "&gt;"}


@dataclasses.dataclass(frozen=True)
class Value:
    """One chart value generated from a setting."""

    section: str
    key: str
    default: int | float
    schema: dict[str, Any]
    description: str


def _number(value: float) -> int | float:
    """A whole float as an int: the chart passes the value to the flag as helm prints it (30, not 30.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _description(help_text: str, flag: str, paths: dict[str, str]) -> str:
    """The flag's help in the chart's words: other flags the chart exposes named by their value path."""
    text = re.sub(r"--[a-z0-9-]+", lambda m: paths.get(m.group(0), m.group(0)), help_text)
    return f"{text[:1].upper()}{text[1:]}; the operator's {flag}."


def values() -> Iterator[Value]:
    """The chart values generated from the settings, in the order of the fields."""
    paths = {how.name: how.chart.path for _, how in settings.every_flag() if how.chart is not None}
    for f, how in settings.every_flag():
        chart = how.chart
        if chart is None:
            continue
        section, _, key = chart.path.partition(".")
        json_type = _TYPES.get(str(f.type))
        if not key or "." in key or json_type is None or not isinstance(f.default, int | float):
            raise ValueError(f"{f.name}: a chart value is a number of a top-level section, not {chart.path} ({f.type})")
        default = _number(f.default)
        description = _description(how.help, how.name, paths)
        schema: dict[str, Any] = {"type": json_type, "default": default}
        if chart.minimum is not None:
            schema["minimum"] = _number(chart.minimum)
        if chart.exclusive_minimum is not None:
            schema["exclusiveMinimum"] = _number(chart.exclusive_minimum)
        schema["description"] = description
        yield Value(section, key, default, schema, description)


def with_schemas(schema_text: str) -> str:
    """values.schema.json with each generated value's schema in place (json.dumps, indent 2)."""
    schema = json.loads(schema_text)
    for value in values():
        section = schema["properties"][value.section]
        section.setdefault("properties", {})[value.key] = value.schema
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def markers(section: str) -> tuple[str, str]:
    """The lines that enclose a section's generated values in values.yaml (indented as its keys)."""
    return (
        f"  # >>> generated ({COMMAND}): the {section} settings",
        f"  # <<< generated: the {section} settings",
    )


def _yaml_lines(value: Value) -> list[str]:
    comment = textwrap.wrap(value.description, _WIDTH - 4, break_on_hyphens=False)
    line = f"  {value.key}: {value.default}"
    if value.key.endswith("Bytes") and isinstance(value.default, int) and value.default % _GIB == 0:
        line += f"   # {value.default // _GIB} GiB"
    return [*(f"  # {c}" for c in comment), line]


def with_defaults(values_text: str) -> str:
    """values.yaml with each section's generated block rewritten from the settings."""
    blocks: dict[str, list[str]] = {}
    for value in values():
        blocks.setdefault(value.section, []).extend(_yaml_lines(value))
    for section, lines in blocks.items():
        begin, end = markers(section)
        values_text = layers.between_markers(values_text, begin, end, "\n".join(lines), str(VALUES))
    return values_text


def _shown_default(f: dataclasses.Field[Any], how: settings.Flag) -> str:
    """A setting's default as the docs table shows it: a number or a name; "none" for an empty one (the help says
    what that means)."""
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, int | float):
        shown = f"`{_number(value)}`"
    else:
        shown = f"`{value}`" if isinstance(value, str | Path) else "none"
    return f"{shown} (or ${how.env})" if how.env else shown


def markdown_table() -> str:
    """The settings table of ``docs/operator.md``."""
    rows = ["| flag | chart value | default | what |", "|---|---|---|---|"]
    for f, how in settings.every_flag():
        chart = f"`{how.chart.path}`" if how.chart else ""
        flag = f"`{how.name}`" + (" (repeatable)" if how.repeatable else "")
        default = _shown_default(f, how)
        what = how.help.replace("%(default)s", str(f.default))
        for char, escaped in _MARKDOWN.items():
            what = what.replace(char, escaped)
        rows.append(f"| {flag} | {chart} | {default} | {what} |")
    return "\n".join(rows)


DOC_BEGIN = f"<!-- settings:begin (generated by {COMMAND}; edit operator/controllers/settings.py) -->"
DOC_END = "<!-- settings:end -->"


def with_table(doc: str) -> str:
    """docs/operator.md with the settings table rewritten."""
    return layers.between_markers(doc, DOC_BEGIN, DOC_END, markdown_table(), str(DOC))


def _files(root: Path) -> Iterator[tuple[Path, str, str]]:
    """(path, current text, wanted text) of each generated file."""
    for relative, rewrite in ((VALUES, with_defaults), (SCHEMA, with_schemas), (DOC, with_table)):
        path = root / relative
        current = path.read_text(encoding="utf-8")
        yield path, current, rewrite(current)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Writes the operator settings' copies into {CHART} and {DOC}.")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    parser.add_argument("--check", action="store_true", help="fail when a generated file is stale; write nothing")
    args = parser.parse_args(argv)
    stale = False
    for path, current, wanted in _files(args.root):
        if wanted == current:
            continue
        if args.check:
            print(f"{path}: the operator settings' copy is out of date; run {COMMAND}", file=sys.stderr)
            stale = True
        else:
            path.write_text(wanted, encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
