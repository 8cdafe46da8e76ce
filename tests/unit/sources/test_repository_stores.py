"""The cloud repository's settings as pure functions: Triton's credential file (sections, the longest prefix, no
match), its variables, the emulators' variables, Azure connection strings, the URI forms; and the mirror over a
store in memory (grouping by model, change tags, deletions)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from google.oauth2 import service_account
from kubeinfer.server.sources.mirror import CloudRepository
from kubeinfer.server.sources.repository_stores import (
    AZURE_CLIENT_ERROR,
    GCS_CLIENT_ERROR,
    RepositoryUnavailable,
    StoredObject,
    azure_settings,
    check_uri,
    credential_entry,
    gcs_settings,
    mount_variable,
    parse_as,
    parse_connection_string,
    s3_settings,
)
from kubeinfer.server.sources.transfer import RangeAnswer, RemoteFile
from kubeinfer.server.sources.uris import AzureLocation, is_cloud

AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE = (
    f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)


def _file(tmp_path: Path, doc: Any) -> dict[str, str]:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps(doc))
    return {"TRITON_CLOUD_CREDENTIAL_PATH": str(path)}


# ------------------------------------------------------------------------------------- the credential file


def test_the_longest_matching_prefix_wins_and_no_match_is_tritons_error(tmp_path: Path) -> None:
    env = _file(tmp_path, {"gs": {"": "default.json", "gs://b": "b.json", "gs://b/team": "team.json"}, "s3": {}})
    assert credential_entry("gs", "gs://b/team/models", env) == (True, "team.json")
    assert credential_entry("gs", "gs://b/other", env) == (True, "b.json")
    assert credential_entry("gs", "gs://c/x", env) == (True, "default.json")
    assert credential_entry("as", "as://a/c", {}) == (False, None)  # no file: the variables apply
    for scheme, uri in (("s3", "s3://b/x"), ("as", "as://acct/c/x")):  # an empty or absent section matches nothing
        with pytest.raises(RepositoryUnavailable, match=rf"^Cannot match credential for path  {uri}$"):
            credential_entry(scheme, uri, env)


def test_an_unreadable_credential_file(tmp_path: Path) -> None:
    with pytest.raises(RepositoryUnavailable, match="failed to read TRITON_CLOUD_CREDENTIAL_PATH"):
        credential_entry("s3", "s3://b/x", {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "none.json")})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(RepositoryUnavailable, match="failed to read TRITON_CLOUD_CREDENTIAL_PATH"):
        credential_entry("s3", "s3://b/x", {"TRITON_CLOUD_CREDENTIAL_PATH": str(tmp_path / "bad.json")})


def test_s3_settings_from_the_file_or_the_variables(tmp_path: Path) -> None:
    env = _file(
        tmp_path, {"s3": {"s3://b": {"key_id": "AK", "secret_key": "SK", "session_token": "T", "region": "r1"}}}
    )
    settings = s3_settings("s3://b/models", env)
    assert settings.credentials is not None and settings.region == "r1"
    assert (settings.credentials.access_key, settings.credentials.secret_key, settings.credentials.token) == (
        "AK",
        "SK",
        "T",
    )
    variables = {"AWS_ACCESS_KEY_ID": "AK2", "AWS_SECRET_ACCESS_KEY": "SK2", "AWS_DEFAULT_REGION": "r2"}
    settings = s3_settings("s3://b/models", variables)
    assert settings.credentials is not None and settings.credentials.access_key == "AK2" and settings.region == "r2"
    # with the file set, the variables are not read (Triton's way)
    with pytest.raises(RepositoryUnavailable, match="Cannot match credential"):
        s3_settings("s3://other/models", {**variables, **env})


# ----------------------------------------------------------------------------------------------------- gs


def _service_account_key(path: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    key = {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": "reader@p.iam.gserviceaccount.com",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path.write_text(json.dumps(key))


def test_gcs_emulator_variables() -> None:
    # no credentials with an emulator: anonymous, as the clients speak to one
    settings = gcs_settings("gs://b/m", {"STORAGE_EMULATOR_HOST": "localhost:4443"})
    assert settings.endpoint == "http://localhost:4443" and settings.credentials is None
    both = {"STORAGE_EMULATOR_HOST": "http://a:1", "CLOUD_STORAGE_EMULATOR_ENDPOINT": "https://b:2"}
    assert gcs_settings("gs://b/m", both).endpoint == "https://b:2"  # google-cloud-cpp's (Triton's) first


def test_gcs_credentials_files(tmp_path: Path) -> None:
    _service_account_key(tmp_path / "key.json")
    emulator = {"STORAGE_EMULATOR_HOST": "localhost:4443"}
    settings = gcs_settings("gs://b/m", {**emulator, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")})
    assert isinstance(settings.credentials, service_account.Credentials)
    assert settings.credentials.service_account_email == "reader@p.iam.gserviceaccount.com"
    env = {**emulator, **_file(tmp_path, {"gs": {"gs://b": str(tmp_path / "key.json"), "gs://b/x": "missing.json"}})}
    assert isinstance(gcs_settings("gs://b/m", env).credentials, service_account.Credentials)
    with pytest.raises(RepositoryUnavailable) as info:
        gcs_settings("gs://b/x/m", env)
    assert str(info.value).startswith(GCS_CLIENT_ERROR) and "missing.json" in str(info.value)
    (tmp_path / "external.json").write_text(json.dumps({"type": "external_account", "audience": "x"}))
    with pytest.raises(RepositoryUnavailable, match="its type is 'external_account'"):
        gcs_settings("gs://b/m", {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "external.json")})
    (tmp_path / "user.json").write_text(
        json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"})
    )
    user = gcs_settings("gs://b/m", {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "user.json")}).credentials
    assert user is not None and not isinstance(user, service_account.Credentials)
    env = {**emulator, **_file(tmp_path, {"gs": {"": {"not": "a path"}}})}
    with pytest.raises(RepositoryUnavailable, match="must be the path of a credentials file"):
        gcs_settings("gs://b/m", env)


# ----------------------------------------------------------------------------------------------------- as


def test_as_uri_forms() -> None:
    assert parse_as("as://acct/models/repo/") == AzureLocation("acct", "models", "repo/")
    assert parse_as("as://acct.blob.core.windows.net/models/repo") == AzureLocation("acct", "models", "repo")
    assert parse_as("as://acct/models") == AzureLocation("acct", "models", "")
    for bad in ("as://acct", "as://ACCT/models", "as://acct/Models/x", "as://acct/models/../x"):
        with pytest.raises(Exception):  # noqa: B017 (SourceError, with the reason)
            parse_as(bad)


def test_connection_strings() -> None:
    azurite = parse_connection_string(AZURITE)
    assert (azurite.account, azurite.endpoint, azurite.account_key) == (
        "devstoreaccount1",
        "http://127.0.0.1:10000/devstoreaccount1",
        AZURITE_KEY,
    )
    assert AZURITE_KEY not in repr(azurite)
    sas = parse_connection_string("BlobEndpoint=https://acct.blob.core.windows.net/;SharedAccessSignature=sv=1&sig=x")
    assert (sas.account, sas.endpoint, sas.account_key, sas.sas_token) == (
        "acct",
        "https://acct.blob.core.windows.net",
        None,
        "sv=1&sig=x",
    )
    with pytest.raises(RepositoryUnavailable) as info:
        parse_connection_string("AccountKey=secret-words")
    assert str(info.value).startswith(AZURE_CLIENT_ERROR) and "secret-words" not in str(info.value)


def test_azure_settings(tmp_path: Path) -> None:
    variables = {"AZURE_STORAGE_ACCOUNT": "other", "AZURE_STORAGE_KEY": "a2V5"}
    settings = azure_settings("as://acct/models/repo", variables)
    # Triton: AZURE_STORAGE_ACCOUNT names the account, whatever the URI's first part says
    assert settings.location == AzureLocation("other", "models", "repo/") and settings.endpoint is None
    assert settings.credential is not None and settings.credential.account_key == "a2V5"
    # a connection string: its endpoint, account and key when Triton's variables name none
    settings = azure_settings("as://devstoreaccount1/models", {"AZURE_STORAGE_CONNECTION_STRING": AZURITE})
    assert settings.endpoint == "http://127.0.0.1:10000/devstoreaccount1"
    assert settings.location == AzureLocation("devstoreaccount1", "models", "")
    assert settings.credential is not None and settings.credential.account_key == AZURITE_KEY
    # the file's account key of the longest prefix, with the connection string's endpoint
    env = {
        "AZURE_STORAGE_CONNECTION_STRING": AZURITE,
        **_file(tmp_path, {"as": {"as://devstoreaccount1": {"account_key": "a2V5"}}}),
    }
    settings = azure_settings("as://devstoreaccount1/models/x", env)
    assert settings.credential is not None and settings.credential.account_key == "a2V5"
    assert azure_settings("as://acct/models", {}).credential is None  # anonymous
    with pytest.raises(RepositoryUnavailable, match="not base64"):
        azure_settings("as://acct/models", {"AZURE_STORAGE_KEY": "not base64!"})
    with pytest.raises(RepositoryUnavailable, match="'managed_identity' is not supported"):
        azure_settings("as://acct/models", {"AZURE_STORAGE_AUTH_TYPE": "managed_identity"})
    with pytest.raises(RepositoryUnavailable, match="must be an object"):
        azure_settings("as://acct/models", _file(tmp_path, {"as": {"": "a string"}}))


# ----------------------------------------------------------------------------------------------- URIs


def test_cloud_uri_forms() -> None:
    assert all(is_cloud(u) for u in ("s3://b/x", "gs://b/x", "as://a/c/x")) and not is_cloud("az://a/c/x")
    for uri in (
        "s3://bucket/repo",
        "s3://host:9000/bucket/repo/",
        "gs://bucket",
        "gs://bucket/repo",
        "as://acct/models/r",
    ):
        check_uri(uri)
    for uri, said in (
        ("gs://bucket/repo/model.onnx", "names an object"),
        ("as://acct/models/repo/config.pbtxt", "names an object"),
        ("gs://UPPER/repo", "not a bucket name"),
        ("as://acct", "not a container name"),
    ):
        with pytest.raises(ValueError, match=said):
            check_uri(uri)
    assert mount_variable("gs://b/x") == "TRITON_GCS_MOUNT_DIRECTORY"
    assert mount_variable("as://a/c/x") == "TRITON_AZURE_MOUNT_DIRECTORY"
    assert mount_variable("s3://b/x") == "TRITON_AWS_MOUNT_DIRECTORY"


# ------------------------------------------------------------------------------------- the mirror


class MemoryStore:
    """A RepositoryStore over a dict: path -> (bytes, tag)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.reads: list[str] = []

    def list_objects(self, limit: int) -> list[StoredObject]:
        return [StoredObject(p, len(d), t, p) for p, (d, t) in sorted(self.objects.items())]

    def reader(self) -> MemoryStore:
        return self

    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        self.reads.append(file.locator)
        data = self.objects[file.locator][0][start : end + 1]
        yield RangeAnswer(206, f"bytes {start}-{end}/{file.size}", iter([data]))


