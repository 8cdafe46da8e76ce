"""Triton's OpenTelemetry trace mode against a real OpenTelemetry Collector (the ``otelcol`` add-on, writing what it
received to a file): spans with Triton's names and attributes, the caller's W3C context over HTTP and gRPC, an
ensemble's steps as child spans, streamed requests (gRPC streams, a decoupled model, HTTP generate, the OpenAI front
end), and requests that succeed whatever happens to the export. BLS requests: test_opentelemetry_bls.py."""

from __future__ import annotations

import queue
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.observability.trace import parse_trace_config
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.otel_collector import OtelCollector
from tests.support.repos import copy_python_models, write_model
from tests.support.server import ServerProcess, free_port, start_server

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""
ENSEMBLE = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add" model_version: -1
    input_map { key: "A" value: "A" } input_map { key: "B" value: "B" } output_map { key: "OUT" value: "MID" } },
  { model_name: "add2" model_version: -1
    input_map { key: "A" value: "MID" } input_map { key: "B" value: "B" } output_map { key: "OUT" value: "OUT" } }
] }
"""
MODEL_EVENTS = ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
COMPUTE_EVENTS = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
SERVER_KIND = 2  # OTLP's SPAN_KIND_SERVER


def _repo(root: Path, decoupled: bool = False) -> Path:
    repo = root / "repo"
    model = test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])
    for name in ("add", "add2"):
        write_model(repo, name, CONFIG.format(name=name), {1: model})
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text(ENSEMBLE)
    if decoupled:
        copy_python_models(repo, "repeat_int32")
    return repo


def _otel_server(repo: Path, url: str, *extra: str) -> ServerProcess:
    return start_server(
        repo,
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url={url}",
        "--trace-config=opentelemetry,resource=service.name=kubeinfer-test",
        "--trace-config=opentelemetry,resource=deployment.environment=ci",
        "--trace-config=opentelemetry,bsp_schedule_delay=100",
        "--trace-config=rate=1",
        "--trace-config=level=TIMESTAMPS",
        *extra,
    )


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtelCollector]:
    with OtelCollector(tmp_path_factory.mktemp("otelcol")) as c:
        yield c


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, collector: OtelCollector) -> Iterator[ServerProcess]:
    server = _otel_server(_repo(tmp_path_factory.mktemp("otel"), decoupled=True), collector.traces_url)
    yield server
    server.terminate()


def _inputs(module: Any, value: float = 1.0) -> list[Any]:
    a = np.full((1, 4), value, dtype=np.float32)
    inputs = [module.InferInput("A", [1, 4], "FP32"), module.InferInput("B", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _of_trace(trace_id: str, count: int):  # type: ignore[no-untyped-def]
    return lambda spans: len([s for s in spans if s["trace_id"] == trace_id]) >= count


def _check_single_model_trace(spans: list[dict[str, Any]], trace_id: str, caller_span: str, model: str) -> None:
    mine = {s["name"]: s for s in spans if s["trace_id"] == trace_id}
    assert set(mine) == {"InferRequest", model, "compute"}, mine.keys()
    root, request, compute = mine["InferRequest"], mine[model], mine["compute"]
    # the caller's span is the parent of Triton's top-level span; the model span under it; compute under that
    assert root["parent_span_id"] == caller_span
    assert request["parent_span_id"] == root["span_id"]
    assert compute["parent_span_id"] == request["span_id"]
    assert {s["kind"] for s in mine.values()} == {SERVER_KIND}
    assert {s["scope"] for s in mine.values()} == {"triton-server"}
    attrs = request["attributes"]
    assert attrs["triton.model_name"] == model and attrs["triton.model_version"] == 1
    assert attrs["triton.trace_parent_id"] == 0 and attrs["triton.trace_id"] > 0
    assert [e for e, _ in request["events"]] == MODEL_EVENTS
    assert [e for e, _ in compute["events"]] == COMPUTE_EVENTS
    stamps = [ns for _, ns in request["events"]]
    assert stamps == sorted(stamps) and stamps[0] == request["start"] and stamps[-1] == request["end"]
    compute_stamps = [ns for _, ns in compute["events"]]
    assert compute_stamps == sorted(compute_stamps)
    assert request["start"] <= compute["start"] <= compute["end"] <= request["end"]
    assert root["start"] <= request["start"] and request["end"] <= root["end"]
    # wall-clock times: within a minute of now
    assert abs(root["start"] - time.time_ns()) < 60e9
    assert root["resource"]["service.name"] == "kubeinfer-test"
    assert root["resource"]["deployment.environment"] == "ci"


def test_http_request_with_traceparent_is_a_child_of_the_callers_span(
    server: ServerProcess, collector: OtelCollector
) -> None:
    traceparent, trace_id, span_id = _traceparent()
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("add", _inputs(httpclient), headers={"traceparent": traceparent})
    np.testing.assert_allclose(result.as_numpy("OUT"), np.full((1, 4), 2.0))
    spans = collector.wait_for_spans(_of_trace(trace_id, 3))
    _check_single_model_trace(spans, trace_id, span_id, "add")


def test_http_asgi_route_reads_traceparent_too(server: ServerProcess, collector: OtelCollector) -> None:
    """A JSON request without Content-Length (chunked) takes the ASGI route, not the direct path."""
    traceparent, trace_id, span_id = _traceparent()
    body = b'{"inputs":[{"name":"A","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]},' + (
        b'{"name":"B","shape":[1,4],"datatype":"FP32","data":[1,1,1,1]}]}'
    )
    response = httpx.post(
        f"{server.base_url}/v2/models/add2/infer",
        content=iter([body]),
        headers={"traceparent": traceparent, "tracestate": "vendor=1"},
    )
    assert response.status_code == 200, response.text
    spans = collector.wait_for_spans(_of_trace(trace_id, 3))
    _check_single_model_trace(spans, trace_id, span_id, "add2")


def test_grpc_request_with_traceparent_metadata(server: ServerProcess, collector: OtelCollector) -> None:
    traceparent, trace_id, span_id = _traceparent()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("add", _inputs(grpcclient, 2.0), headers={"traceparent": traceparent})
    np.testing.assert_allclose(result.as_numpy("OUT"), np.full((1, 4), 4.0))
    spans = collector.wait_for_spans(_of_trace(trace_id, 3))
    _check_single_model_trace(spans, trace_id, span_id, "add")


def test_grpc_traceparent_on_the_grpcio_transport(tmp_path: Path, collector: OtelCollector) -> None:
    """The same over grpc.aio (the default transport is the Rust one where it is built)."""
    server = _otel_server(_repo(tmp_path), collector.traces_url, "--grpc-transport=grpcio")
    try:
        traceparent, trace_id, span_id = _traceparent()
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "add", _inputs(grpcclient), headers={"traceparent": traceparent}
        )
        _check_single_model_trace(collector.wait_for_spans(_of_trace(trace_id, 3)), trace_id, span_id, "add")
    finally:
        server.terminate()


def test_request_without_context_starts_a_trace_of_its_own(server: ServerProcess, collector: OtelCollector) -> None:
    before = {s["trace_id"] for s in collector.spans()}
    client = httpclient.InferenceServerClient(server.http_url)
    client.infer("add2", _inputs(httpclient), request_id="no-context")
    spans = collector.wait_for_spans(
        lambda spans: any(s["attributes"].get("triton.request_id") == "no-context" for s in spans)
    )
    request = next(s for s in spans if s["attributes"].get("triton.request_id") == "no-context")
    assert request["trace_id"] not in before
    root = next(s for s in spans if s["span_id"] == request["parent_span_id"])
    assert root["name"] == "InferRequest" and root["parent_span_id"] == ""


def test_ensemble_steps_are_child_spans_of_the_ensembles_span(server: ServerProcess, collector: OtelCollector) -> None:
    traceparent, trace_id, span_id = _traceparent()
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("chain", _inputs(httpclient), headers={"traceparent": traceparent})
    np.testing.assert_allclose(result.as_numpy("OUT"), np.full((1, 4), 3.0))
    # InferRequest, chain, add + compute, add2 + compute
    spans = [s for s in collector.wait_for_spans(_of_trace(trace_id, 6)) if s["trace_id"] == trace_id]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    assert sorted(by_name) == ["InferRequest", "add", "add2", "chain", "compute"]
    root, chain = by_name["InferRequest"][0], by_name["chain"][0]
    assert root["parent_span_id"] == span_id and chain["parent_span_id"] == root["span_id"]
    chain_id = chain["attributes"]["triton.trace_id"]
    assert chain["attributes"]["triton.trace_parent_id"] == 0
    step_ids = set()
    for step in ("add", "add2"):
        (member,) = by_name[step]
        assert member["parent_span_id"] == chain["span_id"]
        assert member["attributes"]["triton.trace_parent_id"] == chain_id
        step_ids.add(member["attributes"]["triton.trace_id"])
        assert chain["start"] <= member["start"] <= member["end"] <= chain["end"]
    assert len(step_ids) == 2 and chain_id not in step_ids
    # each step has its compute span; the ensemble itself computes nothing
    assert sorted(c["parent_span_id"] for c in by_name["compute"]) == sorted(
        by_name[s][0]["span_id"] for s in ("add", "add2")
    )


def _stream(server: ServerProcess, traceparent: str, requests: list[tuple[str, list[Any]]]) -> list[Any]:
    """Each request on one gRPC stream opened with ``traceparent``; every result (the stream ends after all)."""
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(
        callback=lambda result, error: results.put((result, error)), headers={"traceparent": traceparent}
    )
    for model, inputs in requests:
        client.async_stream_infer(model, inputs)
    client.stop_stream()  # waits for the stream's responses
    client.close()
    answers = []
    while not results.empty():
        answers.append(results.get())
    assert all(error is None for _, error in answers), answers
    return [result for result, _ in answers]


def test_grpc_stream_requests_are_traced_each_under_the_streams_traceparent(
    server: ServerProcess, collector: OtelCollector
) -> None:
    traceparent, trace_id, span_id = _traceparent()
    results = _stream(server, traceparent, [("add", _inputs(grpcclient, 1.0)), ("add2", _inputs(grpcclient, 2.0))])
    assert sorted(float(r.as_numpy("OUT")[0, 0]) for r in results) == [2.0, 4.0]
    spans = collector.wait_for_spans(_of_trace(trace_id, 6))
    # one trace per request: a root under the stream's caller span each, with its model and compute spans
    roots = [s for s in spans if s["trace_id"] == trace_id and s["name"] == "InferRequest"]
    assert len(roots) == 2
    for model in ("add", "add2"):
        (request,) = [s for s in spans if s["trace_id"] == trace_id and s["name"] == model]
        (root,) = [r for r in roots if r["span_id"] == request["parent_span_id"]]
        compute = [s for s in spans if s["parent_span_id"] == request["span_id"]]
        _check_single_model_trace([root, request, *compute], trace_id, span_id, model)
    mine = [s for s in spans if s["trace_id"] == trace_id and s["name"] in ("add", "add2")]
    assert len({s["attributes"]["triton.trace_id"] for s in mine}) == 2


def test_decoupled_models_spans_end_after_its_final_response(server: ServerProcess, collector: OtelCollector) -> None:
    traceparent, trace_id, span_id = _traceparent()
    inputs = []
    for name, values, dtype in (("IN", [1, 2], np.int32), ("DELAY", [0, 400], np.uint32), ("WAIT", [0], np.uint32)):
        tensor = grpcclient.InferInput(name, [len(values)], "INT32" if dtype is np.int32 else "UINT32")
        tensor.set_data_from_numpy(np.array(values, dtype))
        inputs.append(tensor)
    sent = time.time_ns()
    results = _stream(server, traceparent, [("repeat_int32", inputs)])
    assert len(results) == 2
    spans = [s for s in collector.wait_for_spans(_of_trace(trace_id, 2)) if s["trace_id"] == trace_id]
    by_name = {s["name"]: s for s in spans}
    root, request = by_name["InferRequest"], by_name["repeat_int32"]
    assert root["parent_span_id"] == span_id and request["parent_span_id"] == root["span_id"]
    attrs = request["attributes"]
    assert attrs["triton.model_name"] == "repeat_int32" and attrs["triton.model_version"] == 1
    assert attrs["triton.trace_parent_id"] == 0
    assert [e for e, _ in request["events"]][0] == "REQUEST_START"
    assert [e for e, _ in request["events"]][-1] == "REQUEST_END"
    # the second response came 400 ms after the first: the spans end after it, not with the first
    assert request["end"] - request["start"] >= 400e6
    assert root["start"] <= request["start"] and request["end"] <= root["end"]
    assert sent - 1e9 <= root["start"] and root["end"] <= time.time_ns()


def test_grpc_stream_to_an_ensemble_puts_its_steps_under_its_span(
    server: ServerProcess, collector: OtelCollector
) -> None:
    traceparent, trace_id, span_id = _traceparent()
    (result,) = _stream(server, traceparent, [("chain", _inputs(grpcclient, 1.0))])
    np.testing.assert_allclose(result.as_numpy("OUT"), np.full((1, 4), 3.0))
    spans = [s for s in collector.wait_for_spans(_of_trace(trace_id, 6)) if s["trace_id"] == trace_id]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    assert sorted(by_name) == ["InferRequest", "add", "add2", "chain", "compute"]
    (root,), (chain,) = by_name["InferRequest"], by_name["chain"]
    assert root["parent_span_id"] == span_id and chain["parent_span_id"] == root["span_id"]
    for step in ("add", "add2"):
        (member,) = by_name[step]
        assert member["parent_span_id"] == chain["span_id"]
        assert member["attributes"]["triton.trace_parent_id"] == chain["attributes"]["triton.trace_id"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_http_generate_is_traced_under_its_traceparent(
    server: ServerProcess, collector: OtelCollector, route: str
) -> None:
    traceparent, trace_id, span_id = _traceparent()
    response = httpx.post(
        f"{server.base_url}/v2/models/add/{route}",
        json={"A": [1, 2, 3, 4], "B": [1, 1, 1, 1]},
        headers={"traceparent": traceparent},
    )
    assert response.status_code == 200, response.text
    assert "[2,3,4,5]" in response.text.replace(" ", "").replace(".0", "")
    spans = collector.wait_for_spans(_of_trace(trace_id, 3))
    _check_single_model_trace(spans, trace_id, span_id, "add")


def test_trace_settings_show_the_mode_and_refuse_changing_it(server: ServerProcess) -> None:
    settings = httpx.get(f"{server.base_url}/v2/trace/setting").json()
    assert settings["trace_mode"] == "opentelemetry" and settings["trace_level"] == ["TIMESTAMPS"]
    refused = httpx.post(f"{server.base_url}/v2/trace/setting", json={"trace_mode": "triton"})
    assert refused.status_code == 400


@pytest.mark.parametrize("url", ["unreachable", "bad"])
def test_requests_succeed_when_the_export_fails(tmp_path: Path, url: str) -> None:
    """A collector that is down (a port nobody listens on) or a URL that is no URL: inference goes on, and the
    server stops promptly."""
    target = "127.0.0.1:9/v1/traces" if url == "unreachable" else "http://[not a host/v1/traces"
    server = _otel_server(_repo(tmp_path), target)
    try:
        http, grpc = (
            httpclient.InferenceServerClient(server.http_url),
            grpcclient.InferenceServerClient(server.grpc_url),
        )
        for i in range(5):
            traceparent = _traceparent()[0]
            out = http.infer("add", _inputs(httpclient, i), headers={"traceparent": traceparent}).as_numpy("OUT")
            np.testing.assert_allclose(out, np.full((1, 4), 2.0 * i))
            out = grpc.infer("chain", _inputs(grpcclient, i), headers={"traceparent": traceparent}).as_numpy("OUT")
            np.testing.assert_allclose(out, np.full((1, 4), 3.0 * i))
        time.sleep(0.5)  # a batch went to the exporter
        assert server.alive()
    finally:
        started = time.monotonic()
        code = server.terminate()
        stopped_in = time.monotonic() - started
    assert code == 0, server.log()
    assert stopped_in < 15, f"the server took {stopped_in:.1f}s to stop"


def test_trace_config_opentelemetry_settings_as_triton_documents_them() -> None:
    assert parse_trace_config(
        [
            "mode=opentelemetry",
            "opentelemetry,url=localhost:4318/v1/traces",
            "opentelemetry,resource=service.name=triton",
            "opentelemetry,resource=service.version=1",
            "opentelemetry,bsp_max_queue_size=100",
            "opentelemetry,bsp_schedule_delay=50",
            "opentelemetry,bsp_max_export_batch_size=10",
            "level=TIMESTAMPS",
        ]
    ) == {
        "trace_mode": "opentelemetry",
        "trace_level": ["TIMESTAMPS"],
        "opentelemetry": {
            "url": "localhost:4318/v1/traces",
            "resource": {"service.name": "triton", "service.version": "1"},
            "bsp_max_queue_size": 100,
            "bsp_schedule_delay": 50,
            "bsp_max_export_batch_size": 10,
        },
    }
    for bad, message in (
        ("opentelemetry,colour=red", "unknown opentelemetry setting 'colour'"),
        ("opentelemetry,resource=novalue", "expected <key>=<value>"),
        ("opentelemetry,bsp_max_queue_size=many", "must be an integer"),
        ("opentelemetry,bsp_max_export_batch_size=0", "must be positive"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_trace_config([bad])


@pytest.fixture(scope="module")
def openai_server(example_repository: Path, collector: OtelCollector) -> Iterator[tuple[ServerProcess, int]]:
    port = free_port()
    server = _otel_server(example_repository, collector.traces_url, f"--openai-port={port}")
    yield server, port
    server.terminate()


@pytest.mark.parametrize("call", ["chat_streamed", "completion", "completion_streamed", "embedding"])
def test_openai_requests_are_traced_under_their_traceparent(
    openai_server: tuple[ServerProcess, int], collector: OtelCollector, call: str
) -> None:
    """The OpenAI front end's requests, with the official client: completions as streamed requests (spans that end
    after the last response), embeddings as unary ones, each under the caller's ``traceparent``."""
    traceparent, trace_id, span_id = _traceparent()
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{openai_server[1]}/v1",
        api_key="x",
        max_retries=0,
        default_headers={"traceparent": traceparent},
    )
    model = "tiny_lm"
    if call == "chat_streamed":
        chunks = list(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "alpha beta gamma"}], stream=True
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "gamma beta alpha"
    elif call == "completion":
        assert client.completions.create(model=model, prompt="one two three").choices[0].text == "three two one"
    elif call == "completion_streamed":
        chunks = list(client.completions.create(model=model, prompt="a b c d", stream=True))
        assert "".join(c.choices[0].text for c in chunks) == "d c b a"
    else:
        model = "tiny_embedding"
        assert len(client.embeddings.create(model=model, input="hello world").data[0].embedding) == 16
    spans = [s for s in collector.wait_for_spans(_of_trace(trace_id, 3)) if s["trace_id"] == trace_id]
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"InferRequest", model, "compute"}, by_name.keys()
    root, request, compute = by_name["InferRequest"], by_name[model], by_name["compute"]
    assert root["parent_span_id"] == span_id
    assert request["parent_span_id"] == root["span_id"] and compute["parent_span_id"] == request["span_id"]
    attrs = request["attributes"]
    assert attrs["triton.model_name"] == model and attrs["triton.model_version"] == 1
    assert [e for e, _ in request["events"]] == MODEL_EVENTS
    assert root["start"] <= request["start"] <= compute["start"] <= compute["end"] <= request["end"] <= root["end"]


def test_openai_request_without_traceparent_is_sampled_by_rate(
    openai_server: tuple[ServerProcess, int], collector: OtelCollector
) -> None:
    """Without a caller's context the request starts a trace of its own (rate=1 here), its root without parent."""
    before = {s["trace_id"] for s in collector.spans()}
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{openai_server[1]}/v1", api_key="x", max_retries=0)
    assert client.completions.create(model="tiny_lm", prompt="no context here").choices[0].text == "here context no"
    spans = collector.wait_for_spans(
        lambda spans: any(s["name"] == "tiny_lm" and s["trace_id"] not in before for s in spans)
    )
    request = next(s for s in spans if s["name"] == "tiny_lm" and s["trace_id"] not in before)
    root = next(s for s in spans if s["span_id"] == request["parent_span_id"])
    assert root["name"] == "InferRequest" and root["parent_span_id"] == ""
