"""Issue 23 part 2: a tenant swapping its folders for symlinks while the operator writes never gets a byte outside.

The real RepositoryWriter syncs a model into ``<root>/ns-a/pool/`` from a real local HTTP server that
answers slowly (headers after a pause, then the body dripped), so every sync has a long window in which
the operator is in the middle of writing. Meanwhile a tenant thread, which sees only its own namespace
folder ``<root>/ns-a/`` (what a namespace's claim mounts), loops over everything it can see there (server
folder, model folder, version folders, config.pbtxt, source markers, any staging or tmp name) and swaps
each for a symlink into ``<root>/ns-b/`` (another tenant's live model), then back. The operator cycles
through creating the model, adding a version, changing the config and retiring a version, and removing
the model. Afterwards every file and folder of ns-b is byte-identical (content, and folder listings and
modification times: nothing was renamed into or out of them), and nothing appeared at the volume root
besides the operator's staging folder.

Before the writer worked on directory descriptors (main@4d15c5b) this test failed: the download opened
``<pool>/.m.staging-<hex>/1/model.onnx`` by name after the tenant had swapped the staging folder for a
symlink to ns-b's model, and wrote into it.
"""

from __future__ import annotations

import hashlib
import http.server
import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.volume.repository_writer import RepositoryWriter
from kubeinfer.server.repository.publish import leftover_of
from onnx import TensorProto

from tests.support.models import unary

#: seconds the tenant keeps swapping while the operator syncs
SWAP_SECONDS = 5.0
#: the slow server: pause before the headers, then the body in pieces
HEADER_DELAY, PIECE, PIECE_DELAY = 0.15, 16, 0.01
MODEL = unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]).SerializeToString()
SHA = hashlib.sha256(MODEL).hexdigest()


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(HEADER_DELAY)
        self.send_response(200)
        self.send_header("Content-Length", str(len(MODEL)))
        self.end_headers()
        for start in range(0, len(MODEL), PIECE):
            self.wfile.write(MODEL[start : start + PIECE])
            self.wfile.flush()
            time.sleep(PIECE_DELAY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _spec(url: str, versions: list[int], batch: int) -> dict:
    return {
        "server": "pool",
        "platform": "onnxruntime_onnx",
        "maxBatchSize": batch,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versionPolicy": {"all": {}},
        # a new query per round: the source marker changes, so each version is staged (downloaded) again
        "versions": [
            {"version": v, "source": {"uri": f"{url}/model.onnx?{v}-{batch}", "sha256": SHA}} for v in versions
        ],
    }


def _victim(root: Path) -> Path:
    """Namespace B's live model, with a source marker and a staging folder of its own writer."""
    model = root / "ns-b" / "pool" / "m"
    for v in ("1", "2"):
        (model / v).mkdir(parents=True)
        (model / v / "model.onnx").write_bytes(b"B's model " + v.encode())
        (model / v / ".kubeinfer-source.json").write_text('{"theirs": true}')
    (model / "config.pbtxt").write_text("B's config")
    (model / ".3.staging-0123abcd").mkdir()
    (root / "ns-b" / "secret.txt").write_text("B's secret")
    return root / "ns-b"


def _snapshot(folder: Path) -> dict[str, tuple[str, bytes, int]]:
    """Every entry under ``folder``: kind, bytes (files) and modification time (files and folders)."""
    seen: dict[str, tuple[str, bytes, int]] = {".": ("dir", b"", folder.lstat().st_mtime_ns)}
    for path in sorted(folder.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            seen[str(path.relative_to(folder))] = ("link", os.readlink(path).encode(), st.st_mtime_ns)
        elif path.is_dir():
            seen[str(path.relative_to(folder))] = ("dir", b"", st.st_mtime_ns)
        else:
            seen[str(path.relative_to(folder))] = ("file", path.read_bytes(), st.st_mtime_ns)
    return seen


def _target_in_b(b: Path, rel: Path) -> Path:
    """Where in B a symlink for ``rel`` (relative to A's folder) does the most harm: the same place."""
    parts = []
    for part in rel.parts:
        final = leftover_of(part) or part
        parts.append("1" if final.isdigit() else final)
    target = b.joinpath(*parts)
    return target if target.exists() else b / "pool" / "m"


class Tenant(threading.Thread):
    """Swaps every entry it can see in its own namespace folder for a symlink into B, and back."""

    def __init__(self, own: Path, victim: Path) -> None:
        super().__init__(daemon=True)
        self.own, self.victim = own, victim
        self.stop = threading.Event()
        self.swaps = 0
        self.staging_names_seen: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            for dirpath, dirnames, filenames in os.walk(self.own):  # never into a symlink
                for name in dirnames + filenames:
                    if self.stop.is_set():
                        return
                    if name.endswith(".away"):
                        continue
                    if leftover_of(name):
                        self.staging_names_seen.add(name)
                    self._swap(Path(dirpath) / name)
                    time.sleep(0.001)  # leave the operator time to get through whole syncs too

    def _swap(self, path: Path) -> None:
        away = path.with_name(path.name + ".away")
        try:
            os.rename(path, away)
        except OSError:
            return
        try:
            os.symlink(_target_in_b(self.victim, path.relative_to(self.own)), path)
            self.swaps += 1
            time.sleep(0.002)
            os.unlink(path)
        except OSError:
            pass
        try:
            os.rename(away, path)
        except OSError:
            pass  # the operator put something there meanwhile: it stays, ours lies aside


def test_a_tenant_swapping_symlinks_while_the_operator_writes_never_reaches_another_namespace(
    tmp_path: Path, slow_server: str
) -> None:
    root = tmp_path
    victim = _victim(root)
    (root / "ns-a").mkdir()
    before = _snapshot(victim)
    writer = RepositoryWriter(root, timeout=10)
    tenant = Tenant(root / "ns-a", victim)
    outcomes: dict[str, int] = {}
    rounds = itertools.count()
    tenant.start()
    deadline = time.monotonic() + SWAP_SECONDS
    try:
        while time.monotonic() < deadline:
            batch = 4 + next(rounds)
            # create the model; add a version; change the config and retire a version; remove the model
            for versions, max_batch in (([1], batch), ([1, 2], batch), ([2], batch + 100), ([], 0)):
                try:
                    server_dir = writer.server_dir("ns-a", "ns-a/pool")
                    if versions:
                        writer.sync_model(server_dir, render_model("m", _spec(slow_server, versions, max_batch)))
                    else:
                        writer.remove_model(server_dir, "m")
                    outcomes["ok"] = outcomes.get("ok", 0) + 1
                except ArtifactError as exc:
                    outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
                except OSError as exc:  # a rename that met the tenant's entry: the sync fails, nothing leaks
                    outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
    finally:
        tenant.stop.set()
        tenant.join(timeout=10)
    after = _snapshot(victim)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"B's folder changed at {changed} (operator outcomes {outcomes}, {tenant.swaps} swaps)"
    assert sorted(p.name for p in root.iterdir()) in (["ns-a", "ns-b"], [".kubeinfer-staging", "ns-a", "ns-b"])
    # the test meant something: the tenant swapped often, and the operator got through whole syncs meanwhile
    assert tenant.swaps > 200, tenant.swaps
    assert outcomes.get("ok", 0) >= 4, outcomes
    # staging happens where the tenant cannot see it
    assert not tenant.staging_names_seen, tenant.staging_names_seen
