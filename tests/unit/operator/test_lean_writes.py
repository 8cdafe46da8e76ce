"""The operator's per-model writes sent straight through the client's pool (operator/kube/lean_writes.py) arrive as
the generated API methods send them: each write is sent both ways to one HTTP server and what arrived is
compared (method, path, content type, credential, user agent, body). A refusal is the client's ApiException.
This is also the test that fails when a kubernetes client upgrade moves what the lean path relies on."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubeinfer.operator.kube.client import MODELS, SERVERS, Kube
from kubeinfer.operator.kube.events import event_body
from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

MERGE = "application/merge-patch+json"


class Recorder(http.server.ThreadingHTTPServer):
    """Records each request; answers the next status in ``answers`` (200 when none is left)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[dict[str, Any]] = []
        self.answers: list[int] = []


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Recorder
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.seen.append(
            {
                "method": self.command,
                "path": self.path,
                "content-type": self.headers.get("Content-Type"),
                "authorization": self.headers.get("Authorization"),
                "user-agent": self.headers.get("User-Agent"),
                "body": json.loads(self.rfile.read(length) or b"null"),
            }
        )
        status = self.server.answers.pop(0) if self.server.answers else 200
        body = json.dumps({"kind": "Status", "code": status, "message": f"answer {status}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_PATCH = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def api() -> Iterator[Recorder]:
    server = Recorder()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def same_times(event: dict[str, Any]) -> dict[str, Any]:
    """The event with its timestamps as datetimes (one instant, however it is written)."""
    return {k: dt.datetime.fromisoformat(v) if k.endswith("Timestamp") else v for k, v in event.items()}


def client_for(server: Recorder, prefix: str = "", proxy: bool = False) -> ApiClient:
    config = Configuration()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    config.host = address + prefix
    config.api_key = {"authorization": "Bearer t0ken"}
    if proxy:  # the recorder plays the proxy too: it sees each request in absolute form
        config.proxy = address
    return ApiClient(config)


@pytest.mark.parametrize(
    ("prefix", "proxy"), [("", False), ("/k8s/clusters/c-1", False), ("", True)], ids=["plain", "prefix", "proxy"]
)
def test_each_write_arrives_as_the_generated_method_sends_it(api: Recorder, prefix: str, proxy: bool) -> None:
    """(The generated calls do not decode the answer: this server's answers are not the objects they expect.)
    Also for an API server under a path (a proxy in front of clusters) and through the configuration's proxy."""
    client = client_for(api, prefix, proxy)
    kube = Kube(client, retry_seconds=0)
    status = {"conditions": [{"type": "Ready", "status": "True", "message": "ünïcode"}], "replicas": 2}
    model = {"kind": "InferenceModel", "metadata": {"name": "m", "namespace": "ns-1", "uid": "u"}}
    event = event_body(model, "Normal", "Ready", "serving versions [1]; rendered: created the model")

    kube.patch_status(MODELS, "ns-1", "m", status)
    CustomObjectsApi(client).patch_namespaced_custom_object_status(
        "serving.kubeinfer.io",
        "v1alpha1",
        "ns-1",
        MODELS,
        "m",
        {"status": status},
        _content_type=MERGE,
        _preload_content=False,
    )
    assert kube.set_finalizers("ns-1", "m", ["serving.kubeinfer.io/model"], "42")
    CustomObjectsApi(client).patch_namespaced_custom_object(
        "serving.kubeinfer.io",
        "v1alpha1",
        "ns-1",
        MODELS,
        "m",
        {"metadata": {"finalizers": ["serving.kubeinfer.io/model"], "resourceVersion": "42"}},
        _content_type=MERGE,
        _preload_content=False,
    )
    kube.create_event("ns-1", event)
    CoreV1Api(client).create_namespaced_event("ns-1", dict(event), _preload_content=False)

    lean, generated = api.seen[0::2], api.seen[1::2]
    assert len(lean) == len(generated) == 3
    assert lean[:2] == generated[:2]
    # the event: the generated method sends it as its CoreV1Event model (timestamps rewritten as +00:00) and
    # without a content type (the API server reads JSON); the same event otherwise
    ours, theirs = lean[2], generated[2]
    assert ours["content-type"] == "application/json" and theirs["content-type"] is None
    assert {**ours, "content-type": None, "body": same_times(ours["body"])} == {
        **theirs,
        "body": same_times(theirs["body"]),
    }
    start = f"http://127.0.0.1:{api.server_address[1]}" if proxy else prefix
    assert [s["path"] for s in lean] == [
        f"{start}/apis/serving.kubeinfer.io/v1alpha1/namespaces/ns-1/inferencemodels/m/status",
        f"{start}/apis/serving.kubeinfer.io/v1alpha1/namespaces/ns-1/inferencemodels/m",
        f"{start}/api/v1/namespaces/ns-1/events",
    ]
    assert lean[0]["authorization"] == "Bearer t0ken" and lean[0]["content-type"] == MERGE


def test_refusals_are_the_clients_exceptions_and_keep_their_meaning(api: Recorder) -> None:
    kube = Kube(client_for(api), retry_seconds=0)
    api.answers = [409, 404]
    assert not kube.set_finalizers("ns", "m", [], "1")  # changed since: the caller reads the newer object
    assert not kube.set_finalizers("ns", "m", [], "1")  # gone
    api.answers = [404]
    kube.patch_status(SERVERS, "ns", "pool", {"replicas": 0})  # deleted meanwhile: nothing to report
    api.answers = [422]
    with pytest.raises(ApiException) as refused:
        kube.create_event("ns", {"reason": "Ready"})
    assert refused.value.status == 422 and "answer 422" in (refused.value.body or "")


def test_a_transient_failure_is_retried(api: Recorder) -> None:
    kube = Kube(client_for(api), retry_seconds=10)
    api.answers = [503, 429]
    kube.patch_status(MODELS, "ns", "m", {"replicas": 1})
    assert len(api.seen) == 3 and kube.retries == 2
