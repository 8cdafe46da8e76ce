"""Fixtures shared by every test folder: the example repository, built once per session."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from tests.support.azurite import Azurite, AzuriteError, azurite_dir
from tests.support.gcs_store import GcsStoreError, fake_gcs_dir
from tests.support.oci_registry import OciRegistry
from tests.support.otel_collector import OtelCollectorError, otelcol_dir
from tests.support.repos import copy_example_repository
from tests.support.s3_store import S3Store, S3StoreError, seaweedfs_dir
from tests.support.server import ServerProcess, start_server

# as the server's pytorch backend does before torch loads: libgomp's spinning threads made the tests'
# own PyTorch reference runs 30x slower on these shared cores (eager Spin model: 60 s vs 1.8 s)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Property-based tests explore new examples on every local run, but in CI (CI=true) each draws the same
# examples every time (derandomize: the seed comes from the test's name), so that main is green or red
# for a reason and a red run can be repeated. KUBEINFER_HYPOTHESIS_PROFILE picks either one by name.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("explore", print_blob=True)
hypothesis_settings.load_profile(
    os.environ.get("KUBEINFER_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "explore")
)


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_example_repository(tmp_path_factory.mktemp("example") / "model_repository")


@pytest.fixture(scope="session")
def example_server(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One real server on the example repository, shared by read-mostly tests."""
    server = start_server(example_repository, log_dir=tmp_path_factory.mktemp("logs"))
    yield server
    server.terminate()


@pytest.fixture(scope="session")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """A real OCI registry (CNCF distribution, htpasswd auth), pushed to with the real ``oras`` CLI; see
    tests/support/oci_registry.py. Shared: give each test its own repository."""
    with OciRegistry(tmp_path_factory.mktemp("oci_registry")) as registry:
        yield registry


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Store]:
    """A real S3-compatible store (SeaweedFS: admin and read-only identities); see tests/support/s3_store.py.
    Shared: give each test its own bucket."""
    with S3Store(tmp_path_factory.mktemp("s3_store")) as store:
        yield store


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A real Azure Blob Storage (Microsoft's emulator Azurite: its well-known devstoreaccount1); see
    tests/support/azurite.py. Shared: give each test its own container."""
    with Azurite(tmp_path_factory.mktemp("azurite")) as store:
        yield store


def pytest_collection_finish(session: pytest.Session) -> None:
    """TensorFlow and torch.export's compiler abort one process together (see tests/support/tf_worker.py)."""
    if "tensorflow" in sys.modules:
        raise pytest.UsageError(
            "a test module imported tensorflow into the pytest process: use tests.support.tf_worker"
        )
    # a cold build of a store (the S3 store's ``weed``, fake-gcs-server, the OpenTelemetry Collector) or Azurite's
    # npm install takes minutes, longer than a test's timeout: made here, outside any test, when a test needs it
    # (its fixture, or its class in the test's module; a failure shows where the store is used)
    stores = (
        ("s3_store", "S3Store", S3StoreError, seaweedfs_dir),
        ("azurite", "Azurite", AzuriteError, azurite_dir),
        ("", "GcsStore", GcsStoreError, fake_gcs_dir),
        ("", "OtelCollector", OtelCollectorError, otelcol_dir),
    )
    for fixture, cls, error, build in stores:
        if not session.config.option.collectonly and any(
            (fixture and fixture in getattr(item, "fixturenames", ()))
            or getattr(getattr(item, "module", None), cls, None)
            for item in session.items
        ):
            with contextlib.suppress(error):
                build()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fuzzing runs' and fault drills' one-line summaries (tests/support/drills.py)."""
    from tests.support import drills

    drills.write_summary(terminalreporter)
