"""Every InferenceModel under examples/kubernetes/ is one the operator renders (its own validation), and every
source URI in them parses: a manifest a user copies must not fail on our side."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubeinfer.operator.models.render import render_model
from kubeinfer.server.sources.uris import parse_az, parse_gs, parse_hf, parse_oci, parse_s3, scheme_of

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "kubernetes"
MODELS = [
    (path.name, doc)
    for path in sorted(EXAMPLES.glob("*.yaml"))
    for doc in yaml.safe_load_all(path.read_text())
    if doc and doc.get("kind") == "InferenceModel"
]


def test_there_are_examples_per_store_scheme() -> None:
    schemes = {scheme_of(v["source"]["uri"]) for _, d in MODELS for v in d["spec"]["versions"] if "uri" in v["source"]}
    assert {"s3", "oci", "hf", "gs", "az"} <= schemes


@pytest.mark.parametrize(("file", "doc"), MODELS, ids=[f"{f}:{d['metadata']['name']}" for f, d in MODELS])
def test_example_models_render(file: str, doc: dict) -> None:
    rendered = render_model(doc["metadata"]["name"], doc["spec"])
    for source in rendered.versions.values():
        if source.uri and scheme_of(source.uri) == "s3":
            parse_s3(source.uri)
        elif source.uri and scheme_of(source.uri) == "oci":
            parse_oci(source.uri)
        elif source.uri and scheme_of(source.uri) == "hf":
            parse_hf(source.uri)
        elif source.uri and scheme_of(source.uri) == "gs":
            parse_gs(source.uri)
        elif source.uri and scheme_of(source.uri) == "az":
            parse_az(source.uri)
