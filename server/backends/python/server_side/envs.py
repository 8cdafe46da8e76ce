"""``EXECUTION_ENV_PATH``: a model's own Python environment, as Triton reads the parameter.

``parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }``
names a conda-pack tarball or a packed virtualenv (``.tar.gz``, ``.tgz`` or ``.tar``), or an unpacked
environment folder. ``$$TRITON_MODEL_DIRECTORY`` is the model's folder; a relative path is taken from
there too. A tarball is unpacked once into a cache keyed by its SHA-256 digest (``<cache>/<digest>``,
written to a temporary folder and renamed into place, so two loads never see half an environment) and
reused by every model and every later load that names the same bytes. The cache is
``$KUBEINFER_PYTHON_ENV_CACHE``, else ``<temp dir>/kubeinfer-python-envs``. Unpacking runs in the server,
within the operator's limits for model archives (size, entries, names, kinds, links: ``env_archive``).

The model's stubs run with the environment's own interpreter (``bin/python3``) and its ``bin`` first on
``PATH`` and ``lib`` on ``LD_LIBRARY_PATH``, as Triton's stub does after sourcing ``bin/activate``; the
environment must hold numpy (as Triton's must).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import threading
from pathlib import Path

from ....config import ConfigError
from . import env_archive

MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
_ARCHIVES = (".tar.gz", ".tgz", ".tar")
_lock = threading.Lock()
#: (path, size, mtime) → digest, so an unchanged tarball is hashed once per process
_digests: dict[tuple[str, int, int], str] = {}


def cache_dir() -> Path:
    configured = os.environ.get("KUBEINFER_PYTHON_ENV_CACHE")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "kubeinfer-python-envs"


#: glibc's malloc in a stub: blocks up to 32 MiB from the heap, and freed memory kept up to 128 MiB. With
#: the defaults a small process gives large blocks back at once, so every large numpy temporary is a fresh
#: mapping whose pages fault in again (docs/backends/python.md has the measured cost). Not when the
#: server's environment sets its own (GLIBC_TUNABLES, MALLOC_*). A stub's memory goes back when it ends.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=134217728"


def base_env() -> dict[str, str]:
    """The environment a stub gets when the model names none: the server's (and the malloc settings)."""
    env = dict(os.environ)
    if "GLIBC_TUNABLES" not in env and not any(k.startswith("MALLOC_") for k in env):
        env["GLIBC_TUNABLES"] = MALLOC_TUNABLES
    return env


def resolve(value: str, model_dir: Path) -> Path:
    """The parameter's path, ``$$TRITON_MODEL_DIRECTORY`` replaced, relative paths from the model folder."""
    path = Path(value.replace(MODEL_DIRECTORY, str(model_dir)))
    return path if path.is_absolute() else model_dir / path


def stub_environment(
    value: str, model_dir: Path, limits: env_archive.Limits | None = None
) -> tuple[str, dict[str, str]]:
    """The interpreter and environment variables for stubs of a model with ``EXECUTION_ENV_PATH`` ``value``
    (a tarball is unpacked within ``limits``)."""
    path = resolve(value, model_dir)
    label = f"EXECUTION_ENV_PATH '{value}'"
    if path.is_dir():
        root = path
    elif path.is_file():
        if not path.name.endswith(_ARCHIVES):
            raise ConfigError(f"{label}: {path.name} is neither a folder nor a .tar.gz, .tgz or .tar archive")
        root = unpacked(path, label, limits or env_archive.Limits())
    else:
        raise ConfigError(f"{label}: {path} does not exist")
    if not (root / "bin").is_dir():  # a tarball of the folder rather than of its contents
        inner = [p for p in root.iterdir() if p.is_dir()]
        if len(inner) == 1 and (inner[0] / "bin").is_dir():
            root = inner[0]
    python = next((root / "bin" / name for name in ("python3", "python") if (root / "bin" / name).exists()), None)
    if python is None:
        raise ConfigError(f"{label}: the environment has no bin/python3 (a conda-pack or virtualenv tarball holds one)")
    env = base_env()
    env.pop("PYTHONHOME", None)
    env["PATH"] = os.pathsep.join([str(root / "bin"), env.get("PATH", os.defpath)])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(root / "lib"), env.get("LD_LIBRARY_PATH", "")) if p)
    env["VIRTUAL_ENV" if (root / "pyvenv.cfg").exists() else "CONDA_PREFIX"] = str(root)
    return str(python), env


def digest(archive: Path) -> str:
    st = archive.stat()
    key = (str(archive), st.st_size, st.st_mtime_ns)
    with _lock:
        known = _digests.get(key)
    if known is not None:
        return known
    h = hashlib.sha256()
    with open(archive, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    value = h.hexdigest()
    with _lock:
        _digests[key] = value
    return value


def unpacked(archive: Path, label: str, limits: env_archive.Limits) -> Path:
    """The archive's contents in the cache (unpacked now unless an earlier load did)."""
    size = archive.stat().st_size
    if size > limits.max_bytes:  # before hashing it
        raise ConfigError(f"{label}: {archive.name} is {size} bytes, over the limit of {limits.max_bytes} bytes")
    target = cache_dir() / digest(archive)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=target.parent))
    try:
        try:
            env_archive.unpack(archive, staging, archive.name, limits)
        except env_archive.Refused as exc:
            raise ConfigError(f"{label}: {exc}") from None
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ConfigError(f"{label}: cannot unpack {archive.name}: {exc}") from None
        try:
            os.rename(staging, target)
        except OSError:
            if not target.is_dir():  # not another load that won the race
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
