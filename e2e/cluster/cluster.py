#!/usr/bin/env python3
"""Local Kubernetes control plane built from pinned Go modules (no containers).

Sub-commands (the executables ``up``, ``down``, ``env`` and ``build`` next to this
file call them):

  build   build the binaries into the cache (no-op when already built for these pins)
  up      build if needed, then start etcd, kube-apiserver, kube-controller-manager,
          kube-scheduler and kwok (one fake GPU node) on 127.0.0.1 with free ports;
          reuses a running, healthy cluster; prints ``export`` lines on stdout
  down    stop exactly the processes ``up`` started (PIDs from the run folder)
  env     print the ``export`` lines of the running cluster (exit 1 if none)
  release drop a ``up --hold PID`` registration; stops the cluster when it was started
          with --hold and no registered process is alive any more (pytest fixture)
  restart COMPONENT [--down-seconds N]
          stop one component and start it again with the same flags (fault drills);
          only on a run folder of one's own (KUBEINFER_CLUSTER_RUN)

``up`` and ``env`` accept ``--json`` to print a JSON document instead of shell lines.
Human-readable progress goes to stderr, so ``eval "$(e2e/cluster/up)"`` works.

Environment:
  KUBEINFER_CLUSTER_CACHE  cache folder (default ~/.cache/kubeinfer-cluster);
                           binaries go to <cache>/bin-<hash of go.mod/go.sum files>
  KUBEINFER_CLUSTER_RUN    run folder: PIDs, logs, PKI, etcd data, kubeconfig
                           (default <cache>/run)
  KUBEINFER_GO_BUILD_P     go build -p (default 2)
  KUBEINFER_GOTOOLCHAIN    GOTOOLCHAIN for the build (default "local")
  KUBEINFER_CLUSTER_TIMEOUT  seconds to wait for the cluster to become ready (default 180)

Only the Python standard library, ``go`` (for building) and ``openssl`` are needed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# localcluster/ sits beside this script, and Python puts a script's folder first on sys.path
from localcluster import addons, node
from localcluster.apiclient import Api
from localcluster.base import ClusterError, log, run_dir
from localcluster.binaries import ensure_built
from localcluster.control_plane import COMPONENTS, SERVICE_CIDR
from localcluster.processes import alive, spawn, stop, tail
from localcluster.scaffold import flock
from localcluster.state import add_holder, live_holders, load_state, save_state
from localcluster.supervisor import START_ATTEMPTS, healthy, recipe_hash, start, stop_components


def exports(state: dict) -> str:
    return (
        f'export KUBECONFIG={shlex.quote(state["kubeconfig"])}\nexport PATH={shlex.quote(state["bin_dir"])}:"$PATH"\n'
    )


def describe(state: dict, started: bool, build_s: float = 0.0, start_s: float = 0.0) -> dict:
    return {
        "kubeconfig": state["kubeconfig"],
        "bin_dir": state["bin_dir"],
        "run_dir": state["run_dir"],
        "server": state["server"],
        "started": started,
        "build_seconds": round(build_s, 1),
        "start_seconds": round(start_s, 1),
        "ports": state["ports"],
        "pids": {n: c["pid"] for n, c in state["components"].items()},
        "addons": addons.describe(state),
        "service_cidr": state.get("service_cidr", SERVICE_CIDR),
        "node": state.get("node"),
    }


def cmd_up(args) -> int:
    bins, build_s, built = ensure_built()
    if not built:
        log(f"binaries: {bins} (cached, {build_s:.1f}s)")
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with_node = node.enabled()
    if with_node:
        node.ensure_packages()
    with flock(rd / ".lock"):
        state = load_state(rd)
        recipe = recipe_hash(with_node)
        if state and state.get("recipe") != recipe:
            stopped = stop_components(rd, state)
            log(
                f"the cluster running in {rd} was started by another recipe (cluster.py, localcluster/ or "
                f"KUBEINFER_CLUSTER_NODE differ); stopped {stopped or 'nothing'} to restart it"
            )
            state = None
        if state and state.get("bin_dir") == str(bins) and healthy(state):
            log(f"reusing running cluster at {state['server']} (run folder {rd})")
            if args.hold is None and state.get("managed"):
                state["managed"] = False  # adopted by a person: `release` must not stop it any more
                save_state(rd, state)
            out = describe(state, started=False, build_s=build_s)
        else:
            if state:
                stopped = stop_components(rd, state)
                log(f"previous cluster in {rd} was not healthy or used other binaries; stopped {stopped or 'nothing'}")
            t0 = time.monotonic()
            timeout = float(os.environ.get("KUBEINFER_CLUSTER_TIMEOUT", "180"))
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    state = start(rd, bins, timeout, with_node)
                    break
                except ClusterError as e:
                    if "address already in use" not in str(e) or attempt == START_ATTEMPTS:
                        raise
                    log(f"a port was taken before its component bound it; starting again ({attempt}/{START_ATTEMPTS})")
            state["managed"] = args.hold is not None
            save_state(rd, state)
            start_s = time.monotonic() - t0
            log(f"cluster started in {start_s:.1f}s at {state['server']} (logs and PIDs in {rd})")
            out = describe(state, started=True, build_s=build_s, start_s=start_s)
        names = addons.selected(args.addons)
        if names:
            secs = addons.start(rd, state, names, float(os.environ.get("KUBEINFER_CLUSTER_TIMEOUT", "180")))
            out = {**describe(state, out["started"], build_s, out["start_seconds"]), "addons_seconds": round(secs, 1)}
        if args.hold is not None:
            add_holder(rd, args.hold)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        log('to use it: eval "$(e2e/cluster/env)"')
        sys.stdout.write(exports(state))
    return 0


def stop_and_clean(rd: Path, state: dict) -> None:
    stopped = stop_components(rd, state)
    shutil.rmtree(rd / "data", ignore_errors=True)
    shutil.rmtree(rd / "holders", ignore_errors=True)
    what = ", ".join(stopped) if stopped else "nothing (processes were already gone)"
    log(f"stopped {what}; logs kept in {rd / 'logs'}")


def cmd_down(args) -> int:
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with flock(rd / ".lock"):
        state = load_state(rd)
        if not state:
            log(f"no cluster recorded in {rd}")
            return 0
        stop_and_clean(rd, state)
    return 0


def cmd_release(args) -> int:
    """Drop a holder; stop the cluster if it was started with --hold and nobody holds it now."""
    rd = run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    with flock(rd / ".lock"):
        (rd / "holders" / str(args.hold)).unlink(missing_ok=True)
        state = load_state(rd)
        if not state:
            log(f"no cluster recorded in {rd}")
            return 0
        others = live_holders(rd)
        if others:
            log(f"cluster still held by pid(s) {others}; leaving it running")
        elif not state.get("managed"):
            log("cluster was started or adopted by `up` without --hold; leaving it running")
        else:
            stop_and_clean(rd, state)
    return 0


def cmd_env(args) -> int:
    rd = run_dir()
    state = load_state(rd)
    if not state or not healthy(state):
        log(f"no running cluster in {rd}; start one with e2e/cluster/up")
        return 1
    if args.json:
        print(json.dumps(describe(state, started=False), indent=2))
    else:
        sys.stdout.write(exports(state))
    return 0


def cmd_restart(args) -> int:
    """Stop one component, keep it down ``--down-seconds``, start it again with the same flags.

    For fault drills (an apiserver restart in the middle of a reconcile). Refused on the shared
    default run folder, where it would disturb other sessions: set KUBEINFER_CLUSTER_RUN.
    """
    if not os.environ.get("KUBEINFER_CLUSTER_RUN") and not args.shared:
        raise ClusterError("restart needs KUBEINFER_CLUSTER_RUN (the default run folder is shared)")
    rd = run_dir()
    with flock(rd / ".lock"):
        state = load_state(rd)
        if not state or args.component not in state.get("components", {}):
            raise ClusterError(f"no {args.component} recorded in {rd}")
        comp = state["components"][args.component]
        stop(comp, args.component)
        log(f"stopped {args.component} (pid {comp['pid']})")
        time.sleep(args.down_seconds)
        pid, st = spawn(comp["cmd"], Path(comp["log"]), rd, "restarting")
        comp.update(pid=pid, starttime=st)
        (rd / "pids" / f"{args.component}.pid").write_text(f"{pid}\n")
        save_state(rd, state)
        if args.component == "kube-apiserver":
            api = Api(state["server"], Path(state["pki"]))
            deadline = time.monotonic() + 120
            while True:
                if not alive(comp):
                    raise ClusterError(f"kube-apiserver exited after restart:\n{tail(Path(comp['log']))}")
                try:
                    if api.call("GET", "/readyz")[0] == 200:
                        break
                except (OSError, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise ClusterError("kube-apiserver not ready 120s after restart")
                time.sleep(0.2)
        log(f"restarted {args.component} (pid {pid})")
    return 0


def cmd_build(args) -> int:
    names = addons.selected(args.addons)
    t0 = time.monotonic()
    # the add-ons' Go builds run beside the control plane's: on a 2-core machine each build leaves a core idle for
    # long stretches (module downloads, the linker), which the other fills (NOTES.md has the measurements)
    with ThreadPoolExecutor(max_workers=1) as pool:
        extra_built = pool.submit(addons.ensure_built, names)
        bins, secs, built = ensure_built()
        log(f"binaries in {bins} ({'built' if built else 'cached'}, {secs:.1f}s)")
        extra = extra_built.result()
    log(f"add-ons {', '.join(extra)} ready ({time.monotonic() - t0:.1f}s)")
    print(bins)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, fn in (
        ("up", cmd_up),
        ("down", cmd_down),
        ("env", cmd_env),
        ("build", cmd_build),
        ("release", cmd_release),
        ("restart", cmd_restart),
    ):
        p = sub.add_parser(name)
        if name in ("up", "env"):
            p.add_argument("--json", action="store_true", help="print a JSON document instead of export lines")
        if name in ("up", "build"):
            p.add_argument(
                "--addons",
                metavar="NAMES",
                help=f"comma-separated add-ons to build and start: {', '.join(addons.ADDONS)} "
                f"(build only: {', '.join(addons.BUILD_ONLY)}; default: $KUBEINFER_CLUSTER_ADDONS); "
                "see localcluster/addons/",
            )
        if name == "up":
            p.add_argument(
                "--hold",
                type=int,
                metavar="PID",
                help="register PID as a user of the cluster; a cluster started this way is stopped by "
                "`release` once no registered PID is alive (used by the pytest fixture)",
            )
        if name == "restart":
            p.add_argument("component", choices=COMPONENTS)
            p.add_argument("--down-seconds", type=float, default=0.0, help="how long it stays stopped")
            p.add_argument("--shared", action="store_true", help="allow it on the default (shared) run folder")
        if name == "release":
            p.add_argument("--hold", type=int, metavar="PID", required=True, help="the PID given to `up --hold`")
        p.set_defaults(fn=fn)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except ClusterError as e:
        log(f"ERROR: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
