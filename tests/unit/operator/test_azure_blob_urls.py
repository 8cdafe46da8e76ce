"""An Azure Blob URL (KServe's ``https://<account>.blob.core.windows.net/<container>/<path>``) in a spec: read by
the Azure store like its ``az://`` form (no sha256 needed: a blob version pins it), while a pre-signed SAS URL
stays an https download that needs its sha256."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator.api.model_types import Source
from kubeinfer.operator.models.render import render_model
from kubeinfer.operator.sources.artifacts import ArtifactError
from kubeinfer.operator.sources.store_sources import StoreSources
from kubeinfer.server.config import ConfigError
from kubeinfer.server.sources.client import StoreClient
from kubeinfer.server.sources.egress import HostRules


def test_an_azure_blob_url_needs_no_sha256_but_a_sas_url_does(model_spec: dict[str, Any]) -> None:
    blob = "https://acct.blob.core.windows.net/models/m/model.onnx"
    model_spec["versions"] = [{"version": 1, "source": {"uri": blob}}]
    assert render_model("m", model_spec).versions[1].uri == blob
    model_spec["versions"] = [{"version": 1, "source": {"uri": blob + "?sv=2024&sig=x"}}]
    with pytest.raises(ConfigError, match=r"source.uri needs source.sha256"):
        render_model("m", model_spec)


def test_the_azure_blob_url_goes_to_the_azure_store_before_any_connection() -> None:
    """The precheck admits the account's endpoint for the namespace (here refused: the host is not allowed), so the
    URL took the Azure path, not the https fetcher's."""
    sources = StoreSources(StoreClient(hosts=HostRules({"ns": ("example.com",)})), deadline=10.0)
    source = Source.from_spec({"uri": "https://acct.blob.core.windows.net/models/m/model.onnx"})
    with pytest.raises(ArtifactError) as info:
        sources.precheck(source, "ns")
    assert "acct.blob.core.windows.net" in info.value.message and "may download from" in info.value.message
