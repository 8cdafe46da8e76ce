"""``EXECUTION_ENV_PATH`` tarballs get the limits of the operator's model archives: each refusal leaves
that model ``UNAVAILABLE`` with the reason, nothing of it outside the cache's staging folder, and the
server serving a small packed environment beside them.

The server runs with ``--backend-config=python,env-archive-max-bytes=65536`` and
``env-archive-max-entries=50`` so that the size limits are reached with small files.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import tarfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, start_server

MAX_BYTES = 64 << 10
MAX_ENTRIES = 50

MODEL = """
import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = np.array([json.dumps({"prefix": sys.prefix}).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", out)]) for _ in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" }} }}
"""

Entry = tuple[tarfile.TarInfo, bytes | None]


def _entry(name: str, data: bytes | None = None, **fields: Any) -> Entry:
    info = tarfile.TarInfo(name)
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    return info, data


def _symlink(name: str, target: str) -> Entry:
    return _entry(name, type=tarfile.SYMTYPE, linkname=target)


def _packed_venv(numpy_only: Path) -> list[Entry]:
    """A packed virtualenv in five entries: ``bin/python3`` a symlink to the base interpreter (venv-pack's
    layout), ``pyvenv.cfg``, and a ``.pth`` naming a folder outside with this environment's numpy."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    cfg = f"home = {base.parent}\ninclude-system-site-packages = false\n".encode()
    return [
        _entry("bin", type=tarfile.DIRTYPE),
        _symlink("bin/python3", str(base)),
        _symlink("bin/python", "python3"),
        _entry("pyvenv.cfg", cfg),
        _entry(f"lib/{version}/site-packages/server-numpy.pth", f"{numpy_only}\n".encode()),
    ]


def _bomb() -> bytes:
    """A gzip tar of a few KiB whose one file claims and holds 10 MiB of zeros."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("lib/zeros")
        info.size = 10 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    return gzip.compress(raw.getvalue())


def _write(path: Path, entries: list[Entry]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


#: model name → (what its archive holds, beside a valid environment; what the refusal says)
REFUSED: dict[str, tuple[Callable[[], list[Entry] | bytes], str]] = {
    "too_large": (
        lambda: [_entry("lib/noise", os.urandom(MAX_BYTES + 1))],
        f"bytes, over the limit of {MAX_BYTES} bytes",  # "env.tar.gz is <its size> bytes, ...": before reading
    ),
    "too_many_entries": (
        lambda: [_entry(f"lib/f{i}", b"") for i in range(MAX_ENTRIES)],
        f"env.tar.gz holds more than {MAX_ENTRIES} entries",
    ),
    "gzip_bomb": (_bomb, f"env.tar.gz unpacks to more than the limit of {MAX_BYTES} bytes"),
    # declared sizes that fit, but the tar stream (headers and padding) is counted as read: over the limit
    "stream_over": (
        lambda: [_entry(f"lib/f{i}", b"x" * 1000) for i in range(45)],
        f"env.tar.gz unpacks to more than the limit of {MAX_BYTES} bytes",
    ),
    "absolute": (lambda: [_entry("/tmp/kubeinfer-absolute", b"x")], "entry '/tmp/kubeinfer-absolute' leads outside"),
    "dotdot": (lambda: [_entry("lib/../../escaped", b"x")], "entry 'lib/../../escaped' leads outside"),
    "symlink_out": (
        lambda: [_symlink("lib/up", "../../..")],
        "entry 'lib/up' is a symlink to '../../..', outside the environment folder",
    ),
    "symlink_absolute": (
        lambda: [_symlink("lib/passwd", "/etc/passwd")],
        "entry 'lib/passwd' is a symlink to '/etc/passwd', outside the environment folder",
    ),
    # each link's text stays inside; resolved through the other, the second leads out
    "symlink_chain": (
        lambda: [_symlink("lib/here", ".."), _symlink("lib/there", "here/..")],
        "the symlink 'lib/there' leads outside the environment folder through other symlinks",
    ),
    "through_a_symlink": (
        lambda: [_symlink("lib/dir", "."), _entry("lib/dir/file", b"x")],
        "entry 'lib/dir/file' lies beneath the symlink 'lib/dir'",
    ),
    "hard_link_out": (
        lambda: [_entry("lib/passwd", type=tarfile.LNKTYPE, linkname="/etc/passwd")],
        "entry 'lib/passwd' is a hard link to '/etc/passwd', which is not a file earlier in the archive",
    ),
    "device": (
        lambda: [_entry("lib/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
        "entry 'lib/null' is a device",
    ),
    "fifo": (lambda: [_entry("lib/pipe", type=tarfile.FIFOTYPE)], "entry 'lib/pipe' is a FIFO"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("env_archives")
    numpy_only = root / "numpy-only"
    numpy_only.mkdir()
    numpy_dir = Path(np.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).exists():
            (numpy_only / name).symlink_to(numpy_dir.parent / name)
    repo = root / "repo"
    for name, (contents, _) in {**REFUSED, "packed": (lambda: [], "")}.items():
        folder = repo / name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name)))
        (folder / "1" / "model.py").write_text(MODEL)
        made = contents()
        if isinstance(made, bytes):
            (folder / "env.tar.gz").write_bytes(made)
        else:
            _write(folder / "env.tar.gz", _packed_venv(numpy_only) + made)
    cache = root / "cache"
    server = start_server(
        repo,
        f"--backend-config=python,env-archive-max-bytes={MAX_BYTES}",
        f"--backend-config=python,env-archive-max-entries={MAX_ENTRIES}",
        log_dir=root,
        env={"KUBEINFER_PYTHON_ENV_CACHE": str(cache)},
    )
    yield server, cache
    server.terminate()


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_environment_archive_beyond_the_limits_is_refused_with_the_reason(
    server: tuple[ServerProcess, Path], name: str
) -> None:
    process, cache = server
    rows = {r["name"]: r for r in httpx.post(f"{process.base_url}/v2/repository/index", json={}, timeout=10).json()}
    assert rows[name]["state"] == "UNAVAILABLE", rows[name]
    reason = rows[name]["reason"]
    assert "EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/env.tar.gz'" in reason
    assert REFUSED[name][1] in reason, reason
    assert not Path("/tmp/kubeinfer-absolute").exists()
    assert not any(p.name == "escaped" for p in cache.parent.rglob("escaped"))
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [_digest_of(process, "packed")]


def _digest_of(process: ServerProcess, name: str) -> str:
    """The cache folder of model ``name``'s environment: the one unpacked environment."""
    client = httpclient.InferenceServerClient(process.http_url, network_timeout=60)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], np.int32))
    try:
        prefix = json.loads(client.infer(name, [x]).as_numpy("REPORT")[0])["prefix"]
    finally:
        client.close()
    return Path(prefix).name


def test_a_packed_virtualenv_within_the_limits_serves(server: tuple[ServerProcess, Path]) -> None:
    process, cache = server
    digest = _digest_of(process, "packed")
    assert len(digest) == 64 and (cache / digest / "bin" / "python3").is_symlink()
