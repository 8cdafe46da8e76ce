"""``s3://`` sources through the operator's writer against a real S3 store (SeaweedFS, uploaded to with boto3):
an object or a prefix becomes the version folder, pinned by the spec's sha256, the object's SHA-256 checksum or
its version; wrong credentials, a missing bucket and an unpinned object are conditions that say so and name no
secret; the size limits hold from the listing, before the first byte.

Fault drills: a store that dies in the middle of a 1 GiB download and comes back leaves the model Ready with the
right bytes and nothing half-written; a prefix that grows while it is listed (page by page) renders a consistent
snapshot; a prefix of 100,000 keys is refused from its listing without a byte downloaded, and listed whole by
the downloader's lister.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import random
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch
from kubeinfer.operator.volume.repository_writer import SOURCE_MARKER, STAGING_DIR
from kubeinfer.server.repository.scan import read_model
from kubeinfer.server.sources.client import Answer, StoreClient
from kubeinfer.server.sources.s3 import S3Endpoint, S3Source, credentials_from
from kubeinfer.server.sources.uris import parse_s3

from tests.support import drills
from tests.support.s3_store import S3Store
from tests.support.sources import (
    LOOPBACK,
    NS,
    files_in,
    make_writer,
    model_spec,
    names_in,
    relu_onnx,
    secret_lookup,
    volume_root,
)


def _keys(store: S3Store, identity: str = "reader") -> Any:
    access, secret = store.credentials(identity)
    return secret_lookup({"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}, store.host)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    with S3Store(tmp_path_factory.mktemp("s3")) as s3:
        s3.client().create_bucket(Bucket="models")
        yield s3


@pytest.fixture
def model_bytes(tmp_path: Path) -> bytes:
    return relu_onnx(tmp_path / "relu.onnx").read_bytes()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return volume_root(tmp_path)


def _source(store: S3Store, key: str, bucket: str = "models", **more: Any) -> dict[str, Any]:
    return {"uri": f"s3://{bucket}/{key}", "endpoint": store.endpoint, "credentialsSecret": "s3", **more}


def test_an_object_pinned_by_sha256_checksum_or_version(root: Path, store: S3Store, model_bytes: bytes) -> None:
    s3 = store.client()
    s3.put_object(Bucket="models", Key="plain/model.onnx", Body=model_bytes)
    s3.put_object(Bucket="models", Key="summed/model.onnx", Body=model_bytes, ChecksumAlgorithm="SHA256")
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    digest = hashlib.sha256(model_bytes).hexdigest()
    fetch = Fetch(_keys(store))
    spec = model_spec(_source(store, "plain/model.onnx", sha256=digest))
    writer.sync_model(server_dir, render_model("a", spec), fetch=fetch)
    assert (server_dir / "a/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"sha256 sha256:{digest}"}
    assert read_model(server_dir, "a").error == ""
    # the store's own SHA-256 checksum pins it: no sha256 in the spec
    fetch = Fetch(_keys(store))
    writer.sync_model(server_dir, render_model("b", model_spec(_source(store, "summed/model.onnx"))), fetch=fetch)
    assert (server_dir / "b/1/model.onnx").read_bytes() == model_bytes
    assert fetch.served == {1: f"s3-checksum sha256:{digest}"}
    # nothing pins it: refused before a byte is written
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            server_dir, render_model("c", model_spec(_source(store, "plain/model.onnx"))), fetch=Fetch(_keys(store))
        )
    assert info.value.reason == "ChecksumRequired" and "--checksum-algorithm SHA256" in info.value.message
    assert not (server_dir / "c").exists()
    # a wrong sha256: the bytes are refused, nothing is published
    wrong = model_spec(_source(store, "plain/model.onnx", sha256="0" * 64))
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("d", wrong), fetch=Fetch(_keys(store)))
    assert info.value.reason == "ChecksumMismatch" and not (server_dir / "d").exists()


def test_a_versioned_object_is_pinned_by_its_version(root: Path, store: S3Store, model_bytes: bytes) -> None:
    s3 = store.client()
    s3.create_bucket(Bucket="versioned")
    s3.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    version = s3.put_object(Bucket="versioned", Key="m/model.onnx", Body=model_bytes)["VersionId"]
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_keys(store))
    source = {"uri": "s3://versioned/m/model.onnx", "endpoint": store.endpoint, "credentialsSecret": "s3"}
    writer.sync_model(server_dir, render_model("v", model_spec(source)), fetch=fetch)
    assert fetch.served == {1: f"s3-version {version}"}
    assert (server_dir / "v/1/model.onnx").read_bytes() == model_bytes


def test_a_prefix_becomes_the_version_folder(root: Path, store: S3Store) -> None:
    s3 = store.client()
    files = {"saved_model.pb": b"graph", "variables/variables.index": b"index", "variables/variables.data": b"w" * 9999}
    for rel, data in files.items():
        s3.put_object(Bucket="models", Key=f"saved/1/{rel}", Body=data, ChecksumAlgorithm="SHA256")
    s3.put_object(Bucket="models", Key="saved/1/", Body=b"")  # a console's folder marker: skipped
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_keys(store))
    writer.sync_model(
        server_dir, render_model("tf", model_spec(_source(store, "saved/1/"), "tensorflow_savedmodel")), fetch=fetch
    )
    folder = server_dir / "tf/1/model.savedmodel"
    assert files_in(folder) == files
    assert fetch.served == {1: "3 objects pinned by s3-checksum"}
    assert sorted(os.listdir(server_dir / "tf/1")) == sorted([SOURCE_MARKER, "model.savedmodel"])
    # a folder is pinned by its objects: a sha256 for it is refused
    with pytest.raises(ArtifactError) as info:
        spec = model_spec(_source(store, "saved/1/", sha256="0" * 64), "tensorflow_savedmodel")
        writer.sync_model(server_dir, render_model("tf2", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceInvalid"


def test_limits_hold_from_the_listing_before_the_first_byte(root: Path, store: S3Store) -> None:
    s3 = store.client()
    for i in range(12):
        s3.put_object(Bucket="models", Key=f"many/1/f{i:02}", Body=b"x" * 1000, ChecksumAlgorithm="SHA256")
    writer = make_writer(root, max_files=10)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = model_spec(_source(store, "many/1/"), "tensorflow_savedmodel")
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("many", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceTooLarge" and "more than 10 objects" in info.value.message
    small = make_writer(root, max_bytes=5000)
    with pytest.raises(ArtifactError) as info:
        small.sync_model(server_dir, render_model("many", spec), fetch=Fetch(_keys(store)))
    assert info.value.reason == "SourceTooLarge" and "12000 bytes" in info.value.message
    assert not list((root / NS).rglob("f0*"))


def test_wrong_credentials_and_missing_things_say_so_and_name_no_secret(
    root: Path, store: S3Store, model_bytes: bytes
) -> None:
    store.client().put_object(Bucket="models", Key="auth/model.onnx", Body=model_bytes, ChecksumAlgorithm="SHA256")
    writer = make_writer(root)
    server_dir = writer.server_dir(NS, "ns/pool")
    access, _ = store.credentials("reader")
    bad_secret = "not-the-secret-" + "x" * 20

    def wrong(name: str, host: str) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": bad_secret}

    with pytest.raises(ArtifactError) as info:
        writer.sync_model(
            server_dir, render_model("w", model_spec(_source(store, "auth/model.onnx"))), fetch=Fetch(wrong)
        )
    assert info.value.reason == "SourceUnauthorized"
    assert "SignatureDoesNotMatch" in info.value.message or "AccessDenied" in info.value.message
    assert bad_secret not in info.value.message and access not in info.value.message
    for uri, reason in (
        ("s3://nosuchbucket/m.onnx", "SourceNotFound"),
        ("s3://models/auth/none.onnx", "SourceNotFound"),
    ):
        source = {"uri": uri, "endpoint": store.endpoint, "credentialsSecret": "s3", "sha256": "0" * 64}
        with pytest.raises(ArtifactError) as info:
            writer.sync_model(server_dir, render_model("n", model_spec(source)), fetch=Fetch(_keys(store)))
        assert info.value.reason == reason, info.value.message
    assert not (server_dir / "w").exists() and not (server_dir / "n").exists()


# ------------------------------------------------------------------------------------------ fault drills


class WatchedClient(StoreClient):
    """The StoreClient on loopback, noting each request it is asked to send (method, URL) and each one that failed
    (a refused connection, an answer broken off, a refusal), and calling ``before(method, url)`` ahead of each."""

    def __init__(self, before: Callable[[str, str], None] | None = None) -> None:
        super().__init__(LOOPBACK, timeout=10.0)
        self.before = before
        self.lock = threading.Lock()
        self.sent: list[tuple[str, str]] = []
        self.failed: list[str] = []
        self.failure = threading.Event()

    @contextlib.contextmanager
    def request(self, method: str, url: Any, headers: Mapping[str, str], **kwargs: Any) -> Iterator[Answer]:
        with self.lock:
            self.sent.append((method, str(url)))
        if self.before is not None:
            self.before(method, str(url))
        try:
            with super().request(method, url, headers, **kwargs) as answer:
                yield answer
        except Exception as exc:
            with self.lock:
                self.failed.append(f"{method} {type(exc).__name__}: {exc}")
            self.failure.set()
            raise

    def listings(self) -> list[str]:
        """The URLs of the ListObjectsV2 pages asked for."""
        with self.lock:
            return [url for method, url in self.sent if method == "GET" and "list-type=2" in url]


GIB = 1 << 30
#: the downloader asks for ListObjectsV2 pages of this many keys (S3Source.list_folder's max-keys)
PAGE = 1000


def _random_file(path: Path, size: int) -> str:
    """``size`` random bytes written to ``path`` 4 MiB at a time (one block in memory); their sha256."""
    digest = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(4 << 20, left))
            digest.update(block)
            f.write(block)
            left -= len(block)
    return digest.hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(4 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_a_store_that_dies_mid_download_and_comes_back(root: Path, tmp_path: Path) -> None:
    """1 GiB uploaded in parts (a multipart upload: pinned by the spec's sha256, as a user would), the store killed
    while the download's parts are in flight and started again once a part has met the dead store: the broken
    parts resume from the byte they reached, the version ends with the right bytes, nothing half-written was ever
    in the server's folder (the file fills in the staging area), and nothing is left in the staging area."""
    from boto3.s3.transfer import TransferConfig

    began = time.monotonic()
    with S3Store(tmp_path / "dying") as dying:
        s3 = dying.client()
        s3.create_bucket(Bucket="big")
        blob = tmp_path / "model.pt"
        digest = _random_file(blob, GIB)
        parts = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
        s3.upload_file(str(blob), "big", "model.pt", Config=parts)
        blob.unlink()
        head = s3.head_object(Bucket="big", Key="model.pt")
        assert head["ContentLength"] == GIB and head["ETag"].endswith('-16"'), head  # 16 parts of 64 MiB
        uploaded = time.monotonic()

        client = WatchedClient()
        writer = make_writer(root, client=client)
        server_dir = writer.server_dir(NS, "ns/pool")
        lock = threading.Lock()
        received = [0]
        seen: dict[str, Any] = {}
        problems: list[str] = []
        killed = threading.Event()
        restarted = threading.Event()

        def kill_then_restart() -> None:
            try:
                seen["received"] = received[0]
                seen["published"] = sorted(os.listdir(server_dir))
                seen["staged"] = {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
                dying.stop()  # SIGKILL: a crash, with parts in flight
                down = time.monotonic()
                if not client.failure.wait(30):
                    problems.append("no request failed within 30 s of the kill")
                seen["first failure"] = time.monotonic() - down
                dying.start()
                seen["down"] = time.monotonic() - down
                restarted.set()
            except BaseException as exc:
                problems.append(repr(exc))

        def count(namespace: str, n: int) -> None:
            with lock:
                received[0] += n
                if received[0] > GIB // 4 and not killed.is_set():
                    killed.set()
                    threading.Thread(target=kill_then_restart, daemon=True).start()

        fetch = Fetch(_keys(dying))
        fetch.count = count  # type: ignore[method-assign]
        source = {"uri": "s3://big/model.pt", "endpoint": dying.endpoint, "credentialsSecret": "s3", "sha256": digest}
        # a TorchScript file is not parsed at render (an ONNX one would be): the bytes may be random
        writer.sync_model(server_dir, render_model("big", model_spec(source, "pytorch_libtorch")), fetch=fetch)
        fetched = time.monotonic()
        assert restarted.wait(60) and not problems, (problems, seen, dying.log_tail())
    assert client.failed, "the kill broke no request"
    assert GIB // 4 < seen["received"] < GIB, seen
    # while the parts were in flight: nothing in the server's folder, the file (at its full length: written at
    # offsets) in the staging area only
    assert seen["published"] == [], seen
    staged = [(name, size) for name, size in seen["staged"].items() if name.endswith("model.pt")]
    assert len(staged) == 1 and staged[0][0].startswith(STAGING_DIR + "/") and staged[0][1] == GIB, seen
    target = server_dir / "big/1/model.pt"
    assert target.stat().st_size == GIB and _sha256_file(target) == digest
    assert fetch.served == {1: f"sha256 sha256:{digest}"}
    # the whole volume: the published model and nothing else (no partial file, nothing left in the staging area)
    assert names_in(root) == [
        f"{NS}/pool/big/1/{SOURCE_MARKER}",
        f"{NS}/pool/big/1/model.pt",
        f"{NS}/pool/big/config.pbtxt",
    ]
    drills.note(
        f"s3 store killed mid-download (1 GiB, multipart): killed at {seen['received'] >> 20} MiB received, "
        f"down {seen['down']:.1f} s, {len(client.failed)} broken or refused requests resumed; "
        f"upload {uploaded - began:.1f} s, download {fetched - uploaded:.1f} s, test {time.monotonic() - began:.1f} s"
    )


#: objects under the growing prefix before the render: three pages of the listing
GROWN_FROM = 2 * PAGE + 100
#: objects put while the listing waits for its second page
GROWN_BY_PAGE_2 = 100


def test_a_prefix_that_grows_while_listed_renders_a_consistent_snapshot(root: Path, store: S3Store) -> None:
    """2,101 objects under a prefix (three pages of the listing); when the writer asks for the second page, a
    thread starts putting new objects under the prefix (keys spread over the whole range: some behind the
    listing's position, some ahead), holding that page until 100 are in, and goes on until the render ends.
    The render succeeds with a snapshot: every object that existed before is there, every file has exactly the
    bytes uploaded for its key, and the new objects it holds are those ahead of the first page, all of the ones
    put there before the second page was asked for among them."""
    s3 = store.client()
    s3.create_bucket(Bucket="growing")
    prefix = "grow/1/"
    uploaded: dict[str, bytes] = {}  # every key put, its bytes (noted before the PutObject is sent)
    lock = threading.Lock()
    local = threading.local()

    def put(key: str) -> None:
        body = f"{key} {os.urandom(8).hex()}".encode()
        with lock:
            uploaded[key] = body
        if not hasattr(local, "s3"):
            local.s3 = store.client()
        local.s3.put_object(Bucket="growing", Key=key, Body=body, ChecksumAlgorithm="SHA256")

    existing = [f"{prefix}saved_model.pb"] + [f"{prefix}variables/part-{i:05}" for i in range(GROWN_FROM)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(put, existing))
    first_page_ends = sorted(existing)[PAGE - 1]

    grown: list[str] = []  # the keys whose PutObject returned, in order
    growing = threading.Event()
    enough = threading.Event()
    stop = threading.Event()
    at_page_2: list[str] = []
    problems: list[str] = []

    def grow() -> None:
        rng = random.Random(7)
        growing.wait()
        n = 0
        try:
            while not stop.is_set():
                key = f"{prefix}variables/part-{rng.randrange(GROWN_FROM):05}-late-{n:05}"
                n += 1
                put(key)
                with lock:
                    grown.append(key)
                    if len(grown) >= GROWN_BY_PAGE_2:
                        enough.set()
        except Exception as exc:
            problems.append(repr(exc))
            enough.set()

    def before(method: str, url: str) -> None:
        if "list-type=2" in url and "continuation-token=" in url and not growing.is_set():
            growing.set()  # the first page is answered: the prefix grows before the second is read
            if not enough.wait(60):
                problems.append(f"fewer than {GROWN_BY_PAGE_2} objects put in 60 s")
            with lock:
                at_page_2.extend(grown)

    client = WatchedClient(before)
    writer = make_writer(root, client=client)
    server_dir = writer.server_dir(NS, "ns/pool")
    fetch = Fetch(_keys(store))
    spec = model_spec(_source(store, prefix, bucket="growing"), "tensorflow_savedmodel")
    thread = threading.Thread(target=grow, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        writer.sync_model(server_dir, render_model("grow", spec), fetch=fetch)
    finally:
        rendered_in = time.monotonic() - started
        stop.set()
        growing.set()
        thread.join(60)
    assert not problems, problems
    folder = server_dir / "grow/1/model.savedmodel"
    rendered = {prefix + rel: data for rel, data in files_in(folder).items()}
    assert set(existing) <= rendered.keys()
    wrong = [key for key, data in rendered.items() if uploaded.get(key) != data]
    assert wrong == [], wrong[:10]
    late = rendered.keys() - set(existing)
    assert all(key > first_page_ends for key in late), sorted(late)[:10]
    ahead = {key for key in at_page_2 if key > first_page_ends}
    assert len(at_page_2) >= GROWN_BY_PAGE_2 and ahead and ahead <= late, (len(at_page_2), sorted(ahead - late)[:10])
    assert len(client.listings()) >= 3
    assert fetch.served == {1: f"{len(rendered)} objects pinned by s3-checksum"}
    drills.note(
        f"s3 prefix growing while listed: {len(existing)} objects before, {len(grown)} put during the render "
        f"({len(at_page_2)} before page 2), {len(late)} of them in the snapshot; {len(client.listings())} pages, "
        f"render {rendered_in:.1f} s"
    )


#: keys under the wide prefix
WIDE = 100_000


def test_a_prefix_of_100000_keys_is_refused_from_its_listing_and_listed_whole(
    root: Path, store: S3Store, tmp_path: Path
) -> None:
    """100,000 empty objects under one prefix (``weed filer.copy``: boto3 puts them at ~470/s here). The writer
    refuses the prefix with its file-count limit (SourceTooLarge) from the listing's first 11 pages: no object read,
    not a byte written. The downloader's lister (the server's cloud repository lists with it, up to 1,000,000
    objects) lists all 100,000 keys, in order, across 100 pages."""
    s3 = store.client()
    s3.create_bucket(Bucket="wide")
    began = time.monotonic()
    folder = tmp_path / "keys"
    folder.mkdir()
    for i in range(WIDE):
        os.close(os.open(folder / f"{i:06}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    store.filer_copy(folder, "wide")
    created_in = time.monotonic() - began

    client = WatchedClient()
    writer = make_writer(root, client=client)
    server_dir = writer.server_dir(NS, "ns/pool")
    spec = model_spec(_source(store, "keys/", bucket="wide"), "tensorflow_savedmodel")
    fetch = Fetch(_keys(store))
    started = time.monotonic()
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("wide", spec), fetch=fetch)
    refused_in = time.monotonic() - started
    assert info.value.reason == "SourceTooLarge" and "more than 10000 objects" in info.value.message
    listings = client.listings()
    assert client.sent == [("GET", url) for url in listings]  # listing pages only: no HEAD, no object read
    assert len(listings) == 11  # the 10,001st key is on the 11th page of 1,000
    assert names_in(root) == [] and not (server_dir / "wide").exists()

    lister = WatchedClient()
    location = parse_s3("s3://wide/keys/")
    access, secret = store.credentials("reader")
    source = S3Source(
        lister,
        location,
        S3Endpoint.of(location, store.endpoint, None, None),
        credentials_from({"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}),
        namespace="",
    )
    rss_before = drills.rss_bytes(os.getpid())
    tracemalloc.start()
    started = time.monotonic()
    try:
        listed = source.list_folder(1_000_000)
        listed_in = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth = drills.rss_bytes(os.getpid()) - rss_before
    assert [o.key for o in listed] == [f"keys/{i:06}" for i in range(WIDE)]
    assert all(o.size == 0 for o in listed)
    assert len(lister.listings()) == WIDE // PAGE and lister.failed == []
    drills.note(
        f"s3 prefix of {WIDE} keys: created in {created_in:.1f} s (weed filer.copy); writer refused it "
        f"(SourceTooLarge) from 11 pages in {refused_in:.2f} s; lister listed all in {listed_in:.1f} s "
        f"({WIDE // PAGE} pages), Python allocations peak {peak / (1 << 20):.0f} MiB, RSS growth "
        f"{rss_growth / (1 << 20):.0f} MiB"
    )
