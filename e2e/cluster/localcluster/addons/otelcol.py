"""An OpenTelemetry Collector for the tests of the server's OpenTelemetry trace mode: a trimmed collector built from
its pinned modules (``e2e/cluster/otelcol``: core v0.161.0, contrib v0.161.0).

Build-only: ``build --addons otelcol`` (and ``ensure_built``) builds it, nothing starts it with the cluster; the tests
start one of their own (``tests/support/otel_collector.py``: the OTLP/HTTP receiver on a free port, the file exporter
writing what it received to a JSON-lines file in the test's folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import gotool
from ..addons import support

# bump when the build below changes
OTELCOL_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w otelcol=wrapper-main(otlpreceiver,batchprocessor,fileexporter)"
OTELCOL = "go.opentelemetry.io/collector/otelcol"


def otelcol_dir() -> Path:
    """``<cache>/addons/otelcol-<hash>``: ``otelcol`` (``e2e/cluster/otelcol/main.go``) and ``VERSION`` (the pinned
    ``otelcol`` module's version)."""
    key = support.key(
        OTELCOL_RECIPE.encode(), *support.module_files("otelcol/go.mod", "otelcol/go.sum", "otelcol/main.go")
    )

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("otelcol", OTELCOL)
        gotool.go(["build", "-p", jobs, "-trimpath", "-ldflags", "-s -w", "-o", str(out / "otelcol"), "."], "otelcol")
        (out / "VERSION").write_text(info["version"] + "\n")

    return support.cached("otelcol", key, make)
