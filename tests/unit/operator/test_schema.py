"""The generated CRDs: checked-in YAML is current, every field is described, rules are present."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubeinfer.operator.api import crds, model_crd

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "crds"


def _walk(node, path="spec"):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_checked_in_crds_are_generated():
    rendered = crds.render_crd_files()
    assert sorted(p.name for p in (REPO / crds.OUTPUT_DIR).iterdir()) == sorted(rendered)
    for name, text in rendered.items():
        assert (REPO / crds.OUTPUT_DIR / name).read_text() == text, (
            f"{crds.OUTPUT_DIR}/{name} is stale: run python -m kubeinfer.operator.api.crds"
        )


def test_chart_crds_are_links_to_the_one_copy():
    """The chart carries no CRD copy of its own: each entry is a relative link into crds/ (a relative one, so it
    resolves in any checkout), and there is one per CRD file."""
    chart = REPO / crds.CHART_CRDS_DIR
    assert sorted(p.name for p in chart.iterdir()) == sorted(crds.CRD_FILES)
    for name in crds.CRD_FILES:
        link = chart / name
        assert link.is_symlink(), f"{link} must be a link to {crds.OUTPUT_DIR}/{name}, not a copy"
        assert not Path(os.readlink(link)).is_absolute()
        assert link.resolve() == (REPO / crds.OUTPUT_DIR / name).resolve()


def test_every_property_has_a_description():
    for build in crds.CRD_FILES.values():
        crd = build()
        root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status"):
            for path, node in _walk(root["properties"][part], part):
                if path.endswith(("[]", "{}")):
                    continue
                assert node.get("description"), f"{crd['metadata']['name']}: {path} has no description"


def test_config_fields_use_proto_json_names():
    spec = model_crd.inference_model_spec_schema()["properties"]
    batching = spec["dynamicBatching"]["properties"]
    assert "maxQueueDelayMicroseconds" in batching
    assert "priorityQueuePolicy" in batching and "defaultQueuePolicy" in batching
    assert spec["inputs"]["items"]["properties"]["dataType"]["enum"][:2] == ["BOOL", "UINT8"]
    assert spec["instanceGroups"]["items"]["properties"]["kind"]["enum"] == [
        "KIND_AUTO",
        "KIND_GPU",
        "KIND_CPU",
        "KIND_MODEL",
    ]
    assert spec["maxBatchSize"]["minimum"] == 0


def test_crd_shape():
    model = yaml.safe_load((CRDS / "serving.kubeinfer.io_inferencemodels.yaml").read_text())
    server = yaml.safe_load((CRDS / "serving.kubeinfer.io_inferenceservers.yaml").read_text())
    assert model["spec"]["names"]["shortNames"] == ["im"]
    assert server["spec"]["names"]["shortNames"] == ["isrv"]
    mv, sv = model["spec"]["versions"][0], server["spec"]["versions"][0]
    assert [c["name"] for c in mv["additionalPrinterColumns"]][:4] == ["Ready", "Versions", "Replicas", "Server"]
    assert mv["subresources"] == {"status": {}}
    assert sv["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    rules = [r["message"] for r in mv["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]]
    assert "spec.versions: version numbers must be unique" in rules
    assert "dynamicBatching.preferredBatchSize entries must not exceed maxBatchSize" in rules
    policy = mv["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["versionPolicy"]
    assert policy["x-kubernetes-validations"][0]["message"] == "set at most one of latest, all, specific"
