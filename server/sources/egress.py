"""Where the operator may download from: the address rules and the per-namespace host allow-lists.

Pure functions and frozen values, so every rule is unit-testable; ``kubeinfer.server.sources.guard`` applies them
to every redirect hop and to the address a connection is actually made to. A tenant names
``source.uri``; without these rules that URI could point the operator at loopback, the node, a
cluster Service or the cloud metadata endpoint (169.254.169.254) and store the answer as a "model".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: RFC 6598 shared address space (carrier-grade NAT); Python's ``is_private`` leaves it out
SHARED = ipaddress.ip_network("100.64.0.0/10")
#: RFC 6052 NAT64 prefix: a gateway translates these to the IPv4 address in their last 32 bits
NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: RFC 1918 and unique-local IPv6: named "private" (the rest of the non-global space is "special-purpose")
PRIVATE = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))


class EgressRefused(Exception):
    """A download the rules refuse; ``rule`` names the rule, the message says what to change (no address)."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


def embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address leads to: IPv4-mapped, 6to4, NAT64 (else None)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_class(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public unicast address ("loopback", "link-local", ...), or None when it is."""
    inner = embedded_ipv4(ip)
    if inner is not None:  # mapped, 6to4 and NAT64 addresses lead to their IPv4 address: judge that
        cls = address_class(inner)
        return None if cls is None else f"{cls} (IPv4 inside IPv6)"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip in SHARED:
        return "shared (CGNAT)"
    if any(ip in net for net in PRIVATE):
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "special-purpose"
    return None


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDRs from flags (a bare address is a /32 or /128); ValueError names the bad one."""
    out = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"'{item}' is not a network (CIDR such as 10.1.0.0/16 or an address)") from None
    return tuple(out)


@dataclass(frozen=True)
class AddressPolicy:
    """Only public unicast addresses, plus ``allowed`` networks, never ``blocked`` ones (blocked wins).

    ``allowed`` is the chart's ``artifacts.allowedNetworks`` (an in-cluster model store, the e2e tests'
    file server); ``blocked`` covers what looks public but is not, e.g. a cluster whose Service or Pod
    CIDR is public address space.
    """

    allowed: tuple[IPNetwork, ...] = ()
    blocked: tuple[IPNetwork, ...] = ()

    def refusal(self, ip: IPAddress) -> str | None:
        """None when the operator may connect to ``ip``, else the address class that forbids it."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # the socket connects to the IPv4 address: judge that one
        candidates = [ip, *filter(None, [embedded_ipv4(ip)])]
        if any(a in net for a in candidates for net in self.blocked):
            return "blocked by the operator"
        if any(ip in net for net in self.allowed):
            return None
        return address_class(ip)


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is one (URL hosts may be bracketed IPv6), else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def normal_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def check_pattern(pattern: str) -> str:
    """A host pattern: ``*`` (any host), ``host.example.com``, ``*.example.com`` or an IP address."""
    p = pattern.strip().strip("[]").lower()
    if p == "*":
        return p
    body = (p[2:] if p.startswith("*.") else p).rstrip(".")
    bad_chars = "*" in body or "/" in body or " " in body or "@" in body
    if not body or bad_chars or (":" in body and literal_address(body) is None):
        raise ValueError(f"host pattern '{pattern}' must be '*', a host name, '*.domain' or an IP address")
    return normal_host(p)


def host_matches(host: str, pattern: str) -> bool:
    """``*.example.com`` matches any name below example.com (not example.com itself); IPs compare as addresses."""
    h, p = normal_host(host), normal_host(pattern)
    if p == "*":
        return True
    if p.startswith("*."):
        return literal_address(h) is None and h.endswith(p[1:]) and len(h) > len(p) - 1
    a, b = literal_address(h), literal_address(p)
    if a is not None or b is not None:
        return a is not None and a == b
    return h == p


def matches_any(host: str, patterns: Iterable[str]) -> bool:
    return any(host_matches(host, p) for p in patterns)


@dataclass(frozen=True)
class HostRules:
    """Per-namespace host allow-lists: a namespace's own list, else the ``*`` list, else any (public) host.

    A namespace's list replaces the ``*`` list (it does not add to it); an empty list allows no host.
    """

    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def patterns(self, namespace: str) -> tuple[str, ...] | None:
        return self.lists.get(namespace, self.lists.get("*"))

    def allows(self, namespace: str, host: str) -> bool:
        patterns = self.patterns(namespace)
        return patterns is None or matches_any(host, patterns)

    @classmethod
    def parse(cls, values: Iterable[str]) -> HostRules:
        """From ``--allowed-hosts NAMESPACE=PATTERN[,PATTERN...]`` flags (``*`` as NAMESPACE: the default)."""
        return cls(namespace_lists(values, check_pattern, "HOST"))


def namespace_lists(values: Iterable[str], check: Callable[[str], str], what: str) -> dict[str, tuple[str, ...]]:
    """``NAMESPACE=ITEM[,ITEM...]`` flags (repeatable, lists of one namespace add up), each item ``check``ed."""
    lists: dict[str, tuple[str, ...]] = {}
    for value in values:
        namespace, sep, rest = value.partition("=")
        namespace = namespace.strip()
        if not sep or not namespace:
            raise ValueError(f"expected NAMESPACE={what}[,{what}...], got '{value}'")
        lists[namespace] = lists.get(namespace, ()) + tuple(check(p) for p in rest.split(",") if p.strip())
    return lists
