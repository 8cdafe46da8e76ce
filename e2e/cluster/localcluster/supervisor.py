"""Starting, checking and stopping a cluster in its run folder: the order the components come up in, what each
one is waited for, and the ``state.json`` that records them (PIDs, ports, paths) for ``down`` and later ``up``s."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from . import addons, node
from .apiclient import Api, http_ok, node_ready
from .base import CLUSTER_DIR, ClusterError, log
from .control_plane import (
    COMPONENTS,
    NODE_NAME,
    SERVICE_CIDR,
    SERVICE_IP,
    Ports,
    commands,
    etcd_url,
    kwok_node,
)
from .node import configs, containerd, lifecycle, network
from .pki import make_pki, write_kubeconfig
from .processes import alive, free_ports, spawn, stop, tail
from .state import save_state

#: tries of a start whose component lost its port to another process between choosing and binding
START_ATTEMPTS = 3


def recipe_files() -> list[Path]:
    """The scripts a running cluster's recipe hashes: the CLI and the modules that build, start and stop it (not
    the add-ons, which ``up`` starts on a running cluster)."""
    pkg = CLUSTER_DIR / "localcluster"
    modules = sorted(p for p in pkg.rglob("*.py") if "addons" not in p.relative_to(pkg).parts)
    return [CLUSTER_DIR / "cluster.py", *modules]


def recipe_hash(with_node: bool) -> str:
    """What a running cluster was started by: these scripts' text and the node switch. ``up`` restarts a
    cluster whose recipe differs instead of reusing one started with other flags or components."""
    h = hashlib.sha256(f"node={with_node}".encode())
    for f in recipe_files():
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def expected_components(state: dict) -> tuple[str, ...]:
    return COMPONENTS + (node.NODE_COMPONENTS if state.get("node") else ())


class Launcher:
    """Starts the components of one ``start`` and waits for them, recording each in ``state`` as it goes."""

    def __init__(self, rd: Path, state: dict, argv: dict[str, list[str]], timeout: float):
        self.rd, self.state, self.argv, self.timeout = rd, state, argv, timeout
        self.deadline = time.monotonic() + timeout

    def launch(self, name: str) -> None:
        rd, state = self.rd, self.state
        pid, st = spawn(self.argv[name], rd / "logs" / f"{name}.log", rd, f"starting {name}")
        state["components"][name] = {
            "pid": pid,
            "starttime": st,
            "log": str(rd / "logs" / f"{name}.log"),
            "cmd": self.argv[name],
        }
        (rd / "pids" / f"{name}.pid").write_text(f"{pid}\n")
        save_state(rd, state)

    def wait(self, what: str, check: Callable[[], bool], names: tuple[str, ...]) -> None:
        """Until ``check()`` holds; an error with the logs' last lines when one of ``names`` exits or time is up."""
        comps = self.state["components"]
        while True:
            for n in names:
                if not alive(comps[n]):
                    raise ClusterError(
                        f"{n} exited while waiting for {what}; last lines of "
                        f"{comps[n]['log']}:\n{tail(Path(comps[n]['log']))}"
                    )
            try:
                if check():
                    return
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > self.deadline:
                logs = "\n".join(f"--- {n}: {comps[n]['log']}\n{tail(Path(comps[n]['log']), 25)}" for n in names)
                raise ClusterError(f"timed out after {self.timeout:.0f}s waiting for {what}\n{logs}")
            time.sleep(0.25)


