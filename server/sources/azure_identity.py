"""``az://`` sources read with the operator's own Azure identity: Microsoft Entra Workload ID, through the guard.

azure-identity does what it is for: ``WorkloadIdentityCredential`` (its public class) reads what AKS's
workload-identity webhook injects into the operator's pod (``AZURE_CLIENT_ID``, ``AZURE_TENANT_ID``,
``AZURE_FEDERATED_TOKEN_FILE``, ``AZURE_AUTHORITY_HOST``), exchanges the projected service-account token for an
access token to Azure Storage (scope ``https://storage.azure.com/.default``) at the authority's token endpoint, and
caches and refreshes that token itself. It never opens a connection: its azure-core pipeline is given
``GuardedTransport`` (the credential's documented ``transport=`` keyword), our implementation of azure-core's public
``HttpTransport`` whose every request is sent by ``client.StoreClient``: the guarded httpcore pool, each address
checked where the connection is made, no redirect followed. The token endpoint is the operator's own (the webhook's
variables, the admin's cloud), so its requests go through a client of their own (``ambient_client``: public
addresses, any host), as the Google workload identity's do.

The access token is a bearer: ``AzureBlobSource`` sends it (``Authorization: Bearer``) to the account's public
endpoint only (``operator/sources/store_sources.py`` refuses a tenant's ``source.endpoint``), over https only. It
is never logged and never in a message: messages name URLs through ``client.shown``, and the credential's failures are
reduced here to Entra ID's error code and the first line of its description.
"""

from __future__ import annotations

import http
import json
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import httpx
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import HttpTransport
from azure.core.rest import HttpRequest, HttpResponse
from azure.core.utils import case_insensitive_dict

from .client import StoreClient
from .egress import AddressPolicy
from .errors import UNAUTHORIZED, UNAVAILABLE, SourceError, printable

#: the one scope asked for: Azure Storage (the token's audience is https://storage.azure.com)
STORAGE_SCOPE = "https://storage.azure.com/.default"
#: the variables AKS's workload-identity webhook injects (AZURE_AUTHORITY_HOST too: the cloud's Entra ID)
WORKLOAD_VARIABLES = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE")
#: the largest token answer read (Entra ID's are a few kB)
MAX_TOKEN_ANSWER = 1 << 20
#: tries of one token request (azure-core's retry policy: a connection failure, 408/429/5xx), beyond the first
TOKEN_RETRIES = 2
#: headers our client sets itself (one of each), or that must not reach the wire from the pipeline
_OWN_HEADERS = {"host", "user-agent", "accept-encoding", "content-length", "transfer-encoding", "connection"}
_UNSET_HINT = (
    "the operator has no Azure workload identity ("
    + ", ".join(WORKLOAD_VARIABLES)
    + " are not set: label the operator's pods azure.workload.identity/use=true and annotate its service account "
    "with azure.workload.identity/client-id)"
)


# ------------------------------------------------------------------------------------- azure-core's transport


