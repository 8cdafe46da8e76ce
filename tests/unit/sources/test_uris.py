"""Source URIs and store answers read as pure functions: what each form names, and what is refused before a connection."""

from __future__ import annotations

import base64
import hashlib

import pytest
from kubeinfer.server.sources.errors import INVALID, SourceError, printable
from kubeinfer.server.sources.s3 import S3Endpoint, _error, _sha256_of
from kubeinfer.server.sources.uris import OciLocation, S3Location, parse_oci, parse_s3, safe_relative


def test_s3_forms() -> None:
    assert parse_s3("s3://models/resnet/model.onnx") == S3Location("models", "resnet/model.onnx")
    folder = parse_s3("s3://models/resnet/")
    assert folder.is_folder and folder.key == "resnet/"
    assert parse_s3("s3://models").is_folder
    # Triton's form for a local store: host:port first, then the bucket
    triton = parse_s3("s3://10.1.2.3:9000/models/a/model.onnx")
    assert triton == S3Location("models", "a/model.onnx", "10.1.2.3:9000")
    assert S3Endpoint.of(triton, None, None, None).url.scheme == "http"
    secure = parse_s3("s3://https://store.example.com:443/models/a/")
    assert secure.hostport == "store.example.com:443" and S3Endpoint.of(secure, None, None, None).url.scheme == "https"


@pytest.mark.parametrize(
    "uri",
    ["s3://UPPER/key", "s3://a/key", "s3://models/../etc", "s3://models//abs", "s3://models/a/./b", "s3://x..y/k"],
)
def test_s3_forms_refused(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_s3(uri)
    assert info.value.reason == INVALID


def test_s3_endpoints() -> None:
    location = parse_s3("s3://models/m.onnx")
    aws = S3Endpoint.of(location, None, "eu-west-1", None)
    assert str(aws.url) == "https://s3.eu-west-1.amazonaws.com" and not aws.path_style
    custom = S3Endpoint.of(location, "http://store.local:8333", None, None)
    assert custom.path_style and custom.region == "us-east-1"
    assert not S3Endpoint.of(location, "https://store.local", None, False).path_style
    for bad in ("ftp://store", "https://store/path", "https://store?x=1"):
        with pytest.raises(SourceError):
            S3Endpoint.of(location, bad, None, None)


def test_oci_forms() -> None:
    digest = "sha256:" + "a" * 64
    assert parse_oci("oci://ghcr.io/team/models/resnet:v1") == OciLocation("ghcr.io", "team/models/resnet", "v1", None)
    pinned = parse_oci(f"oci://registry.local:5000/resnet@{digest}")
    assert pinned.registry == "registry.local:5000" and pinned.reference == digest
    both = parse_oci(f"oci://r.io/m:v2@{digest}")
    assert both.tag == "v2" and both.reference == digest


@pytest.mark.parametrize(
    "uri",
    ["oci://r.io/m", "oci://r.io", "oci://r.io/M:v1", "oci://r.io/m@sha256:abc", "oci://r.io/m:-bad", "oci:///m:v1"],
)
def test_oci_forms_refused(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_oci(uri)
    assert info.value.reason == INVALID


@pytest.mark.parametrize(
    "path", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "", "a/" + "b/" * 40 + "c"]
)
def test_listed_paths_that_leave_the_folder_are_refused(path: str) -> None:
    with pytest.raises(SourceError):
        safe_relative(path)


def test_listed_paths_kept() -> None:
    assert safe_relative("variables/variables.data-00000-of-00001") == "variables/variables.data-00000-of-00001"
    assert safe_relative(".hidden") == ".hidden"


def test_s3_checksums_pin_only_whole_objects() -> None:
    digest = hashlib.sha256(b"x").digest()
    b64 = base64.b64encode(digest).decode()
    assert _sha256_of(b64, None) == digest.hex()
    assert _sha256_of(b64, "FULL_OBJECT") == digest.hex()
    assert _sha256_of(b64, "COMPOSITE") is None  # a multipart's checksum of checksums
    assert _sha256_of(b64 + "-3", None) is None
    assert _sha256_of("not base64!", None) is None
    assert _sha256_of(base64.b64encode(b"short").decode(), None) is None


def test_s3_errors_keep_the_stores_words_and_nothing_else() -> None:
    body = (
        b"<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match"
        b"</Message><StringToSign>AWS4-HMAC-SHA256 secret-ish</StringToSign></Error>"
    )
    error = _error(403, body, "s3://b/k")
    assert error.reason == "SourceUnauthorized"
    assert "SignatureDoesNotMatch" in error.message and "StringToSign" not in error.message
    assert "secret-ish" not in error.message
    assert _error(404, b"<Error><Code>NoSuchKey</Code></Error>", "s3://b/k").reason == "SourceNotFound"
    assert _error(503, b"", "s3://b/k").reason == "SourceUnavailable"
    assert _error(400, b"<!DOCTYPE x [<!ENTITY a 'b'>]><Error/>", "s3://b/k").reason == INVALID


def test_printable() -> None:
    assert printable("a\nb\x00c   d") == "a b c d"
    assert printable("x" * 300, 10) == "x" * 10 + "..."


def test_pull_secrets_give_the_registrys_entry() -> None:
    import json

    from kubeinfer.operator.sources.store_sources import pull_secret_auth

    config = json.dumps(
        {
            "auths": {
                "ghcr.io": {"auth": base64.b64encode(b"bot:pa:ss").decode()},
                "https://registry.example.com": {"username": "u", "password": "p"},
            }
        }
    )
    assert pull_secret_auth(config, "ghcr.io") == ("bot", "pa:ss")
    assert pull_secret_auth(config, "registry.example.com") == ("u", "p")
    assert pull_secret_auth(config, "other.io") is None
    with pytest.raises(SourceError):
        pull_secret_auth("not json", "ghcr.io")
