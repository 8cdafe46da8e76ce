"""An OpenTelemetry Collector for the tests: the OTLP/HTTP receiver on a free port, the file exporter writing every
batch it received as one JSON line (OTLP's JSON encoding) to ``data/traces.jsonl`` in the test's folder.

The binary is the local cluster's build-only ``otelcol`` add-on (e2e/cluster/localcluster/addons/otelcol.py: a
trimmed collector built from the pinned modules of e2e/cluster/otelcol into the add-on cache; ``e2e/cluster/build
--addons otelcol`` builds it ahead, CI does)::

    with OtelCollector(tmp_path / "otel") as collector:
        url = collector.traces_url          # 127.0.0.1:<port>/v1/traces, Triton's form
        ...
        spans = collector.wait_for_spans(lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import functools
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.store_process import StoreProcess, StoreProcessError, free_port_on

ROOT = Path(__file__).resolve().parents[2]


class OtelCollectorError(StoreProcessError):
    pass


@functools.cache
def otelcol_dir() -> Path:
    """The ``otelcol`` add-on's folder (``otelcol``, ``VERSION``), built into the add-on cache on first use (in a
    child Python, as the other add-ons: a cold build downloads the modules and compiles, about a minute)."""
    code = "from e2e.cluster.localcluster.addons import otelcol; print(otelcol.otelcol_dir())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise OtelCollectorError(
            f"building the otelcol add-on failed (exit {proc.returncode}):\n{proc.stderr[-10000:]}"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def _value(v: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as Python (intValue travels as a string)."""
    if "intValue" in v:
        return int(v["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    return v


def _attributes(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a.get("value", {})) for a in items or ()}


class OtelCollector(StoreProcess):
    """The collector; ``spans()`` reads what it exported so far, flattened: one dict per span with ``name``,
    ``trace_id``/``span_id``/``parent_span_id`` (hex), ``kind`` (OTLP's number: 2 = SERVER), ``attributes``,
    ``events`` ([(name, unix ns)]), ``start``/``end`` (unix ns), ``resource`` and ``scope`` (the tracer's name)."""

    program = "otelcol"
    log_name = "otelcol.log"
    error = OtelCollectorError

    def __init__(self, root: Path, *, startup_timeout: float = 30.0) -> None:
        super().__init__(root, "127.0.0.1", startup_timeout=startup_timeout)
        self.port = free_port_on(self.host)
        self.output = self.data_dir / "traces.jsonl"
        self.config_path = self.root / "otelcol.yaml"
        self.config_path.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"{self.host}:{self.port}"}}}},
                    "processors": {"batch": {"timeout": "100ms"}},
                    "exporters": {"file": {"path": str(self.output), "flush_interval": "100ms"}},
                    "service": {
                        # no metrics listener of its own (upstream's default port would clash between tests)
                        "telemetry": {"metrics": {"level": "none"}},
                        "pipelines": {
                            "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["file"]}
                        },
                    },
                },
                indent=1,
            )
        )
        self.start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def traces_url(self) -> str:
        """Where OTLP/HTTP traces go, in Triton's ``host:port/v1/traces`` form."""
        return f"{self.host}:{self.port}/v1/traces"

    def command(self) -> list[str]:
        return [str(otelcol_dir() / "otelcol"), "--config", str(self.config_path)]

    def ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def spans(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            lines = self.output.read_text().splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                batch = json.loads(line)
            except ValueError:  # a line being written
                continue
            for rs in batch.get("resourceSpans", ()):
                resource = _attributes(rs.get("resource", {}).get("attributes"))
                for ss in rs.get("scopeSpans", ()):
                    scope = ss.get("scope", {}).get("name", "")
                    for s in ss.get("spans", ()):
                        out.append(
                            {
                                "name": s["name"],
                                "trace_id": s.get("traceId", ""),
                                "span_id": s.get("spanId", ""),
                                "parent_span_id": s.get("parentSpanId", ""),
                                "kind": s.get("kind", 0),
                                "attributes": _attributes(s.get("attributes")),
                                "events": [(e["name"], int(e.get("timeUnixNano", 0))) for e in s.get("events", ())],
                                "start": int(s.get("startTimeUnixNano", 0)),
                                "end": int(s.get("endTimeUnixNano", 0)),
                                "resource": resource,
                                "scope": scope,
                            }
                        )
        return out

    def wait_for_spans(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 20.0
    ) -> list[dict[str, Any]]:
        """``spans()`` once ``done(spans)`` holds; raises with what arrived when it does not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = [(s["name"], s["trace_id"]) for s in spans]
                raise AssertionError(f"the collector did not get the spans awaited within {timeout:.0f}s: {names}")
            time.sleep(0.1)
