"""The typed InferenceServer spec (``operator/api/server_types.py``): real specs parse into it and come back
unchanged, what a spec leaves out gets the default the CRD's descriptions state, and the schema generated
from the classes is the published CRD's."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeinfer.operator.api import server_crd, server_spec, typed
from kubeinfer.operator.api.server_types import (
    Auth,
    InferenceServerSpec,
    Probe,
    ServerFlags,
    TokenSecret,
)
from kubeinfer.server.config.platforms import BUILTIN_BACKENDS

from tests.support.specs import every_option_spec
from tests.support.specs import server_spec as sample_spec

ROOT = Path(__file__).resolve().parents[3]

#: the spec with every option (e2e/test_helm.py's kubeconform test validates what is rendered from it)
EVERY_OPTION = every_option_spec()

#: e2e/test_scale_to_zero.py's pool (less its image and claim, which the test makes)
SCALE_TO_ZERO = sample_spec(
    auth={"tokenSecret": {"name": "pool-token"}},
    drainSeconds=1,
    probes={"readiness": {"periodSeconds": 1}, "startup": {"periodSeconds": 1, "failureThreshold": 300}},
    autoscaling={
        "minReplicas": 0,
        "maxReplicas": 2,
        "pollingIntervalSeconds": 2,
        "target": {"metric": "PendingRequests", "value": "10"},
        "scaleToZero": {"idleSeconds": 45, "hosts": ["pool.example", "resnet.team-a"]},
    },
    modelCache={"memoryBudget": "4Gi", "loadTimeoutSeconds": 60},
    allowedBackends=["onnxruntime"],
    allowExternalOpLibraries=True,
    sessionAffinity="ClientIP",
)


def _documented_specs() -> list[tuple[str, dict[str, Any]]]:
    """Every InferenceServer in examples/ and in the docs' YAML blocks: what users copy."""
    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "InferenceServer":
                found.append((str(path.relative_to(ROOT)), doc["spec"]))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", path.read_text(), re.S):
            for doc in yaml.safe_load_all(block):
                if isinstance(doc, dict) and doc.get("kind") == "InferenceServer" and "spec" in doc:
                    found.append((str(path.relative_to(ROOT)), doc["spec"]))
    return found


DOCUMENTED = _documented_specs()
SPECS = [("tests/support/specs.py", sample_spec()), ("every option", EVERY_OPTION), ("scale to zero", SCALE_TO_ZERO)]


def test_the_documents_show_inference_servers() -> None:
    """The round trip below covers the examples users copy (both example files and the autoscaling page)."""
    sources = {source for source, _ in DOCUMENTED}
    assert {"examples/kubernetes/inferenceserver.yaml", "examples/kubernetes/inferenceserver-gpu.yaml"} <= sources
    assert "docs/autoscaling.md" in sources


def _assert_contains(written: Any, given: Any, where: str = "spec") -> None:
    """Every value ``given`` sets is in ``written`` unchanged (``written`` may add defaults)."""
    if isinstance(given, dict):
        assert isinstance(written, dict), where
        for key, value in given.items():
            assert key in written, f"{where}.{key} was dropped"
            _assert_contains(written[key], value, f"{where}.{key}")
    elif isinstance(given, list):
        assert isinstance(written, list) and len(written) == len(given), where
        for i, (w, g) in enumerate(zip(written, given, strict=True)):
            _assert_contains(w, g, f"{where}[{i}]")
    else:
        assert written == given and type(written) is type(given), where


@pytest.mark.parametrize(("source", "spec"), SPECS + DOCUMENTED, ids=[s for s, _ in SPECS + DOCUMENTED])
def test_real_specs_round_trip(source: str, spec: dict[str, Any]) -> None:
    original = copy.deepcopy(spec)
    parsed = InferenceServerSpec.from_body({"spec": spec})
    written = typed.as_body(parsed)
    _assert_contains(written, original)
    assert typed.parse(InferenceServerSpec, written) == parsed
    assert spec == original  # the custom object is read, never changed


