"""A real OCI registry for the tests (CNCF distribution's ``registry``) and pushes to it with the real ``oras`` CLI.

Both programs are the cluster's ``registry`` add-on (``e2e/cluster/localcluster/addons/registry.py``), built from
their pinned Go modules and cached with the other add-ons; ``e2e/cluster/build --addons registry`` builds them
ahead (CI does), and the first ``OciRegistry`` builds them otherwise (minutes, once).

    with OciRegistry(tmp_path / "registry") as registry:
        digest = registry.push_artifact("models/simple", "v1", {"model.onnx": path})
        ref = registry.ref("models/simple", "v1")          # 127.0.0.1:PORT/models/simple:v1
        httpx.get(f"{registry.url}/v2/", auth=registry.auth)

The registry listens on plain HTTP (``host``: 127.0.0.1 unless given; e2e passes the address the node reaches),
keeps its blobs and manifests under ``<root>/storage`` (filesystem driver; ``stop()``/``start()`` keep them and the
port), and asks for HTTP Basic credentials (htpasswd, bcrypt) of a user and password drawn for this registry.
``anonymous_read=True`` runs it with no ``auth`` section instead: distribution's htpasswd backend has no
anonymous pull, so every request is served without credentials (the tests are its only writers).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support import processes
from tests.support.registry_tokens import TokenService

ROOT = Path(__file__).resolve().parents[2]

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
#: the ``artifactType`` of ``push_artifact`` unless given
ARTIFACT_TYPE = "application/vnd.kubeinfer.test.model.v1"
TITLE = "org.opencontainers.image.title"
#: bcrypt's lowest cost: the registry checks the password on every request (cost 10 is ~60 ms of CPU each)
BCRYPT_ROUNDS = 4


def binaries() -> Path:
    """The folder with ``registry`` and ``oras``: the cluster's cached ``registry`` add-on, built if missing."""
    from e2e.cluster.localcluster.addons.registry import registry_dir

    return registry_dir()


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class OciRegistryError(RuntimeError):
    pass


