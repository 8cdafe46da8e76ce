"""tritonclient clients for the module's ``server`` fixture (each test module starts the server it needs),
and one shared server for the Python backend's models (tests/support/python_models)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.grpc.transport import default_transport, rust_missing

from tests.support.repos import copy_python_models
from tests.support.server import ServerProcess, start_server


@pytest.fixture(scope="module")
def http_client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def python_models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on every model of tests/support/python_models, shared by the modules that use them."""
    root = tmp_path_factory.mktemp("python_models")
    server = start_server(copy_python_models(root / "repo"), log_dir=root)
    yield server
    server.terminate()


@pytest.fixture(scope="session")
def python_models_server_on(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], ServerProcess]]:
    """The Python-models server for a ``--grpc-transport``: the shared one for the default transport, one
    more (started on first use, kept for the session) for another."""
    started: dict[str, ServerProcess] = {}
    default = default_transport()
    served_by_default = default if default != "auto" else "grpcio" if rust_missing() else "rust"

    def on(transport: str) -> ServerProcess:
        if transport == served_by_default:
            server: ServerProcess = request.getfixturevalue("python_models_server")
            return server
        if transport not in started:
            root = tmp_path_factory.mktemp(f"python_models_{transport}")
            repo = copy_python_models(root / "repo")
            started[transport] = start_server(repo, "--grpc-transport", transport, log_dir=root)
        return started[transport]

    yield on
    for server in started.values():
        server.terminate()
