"""Triton's OpenTelemetry trace mode for a Python model's BLS requests, against a real OpenTelemetry Collector: a BLS
request made with ``trace=request.trace()`` is a model span (with its compute span) under the span of the request
that made it, in stub processes and in the server's process alike, over HTTP and gRPC; one made without it, or by a
request that is not traced, has no span (Triton's "Tracing for BLS models")."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.test_opentelemetry import COMPUTE_EVENTS, MODEL_EVENTS, _otel_server, _repo, _traceparent
from tests.integration.test_opentelemetry import collector as collector  # the module's collector fixture
from tests.support.otel_collector import OtelCollector
from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess

IN_PROCESS = 'parameters { key: "KUBEINFER_IN_PROCESS" value: { string_value: "true" } }\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, collector: OtelCollector) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("otel-bls"), decoupled=True)  # add, add2, chain, repeat_int32
    copy_python_models(repo, "bls_traced", "bls_abandons")
    for source, name, extra in (
        ("bls_traced", "bls_traced_in_process", IN_PROCESS),
        ("bls_traced", "bls_quiet", ""),
        ("bls_abandons", "bls_abandons_in_process", IN_PROCESS),
    ):
        shutil.copytree(repo / source, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text() + extra)
    server = _otel_server(repo, collector.traces_url)
    yield server
    server.terminate()


def _infer(server: ServerProcess, protocol: str, model: str, request_id: str, headers: dict[str, str]) -> Any:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    x = module.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return client.infer(model, [x], request_id=request_id, headers=headers).as_numpy("OUT")


@pytest.mark.parametrize("model", ["bls_traced", "bls_traced_in_process"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bls_requests_with_the_requests_trace_are_its_child_spans(
    server: ServerProcess, collector: OtelCollector, protocol: str, model: str
) -> None:
    traceparent, trace_id, caller_span = _traceparent()
    request_id = f"bls-{secrets.token_hex(4)}"
    out = _infer(server, protocol, model, request_id, {"traceparent": traceparent})
    np.testing.assert_allclose(out, 4 * np.arange(4, dtype=np.float32).reshape(1, 4))

    def done(spans: list[dict[str, Any]]) -> bool:  # the root ends last: with it, every span of the trace came
        return any(s["trace_id"] == trace_id and s["name"] == "InferRequest" for s in spans)

    spans = [s for s in collector.wait_for_spans(done) if s["trace_id"] == trace_id]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    # add2 was called without trace=: no span of its own
    assert sorted(by_name) == sorted(["InferRequest", model, "add", "repeat_int32", "compute"]), sorted(by_name)
    (root,), (parent,) = by_name["InferRequest"], by_name[model]
    assert root["parent_span_id"] == caller_span and parent["parent_span_id"] == root["span_id"]
    parent_id = parent["attributes"]["triton.trace_id"]
    assert parent["attributes"]["triton.trace_parent_id"] == 0 and parent_id > 0
    children = {}
    for callee in ("add", "repeat_int32"):
        (child,) = by_name[callee]
        children[callee] = child
        attrs = child["attributes"]
        assert child["parent_span_id"] == parent["span_id"], callee
        assert attrs["triton.trace_parent_id"] == parent_id
        assert attrs["triton.trace_id"] not in (0, parent_id)
        assert attrs["triton.model_name"] == callee and attrs["triton.model_version"] == 1
        assert attrs["triton.request_id"] == request_id
        assert [e for e, _ in child["events"]] == MODEL_EVENTS
        # made and ended while the parent executed
        assert parent["start"] <= child["start"] <= child["end"] <= parent["end"]
    assert children["add"]["attributes"]["triton.trace_id"] != children["repeat_int32"]["attributes"]["triton.trace_id"]
    # compute spans: the parent's own and each child's, under it
    compute_parents = sorted(c["parent_span_id"] for c in by_name["compute"])
    assert compute_parents == sorted(s["span_id"] for s in (parent, *children.values()))
    for c in by_name["compute"]:
        assert [e for e, _ in c["events"]] == COMPUTE_EVENTS


def test_bls_of_a_request_that_is_not_traced_has_no_span(server: ServerProcess, collector: OtelCollector) -> None:
    """``trace=request.trace()`` of a request that is not traced (its model's trace level is OFF, and it carries no
    traceparent) traces nothing: no span for the request or its BLS requests."""
    response = httpx.post(f"{server.base_url}/v2/models/bls_quiet/trace/setting", json={"trace_level": ["OFF"]})
    assert response.status_code == 200, response.text
    quiet = f"quiet-{secrets.token_hex(4)}"
    out = _infer(server, "http", "bls_quiet", quiet, {})
    np.testing.assert_allclose(out, 4 * np.arange(4, dtype=np.float32).reshape(1, 4))
    # a traced request after it: once its root arrived, any span of the quiet one would have too
    traceparent, trace_id, _ = _traceparent()
    _infer(server, "grpc", "bls_traced", "after-quiet", {"traceparent": traceparent})
    spans = collector.wait_for_spans(
        lambda spans: any(s["trace_id"] == trace_id and s["name"] == "InferRequest" for s in spans)
    )
    assert not [s for s in spans if s["attributes"].get("triton.request_id") == quiet]
    assert not [s for s in spans if s["name"] == "bls_quiet"]


@pytest.mark.parametrize("model", ["bls_abandons", "bls_abandons_in_process"])
def test_a_dropped_decoupled_bls_iterator_still_ends_its_span(
    server: ServerProcess, collector: OtelCollector, model: str
) -> None:
    """A model that reads the first response of a traced decoupled BLS request and drops the iterator: the callee's
    span still ends (with its final response, after the caller answered) and is exported under the caller's span."""
    traceparent, trace_id, _ = _traceparent()
    out = _infer(server, "http", model, f"abandon-{secrets.token_hex(4)}", {"traceparent": traceparent})
    np.testing.assert_allclose(out, np.arange(4, dtype=np.float32).reshape(1, 4))

    def done(spans: list[dict[str, Any]]) -> bool:
        names = {s["name"] for s in spans if s["trace_id"] == trace_id}
        return {"InferRequest", model, "repeat_int32"} <= names

    spans = [s for s in collector.wait_for_spans(done) if s["trace_id"] == trace_id]
    (parent,) = [s for s in spans if s["name"] == model]
    (child,) = [s for s in spans if s["name"] == "repeat_int32"]
    assert child["parent_span_id"] == parent["span_id"]
    assert [e for e, _ in child["events"]] == MODEL_EVENTS
    # its last responses came 300 ms apart after the caller had answered: the span ended with the final one
    assert child["end"] > parent["end"]
