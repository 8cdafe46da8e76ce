"""The tests' S3 store (tests/support/s3_store.py: SeaweedFS built from its pinned module) answers as S3 does, with
boto3: buckets, objects, ListObjectsV2 pages, ranged GETs, HEAD, SigV4 failures, a read-only identity, a restart."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from tests.support.s3_store import S3Store

BODIES = {f"models/simple/{i}/model.onnx": secrets.token_bytes(1000 + 100 * i) for i in range(5)}


@pytest.fixture(scope="module")
def bucket(s3_store: S3Store) -> str:
    name = f"smoke-{secrets.token_hex(4)}"
    s3 = s3_store.client()
    s3.create_bucket(Bucket=name)
    for key, body in BODIES.items():
        s3.put_object(Bucket=name, Key=key, Body=body)
    return name


def error_of(e: pytest.ExceptionInfo[ClientError]) -> tuple[int, str]:
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"], e.value.response["Error"]["Code"]


def test_list_objects_v2_pages(s3_store: S3Store, bucket: str) -> None:
    s3 = s3_store.client()
    keys, pages, token = [], 0, None
    while True:
        page = s3.list_objects_v2(Bucket=bucket, MaxKeys=2, **({"ContinuationToken": token} if token else {}))
        pages += 1
        assert page["KeyCount"] == len(page["Contents"]) <= 2
        keys += [o["Key"] for o in page["Contents"]]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
    assert pages == 3
    assert keys == sorted(BODIES)
    sizes = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="models/simple/")["Contents"]}
    assert sizes == {k: len(v) for k, v in BODIES.items()}


def test_ranged_get_and_head(s3_store: S3Store, bucket: str) -> None:
    s3 = s3_store.client()
    key = "models/simple/4/model.onnx"
    got = s3.get_object(Bucket=bucket, Key=key, Range="bytes=100-299")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 100-299/{len(BODIES[key])}"
    assert got["Body"].read() == BODIES[key][100:300]
    assert s3.get_object(Bucket=bucket, Key=key, Range="bytes=-10")["Body"].read() == BODIES[key][-10:]
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(BODIES[key])
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key="models/missing")
    assert error_of(e)[0] == 404


def client_with(store: S3Store, access_key: str, secret_key: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        region_name=store.region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


def test_wrong_keys_are_refused(s3_store: S3Store, bucket: str) -> None:
    wrong_secret = client_with(s3_store, s3_store.admin_access_key, "not-" + s3_store.admin_secret_key)
    with pytest.raises(ClientError) as e:
        wrong_secret.get_object(Bucket=bucket, Key=next(iter(BODIES)))
    assert error_of(e) == (403, "SignatureDoesNotMatch")
    unknown = client_with(s3_store, "AKIANOTAKEY", s3_store.admin_secret_key)
    with pytest.raises(ClientError) as e:
        unknown.list_objects_v2(Bucket=bucket)
    assert error_of(e) == (403, "InvalidAccessKeyId")


def test_reader_reads_and_lists_but_cannot_write(s3_store: S3Store, bucket: str) -> None:
    reader = s3_store.client("reader")
    key = next(iter(BODIES))
    assert reader.get_object(Bucket=bucket, Key=key)["Body"].read() == BODIES[key]
    assert len(reader.list_objects_v2(Bucket=bucket)["Contents"]) == len(BODIES)
    with pytest.raises(ClientError) as e:
        reader.put_object(Bucket=bucket, Key="models/written-by-reader", Body=b"x")
    assert error_of(e) == (403, "AccessDenied")
    with pytest.raises(ClientError) as e:
        reader.delete_object(Bucket=bucket, Key=key)
    assert error_of(e) == (403, "AccessDenied")
    assert s3_store.client().head_object(Bucket=bucket, Key=key)["ContentLength"] == len(BODIES[key])


def test_restart_keeps_ports_keys_and_data(tmp_path: Path) -> None:
    """``stop()`` kills it (the data stays), ``start()`` serves the same data again on the same endpoint."""
    with S3Store(tmp_path / "s3") as store:
        s3 = store.client()
        s3.create_bucket(Bucket="restart")
        s3.put_object(Bucket="restart", Key="a/b", Body=b"kept")
        endpoint = store.endpoint
        store.stop()
        assert not store.running()
        with pytest.raises(EndpointConnectionError):
            s3.head_object(Bucket="restart", Key="a/b")
        store.start()
        assert store.endpoint == endpoint
        assert s3.get_object(Bucket="restart", Key="a/b")["Body"].read() == b"kept"
