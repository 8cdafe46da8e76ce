"""The address rules and host allow-lists of downloads (operator/egress.py): pure functions, every class."""

from __future__ import annotations

import ipaddress

import pytest
from kubeinfer.server.sources.egress import (
    AddressPolicy,
    HostRules,
    address_class,
    check_pattern,
    embedded_ipv4,
    host_matches,
    parse_networks,
)


@pytest.mark.parametrize(
    ("address", "cls"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.0.9", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud metadata endpoint
        ("fe80::1", "link-local"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("224.0.0.1", "multicast"),  # Python calls multicast "global"
        ("239.1.1.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "special-purpose"),  # documentation
        ("198.18.0.1", "special-purpose"),  # benchmarking
        ("2001:db8::1", "special-purpose"),
        ("::ffff:127.0.0.1", "loopback (IPv4 inside IPv6)"),
        ("64:ff9b::a9fe:a9fe", "link-local (IPv4 inside IPv6)"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", "loopback (IPv4 inside IPv6)"),  # 6to4 of 127.0.0.1
        ("2002:a00:1::", "private (IPv4 inside IPv6)"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),
    ],
)
def test_address_classes(address: str, cls: str | None) -> None:
    assert address_class(ipaddress.ip_address(address)) == cls


def test_embedded_ipv4() -> None:
    assert embedded_ipv4(ipaddress.ip_address("::ffff:10.1.2.3")) == ipaddress.ip_address("10.1.2.3")
    assert embedded_ipv4(ipaddress.ip_address("64:ff9b::a01:203")) == ipaddress.ip_address("10.1.2.3")
    assert embedded_ipv4(ipaddress.ip_address("2606:4700::1")) is None
    assert embedded_ipv4(ipaddress.ip_address("10.1.2.3")) is None


def test_policy_allows_public_and_allowed_and_never_blocked() -> None:
    ip = ipaddress.ip_address
    default = AddressPolicy()
    assert default.refusal(ip("8.8.8.8")) is None
    assert default.refusal(ip("10.1.2.3")) == "private"
    allowed = AddressPolicy(allowed=parse_networks(["10.1.0.0/16", "fd00::/8"]))
    assert allowed.refusal(ip("10.1.2.3")) is None
    assert allowed.refusal(ip("10.2.0.1")) == "private"
    assert allowed.refusal(ip("fd00::5")) is None
    assert allowed.refusal(ip("::ffff:10.1.2.3")) is None  # the socket connects to the IPv4 address
    both = AddressPolicy(allowed=parse_networks(["10.0.0.0/8"]), blocked=parse_networks(["10.96.0.0/12"]))
    assert both.refusal(ip("10.96.0.1")) == "blocked by the operator"  # blocked wins over allowed
    assert both.refusal(ip("10.1.0.1")) is None
    public_pods = AddressPolicy(blocked=parse_networks(["34.118.224.0/20"]))  # a "public" Service CIDR
    assert public_pods.refusal(ip("34.118.224.10")) == "blocked by the operator"
    assert public_pods.refusal(ip("::ffff:34.118.224.10")) == "blocked by the operator"
    assert public_pods.refusal(ip("2002:2276:e00a::")) == "blocked by the operator"  # its 6to4 form


def test_parse_networks() -> None:
    assert [str(n) for n in parse_networks(["10.0.0.0/8, 192.168.1.7", "fd00::/8"])] == [
        "10.0.0.0/8",
        "192.168.1.7/32",
        "fd00::/8",
    ]
    with pytest.raises(ValueError, match="'10.0.0.0/33' is not a network"):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="'example.com' is not a network"):
        parse_networks(["example.com"])


@pytest.mark.parametrize(
    ("host", "pattern", "matches"),
    [
        ("models.example.com", "models.example.com", True),
        ("Models.Example.COM.", "models.example.com", True),
        ("models.example.com", "example.com", False),
        ("a.s3.amazonaws.com", "*.s3.amazonaws.com", True),
        ("a.b.s3.amazonaws.com", "*.s3.amazonaws.com", True),
        ("s3.amazonaws.com", "*.s3.amazonaws.com", False),
        ("evils3.amazonaws.com", "*.s3.amazonaws.com", False),
        ("s3.amazonaws.com.evil.io", "*.s3.amazonaws.com", False),
        ("anything.io", "*", True),
        ("10.0.0.1", "10.0.0.1", True),
        ("::1", "[::1]", True),
        ("0:0::1", "::1", True),
        ("10.0.0.1", "*.0.0.1", False),  # a wildcard never matches an address
    ],
)
def test_host_patterns(host: str, pattern: str, matches: bool) -> None:
    assert host_matches(host, pattern) is matches


@pytest.mark.parametrize(
    "bad", ["", "*.", "a.*.com", "*foo.com", "http://x.com", "x.com/path", "user@x.com", "x.com:443"]
)
def test_bad_host_patterns_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        check_pattern(bad)


def test_host_rules_per_namespace() -> None:
    rules = HostRules.parse(["team-a=models.example.com,*.blob.core.windows.net", "*=*.example.org", "locked="])
    assert rules.allows("team-a", "models.example.com")
    assert rules.allows("team-a", "x.blob.core.windows.net")
    assert not rules.allows("team-a", "a.example.org")  # a namespace's own list replaces '*'
    assert rules.allows("team-b", "a.example.org")
    assert not rules.allows("team-b", "models.example.com")
    assert not rules.allows("locked", "a.example.org")  # an empty list: no downloads at all
    assert HostRules().allows("anyone", "anything.io")  # default: any host (the address rules still apply)
    assert HostRules.parse(["team-a=a.io", "team-a=b.io"]).patterns("team-a") == ("a.io", "b.io")
    with pytest.raises(ValueError, match="NAMESPACE=HOST"):
        HostRules.parse(["models.example.com"])
