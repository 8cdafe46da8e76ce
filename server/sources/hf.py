"""``hf://`` sources: model repositories of the Hugging Face Hub (or a Hub-compatible endpoint), through the guard.

huggingface_hub does what it is for: ``HfApi.model_info`` resolves the revision to a commit,
``HfApi.list_repo_tree`` lists the files at that commit (sizes, and the sha256 of each LFS file), and
``hf_hub_url`` names a file's resolve URL. Its HTTP client is the one ``huggingface_hub.set_client_factory``
(public since 1.0) makes: an httpx client whose transport, ``GuardedTransport``, sends every request through
``client.StoreClient`` (the guarded httpcore pool, each host admitted for the namespace, redirects followed
hop by hop). The library keeps one client per process, so the transport reads the StoreClient and the
namespace from the calling thread (set by ``HfSource`` around each call); a request from any other
caller of huggingface_hub in the process is refused, never sent unguarded. The file bytes are ranged GETs
of the resolve URL at the commit, sent by the StoreClient itself: the Hub answers an LFS file with a redirect
to its CDN, which is admitted like the first hop and gets no token.

Content is pinned by the commit (recorded in the status as ``hf-commit <sha>``), and each LFS file by its
sha256, checked while streaming; a small file kept in git is pinned by the commit alone.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import huggingface_hub
from huggingface_hub import HfApi, RepoFile, RepoFolder, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

# the HTTP module huggingface_hub's clients come from (httpx before 2.0, httpx2 since), as the library exports it
# since 1.32 for code that supports both (the ignore: its __all__ is computed, so mypy misses the export)
from huggingface_hub.utils import httpx as hub_http  # type: ignore[attr-defined]

from .client import StoreClient
from .errors import INVALID, NOT_FOUND, REFUSED, TOO_LARGE, UNAUTHORIZED, UNAVAILABLE, SourceError, printable
from .guard import deadline_scope
from .transfer import RangeAnswer, RemoteFile
from .uris import HfLocation, safe_relative

DEFAULT_ENDPOINT = "https://huggingface.co"
#: the largest API answer read (a page of a tree listing, a model's info)
MAX_API_ANSWER = 16 << 20
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: request headers the StoreClient writes itself (or that describe a body, which is never sent)
_OWN_HEADERS = frozenset({"host", "accept-encoding", "user-agent", "connection", "content-length", "transfer-encoding"})
#: answer headers that describe the connection's framing, not the body handed to huggingface_hub
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})
_TOKEN_HINT = (
    "a private or gated model needs a token (source.credentialsSecret, key 'token') of a user granted access "
    "to it on the Hub"
)
log = logging.getLogger("kubeinfer.sources.hf")


def hub_endpoint(endpoint: str | None) -> httpx.URL:
    """The Hub's base URL: huggingface.co unless ``source.endpoint`` names another (a mirror, a private Hub)."""
    url = httpx.URL(endpoint or DEFAULT_ENDPOINT)
    if url.scheme not in ("http", "https") or not url.host or url.query or url.path not in ("", "/"):
        raise SourceError(INVALID, "source.endpoint must be a Hub's base URL, http(s)://host[:port]")
    return httpx.URL(f"{url.scheme}://{url.netloc.decode('ascii')}")


# ------------------------------------------------------------------------------- the guarded client


@dataclass(frozen=True)
class _Call:
    client: StoreClient
    namespace: str
    where: str


_calls = threading.local()


class GuardedTransport(hub_http.BaseTransport):
    """huggingface_hub's HTTP transport: each request sent by the StoreClient of the calling thread's source."""

    def handle_request(self, request: hub_http.Request) -> hub_http.Response:
        call: _Call | None = getattr(_calls, "current", None)
        if call is None:
            raise SourceError(
                REFUSED, "huggingface_hub sent a request outside an hf:// source; it is not sent (the egress guard)"
            )
        if request.method not in ("GET", "HEAD") or request.headers.get("content-length", "0") != "0":
            raise SourceError(INVALID, f"{call.where}: only the Hub's read API is used (not {request.method})")
        if "transfer-encoding" in request.headers:
            raise SourceError(INVALID, f"{call.where}: only the Hub's read API is used (a request with a body)")
        url = httpx.URL(str(request.url))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _OWN_HEADERS}
        with call.client.request(
            request.method, url, headers, namespace=call.namespace, where=call.where, follow=True
        ) as answer:
            if answer.status >= 500 or answer.status == 429:
                # answered here: huggingface_hub would sleep and retry (for as long as a Retry-After asks); the
                # operator retries SourceUnavailable with its own backoff, within its deadlines
                answer.read(64 << 10)
                code, said = answer.header("x-error-code") or "", answer.header("x-error-message") or ""
                raise _status_error(answer.status, code, said, call.where, False)
            body = b"" if request.method == "HEAD" else answer.read(MAX_API_ANSWER)
            kept = [(k, v) for k, v in answer.headers.items() if k not in _FRAMING]
            return hub_http.Response(answer.status, headers=kept, content=body, request=request)