def test_the_mirror_copies_changed_models_and_drops_deleted_ones(tmp_path: Path) -> None:
    store = MemoryStore()
    store.objects = {
        "a/config.pbtxt": (b"config a", "1"),
        "a/1/model.onnx": (b"model a", "1"),
        "b/1/model.onnx": (b"model b", "1"),
        "notes.txt": (b"beside the models", "1"),
        "c/../escape": (b"x", "1"),
    }
    mirror = CloudRepository("gs://bucket/repo", tmp_path / "local", store=store)
    try:
        assert mirror.sync() == ["a", "b"]
        assert (tmp_path / "local/a/1/model.onnx").read_bytes() == b"model a"
        assert not (tmp_path / "local/notes.txt").exists() and not (tmp_path / "escape").exists()
        assert mirror.sync() == [] and len(store.reads) == 3  # nothing changed: nothing read
        store.objects["b/1/model.onnx"] = (b"model b2", "2")  # a new change tag
        del store.objects["a/config.pbtxt"]
        del store.objects["a/1/model.onnx"]
        assert mirror.sync() == ["b", "a"]
        assert (tmp_path / "local/b/1/model.onnx").read_bytes() == b"model b2"
        assert not (tmp_path / "local/a").exists()
        assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["b"]  # no staging folder left
    finally:
        mirror.close()
