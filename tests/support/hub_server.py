"""A local Hugging Face Hub for hf:// tests: the Hub's documented read endpoints, over HTTP(S) on 127.0.0.1.

No open Hugging Face Hub server exists (the Hub's own server is not published), so this implements the
endpoints that the official client, huggingface_hub, calls for what ``kubeinfer.server.sources.hf`` asks of
it, as the Hub documents and answers them:

- ``GET /api/models/{namespace}/{name}[/revision/{revision}]``: the model's info, ``sha`` (the commit the
  revision resolves to) and ``siblings`` (with ``?blobs=true``: sizes, blob ids and LFS metadata);
- ``GET /api/models/{namespace}/{name}/tree/{revision}[/{path}]?recursive=&cursor=``: a folder's entries
  (``type``, ``oid``, ``size``, ``path``, ``lfs: {oid, size, pointerSize}``), paged by ``Link: <...>;
  rel="next"`` headers when ``tree_page`` is small;
- ``GET``/``HEAD /{namespace}/{name}/resolve/{revision}/{path}``: a file's bytes (``Range`` answered with
  206), with ``X-Repo-Commit`` and ``ETag`` (the git blob id); an LFS file is a 302 to a second server, the
  "CDN" (another port, so another origin), with ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``, as the
  Hub redirects LFS downloads to its CDN with a signed URL;
- errors as the Hub gives them: ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``,
  ``GatedRepo``), ``X-Error-Message`` and a JSON ``{"error": ...}`` body; a Bearer token the Hub does not
  know is refused everywhere (401, "Invalid credentials in Authorization header"); a gated repository's
  info and tree are public, its files need a token granted access (401 without one, 403 with another).

Repositories, commits and files live in memory (``add_commit``); the test drives it only through
huggingface_hub and kubeinfer's own downloader.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import ssl
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.https import make_ca_and_cert


@dataclass(frozen=True)
class HubFile:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        """The git-lfs pointer file that git keeps for an LFS file."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n".encode()

    @property
    def blob_id(self) -> str:
        """The git blob id of what git keeps (the pointer, for an LFS file)."""
        kept = self.pointer if self.lfs else self.data
        return hashlib.sha1(b"blob %d\0" % len(kept) + kept).hexdigest()


@dataclass
class HubRepo:
    #: commit sha -> {path: file}
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    #: branch or tag -> commit sha
    refs: dict[str, str] = field(default_factory=dict)
    #: tokens granted access to a gated repository (None: not gated)
    granted: set[str] | None = None


@dataclass(frozen=True)
class Request:
    """A request a server received: its method, path (with the query) and the headers the tests look at."""

    method: str
    path: str
    authorization: str | None
    user_agent: str | None


