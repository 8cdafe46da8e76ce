"""The chart's download rules and the operator pod's egress NetworkPolicy, rendered by the real helm binary.

The local cluster's CNI (a plain bridge) does not enforce NetworkPolicy, so the policy is checked as
rendered: its rules are evaluated here for the destinations that matter (the metadata endpoint, the
node, private and public addresses), the manifests validate with kubeconform, the operator's own
argument parser accepts the arguments the chart gives it, and a server-side dry run against the real
API server fills in the API server's address.
"""

from __future__ import annotations

import ipaddress
import json
import uuid
from pathlib import Path

import pytest
import yaml
from kubeinfer.operator.cli import build_parser

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeinfer"

RULES = [
    "--set", "artifacts.allowedNetworks={10.20.0.0/16,192.168.7.7}",
    "--set", "artifacts.blockedNetworks={34.118.224.0/20}",
    "--set", "artifacts.allowedHosts.team-a={models.example.com,*.s3.amazonaws.com}",
    "--set", "artifacts.allowedHosts.*={*.example.org}",
    "--set", "artifacts.fetchDeadlineSeconds=600",
    "--set", "artifacts.downloadsPerNamespace=1",
    "--set", "artifacts.downloadsTotal=3",
    "--set", "artifacts.namespaceQuotaBytes=53687091200",
    "--set", "artifacts.namespaceQuotas.team-b=0",
    "--set", "artifacts.onnxCheckTimeoutSeconds=30",
    "--set", "operator.workers=6",
    "--set", "operator.watchNamespaces={team-a,team-b}",
    "--set", "networkPolicy.apiServerCIDRs={172.18.0.2}",
    "--set", "networkPolicy.serverPorts={8000}",
]  # fmt: skip


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _render(helm, *values: str) -> list[dict]:
    return _docs(helm("template", "ki", str(CHART), "-n", "ops", *values).stdout)


def _policy(docs: list[dict]) -> dict:
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return policy


