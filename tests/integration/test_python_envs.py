"""``EXECUTION_ENV_PATH``: a model runs with its own Python environment (a packed virtualenv), where a
package has another version than the server's; the server and a model without one keep the server's.

The environment is built here: a virtualenv (``python -m venv``) holding its own ``idna`` (the server's
environment has the real one), and a ``.pth`` file naming a folder outside it that links to the server's
numpy (the stub needs numpy, as Triton's does; a symlink inside the tarball may not lead out of it, and
copying numpy would cost seconds), packed as a tarball and named with ``$$TRITON_MODEL_DIRECTORY`` as
Triton's docs do. Its ``bin/python3`` is a symlink to the base interpreter, as a packed virtualenv's is.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, start_server

FAKE_VERSION = "0.0.1+kubeinfer.env"

REPORT = """
import json
import sys

import idna
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        report = {"idna": idna.__version__, "idna_file": idna.__file__, "prefix": sys.prefix,
                  "executable": sys.executable}
        out = np.array([json.dumps(report).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", out)]) for _ in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] }} ]
{parameters}
"""


def _env_parameter(value: str) -> str:
    return f'parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{value}" }} }}'


def _model(repo: Path, name: str, parameters: str = "") -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name, parameters=parameters)))
    (folder / "1" / "model.py").write_text(REPORT)
    return folder


def _packed_venv(root: Path) -> Path:
    """A virtualenv with a fake ``idna``, and this environment's numpy through a ``.pth`` file, as a folder."""
    env = root / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "idna").mkdir()
    (site / "idna" / "__init__.py").write_text(f'__version__ = "{FAKE_VERSION}"\n')
    numpy_only = root / "numpy-only"
    numpy_only.mkdir()
    numpy_dir = Path(np.__file__).parent
    for name in ("numpy", "numpy.libs"):
        if (numpy_dir.parent / name).exists():
            (numpy_only / name).symlink_to(numpy_dir.parent / name)
    (site / "server-numpy.pth").write_text(f"{numpy_only}\n")
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path, Path]]:
    root = tmp_path_factory.mktemp("envs")
    env = _packed_venv(root)
    repo = root / "repo"
    packed = _model(repo, "own_env", _env_parameter("$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
    with tarfile.open(packed / "env.tar.gz", "w:gz") as tar:
        tar.add(env, arcname=".")
    _model(repo, "env_folder", _env_parameter(str(env)))
    _model(repo, "server_env")
    _model(repo, "missing_env", _env_parameter("$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz"))
    cache = root / "cache"
    server = start_server(repo, log_dir=root, env={"KUBEINFER_PYTHON_ENV_CACHE": str(cache)})
    yield server, cache, env
    server.terminate()


def _report(server: ServerProcess, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    t = httpclient.InferInput("X", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    try:
        return dict(json.loads(client.infer(model, [t]).as_numpy("REPORT")[0]))
    finally:
        client.close()


def test_a_packed_environment_is_unpacked_once_and_its_package_versions_win(
    server: tuple[ServerProcess, Path, Path],
) -> None:
    process, cache, _ = server
    report = _report(process, "own_env")
    assert report["idna"] == FAKE_VERSION
    (unpacked,) = [p for p in cache.iterdir() if not p.name.startswith(".")]  # one folder: <sha256 of the tarball>
    assert len(unpacked.name) == 64
    assert report["idna_file"].startswith(str(unpacked))
    assert report["prefix"] == str(unpacked)
    assert report["executable"] == str(unpacked / "bin" / "python3")


def test_the_server_and_a_model_without_an_environment_keep_the_servers_versions(
    server: tuple[ServerProcess, Path, Path],
) -> None:
    process, _, _ = server
    report = _report(process, "server_env")
    assert report["idna"] == importlib.metadata.version("idna") != FAKE_VERSION
    assert report["prefix"] == sys.prefix  # the server's own environment (the test runs in it)


def test_an_unpacked_environment_folder_is_used_in_place(server: tuple[ServerProcess, Path, Path]) -> None:
    process, _, env = server
    report = _report(process, "env_folder")
    assert report["idna"] == FAKE_VERSION
    assert report["prefix"] == str(env)


def test_a_missing_environment_fails_the_load_with_the_reason(server: tuple[ServerProcess, Path, Path]) -> None:
    process, _, _ = server
    rows = {r["name"]: r for r in httpx.post(f"{process.base_url}/v2/repository/index", json={}, timeout=10).json()}
    assert rows["missing_env"]["state"] == "UNAVAILABLE"
    assert "EXECUTION_ENV_PATH '$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz'" in rows["missing_env"]["reason"]
    assert "does not exist" in rows["missing_env"]["reason"]
