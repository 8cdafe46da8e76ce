"""kubeinfer's repository poll request, and models removed from a polled repository (real server processes).

A writer of the repository (the operator) that just changed some model folders asks a poll-mode server
to look at them now (``POST /v2/repository/poll``) instead of waiting for its next poll; the answer is
their index rows once loaded or unloaded. A folder removed from the repository is an unload (INFO), never
a failed load (ERROR), however its removal falls between a poll's listing and its reads.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from onnx import TensorProto

from tests.support.models import unary
from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


def put_model(repo: Path, name: str, model: bytes) -> None:
    """As the operator publishes: built under a dot-name, renamed into place."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repo))
    (staging / "config.pbtxt").write_text(CONFIG.format(name=name))
    (staging / "1").mkdir()
    (staging / "1" / "model.onnx").write_bytes(model)
    os.rename(staging, repo / name)


def remove_model(repo: Path, name: str) -> None:
    """As the operator removes: renamed to a dot-name (gone for the server at once), then deleted."""
    doomed = repo / f".{name}.removing-{os.getpid()}"
    os.rename(repo / name, doomed)
    shutil.rmtree(doomed)


@pytest.fixture(scope="module")
def relu() -> bytes:
    return unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]).SerializeToString()


def poll(server: ServerProcess, body: dict | None = None, **kw: object) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v2/repository/poll", json=body or {}, timeout=60, **kw)  # type: ignore[arg-type]


def errors(server: ServerProcess) -> list[str]:
    return [line for line in server.log().splitlines() if " ERROR " in line]


def test_a_poll_request_loads_and_unloads_the_named_models_at_once(tmp_path: Path, relu: bytes) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    token = tmp_path / "token"
    token.write_text("s3cret")
    # the server's own poll would come only after an hour: whatever happens below, the request did it
    server = start_server(
        repo, "--model-control-mode", "poll", "--repository-poll-secs", "3600", "--auth-token-file", str(token),
        log_dir=tmp_path,
    )  # fmt: skip
    auth = {"Authorization": "Bearer s3cret"}
    try:
        for name in ("a", "b"):
            put_model(repo, name, relu)
        assert poll(server, {"models": ["a"]}).status_code == 401  # as protected as the index
        rows = poll(server, {"models": ["a"]}, headers=auth).json()
        assert [(r["name"], r["version"], r["state"]) for r in rows] == [("a", "1", "READY")]
        assert rows[0]["config_digest"]
        index = httpx.post(f"{server.base_url}/v2/repository/index", json={}, headers=auth, timeout=10).json()
        assert {r["name"]: r.get("state", "") for r in index} == {"a": "READY", "b": ""}  # b: not asked about

        remove_model(repo, "a")
        rows = poll(server, {"models": ["a", "b"]}, headers=auth).json()
        assert [(r["name"], r["version"], r["state"], r["reason"]) for r in rows] == [("b", "1", "READY", "")]
        ready = httpx.post(f"{server.base_url}/v2/repository/index", json={"ready": True}, headers=auth, timeout=10)
        assert [r["name"] for r in ready.json()] == ["b"]
        assert "model folder 'a' was removed from the repository: unloading the model" in server.log()

        # no names: the whole repository, as the next poll would
        put_model(repo, "c", relu)
        assert {r["name"] for r in poll(server, headers=auth).json() if r.get("state") == "READY"} == {"b", "c"}

        bad = poll(server, {"models": "b"}, headers=auth)
        assert bad.status_code == 400 and "'models' must be a list" in bad.json()["error"]
        bad = poll(server, {"models": ["../etc"]}, headers=auth)
        assert bad.status_code == 400, bad.text
        assert errors(server) == []
    finally:
        server.terminate()


def test_a_poll_request_is_refused_outside_poll_mode(tmp_path: Path, relu: bytes) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    put_model(repo, "a", relu)
    server = start_server(repo, "--model-control-mode", "explicit", log_dir=tmp_path)
    try:
        response = poll(server, {"models": ["a"]})
        assert response.status_code == 503
        assert "a repository poll needs --model-control-mode=poll" in response.json()["error"]
        # an explicit-mode server loads only when told: the request loaded nothing
        index = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
        assert index == [{"name": "a"}]
    finally:
        server.terminate()


def test_models_removed_while_the_server_polls_are_unloaded_without_an_error(tmp_path: Path, relu: bytes) -> None:
    """50 folders removed one after another while polls run every 0.1 s: some removals land between a poll's
    listing and its read of that folder (the race a bulk delete by the operator hits), and none is an ERROR."""
    repo = tmp_path / "repo"
    repo.mkdir()
    names = [f"m{i:02d}" for i in range(50)]
    for name in names:
        put_model(repo, name, relu)
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.1", log_dir=tmp_path)
    try:

        def ready() -> set[str]:
            index = httpx.post(f"{server.base_url}/v2/repository/index", json={"ready": True}, timeout=10).json()
            return {r["name"] for r in index}

        wait_for("50 models READY", lambda: ready() == set(names), 120, describe=lambda: server.log()[-3000:])
        for name in names:
            remove_model(repo, name)
            time.sleep(0.01)
        wait_for("every model unloaded", lambda: not ready(), 60, describe=lambda: server.log()[-3000:])
        time.sleep(0.5)  # a poll or two more
        assert errors(server) == [], "\n".join(errors(server)[:5])
        assert server.log().count("was removed from the repository: unloading the model") == len(names)
    finally:
        server.terminate()


