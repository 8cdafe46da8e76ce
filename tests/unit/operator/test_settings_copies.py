"""The copies of the operator's settings are generated from ``OperatorConfig`` (``settings_copies``): the committed
values.yaml, values.schema.json and docs/operator.md table are current, the chart's defaults are the settings'
defaults, and the chart's deployment.yaml passes each such value to its setting's flag."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from kubeinfer.operator.controllers import settings, settings_copies

from tests.unit.test_layers import ROOT

DEPLOYMENT = ROOT / settings_copies.CHART / "templates" / "deployment.yaml"


def _read(relative: Path) -> str:
    return (ROOT / relative).read_text(encoding="utf-8")


def test_the_copies_are_current() -> None:
    values, schema, doc = _read(settings_copies.VALUES), _read(settings_copies.SCHEMA), _read(settings_copies.DOC)
    assert settings_copies.with_defaults(values) == values, f"run {settings_copies.COMMAND}"
    assert settings_copies.with_schemas(schema) == schema, f"run {settings_copies.COMMAND}"
    assert settings_copies.with_table(doc) == doc, f"run {settings_copies.COMMAND}"


def test_the_docs_table_has_every_flag_once() -> None:
    table = settings_copies.markdown_table().splitlines()[2:]
    names = [row.split("`")[1] for row in table]
    assert names == [how.name for _, how in settings.every_flag()]
    workers = next(row for row in table if row.startswith("| `--workers` |"))
    assert "| `operator.workers` | `8` |" in workers
    hosts = next(row for row in table if row.startswith("| `--allowed-hosts` (repeatable) |"))
    assert "'\\*.example.com'" in hosts  # no Markdown emphasis between two asterisks


def test_every_chart_value_defaults_to_its_setting() -> None:
    values = yaml.safe_load(_read(settings_copies.VALUES))
    schema = json.loads(_read(settings_copies.SCHEMA))
    seen = set()
    for f, how in settings.every_flag():
        if how.chart is None:
            continue
        section, key = how.chart.path.split(".")
        assert values[section][key] == f.default, how.chart.path
        fragment = schema["properties"][section]["properties"][key]
        assert fragment["default"] == f.default and how.name in fragment["description"]
        seen.add(how.chart.path)
    # the settings the chart repeated by hand before they were generated
    assert {"operator.resyncSeconds", "operator.workers", "artifacts.downloadsTotal", "lease.durationSeconds"} <= seen


def test_the_chart_passes_each_value_to_its_flag() -> None:
    template = DEPLOYMENT.read_text(encoding="utf-8")
    for _, how in settings.every_flag():
        if how.chart is not None:
            wired = rf"- {how.name}={{{{ (int64 )?\.Values\.{re.escape(how.chart.path)} }}}}\n"
            assert re.search(wired, template), f"{DEPLOYMENT.name} does not pass {how.chart.path} to {how.name}"


def test_descriptions_name_other_flags_by_their_chart_value() -> None:
    schema = json.loads(_read(settings_copies.SCHEMA))
    total = schema["properties"]["artifacts"]["properties"]["downloadsTotal"]["description"]
    assert "keep it below operator.workers;" in total and total.endswith("the operator's --downloads-total.")


def test_check_reports_a_stale_chart_and_writes_nothing(tmp_path: Path) -> None:
    chart = tmp_path / settings_copies.CHART
    shutil.copytree(ROOT / settings_copies.CHART, chart, symlinks=True)
    (tmp_path / settings_copies.DOC).parent.mkdir()
    shutil.copy(ROOT / settings_copies.DOC, tmp_path / settings_copies.DOC)
    values = chart / "values.yaml"
    stale = values.read_text(encoding="utf-8").replace("  workers: 8\n", "  workers: 9\n")
    assert stale != values.read_text(encoding="utf-8")
    values.write_text(stale, encoding="utf-8")
    assert settings_copies.main(["--root", str(tmp_path), "--check"]) == 1
    assert values.read_text(encoding="utf-8") == stale
    assert settings_copies.main(["--root", str(tmp_path)]) == 0
    assert values.read_text(encoding="utf-8") == _read(settings_copies.VALUES)


def test_a_copy_without_its_markers_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"^helm/kubeinfer/values.yaml: the markers"):
        settings_copies.with_defaults("operator: {}\n")
    with pytest.raises(ValueError, match=r"^docs/operator.md: the markers"):
        settings_copies.with_table("# Operator\n")
