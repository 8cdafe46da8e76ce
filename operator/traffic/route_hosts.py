"""Which host names a namespace may route through the shared scale-to-zero interceptor.

KEDA's HTTP add-on runs one interceptor for the whole cluster and picks a route by the request's
``Host``. A pool's ``scaleToZero.hosts`` therefore claims a name cluster-wide: unchecked, namespace B
could claim ``resnet.team-a`` first and receive team A's requests and bearer tokens. So a namespace may
route only:

* its own Service names (``<service>.<namespace>``, ``<service>.<namespace>.svc[.<cluster domain>]``),
  never another namespace's; and
* names under a domain the admin gives that namespace (``--route-domains NAMESPACE=DOMAIN[,DOMAIN...]``,
  chart value ``keda.httpAddon.hostDomains``; ``*`` names the default for every other namespace and
  ``{namespace}`` in a domain stands for the namespace's name). No domain given: no extra names at all.

A name another route already claims (a route of another pool, or one made by hand) is a conflict: the
pool is not routed that name and its ``ScaleToZero`` condition says so (first come keeps it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeinfer.server.sources.egress import namespace_lists

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PLACEHOLDER = "{namespace}"


def normal(host: str) -> str:
    return host.strip().lower().rstrip(".")


def is_dns_name(name: str) -> bool:
    """An RFC 1123 host name of at most 253 characters (no wildcard, no port, no address)."""
    return 0 < len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))


def service_namespace(host: str) -> str | None:
    """The namespace a cluster Service name points into (``svc.ns``, ``svc.ns.svc[...]``), else None."""
    labels = host.split(".")
    if len(labels) == 2:
        return labels[1]
    if len(labels) >= 3 and labels[2] == "svc":
        return labels[1]
    return None


def check_domain(domain: str) -> str:
    """A domain of ``--route-domains``: a DNS name of two labels or more, ``{namespace}`` allowed in it."""
    d = normal(domain)
    if not is_dns_name(d.replace(PLACEHOLDER, "ns")) or "." not in d:
        raise ValueError(f"route domain '{domain}' must be a DNS name such as models.example.com")
    return d


@dataclass(frozen=True)
class RouteDomains:
    """Per-namespace domains for scale-to-zero host names: a namespace's own list, else the ``*`` list."""

    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def domains(self, namespace: str) -> tuple[str, ...]:
        raw = self.lists.get(namespace, self.lists.get("*", ()))
        return tuple(d.replace(PLACEHOLDER, namespace) for d in raw)

    @classmethod
    def parse(cls, values: Iterable[str]) -> RouteDomains:
        """From ``--route-domains NAMESPACE=DOMAIN[,DOMAIN...]`` flags."""
        return cls(namespace_lists(values, check_domain, "DOMAIN"))


def refusal(namespace: str, host: str, domains: tuple[str, ...]) -> str | None:
    """Why ``namespace`` may not route ``host`` (None: it may)."""
    h = normal(host)
    if not is_dns_name(h):
        return f"'{host}' is not a DNS host name"
    owner = service_namespace(h)
    if owner is not None:
        if owner == namespace:
            return None
        return f"'{host}' is a Service name of namespace '{owner}'"
    if any(h == d or h.endswith("." + d) for d in domains):
        return None
    if not domains:
        return (
            f"'{host}': the operator gives namespace '{namespace}' no domain for scale-to-zero host names "
            "(chart value keda.httpAddon.hostDomains)"
        )
    return f"'{host}' is not under a domain namespace '{namespace}' may use ({', '.join(domains)})"


def claimed_elsewhere(routes: Iterable[Mapping[str, Any]], owner_uid: str) -> dict[str, str]:
    """Host → ``namespace/route`` for every host a route not owned by ``owner_uid`` claims."""
    claims: dict[str, str] = {}
    for route in routes:
        meta = route.get("metadata") or {}
        if any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or ()):
            continue
        where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for rule in (route.get("spec") or {}).get("rules") or ():
            for host in rule.get("hosts") or ():
                if isinstance(host, str):
                    claims.setdefault(normal(host), where)
    return claims
