"""The typed InferenceModel spec and status (``operator/api/model_types.py``, ``model_status.py``): real specs
parse into them and come back unchanged, what a spec leaves out gets the default its description states, the
CRD's spec schema is the classes' fields plus the proto's, and every key the controller writes into a status
is one the generated status schema keeps (the apiserver prunes the others)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.api import model_crd, model_spec, typed
from kubeinfer.operator.api.model_status import InferenceModelStatus
from kubeinfer.operator.api.model_types import (
    OPERATOR_FIELDS,
    InferenceModel,
    InferenceModelSpec,
    ModelVersion,
    Rollout,
    Source,
)
from kubeinfer.operator.api.schema import CONFIG_TOP_FIELDS, TOP_LEVEL_ALIASES
from kubeinfer.operator.api.status import ModelObservation, ReplicaView, VersionState, model_status
from kubeinfer.operator.models import cold_start
from kubeinfer.operator.models.render import render_model, render_versions
from kubeinfer.operator.traffic import rollout

ROOT = Path(__file__).resolve().parents[2]

#: a canary with every operator field set
CANARY: dict[str, Any] = {
    "server": "pool",
    "platform": "onnxruntime_onnx",
    "maxBatchSize": 8,
    "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
    "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
    "versions": [
        {"version": 1, "source": {"path": "uploads/relu.onnx"}, "trafficPercent": 90},
        {
            "version": 2,
            "source": {
                "uri": "s3://models/relu/2/model.onnx",
                "endpoint": "http://minio.local:9000",
                "region": "eu-west-1",
                "pathStyle": False,
                "credentialsSecret": "s3-creds",
            },
            "trafficPercent": 10,
        },
    ],
    "rollout": {"windowSeconds": 30, "minRequests": 20, "maxErrorRate": 0.05, "maxP99Milliseconds": 25.5},
    "coldStartBudgetSeconds": 120,
}


def _documented_models() -> list[tuple[str, dict[str, Any]]]:
    """Every InferenceModel in examples/ and in the docs' YAML blocks: what users copy."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceModel":
                found.append((str(path.relative_to(ROOT)), doc))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and doc.get("kind") == "InferenceModel" and "spec" in doc:
                    found.append((str(path.relative_to(ROOT)), doc))
    return found


DOCUMENTED = _documented_models()
SPECS = [("canary", {"metadata": {"name": "m"}, "spec": CANARY}), *DOCUMENTED]


def _body(doc: dict[str, Any]) -> dict[str, Any]:
    meta = {"namespace": "ns", "uid": "u", **doc.get("metadata", {})}
    return {"metadata": meta, "spec": doc["spec"]}


def test_the_documents_show_inference_models() -> None:
    assert len({source for source, _ in DOCUMENTED}) >= 5


@pytest.mark.parametrize(("source", "doc"), SPECS, ids=[s for s, _ in SPECS])
def test_real_specs_round_trip(source: str, doc: dict[str, Any]) -> None:
    """The typed operator fields and the ModelConfig part put back together are the spec as written (the
    rollout rule gains its defaults), and nothing is read twice or lost."""
    original = copy.deepcopy(doc["spec"])
    model = InferenceModel.from_body(_body(doc))
    written = {**typed.as_body(model.spec), **model.config}
    if "rollout" in original:
        assert written["rollout"] == {**typed.as_body(Rollout()), **original["rollout"]}
        written["rollout"] = original["rollout"]
    assert written == original
    assert set(model.config).isdisjoint(OPERATOR_FIELDS)
    assert typed.parse(InferenceModelSpec, typed.as_body(model.spec)) == model.spec
    assert doc["spec"] == original  # the custom object is read, never changed


def test_the_typed_render_is_the_render_of_the_spec_as_written() -> None:
    model = InferenceModel.from_body(_body({"metadata": {"name": "m"}, "spec": CANARY}))
    typed_render = render_versions("m", model.spec.versions, model.config)
    assert typed_render == render_model("m", CANARY)
    assert typed_render.versions[2] == Source(
        uri="s3://models/relu/2/model.onnx",
        endpoint="http://minio.local:9000",
        region="eu-west-1",
        path_style=False,
        credentials_secret="s3-creds",
    )
    assert typed_render.versions[2].as_dict() == CANARY["versions"][1]["source"]  # pathStyle false is kept
    assert model.spec.weights() == {1: 90.0, 2: 10.0}
    assert model.spec.cold_start_budget_seconds == 120.0


