"""``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``: a Python model managing other models
(Triton's BLS model control), with the results and error texts Triton 2.51 gave for the same calls from
the same model (tests/support/python_models/model_control, run there in explicit, none and poll mode).

Where kubeinfer deliberately differs: ``files`` are refused (this server loads only what its repository
holds, as its repository API refuses ``file:`` parameters; 2.51 writes them into a temporary model folder,
and crashed here on a ``files`` load without ``config``), and a failed load says why (2.51 says only
``failed to poll from model repository``; the reason is in its log).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

#: Triton's prefix for a failed load/unload: the calling instance (group model_control_0, instance 0)
FAILED = "Failed to {} model: Failed to process the request for model 'model_control_0_0', message: "
NOT_EXPLICIT = "explicit model load / unload is not allowed if polling is enabled"


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("model_control")
    repo = copy_python_models(root / "repo", "model_control", "scaled")
    server = start_server(repo, "--model-control-mode=explicit", "--load-model=model_control", log_dir=root)
    yield server
    server.terminate()


def control(server: ServerProcess, **command: Any) -> dict[str, Any]:
    """Send ``command`` to the model_control model; its JSON answer."""
    body = {"inputs": [{"name": "COMMAND", "datatype": "BYTES", "shape": [1], "data": [json.dumps(command)]}]}
    r = httpx.post(f"{server.base_url}/v2/models/model_control/infer", json=body, timeout=120)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = json.loads(r.json()["outputs"][0]["data"][0])
    return result


def scaled(server: ServerProcess, x: float) -> float:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([x], np.float32))
        return float(client.infer("scaled", [inp]).as_numpy("Y")[0])
    finally:
        client.close()


def states(server: ServerProcess) -> dict[str, str]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {row["name"]: row.get("state", "") for row in rows}  # Triton lists models never loaded without one


def test_a_model_loads_reloads_with_a_config_and_unloads_another(explicit: ServerProcess) -> None:
    assert control(explicit, op="ready", name="scaled") == {"ok": False}
    assert control(explicit, op="load", name="scaled") == {"ok": None}  # returns once it is loaded
    assert control(explicit, op="ready", name="scaled") == {"ok": True}
    assert control(explicit, op="ready", name="scaled", version="1") == {"ok": True}
    assert control(explicit, op="ready", name="scaled", version="7") == {"ok": False}
    assert scaled(explicit, 2.0) == 2.0

    # config replaces config.pbtxt for this load, as the repository API's "config" parameter
    config = {
        "backend": "python",
        "parameters": {"scale": {"string_value": "3"}},
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    assert control(explicit, op="load", name="scaled", config=json.dumps(config)) == {"ok": None}
    assert scaled(explicit, 2.0) == 6.0

    # unload returns before the model has unloaded, and it is not ready from then on (2.51: UNLOADING)
    assert control(explicit, op="unload", name="scaled") == {"ok": None}
    assert control(explicit, op="ready", name="scaled") == {"ok": False}
    wait_for("scaled to unload", lambda: states(explicit).get("scaled") == "UNAVAILABLE")
    # unloading what is not loaded, or not there at all, is no error (as 2.51)
    assert control(explicit, op="unload", name="scaled") == {"ok": None}
    assert control(explicit, op="unload", name="never_there") == {"ok": None}
    # loading the model that runs the call changes nothing: it keeps serving
    assert control(explicit, op="load", name="model_control") == {"ok": None}


def test_loads_that_fail_raise_tritons_exception(explicit: ServerProcess) -> None:
    failed = FAILED.format("load")
    answer = control(explicit, op="load", name="nope")
    assert answer["error"] == "TritonModelException"
    assert answer["message"].startswith(failed + "failed to load 'nope'"), answer  # 2.51: "..., failed to poll ..."
    answer = control(explicit, op="load", name="scaled", config="{not json")
    assert answer["message"].startswith(failed + "invalid config override"), answer
    # checked before anything is sent: Triton's stub text
    assert control(explicit, op="load", name="scaled", files="abc") == {
        "error": "TritonModelException",
        "message": "failed to load model 'scaled', files should be a dictionary of file paths and file contents",
    }
    answer = control(explicit, op="load", name="scaled", config='{"backend": "python"}', files={"1/model.py": "x"})
    assert answer["message"].startswith(failed + "load parameters file:1/model.py: model files in a load request"), (
        answer
    )
    assert states(explicit).get("scaled") != "READY"


def test_a_model_can_unload_itself(explicit: ServerProcess) -> None:
    """Unload does not wait for the model to drain: a model unloading itself finishes the request that
    asked for it, then goes (2.51: UNLOADING, then UNAVAILABLE "unloaded")."""
    assert control(explicit, op="unload", name="model_control") == {"ok": None}
    wait_for("model_control to unload", lambda: states(explicit)["model_control"] == "UNAVAILABLE")
    r = httpx.post(f"{explicit.base_url}/v2/repository/models/model_control/load", json={}, timeout=60)
    assert r.status_code == 200, r.text
    assert control(explicit, op="ready", name="model_control") == {"ok": True}


@pytest.mark.parametrize("op", ["load", "unload"])
def test_outside_explicit_mode_model_control_is_refused_in_tritons_words(
    python_models_server: ServerProcess, op: str
) -> None:
    """The session's server runs in model control mode "none" (2.51 answered the same in "poll")."""
    assert control(python_models_server, op=op, name="scaled") == {
        "error": "TritonModelException",
        "message": FAILED.format(op) + NOT_EXPLICIT,
    }
    assert control(python_models_server, op="ready", name="scaled") == {"ok": True}
    # the repository API answers the same refusal: 503 (gRPC UNAVAILABLE), as 2.51
    r = httpx.post(f"{python_models_server.base_url}/v2/repository/models/scaled/{op}", json={}, timeout=10)
    assert (r.status_code, r.json()) == (503, {"error": NOT_EXPLICIT})
