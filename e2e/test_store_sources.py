"""Store sources end to end: the operator pod fetches the same model from S3 and from an OCI registry into two
pools, and tritonclient gets the right answers through each pool's Service.

One namespace of the test's own, the chart ``helm install``-ed from the locally built images with
``artifacts.allowedNetworks`` = the host's address as pods reach it (the stores listen there, a private
address). On that address:

* a real S3-compatible store (SeaweedFS): the example CIFAR-10 ResNet-18 uploaded with a SHA-256 checksum
  (``ChecksumAlgorithm="SHA256"``), no ``sha256`` in the spec: the object's own checksum pins it; read with the
  store's read-only identity from a labelled, host-bound credentials Secret;
* a real OCI registry (CNCF distribution, anonymous, plain http): the same bytes pushed as an ORAS artifact
  (``model.onnx``), referenced by tag: the manifest's digest pins it.

Two InferenceServers (``s3-pool``, ``oci-pool``) and an InferenceModel on each, one per source: both Ready,
``status.coldStart.render.artifacts[].pinnedBy`` says what pinned the content (``s3-checksum sha256:<hex of
the file>``, ``oci-digest <the pushed manifest's digest>``), the rendered files are the uploaded bytes, and
tritonclient over HTTP through each Service's ClusterIP gets what onnxruntime computes here. The S3 secret key
shows nowhere: not in the models' status, the namespace's events, nor the operator pod's log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
import yaml
from chart_release import EXAMPLES, Release, example_server, install_chart, ready, sha256, uninstall
from kubeinfer.server.examples import models

from tests.support import drills
from tests.support.oci_registry import OciRegistry
from tests.support.operator_logs import problems
from tests.support.s3_store import S3Store
from tests.support.waiting import wait_for_cluster

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BUCKET = "models"
KEY = "cifar10/resnet18/model.onnx"
REPOSITORY = "models/cifar10-resnet18"
TAG = "v1"
SECRET = "s3-reader"
#: per source: (InferenceServer, InferenceModel)
POOLS = {"s3": ("s3-pool", "resnet-s3"), "oci": ("oci-pool", "resnet-oci")}


@dataclass
class Stores(Release):
    """The test's namespace, release, stores and what was put in them."""

    cluster: Any
    node: dict
    images: dict
    ns: str
    release: str
    s3: S3Store
    registry: OciRegistry
    model_file: Path
    digest: str = ""
    volume: Path = Path()
    image: np.ndarray = field(default_factory=lambda: np.random.default_rng(11).random((2, 3, 32, 32), np.float32))
    expected: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def secret_key(self) -> str:
        return self.s3.credentials("reader")[1]

    def ready_condition(self, model: str) -> dict:
        obj = self.get("inferencemodel", model) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})

    def operator_log(self) -> str:
        return self.kubectl("logs", f"deploy/{self.operator}", check=False).stdout

    def describe(self) -> str:
        out = self.kubectl("get", "inferenceservers,inferencemodels,deploy,pods,svc,pvc", "-o", "wide", check=False)
        statuses = "".join(
            f"\n--- {model} status: {json.dumps((self.get('inferencemodel', model) or {}).get('status'))}"
            for _, model in POOLS.values()
        )
        op = self.kubectl("logs", f"deploy/{self.operator}", "--tail=60", check=False)
        return f"{out.stdout}{statuses}\n--- operator:\n{op.stdout}"


def infer_http(url: str, model: str, image: np.ndarray) -> tuple[str, np.ndarray]:
    client = httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=30)
    try:
        inp = httpclient.InferInput("input", list(image.shape), "FP32")
        inp.set_data_from_numpy(image)
        result = client.infer(model, [inp])
        return result.get_response()["model_version"], result.as_numpy("output")
    finally:
        client.close()


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def stores(cluster, node, images, tmp_path_factory) -> Iterator[Stores]:
    """Both stores on the host's node-facing address, the model uploaded to S3 (with its SHA-256 checksum) and
    pushed to the registry as an ORAS artifact."""
    suffix = uuid.uuid4().hex[:6]
    files = tmp_path_factory.mktemp("store-files")
    model_file = files / "model.onnx"
    onnx.save(models.resnet18_cifar(seed=3), model_file)
    with (
        S3Store(tmp_path_factory.mktemp("s3"), host=node["host_ip"]) as s3,
        OciRegistry(tmp_path_factory.mktemp("registry"), host=node["host_ip"], anonymous_read=True) as registry,
    ):
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=KEY, Body=model_file.read_bytes(), ChecksumAlgorithm="SHA256")
        head = client.head_object(Bucket=BUCKET, Key=KEY, ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256"), head  # the store keeps the object's checksum: what pins it below
        st = Stores(cluster, node, images, f"e2e-stores-{suffix}", f"kubeinfer-{suffix}", s3, registry, model_file)
        st.digest = registry.push_artifact(REPOSITORY, TAG, {"model.onnx": model_file})
        session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
        st.expected = session.run(["output"], {"input": st.image})[0]
        try:
            yield st
        finally:
            uninstall(st, timeout=180)


@pytest.fixture(scope="module")
def installed(stores: Stores) -> Stores:
    """The chart with its default values, but for the watched namespace, the stores' network and the namespace
    whose Secrets the operator may read."""
    st = stores
    # the stores listen on this machine, a private address: install_chart allows the host's address; the
    # operator reads Secrets (source.credentialsSecret) only in the namespaces named by rbac.secretNamespaces
    st.volume = install_chart(st, "--set", f"rbac.secretNamespaces={{{st.ns}}}")
    return st


@pytest.fixture(scope="module")
def served(installed: Stores) -> Stores:
    """The credentials Secret, two pools and one model on each (S3, OCI), both Ready."""
    st = installed
    access, secret = st.s3.credentials("reader")
    st.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": SECRET,
                "labels": {"serving.kubeinfer.io/artifact-credentials": "true"},
                "annotations": {"serving.kubeinfer.io/artifact-hosts": st.s3.host},
            },
            "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret},
        }
    )
    sources = {
        # no sha256: the object's own SHA-256 checksum pins it
        "s3": {"uri": f"s3://{BUCKET}/{KEY}", "endpoint": st.s3.endpoint, "credentialsSecret": SECRET},
        # anonymous, plain http: the endpoint says so; the manifest's digest pins the tag's content
        "oci": {"uri": f"oci://{st.registry.address}/{REPOSITORY}:{TAG}", "endpoint": st.registry.url},
    }
    for kind, (pool, model) in POOLS.items():
        st.apply(example_server(st.images["server"], pool))
        spec = yaml.safe_load((EXAMPLES / "cifar10-resnet.yaml").read_text())
        spec["metadata"]["name"] = model
        spec["spec"]["server"] = pool
        spec["spec"]["versions"] = [{"version": 1, "source": sources[kind]}]
        st.apply(spec)

    def both_ready() -> dict | None:
        conditions = {model: st.ready_condition(model) for _, model in POOLS.values()}
        return conditions if all(c.get("status") == "True" for c in conditions.values()) else None

    wait_for_cluster("both InferenceModels Ready", both_ready, timeout=420, describe=st.describe)
    return st