@dataclass
class Seen:
    requests: list[Request] = field(default_factory=list)

    def record(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        headers = handler.headers
        self.requests.append(Request(handler.command, handler.path, headers["Authorization"], headers["User-Agent"]))


_API = re.compile(r"^/api/models/([^/]+)/([^/]+)(?:/revision/([^/]+))?$")
_TREE = re.compile(r"^/api/models/([^/]+)/([^/]+)/tree/([^/]+)(?:/(.+))?$")
_RESOLVE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_CDN = re.compile(r"^/lfs/([0-9a-f]{64})$")


class _Server:
    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], tls: tuple[Path, Path] | None) -> None:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HubServer:
    """The Hub (API and resolve endpoints) and its CDN for LFS files: two servers, two origins."""

    def __init__(self, folder: Path | None = None, *, tls: bool = False, tree_page: int = 1000) -> None:
        self.repos: dict[str, HubRepo] = {}
        #: every token the Hub knows (others are refused as invalid credentials)
        self.tokens: set[str] = set()
        #: sha256 -> bytes the CDN serves instead of the file's own (a corrupted or tampered object)
        self.cdn_override: dict[str, bytes] = {}
        self.tree_page = tree_page
        self.hub_seen = Seen()
        self.cdn_seen = Seen()
        self.ca_file: Path | None = None
        certs: tuple[Path, Path] | None = None
        if tls:
            assert folder is not None, "a folder for the test CA's files"
            self.ca_file, cert, key = make_ca_and_cert(folder)
            certs = (cert, key)
        self._lock = threading.Lock()
        self._hub = _Server(self._hub_handler(), certs)
        self._cdn = _Server(self._cdn_handler(), certs)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._hub.close()
        self._cdn.close()

    @property
    def url(self) -> str:
        return self._hub.url

    @property
    def cdn_url(self) -> str:
        return self._cdn.url

    # ------------------------------------------------------------------------------------ content
    def add_commit(
        self,
        repo: str,
        files: dict[str, bytes],
        *,
        lfs: Iterable[str] = (),
        ref: str = "main",
        gated_for: Iterable[str] | None = None,
    ) -> str:
        """A commit of ``repo`` holding ``files`` (those named in ``lfs`` stored in LFS), ``ref`` moved to it."""
        kept = set(lfs)
        tree = {path: HubFile(data, path in kept) for path, data in files.items()}
        listing = "".join(f"{p}\0{f.blob_id}\n" for p, f in sorted(tree.items()))
        with self._lock:
            entry = self.repos.setdefault(repo, HubRepo())
            sha = hashlib.sha1(f"{repo}\0{len(entry.commits)}\0{listing}".encode()).hexdigest()
            entry.commits[sha] = tree
            entry.refs[ref] = sha
            if gated_for is not None:
                entry.granted = set(gated_for)
                self.tokens.update(entry.granted)
        return sha

    # ------------------------------------------------------------------------------------- answers
    def _resolve(
        self, repo: str, revision: str, token: str | None
    ) -> tuple[HubRepo, str] | tuple[None, tuple[int, str, str]]:
        entry = self.repos.get(repo)
        if entry is None:  # the Hub answers 401 to an anonymous caller: a private repository looks the same
            return None, (404 if token else 401, "RepoNotFound", "Repository not found")
        sha = entry.refs.get(revision) or (revision if revision in entry.commits else None)
        if sha is None:
            return None, (404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return entry, sha

    def _model_info(self, repo: str, entry: HubRepo, sha: str, blobs: bool) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = []
        for path, file in sorted(entry.commits[sha].items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling.update(size=len(file.data), blobId=file.blob_id)
                if file.lfs:
                    sibling["lfs"] = {"sha256": file.sha256, "size": len(file.data), "pointerSize": len(file.pointer)}
            siblings.append(sibling)
        return {
            "_id": hashlib.md5(repo.encode()).hexdigest()[:24],
            "id": repo,
            "modelId": repo,
            "author": repo.split("/")[0],
            "sha": sha,
            "private": False,
            "disabled": False,
            "gated": "manual" if entry.granted is not None else False,
            "tags": [],
            "siblings": siblings,
        }

    def _tree(self, entry: HubRepo, sha: str, folder: str, recursive: bool) -> list[dict[str, Any]] | None:
        files = entry.commits[sha]
        prefix = f"{folder}/" if folder else ""
        out: dict[str, dict[str, Any]] = {}
        for path, file in sorted(files.items()):
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            if "/" in rest and not recursive:
                sub = prefix + rest.split("/")[0]
                out.setdefault(
                    sub, {"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "size": 0, "path": sub}
                )
                continue
            if recursive:
                parts = rest.split("/")[:-1]
                for depth in range(1, len(parts) + 1):
                    sub = prefix + "/".join(parts[:depth])
                    out.setdefault(
                        sub,
                        {"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "size": 0, "path": sub},
                    )
            item: dict[str, Any] = {"type": "file", "oid": file.blob_id, "size": len(file.data), "path": path}
            if file.lfs:
                item["lfs"] = {"oid": file.sha256, "size": len(file.data), "pointerSize": len(file.pointer)}
            out[path] = item
        if folder and not out:
            return None
        return [out[k] for k in sorted(out)]

    def _auth(self, header: str | None) -> tuple[str | None, tuple[int, str, str] | None]:
        """(token, refusal): a token the Hub does not know is refused on every endpoint."""
        if not header:
            return None, None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return None, (401, "", "Invalid credentials in Authorization header")
        return token, None

    def _hub_handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def do_GET(self, head: bool = False) -> None:
                hub.hub_seen.record(self)
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                token, refused = hub._auth(self.headers.get("Authorization"))
                if refused:
                    return self.error(*refused)
                if (m := _API.match(split.path)) is not None:
                    return self.model_info(m, query, token)
                if (m := _TREE.match(split.path)) is not None:
                    return self.tree(m, query, split.path, token)
                if (m := _RESOLVE.match(split.path)) is not None:
                    return self.resolve(m, token, head)
                self.error(404, "", "Not found")

            def model_info(self, m: re.Match[str], query: dict[str, list[str]], token: str | None) -> None:
                repo = f"{m[1]}/{m[2]}"
                entry, sha = hub._resolve(repo, urllib.parse.unquote(m[3] or "main"), token)
                if entry is None:
                    return self.error(*sha)
                assert isinstance(sha, str)
                blobs = query.get("blobs", ["false"])[0].lower() == "true"
                self.json(hub._model_info(repo, entry, sha, blobs))

            def tree(self, m: re.Match[str], query: dict[str, list[str]], path: str, token: str | None) -> None:
                entry, sha = hub._resolve(f"{m[1]}/{m[2]}", urllib.parse.unquote(m[3]), token)
                if entry is None:
                    return self.error(*sha)
                assert isinstance(sha, str)
                folder = urllib.parse.unquote(m[4] or "").strip("/")
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                items = hub._tree(entry, sha, folder, recursive)
                if items is None:
                    return self.error(404, "EntryNotFound", f"{folder} does not exist on {m[3]}")
                start = int(query.get("cursor", ["0"])[0])
                page = items[start : start + hub.tree_page]
                headers = {}
                if start + hub.tree_page < len(items):
                    nxt = dict(query, cursor=[str(start + hub.tree_page)])
                    link = f"{hub.url}{path}?{urllib.parse.urlencode(nxt, doseq=True)}"
                    headers["Link"] = f'<{link}>; rel="next"'
                self.json(page, headers)

            def resolve(self, m: re.Match[str], token: str | None, head: bool) -> None:
                repo = f"{m[1]}/{m[2]}"
                entry, sha = hub._resolve(repo, urllib.parse.unquote(m[3]), token)
                if entry is None:
                    return self.error(*sha)
                assert isinstance(sha, str)
                if entry.granted is not None and token not in entry.granted:
                    status = 401 if token is None else 403
                    return self.error(
                        status, "GatedRepo", "Access to model is restricted and you are not in the authorized list"
                    )
                path = urllib.parse.unquote(m[4])
                file = entry.commits[sha].get(path)
                if file is None:
                    return self.error(404, "EntryNotFound", f"{path} does not exist on {sha}")
                common = {"X-Repo-Commit": sha, "ETag": f'"{file.blob_id}"'}
                if file.lfs:
                    signed = f"{hub.cdn_url}/lfs/{file.sha256}?X-Amz-Signature={hashlib.sha1(file.data).hexdigest()}"
                    common.update(
                        {"Location": signed, "X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(len(file.data))}
                    )
                    return self.send(302, common, b"", head)
                send_range(self, file.data, common, head)

            def json(self, document: Any, headers: dict[str, str] | None = None) -> None:
                self.send(200, {"Content-Type": "application/json", **(headers or {})}, json.dumps(document).encode())

            def error(self, status: int, code: str, message: str) -> None:
                headers = {"Content-Type": "application/json", "X-Error-Message": message}
                if code:
                    headers["X-Error-Code"] = code
                self.send(status, headers, json.dumps({"error": message}).encode())

            def send(self, status: int, headers: dict[str, str], body: bytes, head: bool = False) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head and self.command != "HEAD":
                    self.wfile.write(body)

        return Handler

    def _cdn_handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.cdn_seen.record(self)
                m = _CDN.match(urllib.parse.urlsplit(self.path).path)
                data = None
                if m is not None:
                    data = hub.cdn_override.get(m[1])
                    if data is None:
                        for entry in hub.repos.values():
                            for tree in entry.commits.values():
                                data = next((f.data for f in tree.values() if f.lfs and f.sha256 == m[1]), data)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                send_range(self, data, {"Content-Type": "application/octet-stream"}, False)

        return Handler


def send_range(handler: http.server.BaseHTTPRequestHandler, data: bytes, headers: dict[str, str], head: bool) -> None:
    """``data`` whole, or the one byte range ``Range: bytes=a-b`` asks for (206)."""
    status, body = 200, data
    asked = re.match(r"^bytes=(\d+)-(\d*)$", handler.headers.get("Range") or "")
    if asked:
        start = int(asked[1])
        end = min(int(asked[2]) if asked[2] else len(data) - 1, len(data) - 1)
        if start > end:
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(data)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        status, body = 206, data[start : end + 1]
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
    handler.send_response(status)
    for k, v in {**headers, "Accept-Ranges": "bytes", "Content-Length": str(len(body))}.items():
        handler.send_header(k, v)
    handler.end_headers()
    if not head:
        handler.wfile.write(body)
