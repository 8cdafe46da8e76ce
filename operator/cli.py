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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING
from typing import Any

import kopf
from kubernetes.client import CoordinationV1Api

from .controllers import settings
from .controllers.reconcile_parts import RECHECK_THREADS
from .controllers.reconciler import FINALIZER, Reconciler
from .controllers.settings import OperatorConfig
from .controllers.wiring import register
from .kube.client import Kube, load_config
from .kube.leader import LeaseElector
from .liveness import FollowerLiveness
from .servers.network_policy import PolicyContext


def _labels(value: str) -> dict[str, str]:
    pairs = [p.partition("=") for p in value.split(",") if p]
    if any(not sep or not k for k, sep, _ in pairs):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE[,KEY=VALUE...], got '{value}'")
    return {k: v for k, _, v in pairs}


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A setting's parser as an argparse ``type``: its ValueError's text is the usage error (argparse would
    print only "invalid value"). Plain types (int, float, Path) keep argparse's own message."""
    if isinstance(parse, type):
        return parse

    def convert(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _add_settings(p: argparse.ArgumentParser) -> None:
    """The flags of the settings (``OperatorConfig``'s, the lease timings), built from their field metadata
    (``settings.flag``)."""
    for f, how in settings.every_flag():
        kwargs: dict[str, Any] = {"help": how.help}
        if how.parse is not None:
            kwargs["type"] = _argument(how.parse)
        if how.metavar is not None:
            kwargs["metavar"] = how.metavar
        if how.repeatable:
            kwargs["action"] = "append"
        default = settings.flag_default(f, how)
        if default is MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        p.add_argument(how.name, **kwargs)


def _add_policy(p: argparse.ArgumentParser) -> None:
    """Who the servers' NetworkPolicies let in (``network_policy.PolicyContext``, whose defaults these are)."""
    defaults = PolicyContext()
    p.add_argument(
        "--operator-pod-labels",
        type=_labels,
        default=dict(defaults.operator_labels),
        metavar="K=V[,K=V]",
        help="labels of the operator's pods; servers' NetworkPolicies let pods with them in --claim-namespace call "
        "the servers (default: any pod of that namespace)",
    )
    p.add_argument(
        "--pool-egress-policy",
        type=_bool,
        default=defaults.egress,
        help="whether pools' NetworkPolicies close egress to all but DNS and --pool-egress-cidr "
        f"(default {str(defaults.egress).lower()})",
    )
    p.add_argument(
        "--pool-egress-cidr",
        action="append",
        default=[],
        type=_argument(settings.cidr),
        metavar="CIDR",
        help="a network pool pods may reach besides DNS, any port (repeatable; default none)",
    )
    p.add_argument(
        "--dns-namespace-labels",
        type=_labels,
        default=dict(defaults.dns_namespace_labels),
        metavar="K=V[,K=V]",
        help="labels of the cluster DNS's namespace, which pool pods may reach (default: kube-system's name)",
    )
    p.add_argument(
        "--dns-pod-labels",
        type=_labels,
        default=dict(defaults.dns_pod_labels),
        metavar="K=V[,K=V]",
        help="labels of the cluster DNS's pods (default k8s-app=kube-dns)",
    )
    p.add_argument(
        "--interceptor-namespace",
        default=defaults.interceptor_namespace,
        help="namespace of KEDA's HTTP add-on interceptor: pools that scale to zero let its pods in (default "
        "%(default)s)",
    )
    p.add_argument(
        "--interceptor-pod-labels",
        type=_labels,
        default=dict(defaults.interceptor_labels),
        metavar="K=V[,K=V]",
        help="labels of the interceptor's pods (default: those of the add-on's chart)",
    )
    p.add_argument(
        "--monitoring-namespace",
        action="append",
        default=[],
        help="namespace allowed to scrape the servers' metrics port through their NetworkPolicies (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubeinfer-operator", description=__doc__)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    _add_settings(p)
    _add_policy(p)
    p.add_argument(
        "--leader-election", action="store_true", help="run only while holding a Lease (for more than one replica)"
    )
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--lease-name", default="kubeinfer-operator")
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
    root = args.repository_root
    if not root.is_dir():
        print(f"kubeinfer-operator: --repository-root '{root}' is not a folder", file=sys.stderr)
        return 2
    # the model work queue and kopf's executor (each --workers threads), the rechecks, the server resyncs
    load_config(args.kubeconfig, connections=2 * args.workers + RECHECK_THREADS + 4)
    config = OperatorConfig(**settings.from_flags(vars(args)))
    for item in filter(None, os.environ.get(settings.ENDPOINTS_ENV, "").split(",")):
        config.server_endpoints.setdefault(*settings.endpoint(item.strip()))
    config.claim_namespace = args.claim_namespace if args.claim_name else None
    config.policy = PolicyContext(
        operator_namespace=args.claim_namespace,
        operator_labels=args.operator_pod_labels,
        monitoring_namespaces=tuple(args.monitoring_namespace),
        egress=args.pool_egress_policy,
        dns_namespace_labels=args.dns_namespace_labels,
        dns_pod_labels=args.dns_pod_labels,
        egress_cidrs=tuple(args.pool_egress_cidr),
        interceptor_namespace=args.interceptor_namespace,
        interceptor_labels=args.interceptor_pod_labels,
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
        timings = settings.LeaseTimings(**settings.from_flags(vars(args), settings.LeaseTimings))
        elector = LeaseElector(
            CoordinationV1Api(),
            args.leader_election_namespace,
            args.lease_name,
            identity,
            lease_seconds=timings.duration,
            renew_deadline=timings.renew_deadline,
            retry_seconds=timings.retry_period,
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
    kopf_settings = kopf.OperatorSettings()
    kopf_settings.posting.level = logging.WARNING  # kopf's own per-handler log lines are noise next to our events
    kopf_settings.persistence.finalizer = FINALIZER  # kopf puts none on the kinds it handles (no delete handlers)
    kopf_settings.execution.max_workers = args.workers
    # with named namespaces kopf needs no cluster-wide reads: it serves those namespaces and the CRDs present
    # at startup, so the chart's namespaced install grants no ClusterRole (no namespaces/CRD list or watch)
    kopf_settings.scanning.disabled = bool(args.namespace)
    # a timer busy in a worker thread when its object is deleted is re-checked every second, not every
    # 60 s (kopf's default), so deletes under resync finish promptly
    kopf_settings.background.cancellation_polling = 1.0
    kopf_settings.background.instant_exit_timeout = 0.5
    # what is imported and built by now (the API client, kopf, onnx, the registry) lives as long as the
    # process: the collector's full passes, which a bulk apply's garbage starts every few seconds, need not
    # walk it again each time (docs/operator-at-scale.md)
    gc.freeze()
    try:
        kopf.run(
            registry=registry,
            settings=kopf_settings,
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