# ------------------------------------------------------------------------------------------ tests


def test_both_models_ready_and_pinned_by_the_stores(served: Stores) -> None:
    st = served
    pins = {"s3": f"s3-checksum sha256:{sha256(st.model_file)}", "oci": f"oci-digest {st.digest}"}
    assert st.digest.startswith("sha256:") and len(st.digest) == 71, st.digest
    for kind, (pool, model) in POOLS.items():
        cond = st.ready_condition(model)
        assert cond["status"] == "True" and cond["reason"] == "Serving", (model, cond)
        status = st.get("inferencemodel", model)["status"]
        assert status["activeVersions"] == [1] and status["targetVersions"] == [1], (model, status)
        artifacts = status["coldStart"]["render"]["artifacts"]
        assert [a["version"] for a in artifacts] == [1], (model, artifacts)
        assert artifacts[0]["pinnedBy"] == pins[kind], (model, artifacts)
        assert artifacts[0]["bytes"] == st.model_file.stat().st_size, (model, artifacts)
        render = status["coldStart"]["render"]
        drills.note(
            f"cold start, fetch from {kind} ({artifacts[0]['bytes']} bytes): fetch {render['fetchSeconds']} s, "
            f"render {render['renderSeconds']} s"
        )
        # what the operator pod wrote to the pool's folder on the volume: the uploaded bytes, and beside them
        # only its own dot-named record of the source (which the server ignores)
        rendered = st.volume / st.ns / pool / model
        assert (rendered / "1" / "model.onnx").read_bytes() == st.model_file.read_bytes(), model
        assert sorted(p.name for p in (rendered / "1").iterdir() if not p.name.startswith(".")) == ["model.onnx"]
        marker = json.loads((rendered / "1" / ".kubeinfer-source.json").read_text())
        assert marker.get("uri") == st.get("inferencemodel", model)["spec"]["versions"][0]["source"]["uri"], marker
        assert model in (rendered / "config.pbtxt").read_text()
        selector = f"app.kubernetes.io/name=kubeinfer-server,app.kubernetes.io/instance={pool}"
        pods = st.get("pods", selector=selector)["items"]
        assert len(pods) == 1 and ready(pods[0]), (pool, [p["status"] for p in pods])


def test_tritonclient_gets_the_right_answers_through_each_service(served: Stores) -> None:
    st = served
    for pool, model in POOLS.values():
        ip = st.get("service", pool)["spec"]["clusterIP"]
        client = httpclient.InferenceServerClient(f"{ip}:8000", connection_timeout=10, network_timeout=30)
        try:
            assert client.is_server_ready() and client.is_model_ready(model), pool
            meta = client.get_model_metadata(model)
            assert meta["inputs"][0]["shape"] == [-1, 3, 32, 32] and meta["outputs"][0]["shape"] == [-1, 10], meta
        finally:
            client.close()
        version, out = infer_http(f"{ip}:8000", model, st.image)
        assert version == "1", (pool, version)
        assert out.shape == (2, 10), out.shape
        np.testing.assert_allclose(out, st.expected, rtol=1e-3, atol=1e-4, err_msg=pool)


def test_the_s3_secret_key_shows_nowhere(served: Stores) -> None:
    st = served
    key = st.secret_key
    assert len(key) >= 30
    for _, model in POOLS.values():
        obj = st.get("inferencemodel", model)
        assert key not in json.dumps(obj["status"]), model
        assert key not in json.dumps(obj["metadata"].get("annotations") or {}), model
    events = st.kubectl("get", "events", "-o", "json").stdout
    assert json.loads(events)["items"], "no events at all in the namespace"
    assert key not in events
    for pool, model in POOLS.values():  # on the volume, which the pool's pods read
        for path in (st.volume / st.ns / pool / model).rglob("*"):
            if path.is_file() and path.name != "model.onnx":
                assert key not in path.read_text(errors="replace"), path
    log = st.operator_log()
    assert st.ns in log, log[-3000:]  # the log read is the one of the operator that fetched
    assert key not in log


def test_the_operator_log_has_no_problems(served: Stores) -> None:
    log = served.operator_log()
    assert "Traceback" not in log and not problems(log), (problems(log), log[-5000:])