class GuardedAnswer(HttpResponse):
    """A token endpoint's answer, read whole: azure-core's public ``azure.core.rest.HttpResponse`` ("use this
    abstract base class to create your own transport responses")."""

    def __init__(self, request: HttpRequest, status: int, headers: Mapping[str, str], content: bytes) -> None:
        self._request = request
        self._status = status
        self._headers: MutableMapping[str, str] = case_insensitive_dict(headers)
        self._content = content
        self._encoding: str | None = None

    @property
    def request(self) -> HttpRequest:
        return self._request

    @property
    def status_code(self) -> int:
        return self._status

    @property
    def headers(self) -> MutableMapping[str, str]:
        return self._headers

    @property
    def reason(self) -> str:
        try:
            return http.HTTPStatus(self._status).phrase
        except ValueError:
            return ""

    @property
    def content_type(self) -> str | None:
        return self._headers.get("content-type")

    @property
    def is_closed(self) -> bool:
        return True

    @property
    def is_stream_consumed(self) -> bool:
        return True

    @property
    def encoding(self) -> str | None:
        if self._encoding is None:
            charset = (self.content_type or "").partition("charset=")[2].split(";")[0].strip().strip('"')
            self._encoding = charset or "utf-8"
        return self._encoding

    @encoding.setter
    def encoding(self, value: str | None) -> None:
        self._encoding = value

    @property
    def url(self) -> str:
        return str(self._request.url)

    @property
    def content(self) -> bytes:
        return self._content

    def text(self, encoding: str | None = None) -> str:
        return self._content.decode(encoding or self.encoding or "utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self._content) if self._content else None

    def raise_for_status(self) -> None:
        if self._status >= 400:
            raise HttpResponseError(response=self)

    def __enter__(self) -> GuardedAnswer:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()

    def close(self) -> None:
        pass

    def read(self) -> bytes:
        return self._content

    def iter_raw(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content

    def iter_bytes(self, **kwargs: Any) -> Iterator[bytes]:
        yield self._content


def request_body(request: HttpRequest) -> bytes:
    """The request's body as bytes: its ``content`` (the public attribute: bytes, text, or a form's fields, which
    azure-identity's token grants are); a stream or files are not sent."""
    content = request.content
    if content is None:
        return b""
    if isinstance(content, bytes):
        return content
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, Mapping):  # form fields: what requests would send as application/x-www-form-urlencoded
        return urllib.parse.urlencode(list(content.items()), doseq=True).encode("ascii")
    raise ServiceRequestError("the guarded transport sends only whole bodies (bytes, text or form fields)")


class GuardedTransport(HttpTransport[HttpRequest, HttpResponse]):
    """azure-core's HTTP transport (its public ``HttpTransport``) over ``StoreClient.request``: each request of the
    pipeline (azure-identity's token grant) is admitted for ``namespace`` and sent through the guarded pool; its
    answer is read whole (at most MAX_TOKEN_ANSWER bytes). No redirect is followed and no other socket is opened:
    the pipeline's proxy and TLS options (``proxies``, ``connection_verify``...) are ignored, the client's own CA
    and egress rules hold.

    A URL the guard or the host rules refuse raises SourceError (REFUSED) through azure-identity unchanged; a
    failed connection is azure-core's ServiceRequestError (retried by its retry policy), whose message is our
    fixed phrase, never the request's body (the federated token)."""

    def __init__(self, client: StoreClient, namespace: str = "", where: str = "the token request") -> None:
        self.client = client
        self.namespace = namespace
        self.where = where

    def send(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        url = httpx.URL(str(request.url))
        headers = {k: str(v) for k, v in request.headers.items() if k.lower() not in _OWN_HEADERS}
        timeout = kwargs.get("read_timeout") or kwargs.get("connection_timeout")
        try:
            with self.client.request(
                request.method,
                url,
                headers,
                namespace=self.namespace,
                where=self.where,
                body=request_body(request),
                timeout=float(timeout) if isinstance(timeout, int | float) and timeout > 0 else None,
            ) as answer:
                return GuardedAnswer(request, answer.status, answer.headers, answer.read(MAX_TOKEN_ANSWER))
        except SourceError as exc:
            if exc.reason != UNAVAILABLE:
                raise  # refused by the guard or the host rules: passed on unchanged
            raise ServiceRequestError(exc.message) from None

    def open(self) -> None:
        pass  # the client's pool is open

    def close(self) -> None:
        pass  # the client is shared: its owner closes it

    def __enter__(self) -> GuardedTransport:
        return self

    def __exit__(self, *args: Any) -> None:
        pass


# ------------------------------------------------------------------------------------------- the token


class StorageToken:
    """Access tokens to Azure Storage from one azure-core ``TokenCredential`` (cached and refreshed by it), as the
    ``Authorization`` header of a blob request; SourceError in words that name neither token nor assertion."""

    def __init__(self, credential: TokenCredential, *, scope: str = STORAGE_SCOPE, what: str = "workload identity"):
        self.credential = credential
        self.scope = scope
        self.what = what
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never a token
        return f"StorageToken({type(self.credential).__name__}, scope={self.scope!r})"

    def authorization(self, shown: str) -> str:
        """``Bearer <token>`` for a request about ``shown`` (a location, for messages)."""
        try:
            with self._lock:  # one token request at a time; the others then find it cached
                token = self.credential.get_token(self.scope).token
        except SourceError as exc:
            raise SourceError(exc.reason, f"{shown}: the {self.what} token request: {exc.message}") from None
        except ClientAuthenticationError as exc:
            said = _said(exc)
            status = exc.status_code or 0
            if status in (408, 429) or status >= 500:
                raise SourceError(
                    UNAVAILABLE, f"{shown}: Microsoft Entra ID is unavailable ({said}); retried"
                ) from None
            raise SourceError(
                UNAUTHORIZED, f"{shown}: no access token from the operator's {self.what} ({said})"
            ) from None
        except (ServiceRequestError, ServiceResponseError, HttpResponseError) as exc:
            raise SourceError(
                UNAVAILABLE, f"{shown}: the {self.what} token request failed ({_said(exc)}); retried"
            ) from None
        except (AzureError, ValueError, OSError) as exc:
            # a token file that cannot be read, a refused configuration: the kind only (azure-core's words may
            # quote a path, never a token, but they are not ours to pass on)
            raise SourceError(
                UNAUTHORIZED, f"{shown}: the operator's {self.what} is not usable ({type(exc).__name__})"
            ) from None
        if not token or any(c.isspace() or not c.isprintable() for c in token):
            raise SourceError(UNAUTHORIZED, f"{shown}: the operator's {self.what} gave no usable access token")
        return f"Bearer {token}"


def _said(exc: AzureError) -> str:
    """The first line of an azure-core error's message, printable and short (Entra ID's code and description)."""
    message = str(exc.message or "") if hasattr(exc, "message") else ""
    return printable(message.strip().split("\n")[0], 200) or type(exc).__name__


# ------------------------------------------------------------------------------------- the operator's identity


def workload_identity(
    client: StoreClient, environ: Mapping[str, str] = os.environ, *, retries: int = TOKEN_RETRIES
) -> StorageToken | None:
    """azure-identity's ``WorkloadIdentityCredential`` from the webhook's variables in ``environ`` (None when they
    are not all set), its requests sent by ``client`` through ``GuardedTransport``."""
    values = {name: (environ.get(name) or "").strip() for name in WORKLOAD_VARIABLES}
    if not all(values.values()):
        return None
    from azure.identity import WorkloadIdentityCredential  # the operator's; a server never imports it

    try:
        credential = WorkloadIdentityCredential(
            tenant_id=values["AZURE_TENANT_ID"],
            client_id=values["AZURE_CLIENT_ID"],
            token_file_path=values["AZURE_FEDERATED_TOKEN_FILE"],
            # the cloud's Entra ID (azure-identity's default: login.microsoftonline.com); https only
            authority=(environ.get("AZURE_AUTHORITY_HOST") or "").strip() or None,
            transport=GuardedTransport(client, "", "the workload identity's token request"),
            retry_total=retries,
        )
    except ValueError as exc:
        raise SourceError(UNAUTHORIZED, f"the operator's Azure workload identity is not usable ({exc})") from None
    return StorageToken(credential, what="Azure workload identity")


def ambient_client() -> StoreClient:
    """The client of the operator's own token requests: public addresses only, any host."""
    return StoreClient(AddressPolicy(), timeout=30.0)


_ambient_lock = threading.Lock()
_ambient: StorageToken | None = None


def ambient_identity() -> StorageToken:
    """The operator's own workload identity, made once (its token cache lives as long as the process), through
    the ambient client; SourceError (UNAUTHORIZED) when the pod has none."""
    global _ambient
    with _ambient_lock:
        if _ambient is None:
            _ambient = workload_identity(ambient_client())
        if _ambient is None:
            raise SourceError(UNAUTHORIZED, _UNSET_HINT)
        return _ambient


#: what StoreSources asks for the operator's identity (a test gives its own)
IdentityFactory = Callable[[], StorageToken]
