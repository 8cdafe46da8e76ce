"""``kubeinfer-operator``: run the InferenceModel/InferenceServer operator (in-cluster or with a kubeconfig)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kopf
from kubeinfer.server.sources.egress import HostRules, parse_networks
from kubernetes.client import CoordinationV1Api

from .api.pool_defaults import parse_backends
from .controllers.reconcile_parts import RECHECK_THREADS
from .controllers.reconciler import FINALIZER, Reconciler
from .controllers.settings import OperatorConfig
from .controllers.wiring import register
from .kube.client import Kube, load_config
from .kube.leader import LeaseElector
from .liveness import FollowerLiveness
from .servers.network_policy import PolicyContext
from .traffic.autoscaling import DEFAULT_SCALER_ADDRESS
from .traffic.route_hosts import RouteDomains
from .volume.tenant_volumes import DEFAULT_CLAIM

ENDPOINTS_ENV = "KUBEINFER_SERVER_ENDPOINTS"


def _endpoint(value: str) -> tuple[str, str]:
    key, sep, url = value.partition("=")
    if not sep or key.count("/") != 1 or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/SERVER=http(s)://HOST:PORT, got '{value}'")
    return key, url


def _labels(value: str) -> dict[str, str]:
    pairs = [p.partition("=") for p in value.split(",") if p]
    if any(not sep or not k for k, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,KEY=VALUE...], got '{value}'")
    return {k: v for k, _, v in pairs}


def _quota(value: str) -> tuple[str, int]:
    namespace, sep, size = value.partition("=")
    if not sep or not namespace or not size.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAMESPACE=BYTES, got '{value}'")
    return namespace, int(size)


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def _networks(value: str) -> str:
    try:
        parse_networks([value])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _hosts(value: str) -> str:
    try:
        HostRules.parse([value])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _backends(value: str) -> tuple[str, ...]:
    try:
        return parse_backends(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _route_domains(value: str) -> str:
    try:
        RouteDomains.parse([value])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubeinfer-operator", description=__doc__)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    p.add_argument(
        "--repository-root",
        type=Path,
        required=True,
        help="where the model repository volume is mounted; servers' subPaths are folders below it",
    )
    p.add_argument(
        "--claim-name",
        help="the PVC mounted at --repository-root: the operator provides each namespace a claim on its folder of "
        "it, and refuses servers' claims that reach beyond their namespace's folder (without it: nothing is "
        "provided or checked, for development)",
    )
    p.add_argument(
        "--claim-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of --claim-name and of the operator's pods (default $POD_NAMESPACE)",
    )
    p.add_argument(
        "--namespace", action="append", default=[], help="watch only this namespace (repeatable; default all)"
    )
    p.add_argument(
        "--tenant-claim-name",
        default=DEFAULT_CLAIM,
        help="the PersistentVolumeClaim the operator provides in each namespace with InferenceServers that name "
        "no claim: bound to a PersistentVolume it makes that reaches only <volume>/<namespace>/",
    )
    p.add_argument(
        "--operator-pod-labels",
        type=_labels,
        default={},
        metavar="K=V[,K=V]",
        help="labels of the operator's pods; servers' NetworkPolicies let pods with them in --claim-namespace call "
        "the servers (default: any pod of that namespace)",
    )
    p.add_argument(
        "--pool-egress-policy",
        type=_bool,
        default=True,
        help="whether pools' NetworkPolicies close egress to all but DNS and --pool-egress-cidr (default true)",
    )
    p.add_argument(
        "--pool-egress-cidr",
        action="append",
        default=[],
        type=_networks,
        metavar="CIDR",
        help="a network pool pods may reach besides DNS, any port (repeatable; default none)",
    )
    p.add_argument(
        "--dns-namespace-labels",
        type=_labels,
        default={"kubernetes.io/metadata.name": "kube-system"},
        metavar="K=V[,K=V]",
        help="labels of the cluster DNS's namespace, which pool pods may reach (default: kube-system's name)",
    )
    p.add_argument(
        "--dns-pod-labels",
        type=_labels,
        default={"k8s-app": "kube-dns"},
        metavar="K=V[,K=V]",
        help="labels of the cluster DNS's pods (default k8s-app=kube-dns)",
    )
    p.add_argument(
        "--interceptor-namespace",
        default="keda",
        help="namespace of KEDA's HTTP add-on interceptor: pools that scale to zero let its pods in (default keda)",
    )
    p.add_argument(
        "--interceptor-pod-labels",
        type=_labels,
        default={"app.kubernetes.io/name": "http-add-on", "app.kubernetes.io/component": "interceptor"},
        metavar="K=V[,K=V]",
        help="labels of the interceptor's pods (default: those of the add-on's chart)",
    )
    p.add_argument(
        "--monitoring-namespace",
        action="append",
        default=[],
        help="namespace allowed to scrape the servers' metrics port through their NetworkPolicies (repeatable)",
    )
    p.add_argument(
        "--default-allowed-backends",
        type=_backends,
        default=None,
        metavar="BACKEND[,BACKEND...]",
        help="the backends a pool allows when its spec.allowedBackends is unset (default: every backend; the chart "
        "sets the backends whose models are not code: python, pytorch and tensorflow run the model author's code)",
    )
    p.add_argument(
        "--server-image-prefix",
        action="append",
        default=[],
        help="InferenceServers may run only images starting with this (repeatable; default any image)",
    )
    p.add_argument(
        "--resync-seconds", type=float, default=30.0, help="timer interval that repairs drift and refreshes status"
    )
    p.add_argument(
        "--server-endpoint",
        action="append",
        type=_endpoint,
        default=[],
        metavar="NS/SERVER=URL",
        help=f"read this server's repository index at URL, not its Service (repeatable; also ${ENDPOINTS_ENV})",
    )
    p.add_argument("--max-artifact-bytes", type=int, default=20 << 30, help="largest model file to download or copy")
    p.add_argument("--fetch-timeout", type=float, default=60.0, help="seconds without progress before a download fails")
    p.add_argument(
        "--fetch-deadline",
        type=float,
        default=1800.0,
        help="longest a download may take in all (slow servers included), in seconds",
    )
    p.add_argument(
        "--fetch-proxy",
        help="HTTP(S) proxy for model downloads (proxy environment variables are not used); the proxy must "
        "refuse non-public destinations itself: the operator cannot see where it connects",
    )
    p.add_argument(
        "--allowed-network",
        action="append",
        default=[],
        type=_networks,
        metavar="CIDR",
        help="a non-public network downloads may reach anyway, e.g. an in-cluster model store (repeatable; "
        "default: public addresses only)",
    )
    p.add_argument(
        "--blocked-network",
        action="append",
        default=[],
        type=_networks,
        metavar="CIDR",
        help="a network downloads may never reach, e.g. a Service or Pod CIDR in public address space "
        "(repeatable; wins over --allowed-network)",
    )
    p.add_argument(
        "--ambient-s3-credentials",
        action="append",
        default=[],
        metavar="NAMESPACE[,NAMESPACE...]",
        help="namespaces whose s3:// sources without source.credentialsSecret are signed with the operator's own "
        "AWS credentials (botocore's chain: web identity token / IRSA, instance role); '*' is every namespace. "
        "Default: none (such a source is fetched anonymously)",
    )
    p.add_argument(
        "--ambient-gcs-credentials",
        action="append",
        default=[],
        metavar="NAMESPACE[,NAMESPACE...]",
        help="namespaces whose gs:// sources without source.credentialsSecret use the operator's own Google "
        "credentials (workload identity's metadata server, or GOOGLE_APPLICATION_CREDENTIALS), toward "
        "https://storage.googleapis.com only; '*' is every namespace. Default: none (fetched anonymously)",
    )
    p.add_argument(
        "--ambient-azure-credentials",
        action="append",
        default=[],
        metavar="NAMESPACE[,NAMESPACE...]",
        help="namespaces whose az:// sources without source.credentialsSecret use the operator's own Azure "
        "credentials (Microsoft Entra Workload ID: AZURE_CLIENT_ID, AZURE_TENANT_ID, AZURE_FEDERATED_TOKEN_FILE), "
        "toward https://<account>.blob.core.windows.net only; '*' is every namespace. Default: none (fetched "
        "anonymously)",
    )
    p.add_argument(
        "--allowed-hosts",
        action="append",
        default=[],
        type=_hosts,
        metavar="NAMESPACE=HOST[,HOST...]",
        help="the hosts a namespace may download from (repeatable; '*.example.com' matches below it; NAMESPACE "
        "'*' is every namespace without a list of its own; default: any public host)",
    )
    p.add_argument(
        "--route-domains",
        action="append",
        default=[],
        type=_route_domains,
        metavar="NAMESPACE=DOMAIN[,DOMAIN...]",
        help="domains under which a namespace's scale-to-zero pools may claim host names on the shared interceptor "
        "(repeatable; NAMESPACE '*' is every namespace without a list of its own, and '{namespace}' in a domain "
        "stands for the namespace; default: none, a pool is routed its own Service names only)",
    )
    p.add_argument(
        "--downloads-per-namespace",
        type=int,
        default=2,
        help="downloads one namespace may run at once; more wait with the condition Queued (0: no limit)",
    )
    p.add_argument(
        "--downloads-total",
        type=int,
        default=4,
        help="downloads the operator runs at once in all (0: no limit); keep it below --workers",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=8,
        help="threads that run model reconciles (and kopf's handler threads: deletes, servers)",
    )
    p.add_argument(
        "--namespace-quota-bytes",
        type=int,
        default=0,
        help="bytes a namespace's folder on the volume may hold; a model that would pass it gets the "
        "condition QuotaExceeded (0: no quota)",
    )
    p.add_argument(
        "--namespace-quota",
        action="append",
        default=[],
        type=_quota,
        metavar="NAMESPACE=BYTES",
        help="the quota of one namespace, replacing --namespace-quota-bytes for it (repeatable; 0: none)",
    )
    p.add_argument(
        "--onnx-check-timeout",
        type=float,
        default=60.0,
        help="seconds the check of one ONNX file against its config may take before the file is refused",
    )
    p.add_argument(
        "--fetch-ca-file", help="CA bundle trusted for https model downloads, replacing the system's (private stores)"
    )
    p.add_argument(
        "--unload-timeout",
        type=float,
        default=120.0,
        help="longest wait for a server to unload a deleted model before its finalizer is released",
    )
    p.add_argument(
        "--prometheus-url",
        help="Prometheus that KEDA ScaledObjects query, e.g. http://prometheus-server.monitoring.svc:9090 "
        "(an InferenceServer's spec.autoscaling.prometheus.serverAddress overrides it)",
    )
    p.add_argument(
        "--keda-http-scaler-address",
        default=DEFAULT_SCALER_ADDRESS,
        help="host:port of KEDA's HTTP add-on external scaler, named by the ScaledObjects of pools with "
        f"minReplicas 0 (default {DEFAULT_SCALER_ADDRESS}, the add-on chart's Service)",
    )
    p.add_argument(
        "--leader-election", action="store_true", help="run only while holding a Lease (for more than one replica)"
    )
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--lease-name", default="kubeinfer-operator")
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds a followers waits for a silent leader")
    p.add_argument(
        "--lease-renew-deadline",
        type=float,
        default=10.0,
        help="the leader stops when it could not renew for this long",
    )
    p.add_argument("--lease-retry-period", type=float, default=2.0, help="seconds between lease attempts")
    p.add_argument("--liveness", metavar="URL", help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop`` while a follower waits (kopf installs its own handlers once it runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers < 2 or (args.downloads_total and args.downloads_total >= args.workers):
        parser.error(
            "--downloads-total must be below --workers (and --workers at least 2): threads must be left "
            "for models that need no download"
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    endpoints = dict(args.server_endpoint)
    for item in filter(None, os.environ.get(ENDPOINTS_ENV, "").split(",")):
        endpoints.setdefault(*_endpoint(item.strip()))
    root = args.repository_root
    if not root.is_dir():
        print(f"kubeinfer-operator: --repository-root '{root}' is not a folder", file=sys.stderr)
        return 2
    # the model work queue and kopf's executor (each --workers threads), the rechecks, the server resyncs
    load_config(args.kubeconfig, connections=2 * args.workers + RECHECK_THREADS + 4)
    config = OperatorConfig(
        repository_root=root,
        resync_seconds=args.resync_seconds,
        server_endpoints=endpoints,
        max_artifact_bytes=args.max_artifact_bytes,
        fetch_timeout=args.fetch_timeout,
        fetch_proxy=args.fetch_proxy,
        fetch_ca_file=args.fetch_ca_file,
        fetch_deadline=args.fetch_deadline,
        allowed_networks=parse_networks(args.allowed_network),
        blocked_networks=parse_networks(args.blocked_network),
        allowed_hosts=HostRules.parse(args.allowed_hosts),
        ambient_s3_namespaces=tuple(n.strip() for v in args.ambient_s3_credentials for n in v.split(",") if n.strip()),
        ambient_gcs_namespaces=tuple(
            n.strip() for v in args.ambient_gcs_credentials for n in v.split(",") if n.strip()
        ),
        ambient_azure_namespaces=tuple(
            n.strip() for v in args.ambient_azure_credentials for n in v.split(",") if n.strip()
        ),
        downloads_per_namespace=args.downloads_per_namespace,
        downloads_total=args.downloads_total,
        namespace_quota_bytes=args.namespace_quota_bytes,
        namespace_quotas=dict(args.namespace_quota),
        onnx_check_timeout=args.onnx_check_timeout,
        claim_name=args.claim_name,
        claim_namespace=args.claim_namespace if args.claim_name else None,
        unload_timeout=args.unload_timeout,
        namespaces=list(args.namespace),
        prometheus_url=args.prometheus_url,
        http_scaler_address=args.keda_http_scaler_address,
        route_domains=RouteDomains.parse(args.route_domains),
        tenant_claim=args.tenant_claim_name,
        policy=PolicyContext(
            operator_namespace=args.claim_namespace,
            operator_labels=args.operator_pod_labels,
            monitoring_namespaces=tuple(args.monitoring_namespace),
            egress=args.pool_egress_policy,
            dns_namespace_labels=args.dns_namespace_labels,
            dns_pod_labels=args.dns_pod_labels,
            egress_cidrs=tuple(args.pool_egress_cidr),
            interceptor_namespace=args.interceptor_namespace,
            interceptor_labels=args.interceptor_pod_labels,
        ),
        server_image_prefixes=list(args.server_image_prefix),
        default_allowed_backends=args.default_allowed_backends,
        workers=args.workers,
    )
    if args.claim_name and not args.claim_namespace:
        print("kubeinfer-operator: --claim-name needs --claim-namespace (or $POD_NAMESPACE)", file=sys.stderr)
        return 2
    stop = threading.Event()
    lost = threading.Event()
    elector: LeaseElector | None = None
    renewing: threading.Thread | None = None
    if args.leader_election:
        identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        elector = LeaseElector(
            CoordinationV1Api(),
            args.leader_election_namespace,
            args.lease_name,
            identity,
            lease_seconds=args.lease_duration,
            renew_deadline=args.lease_renew_deadline,
            retry_seconds=args.lease_retry_period,
        )
        # the chart's liveness probe must pass on a waiting follower too
        follower = FollowerLiveness(args.liveness, elector.healthy) if args.liveness else None
        with _stop_on_signals(stop):
            if follower:
                follower.start()
            try:
                leading = elector.wait_for_leadership(stop)
            finally:
                if follower:
                    follower.stop()
        if not leading:
            return 0  # stopped while following
        renewing = threading.Thread(target=elector.keep_renewing, args=(stop, lost), daemon=True, name="lease")
        renewing.start()
    reconciler = Reconciler(config, Kube())
    registry = kopf.OperatorRegistry()
    register(reconciler, registry)

    def release_stop_flag(**_: object) -> None:
        # kopf waits for ``stop_flag`` in a thread of the loop's default executor, and asyncio.run
        # joins that executor on exit: a flag never set (a stop by SIGTERM) hangs the process forever
        stop.set()

    kopf.on.cleanup(registry=registry, id="stop-flag")(release_stop_flag)
    settings = kopf.OperatorSettings()
    settings.posting.level = logging.WARNING  # kopf's own per-handler log lines are noise next to our events
    settings.persistence.finalizer = FINALIZER  # kopf puts none on the kinds it handles (no delete handlers)
    settings.execution.max_workers = args.workers
    # with named namespaces kopf needs no cluster-wide reads: it serves those namespaces and the CRDs present
    # at startup, so the chart's namespaced install grants no ClusterRole (no namespaces/CRD list or watch)
    settings.scanning.disabled = bool(args.namespace)
    # a timer busy in a worker thread when its object is deleted is re-checked every second, not every
    # 60 s (kopf's default), so deletes under resync finish promptly
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = 0.5
    # what is imported and built by now (the API client, kopf, onnx, the registry) lives as long as the
    # process: the collector's full passes, which a bulk apply's garbage starts every few seconds, need not
    # walk it again each time (README, "At scale")
    gc.freeze()
    try:
        kopf.run(
            registry=registry,
            settings=settings,
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            stop_flag=stop,
        )
    finally:
        stop.set()
        reconciler.close()
        if elector is not None and renewing is not None and not lost.is_set():
            renewing.join(10)  # a renewal in flight must not land after the release
            elector.release()
    return 1 if lost.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
