"""The stores a cloud model repository lives in (``s3://``, ``gs://``, ``as://``), reached as Triton reaches them.

The mirror (mirror.py) sees a store through one small protocol, ``RepositoryStore``: every object under the
repository's prefix as (path relative to it, size, change tag: an ETag, a generation), and a ``RangeReader`` that
``transfer.download`` reads them with. One adapter per scheme wraps the operator's sources (S3Source, GcsSource,
AzureBlobSource) and turns a listing that fails into ``RepositoryUnavailable`` in Triton's words.

Credentials as Triton reads them (core's ``filesystem/api.cc`` and ``implementations/{s3,gcs,as}.h``):

* ``TRITON_CLOUD_CREDENTIAL_PATH`` set: its JSON file is the only place credentials come from. Its ``s3``, ``gs``
  and ``as`` sections map path prefixes to credentials; the longest prefix of the repository's path wins, and
  none matching is Triton's error ``Cannot match credential for path  <path>``. ``s3``: ``key_id``,
  ``secret_key``, ``session_token``, ``region`` (no keys: botocore's default chain). ``gs``: the path of a
  credentials file. ``as``: ``account_str``, ``account_key`` (``auth_type`` other than ``key`` is refused).
* Otherwise the environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``/
  ``AWS_DEFAULT_REGION`` (else botocore's chain); ``GOOGLE_APPLICATION_CREDENTIALS`` (else google-auth's
  application default credentials: the metadata server; none: anonymous); ``AZURE_STORAGE_ACCOUNT``/
  ``AZURE_STORAGE_KEY`` (none: anonymous).

Emulators, as their clients find them: ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (google-cloud-cpp, Triton's client) or
``STORAGE_EMULATOR_HOST`` (google-cloud-storage for Python and Go) replace storage.googleapis.com, and without a
credentials file the requests are anonymous, as those clients make them; ``AZURE_STORAGE_CONNECTION_STRING``
(read with azure-storage-blob) gives the blob endpoint (``BlobEndpoint=...``, Azurite's path-style one too), the
account, and its key or SAS when Triton's variables name none.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import google.auth.credentials
import google.auth.exceptions
import google.oauth2.credentials
import httpx
from azure.storage.blob import BlobServiceClient
from botocore.credentials import Credentials
from google.oauth2 import service_account

from .azure import DEFAULT_SUFFIX, AzureBlobSource, AzureCredential
from .client import StoreClient
from .errors import NOT_FOUND, UNAUTHORIZED, SourceError, printable
from .gcs import DEFAULT_ENDPOINT as GCS_DEFAULT_ENDPOINT
from .gcs import READ_ONLY_SCOPE, GcsSource
from .gcs import ambient_credentials as gcs_ambient_credentials
from .s3 import S3Endpoint, S3Source
from .s3 import ambient_credentials as s3_ambient_credentials
from .transfer import RangeReader
from .uris import AzureLocation, parse_az, parse_gs, parse_s3, scheme_of

CREDENTIAL_PATH = "TRITON_CLOUD_CREDENTIAL_PATH"
#: Triton's variables naming the folder a repository is copied into, per scheme
MOUNT_VARIABLES = {
    "s3": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs": "TRITON_GCS_MOUNT_DIRECTORY",
    "as": "TRITON_AZURE_MOUNT_DIRECTORY",
}
#: the emulator variables of Cloud Storage's clients, google-cloud-cpp's (Triton's) first
GCS_EMULATOR_VARIABLES = ("CLOUD_STORAGE_EMULATOR_ENDPOINT", "STORAGE_EMULATOR_HOST")
#: one model's copy may take this long (the mirror's deadline; an Azure SAS signed here outlives it)
COPY_DEADLINE = 3600.0
#: an Azure SAS is signed again when older than this, so every copy starts with one valid for COPY_DEADLINE
SAS_RESIGN_AFTER = 900.0

# Triton's words (core: CheckClient of implementations/{s3,gcs,as}.h, GetDirectoryContents of gcs.h,
# ListDirectory of as.h)
S3_CLIENT_ERROR = "Unable to create S3 filesystem client. Check account credentials."
GCS_CLIENT_ERROR = "Unable to create GCS client. Check account credentials."
AZURE_CLIENT_ERROR = "Unable to create Azure filesystem client. Check account credentials."
#: what a refused listing or read tells the server's operator to check (Triton's variables, not the operator's Secret)
GCS_REFUSAL_HINT = (
    "check GOOGLE_APPLICATION_CREDENTIALS or the 'gs' section of TRITON_CLOUD_CREDENTIAL_PATH, and that its account "
    "may read the bucket"
)
AZURE_REFUSAL_HINT = (
    "check AZURE_STORAGE_ACCOUNT/AZURE_STORAGE_KEY, AZURE_STORAGE_CONNECTION_STRING or the 'as' section of "
    "TRITON_CLOUD_CREDENTIAL_PATH"
)


class RepositoryUnavailable(Exception):
    """The repository cannot be read (Triton's words for it)."""


@dataclass(frozen=True)
class StoredObject:
    """One object of the repository: its path below the repository's prefix, its size, what changes when it does
    (an ETag, a generation), and the store's handle for reading it (a RemoteFile's locator)."""

    path: str
    size: int
    tag: str
    locator: Any


class RepositoryStore(Protocol):
    def list_objects(self, limit: int) -> list[StoredObject]:
        """Every object under the repository's prefix (folder markers left out); RepositoryUnavailable when the
        store cannot be listed."""
        ...

    def reader(self) -> RangeReader:
        """What reads the listed objects' bytes (for one model's copy)."""
        ...


# ------------------------------------------------------------------------------------------ credentials


def credential_entry(scheme: str, uri: str, env: Mapping[str, str]) -> tuple[bool, Any]:
    """(True, the entry of the longest prefix of ``uri`` in the file's ``scheme`` section) when
    TRITON_CLOUD_CREDENTIAL_PATH is set, else (False, None): the environment's variables apply."""
    path = env.get(CREDENTIAL_PATH)
    if not path:
        return False, None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RepositoryUnavailable(f"failed to read {CREDENTIAL_PATH} '{path}': {exc}") from None
    section = doc.get(scheme) if isinstance(doc, dict) else None
    prefixes = [p for p in section if uri.startswith(p)] if isinstance(section, dict) else []
    if not prefixes:
        raise RepositoryUnavailable(f"Cannot match credential for path  {uri}")  # Triton's words, two spaces
    assert isinstance(section, dict)
    return True, section[max(prefixes, key=len)]


@dataclass(frozen=True)
class S3Settings:
    credentials: Credentials | None
    region: str | None


def s3_settings(uri: str, env: Mapping[str, str] = os.environ) -> S3Settings:
    """Credentials and region for ``uri``, in Triton's order (see the module's docstring)."""
    from_file, entry = credential_entry("s3", uri, env)
    if from_file:
        entry = entry if isinstance(entry, dict) else {}
        key, secret = str(entry.get("key_id") or ""), str(entry.get("secret_key") or "")
        region = str(entry.get("region") or "") or None
        if key and secret:
            return S3Settings(Credentials(key, secret, entry.get("session_token") or None), region)
        return S3Settings(s3_ambient_credentials(), region)  # Triton: the AWS SDK's default chain
    region = env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        token = env.get("AWS_SESSION_TOKEN") or None
        return S3Settings(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], token), region)
    return S3Settings(s3_ambient_credentials(), region)  # refreshable (web identity, instance role)


