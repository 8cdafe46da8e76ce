"""``--model-config-name=<name>`` against a real server (Triton docs, "Custom Model Configuration").

Each model's ``configs/<name>.pbtxt`` is its config where it exists, ``config.pbtxt`` elsewhere; the config
API and inference follow the file chosen; in poll mode an edit of the custom config reloads the model, and
removing it falls back to config.pbtxt; a malformed custom config fails that model in Triton's words.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from tests.support.models import unary
from tests.support.repos import write_model
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: {n}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "from" value {{ string_value: "{source}" }} }}
"""


def custom(folder: Path, name: str, text: str) -> None:
    """Write ``configs/<name>.pbtxt`` whole (renamed into place, as a writer of a polled repository must)."""
    (folder / "configs").mkdir(exist_ok=True)
    staged = folder / "configs" / f".{name}.tmp"
    staged.write_text(text)
    os.rename(staged, folder / "configs" / f"{name}.pbtxt")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("custom_config")
    relu = unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4])
    a = write_model(root / "repo", "a", CONFIG.format(n=1, source="config.pbtxt"), {1: relu})
    custom(a, "h100", CONFIG.format(n=4, source="h100"))
    custom(a, "v100", CONFIG.format(n=8, source="v100"))
    b = write_model(root / "repo", "b", CONFIG.format(n=2, source="config.pbtxt"), {1: relu})
    custom(b, "v100", CONFIG.format(n=8, source="v100"))  # not the name asked for: config.pbtxt
    broken = write_model(root / "repo", "broken", CONFIG.format(n=2, source="config.pbtxt"), {1: relu})
    custom(broken, "h100", "max_batch_size: [")
    return root / "repo"


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    server = start_server(
        repo, "--model-control-mode=poll", "--repository-poll-secs=0.5", "--model-config-name=h100",
        log_dir=repo.parent,
    )  # fmt: skip
    yield server
    server.terminate()


def config(server: ServerProcess, model: str) -> dict:
    response = httpx.get(f"{server.base_url}/v2/models/{model}/config", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def source(server: ServerProcess, model: str) -> tuple[int, str]:
    c = config(server, model)
    return c["max_batch_size"], c["parameters"]["from"]["string_value"]


def infer(server: ServerProcess, model: str, rows: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 5
        inp = httpclient.InferInput("IN", [rows, 4], "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer(model, [inp]).as_numpy("OUT")
        assert out is not None
        np.testing.assert_array_equal(out, np.maximum(x, 0))
        return out
    finally:
        client.close()


def index(server: ServerProcess) -> dict[str, dict]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {r["name"]: r for r in rows}


def test_each_model_serves_its_custom_config_where_it_has_one(server: ServerProcess) -> None:
    assert source(server, "a") == (4, "h100")
    assert source(server, "b") == (2, "config.pbtxt")
    infer(server, "a", 3)  # 3 rows: only h100.pbtxt's max_batch_size 4 allows them
    with pytest.raises(InferenceServerException, match="batch-size must be <= 2"):
        infer(server, "b", 3)


def test_a_malformed_custom_config_fails_its_model_in_tritons_words(server: ServerProcess, repo: Path) -> None:
    row = index(server)["broken"]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"].startswith(f"failed to read text proto from {repo / 'broken' / 'configs' / 'h100.pbtxt'}")


def test_a_poll_reloads_a_changed_custom_config_and_falls_back_when_it_goes(server: ServerProcess, repo: Path) -> None:
    custom(repo / "a", "h100", CONFIG.format(n=6, source="h100 edited"))
    wait_for("a reloaded with the edited h100.pbtxt", lambda: source(server, "a") == (6, "h100 edited"), 60)
    os.unlink(repo / "a" / "configs" / "h100.pbtxt")
    wait_for("a back on config.pbtxt", lambda: source(server, "a") == (1, "config.pbtxt"), 60)
    infer(server, "a", 1)
    custom(repo / "broken", "h100", CONFIG.format(n=3, source="h100 fixed"))
    wait_for("broken loads once fixed", lambda: index(server)["broken"].get("state") == "READY", 60)
    assert source(server, "broken") == (3, "h100 fixed")
    assert server.alive()


def test_an_empty_name_stops_the_server_with_tritons_text(repo: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.server",
            "tritonserver",
            f"--model-repository={repo}",
            "--model-config-name=",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "error: empty argument for --model-config-name" in done.stderr
