"""Sequences across replicas: every request of a sequence must reach the replica that holds its state.

A stateful (sequence-batched) model keeps each sequence's state in one server process. Behind a Service,
kube-proxy picks a pod per *connection*: an HTTP client that opens a new connection per request, a
connection pool, or a gRPC channel reconnecting after the server's ``--grpc-max-connection-age`` GOAWAY
(the operator sets it to half of ``drainSeconds``) lands on any replica, where the sequence is unknown
(Triton's "must specify the START flag on the first request of the sequence"). Seen on the local cluster
with 2 replicas (e2e/test_sequence_replicas.py).

The remedy chosen: the pool's Service gets ``sessionAffinity: ClientIP`` while the pool serves a sequence
model (``spec.sessionAffinity: Auto``, the default), so every connection of a client reaches the same
replica, reconnects included; kube-proxy does it, no mesh and no proxy of our own. The affinity lasts
``timeoutSeconds`` after a client's last new connection: twice the longest ``maxSequenceIdleMicroseconds``
of the pool's sequence models (at least 30 s), since a sequence idle longer has lost its slot anyway, and
a client idle that long may be moved to a newer replica. What it cannot do, said in the model's
``SequenceRouting`` condition: clients behind one address (a gateway, a NAT) all share one replica, and a
replica that stops (scale-down, rollout) loses its sequences, as a Triton process does.
``spec.sessionAffinity: None`` turns it off (the condition then says sequences may break across replicas);
``ClientIP`` sets it whatever the models. A pool that scales to zero is reached through KEDA's HTTP add-on
interceptor, the one client address its Service sees: the affinity then sends every request of the pool to
one replica (sequences stay whole, the other replicas idle), and the condition says so. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..api.server_types import InferenceServerSpec
from ..api.status import Condition

#: Triton's default max_sequence_idle_microseconds (1 s)
DEFAULT_IDLE_US = 1_000_000
MIN_TIMEOUT = 30
MAX_TIMEOUT = 86_400  # the Service API's limit


def sequence_models(models: Iterable[Mapping[str, Any]], server: str) -> list[Mapping[str, Any]]:
    """The InferenceModels of ``server`` that are sequence-batched."""
    return [
        m
        for m in models
        if (m.get("spec") or {}).get("server") == server and (m.get("spec") or {}).get("sequenceBatching") is not None
    ]


def affinity(server_spec: InferenceServerSpec, stateful: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The Service's ``sessionAffinityConfig`` to set (None: no affinity)."""
    mode = server_spec.session_affinity
    if mode == "None" or (mode == "Auto" and not stateful):
        return None
    idle_us = max(
        [int(m["spec"]["sequenceBatching"].get("maxSequenceIdleMicroseconds") or DEFAULT_IDLE_US) for m in stateful]
        or [DEFAULT_IDLE_US]
    )
    timeout = min(MAX_TIMEOUT, max(MIN_TIMEOUT, math.ceil(2 * idle_us / 1_000_000)))
    return {"clientIP": {"timeoutSeconds": timeout}}


def may_run_replicas(server_spec: InferenceServerSpec) -> bool:
    """Whether the pool may run more than one replica (its replicas or its autoscaler's maximum)."""
    scaling = server_spec.autoscaling
    return server_spec.replicas > 1 or (scaling is not None and scaling.max_replicas > 1)


def model_condition(
    model_spec: Mapping[str, Any], server_spec: InferenceServerSpec, through_interceptor: bool = False
) -> Condition | None:
    """``SequenceRouting`` for a sequence model (None for any other); ``through_interceptor``: the pool scales
    to zero, so its requests come from KEDA's HTTP add-on interceptor."""
    if model_spec.get("sequenceBatching") is None:
        return None
    mode = server_spec.session_affinity
    if not may_run_replicas(server_spec):
        return Condition(
            "SequenceRouting",
            True,
            "OneReplica",
            "one replica holds every sequence (a rollout or a restart loses the live ones, as with Triton)",
        )
    if mode == "None":
        return Condition(
            "SequenceRouting",
            False,
            "NoAffinity",
            "the pool runs several replicas and its spec.sessionAffinity is None: a client's new connection "
            "(a connection pool, a gRPC reconnect after --grpc-max-connection-age) may reach another replica, "
            "where its sequence is unknown; set spec.sessionAffinity to Auto or ClientIP, or run one replica",
        )
    if through_interceptor:
        return Condition(
            "SequenceRouting",
            False,
            "OneAddressThroughInterceptor",
            "the pool scales to zero, so every request reaches it from KEDA's HTTP add-on interceptor, the one "
            "client address its Service sees: the session affinity that keeps each sequence on its replica sends "
            "all of the pool's requests to one replica and the others serve none; set spec.autoscaling."
            "maxReplicas to 1, or serve the sequence model on a pool that does not scale to zero",
        )
    return Condition(
        "SequenceRouting",
        True,
        "ClientAffinity",
        "the pool's Service sends every connection of a client to one replica (sessionAffinity ClientIP), "
        "reconnects included; clients behind one address share a replica, and a replica that stops loses "
        "its live sequences",
    )