def test_what_a_spec_leaves_out_gets_the_operators_defaults() -> None:
    spec = InferenceServerSpec.from_body({"spec": {"image": "img:1"}})
    assert spec.image == "img:1" and spec.replicas == 1
    assert spec.drain_seconds == server_spec.DEFAULT_DRAIN_SECONDS
    assert spec.shared_memory_size == server_spec.DEFAULT_SHM
    assert (spec.server.http_port, spec.server.grpc_port, spec.server.metrics_port) == tuple(
        server_spec.DEFAULT_PORTS[k] for k in ("http", "grpc", "metrics")
    )
    assert spec.server.poll_interval_seconds == server_spec.DEFAULT_POLL_SECONDS
    assert spec.server.shutdown_timeout_seconds == server_spec.SHUTDOWN_SECONDS
    assert spec.server.extra_args == () and spec.server.log_level is None
    for kind in ("liveness", "readiness", "startup"):
        probe = getattr(spec.probes, kind)
        assert {
            "periodSeconds": probe.period_seconds,
            "timeoutSeconds": probe.timeout_seconds,
            "failureThreshold": probe.failure_threshold,
        } == server_spec.PROBE_DEFAULTS[kind]
    assert spec.backends == tuple(BUILTIN_BACKENDS)
    assert spec.network_policy.enabled is True and spec.session_affinity == "Auto"
    # absent means something other than a fixed value here: the operator's default backends, no autoscaler,
    # no model cache, no auth, the namespace's claim and the server's name as the folder
    assert spec.allowed_backends is None and spec.autoscaling is None and spec.model_cache is None
    assert spec.auth is None and spec.repository.claim_name is None and spec.repository.sub_path is None
    assert spec == InferenceServerSpec(image="img:1")  # parsing {} and constructing agree on every default


def test_a_partial_probe_keeps_the_other_defaults_of_its_kind() -> None:
    spec = InferenceServerSpec.from_body({"spec": {"image": "i", "probes": {"startup": {"periodSeconds": 2}}}})
    startup = server_spec.PROBE_DEFAULTS["startup"]
    assert spec.probes.startup == Probe(
        period_seconds=2, timeout_seconds=startup["timeoutSeconds"], failure_threshold=startup["failureThreshold"]
    )
    assert spec.probes.liveness.period_seconds == server_spec.PROBE_DEFAULTS["liveness"]["periodSeconds"]


def test_nested_parts_are_typed_and_defaulted() -> None:
    spec = InferenceServerSpec.from_body({"spec": SCALE_TO_ZERO})
    assert spec.auth == Auth(token_secret=TokenSecret(name="pool-token", key="token"))
    assert spec.autoscaling is not None and spec.autoscaling.scale_to_zero is not None
    assert spec.autoscaling.scale_to_zero.hosts == ("pool.example", "resnet.team-a")
    assert spec.autoscaling.scale_to_zero.concurrency_per_replica == server_spec.DEFAULT_CONCURRENCY
    assert spec.autoscaling.target is not None and spec.autoscaling.target.value == "10"
    assert spec.autoscaling.autoscaler == "Auto" and spec.autoscaling.prometheus is None
    assert spec.allowed_backends == ("onnxruntime",)
    every = InferenceServerSpec.from_body({"spec": EVERY_OPTION})
    assert every.server == ServerFlags(
        http_port=9000, log_level="debug", shutdown_timeout_seconds=60, extra_args=("--x=1",)
    )
    assert every.image_pull_secrets[0].name == "regcred" and every.tolerations[0].effect == "NoSchedule"
    assert every.resources.limits == {"nvidia.com/gpu": 1}


def test_unknown_fields_are_ignored_and_required_ones_are_not() -> None:
    spec = InferenceServerSpec.from_body({"spec": {"image": "i", "gone": 1, "server": {"removedFlag": True}}})
    assert spec == InferenceServerSpec(image="i")
    with pytest.raises(ValueError, match="image is required"):
        InferenceServerSpec.from_body({"spec": {"replicas": 2}})
    with pytest.raises(ValueError, match="maxReplicas is required"):
        InferenceServerSpec.from_body({"spec": {"image": "i", "autoscaling": {"minReplicas": 2}}})


