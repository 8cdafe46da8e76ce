"""The operator's flags are built from its settings (``settings.OperatorConfig`` field metadata).

A default is written once, on the setting: the command line without flags gives exactly the settings' defaults,
each flag lands on its setting, and the flag names are the ones the chart and the docs use.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubeinfer.operator.cli import build_parser
from kubeinfer.operator.controllers import settings
from kubeinfer.operator.controllers.settings import OperatorConfig
from kubeinfer.server.sources.egress import HostRules, parse_networks

#: the command line the chart (helm/kubeinfer/templates/deployment.yaml) and the README use: it must not change
FLAGS = {
    "--kubeconfig", "--repository-root", "--claim-name", "--claim-namespace", "--namespace", "--tenant-claim-name",
    "--operator-pod-labels", "--pool-egress-policy", "--pool-egress-cidr", "--dns-namespace-labels",
    "--dns-pod-labels", "--interceptor-namespace", "--interceptor-pod-labels", "--monitoring-namespace",
    "--default-allowed-backends", "--server-image-prefix", "--resync-seconds", "--server-endpoint",
    "--max-artifact-bytes", "--fetch-timeout", "--fetch-deadline", "--fetch-proxy", "--allowed-network",
    "--blocked-network", "--ambient-s3-credentials", "--ambient-gcs-credentials", "--ambient-azure-credentials",
    "--allowed-hosts", "--route-domains", "--downloads-per-namespace", "--downloads-total", "--workers",
    "--namespace-quota-bytes", "--namespace-quota", "--onnx-check-timeout", "--fetch-ca-file", "--unload-timeout",
    "--prometheus-url", "--keda-http-scaler-address", "--leader-election", "--leader-election-namespace",
    "--lease-name", "--lease-duration", "--lease-renew-deadline", "--lease-retry-period", "--liveness", "--log-level",
}  # fmt: skip


def _config(*argv: str) -> OperatorConfig:
    return OperatorConfig(**settings.from_flags(vars(build_parser().parse_args(["--repository-root", "/r", *argv]))))


def test_the_flag_names_stay() -> None:
    usage = build_parser().format_usage()  # every flag, once
    assert set(re.findall(r"--[a-z0-9-]+", usage)) - {"--help"} == FLAGS


def test_no_flags_give_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert _config() == OperatorConfig(repository_root=Path("/r"))


def test_each_flag_lands_on_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    config = _config(
        "--workers=6",
        "--fetch-deadline=600",
        "--onnx-check-timeout=30",
        "--allowed-network=10.20.0.0/16",
        "--allowed-network=192.168.7.7",
        "--allowed-hosts=team-a=models.example.com",
        "--ambient-s3-credentials=team-a,team-b",
        "--ambient-s3-credentials=team-c",
        "--namespace-quota=team-b=0",
        "--server-endpoint=ns/pool=http://127.0.0.1:8000",
        "--default-allowed-backends=onnxruntime,tensorrt",
        "--namespace=team-a",
    )
    assert (config.workers, config.fetch_deadline, config.onnx_check_timeout) == (6, 600.0, 30.0)
    assert config.allowed_networks == parse_networks(["10.20.0.0/16", "192.168.7.7"])
    assert config.allowed_hosts == HostRules.parse(["team-a=models.example.com"])
    assert config.ambient_s3_namespaces == ("team-a", "team-b", "team-c")
    assert config.namespace_quotas == {"team-b": 0}
    assert config.server_endpoints == {"ns/pool": "http://127.0.0.1:8000"}
    assert config.default_allowed_backends == ("onnxruntime", "tensorrt")
    assert config.namespaces == ["team-a"]
    assert config.claim_namespace == "ops"  # $POD_NAMESPACE is --claim-namespace's default


def test_the_lease_flags_land_on_the_lease_timings() -> None:
    def timings(*argv: str) -> settings.LeaseTimings:
        parsed = vars(build_parser().parse_args(["--repository-root", "/r", *argv]))
        return settings.LeaseTimings(**settings.from_flags(parsed, settings.LeaseTimings))

    assert timings() == settings.LeaseTimings()
    assert timings("--lease-duration=30", "--lease-retry-period=1").duration == 30.0
    assert timings("--lease-renew-deadline=8").renew_deadline == 8.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--allowed-network=10.0.0.0/33"], "--allowed-network"),
        (["--default-allowed-backends=onnxruntime,bogus"], "unknown backend(s) bogus"),
        (["--namespace-quota=team-b"], "expected NAMESPACE=BYTES, got 'team-b'"),
        (["--workers=many"], "invalid int value: 'many'"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_mistake(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--repository-root", "/r", *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
