"""A Google Cloud Storage emulator for the tests: fake-gcs-server (the JSON API, media downloads with ranges and
generations, uploads) on a free port, its objects in a folder of the test's (the filesystem backend).

The binary is the local cluster's build-only ``fake-gcs`` add-on (e2e/cluster/localcluster/addons/fake_gcs.py:
built from the pinned module e2e/cluster/fake-gcs into the add-on cache; ``e2e/cluster/build --addons fake-gcs``
builds it ahead, CI does). Over http by default, or https with ``tls=(cert, key)`` (a test CA's certificate for
the host). The emulator checks no credentials: it accepts any Authorization header or none. ``stop()`` kills the
process and keeps the objects; ``start()`` brings it back on the same port::

    with GcsStore(tmp_path / "gcs") as store:
        store.create_bucket("models")
        generation = store.upload("models", "m/model.onnx", data)["generation"]
        store.endpoint  # http://127.0.0.1:<port>: source.endpoint of a gs:// source
"""

from __future__ import annotations

import functools
import ssl
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import httpx

from tests.support.store_process import StoreProcess, StoreProcessError, free_port_on

ROOT = Path(__file__).resolve().parents[2]


class GcsStoreError(StoreProcessError):
    pass


@functools.cache
def fake_gcs_dir() -> Path:
    """The ``fake-gcs`` add-on's folder (``fake-gcs-server``, ``VERSION``), built into the add-on cache on first use
    (in a child Python, as the S3 store's ``weed``: a cold build downloads the module's dependencies and compiles)."""
    code = "from e2e.cluster.localcluster.addons import fake_gcs; print(fake_gcs.fake_gcs_dir())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise GcsStoreError(f"building the fake-gcs add-on failed (exit {proc.returncode}):\n{proc.stderr[-10000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def fake_gcs_binary() -> Path:
    return fake_gcs_dir() / "fake-gcs-server"


class GcsStore(StoreProcess):
    """fake-gcs-server serving Cloud Storage's JSON API at ``endpoint`` (``http(s)://host:port``).

    ``root`` holds ``data/`` (the filesystem backend's objects) and ``fake-gcs.log``. Its public host (the host in
    the URLs it writes: media links, upload locations) is its own address, so every URL it gives points at it."""

    program = "fake-gcs-server"
    log_name = "fake-gcs.log"
    error = GcsStoreError
    ready_interval = 0.2

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        *,
        tls: tuple[Path, Path] | None = None,
        ca_file: Path | None = None,
        binary: Path | None = None,
        startup_timeout: float = 30,
        start: bool = True,
    ) -> None:
        super().__init__(root, host, startup_timeout=startup_timeout)
        self.tls = tls
        self.ca_file = ca_file
        self.binary = binary
        self.port = free_port_on(host)
        if start:
            self.start()

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    # -- the process -----------------------------------------------------------------------------------------

    def command(self) -> list[str]:
        args = [
            str(self.binary or fake_gcs_binary()),
            f"-scheme={self.scheme}",
            f"-host={self.host}",
            f"-port={self.port}",
            "-backend=filesystem",
            f"-filesystem-root={self.data_dir}",
            f"-public-host={self.host}:{self.port}",
            f"-external-url={self.endpoint}",
            "-log-level=info",
        ]
        if self.tls:
            args += [f"-cert-location={self.tls[0]}", f"-private-key-location={self.tls[1]}"]
        return args

    def http(self, timeout: float = 10) -> httpx.Client:
        verify: Any = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else True
        return httpx.Client(base_url=self.endpoint, trust_env=False, timeout=timeout, verify=verify)

    def ready(self) -> bool:
        try:
            with self.http(timeout=2) as http:
                return http.get("/storage/v1/b").status_code == 200
        except httpx.HTTPError:
            return False

    # -- the JSON API ----------------------------------------------------------------------------------------

    def _checked(self, response: httpx.Response, what: str) -> dict[str, Any]:
        if response.status_code >= 300:
            raise GcsStoreError(f"{what}: HTTP {response.status_code} {response.text[:500]}\n{self.log_tail()}")
        result: dict[str, Any] = response.json()
        return result

    def create_bucket(self, name: str) -> dict[str, Any]:
        with self.http() as http:
            return self._checked(http.post("/storage/v1/b", json={"name": name}), f"creating bucket {name}")

    def upload(self, bucket: str, name: str, data: bytes) -> dict[str, Any]:
        """A simple media upload; the object's metadata (``generation``, ``size``, ``md5Hash``) as the store
        answers it."""
        path = f"/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        with self.http() as http:
            response = http.post(
                path,
                params={"uploadType": "media", "name": name},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
        return self._checked(response, f"uploading gs://{bucket}/{name}")

    def metadata(self, bucket: str, name: str) -> dict[str, Any]:
        path = f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(name, safe='')}"
        with self.http() as http:
            return self._checked(http.get(path), f"gs://{bucket}/{name}")