def test_the_operators_poll_requests_are_batched_per_replica_and_answered_with_rows(
    tmp_path: Path, relu: bytes
) -> None:
    """The operator's Nudger against a real server: 30 names asked for one by one while a request is in flight
    go in a few requests, every name's ticket gets its rows; a server that does not take poll requests (explicit
    mode) is asked once, then left to itself."""
    from kubeinfer.operator.replicas.indexes import IndexReader
    from kubeinfer.operator.replicas.nudge import Nudger
    from kubeinfer.operator.replicas.server_access import PLAIN

    repo = tmp_path / "repo"
    repo.mkdir()
    names = [f"n{i:02d}" for i in range(30)]
    for name in names:
        put_model(repo, name, relu)
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "3600", log_dir=tmp_path)
    explicit_repo = tmp_path / "explicit"
    explicit_repo.mkdir()
    explicit = start_server(explicit_repo, "--model-control-mode", "explicit", log_dir=tmp_path)
    reader = IndexReader()
    answered: list[tuple[str, list[str]]] = []
    nudger = Nudger(reader.client_for, lambda url, access, asked, rows: answered.append((url, asked)))
    try:
        tickets = [t for name in names for t in nudger.nudge(server.base_url, PLAIN, [name])]
        rows = [t.wait(60) for t in tickets]
        assert all(
            r is not None and [(x["name"], x["state"]) for x in r] == [(n, "READY")]
            for r, n in zip(rows, names, strict=True)
        )
        assert nudger.requests < len(names) / 2, f"{nudger.requests} requests for {len(names)} names"
        assert sorted(n for _, asked in answered for n in asked) == names

        (ticket,) = nudger.nudge(explicit.base_url, PLAIN, ["x"])
        assert ticket.wait(30) is None
        before = nudger.requests
        (ticket,) = nudger.nudge(explicit.base_url, PLAIN, ["y"])
        assert ticket.wait(1) is None and nudger.requests == before  # not asked again
        assert errors(server) == []
    finally:
        nudger.close()
        reader.close()
        server.terminate()
        explicit.terminate()


def test_names_that_trickle_in_go_together_after_the_first(tmp_path: Path, relu: bytes) -> None:
    """A bulk apply reaches the operator one model at a time: the first name goes at once, the ones that follow
    within the pause (``linger``) go together in the next request, each ticket still gets its own rows; ``full``
    names waiting (every reconcile thread of a bulk delete waits for its answer) go without the pause."""
    from kubeinfer.operator.replicas.indexes import IndexReader
    from kubeinfer.operator.replicas.nudge import Nudger
    from kubeinfer.operator.replicas.server_access import PLAIN

    repo = tmp_path / "repo"
    repo.mkdir()
    names = [f"t{i:02d}" for i in range(12)]
    full = [f"f{i:02d}" for i in range(12)]
    for name in names + full:
        put_model(repo, name, relu)
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "3600", log_dir=tmp_path)
    reader = IndexReader()
    answered: list[list[str]] = []
    nudger = Nudger(reader.client_for, lambda url, access, asked, rows: answered.append(asked), linger=8.0, full=12)
    try:
        started = time.monotonic()
        (first,) = nudger.nudge(server.base_url, PLAIN, names[:1])
        assert first.wait(30) is not None
        first_after = time.monotonic() - started
        tickets = []
        for name in names[1:]:  # faster than the pause, slower than a request: one request each without it
            tickets += nudger.nudge(server.base_url, PLAIN, [name])
            time.sleep(0.05)
        rows = [t.wait(60) for t in tickets]
        assert all(
            r is not None and [(x["name"], x["state"]) for x in r] == [(n, "READY")]
            for r, n in zip(rows, names[1:], strict=True)
        )
        assert first_after < 8.0, f"the first name waited {first_after:.2f}s"
        assert answered[0] == names[:1]
        assert nudger.requests <= 3, f"{nudger.requests} requests: {answered}"
        assert sorted(n for asked in answered for n in asked) == names

        requests, started = nudger.requests, time.monotonic()  # a request just went: the pause runs
        tickets = nudger.nudge(server.base_url, PLAIN, full[:1])
        time.sleep(0.5)  # its sender waits out the pause; the names that fill the batch wake it
        tickets += [t for name in full[1:] for t in nudger.nudge(server.base_url, PLAIN, [name])]
        assert all(t.wait(30) is not None for t in tickets)
        assert time.monotonic() - started < 6.0 and nudger.requests == requests + 1, answered
        assert errors(server) == []
    finally:
        nudger.close()
        reader.close()
        server.terminate()