def test_what_a_spec_leaves_out_gets_the_defaults_its_descriptions_state() -> None:
    spec = InferenceModelSpec.from_body(
        {"spec": {"server": "p", "versions": [{"version": 3}], "rollout": {}, "platform": "ensemble"}}
    )
    assert spec.versions == (ModelVersion(version=3),) and spec.cold_start_budget_seconds is None
    assert spec.rollout == Rollout(
        window_seconds=model_spec.ROLLOUT_WINDOW_SECONDS,
        min_requests=model_spec.ROLLOUT_MIN_REQUESTS,
        max_error_rate=None,
        max_p99_milliseconds=None,
        promote=True,
    )
    described = typed.schema_of(Rollout)["properties"]
    for name, value in typed.as_body(spec.rollout).items():
        assert f"(default {str(value).lower()})" in described[name]["description"], name
    assert spec.weights() == {}
    assert rollout.weights_in_force(spec, None, 1) == {}
    with pytest.raises(ValueError, match="server is required"):
        InferenceModelSpec.from_body({"spec": {"versions": []}})


def test_the_crd_spec_is_the_classes_fields_and_the_protos() -> None:
    """The operator's fields come from the classes, the rest from model_config.proto; nothing else."""
    properties = model_crd.inference_model_spec_schema()["properties"]
    proto = {TOP_LEVEL_ALIASES.get(f, re.sub(r"_(\w)", lambda m: m.group(1).upper(), f)) for f in CONFIG_TOP_FIELDS}
    assert set(properties) == set(OPERATOR_FIELDS) | proto
    assert set(OPERATOR_FIELDS) == {"server", "versions", "rollout", "coldStartBudgetSeconds"}
    assert list(properties)[0] == "server"
    for name, prop in typed.schema_of(InferenceModelSpec)["properties"].items():
        assert properties[name] == prop


def _keys_outside(written: Any, schema: dict[str, Any], where: str) -> list[str]:
    """Paths of keys in ``written`` the schema does not state (the apiserver would prune them)."""
    if isinstance(written, list):
        return [k for i, item in enumerate(written) for k in _keys_outside(item, schema.get("items", {}), where)]
    if not isinstance(written, dict) or "properties" not in schema:
        return []
    out = []
    for key, value in written.items():
        if key not in schema["properties"]:
            out.append(f"{where}.{key}")
        else:
            out += _keys_outside(value, schema["properties"][key], f"{where}.{key}")
    return out


def test_every_key_a_status_holds_is_in_the_generated_schema() -> None:
    """A status key the classes leave out would be pruned by the apiserver: the model's status, its
    canary's numbers and decision and its cold start, as the controller writes them, are all stated."""
    schema = typed.schema_of(InferenceModelStatus)
    assert schema == model_crd.INFERENCE_MODEL_STATUS
    obs = ModelObservation(generation=2, target=[1, 2], rendered=[1, 2], config_digest="c", server="pool")
    obs.repository_path, obs.endpoint = "ns/pool/m", {"http": "h:8000", "grpc": "h:8001", "model": "m"}
    obs.render_error, obs.failed_version = ("FetchFailed", "the store said no"), 2
    cold = (("started_at", 1.0), ("load_seconds", 0.5), ("first_inference_at", 3.0), ("first_inference_seconds", 0.1))
    states = [VersionState(1, "READY", config_digest="c", cold_start=cold), VersionState(2, "UNAVAILABLE", "no file")]
    obs.replicas = [ReplicaView("pod-a", True, states)]
    obs.render_timing = cold_start.render_record(1.5, [(2, 100, 0.5)], served={2: "sha256 sha256:00"})
    new = model_status(obs, None, when="2026-01-01T00:00:00Z")
    block = cold_start.status_block(obs.render_timing, obs.replicas, None)
    new["coldStart"] = block
    weights = {1: 90.0, 2: 10.0}
    new["versionTraffic"] = rollout.version_traffic(weights, {}, 30)
    new["rollout"] = {
        "phase": "RolledBack",
        "canaryVersion": 2,
        "generation": 2,
        "message": "m",
        "time": "t",
        "weights": [{"version": 1, "trafficPercent": 100.0}],
    }
    for key in ("conditions", "versionStates", "lastFailure", "endpoint", "versionTraffic", "coldStart"):
        assert new.get(key), key  # the walk below sees each part
    assert block is not None and block["replicas"] and block["render"]["artifacts"][0]["pinnedBy"]
    assert _keys_outside(new, schema, "status") == []
    assert _keys_outside({"bogus": 1, "rollout": {"extra": 2}}, schema, "status") == [
        "status.bogus",
        "status.rollout.extra",
    ]
