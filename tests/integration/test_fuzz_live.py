"""Fuzzing a live server: schemathesis over its OpenAPI document, hypothesis bodies over HTTP and gRPC.

One real server process. A 5xx answer to bad input, a crash (the process exits) or a hang (a request
timing out) fails; a good request is sent after every batch of bad ones and must succeed; the
server's RSS is read before and after. Bounded: a fixed number of examples per run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubeinfer.server.grpc import grpc_service_pb2 as pb
from kubeinfer.server.http.app import openapi_document
from onnx import TensorProto
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.support.drills import mib, report, rss_bytes
from tests.support.fuzzing import grpc_requests, http_bodies
from tests.support.models import binary, string_identity, unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server

MODELS = ["relu", "add", "strings", "missing"]
SCHEMA = schemathesis.openapi.from_dict(openapi_document())
STATS: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("fuzz") / "repo"
    cfg = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    write_model(repo, "relu", cfg, {1: unary("relu", "Relu", TensorProto.FLOAT, ["batch", "n"])})
    write_model(repo, "add", cfg, {1: binary("add", "Add", TensorProto.FLOAT, ["batch", "n"])})
    write_model(repo, "strings", cfg, {1: string_identity()})
    s = start_server(
        repo,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--max-tensor-elements",
        "65536",
        "--allow-client-shm=true",  # the shared-memory routes are fuzzed for real, not only refused
    )
    yield s
    for name, st_ in sorted(STATS.items()):
        rss = mib(st_["rss_after"] - st_["rss_before"]) if "rss_after" in st_ else "n/a"
        report(
            name,
            inputs=st_["inputs"],
            crashes=int(not s.alive()),
            server_errors=st_["5xx"],
            failed_good=st_["failed_good"],
            rss=rss,
        )
    assert s.terminate() == 0


def _good_http(server: ServerProcess, stats: dict[str, Any]) -> None:
    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": [1.0, -1.0, 2.0, -2.0]}]}
    r = httpx.post(f"{server.base_url}/v2/models/relu/infer", json=body, timeout=30)
    if r.status_code != 200 or r.json()["outputs"][0]["data"] != [1.0, 0.0, 2.0, 0.0]:
        stats["failed_good"] += 1
        pytest.fail(f"a good request failed after fuzzing: {r.status_code} {r.text}")


def _stats(name: str, server: ServerProcess) -> dict[str, Any]:
    return STATS.setdefault(name, {"inputs": 0, "5xx": 0, "failed_good": 0, "rss_before": rss_bytes(server.proc.pid)})


def _finish(stats: dict[str, Any], server: ServerProcess) -> None:
    stats["rss_after"] = rss_bytes(server.proc.pid)
    assert server.alive(), server.log()[-3000:]


# --------------------------------------------------------------------------------------- schemathesis


@SCHEMA.parametrize()
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_openapi(case: Any, server: ServerProcess) -> None:
    """Every operation of the OpenAPI document, with generated valid and invalid data: no 5xx, answers conform."""
    stats = _stats("fuzz schemathesis (OpenAPI, HTTP)", server)
    stats["inputs"] += 1
    if case.path_parameters and "model_name" in case.path_parameters and case.method == "POST":
        if case.path.endswith("/load") or case.path.endswith("/unload"):
            case.path_parameters["model_name"] = "missing-" + str(case.path_parameters["model_name"])[:40]
    response = case.call(base_url=server.base_url, timeout=30)
    # 503 is the documented "not ready" of the readiness routes (KServe's choice); 501 is what an operation
    # that documents it answers for a feature this server does not offer (Triton's answer to a trace_file
    # update); any other 5xx fails
    documented_503 = case.path.endswith("/ready") and response.status_code == 503
    documented_501 = response.status_code == 501 and "501" in case.operation.definition.raw.get("responses", {})
    # the repository poll is refused (503, as documented) outside poll mode: this server runs in explicit mode
    refused_poll = case.path == "/v2/repository/poll" and response.status_code == 503
    if response.status_code >= 500 and not (documented_503 or documented_501 or refused_poll):
        stats["5xx"] += 1
        pytest.fail(f"{case.method} {case.formatted_path}: {response.status_code} {response.text}")
    # excluded: the 5xx check (done above, with the readiness routes' 503) and "schema-valid data must be
    # accepted": an inference request can fit the schema and still not fit the model (names, shapes), a 400
    case.validate_response(response, excluded_checks=[schemathesis.checks.not_a_server_error, positive_data_acceptance])
    if stats["inputs"] % 50 == 0:
        _good_http(server, stats)
    _finish(stats, server)


# --------------------------------------------------------------------------------- hypothesis, HTTP


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(model=st.sampled_from(MODELS), body=http_bodies())
def test_http_infer_bodies(server: ServerProcess, model: str, body: tuple[bytes, str | None]) -> None:
    stats = _stats("fuzz HTTP infer bodies (live)", server)
    stats["inputs"] += 1
    headers = {"Inference-Header-Content-Length": body[1]} if body[1] is not None else {}
    try:
        r = httpx.post(f"{server.base_url}/v2/models/{model}/infer", content=body[0], headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        stats["5xx"] += 1
        pytest.fail(f"no answer ({exc!r}) to {body!r}")
    if r.status_code >= 500:
        stats["5xx"] += 1
        pytest.fail(f"{r.status_code} {r.text} for {body!r}")
    if stats["inputs"] % 25 == 0:
        _good_http(server, stats)
    _finish(stats, server)


# --------------------------------------------------------------------------------- hypothesis, gRPC


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as ch:
        yield ch


BAD_STATUS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(model=st.sampled_from(MODELS), msg=grpc_requests(), garbage=st.one_of(st.none(), st.binary(max_size=64)))
def test_grpc_infer_messages(
    server: ServerProcess, channel: grpc.Channel, model: str, msg: pb.ModelInferRequest, garbage: bytes | None
) -> None:
    stats = _stats("fuzz gRPC ModelInfer messages (live)", server)
    stats["inputs"] += 1
    msg.model_name = model
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    payload = garbage if garbage is not None else msg.SerializeToString()
    try:
        call(payload, timeout=30)
    except grpc.RpcError as exc:
        if exc.code() in BAD_STATUS or exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            stats["5xx"] += 1
            pytest.fail(f"{exc.code()} {exc.details()} for {payload!r}")
    if stats["inputs"] % 25 == 0:
        ok = pb.ModelInferRequest(model_name="relu")
        ok.inputs.add(name="IN", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(-3.0)
        answer = pb.ModelInferResponse.FromString(call(ok.SerializeToString(), timeout=30))
        if answer.raw_output_contents[0] != b"\x00\x00\x00\x00":
            stats["failed_good"] += 1
            pytest.fail("a good gRPC request failed after fuzzing")
    _finish(stats, server)


def test_the_openapi_document_describes_every_route() -> None:
    """Drift test: the document's operations are exactly the server's routes (FastAPI's and the infer route)."""
    from kubeinfer.server.http.app import build_app

    app = build_app(None)  # type: ignore[arg-type]  # routes only: nothing is served
    served = {
        (
            method,
            route.path.replace("{name:path}", "{model_name}")
            .replace("{name}", "{model_name}")
            .replace("{version}", "{model_version}"),
        )  # fmt: skip
        for route in app.routes
        for method in getattr(route, "methods", ()) or ()
        if method != "HEAD" and route.path not in ("/docs", "/redoc")
    }
    served |= {
        ("POST", "/v2/models/{model_name}/infer"),
        ("POST", "/v2/models/{model_name}/versions/{model_version}/infer"),
    }
    documented = {
        (m.upper(), path) for path, ops in openapi_document()["paths"].items() for m in ops if m != "parameters"
    }
    assert documented == served