def gcs_emulator(env: Mapping[str, str]) -> str | None:
    """The emulator's base URL its variables name (``host:port`` alone is http, as the clients take it)."""
    for name in GCS_EMULATOR_VARIABLES:
        value = (env.get(name) or "").strip()
        if value:
            return value if "://" in value else f"http://{value}"
    return None


@dataclass(frozen=True)
class GcsSettings:
    endpoint: str
    credentials: google.auth.credentials.Credentials | None
    #: the client of the process's own token flows (the metadata server), for application default credentials
    token_client: StoreClient | None = None


def gcs_settings(uri: str, env: Mapping[str, str] = os.environ) -> GcsSettings:
    """Endpoint and credentials for ``uri`` (see the module's docstring)."""
    emulator = gcs_emulator(env)
    from_file, entry = credential_entry("gs", uri, env)
    if from_file and not isinstance(entry, str):
        raise RepositoryUnavailable(
            f"{GCS_CLIENT_ERROR} The 'gs' entry of {CREDENTIAL_PATH} for '{uri}' must be the path of a credentials file"
        )
    key_path = entry if from_file else env.get("GOOGLE_APPLICATION_CREDENTIALS", "")
    endpoint = emulator or GCS_DEFAULT_ENDPOINT
    if key_path:
        return GcsSettings(endpoint, gcs_credentials_file(key_path))
    if emulator:
        return GcsSettings(endpoint, None)  # anonymous, as the clients speak to an emulator
    ambient, token_client = gcs_ambient_credentials()  # the metadata server; none: anonymous, as Triton
    return GcsSettings(endpoint, ambient, token_client)


