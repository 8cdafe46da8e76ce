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

The process's life (start, readiness, ``stop(graceful)``, ``restart()``, the log) is ``StoreProcess``'s
(tests/support/store_process.py). ``filer_copy(folder, bucket)`` puts a folder's files as objects through the
filer, for the tests that need a great many keys (100,000 empty objects in ~7 s; boto3 makes ~470 puts/s here).

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
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import httpx

from tests.support.store_process import StoreProcess, StoreProcessError, free_port_on

ROOT = Path(__file__).resolve().parents[2]
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


class S3StoreError(StoreProcessError):
    pass


@functools.cache
def seaweedfs_dir() -> Path:
    """The ``seaweedfs`` add-on's folder (``weed``, ``VERSION``), built into the add-on cache on first use.

    In a child Python, as the e2e suite's kubeconform fixture gets its add-on: a cold build takes minutes (module
    downloads and the compile; tests/conftest.py builds it before any test when one needs ``s3_store``)."""
    code = "from e2e.cluster.localcluster.addons import seaweedfs; print(seaweedfs.seaweedfs_dir())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise S3StoreError(f"building the seaweedfs add-on failed (exit {proc.returncode}):\n{proc.stderr[-10000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def weed_binary() -> Path:
    return seaweedfs_dir() / "weed"


class S3Store(StoreProcess):
    """SeaweedFS serving S3 at ``endpoint`` (``http://host:port``), region ``us-east-1``.

    ``root`` holds ``data/`` (what ``weed -dir`` stores: volumes, the filer's metadata), ``s3.json`` (the
    identities) and ``weed.log``. ``host`` is the address it binds and advertises (the e2e tests pass the
    node-facing host address so that pods reach it). ``domain_name`` turns on virtual-hosted-style requests
    (``<bucket>.<domain_name>``); path-style always works."""

    program = "weed mini"
    log_name = "weed.log"
    error = S3StoreError
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
        super().__init__(root, host, startup_timeout=startup_timeout)
        self.binary = binary
        self.domain_name = domain_name
        self.config_path = self.root / "s3.json"
        self.admin_access_key = "admin" + secrets.token_hex(8)
        self.admin_secret_key = secrets.token_urlsafe(30)
        self.reader_access_key = "reader" + secrets.token_hex(8)
        self.reader_secret_key = secrets.token_urlsafe(30)
        # ``weed`` names its Unix sockets by port alone: free on every address, not only on ``host``
        self.ports: dict[str, int] = {name: free_port_on(host) for name in PORTS}
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

    def _after_stop(self) -> None:
        """The sockets a killed process leaves behind (a new start removes them too, before it binds)."""
        for sock, name in LOCAL_SOCKETS.items():
            with contextlib.suppress(OSError):
                Path(f"/tmp/seaweedfs-{sock}-{self.ports[name]}.sock").unlink()

    # -- readiness -------------------------------------------------------------------------------------------

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

    # -- bulk ------------------------------------------------------------------------------------------------

    def filer_copy(self, folder: Path, bucket: str, concurrency: int = 64, timeout: float = 300) -> None:
        """Every file under ``folder`` into ``bucket``, as ``<folder's name>/<its path under folder>`` keys, by
        ``weed filer.copy`` straight into the filer (the bucket's folder ``/buckets/<bucket>/``): thousands of
        small objects a second where boto3's PutObject makes a few hundred (100,000 empty files: 7 s against
        ~210 s, on 2 cores). The objects carry no S3 checksum; the bucket must exist (``create_bucket``)."""
        filer = f"{self.host}:{self.ports['filer']}.{self.ports['filer_grpc']}"  # host:port.grpcPort
        proc = subprocess.run(
            [str(self.binary or weed_binary()), "filer.copy", f"-c={concurrency}", str(folder),
             f"http://{filer}/buckets/{bucket}/"],
            capture_output=True, text=True, timeout=timeout, cwd=self.root,
        )  # fmt: skip
        if proc.returncode != 0:
            raise S3StoreError(f"weed filer.copy {folder} failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
