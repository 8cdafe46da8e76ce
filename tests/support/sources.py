"""What the store-source integration tests (tests/integration/test_{s3,gcs,azure,oci,hf}_sources.py) share: the
operator's RepositoryWriter wired as the operator wires it (a Fetcher and a StoreClient under one set of egress
rules, StoreSources for the store schemes), a one-version InferenceModel spec around a source, the volume's
namespace folder, a credentials Secret bound to hosts, and the files a version folder ends with::

    writer = sources.make_writer(root)  # loopback allowed, 10 s connections, 300 s per source
    server_dir = writer.server_dir(sources.NS, "ns/pool")
    writer.sync_model(server_dir, render_model("m", sources.model_spec({"uri": ...})), fetch=Fetch(lookup))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetcher
from kubeinfer.operator.sources.store_sources import StoreSources
from kubeinfer.operator.volume.repository_writer import RepositoryWriter
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import AddressPolicy, parse_networks
from onnx import TensorProto

from tests.support.models import unary

#: the namespace the tests' models live in
NS = "ns"
#: egress rules that let the operator reach the tests' stores (all on loopback), and nothing else
LOOPBACK = AddressPolicy(allowed=parse_networks(["127.0.0.0/8"]))

Lookup = Callable[[str, str], dict[str, str]]


def model_spec(source: dict[str, Any], platform: str = "onnxruntime_onnx") -> dict[str, Any]:
    """An InferenceModel's spec whose one version (1) comes from ``source``."""
    return {
        "server": "s",
        "platform": platform,
        "maxBatchSize": 8,
        "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
        "versions": [{"version": 1, "source": source}],
    }


def make_writer(
    root: Path,
    *,
    client: StoreClient | None = None,
    policy: AddressPolicy = LOOPBACK,
    ca_file: Path | str | None = None,
    deadline: float = 300.0,
    max_bytes: int | None = None,
    **stores: Any,
) -> RepositoryWriter:
    """The operator's writer on ``root``: https downloads and store sources under ``policy``, ``ca_file`` trusted
    besides the system's; ``client`` (a StoreClient of the test's) instead of a fresh one; ``stores`` go to
    StoreSources (``max_files``, ``part_size``, ``parallel``, ``ambient_gcs_namespaces``...)."""
    ca = str(ca_file) if ca_file else None
    client = client or StoreClient(policy, timeout=10.0, ca_file=ca)
    more: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
    return RepositoryWriter(
        root,
        fetcher=Fetcher(policy, ca_file=ca),
        stores=StoreSources(client, deadline=deadline, **stores),
        **more,
    )


def volume_root(tmp_path: Path) -> Path:
    """The volume's root under ``tmp_path``, with the namespace's folder in it."""
    (tmp_path / "volume" / NS).mkdir(parents=True)
    return tmp_path / "volume"


def relu_onnx(path: Path) -> Path:
    """A small valid ONNX model (Relu over [batch, 4] floats, the spec's IN and OUT) saved at ``path``."""
    onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), path)
    return path


def secret_lookup(data: dict[str, str], *hosts: str) -> Lookup:
    """A credentials Secret's lookup (``Fetch(lookup)``): ``data`` for the ``hosts`` it is bound to,
    CredentialsRejected for any other host, as the operator's Secret reader answers."""

    def lookup(name: str, host: str) -> dict[str, str]:
        if host not in hosts:
            raise ArtifactError("CredentialsRejected", f"Secret '{name}' may not be sent to '{host}'")
        return data

    return lookup


def files_in(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: its path relative to ``folder`` → its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def names_in(folder: Path) -> list[str]:
    """The files under ``folder``, relative to it, sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
