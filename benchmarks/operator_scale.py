"""The operator at scale: N InferenceModels created in one apply, Ready, idle, restarted, deleted.

Measured as a platform team would run it: a private control plane (its own run folder, so nobody
else's requests are counted; ``--shared-cluster`` uses the machine's shared one instead), one
InferenceServer whose namespace gets the operator's tenant claim (a PersistentVolume on
``<volume>/<namespace>/``) and whose ``spec.auth`` asks for a bearer token, one real
``kubeinfer-server`` in poll mode on that pool's folder behind a small counting proxy, and the real
operator out of cluster (``--server-endpoint``). Every run, with a fresh operator process:

* **create**: one ``kubectl apply --server-side`` of N models; when their folders are on the volume,
  when the last one is ``Rendered`` and when the last one is ``Ready`` (from a watch), the operator's
  CPU per model (until 3 s after the last Ready) and the API requests it caused;
* **idle**: after one resync period to settle, the operator's CPU over ``--window`` seconds (share
  of a core and per model per resync), its API requests (status writes among them: none expected),
  the repository index reads and poll nudges it sent the server, the server's own CPU;
* **rss** of the operator; **sigterm**: seconds to exit with N models;
* **restart**: a new operator resumes N models (CPU, seconds until it is quiet again);
* **delete**: every model deleted by one request (a delete-collection: the harshest bulk delete), until
  each is gone (its folder removed, the server unloaded it, the finalizer released): seconds, the
  operator's CPU per model, and the ERROR lines the server logged meanwhile (none expected).

Before each create the CPU cost of creating one file on the volume is recorded (``inode_create_us``): on
these VMs' ext4 (no journal) it grows with the inodes deleted in the last minutes, the previous run's delete
among them; ``--settle-seconds`` waits that out before each create.

With ``--profile`` the first run's phases are also recorded by py-spy (raw collapsed stacks, in the
work folder; ``--profile-summary`` prints the top functions). With ``--baseline REF`` the operator of
that git revision is measured first on the same cluster and server (``git archive`` of its
``operator/`` and ``server/``, first on PYTHONPATH): compare within one run, the machine is shared.

Results: ``benchmarks/results/operator-scale-<N>-<time>.json`` (every run's phases, and medians). A
measurement, never a test.

    .venv/bin/python benchmarks/operator_scale.py --models 1000 --runs 3
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import io
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.support.models import unary  # noqa: E402
from tests.support.server import start_server  # noqa: E402

CLUSTER = ROOT / "e2e" / "cluster" / "cluster.py"
GROUP, VERSION = "serving.kubeinfer.io", "v1alpha1"
API = f"{GROUP}/{VERSION}"
NS = "bench"
POOL = "pool"
OPERATOR_NS = "kubeinfer-system"
TOKEN = "bench-token-0123456789"
#: resources whose API requests are counted (the operator's, and what the tenant and auth paths read)
RESOURCES = (
    "inferencemodels",
    "inferenceservers",
    "events",
    "secrets",
    "persistentvolumes",
    "persistentvolumeclaims",
    "endpointslices",
    "deployments",
    "services",
    "networkpolicies",
    "horizontalpodautoscalers",
)
_REQUEST = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def log(msg: str) -> None:
    print(f"[operator-scale {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- cluster


class Cluster:
    """A private control plane (own run folder; no worker node), or the machine's shared one."""

    def __init__(self, run: Path | None) -> None:
        self.private = run is not None
        self.env = dict(os.environ)
        if run is not None:
            self.env.update(KUBEINFER_CLUSTER_RUN=str(run), KUBEINFER_CLUSTER_NODE="0")
        proc = subprocess.run(
            [sys.executable, str(CLUSTER), "up", "--json"], env=self.env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise SystemExit(f"cluster up failed:\n{proc.stderr[-4000:]}")
        self.info = json.loads(proc.stdout)
        self.kubeconfig = self.info["kubeconfig"]
        self.kubectl_bin = str(Path(self.info["bin_dir"]) / "kubectl")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 900) -> str:
        proc = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:4])}: {proc.stderr[-2000:]}")
        return proc.stdout

    def requests(self) -> Counter[str]:
        """apiserver_request_total for RESOURCES, as "VERB resource[/subresource]" (WATCH excluded)."""
        out: Counter[str] = Counter()
        for line in self.kubectl("get", "--raw", "/metrics").splitlines():
            m = _REQUEST.match(line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
            if labels.get("resource") not in RESOURCES or labels.get("verb") == "WATCH":
                continue
            sub = labels.get("subresource", "")
            out[f"{labels['verb']} {labels['resource']}{'/' + sub if sub else ''}"] += int(float(m["value"]))
        return out

    def down(self) -> None:
        if self.private:
            subprocess.run([sys.executable, str(CLUSTER), "down"], env=self.env, capture_output=True, check=False)


class Watcher:
    """When each model was first seen Rendered and Ready, and deleted (one watch, re-listed on expiry)."""

    def __init__(self, kubeconfig: str) -> None:
        import kubernetes

        self.api = kubernetes.client.CustomObjectsApi(kubernetes.config.new_client_from_config(kubeconfig))
        self.lock = threading.Lock()
        self.rendered: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.present: set[str] = set()
        self.gone: dict[str, float] = {}
        self.deleting: dict[str, float] = {}
        self.events = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def reset(self) -> None:
        with self.lock:
            self.rendered.clear()
            self.ready.clear()
            self.gone.clear()
            self.deleting.clear()
            self.events = 0

    def _see(self, kind: str, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            self.events += 1
            if kind == "DELETED":
                self.present.discard(name)
                self.gone.setdefault(name, at)
                return
            self.present.add(name)
            if obj["metadata"].get("deletionTimestamp"):
                self.deleting.setdefault(name, at)
            for cond in (obj.get("status") or {}).get("conditions") or ():
                if cond.get("status") != "True":
                    continue
                if cond.get("type") == "Rendered":
                    self.rendered.setdefault(name, at)
                elif cond.get("type") == "Ready":
                    self.ready.setdefault(name, at)

    def _run(self) -> None:
        from kubernetes import watch

        while not self.stopped.is_set():
            try:
                listing = self.api.list_namespaced_custom_object(GROUP, VERSION, NS, "inferencemodels")
                now = time.monotonic()
                names = {o["metadata"]["name"] for o in listing["items"]}
                with self.lock:
                    for name in self.present - names:
                        self.gone.setdefault(name, now)
                    self.present = set()
                for obj in listing["items"]:
                    self._see("ADDED", obj, now)
                rv = listing["metadata"]["resourceVersion"]
                stream = watch.Watch().stream(
                    self.api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NS,
                    "inferencemodels",
                    resource_version=rv,
                    timeout_seconds=120,
                )
                for event in stream:
                    if self.stopped.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._see(event["type"], event["object"], time.monotonic())
            except Exception as exc:  # an expired resourceVersion (410) or a dropped stream: list again
                if not self.stopped.is_set():
                    log(f"watch restarted: {type(exc).__name__}: {str(exc)[:200]}")
                    time.sleep(0.5)

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            return len(self.rendered), len(self.ready), len(self.present)


class CountingProxy:
    """Forwards HTTP to the server (headers and all) and counts index reads and poll nudges."""

    def __init__(self, target: str) -> None:
        self.counts: Counter[str] = Counter()
        parsed = urllib.parse.urlsplit(target)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
        outer = self
        local = threading.local()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?", 1)[0]
                outer.counts["index" if path == "/v2/repository/index" else path] += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection(host, port, timeout=60)
                try:
                    conn.request(method, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except (OSError, http.client.HTTPException):
                    local.conn = None
                    conn.close()
                    raise
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type") or "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self._forward("POST")

            def do_GET(self) -> None:
                self._forward("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


# ------------------------------------------------------------------------------------------ process


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process and of its waited-for children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of the process, by OS thread id."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        out[int(task.name)] = sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    return out


def thread_roles(pid: int) -> dict[int, str]:
    """OS thread id → the Python thread's name without its number ("reconcile-3" → "reconcile"), by py-spy."""
    spy = Path(sys.executable).with_name("py-spy")
    proc = subprocess.run([str(spy), "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {}
    return {
        int(t["os_thread_id"]): re.sub(r"[-_]\d+(_\d+)?$", "", t.get("thread_name") or "?")
        for t in json.loads(proc.stdout)
        if t.get("os_thread_id")
    }


def cpu_by_role(pid: int, before: dict[int, float], total: float) -> dict[str, float]:
    """CPU seconds per thread role since ``before`` (``thread_cpu``); what threads that ended used is
    ``(ended)``: ``total`` less the rest."""
    after, roles = thread_cpu(pid), thread_roles(pid)
    out: Counter[str] = Counter()
    for tid, cpu in after.items():
        out[roles.get(tid, "(native)")] += cpu - before.get(tid, 0.0)
    out["(ended)"] = total - sum(out.values())
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.01}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class Profiler:
    """py-spy attached to a process for one phase (raw collapsed stacks of the thread holding the GIL: the
    CPU spent without it, in TLS and system calls, is not seen; stopped with SIGINT). The CPU numbers of a
    profiled run are not comparable: py-spy's interruptions wake waiting threads."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        spy = Path(sys.executable).with_name("py-spy")
        self.proc = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", "100", "--gil", "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def summarize_profile(path: Path, top: int = 25) -> str:
    """Top functions by inclusive and by own samples of a py-spy raw file."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r" \(.*/site-packages/", " (", f) for f in stack.split(";")[1:]]
        for frame in set(frames):
            inclusive[frame] += n
        if frames:
            own[frames[-1]] += n
    lines = [f"{path.name}: {total} samples"]
    for title, counter in (("inclusive", inclusive), ("own", own)):
        lines.append(f"  -- {title}")
        lines += [f"  {100 * n / max(total, 1):5.1f}%  {f[:150]}" for f, n in counter.most_common(top)]
    return "\n".join(lines)


class Operator:
    def __init__(self, module: str, pythonpath: str, args: list[str], log_path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": pythonpath + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def sigterm(self) -> float | None:
        t = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
            return round(time.monotonic() - t, 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_quiet(self, limit: float, rate: float = 0.05, seconds: int = 3) -> float:
        """Seconds until the process used under ``rate`` of a core for ``seconds`` whole seconds in a row."""
        t0 = time.monotonic()
        calm = 0
        last = self.cpu()
        while time.monotonic() - t0 < limit and calm < seconds:
            time.sleep(1)
            now = self.cpu()
            calm = calm + 1 if now - last < rate else 0
            last = now
        return time.monotonic() - t0 - calm


# ------------------------------------------------------------------------------------------ a run


def wait(what: str, check: Any, timeout: float, every: float = 0.2) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():
            return time.monotonic() - t0
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def model(i: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "InferenceModel",
        "metadata": {"name": f"m{i:05d}", "namespace": NS},
        "spec": {
            "server": POOL,
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
            "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
            "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}],
        },
    }


def delta(after: Counter[str], before: Counter[str]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in sorted(after) if after[k] - before[k]}


def per_model(requests: dict[str, int], n: int) -> float:
    return round(sum(requests.values()) / n, 3)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(None if args.shared_cluster else work / "cluster")
        self.root = work / "volume"
        self.probes = 0
        self.repo = self.root / NS / POOL
        self.server: Any = None
        self.proxy: CountingProxy | None = None
        self.watcher: Watcher | None = None

    # ---------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        import onnx
        from onnx import TensorProto

        c = self.cluster
        c.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        established = '{.status.conditions[?(@.type=="Established")].status}'
        for crd in ("inferencemodels", "inferenceservers"):
            wait(
                f"CRD {crd} established",
                lambda crd=crd: c.kubectl("get", f"crd/{crd}.{GROUP}", "-o", f"jsonpath={established}") == "True",
                60,
            )
        for ns in (NS, OPERATOR_NS):
            c.kubectl("create", "namespace", ns, check=False)
        uploads = self.root / NS / "uploads"
        uploads.mkdir(parents=True)
        onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
        self.repo.mkdir(parents=True)
        token_file = self.work / "token"
        token_file.write_text(TOKEN)
        # the operator's own claim: a hostPath PersistentVolume on the whole volume, bound in OPERATOR_NS
        pv = f"bench-volume-{os.getpid()}"
        c.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": [
                        {
                            "apiVersion": "v1",
                            "kind": "PersistentVolume",
                            "metadata": {"name": pv},
                            "spec": {
                                "capacity": {"storage": "10Gi"},
                                "accessModes": ["ReadWriteMany"],
                                "persistentVolumeReclaimPolicy": "Retain",
                                "storageClassName": "",
                                "hostPath": {"path": str(self.root)},
                            },
                        },
                        {
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "metadata": {"name": "models", "namespace": OPERATOR_NS},
                            "spec": {
                                "accessModes": ["ReadWriteMany"],
                                "storageClassName": "",
                                "volumeName": pv,
                                "resources": {"requests": {"storage": "10Gi"}},
                            },
                        },
                        {
                            "apiVersion": "v1",
                            "kind": "Secret",
                            "metadata": {"name": "pool-token", "namespace": NS},
                            "stringData": {"token": TOKEN},
                        },
                        {
                            "apiVersion": API,
                            "kind": "InferenceServer",
                            "metadata": {"name": POOL, "namespace": NS},
                            "spec": {
                                "image": "img:1",
                                "replicas": 1,
                                "server": {"pollIntervalSeconds": int(self.args.poll_secs)},
                                "auth": {"tokenSecret": {"name": "pool-token"}},
                            },
                        },
                    ],
                }
            ),
        )
        wait(
            "the operator's claim Bound",
            lambda: c.kubectl("-n", OPERATOR_NS, "get", "pvc", "models", "-o", "jsonpath={.status.phase}") == "Bound",
            120,
        )
        self.server = start_server(
            self.repo,
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            str(int(self.args.poll_secs)),
            "--auth-token-file",
            str(token_file),
            log_dir=self.logs,
        )
        self.proxy = CountingProxy(self.server.base_url)
        self.watcher = Watcher(c.kubeconfig)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stopped.set()
        if self.server is not None:
            self.server.terminate()
        self.cluster.down()

    # ------------------------------------------------------------------------------------ phases
    def operator(self, module: str, pythonpath: str, tag: str) -> Operator:
        assert self.proxy is not None
        args = [
            "--kubeconfig", self.cluster.kubeconfig,
            "--repository-root", str(self.root),
            "--namespace", NS,
            "--claim-name", "models", "--claim-namespace", OPERATOR_NS,
            "--resync-seconds", str(self.args.resync),
            "--server-endpoint", f"{NS}/{POOL}={self.proxy.url}",
            "--log-level", "warning",
        ]  # fmt: skip
        return Operator(module, pythonpath, args, self.logs / f"operator-{tag}.log")

    def pool_reconciled(self) -> bool:
        out = self.cluster.kubectl("-n", NS, "get", "inferenceserver", POOL, "-o", "json")
        conds = (json.loads(out).get("status") or {}).get("conditions") or []
        return any(c["type"] == "RepositoryReady" and c["status"] == "True" for c in conds)

    def clear_pool_status(self) -> None:
        self.cluster.kubectl(
            "-n", NS, "patch", "inferenceserver", POOL, "--subresource=status", "--type=merge",
            "-p", '{"status":null}',
        )  # fmt: skip

    def inode_probe(self, files: int = 200) -> float:
        """CPU microseconds to create one empty file in a new folder on the volume, before a create: on an
        ext4 without a journal (these VMs' disks) the kernel skips, one by one, the inodes freed in the last
        60 s (300 s while their table block is unwritten) when it allocates one, so the previous run's
        delete can add ~1 ms to each model a create writes. Recorded so that runs can be compared; the
        files stay (deleting them would add to what it measures)."""
        self.probes += 1
        folder = self.root / f".bench-inode-probe-{self.probes}"
        folder.mkdir()
        fd = os.open(folder, os.O_RDONLY)
        try:
            t = time.thread_time()
            for i in range(files):
                os.close(os.open(f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd))
            return round((time.thread_time() - t) * 1e6 / files, 1)
        finally:
            os.close(fd)

    def run(self, module: str, pythonpath: str, tag: str, profile: bool) -> dict[str, Any]:
        assert self.watcher is not None and self.proxy is not None and self.server is not None
        n, c, w = self.args.models, self.cluster, self.watcher
        spies: list[Path] = []
        out: dict[str, Any] = {"operator": tag, "load_before": os.getloadavg()}

        def spy(op: Operator, phase: str) -> Profiler | None:
            if not profile:
                return None
            path = self.work / f"profile-{tag.replace(' ', '_')}-{phase}.txt"
            spies.append(path)
            return Profiler(op.pid, path)

        self.clear_pool_status()
        op = self.operator(module, pythonpath, tag)
        try:
            wait("the operator to reconcile the pool", self.pool_reconciled, 180, every=0.5)
            time.sleep(2)
            if self.args.settle_seconds:
                os.sync()
                time.sleep(self.args.settle_seconds)
            out["inode_create_us"] = self.inode_probe()
            # ---- create
            w.reset()
            req0, cpu0, srv0 = c.requests(), op.cpu(), cpu_seconds(self.server.proc.pid)
            calls0, threads0 = Counter(self.proxy.counts), thread_cpu(op.pid)
            prof = spy(op, "create")
            t0 = time.monotonic()
            files_at: list[float] = []

            def files() -> None:
                while time.monotonic() - t0 < self.args.timeout:
                    if sum(1 for e in os.scandir(self.repo) if not e.name.startswith(".")) >= n:
                        files_at.append(time.monotonic() - t0)
                        return
                    time.sleep(0.05)

            threading.Thread(target=files, daemon=True).start()
            manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [model(i) for i in range(n)]})
            c.kubectl("apply", "--server-side", "-f", "-", input=manifest)
            apply_s = time.monotonic() - t0
            wait(f"{n} models Ready", lambda: w.counts()[1] >= n, self.args.timeout)
            with w.lock:
                last_render = max(w.rendered.values()) - t0 if len(w.rendered) >= n else None
                last_ready = max(w.ready.values()) - t0
            time.sleep(3)
            if prof:
                prof.stop()
            cpu1, req1 = op.cpu(), c.requests()
            reqs = delta(req1, req0)
            out["create"] = {
                "apply_seconds": round(apply_s, 2),
                "files_on_volume_seconds": round(files_at[0], 2) if files_at else None,
                "last_rendered_seconds": round(last_render, 2) if last_render is not None else None,
                "last_ready_seconds": round(last_ready, 2),
                "window_seconds": round(time.monotonic() - t0, 1),
                "ready_after_last_render_seconds": round(last_ready - last_render, 2) if last_render else None,
                "operator_cpu_seconds": round(cpu1 - cpu0, 2),
                "operator_cpu_ms_per_model": round((cpu1 - cpu0) * 1000 / n, 2),
                "operator_cpu_seconds_by_thread": cpu_by_role(op.pid, threads0, cpu1 - cpu0),
                "server_cpu_seconds": round(cpu_seconds(self.server.proc.pid) - srv0, 2),
                "api_requests": reqs,
                "api_requests_per_model": per_model(reqs, n),
                "server_calls": delta(Counter(self.proxy.counts), calls0),
                "model_events_seen": w.events,
            }
            log(f"{tag} create: {json.dumps(out['create'])}")
            # ---- idle
            time.sleep(self.args.resync)
            prof = spy(op, "idle")
            req0, cpu0, srv0, calls0 = (
                c.requests(),
                op.cpu(),
                cpu_seconds(self.server.proc.pid),
                Counter(self.proxy.counts),
            )
            threads0, t0 = thread_cpu(op.pid), time.monotonic()
            time.sleep(self.args.window)
            window = time.monotonic() - t0
            cpu1, req1, srv1 = op.cpu(), c.requests(), cpu_seconds(self.server.proc.pid)
            if prof:
                prof.stop()
            reqs = delta(req1, req0)
            calls = delta(Counter(self.proxy.counts), calls0)
            resyncs = window / self.args.resync
            out["idle"] = {
                "window_seconds": round(window, 1),
                "operator_cpu_core_fraction": round((cpu1 - cpu0) / window, 4),
                "operator_cpu_ms_per_model_per_resync": round((cpu1 - cpu0) * 1000 / (n * resyncs), 3),
                "operator_cpu_seconds_by_thread": cpu_by_role(op.pid, threads0, cpu1 - cpu0),
                "server_cpu_core_fraction": round((srv1 - srv0) / window, 4),
                "api_requests": reqs,
                "status_writes": sum(
                    v for k, v in reqs.items() if k.startswith(("PATCH", "UPDATE")) and "/status" in k
                ),
                "server_calls": calls,
                "index_reads_per_10s": round(calls.get("index", 0) * 10 / window, 2),
            }
            out["operator_rss_mb"] = rss_mb(op.pid)
            out["server_rss_mb"] = rss_mb(self.server.proc.pid)
            log(f"{tag} idle: {json.dumps(out['idle'])} rss {out['operator_rss_mb']} MB")
            # ---- SIGTERM with N models, then a new operator resumes them
            out["sigterm_exit_seconds"] = op.sigterm()
            op = self.operator(module, pythonpath, tag)
            prof = spy(op, "restart")
            t0 = time.monotonic()
            time.sleep(1)
            quiet = op.wait_quiet(self.args.timeout)
            if prof:
                prof.stop()
            out["restart"] = {"quiet_after_seconds": round(quiet, 1), "operator_cpu_seconds": round(op.cpu(), 2)}
            log(f"{tag} sigterm {out['sigterm_exit_seconds']}s, restart: {json.dumps(out['restart'])}")
            time.sleep(2)
            # ---- delete
            w.reset()
            log_offset = self.server.log_path.stat().st_size
            req0, cpu0, calls0 = c.requests(), op.cpu(), Counter(self.proxy.counts)
            threads0 = thread_cpu(op.pid)
            prof = spy(op, "delete")
            t0 = time.monotonic()
            # every model marked for deletion by one request (a namespace's models deleted at once: what the
            # operator must keep up with), then waited for until gone (finalizers released)
            timeouts = 0
            while True:
                try:
                    w.api.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, "inferencemodels")
                    break
                except ApiException as exc:
                    # thousands outlive the API server's 60 s request timeout: asked again, it marks the rest
                    if exc.status != 504 or timeouts >= 10:
                        raise
                    timeouts += 1
                    log(f"delete-collection: HTTP 504 after {time.monotonic() - t0:.0f}s; asking again")
            delete_s = time.monotonic() - t0
            wait("every model gone", lambda: w.counts()[2] == 0 and not any(os.scandir(self.repo)), self.args.timeout)
            gone_s = time.monotonic() - t0
            time.sleep(2)
            if prof:
                prof.stop()
            cpu1, req1 = op.cpu(), c.requests()
            reqs = delta(req1, req0)
            with open(self.server.log_path, "rb") as f:
                f.seek(log_offset)
                errors = [ln for ln in f.read().decode(errors="replace").splitlines() if " ERROR " in ln]
            with w.lock:
                waits = sorted(w.gone[k] - w.deleting[k] for k in w.gone if k in w.deleting)
                last_marked = max(w.deleting.values(), default=t0) - t0
            out["delete"] = {
                "delete_request_seconds": round(delete_s, 2),
                "delete_request_timeouts": timeouts,
                "all_gone_seconds": round(gone_s, 2),
                # when the watch saw the last model marked for deletion, and how long each took from its mark
                # to its removal (the operator's part: folder removed, unloaded, finalizer released)
                "last_marked_seconds": round(last_marked, 2),
                "finalizer_seconds_median": round(statistics.median(waits), 2) if waits else None,
                "finalizer_seconds_max": round(waits[-1], 2) if waits else None,
                "server_calls": delta(Counter(self.proxy.counts), calls0),
                "operator_cpu_seconds": round(cpu1 - cpu0, 2),
                "operator_cpu_ms_per_model": round((cpu1 - cpu0) * 1000 / n, 2),
                "operator_cpu_seconds_by_thread": cpu_by_role(op.pid, threads0, cpu1 - cpu0),
                "api_requests": reqs,
                "api_requests_per_model": per_model(reqs, n),
                "server_error_lines": len(errors),
                "server_error_examples": errors[:3],
            }
            log(f"{tag} delete: {json.dumps(out['delete'])}")
            out["final_sigterm_exit_seconds"] = op.sigterm()
        finally:
            op.kill()
        out["load_after"] = os.getloadavg()
        out["profiles"] = [str(p) for p in spies]
        if profile and self.args.profile_summary:
            for path in spies:
                if path.exists():
                    print(summarize_profile(path), file=sys.stderr)
        return out


def baseline_package(ref: str, into: Path) -> None:
    """``operator/`` and ``server/`` of git revision ``ref`` as package ``kubeinfer`` under ``into``."""
    data = subprocess.run(["git", "archive", ref, "operator", "server"], cwd=ROOT, capture_output=True, check=True)
    (into / "kubeinfer").mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        tar.extractall(into / "kubeinfer", filter="data")
    so = next((ROOT / "server" / "grpc").glob("kubeinfer_grpc_transport*.so"), None)
    if so is not None:  # the built transport is not in git
        (into / "kubeinfer" / "server" / "grpc" / so.name).write_bytes(so.read_bytes())


#: (phase, key) pairs whose medians the summary reports
HEADLINE = (
    ("create", "apply_seconds"),
    ("create", "files_on_volume_seconds"),
    ("create", "last_rendered_seconds"),
    ("create", "last_ready_seconds"),
    ("create", "ready_after_last_render_seconds"),
    ("", "inode_create_us"),
    ("create", "operator_cpu_ms_per_model"),
    ("create", "api_requests_per_model"),
    ("idle", "operator_cpu_core_fraction"),
    ("idle", "operator_cpu_ms_per_model_per_resync"),
    ("idle", "status_writes"),
    ("idle", "index_reads_per_10s"),
    ("idle", "server_cpu_core_fraction"),
    ("", "operator_rss_mb"),
    ("", "server_rss_mb"),
    ("", "sigterm_exit_seconds"),
    ("restart", "quiet_after_seconds"),
    ("restart", "operator_cpu_seconds"),
    ("delete", "all_gone_seconds"),
    ("delete", "finalizer_seconds_max"),
    ("delete", "operator_cpu_ms_per_model"),
    ("delete", "api_requests_per_model"),
    ("delete", "server_error_lines"),
)


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase, key in HEADLINE:
        values = [(r.get(phase) if phase else r).get(key) for r in runs]
        values = [v for v in values if v is not None]
        if values:
            out[f"{phase}.{key}" if phase else key] = round(statistics.median(values), 4)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--resync", type=float, default=30.0, help="operator --resync-seconds")
    p.add_argument("--window", type=float, default=60.0, help="idle seconds measured, after one resync to settle")
    p.add_argument("--poll-secs", type=float, default=5.0, help="the server's --repository-poll-secs")
    p.add_argument("--timeout", type=float, default=900.0, help="longest wait for a phase")
    p.add_argument("--shared-cluster", action="store_true", help="use the machine's shared control plane")
    p.add_argument(
        "--baseline", metavar="REF", help="also measure the operator of this git revision (alternating with this one)"
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=0.0,
        help="wait this long (after a sync) before each create, so that the previous run's deleted inodes "
        "are no longer recent to the kernel (see Bench.inode_probe)",
    )
    p.add_argument("--profile", action="store_true", help="py-spy the first run's phases")
    p.add_argument("--profile-summary", action="store_true", help="print the top functions of each profile")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="operator-scale-"))
    log(f"work folder {work}; load {os.getloadavg()}")
    bench = Bench(args, work)
    variants = []
    if args.baseline:
        baseline_package(args.baseline, work / "baseline")
        variants.append((f"baseline {args.baseline}", "kubeinfer.operator", str(work / "baseline")))
    variants.append(("current", "kubeinfer.operator", ""))
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        bench.setup()
        # rounds of one run per variant, alternating: a load that changes during the benchmark (a shared
        # machine) falls on every variant alike
        for i in range(args.runs):
            for tag, module, path in variants:
                log(f"{tag}: run {i + 1}/{args.runs}")
                results.setdefault(tag, []).append(bench.run(module, path, tag, args.profile and i == 0))
    finally:
        bench.close()
    summary: dict[str, Any] = {
        "benchmark": "operator-scale",
        "command": " ".join(["benchmarks/operator_scale.py", *sys.argv[1:]]),
        "models": args.models,
        "resync_seconds": args.resync,
        "server_poll_seconds": args.poll_secs,
        "control_plane": "shared" if args.shared_cluster else "private",
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_end": os.getloadavg()},
        "medians": {tag: medians(runs) for tag, runs in results.items()},
        "runs": results,
    }
    print(json.dumps(summary["medians"], indent=2))
    out = HERE / "results" / f"operator-scale-{args.models}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
