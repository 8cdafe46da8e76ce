"""``--model-repository=s3://...`` as Triton reads it, against a real S3 store (SeaweedFS): the server copies each
model locally, serves it to tritonclient, notices a model changed or deleted in the bucket at its next poll, and
gives Triton's error for bad credentials instead of starting on an empty repository.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.test_reload import CONFIG, add_sub_plus
from tests.support.s3_store import S3Store
from tests.support.server import start_server
from tests.support.waiting import wait_for

CONFIG_TEXT = CONFIG.format(max_batch_size=8, extra="").replace('name: "drill"', 'name: "adder"')


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    with S3Store(tmp_path_factory.mktemp("s3-repository")) as s3:
        s3.client().create_bucket(Bucket="repository")
        yield s3


def _upload(store: S3Store, prefix: str, offset: float) -> None:
    s3 = store.client()
    s3.put_object(Bucket="repository", Key=f"{prefix}/adder/config.pbtxt", Body=CONFIG_TEXT.encode())
    s3.put_object(
        Bucket="repository", Key=f"{prefix}/adder/1/model.onnx", Body=add_sub_plus(offset).SerializeToString()
    )


def _infer(url: str) -> float:
    client = httpclient.InferenceServerClient(url)
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return float(client.infer("adder", inputs).as_numpy("OUTPUT0")[0, 0])


def _env(store: S3Store, identity: str = "reader") -> dict[str, str]:
    access, secret = store.credentials(identity)
    return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1"}


def test_a_cloud_repository_is_served_and_polled(store: S3Store, tmp_path: Path) -> None:
    _upload(store, "polled", 0.0)
    uri = f"s3://{store.host}:{store.port}/repository/polled"
    server = start_server(
        uri,  # type: ignore[arg-type]
        "--model-control-mode=poll",
        "--repository-poll-secs=1",
        log_dir=tmp_path,
        env=_env(store),
    )
    try:
        assert _infer(server.http_url) == 2.0
        _upload(store, "polled", 100.0)  # the model changed in the bucket: the next poll reloads it
        wait_for("the changed model served", lambda: _infer(server.http_url) == 102.0, 60, describe=server.log)
        store.client().delete_object(Bucket="repository", Key="polled/adder/1/model.onnx")
        store.client().delete_object(Bucket="repository", Key="polled/adder/config.pbtxt")
        client = httpclient.InferenceServerClient(server.http_url)
        wait_for("the deleted model unloaded", lambda: not client.is_model_ready("adder"), 60, describe=server.log)
    finally:
        server.terminate()


def test_credentials_from_triton_cloud_credential_path(store: S3Store, tmp_path: Path) -> None:
    _upload(store, "byfile", 0.0)
    uri = f"s3://{store.host}:{store.port}/repository/byfile"
    access, secret = store.credentials("reader")
    creds = tmp_path / "cloud.json"
    creds.write_text(json.dumps({"s3": {uri: {"key_id": access, "secret_key": secret, "region": "us-east-1"}}}))
    server = start_server(uri, log_dir=tmp_path, env={"TRITON_CLOUD_CREDENTIAL_PATH": str(creds)})  # type: ignore[arg-type]
    try:
        assert _infer(server.http_url) == 2.0
    finally:
        server.terminate()


def test_bad_credentials_stop_the_server_with_tritons_words(store: S3Store, tmp_path: Path) -> None:
    _upload(store, "refused", 0.0)
    env = {**_env(store), "AWS_SECRET_ACCESS_KEY": "wrong-secret-abcdef"}
    uri = f"s3://{store.host}:{store.port}/repository/refused"
    server = start_server(uri, log_dir=tmp_path, env=env, wait=False)  # type: ignore[arg-type]
    assert server.proc.wait(timeout=60) == 1
    log = server.log()
    assert "Unable to create S3 filesystem client. Check account credentials." in log
    assert "wrong-secret-abcdef" not in log
    missing = start_server(
        f"s3://{store.host}:{store.port}/nosuchbucket/x",  # type: ignore[arg-type]
        log_dir=tmp_path,
        env=_env(store),
        wait=False,
    )
    assert missing.proc.wait(timeout=60) == 1
    assert "NoSuchBucket" in missing.log() or "SourceNotFound" in missing.log()