def gcs_credentials_file(path: str) -> google.auth.credentials.Credentials:
    """The credentials of a JSON file, of the two types Triton reads (google-cloud-cpp's
    CreateAuthorizedUserCredentialsFromJsonFilePath, CreateServiceAccountCredentialsFromJsonFilePath): a user's
    (``authorized_user``) or a service account's key, with the read-only scope."""
    try:
        info = json.loads(Path(path).read_text())
        kind = info.get("type") if isinstance(info, dict) else None
        if kind == "service_account":
            key: google.auth.credentials.Credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                info, scopes=[READ_ONLY_SCOPE]
            )
            return key
        if kind == "authorized_user":
            make = google.oauth2.credentials.Credentials.from_authorized_user_info
            user: google.auth.credentials.Credentials = make(info, scopes=[READ_ONLY_SCOPE])  # type: ignore[no-untyped-call]
            return user
        said = f"its type is {printable(str(kind), 40)!r}, not 'service_account' or 'authorized_user'"
    except OSError as exc:
        said = printable(exc.strerror or "unreadable", 80)
    except ValueError:
        said = "not JSON, or not a usable key (it needs client_email, private_key and token_uri)"
    except (KeyError, TypeError, google.auth.exceptions.GoogleAuthError):
        said = "not a usable key (it needs client_email, private_key and token_uri)"
    raise RepositoryUnavailable(f"{GCS_CLIENT_ERROR} The credentials file '{path}': {said}")


def parse_as(uri: str) -> AzureLocation:
    """Triton's ``as://<account>/<container>/<path>`` (the account may be written as its host,
    ``<account>.blob.core.windows.net``, as Triton's pattern allows)."""
    host, _, rest = uri[len("as://") :].partition("/")
    account = host.removesuffix(f".{DEFAULT_SUFFIX}")
    try:
        return parse_az(f"az://{account}/{rest}")
    except SourceError as exc:
        raise SourceError(exc.reason, exc.message.replace("az:// URI", "as:// URI")) from None


@dataclass(frozen=True)
class ConnectionString:
    """What an Azure Storage connection string names, as azure-storage-blob reads it."""

    account: str
    #: the blob endpoint, without a query (``http://127.0.0.1:10000/devstoreaccount1`` for Azurite)
    endpoint: str
    account_key: str | None
    sas_token: str | None

    def __repr__(self) -> str:  # never the secrets
        return f"ConnectionString(account={self.account!r}, endpoint={self.endpoint!r})"


def parse_connection_string(text: str) -> ConnectionString:
    try:
        service = BlobServiceClient.from_connection_string(text)
    except (ValueError, TypeError):
        raise RepositoryUnavailable(
            f"{AZURE_CLIENT_ERROR} AZURE_STORAGE_CONNECTION_STRING is not a storage connection string"
        ) from None
    url = httpx.URL(service.url)
    key = getattr(service.credential, "account_key", None)  # the shared key azure-storage-blob signs with
    sas = url.query.decode("ascii", "replace") or None
    endpoint = str(url.copy_with(query=None)).rstrip("/")
    return ConnectionString(service.account_name or "", endpoint, key if isinstance(key, str) else None, sas)


