"""``gs://`` URIs and Cloud Storage's answers read as pure functions: what each form names, what is refused before
a connection, and a store's refusal in words that name no credential."""

from __future__ import annotations

import json

import pytest
from kubeinfer.server.sources.errors import INVALID, NOT_FOUND, UNAUTHORIZED, UNAVAILABLE, SourceError
from kubeinfer.server.sources.gcs import _entry, _error, credentials_from, gcs_endpoint
from kubeinfer.server.sources.uris import STORE_SCHEMES, GcsLocation, parse_gs


def test_gs_forms() -> None:
    assert "gs" in STORE_SCHEMES
    one = parse_gs("gs://models/resnet/model.onnx")
    assert one == GcsLocation("models", "resnet/model.onnx") and not one.is_folder
    folder = parse_gs("gs://models/resnet/")
    assert folder.is_folder and folder.name == "resnet/" and folder.shown == "gs://models/resnet/"
    assert parse_gs("gs://models").is_folder and parse_gs("gs://models/").name == ""
    # Cloud Storage allows '_' and dotted (domain-named) buckets of up to 222 characters
    assert parse_gs("gs://my_models.example.com/a").bucket == "my_models.example.com"
    assert parse_gs("gs://" + ".".join(["a" * 60] * 3) + "/x").name == "x"


@pytest.mark.parametrize(
    "uri",
    [
        "gs://UPPER/key",
        "gs://a/key",
        "gs://-models/key",
        "gs://models-/key",
        "gs://" + "a" * 64 + "/key",
        "gs://" + "a" * 64 + ".b/key",
        "gs://x..y/key",
        "gs://goog-models/key",
        "gs://models/../etc",
        "gs://models//abs",
        "gs://models/a/./b",
        "gs://models/a\nb",
        "gs://models/" + "k" * 1025,
    ],
)
def test_gs_refusals(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_gs(uri)
    assert info.value.reason == INVALID


def test_endpoint_is_a_base_url() -> None:
    assert str(gcs_endpoint(None)) == "https://storage.googleapis.com"
    assert str(gcs_endpoint("http://127.0.0.1:4443/")) == "http://127.0.0.1:4443"
    for bad in ("ftp://store", "https://store/path", "https://store?x=1"):
        with pytest.raises(SourceError):
            gcs_endpoint(bad)


def test_metadata_pins_by_generation() -> None:
    file = _entry({"name": "m/a", "size": "12", "generation": "1700000000123456"}, "m/a", "a", "gs://b/m/a")
    assert (file.path, file.size, file.sha256) == ("a", 12, None)
    assert file.pinned_by == "gcs-generation 1700000000123456" and file.locator == ("m/a", "1700000000123456")
    for doc in ({"size": "x", "generation": "1"}, {"size": "1"}, {"size": "1", "generation": "0"}):
        with pytest.raises(SourceError) as info:
            _entry(doc, "m/a", "", "gs://b/m/a")
        assert info.value.reason == UNAVAILABLE


def test_errors_in_the_stores_words() -> None:
    body = json.dumps({"error": {"code": 403, "message": "caller does not have storage.objects.get access"}})
    err = _error(403, body.encode(), "gs://b/o", True)
    assert err.reason == UNAUTHORIZED and "storage.objects.get" in err.message
    assert _error(401, b"", "gs://b/o", False).reason == UNAUTHORIZED
    assert _error(404, b'{"error": {"message": "No such object"}}', "gs://b/o", False).reason == NOT_FOUND
    assert _error(503, b"<html>", "gs://b/o", False).reason == UNAVAILABLE
    assert _error(429, b"", "gs://b/o", False).reason == UNAVAILABLE
    assert _error(400, b"", "gs://b/o", False).reason == INVALID


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"key.json": "not json"},
        {"key.json": json.dumps({"type": "authorized_user", "refresh_token": "r"})},
        {"key.json": json.dumps({"type": "external_account", "credential_source": {"file": "/etc/shadow"}})},
        {"key.json": json.dumps({"type": "service_account", "token_uri": "http://t/token"})},
        {"key.json": json.dumps({"type": "service_account", "token_uri": "https://t/token", "private_key": "x"})},
    ],
)
def test_only_usable_service_account_keys(data: dict[str, str]) -> None:
    with pytest.raises(SourceError) as info:
        credentials_from(data)
    assert info.value.reason == UNAUTHORIZED
    assert "/etc/shadow" not in info.value.message and "refresh_token" not in info.value.message
