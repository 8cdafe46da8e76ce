"""``az://`` URIs and endpoints, checked before any connection: what names an account, a container, a blob or a
prefix, which endpoint a location is reached at, and which Secret data is a credential."""

from __future__ import annotations

import pytest
from kubeinfer.server.sources.azure import AzureBlobSource, account_url, credential_from
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.errors import INVALID, REFUSED, UNAUTHORIZED, SourceError
from kubeinfer.server.sources.uris import STORE_SCHEMES, AzureLocation, as_store_uri, parse_az, store_scheme

KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


@pytest.mark.parametrize(
    ("uri", "want"),
    [
        ("az://acct/models/m/model.onnx", AzureLocation("acct", "models", "m/model.onnx")),
        ("az://acct/models/saved/1/", AzureLocation("acct", "models", "saved/1/")),
        ("az://acct/models", AzureLocation("acct", "models", "")),
        (
            "az://devstoreaccount1/my-container/a b+c.bin",
            AzureLocation("devstoreaccount1", "my-container", "a b+c.bin"),
        ),
    ],
)
def test_az_uris_name_an_account_a_container_and_a_blob_or_prefix(uri: str, want: AzureLocation) -> None:
    got = parse_az(uri)
    assert got == want
    assert got.is_folder == (want.blob == "" or want.blob.endswith("/"))
    assert got.shown == f"az://{want.account}/{want.container}/{want.blob}"
    assert "az" in STORE_SCHEMES


@pytest.mark.parametrize(
    "uri",
    [
        "az://Acct/models/x",  # upper case
        "az://ab/models/x",  # too short
        "az://a-b/models/x",  # not a letter or digit
        "az://acct/Models/x",
        "az://acct/mo--dels/x",  # two hyphens
        "az://acct/-models/x",
        "az://acct/m/x",  # too short
        "az://acct/models/../x",
        "az://acct/models/a/./b",
        "az://acct/models//x",
        "az://acct/models/a\\b",
        "az://acct/models/a\nb",
        "az://acct/models/" + "x" * 1025,
        "az://acct",
    ],
)
def test_bad_az_uris_are_refused(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_az(uri)
    assert info.value.reason == INVALID


def test_the_endpoint_is_the_accounts_or_a_named_base_url() -> None:
    location = parse_az("az://acct/models/m")
    assert str(account_url(location, None)) == "https://acct.blob.core.windows.net"
    assert str(account_url(location, "https://acct.privatelink.example.com/")) == "https://acct.privatelink.example.com"
    # path style, the account in the path (Azurite)
    assert str(account_url(location, "http://127.0.0.1:10000/acct/")) == "http://127.0.0.1:10000/acct"
    for bad in ("ftp://x", "http://h/other", "http://h/acct?sv=1", "http://u:p@h/", "http://h/acct/x"):
        with pytest.raises(SourceError) as info:
            account_url(location, bad)
        assert info.value.reason == INVALID


def test_secret_data_names_a_sas_or_a_key_and_never_shows_it() -> None:
    sas = credential_from({"AZURE_STORAGE_SAS_TOKEN": "?sv=2024-01-01&sp=rl&sig=abc%3D"})
    assert sas.sas_token == "sv=2024-01-01&sp=rl&sig=abc%3D" and sas.account_key is None
    assert credential_from({"sasToken": "sp=r&sig=x"}).sas_token == "sp=r&sig=x"
    key = credential_from({"accountKey": KEY})
    assert key.account_key == KEY and KEY not in repr(key) and "sig=" not in repr(sas)
    assert credential_from({"AZURE_STORAGE_KEY": KEY}).account_key == KEY
    for data in ({}, {"sasToken": "sv=1&sp=r"}, {"accountKey": "not base64!"}, {"sasToken": "sig=a b"}):
        with pytest.raises(SourceError) as info:
            credential_from(data)
        assert info.value.reason == UNAUTHORIZED
        assert "not base64!" not in info.value.message


def test_a_key_signs_a_read_and_list_sas_for_the_container_only() -> None:
    client = StoreClient()
    try:
        source = AzureBlobSource(
            client, parse_az("az://acct/models/m/x.onnx"), "ns", credential=credential_from({"accountKey": KEY})
        )
        url = source._url("m/x.onnx", [])
        assert url.host == "acct.blob.core.windows.net" and url.path == "/models/m/x.onnx"
        query = dict(p.split("=", 1) for p in url.query.decode().split("&"))
        assert query["sp"] == "rl" and query["sr"] == "c" and "sig" in query and KEY not in str(url)
        # the admission of the endpoint, before a connection: a metadata address is refused
        refused = AzureBlobSource(client, parse_az("az://acct/models/x"), "ns", endpoint="http://169.254.169.254/acct")
        with pytest.raises(SourceError) as info:
            refused.head("x")
        assert info.value.reason == REFUSED
    finally:
        client.close()


@pytest.mark.parametrize(
    ("uri", "scheme", "as_az"),
    [
        # KServe's storageUri form: read by the Azure store, as the az:// location it names
        ("https://acct.blob.core.windows.net/models/m/model.onnx", "az", "az://acct/models/m/model.onnx"),
        ("https://acct.blob.core.windows.net/models/saved/1/", "az", "az://acct/models/saved/1/"),
        ("https://acct.blob.core.windows.net/models/a%20b.bin", "az", "az://acct/models/a b.bin"),
        # a pre-signed SAS URL, another host, plain http: an https download like any other (with its sha256)
        ("https://acct.blob.core.windows.net/models/m.onnx?sv=2024&sig=x", "", None),
        ("https://acct.blob.core.windows.net.evil.example/models/m.onnx", "", None),
        ("https://Acct.blob.core.windows.net/models/m.onnx", "", None),
        ("http://acct.blob.core.windows.net/models/m.onnx", "", None),
        ("https://acct.blob.core.windows.net/", "", None),
        ("az://acct/models/m.onnx", "az", "az://acct/models/m.onnx"),
        ("s3://bucket/m.onnx", "s3", "s3://bucket/m.onnx"),
        ("https://example.com/m.onnx", "", None),
    ],
)
def test_an_azure_blob_url_is_read_by_the_azure_store(uri: str, scheme: str, as_az: str | None) -> None:
    assert store_scheme(uri) == scheme
    assert as_store_uri(uri) == (as_az or uri)
    if scheme == "az":
        assert parse_az(as_store_uri(uri)).account == "acct"
