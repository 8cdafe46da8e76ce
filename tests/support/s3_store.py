"""A real S3-compatible object store for the tests: SeaweedFS's ``weed mini`` (master, volume server, filer and S3
gateway in one process) on free ports, its data in a folder of the test's.

The ``weed`` binary is the local cluster's build-only ``seaweedfs`` add-on (e2e/cluster/localcluster/addons/
seaweedfs.py: built from the pinned module e2e/cluster/seaweedfs into the add-on cache, like kubeconform;
``e2e/cluster/build --addons seaweedfs`` builds it ahead, CI does). Two S3 identities with random keys: an admin
(every action) and a reader (Read, List). ``stop()`` kills the process and keeps the data; ``start()`` brings it
back on the same ports with the same data (a store that dies mid-download and comes back)::

    with S3Store(tmp_path / "s3") as store:
        s3 = store.client()  # boto3, admin identity, path-style addressing
        s3.create_bucket(Bucket="models")
        store.stop()
        store.start()

Reads are served as soon as ``start()`` returns. After a *restart* (data already there) the master refuses new
write assignments for its warm-up (3 heartbeat pulses of 5 s: 15 s, not configurable); the S3 gateway retries
meanwhile, so a PutObject right after ``start()`` succeeds but takes up to ~15 s. A fresh store takes writes at once.

Probed on this version (4.53, module v0.0.0-20261109003541-7506e5f91cd6): bucket versioning (VersionId on put,
get and list_object_versions), ``ChecksumAlgorithm='SHA256'`` on PutObject (a wrong digest is refused: BadDigest)
with ``x-amz-checksum-sha256`` on HEAD/GET under ``ChecksumMode='ENABLED'``, path-style addressing, and
virtual-hosted style when started with ``domain_name`` (``<bucket>.<domain_name>:<port>``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx

from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / "e2e" / "cluster"
#: SeaweedFS's S3 identity actions (weed/s3api/s3_constants: AllowedActions): the admin gets them all
ADMIN_ACTIONS = ("Admin", "Read", "ReadAcp", "Write", "WriteAcp", "List", "Tagging", "DeleteBucket")
READER_ACTIONS = ("Read", "List")
#: the Unix sockets ``weed mini`` opens beside its gRPC ports and the filer's and gateway's HTTP ports:
#: ``/tmp/seaweedfs-<name>-<port>.sock`` → the port's name in ``S3Store.ports``
LOCAL_SOCKETS = {
    "master-grpc": "master_grpc",
    "volume-grpc": "volume_grpc",
    "filer": "filer",
    "filer-grpc": "filer_grpc",
    "s3": "s3",
    "s3-grpc": "s3_grpc",
    "admin-grpc": "admin_grpc",
}
#: the ports ``weed mini`` listens on (each gRPC one beside its HTTP one)
PORTS = (
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
    "admin",
    "admin_grpc",
)


class S3StoreError(RuntimeError):
    pass


@functools.cache
def seaweedfs_dir() -> Path:
    """The ``seaweedfs`` add-on's folder (``weed``, ``VERSION``), built into the add-on cache on first use.

    In a child Python, as the e2e suite's kubeconform fixture gets its add-on: a cold build takes minutes (module
    downloads and the compile; tests/conftest.py builds it before any test when one needs ``s3_store``)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from localcluster.addons import seaweedfs; print(seaweedfs.seaweedfs_dir())"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(CLUSTER_DIR)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise S3StoreError(f"building the seaweedfs add-on failed (exit {proc.returncode}):\n{proc.stderr[-10000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def weed_binary() -> Path:
    return seaweedfs_dir() / "weed"


def _free_port(host: str) -> int:
    """A port by the suite's rule (``free_port``) that is free on every address too, ``host`` included: ``weed``
    names its Unix sockets by port alone (/tmp/seaweedfs-s3-<port>.sock), so two stores on different hosts must
    not share a port number."""
    while True:
        port = free_port()
        try:
            for addr in {"0.0.0.0", host}:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((addr, port))
        except OSError:
            continue
        return port


class S3Store:
    """SeaweedFS serving S3 at ``endpoint`` (``http://host:port``), region ``us-east-1``.

    ``root`` holds ``data/`` (what ``weed -dir`` stores: volumes, the filer's metadata), ``s3.json`` (the
    identities) and ``weed.log``. ``host`` is the address it binds and advertises (the e2e tests pass the
    node-facing host address so that pods reach it). ``domain_name`` turns on virtual-hosted-style requests
    (``<bucket>.<domain_name>``); path-style always works."""

    region = "us-east-1"

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        *,
        binary: Path | None = None,
        startup_timeout: float = 60,
        domain_name: str | None = None,
        start: bool = True,
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.domain_name = domain_name
        self.data_dir = self.root / "data"
        self.config_path = self.root / "s3.json"
        self.log_path = self.root / "weed.log"
        self.admin_access_key = "admin" + secrets.token_hex(8)
        self.admin_secret_key = secrets.token_urlsafe(30)
        self.reader_access_key = "reader" + secrets.token_hex(8)
        self.reader_secret_key = secrets.token_urlsafe(30)
        self.ports: dict[str, int] = {name: _free_port(host) for name in PORTS}
        self.proc: subprocess.Popen[bytes] | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.config_path.write_text(json.dumps(self.identities(), indent=2) + "\n")
        if start:
            self.start()

    # -- addresses and credentials ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.ports["s3"]

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def identities(self) -> dict[str, Any]:
        """The ``-s3.config`` document: SeaweedFS's static identities (name, credentials, actions)."""

        def identity(name: str, access: str, secret: str, actions: tuple[str, ...]) -> dict[str, Any]:
            return {
                "name": name,
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": list(actions),
            }

        return {
            "identities": [
                identity("admin", self.admin_access_key, self.admin_secret_key, ADMIN_ACTIONS),
                identity("reader", self.reader_access_key, self.reader_secret_key, READER_ACTIONS),
            ]
        }

    def credentials(self, identity: str = "admin") -> tuple[str, str]:
        if identity == "admin":
            return self.admin_access_key, self.admin_secret_key
        if identity == "reader":
            return self.reader_access_key, self.reader_secret_key
        raise ValueError(f"unknown identity {identity!r}: admin or reader")

    def client(
        self, identity: str = "admin", addressing_style: Literal["path", "virtual", "auto"] = "path", **config: Any
    ) -> Any:
        """A boto3 S3 client for ``identity`` (admin or reader); ``config`` goes into ``botocore.config.Config``."""
        import boto3
        from botocore.config import Config

        access, secret = self.credentials(identity)
        config.setdefault("retries", {"max_attempts": 1})
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=access,
            aws_secret_access_key=secret,
            config=Config(s3={"addressing_style": addressing_style}, **config),
        )

    # -- the process -----------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """``weed mini``: master, volume server, filer and S3 gateway in one process, each on its port here (its
        admin server too, which it always starts: bound to loopback), WebDAV and the admin UI off. ``mini`` and
        not ``server -filer -s3``: a fresh ``server`` refuses writes for its first seconds (the allocation hold
        of a newly minted topology, the filer's lock ring: a first PutObject took 8 s), ``mini`` does not."""
        p = self.ports
        args = [
            str(self.binary or weed_binary()),
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.telemetry=false",
            # fixed sizes, not mini's (which follow the disk's free space): volumes are sparse files, and each
            # bucket is a collection of its own that grows one volume at a time
            "-master.volumeSizeLimitMB=256",
            "-volume.max=100",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self.config_path}",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin_grpc']}",
            "-admin.port.legacy=0",
        ]
        if self.domain_name:
            args.append(f"-s3.domainName={self.domain_name}")
        return args

    def start(self) -> None:
        """Start ``weed mini`` (again: same ports, same data) and wait until it serves S3."""
        if self.running():
            raise S3StoreError(f"the store at {self.endpoint} is running already")
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} $ {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True
            )
        try:
            self.wait_ready(self.startup_timeout)
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, graceful: bool = False) -> None:
        """Kill the process (SIGKILL, as a crash; ``graceful``: SIGTERM first) and keep the data folder."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        # the sockets a killed process leaves behind (a new start removes them too, before it binds)
        for sock, name in LOCAL_SOCKETS.items():
            with contextlib.suppress(OSError):
                Path(f"/tmp/seaweedfs-{sock}-{self.ports[name]}.sock").unlink()

    def close(self) -> None:
        self.stop(graceful=True)

    def __enter__(self) -> S3Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- readiness -------------------------------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ready(self) -> bool:
        """Master ready (a leader), the volume server heartbeating, the filer and the S3 gateway up, and the admin
        identity's ListBuckets answered (the identities loaded, the filer reachable from the gateway)."""
        checks = (("master", "/readyz"), ("volume", "/healthz"), ("filer", "/healthz"), ("s3", "/healthz"))
        with httpx.Client(trust_env=False, timeout=2) as http:
            for name, path in checks:
                try:
                    if http.get(f"http://{self.host}:{self.ports[name]}{path}").status_code != 200:
                        return False
                except httpx.HTTPError:
                    return False
        try:
            self.client(connect_timeout=2, read_timeout=5).list_buckets()
        except Exception:
            return False
        return True

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise S3StoreError(f"weed mini exited ({code}) before it served S3:\n{self.log_tail()}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                raise S3StoreError(
                    f"weed mini did not serve S3 at {self.endpoint} within {timeout:.0f}s "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.25)