_TRANSPORT = GuardedTransport()
_made: weakref.WeakSet[hub_http.Client] = weakref.WeakSet()
_install_lock = threading.Lock()
_installed = False


def _guarded_client() -> hub_http.Client:
    """The client factory given to huggingface_hub: redirects are the StoreClient's to follow (hop by hop)."""
    client = hub_http.Client(transport=_TRANSPORT, follow_redirects=False, timeout=None)
    _made.add(client)
    return client


def _ensure_guarded() -> None:
    """Make huggingface_hub's shared client one of ours (again, if something in the process replaced it)."""
    global _installed
    with _install_lock:
        if not _installed or huggingface_hub.get_session() not in _made:
            huggingface_hub.set_client_factory(_guarded_client)
            _installed = True
    if huggingface_hub.get_session() not in _made:
        raise SourceError(REFUSED, "huggingface_hub's HTTP client is not the guarded one; the Hub is not contacted")


# ------------------------------------------------------------------------------------- the source


class HfSource:
    """One ``hf://`` location: its revision resolved to a commit, its files listed, ranged reads of their bytes."""

    def __init__(
        self,
        client: StoreClient,
        location: HfLocation,
        namespace: str,
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        token: str | None = None,
        deadline: float | None = None,
    ) -> None:
        self.client = client
        self.location = location
        self.namespace = namespace
        self.endpoint = str(hub_endpoint(endpoint)).rstrip("/")
        #: seconds the Hub's API calls may take together (the download has its own deadline)
        self.deadline = deadline
        self._token = token
        # token=False: no token from the process's environment or a huggingface-cli login is ever sent
        self.api = HfApi(endpoint=self.endpoint, token=token or False)
        self.shown = location.shown
        #: the commit the revision resolved to (set by ``files``)
        self.commit: str | None = None

    # -------------------------------------------------------------------------------------- API
    @contextlib.contextmanager
    def _calling(self, what: str) -> Iterator[None]:
        """huggingface_hub's requests of this thread go through this source's client; its errors become ours."""
        _ensure_guarded()
        before = getattr(_calls, "current", None)
        _calls.current = _Call(self.client, self.namespace, what)
        scope = deadline_scope(time.monotonic() + self.deadline) if self.deadline else contextlib.nullcontext()
        try:
            with scope:
                yield
        except SourceError:
            raise
        except HfHubHTTPError as exc:
            raise _hub_error(exc, what, self._token is not None) from None
        except hub_http.HTTPError as exc:
            log.info("hub request for %s failed: %s", what, type(exc).__name__)
            raise SourceError(UNAVAILABLE, f"{what}: the Hub's answer could not be read; retried") from None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SourceError(UNAVAILABLE, f"{what}: the Hub's answer is not the document its API describes") from None
        finally:
            _calls.current = before

    def resolve(self) -> str:
        """The commit the revision names now."""
        what = f"hf://{self.location.repo}@{self.location.revision}"
        with self._calling(what):
            info = self.api.model_info(self.location.repo, revision=self.location.revision)
        sha = info.sha or ""
        if not _COMMIT.match(sha):
            raise SourceError(UNAVAILABLE, f"{what}: the Hub named no commit for the revision")
        if _COMMIT.match(self.location.revision) and sha != self.location.revision:
            raise SourceError(INVALID, f"{what}: the Hub resolved the commit to another one ({sha})")
        self.commit = sha
        return sha

    def files(self, max_files: int, max_bytes: int) -> list[RemoteFile]:
        """What the location names at its commit, each file pinned (LFS: its sha256; in git: the commit)."""
        commit = self.resolve()
        path = self.location.path
        where = f"hf://{self.location.repo}@{commit}/{path}"
        if self.location.is_folder:
            listed = self._tree(path.rstrip("/"), True, where, max_files)
            files = [e for e in listed if isinstance(e, RepoFile)]
            if not files:
                raise SourceError(NOT_FOUND, f"{self.shown}: no file in this folder of the repository")
        else:
            parent = path.rpartition("/")[0]
            found = [e for e in self._tree(parent, False, where, max_files) if e.path == path]
            if not found:
                raise SourceError(NOT_FOUND, f"{self.shown}: the repository has no such file at commit {commit}")
            if isinstance(found[0], RepoFolder):
                raise SourceError(INVALID, f"{self.shown} is a folder of the repository: end the path with '/'")
            files = [e for e in found if isinstance(e, RepoFile)]
        out = [self._pinned(entry, commit) for entry in files]
        total = sum(f.size for f in out)
        if total > max_bytes:
            raise SourceError(TOO_LARGE, f"{self.shown}: {total} bytes, over the limit of {max_bytes} bytes")
        return out

    def _tree(self, folder: str, recursive: bool, where: str, max_files: int) -> list[RepoFile | RepoFolder]:
        out: list[RepoFile | RepoFolder] = []
        with self._calling(where):
            for entry in self.api.list_repo_tree(
                self.location.repo, folder or None, recursive=recursive, revision=self.commit
            ):
                out.append(entry)
                if len(out) > max_files:
                    raise SourceError(TOO_LARGE, f"{self.shown} holds more than {max_files} files (the limit)")
        return out

    def _pinned(self, entry: RepoFile, commit: str) -> RemoteFile:
        path = self.location.path
        if self.location.is_folder:
            if not entry.path.startswith(path):
                raise SourceError(INVALID, f"{self.shown}: the listing names '{entry.path[:120]}' outside the folder")
            rel = safe_relative(entry.path[len(path) :])
        else:
            rel = ""
        size = entry.lfs.size if entry.lfs is not None else entry.size
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise SourceError(UNAVAILABLE, f"{self.shown}: the listing gives no size for '{entry.path[:120]}'")
        if entry.lfs is not None:
            sha256 = str(entry.lfs.sha256).lower()
            if not _SHA256.match(sha256):
                raise SourceError(UNAVAILABLE, f"{self.shown}: '{entry.path[:120]}' has no LFS sha256 in the listing")
            return RemoteFile(rel, size, sha256, "hf-lfs", entry.path)
        return RemoteFile(rel, size, None, f"hf-commit {commit}", entry.path)

    # -------------------------------------------------------------------------------- transfer
    @contextlib.contextmanager
    def read_range(self, file: RemoteFile, start: int, end: int) -> Iterator[RangeAnswer]:
        assert self.commit is not None, "files() resolves the commit first"
        url = httpx.URL(hf_hub_url(self.location.repo, file.locator, revision=self.commit, endpoint=self.endpoint))
        what = f"hf://{self.location.repo}@{self.commit}/{file.locator}"
        headers = {"Range": f"bytes={start}-{end}"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"  # the Hub's origin only: not the CDN it redirects to
        with self.client.request("GET", url, headers, namespace=self.namespace, where=what, follow=True) as answer:
            if answer.status >= 300:
                answer.read(64 << 10)
                raise _status_error(
                    answer.status,
                    answer.header("x-error-code") or "",
                    answer.header("x-error-message") or "",
                    what,
                    self._token is not None,
                )
            served = answer.header("x-repo-commit")
            if served and served != self.commit:
                raise SourceError(UNAVAILABLE, f"{what}: the Hub served commit {served[:40]} for it")
            yield answer.ranged()


# --------------------------------------------------------------------------------------- errors


def _hub_error(exc: HfHubHTTPError, what: str, with_token: bool) -> SourceError:
    """huggingface_hub's error as ours: by its class, then the status; the Hub's words, never the request's."""
    status = exc.response.status_code if exc.response is not None else 0
    said = printable(exc.server_message or "", 160)
    if isinstance(exc, GatedRepoError):
        return _status_error(status or 401, "GatedRepo", said, what, with_token)
    if isinstance(exc, RevisionNotFoundError):
        return SourceError(NOT_FOUND, f"{what}: the repository has no such branch, tag or commit")
    if isinstance(exc, EntryNotFoundError):
        return SourceError(NOT_FOUND, f"{what}: the repository has no such file or folder")
    if isinstance(exc, RepositoryNotFoundError) and status not in (401, 403):
        return SourceError(NOT_FOUND, f"{what}: no such model repository on the Hub")
    code = exc.response.headers.get("x-error-code", "") if exc.response is not None else ""
    return _status_error(status, code, said, what, with_token)


def _status_error(status: int, code: str, message: str, what: str, with_token: bool) -> SourceError:
    said = f"HTTP {status}" + (f" {printable(code, 40)}" if code else "")
    if message:
        said += f": {printable(message, 160)}"
    if status in (401, 403) or code == "GatedRepo":
        if code == "GatedRepo":
            hint = (
                "the model is gated: the token's user must be granted access to it on the Hub"
                if with_token
                else "the model is gated: give a token (source.credentialsSecret, key 'token') of a user granted access"
            )
        elif with_token:
            hint = "the token was refused, or its user has no access to this repository"
        else:
            hint = f"no such repository, or it is private or gated; {_TOKEN_HINT}"
        return SourceError(UNAUTHORIZED, f"{what}: the Hub refused ({said}); {hint}")
    if status == 404 or code in ("RepoNotFound", "RevisionNotFound", "EntryNotFound"):
        return SourceError(NOT_FOUND, f"{what}: not found ({said})")
    if status >= 500 or status in (408, 429):
        return SourceError(UNAVAILABLE, f"{what}: the Hub is unavailable ({said}); retried")
    return SourceError(INVALID, f"{what}: the Hub refused the request ({said})")
