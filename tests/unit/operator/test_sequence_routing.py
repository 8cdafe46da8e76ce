"""Sequences across replicas: the Service's session affinity and the models' SequenceRouting condition
(operator/traffic/sequence_routing.py). Pure functions; e2e/test_sequence_replicas.py runs it on real pods."""

from __future__ import annotations

from typing import Any

from kubeinfer.operator.api.server_types import InferenceServerSpec
from kubeinfer.operator.servers.manifests import service
from kubeinfer.operator.traffic import sequence_routing as sr

BODY = {"metadata": {"name": "pool", "namespace": "ns", "uid": "u"}, "spec": {"image": "x", "replicas": 2}}


def _spec(**fields: Any) -> InferenceServerSpec:
    return InferenceServerSpec.from_body({"spec": {"image": "x", **fields}})


def _model(name: str, server: str = "pool", idle_us: int | None = None, stateful: bool = True) -> dict:
    spec: dict = {"server": server}
    if stateful:
        spec["sequenceBatching"] = {} if idle_us is None else {"maxSequenceIdleMicroseconds": idle_us}
    return {"metadata": {"name": name}, "spec": spec}


def test_a_pool_with_a_sequence_model_gets_client_affinity() -> None:
    models = [_model("plain", stateful=False), _model("acc", idle_us=60_000_000), _model("other", server="x")]
    stateful = sr.sequence_models(models, "pool")
    assert [m["metadata"]["name"] for m in stateful] == ["acc"]
    config = sr.affinity(_spec(**BODY["spec"]), stateful)
    assert config == {"clientIP": {"timeoutSeconds": 120}}  # twice the longest idle time
    svc = service(BODY, config)["spec"]
    assert svc["sessionAffinity"] == "ClientIP" and svc["sessionAffinityConfig"] == config
    assert sr.affinity(_spec(**BODY["spec"]), [_model("acc")]) == {"clientIP": {"timeoutSeconds": 30}}  # at least 30 s


def test_no_affinity_without_sequence_models_or_when_turned_off() -> None:
    assert sr.affinity(_spec(**BODY["spec"]), []) is None
    assert service(BODY, None)["spec"]["sessionAffinity"] == "None"
    assert sr.affinity(_spec(**BODY["spec"], sessionAffinity="None"), [_model("acc")]) is None
    assert sr.affinity(_spec(**BODY["spec"], sessionAffinity="ClientIP"), []) == {"clientIP": {"timeoutSeconds": 30}}


def test_the_condition_says_what_holds() -> None:
    stateful = {"sequenceBatching": {}}
    assert sr.model_condition({}, _spec(**BODY["spec"])) is None
    c = sr.model_condition(stateful, _spec(**BODY["spec"]))
    assert c is not None and (c.status, c.reason) == (True, "ClientAffinity")
    c = sr.model_condition(stateful, _spec(**BODY["spec"], sessionAffinity="None"))
    assert c is not None and (c.status, c.reason) == (False, "NoAffinity") and "may reach another replica" in c.message
    c = sr.model_condition(stateful, _spec(replicas=1, sessionAffinity="None"))
    assert c is not None and c.reason == "OneReplica"
    c = sr.model_condition(stateful, _spec(replicas=1, autoscaling={"maxReplicas": 4}, sessionAffinity="None"))
    assert c is not None and c.reason == "NoAffinity"


def test_a_pool_that_scales_to_zero_says_its_sequences_all_reach_one_replica() -> None:
    """Through KEDA's HTTP add-on the Service sees one client, the interceptor: ClientIP affinity pins the whole
    pool's traffic to one replica. One replica at most is fine; more is a set-up the condition points out."""
    stateful = {"sequenceBatching": {}}
    zero = {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 3}}
    c = sr.model_condition(stateful, _spec(**zero), through_interceptor=True)
    assert c is not None and (c.status, c.reason) == (False, "OneAddressThroughInterceptor")
    assert "maxReplicas to 1" in c.message
    one = {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 1}}
    c = sr.model_condition(stateful, _spec(**one), through_interceptor=True)
    assert c is not None and (c.status, c.reason) == (True, "OneReplica")
    c = sr.model_condition(stateful, _spec(**zero, sessionAffinity="None"), through_interceptor=True)
    assert c is not None and c.reason == "NoAffinity"
