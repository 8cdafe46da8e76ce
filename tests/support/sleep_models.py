"""Models served by the test-only ``sleep`` backend (tests/plugins/kubeinfer-test-backends).

The backend is found through the ``kubeinfer.backends`` entry-point group, so the plugin must be
installed: ``pip install -e tests/plugins/kubeinfer-test-backends``.
"""

from __future__ import annotations

import tempfile
import textwrap
import time
from importlib.metadata import entry_points
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from tests.support.waiting import wait_for

INSTALL_HINT = "pip install -e tests/plugins/kubeinfer-test-backends"


def require_sleep_backend() -> None:
    names = {ep.name for ep in entry_points(group="kubeinfer.backends")}
    if "sleep" not in names:
        raise RuntimeError(f"the test backend 'sleep' is not installed; run: {INSTALL_HINT}")


def write_sleep_model(repo: Path, name: str, sleep_ms: float, body: str = "", max_batch_size: int = 8) -> Path:
    """``<repo>/<name>/config.pbtxt`` plus an empty version folder 1 (the backend has no model file)."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config = (
        f'name: "{name}"\nbackend: "sleep"\nmax_batch_size: {max_batch_size}\n'
        f'parameters {{ key: "sleep_ms" value {{ string_value: "{sleep_ms}" }} }}\n' + textwrap.dedent(body)
    )
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def infer_body(values: list[float] | None = None, rows: int = 1, **parameters: Any) -> dict[str, Any]:
    data = values if values is not None else [float(i) for i in range(rows * 2)]
    width = len(data) // rows
    body: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, width], "data": data}]}
    if parameters:
        body["parameters"] = parameters
    return body


def post_infer(
    base_url: str, model: str, body: dict[str, Any], timeout: float = 60
) -> tuple[int, dict[str, Any], float]:
    """(status, JSON answer, seconds) of one inference over HTTP, on a fresh connection."""
    start = time.monotonic()
    r = httpx.post(f"{base_url}/v2/models/{model}/infer", json=body, timeout=timeout)
    return r.status_code, r.json(), time.monotonic() - start


def output(answer: dict[str, Any], name: str) -> np.ndarray:
    for out in answer["outputs"]:
        if out["name"] == name:
            return np.array(out["data"]).reshape(out["shape"])
    raise KeyError(name)


def stats(base_url: str, model: str) -> dict[str, Any]:
    r = httpx.get(f"{base_url}/v2/models/{model}/stats", timeout=10)
    r.raise_for_status()
    (entry,) = r.json()["model_stats"]
    return entry


def pending(metrics_url: str, model: str) -> float:
    """``nv_inference_pending_request_count`` of ``model`` (0 when absent)."""
    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_pending(metrics_url: str, model: str, n: int) -> None:
    """Until exactly ``n`` requests of ``model`` wait in its scheduler's queue (the pending-request gauge)."""
    wait_for(
        f"{n} pending request(s) of {model}",
        lambda: pending(metrics_url, model) == n,
        describe=lambda: pending(metrics_url, model),
    )


def executions(answer: dict[str, Any]) -> int:
    """The model-wide number of the execution that computed ``answer`` (1 = the first to start)."""
    return int(output(answer, "EXECUTION").flat[0])


class Gate:
    """A gate the ``sleep`` backend holds executions at: send a request with ``**gate.params`` and it
    executes only once the test calls ``open()``; ``entered()`` counts executions held (or passed).

    Use it as a context manager: leaving the block opens the gate, so a failing test never leaves the
    server's instances held (the backend gives up on a gate after 120 s).
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="gate-", dir=directory))

    @property
    def params(self) -> dict[str, str]:
        return {"gate": str(self.path)}

    def entered(self) -> int:
        return sum(1 for _ in self.path.glob("entered-*"))

    def wait_entered(self, n: int = 1) -> None:
        """Until ``n`` executions reached the gate (they are executing now, held)."""
        wait_for(f"{n} execution(s) at the gate", lambda: self.entered() >= n, describe=self.entered)

    def open(self) -> None:
        (self.path / "open").touch()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.open()
