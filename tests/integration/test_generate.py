"""Triton's generate extension over HTTP with httpx: ``/generate`` and ``/generate_stream`` (server-sent
events), as Triton 2.51 answers them for the same models (tests/support/python_models)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess, http_transports, start_server
from tests.support.waiting import wait_for


@pytest.fixture(scope="module", params=http_transports())
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shared Python-models server on the default HTTP transport; one more for the native transport."""
    if request.param == "asgi":
        yield request.getfixturevalue("python_models_server")
        return
    root = tmp_path_factory.mktemp("generate_native")
    s = start_server(copy_python_models(root / "repo"), "--http-transport", request.param, log_dir=root)
    yield s
    assert s.terminate() == 0


def _post(server: ServerProcess, model: str, body: object, stream: bool = False, version: str = "") -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    path += "/generate_stream" if stream else "/generate"
    return httpx.post(server.base_url + path, json=body, timeout=60)


def _events(response: httpx.Response) -> list[dict[str, object]]:
    assert response.text.endswith("\n\n")
    return [json.loads(chunk.removeprefix("data: ")) for chunk in response.text.split("\n\n") if chunk]


def test_generate_stream_sends_each_response_as_an_event(server: ServerProcess) -> None:
    r = _post(server, "text_generator", {"text_input": "the quick brown fox", "delay_ms": 1}, stream=True)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _events(r) == [
        {"model_name": "text_generator", "model_version": "1", "text_output": word}
        for word in ("the", "quick", "brown", "fox")
    ]


def test_generate_answers_one_flat_json_object(server: ServerProcess) -> None:
    r = _post(server, "text_generator", {"text_input": "single", "id": "req-7"})
    assert (r.status_code, r.headers["content-type"]) == (200, "application/json")
    # Triton's key order (a sorted map) and a one-element output as a bare value
    assert r.text == '{"id":"req-7","model_name":"text_generator","model_version":"1","text_output":"single"}'


def test_generate_shapes_inputs_from_the_model_metadata(server: ServerProcess) -> None:
    r = _post(server, "repeat_int32", {"IN": [4, 5], "DELAY": [1, 1], "WAIT": 0}, stream=True, version="1")
    assert _events(r) == [
        {"IDX": 0, "OUT": 4, "model_name": "repeat_int32", "model_version": "1"},
        {"IDX": 1, "OUT": 5, "model_name": "repeat_int32", "model_version": "1"},
    ]
    bad = _post(server, "repeat_int32", {"IN": [4], "DELAY": [1], "WAIT": [0, 0]}, stream=True)
    assert (bad.status_code, bad.json()) == (
        400,
        {"error": "The schema can not convert input 'WAIT' to tensor with proper shape"},
    )


def test_generate_works_for_non_decoupled_models_and_takes_parameters(server: ServerProcess) -> None:
    r = _post(server, "echo_params", {"IN": [1, 2], "temperature": 0.5, "flag": True, "n": 3, "s": "x"})
    assert r.status_code == 200
    body = r.json()
    assert body["OUT"] == [1, 2]
    assert json.loads(body["PARAMS"]) == {"temperature": 0.5, "flag": True, "n": 3, "s": "x"}


def test_generate_needs_exactly_one_response(server: ServerProcess) -> None:
    message = (
        "generate expects model to produce exactly 1 response, use generate stream for model that generates "
        "various number of responses"
    )
    for n in (0, 2):
        r = _post(server, "square_int32", {"IN": n})
        assert (r.status_code, r.json()) == (200, {"error": message})  # Triton 2.51: the first response's status
    assert _post(server, "square_int32", {"IN": 1}).json() == {
        "OUT": 1,
        "model_name": "square_int32",
        "model_version": "1",
    }
    empty = _post(server, "square_int32", {"IN": 0}, stream=True)
    assert (empty.status_code, empty.text) == (200, "")  # a flag-only final sends nothing


def test_generate_errors(server: ServerProcess) -> None:
    # a model's error: {"error": ...} with 400 whatever its code (as Triton 2.51)
    assert _post(server, "error_code", {"CODE": "NOT_FOUND"}).json() == {"error": "error code: NOT_FOUND"}
    assert _post(server, "error_code", {"CODE": "NOT_FOUND"}).status_code == 400
    stream = _post(server, "decoupled_misuse", {"MODE": "ERROR_RESPONSE"}, stream=True)
    assert stream.status_code == 400
    assert _events(stream) == [
        {"error": "bad token"},
        {"OUT": "after the error", "model_name": "decoupled_misuse", "model_version": "1"},
    ]
    # refused before running: the usual status table and Triton's texts
    unknown = _post(server, "nope", {"IN": 1}, stream=True)
    assert (unknown.status_code, unknown.json()) == (404, {"error": "Request for unknown model: 'nope' is not found"})
    bad_param = _post(server, "error_code", {"CODE": "OK", "arr": [1, 2]})
    assert (bad_param.status_code, bad_param.json()["error"]) == (
        400,
        "parameter 'arr' has invalid type. It should be either 'int', 'bool', or 'string'.",
    )
    missing = _post(server, "error_code", {"other": "x"})
    assert missing.status_code == 400
    assert missing.json()["error"] == (
        "[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'error_code'. Got input(s) [], "
        "but missing required input(s) ['CODE']. Please provide all required input(s)."
    )


def test_closing_a_generate_stream_cancels_the_request(server: ServerProcess) -> None:
    words = " ".join(["w"] * 200)
    with httpx.Client(timeout=60) as client:
        with client.stream(
            "POST",
            f"{server.base_url}/v2/models/text_generator/generate_stream",
            json={"text_input": words, "delay_ms": 30, "id": "closed-early"},
        ) as r:
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data:")
                if events == 2:
                    break
    wait_for(
        "the model to see the cancellation",
        lambda: "text_generator: request closed-early cancelled after" in server.log(),
        describe=lambda: server.log()[-2000:],
    )
