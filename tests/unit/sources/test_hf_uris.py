"""``hf://`` URIs read as pure functions: the repository, revision and path each form names, and what is refused
before any connection (the Hub's errors as SourceErrors are in tests/integration/test_hf_sources.py)."""

from __future__ import annotations

import pytest
from kubeinfer.server.sources.errors import INVALID, SourceError
from kubeinfer.server.sources.hf import hub_endpoint
from kubeinfer.server.sources.uris import STORE_SCHEMES, HfLocation, parse_hf


def test_hf_forms() -> None:
    assert "hf" in STORE_SCHEMES
    assert parse_hf("hf://org/model@main/model.onnx") == HfLocation("org/model", "main", "model.onnx")
    # no revision: main; no path: the whole repository, a folder
    whole = parse_hf("hf://org/model")
    assert whole == HfLocation("org/model", "main", "") and whole.is_folder
    assert parse_hf("hf://org/model/").is_folder
    folder = parse_hf("hf://Org-1/my_model.v2@v1.0/onnx/")
    assert folder == HfLocation("Org-1/my_model.v2", "v1.0", "onnx/") and folder.is_folder
    single = parse_hf("hf://org/model/onnx/model.onnx")
    assert single.path == "onnx/model.onnx" and not single.is_folder
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert parse_hf(f"hf://org/model@{commit}").revision == commit
    # huggingface_hub's own forms: the models/ type prefix, a '/' in a branch as %2F, the Hub's special refs
    assert parse_hf("hf://models/org/model@main/a.onnx") == HfLocation("org/model", "main", "a.onnx")
    assert parse_hf("hf://org/model@feature%2Fx/a.onnx").revision == "feature/x"
    assert parse_hf("hf://org/model@refs/pr/12/a.onnx") == HfLocation("org/model", "refs/pr/12", "a.onnx")
    assert parse_hf("hf://org/model@refs/convert/onnx") == HfLocation("org/model", "refs/convert/onnx", "")
    assert parse_hf("hf://org/model@v1/a.onnx").shown == "hf://org/model@v1/a.onnx"


@pytest.mark.parametrize(
    "uri",
    [
        "hf://model",  # no namespace
        "hf://org/",
        "hf:///model/a.onnx",
        "hf://org/-model",
        "hf://org/model.",
        "hf://org/mo--del",
        "hf://org/mo..del",
        "hf://org/model.git",
        "hf://o%20g/model",
        "hf://datasets/org/data",  # not a model repository
        "hf://spaces/org/app",
        "hf://org/model@/a.onnx",  # empty revision
        "hf://org/model@a..b/x",
        "hf://org/model@-x/a",
        "hf://org/model@x.lock/a",
        "hf://org/model@a%2F%2Fb/x",
        "hf://org/model//a.onnx",
        "hf://org/model/a/../b.onnx",
        "hf://org/model/./a.onnx",
        "hf://org/model/a//b.onnx",
        "hf://org/model/a\\b.onnx",
        "hf://org/model/" + "a" * 1025,
    ],
)
def test_hf_forms_refused(uri: str) -> None:
    with pytest.raises(SourceError) as info:
        parse_hf(uri)
    assert info.value.reason == INVALID


def test_hub_endpoints() -> None:
    assert str(hub_endpoint(None)) == "https://huggingface.co"
    assert str(hub_endpoint("https://hub.example.com:8443/")) == "https://hub.example.com:8443"
    assert str(hub_endpoint("http://10.0.0.5:8080")) == "http://10.0.0.5:8080"
    for bad in ("ftp://hub", "https://hub/path", "https://hub?x=1", "hub.example.com"):
        with pytest.raises(SourceError) as info:
            hub_endpoint(bad)
        assert info.value.reason == INVALID
