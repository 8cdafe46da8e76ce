"""End-to-end fault drill: the kube-apiserver restarts in the middle of a reconcile.

Runs on a control plane of its own (a private run folder), since restarting the shared apiserver
would break every other session's tests. The operator must ride the outage out (API calls retried
with backoff, watches re-established), converge, and leave nothing half-written on the volume.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto
from test_operator import API, SERVER, Env, Files, Operator

from tests.support.models import unary
from tests.support.server import start_server
from tests.support.waiting import wait_for_cluster

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def private_cluster(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A second control plane in a run folder of its own (``cluster`` first: the binaries are built)."""
    run = tmp_path_factory.mktemp("private-cluster")
    env = {**os.environ, "KUBEINFER_CLUSTER_RUN": str(run)}
    proc = cluster.script("up", "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    handle = type(cluster).from_info(json.loads(proc.stdout))
    handle.env["KUBEINFER_CLUSTER_RUN"] = str(run)
    try:
        yield handle
    finally:
        cluster.script("down", env=env, timeout=120)


@pytest.fixture
def env(private_cluster: Any, tmp_path: Path) -> Iterator[Env]:
    cluster = private_cluster
    ns = f"e2e-fault-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for crd in ("inferencemodels", "inferenceservers"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
    cluster.kubectl("create", "namespace", ns)
    root = tmp_path / "volume"
    uploads = root / ns / "uploads"  # paths in specs are relative to the namespace's folder
    uploads.mkdir(parents=True)
    (root / ns / SERVER).mkdir()
    for name, op in (("relu.onnx", "Relu"), ("abs.onnx", "Abs")):
        onnx.save(unary(name, op, TensorProto.FLOAT, ["batch", 4]), uploads / name)
    handler = lambda *a: Files(*a, directory=str(uploads))  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    logs = tmp_path / "logs"
    logs.mkdir()
    server = start_server(
        root / ns / SERVER, "--model-control-mode", "poll", "--repository-poll-secs", "1", log_dir=logs
    )
    op = Operator(cluster, root, ns, server, logs)
    op.start()
    e = Env(cluster, ns, root, f"http://127.0.0.1:{httpd.server_address[1]}", server, op)
    e.apply(
        {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": SERVER},
            "spec": {"image": "img:1", "repository": {"claimName": "c", "subPath": SERVER}},
        }
    )
    try:
        yield e
    finally:
        op.stop()
        server.terminate()
        httpd.shutdown()


def test_apiserver_restart_mid_reconcile_converges_with_nothing_half_written(env: Env) -> None:
    env.apply(env.model("steady", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    env.wait_condition("steady", "True")
    env.apply(env.model("inflight", [env.uri_version(1, "abs.onnx", slow=True)]))  # a ~6 s download
    wait_for_cluster("download started", lambda: env.staged("inflight"))
    restart = env.cluster.script("restart", "kube-apiserver", "--down-seconds", "4", env=env.cluster.env, timeout=180)
    assert restart.returncode == 0, restart.stderr
    # the render finished while the API was away; its status write waited for the API to come back
    env.wait_condition("inflight", "True", timeout=120)
    env.wait_condition("steady", "True")
    assert env.operator.proc is not None and env.operator.proc.poll() is None, "the operator exited"
    log = "\n".join(p.read_text(errors="replace") for p in sorted(env.operator.log_dir.glob("operator-*.log")))
    assert "retrying in" in log, log[-6000:]
    # watches came back too: a model created after the restart is served
    env.apply(env.model("after", [{"version": 1, "source": {"path": "uploads/relu.onnx"}}]))
    env.wait_condition("after", "True", timeout=90)
    assert env.visible("inflight") == ["1", "config.pbtxt"]
    assert env.leftovers() == []
    for name in ("steady", "inflight", "after"):
        env.delete_model(name)