def _args(docs: list[dict]) -> list[str]:
    dep = next(d for d in docs if d["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]["containers"][0]["args"]


def allows(policy: dict, address: str, port: int) -> bool:
    """Whether an egress rule with an ipBlock lets the pod reach ``address:port`` (TCP). Selector-based
    rules (DNS, server pods) never match an address here, as for traffic leaving the cluster."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        ports = rule.get("ports")
        if ports is not None and not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports):
            continue
        peers = rule.get("to")
        if peers is None:
            return True  # no `to`: any destination on these ports
        for peer in peers:
            block = peer.get("ipBlock")
            if block is None:
                continue
            net = ipaddress.ip_network(block["cidr"])
            if ip.version == net.version and ip in net:
                if not any(ip in ipaddress.ip_network(e) for e in block.get("except", ())):
                    return True
    return False


def test_defaults_open_dns_apiserver_servers_and_public_http_only(helm) -> None:
    docs = _render(helm)
    policy = _policy(docs)
    assert policy["spec"]["policyTypes"] == ["Egress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "kubeinfer-operator",
        "app.kubernetes.io/instance": "ki",
    }
    dns, api, servers, public = policy["spec"]["egress"]
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    # helm template cannot look the API server up: its ports, anywhere
    assert "to" not in api and [p["port"] for p in api["ports"]] == [443, 6443]
    assert servers == {
        "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "kubeinfer-operator"}},
                "namespaceSelector": {}}]
    }  # fmt: skip
    assert [p["port"] for p in public["ports"]] == [80, 443]
    for address, port, expected in [
        ("8.8.8.8", 443, True),
        ("8.8.8.8", 80, True),
        ("8.8.8.8", 22, False),
        ("169.254.169.254", 80, False),  # the cloud metadata endpoint
        ("10.0.0.1", 80, False),
        ("172.20.0.1", 80, False),
        ("192.168.1.1", 80, False),
        ("100.64.0.1", 80, False),
        ("127.0.0.1", 80, False),
        ("2606:4700::1111", 443, True),
        ("fd00::1", 80, False),
        ("fe80::1", 80, False),
        # IPv6 prefixes that lead to an IPv4 address: the policy cannot see the IPv4 address inside, so none is
        # open (an IPv4-mapped destination is an IPv4 connection, which the IPv4 block governs; the API server
        # refuses ::ffff:0:0/96 in an IPv6 block)
        ("64:ff9b::a9fe:a9fe", 80, False),  # NAT64 of 169.254.169.254
        ("2002:a00:1::1", 80, False),  # 6to4 of 10.0.0.1
    ]:
        assert allows(policy, address, port) is expected, (address, port)
    args = _args(docs)
    for arg in ("--fetch-deadline=1800", "--downloads-per-namespace=2", "--downloads-total=4", "--workers=8",
                "--namespace-quota-bytes=107374182400", "--onnx-check-timeout=60"):  # fmt: skip
        assert arg in args, args
    assert not any(a.startswith(("--allowed-network", "--blocked-network", "--allowed-hosts")) for a in args)


def test_values_become_operator_arguments_and_policy_rules(helm) -> None:
    docs = _render(helm, *RULES)
    args = _args(docs)
    assert [a for a in args if a.startswith(("--allowed", "--blocked", "--namespace-quota="))] == [
        "--allowed-network=10.20.0.0/16",
        "--allowed-network=192.168.7.7",
        "--blocked-network=34.118.224.0/20",
        "--allowed-hosts=*=*.example.org",
        "--allowed-hosts=team-a=models.example.com,*.s3.amazonaws.com",
        "--namespace-quota=team-b=0",
    ]
    for arg in ("--fetch-deadline=600", "--downloads-per-namespace=1", "--downloads-total=3", "--workers=6",
                "--namespace-quota-bytes=53687091200", "--onnx-check-timeout=30"):  # fmt: skip
        assert arg in args, args
    # the operator's own parser accepts exactly what the chart passes
    parsed = build_parser().parse_args(args)
    assert parsed.allowed_network == ["10.20.0.0/16", "192.168.7.7"]
    assert parsed.namespace_quota == [("team-b", 0)] and parsed.workers == 6
    policy = _policy(docs)
    api = policy["spec"]["egress"][1]
    assert api["to"] == [{"ipBlock": {"cidr": "172.18.0.2/32"}}]
    servers = policy["spec"]["egress"][2]
    assert servers["to"][0]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]
    assert servers["ports"] == [{"port": 8000, "protocol": "TCP"}]
    assert policy["spec"]["egress"][4] == {
        "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}, {"ipBlock": {"cidr": "192.168.7.7/32"}}]
    }
    for address, port, expected in [
        ("10.20.3.4", 9000, True),  # an allowed network: any port
        ("192.168.7.7", 8080, True),
        ("192.168.7.8", 80, False),
        ("34.118.224.10", 443, False),  # a blocked "public" network
        ("34.118.240.10", 443, True),
        ("172.18.0.2", 6443, True),  # the API server
        ("172.18.0.3", 6443, False),
        ("169.254.169.254", 80, False),
    ]:
        assert allows(policy, address, port) is expected, (address, port)


def test_workload_identity_values(helm) -> None:
    """ambientGcsCredentials / ambientAzureCredentials: the operator's flags (its parser reads the namespaces), the
    pod label AKS's workload-identity webhook looks for (Azure only), and their token endpoints: Entra ID's is
    public (login.microsoftonline.com on 443), Google's metadata server opened for GCS only."""
    docs = _render(helm, "--set", "artifacts.ambientAzureCredentials={team-a,team-b}")
    args = _args(docs)
    assert [a for a in args if a.startswith("--ambient")] == [
        "--ambient-azure-credentials=team-a",
        "--ambient-azure-credentials=team-b",
    ]
    assert build_parser().parse_args(args).ambient_azure_credentials == ["team-a", "team-b"]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert "azure.workload.identity/use" not in dep["spec"]["selector"]["matchLabels"]
    policy = _policy(docs)
    assert allows(policy, "20.190.151.68", 443) and not allows(policy, "169.254.169.254", 80)
    plain = next(d for d in _render(helm, "--set", "artifacts.ambientGcsCredentials={*}") if d["kind"] == "Deployment")
    assert "azure.workload.identity/use" not in plain["spec"]["template"]["metadata"]["labels"]


def test_the_policy_can_be_switched_off(helm) -> None:
    docs = _render(helm, "--set", "networkPolicy.enabled=false")
    assert not [d for d in docs if d["kind"] == "NetworkPolicy"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "artifacts.allowedNetworks={metadata.internal}"], "allowedNetworks"),
        (["--set", "artifacts.allowedHosts.team-a={http://x.example.com/}"], "allowedHosts"),
        (["--set", "artifacts.allowedHosts.Team_A={x.example.com}"], "Team_A"),
        (["--set", "artifacts.downloadsPerNamespace=-1"], "downloadsPerNamespace"),
        (["--set", "artifacts.fetchDeadlineSeconds=0"], "fetchDeadlineSeconds"),
        (["--set", "artifacts.namespaceQuotaBytes=lots"], "namespaceQuotaBytes"),
        (["--set", "operator.workers=1"], "workers"),
        (["--set", "networkPolicy.fetchPorts={0}"], "fetchPorts"),
        (["--set", "networkPolicy.enable=true"], "enable"),
    ],
)
def test_schema_refuses_bad_download_values(helm, values, message) -> None:
    proc = helm("template", "ki", str(CHART), *values, check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr and message in proc.stderr


def test_rendered_policy_validates_with_kubeconform(helm, kubeconform, crd_schemas) -> None:
    for values in ([], RULES):
        rendered = helm("template", "ki", str(CHART), "-n", "ops", *values).stdout
        proc = kubeconform.validate(rendered, crd_schemas)
        report = json.loads(proc.stdout)
        assert proc.returncode == 0, json.dumps(report["resources"], indent=1)
        assert report["summary"]["valid"] == len(_docs(rendered))


def test_install_looks_up_the_api_servers_address(cluster, helm, kubectl) -> None:
    """A server-side dry run (lookups answered by the real API server) puts the `kubernetes` Service's
    endpoints into the policy's API server rule."""
    ns = f"e2e-egress-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    try:
        proc = helm("install", "ki", str(CHART), "-n", ns, "--dry-run=server", "--set", "repository.create=false")
        manifest = proc.stdout.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0]
        policy = _policy(_docs(manifest))
        slice_ = json.loads(kubectl("-n", "default", "get", "endpointslice", "kubernetes", "-o", "json").stdout)
        addresses = sorted(a for e in slice_["endpoints"] for a in e["addresses"])
        api = policy["spec"]["egress"][1]
        assert sorted(p["ipBlock"]["cidr"] for p in api["to"]) == [f"{a}/32" for a in addresses], api
        port = slice_["ports"][0]["port"]
        assert all(allows(policy, a, port) for a in addresses)
    finally:
        kubectl("delete", "namespace", ns, "--wait=false", check=False)