@dataclass(frozen=True)
class AzureSettings:
    #: the container and prefix, in the account Triton's settings name (``account_str``, else the URI's)
    location: AzureLocation
    #: the blob endpoint (a connection string's), else None: ``https://<account>.blob.core.windows.net``
    endpoint: str | None
    credential: AzureCredential | None


def azure_settings(uri: str, env: Mapping[str, str] = os.environ) -> AzureSettings:
    """Account, endpoint and credential for ``uri`` (see the module's docstring)."""
    named = parse_as(uri.rstrip("/") + "/")
    text = env.get("AZURE_STORAGE_CONNECTION_STRING") or ""
    connection = parse_connection_string(text) if text.strip() else None
    from_file, entry = credential_entry("as", uri, env)
    if from_file:
        if not isinstance(entry, dict):
            raise RepositoryUnavailable(
                f"{AZURE_CLIENT_ERROR} The 'as' entry of {CREDENTIAL_PATH} for '{uri}' must be an object "
                '({"account_str": ..., "account_key": ...})'
            )
        account, key, auth = (str(entry.get(k) or "") for k in ("account_str", "account_key", "auth_type"))
    else:
        account, key, auth = (
            env.get(k, "") for k in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "AZURE_STORAGE_AUTH_TYPE")
        )
    if auth and auth != "key":
        raise RepositoryUnavailable(
            f"{AZURE_CLIENT_ERROR} Authentication type '{printable(auth, 40)}' is not supported here: give the "
            "account's key (AZURE_STORAGE_KEY, or account_key in the credential file)"
        )
    account = account or (connection.account if connection else "") or named.account
    try:
        location = parse_az(f"az://{account}/{named.container}/{named.blob}")
    except SourceError as exc:
        raise RepositoryUnavailable(f"{AZURE_CLIENT_ERROR} {exc.message}") from None
    credential = None
    if key:
        try:
            base64.b64decode(key, validate=True)
        except (binascii.Error, ValueError):
            raise RepositoryUnavailable(f"{AZURE_CLIENT_ERROR} The account key is not base64") from None
        credential = AzureCredential(account_key=key)
    elif connection is not None and connection.account_key:
        credential = AzureCredential(account_key=connection.account_key)
    elif connection is not None and connection.sas_token:
        credential = AzureCredential(sas_token=connection.sas_token)
    return AzureSettings(location, connection.endpoint if connection else None, credential)


# ------------------------------------------------------------------------------------------- adapters


class S3RepositoryStore:
    def __init__(self, uri: str, client: StoreClient, env: Mapping[str, str]) -> None:
        self.uri = uri
        location = parse_s3(uri.rstrip("/") + "/")
        settings = s3_settings(uri, env)
        endpoint = S3Endpoint.of(location, None, settings.region, None)
        self.source = S3Source(client, location, endpoint, settings.credentials, namespace="")

    def list_objects(self, limit: int) -> list[StoredObject]:
        try:
            listed = self.source.list_folder(limit)
        except SourceError as exc:
            if exc.reason in (UNAUTHORIZED, NOT_FOUND):  # Triton's HeadBucket check fails for both
                raise RepositoryUnavailable(
                    f"{S3_CLIENT_ERROR} Exception: '{exc.reason}' Message: '{exc.message}'"
                ) from None
            raise RepositoryUnavailable(f"failed to list {self.uri}: {exc.message}") from None
        prefix = self.source.location.key
        return [StoredObject(o.key[len(prefix) :], o.size, o.etag, (o.key, None)) for o in listed]

    def reader(self) -> RangeReader:
        return self.source


