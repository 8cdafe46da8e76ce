"""A real Azure Blob Storage for the tests: Microsoft's emulator Azurite (``azurite-blob``) on a free port, its data
in a folder of the test's.

Azurite is an npm package, installed once into the local cluster's add-on cache like the Go add-ons
(``<cache>/addons/azurite-<hash>``: ``npm install azurite@AZURITE_VERSION`` into a fresh folder, renamed into place
under a lock by ``localcluster.addons.support.cached``). tests/conftest.py installs it before any test when one
needs it (a cold install takes about a minute). It serves the emulator's one well-known account,
``devstoreaccount1`` with its published key, path-style (``http://host:port/devstoreaccount1/container/blob``).
``stop()`` kills the process and keeps the data; ``start()`` brings it back on the same port with the same data::

    with Azurite(tmp_path / "azurite") as azurite:
        service = azurite.service()  # azure-storage-blob's BlobServiceClient, shared key
        service.create_container("models")

Probed on 3.37.0: shared key and SAS (service and account SAS) authentication, ranged GETs, List Blobs paged by
marker, Content-MD5 on upload; no blob versioning (no ``x-ms-version-id`` on any answer).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.support.store_process import StoreProcess, StoreProcessError, free_port_on

ROOT = Path(__file__).resolve().parents[2]
AZURITE_VERSION = "3.37.0"
#: bump when the install below changes
AZURITE_RECIPE = f"v1 npm install --no-audit --no-fund azurite@{AZURITE_VERSION}"
#: the emulator's account and key, published in its README (the same in every Azurite)
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class AzuriteError(StoreProcessError):
    pass


@functools.cache
def azurite_dir() -> Path:
    """``<cache>/addons/azurite-<hash>`` (``node_modules/.bin/azurite-blob``), installed on first use.

    In a child Python, as ``tests.support.s3_store.seaweedfs_dir`` builds its add-on: the add-on code lives in
    e2e/cluster (``localcluster``), not on the tests' import path."""
    if shutil.which("npm") is None:
        raise AzuriteError("installing Azurite needs npm (Node.js 20 or newer) on PATH")
    code = (
        "import sys; from e2e.cluster.localcluster.addons import support; "
        "make = lambda out: support.run(['npm', 'install', '--prefix', str(out), '--no-audit', '--no-fund', "
        "'--loglevel=error', 'azurite@' + sys.argv[2]], 'npm install azurite'); "
        "print(support.cached('azurite', support.key(sys.argv[1].encode()), make))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, AZURITE_RECIPE, AZURITE_VERSION], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        raise AzuriteError(f"installing the azurite add-on failed (exit {proc.returncode}):\n{proc.stderr[-10000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def azurite_blob() -> Path:
    return azurite_dir() / "node_modules" / ".bin" / "azurite-blob"


class Azurite(StoreProcess):
    """Azurite's blob service at ``endpoint`` (``http://host:port/devstoreaccount1``, the account's base URL).

    ``root`` holds ``data/`` (Azurite's workspace: its database and extents) and ``azurite.log``."""

    program = "azurite-blob"
    log_name = "azurite.log"
    error = AzuriteError
    account = ACCOUNT
    key = ACCOUNT_KEY

    def __init__(self, root: Path, host: str = "127.0.0.1", *, startup_timeout: float = 60, start: bool = True) -> None:
        super().__init__(root, host, startup_timeout=startup_timeout)
        self.port = free_port_on(host)
        if start:
            self.start()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/{self.account}"

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};AccountKey={self.key};"
            f"BlobEndpoint={self.endpoint};"
        )

    def service(self) -> Any:
        """azure-storage-blob's BlobServiceClient on the account's shared key (the tests' own uploads)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string())

    def command(self) -> list[str]:
        return [
            str(azurite_blob()),
            "--blobHost", self.host,
            "--blobPort", str(self.port),
            "--location", str(self.data_dir),
            # any x-ms-version (the SDK may be newer than the emulator); unknown headers and parameters ignored
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
        ]  # fmt: skip

    def ready(self) -> bool:
        """The blob service answers (any status: an anonymous account request is refused, but answered)."""
        try:
            with httpx.Client(trust_env=False, timeout=2) as http:
                answer = http.get(f"{self.endpoint}?comp=list")
        except httpx.HTTPError:
            return False
        return "x-ms-request-id" in answer.headers