#: every optional part present, each as empty as its schema allows: the defaults of every field come out
EVERY_PART = {
    "image": "i",
    "autoscaling": {"maxReplicas": 1, "target": {}, "prometheus": {}, "scaleToZero": {}},
    "modelCache": {},
    "auth": {"tokenSecret": {"name": "t"}, "tls": {"certificateSecret": "c", "clientCASecret": {"name": "ca"}}},
}
#: defaults a description names that the server applies, not the operator: the typed field stays unset and
#: the operator passes no flag
SERVERS_OWN_DEFAULTS = {"spec.server.logLevel", "spec.modelCache.loadTimeoutSeconds"}
_DEFAULT = re.compile(r"default ([^)\s,;:]+)\)")


def _described_defaults(schema: dict[str, Any], path: str) -> list[tuple[str, str]]:
    """(path, value) of each property whose description names one default, "(default X)"."""
    found = []
    for name, prop in (schema.get("properties") or {}).items():
        where = f"{path}.{name}"
        named = _DEFAULT.findall(" ".join(prop.get("description", "").split()))
        if len(named) == 1 and "properties" not in prop:
            found.append((where, named[0]))
        found += _described_defaults(prop, where)
    return found


def test_each_default_a_description_names_is_the_one_parsing_applies() -> None:
    """One home: the text kubectl explain shows and the value the reconcilers read are the same field's."""
    written = typed.as_body(InferenceServerSpec.from_body({"spec": EVERY_PART}))
    described = _described_defaults(typed.schema_of(InferenceServerSpec), "spec")
    assert len(described) >= 20  # the pattern still finds what it should
    for where, value in described:
        node: Any = {"spec": written}
        for key in where.split("."):
            node = node.get(key) if isinstance(node, dict) else None
        if where in SERVERS_OWN_DEFAULTS:
            assert node is None, where
        else:
            assert str(node).lower() == value.lower(), f"{where}: description says {value}, parsing gives {node}"


def test_the_published_crd_is_generated_from_the_classes() -> None:
    crd = server_crd.inference_server_crd()
    (version,) = crd["spec"]["versions"]
    assert version["schema"]["openAPIV3Schema"]["properties"]["spec"] == typed.schema_of(InferenceServerSpec)
    published = yaml.safe_load((ROOT / "crds" / "serving.kubeinfer.io_inferenceservers.yaml").read_text())
    assert published["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] == typed.schema_of(
        InferenceServerSpec
    )


def test_the_deployment_writes_the_typed_spec_back_as_the_user_wrote_it() -> None:
    """``servers.manifests`` reads the typed spec: what it passes through to the pod (scheduling fields, probe
    timing) comes out as the custom object said it, with the spec's defaults where it said nothing."""
    from kubeinfer.operator.servers import manifests

    spec = {**EVERY_OPTION, "probes": {"startup": {"failureThreshold": 120, "initialDelaySeconds": 3}}}
    body = {"kind": "InferenceServer", "metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": spec}
    pod = manifests.deployment(body, "c")["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets"):
        assert pod[key] == EVERY_OPTION[key], key
    (container,) = pod["containers"]
    startup = server_spec.PROBE_DEFAULTS["startup"]
    assert {k: v for k, v in container["startupProbe"].items() if k != "httpGet"} == {
        **startup,
        "failureThreshold": 120,
        "initialDelaySeconds": 3,
    }
    liveness = {k: v for k, v in container["livenessProbe"].items() if k != "httpGet"}
    assert liveness == server_spec.PROBE_DEFAULTS["liveness"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    # the helpers take the typed spec as they take the dict the controllers still hand them
    parsed = InferenceServerSpec.from_body(body)
    assert manifests.server_args(parsed) == container["args"]
    assert "--log-level=debug" in container["args"] and container["args"][-1] == "--x=1"