class GcsRepositoryStore:
    def __init__(self, uri: str, client: StoreClient, env: Mapping[str, str]) -> None:
        self.uri = uri
        location = parse_gs(uri.rstrip("/") + "/")
        settings = gcs_settings(uri, env)
        try:
            self.source = GcsSource(
                client,
                location,
                "",
                endpoint=settings.endpoint,
                credentials=settings.credentials,
                token_client=settings.token_client,
                token_namespace="",
                refusal_hint=GCS_REFUSAL_HINT,
            )
        except SourceError:
            raise RepositoryUnavailable(
                f"{GCS_CLIENT_ERROR} The emulator endpoint '{settings.endpoint}' is not http(s)://host[:port]"
            ) from None

    def list_objects(self, limit: int) -> list[StoredObject]:
        try:
            listed = self.source.list_folder(limit)
        except SourceError as exc:
            # Triton lists a repository's folders with GetDirectoryContents: a missing bucket or refused
            # credentials fail there, in these words
            raise RepositoryUnavailable(f"Could not list contents of directory at {self.uri} : {exc.message}") from None
        return [StoredObject(f.path, f.size, str(f.locator[1]), f.locator) for _, f in listed]

    def reader(self) -> RangeReader:
        return self.source


class AzureRepositoryStore:
    """The SAS an account key signs is short-lived: a fresh one is signed (locally) every SAS_RESIGN_AFTER."""

    def __init__(self, uri: str, client: StoreClient, env: Mapping[str, str]) -> None:
        self.uri = uri
        self.client = client
        self.settings = azure_settings(uri, env)
        self._made = 0.0
        self._source = self._new_source()

    def _new_source(self) -> AzureBlobSource:
        try:
            source = AzureBlobSource(
                self.client,
                self.settings.location,
                "",
                endpoint=self.settings.endpoint,
                credential=self.settings.credential,
                lifetime=COPY_DEADLINE,
                refusal_hint=AZURE_REFUSAL_HINT,
            )
        except SourceError as exc:
            raise RepositoryUnavailable(f"{AZURE_CLIENT_ERROR} {exc.message}") from None
        self._made = time.monotonic()
        return source

    def _current(self) -> AzureBlobSource:
        if time.monotonic() - self._made > SAS_RESIGN_AFTER:
            self._source = self._new_source()
        return self._source

    def list_objects(self, limit: int) -> list[StoredObject]:
        source = self._current()
        try:
            listed = source.list_folder(limit)
        except SourceError as exc:
            # Triton's ListDirectory (its folders' listing) fails so for a missing container or a refused key
            folder = self.settings.location.blob.rstrip("/")
            raise RepositoryUnavailable(f"Failed to get contents of directory {folder}:{exc.message}") from None
        prefix = self.settings.location.blob
        return [StoredObject(b.name[len(prefix) :], b.size, b.etag, (b.name, b.version_id, b.etag)) for b in listed]

    def reader(self) -> RangeReader:
        return self._current()


def open_store(uri: str, client: StoreClient, env: Mapping[str, str] = os.environ) -> RepositoryStore:
    """The store of the cloud repository ``uri`` (as given: credential prefixes are matched against it)."""
    scheme = scheme_of(uri)
    try:
        if scheme == "s3":
            return S3RepositoryStore(uri, client, env)
        if scheme == "gs":
            return GcsRepositoryStore(uri, client, env)
        if scheme == "as":
            return AzureRepositoryStore(uri, client, env)
    except SourceError as exc:
        raise RepositoryUnavailable(f"--model-repository '{uri}': {exc.message}") from None
    raise RepositoryUnavailable(f"'{uri}' is not a cloud repository (s3://, gs://, as://)")


def check_uri(uri: str) -> None:
    """A cloud repository URI's form, before anything starts (ValueError with the reason)."""
    scheme = scheme_of(uri)
    try:
        if scheme == "s3":
            key = parse_s3(uri).key
        elif scheme == "gs":
            key = parse_gs(uri).name
        elif scheme == "as":
            key = parse_as(uri).blob
        else:
            raise ValueError(f"--model-repository '{uri}': not s3://, gs:// or as://")
    except SourceError as exc:
        raise ValueError(f"--model-repository '{uri}': {exc.message}") from None
    if key and not key.endswith("/") and "." in key.rsplit("/", 1)[-1]:
        raise ValueError(f"--model-repository '{uri}' names an object; name the repository's folder")


def mount_variable(uri: str) -> str:
    """Triton's variable naming the local folder ``uri``'s models are copied into."""
    return MOUNT_VARIABLES.get(scheme_of(uri), "TRITON_AWS_MOUNT_DIRECTORY")
