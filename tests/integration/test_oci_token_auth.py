"""``oci://`` sources from a registry with token authentication, the scheme Docker Hub, GHCR, Harbor and ECR's
public gallery use: the real ``distribution`` registry challenges with ``Bearer realm,service,scope`` and verifies
the tokens it is given; the token service that issues them is tests/support/registry_tokens.py (written to the
spec: no open-source one is small enough to build here). The operator must answer the challenge as the spec
says: ask the realm for the repository's pull scope with the Secret's credentials (sent to the realm only),
bring the token back to the registry, and never show the password or the token in a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.fetch import Fetch

from tests.support.oci_registry import OciRegistry
from tests.support.registry_tokens import SERVICE
from tests.support.sources import NS, make_writer, model_spec, relu_onnx, secret_lookup, volume_root


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    with OciRegistry(tmp_path_factory.mktemp("token-registry"), tls=True, token_auth=True) as registry:
        yield registry


def test_a_registry_with_token_auth_is_answered_as_the_spec_says(registry: OciRegistry, tmp_path: Path) -> None:
    model = relu_onnx(tmp_path / "model.onnx")
    digest = registry.push_artifact("team/relu", "v1", {"model.onnx": model})  # oras runs the token flow too
    tokens = registry.tokens
    assert tokens is not None and registry.ca_file is not None and registry.password is not None
    writer = make_writer(volume_root(tmp_path), ca_file=registry.ca_file)
    server_dir = writer.server_dir(NS, "ns/pool")
    uri = f"oci://{registry.address}/team/relu:v1"
    spec = model_spec({"uri": uri, "credentialsSecret": "registry"})
    right = {"username": str(registry.user), "password": registry.password}
    asked = len(tokens.requests)

    fetch = Fetch(secret_lookup(right, "127.0.0.1"))
    writer.sync_model(server_dir, render_model("m", spec), fetch=fetch)
    assert (server_dir / "m/1/model.onnx").read_bytes() == model.read_bytes()
    assert fetch.served == {1: f"oci-digest {digest}"}
    # one token, for the repository's pull scope only, asked with the Secret's user, for the registry's service
    ours = tokens.requests[asked:]
    assert [(r.user, r.service, r.scopes, r.status) for r in ours] == [
        (registry.user, SERVICE, ("repository:team/relu:pull",), 200)
    ]

    # no Secret: the service grants nothing and the registry refuses the token it gave
    asked = len(tokens.requests)
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("a", model_spec({"uri": uri})), fetch=Fetch())
    assert info.value.reason == "SourceUnauthorized"
    assert [(r.user, r.status) for r in tokens.requests[asked:]] == [(None, 200)]

    # a wrong password: the token service refuses it; neither the password nor any token is in the message
    wrong = Fetch(secret_lookup({"username": str(registry.user), "password": "nope-123"}, "127.0.0.1"))
    with pytest.raises(ArtifactError) as info:
        writer.sync_model(server_dir, render_model("b", spec), fetch=wrong)
    assert info.value.reason == "SourceUnauthorized" and "token service refused" in info.value.message
    assert "nope-123" not in info.value.message and registry.password not in info.value.message
    assert not any(token in info.value.message for token in tokens.issued)
    assert not (server_dir / "b").exists()
