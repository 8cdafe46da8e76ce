"""Scale-to-zero host names on the shared interceptor: a namespace routes its own names and its admin-given
domains only, and a name another route holds is reported, not taken (issue #37, item 4)."""

from __future__ import annotations

from typing import Any

import pytest
from kubeinfer.operator.cli import build_parser
from kubeinfer.operator.traffic import autoscaling
from kubeinfer.operator.traffic.route_hosts import RouteDomains, claimed_elsewhere, refusal, service_namespace

DOMAINS = RouteDomains.parse(["*={namespace}.models.example.com", "team-a=team-a.example.com,ml.example.org"])


def test_domains_per_namespace_with_the_placeholder_and_the_default() -> None:
    assert DOMAINS.domains("team-a") == ("team-a.example.com", "ml.example.org")
    assert DOMAINS.domains("team-b") == ("team-b.models.example.com",)
    assert RouteDomains().domains("team-b") == ()


@pytest.mark.parametrize("bad", ["team-a", "=x.example.com", "team-a=*.example.com", "team-a=example", "t=a b.com"])
def test_bad_domain_flags_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        RouteDomains.parse([bad])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--repository-root", "/tmp", "--route-domains", bad])


def test_service_names_point_into_their_namespace() -> None:
    assert service_namespace("resnet.team-a") == "team-a"
    assert service_namespace("resnet.team-a.svc") == "team-a"
    assert service_namespace("resnet.team-a.svc.cluster.local") == "team-a"
    assert service_namespace("resnet.models.example.com") is None


@pytest.mark.parametrize(
    ("namespace", "host", "allowed"),
    [
        ("team-b", "resnet.team-a", False),  # the grab the issue reproduced: another namespace's Service name
        ("team-b", "resnet.team-a.svc.cluster.local", False),
        ("team-a", "resnet.team-a", True),  # its own Service names
        ("team-a", "other.team-a.svc", True),
        ("team-a", "pool.team-a.example.com", True),  # under its domains
        ("team-a", "team-a.example.com", True),
        ("team-a", "x.ml.example.org", True),
        ("team-a", "evil-team-a.example.com", False),  # a suffix is not a domain
        ("team-a", "pool.team-b.models.example.com", False),  # the default domain of another namespace
        ("team-b", "pool.team-b.models.example.com", True),
        ("team-b", "pool.example.com", False),
        ("team-b", "POOL.Team-B.Models.Example.com.", True),  # names compare case-free, without the root dot
        ("team-b", "*.team-b.models.example.com", False),
        ("team-b", "10.0.0.1", False),
        ("team-b", "pool.team-b.models.example.com:80", False),
    ],
)
def test_which_names_a_namespace_may_route(namespace: str, host: str, allowed: bool) -> None:
    why = refusal(namespace, host, DOMAINS.domains(namespace))
    assert (why is None) is allowed, why


def test_without_a_domain_only_own_service_names() -> None:
    why = refusal("team-b", "pool.example.com", ())
    assert why is not None and "no domain" in why and "keda.httpAddon.hostDomains" in why
    assert refusal("team-b", "pool.team-b", ()) is None


def _route(ns: str, name: str, uid: str, *hosts: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "ownerReferences": [{"uid": uid}]},
        "spec": {"rules": [{"hosts": list(hosts)}]},
    }


def test_claims_of_other_routes_only() -> None:
    routes = [
        _route("team-a", "resnet-http", "uid-a", "resnet.team-a", "Pool.Example.com"),
        _route("b", "r", "uid-b", "x.b"),
    ]
    assert claimed_elsewhere(routes, "uid-b") == {
        "resnet.team-a": "team-a/resnet-http",
        "pool.example.com": "team-a/resnet-http",
    }


class Routes:
    """The operator's Kube as checked_hosts uses it: a cluster-wide InterceptorRoute listing (or a 403 for it)."""

    def __init__(self, routes: list[dict[str, Any]], cluster_forbidden: bool = False) -> None:
        self.routes, self.cluster_forbidden = routes, cluster_forbidden
        self.asked: list[str | None] = []

    def list_custom(self, group: str, version: str, plural: str, namespace: str | None) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        self.asked.append(namespace)
        if namespace is None and self.cluster_forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return [r for r in self.routes if namespace is None or r["metadata"]["namespace"] == namespace]


def _pool(ns: str, name: str, uid: str, hosts: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"image": "x", "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "scaleToZero": {"hosts": hosts}}},
    }


def test_a_pool_gets_its_allowed_free_names_and_hears_why_not_the_rest() -> None:
    kube = Routes([_route("team-a", "resnet-http", "uid-a", "resnet.team-a", "shared.team-b.models.example.com")])
    scaler = autoscaling.Autoscaler(kube, route_domains=DOMAINS)
    wanted = ["resnet.team-a", "shared.team-b.models.example.com", "mine.team-b.models.example.com", "x.other.org"]
    hosts, problems = scaler.checked_hosts(_pool("team-b", "pool", "uid-b", wanted))
    assert hosts == [
        "mine.team-b.models.example.com",
        "pool.team-b",
        "pool.team-b.svc",
        "pool.team-b.svc.cluster.local",
    ]
    reasons = dict(problems)
    assert [r for r, _ in problems] == ["HostRefused", "HostRefused", "HostConflict"]
    assert "Service name of namespace 'team-a'" in problems[0][1]
    assert "not under a domain" in problems[1][1]
    assert reasons["HostConflict"] == (
        "host 'shared.team-b.models.example.com' is already routed by InterceptorRoute team-a/resnet-http"
    )
    rendered = autoscaling.interceptor_routes(_pool("team-b", "pool", "uid-b", wanted), hosts)
    assert rendered[0]["spec"]["rules"][0]["hosts"] == hosts


def test_a_pool_whose_every_name_is_taken_is_refused() -> None:
    own = ["pool.team-b", "pool.team-b.svc", "pool.team-b.svc.cluster.local"]
    kube = Routes([_route("team-b", "by-hand", "uid-x", *own)], cluster_forbidden=True)
    with pytest.raises(autoscaling.AutoscalingError) as err:
        autoscaling.Autoscaler(kube).checked_hosts(_pool("team-b", "pool", "uid-b", []))
    assert err.value.reason == "HostConflict" and "team-b/by-hand" in err.value.message
    assert kube.asked == [None, "team-b"]  # a namespaced install lists its own namespace's routes