def start(rd: Path, bins: Path, timeout: float, with_node: bool) -> dict:
    for sub in ("data", "pki", "pids"):
        shutil.rmtree(rd / sub, ignore_errors=True)
    (rd / "logs").mkdir(parents=True, exist_ok=True)
    (rd / "pids").mkdir(parents=True, exist_ok=True)
    pki = rd / "pki"
    net = None
    api_ip, service_cidr, service_ip = "127.0.0.1", SERVICE_CIDR, SERVICE_IP
    if with_node:
        # the node's network namespace comes first: the apiserver listens on the host end of its veth
        net = network.choose_net(rd)
        network.setup_network(net)
        api_ip, service_cidr, service_ip = net.host_ip, net.service_cidr, net.service_ip
    make_pki(pki, api_ips=(api_ip,), service_ip=service_ip, kubelet_ip=net.node_ip if net else "")
    ports = Ports(*free_ports(5))
    server = f"https://{api_ip}:{ports.apiserver}"
    kubeconfig = rd / "kubeconfig"
    write_kubeconfig(kubeconfig, pki, server)
    state: dict = {
        "bin_dir": str(bins),
        "run_dir": str(rd),
        "kubeconfig": str(kubeconfig),
        "server": server,
        "pki": str(pki),
        "recipe": recipe_hash(with_node),
        "service_cidr": service_cidr,
        "ports": ports.record(),
        "components": {},
    }
    argv = commands(rd, bins, pki, kubeconfig, ports, api_ip, service_cidr, with_node=net is not None)
    node_paths: dict = {}
    if net:
        node_paths = configs.write_configs(rd, net, pki, bins, kubeconfig)
        argv.update(configs.commands(net, node_paths, bins))
        state["node"] = lifecycle.describe(net, node_paths)  # from here on, a failed start cleans the node up too
        save_state(rd, state)
    api = Api(server, pki)
    launcher = Launcher(rd, state, argv, timeout)
    launch, wait = launcher.launch, launcher.wait
    try:
        launch("etcd")
        wait("etcd /health", lambda: http_ok(etcd_url(ports) + "/health", insecure=False), ("etcd",))
        launch("kube-apiserver")
        wait("kube-apiserver /readyz", lambda: api.call("GET", "/readyz")[0] == 200, ("etcd", "kube-apiserver"))
        launch("kube-controller-manager")
        launch("kube-scheduler")
        launch("kwok")
        all_names = tuple(COMPONENTS)
        kcm, sched = ports.controller_manager, ports.scheduler
        wait("kube-controller-manager /healthz", lambda: http_ok(f"https://127.0.0.1:{kcm}/healthz"), all_names)
        wait("kube-scheduler /healthz", lambda: http_ok(f"https://127.0.0.1:{sched}/healthz"), all_names)
        code, text = api.call("POST", "/api/v1/nodes", kwok_node(gpu_taint=net is not None))
        if code not in (201, 409):
            raise ClusterError(f"creating node {NODE_NAME} failed: HTTP {code}: {text}")

        wait(f"node {NODE_NAME} Ready without not-ready taint", lambda: node_ready(api, NODE_NAME), all_names)
        # Pods need the namespace's default ServiceAccount (ServiceAccount admission).
        wait(
            "ServiceAccount default/default",
            lambda: api.get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None,
            all_names,
        )
        if net:
            lifecycle.start_node(net, node_paths, bins, api, launcher, COMPONENTS, rd)
    except BaseException:
        log("start failed; stopping the processes started so far")
        stop_components(rd, state)
        raise
    state["started_at"] = time.time()
    save_state(rd, state)
    return state


def healthy(state: dict, patience: float = 30) -> bool:
    """All recorded processes alive and /readyz ok. A loaded machine can make the apiserver
    slow, so with every process alive keep asking for up to ``patience`` seconds before
    declaring the cluster broken (``up`` would then restart it under its users' feet)."""
    comps = state.get("components", {})
    if set(comps) != set(expected_components(state)):
        return False
    api = Api(state["server"], Path(state["pki"]))
    deadline = time.monotonic() + patience
    while all(alive(c) for c in comps.values()):
        code, text = api.call("GET", "/readyz", timeout=10)
        if code == 200 and text.strip() == "ok":
            return True
        if time.monotonic() > deadline:
            log(f"apiserver {state['server']} /readyz: HTTP {code}: {text.strip()[:500]}")
            return False
        time.sleep(1)
    return False


def stop_components(rd: Path, state: dict) -> list[str]:
    """Stop the add-ons, then every component in reverse start order; clean up the node; forget the state."""
    stopped = addons.stop(rd, state) if state.get("addons") else []
    comps = state.get("components", {})
    node_info = state.get("node")
    for name in reversed(list(comps)):
        comp = comps[name]
        if name == "containerd" and node_info:
            # the kubelet is gone by now; stop the pods while containerd can still do it
            n = containerd.kill_pods(configs.paths(rd, lifecycle.net_of(node_info)))
            if n:
                stopped.append(f"{n} pod container(s)")
        if stop(comp, name):
            stopped.append(f"{name}({comp['pid']})")
    if node_info:
        lifecycle.cleanup(rd, node_info)
    for name in comps:
        with contextlib.suppress(OSError):
            (rd / "pids" / f"{name}.pid").unlink()
    with contextlib.suppress(OSError):
        (rd / "state.json").unlink()
    return stopped