class OciRegistry:
    """One registry process: ``start()`` (or ``with``) runs it, ``stop()`` ends it and keeps its storage.

    Attributes: ``root``, ``storage`` (the filesystem driver's root directory), ``host``, ``port`` (0 until the
    first start), ``address`` (``host:port``, what image references start with), ``url`` (``http://host:port``),
    ``user``/``password``/``auth`` (None in ``anonymous_read`` mode), ``registry_config`` (the Docker config file
    ``oras login`` wrote the credentials to), ``log_path``, ``version``/``oras_version``.
    """

    def __init__(
        self,
        root: Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        anonymous_read: bool = False,
        bin_dir: Path | None = None,
        start_timeout: float = 30,
        tls: bool = False,
        token_auth: bool = False,
    ) -> None:
        self.root = Path(root)
        self.storage = self.root / "storage"
        self.host = host
        self.port = port
        self.anonymous_read = anonymous_read
        self.bin_dir = Path(bin_dir) if bin_dir is not None else binaries()
        self.start_timeout = start_timeout
        self.user: str | None = None if anonymous_read else f"tester-{secrets.token_hex(4)}"
        self.password: str | None = None if anonymous_read else secrets.token_urlsafe(18)
        self.log_path = self.root / "registry.log"
        self.config_path = self.root / "config.yml"
        self.docker_config = self.root / "docker"
        self.registry_config = self.docker_config / "config.json"
        self.version = (self.bin_dir / "REGISTRY_VERSION").read_text().strip()
        self.oras_version = (self.bin_dir / "ORAS_VERSION").read_text().strip()
        self.proc: subprocess.Popen[bytes] | None = None
        self._logged_in = False
        #: with ``tls``: HTTPS with a certificate for 127.0.0.1 from a test CA (``ca_file``), as a registry that
        #: takes credentials is served (clients send no password over plain http)
        self.ca_file: Path | None = None
        self._tls: tuple[Path, Path] | None = None
        if tls:
            from tests.support.https import make_ca_and_cert

            (self.root / "tls").mkdir(parents=True, exist_ok=True)
            ca, cert, key = make_ca_and_cert(self.root / "tls")
            self.ca_file, self._tls = ca, (cert, key)
        #: with ``token_auth`` (and ``tls``): distribution's token authentication, its tokens issued by a token
        #: service (tests/support/registry_tokens.py) to this registry's user, HTTPS with the same test CA
        self.tokens: TokenService | None = None
        if token_auth:
            if self._tls is None or self.user is None or self.password is None:
                raise ValueError("token_auth needs tls and credentials")
            self.tokens = TokenService(self.root / "tokens", *self._tls, self.user, self.password)

    # -- the process ----------------------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{self.address}"

    @property
    def auth(self) -> tuple[str, str] | None:
        """``(user, password)`` for httpx/requests, None when reads need no credentials."""
        return None if self.user is None or self.password is None else (self.user, self.password)

    def ref(self, repo: str, tag_or_digest: str) -> str:
        """``host:port/repo:tag``, or ``host:port/repo@sha256:...`` for a digest."""
        sep = "@" if tag_or_digest.startswith("sha256:") else ":"
        return f"{self.address}/{repo}{sep}{tag_or_digest}"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "info", "formatter": "text"},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage)},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {"addr": self.address, "secret": secrets.token_hex(16)},
        }
        if self._tls is not None:
            cfg["http"]["tls"] = {"certificate": str(self._tls[0]), "key": str(self._tls[1])}
        if self.tokens is not None:
            cfg["auth"] = self.tokens.registry_auth()
        elif not self.anonymous_read:
            cfg["auth"] = {"htpasswd": {"realm": "kubeinfer-test-registry", "path": str(self.root / "htpasswd")}}
        return cfg

    def start(self) -> OciRegistry:
        """Run the registry (on the port it had before, or a free one) and wait until it answers ``/v2/``."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        if self.user is not None and self.password is not None:
            import bcrypt

            hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=BCRYPT_ROUNDS)).decode()
            (self.root / "htpasswd").write_text(f"{self.user}:{hashed}\n")
        keep_port = self.port != 0
        for attempt in range(3):
            if not keep_port:
                self.port = free_port(self.host)
            self.config_path.write_text(json.dumps(self.config(), indent=2) + "\n")  # JSON is YAML
            with self.log_path.open("ab") as log:
                log.write(f"--- starting registry {self.version} on {self.address}\n".encode())
                log.flush()
                self.proc = subprocess.Popen(
                    [str(self.bin_dir / "registry"), "serve", str(self.config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                self._wait_ready()
                break
            except OciRegistryError as e:
                if keep_port or attempt == 2 or "address already in use" not in str(e):
                    raise
        self._logged_in = False
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise OciRegistryError(f"registry exited ({self.proc.returncode}) at start:\n{self.log_tail()}")
            try:
                context = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
                with urllib.request.urlopen(f"{self.url}/v2/", timeout=2, context=context) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                if e.code == 401 and not self.anonymous_read:
                    return
                raise OciRegistryError(f"GET {self.url}/v2/ answered {e.code} at start:\n{self.log_tail()}") from e
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise OciRegistryError(
                    f"registry not answering {self.url}/v2/ after {self.start_timeout:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """End the process (SIGTERM, then SIGKILL); the storage, port and credentials stay for ``start()``."""
        if self.proc is not None:
            processes.stop(self.proc, grace=10)
            self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> OciRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self.tokens is not None:
            self.tokens.close()

    # -- oras ---------------------------------------------------------------------------------------------------

    def oras(self, *args: str, cwd: Path | None = None, input: str | None = None) -> str:
        """Run ``oras`` with this registry's private credentials file; returns stdout, raises with its output."""
        env = {**os.environ, "DOCKER_CONFIG": str(self.docker_config), "HOME": str(self.root)}
        cmd = [str(self.bin_dir / "oras"), *args]
        p = subprocess.run(cmd, cwd=cwd, env=env, input=input, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise OciRegistryError(
                f"oras {' '.join(args[:2])} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout}{p.stderr}\n"
                f"--- registry log\n{self.log_tail()}"
            )
        return p.stdout

    def _flags(self) -> list[str]:
        if not self.running():
            raise OciRegistryError(f"the registry at {self.address} is not running")
        if not self._logged_in and self.password is not None:
            self.docker_config.mkdir(parents=True, exist_ok=True)
            self.oras(
                "login", *self._transport(), "--registry-config", str(self.registry_config),
                "-u", str(self.user), "--password-stdin", self.address,
                input=self.password,
            )  # fmt: skip
            self._logged_in = True
        return [*self._transport(), "--registry-config", str(self.registry_config)]

    def _transport(self) -> list[str]:
        return ["--ca-file", str(self.ca_file)] if self.ca_file else ["--plain-http"]

    def dockerconfigjson(self) -> str:
        """A ``.dockerconfigjson`` with this registry's credentials (for a Kubernetes pull Secret)."""
        import base64

        auths = {}
        if self.user is not None and self.password is not None:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            auths[self.address] = {"username": self.user, "password": self.password, "auth": token}
        return json.dumps({"auths": auths})

    def push_artifact(
        self,
        repo: str,
        tag: str,
        files: Mapping[str, Path | str],
        artifact_type: str = ARTIFACT_TYPE,
        media_type: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> str:
        """``oras push`` of an artifact: one layer per file, in the given order, each named by its key (which
        oras puts in the layer's ``org.opencontainers.image.title`` annotation; a key may hold ``/``). The
        layers' media type is ``media_type`` or oras's default (``application/vnd.oci.image.layer.v1.tar``).
        Returns the manifest's digest."""
        flags = self._flags()
        with tempfile.TemporaryDirectory(dir=self.root, prefix="push-") as tmp:
            args = []
            for name, path in files.items():
                if Path(name).is_absolute() or ".." in Path(name).parts:
                    raise ValueError(f"file name {name!r}: a relative path, please")
                dest = Path(tmp) / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(path, dest)
                except OSError:
                    shutil.copyfile(path, dest)
                args.append(f"{name}:{media_type}" if media_type else name)
            for key, value in (annotations or {}).items():
                args += ["--annotation", f"{key}={value}"]
            out = self.oras(
                "push", *flags, "--format", "json", "--artifact-type", artifact_type,
                self.ref(repo, tag), *args, cwd=Path(tmp),
            )  # fmt: skip
        digest: str = json.loads(out)["digest"]
        return digest

    def push_modelcar(self, repo: str, tag: str, folder: Path | str, compress: bool = True) -> str:
        """A KServe modelcar: an OCI image (linux/amd64) of one layer holding ``folder``'s files under
        ``/models/`` (a tar.gz, or a plain tar with ``compress=False``), its config with that layer's diff ID.
        Pushed the way an image builder lays it out: ``oras blob push`` of both blobs, then ``oras manifest push``
        of the image manifest (no annotations). Returns the manifest's digest."""
        flags = self._flags()
        layer, diff_id = modelcar_layer(Path(folder), compress)
        config = json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"WorkingDir": "/"},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created_by": "kubeinfer tests: models/", "comment": "modelcar"}],
            },
            separators=(",", ":"),
        ).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": len(config)},
            "layers": [
                {
                    "mediaType": OCI_LAYER_TAR_GZIP if compress else OCI_LAYER_TAR,
                    "digest": sha256_digest(layer),
                    "size": len(layer),
                }
            ],
        }
        body = json.dumps(manifest, separators=(",", ":")).encode()
        with tempfile.TemporaryDirectory(dir=self.root, prefix="push-") as tmp:
            for name, data in (("config.json", config), ("layer", layer), ("manifest.json", body)):
                (Path(tmp) / name).write_bytes(data)
            for name, data in (("config.json", config), ("layer", layer)):
                self.oras("blob", "push", *flags, f"{self.address}/{repo}@{sha256_digest(data)}", str(Path(tmp) / name))
            self.oras(
                "manifest", "push", *flags, "--media-type", OCI_MANIFEST, self.ref(repo, tag),
                str(Path(tmp) / "manifest.json"),
            )  # fmt: skip
        return sha256_digest(body)

    # -- storage ------------------------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        """Where the filesystem driver keeps a blob (``docker/registry/v2/blobs/sha256/ab/abcd.../data``)."""
        algo, _, hexdigest = digest.partition(":")
        return self.storage / "docker/registry/v2/blobs" / algo / hexdigest[:2] / hexdigest / "data"

    def corrupt_blob(self, digest: str) -> Path:
        """Rewrite a blob on disk with other bytes of the same length (its middle byte inverted), so its size
        still matches the manifest and only a digest check catches it. Blobs are content-addressed and shared
        by every repository of the registry: corrupt only content no other test pushes."""
        path = self.blob_path(digest)
        data = bytearray(path.read_bytes())
        if not data:
            raise ValueError(f"blob {digest} is empty: nothing to corrupt")
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        return path


def modelcar_layer(folder: Path, compress: bool = True) -> tuple[bytes, str]:
    """The layer tarball of a modelcar: ``models/`` and ``folder``'s files under it (sorted, mode 0644/0755, uid 0,
    mtime 0: the same bytes for the same files), gzip-compressed (mtime 0) unless not ``compress``.
    Returns (layer bytes, diff ID: the digest of the uncompressed tar)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(arcname: str, path: Path | None) -> None:
            info = tarfile.TarInfo(arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if path is None or path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                info.size = path.stat().st_size
                with path.open("rb") as f:
                    tar.addfile(info, f)

        add("models", None)
        for path in sorted(folder.rglob("*")):
            add(f"models/{path.relative_to(folder).as_posix()}", path)
    tar_bytes = raw.getvalue()
    diff_id = sha256_digest(tar_bytes)
    if not compress:
        return tar_bytes, diff_id
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, filename="") as f:
        f.write(tar_bytes)
    return gz.getvalue(), diff_id
