"""Operator resync cost: idle CPU and API requests per model per resync, with nothing changing.

It starts a private control plane (its own run folder, so nobody else's requests are counted),
one real ``kubeinfer-server`` (poll mode) serving N InferenceModels of one InferenceServer, and the
real operator out of cluster (``--server-endpoint``: the server runs on this machine). Once every
model is Ready it waits one resync period, then measures over a window of several periods:

* the operator process's CPU time (``/proc/<pid>/stat``), as a fraction of one core and per model
  per resync;
* the API server's own request counters (``apiserver_request_total``) for the operator's resources
  (InferenceModels and their status, InferenceServers, Events), per model per resync, and the status
  writes among them (target: none, since nothing changed);
* repository index reads per model per resync (what the operator costs the server), counted by a
  small forwarding proxy in front of the server;
* how long the operator takes to exit on SIGTERM.

With ``--baseline REF`` it first measures the operator of that git revision (``git archive`` of its
``operator/`` and ``server/``, first on PYTHONPATH) on the same cluster and models, and prints the
ratios: compare within one run, the machine is shared. Results go to
``benchmarks/results/operator-resync-<time>.json``. A measurement, never a test.

    .venv/bin/python benchmarks/operator_resync.py --models 200 --resync 30 --window 90 [--baseline 908aa5b]
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.support.models import unary  # noqa: E402
from tests.support.server import start_server  # noqa: E402

CLUSTER = ROOT / "e2e" / "cluster" / "cluster.py"
API = "serving.kubeinfer.io/v1alpha1"
RESOURCES = ("inferencemodels", "inferenceservers", "events")
_REQUEST = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")


def log(msg: str) -> None:
    print(f"[operator-resync] {msg}", file=sys.stderr, flush=True)


class Cluster:
    def __init__(self, run: Path) -> None:
        self.env = {**os.environ, "KUBEINFER_CLUSTER_RUN": str(run)}
        proc = subprocess.run(
            [sys.executable, str(CLUSTER), "up", "--json"], env=self.env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise SystemExit(f"cluster up failed:\n{proc.stderr[-4000:]}")
        self.info = json.loads(proc.stdout)
        self.kubeconfig = self.info["kubeconfig"]
        self.kubectl_bin = str(Path(self.info["bin_dir"]) / "kubectl")

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def requests(self) -> dict[tuple[str, str, str], float]:
        """apiserver_request_total for our resources, by (verb, resource, subresource); WATCH excluded."""
        out: dict[tuple[str, str, str], float] = {}
        for line in self.kubectl("get", "--raw", "/metrics").splitlines():
            m = _REQUEST.match(line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
            if labels.get("resource") not in RESOURCES or labels.get("verb") == "WATCH":
                continue
            key = (labels["verb"], labels["resource"], labels.get("subresource", ""))
            out[key] = out.get(key, 0.0) + float(m["value"])
        return out

    def down(self) -> None:
        subprocess.run([sys.executable, str(CLUSTER), "down"], env=self.env, capture_output=True, check=False)


class CountingProxy:
    """Forwards HTTP to the server and counts repository index reads (what the operator costs the server)."""

    def __init__(self, target: str) -> None:
        self.index_reads = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else None
                if self.path == "/v2/repository/index":
                    outer.index_reads += 1
                req = urllib.request.Request(target + self.path, data=body, method=method)
                req.add_header("Content-Type", "application/json")
                with urllib.request.urlopen(req, timeout=30) as resp:
                    data = resp.read()
                    self.send_response(resp.status)
                self.send_header("Content-Type", "application/json")
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def baseline_package(ref: str, into: Path) -> str:
    """``operator/`` and ``server/`` of git revision ``ref`` as package ``kubeinfer`` under ``into``
    (put first on PYTHONPATH, it wins over the editable install of the working tree)."""
    data = subprocess.run(
        ["git", "archive", ref, "operator", "server"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    (into / "kubeinfer").mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into / "kubeinfer", filter="data")
    return "kubeinfer.operator"


def wait(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise SystemExit(f"timed out waiting for {what}")


def clear_status(cluster: Cluster, ns: str, names: list[str]) -> None:
    """Forget the previous variant's status, so "Ready" below is this operator's own verdict."""
    import kubernetes

    api = kubernetes.client.CustomObjectsApi(kubernetes.config.new_client_from_config(cluster.kubeconfig))
    for name in names:
        api.patch_namespaced_custom_object_status(
            "serving.kubeinfer.io", "v1alpha1", ns, "inferencemodels", name, {"status": None},
            _content_type="application/merge-patch+json",
        )  # fmt: skip


def ready_count(cluster: Cluster, ns: str) -> int:
    items = json.loads(cluster.kubectl("-n", ns, "get", "inferencemodels", "-o", "json"))["items"]
    return sum(
        1
        for m in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in (m.get("status") or {}).get("conditions", []))
    )


def measure(
    name: str,
    module: str,
    pythonpath: str,
    cluster: Cluster,
    ns: str,
    root: Path,
    proxy: CountingProxy,
    args: argparse.Namespace,
    logs: Path,
) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", module,
        "--kubeconfig", cluster.kubeconfig,
        "--repository-root", str(root),
        "--namespace", ns,
        "--resync-seconds", str(args.resync),
        "--server-endpoint", f"{ns}/pool={proxy.url}",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": pythonpath + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(logs / f"operator-{name}.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        t0 = time.monotonic()
        wait(f"{args.models} models Ready ({name})", lambda: ready_count(cluster, ns) == args.models, args.timeout)
        # every model Ready, and the status writes that made it so are done; one more period to settle
        converge = time.monotonic() - t0
        log(f"{name}: all {args.models} models Ready in {converge:.1f}s; settling {args.resync:.0f}s")
        time.sleep(args.resync)
        cpu0, req0, idx0 = cpu_seconds(proc.pid), cluster.requests(), proxy.index_reads
        w0 = time.monotonic()
        time.sleep(args.window)
        window = time.monotonic() - w0
        cpu1, req1, idx1 = cpu_seconds(proc.pid), cluster.requests(), proxy.index_reads
        rss = rss_mb(proc.pid)
        t_stop = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
            stop_s: float | None = round(time.monotonic() - t_stop, 2)
        except subprocess.TimeoutExpired:
            stop_s = None
            proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    resyncs = window / args.resync
    per_model_resync = args.models * resyncs
    delta = {}
    for (verb, resource, sub), after in sorted(req1.items()):
        if after - req0.get((verb, resource, sub), 0):
            delta[f"{verb} {resource}{'/' + sub if sub else ''}"] = int(after - req0.get((verb, resource, sub), 0))
    api_total = sum(delta.values())
    status_writes = sum(v for k, v in delta.items() if k.startswith(("PATCH", "UPDATE", "APPLY")) and "/status" in k)
    result = {
        "operator": name,
        "converge_seconds": round(converge, 1),
        "window_seconds": round(window, 1),
        "cpu_core_fraction": round((cpu1 - cpu0) / window, 4),
        "cpu_ms_per_model_per_resync": round((cpu1 - cpu0) * 1000 / per_model_resync, 3),
        "api_requests": delta,
        "api_requests_per_model_per_resync": round(api_total / per_model_resync, 4),
        "status_writes": status_writes,
        "index_reads": idx1 - idx0,
        "index_reads_per_model_per_resync": round((idx1 - idx0) / per_model_resync, 4),
        "rss_mb": round(rss, 1),
        "sigterm_exit_seconds": stop_s,
    }
    log(f"{name}: {json.dumps(result)}")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--resync", type=float, default=30.0, help="operator --resync-seconds")
    p.add_argument("--window", type=float, default=90.0, help="seconds measured once everything is Ready")
    p.add_argument("--timeout", type=float, default=900.0, help="longest wait for all models to be Ready")
    p.add_argument("--baseline", metavar="REF", help="also measure the operator of this git revision, first")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="operator-resync-"))
    logs = work / "logs"
    logs.mkdir()
    log(f"work folder {work}")
    cluster = Cluster(work / "cluster")
    server = None
    results: list[dict[str, Any]] = []
    try:
        ns = "bench"
        cluster.kubectl("apply", "-f", str(ROOT / "crds"))
        for crd in ("inferencemodels", "inferenceservers"):
            cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}.serving.kubeinfer.io", "--timeout=60s")
        cluster.kubectl("create", "namespace", ns)
        root = work / "volume"
        import onnx
        from onnx import TensorProto

        # the operator of today resolves subPath and source.path inside <volume>/<namespace>/ (tenant
        # isolation); older revisions (a --baseline) inside <volume>/: the file is in both places
        for uploads in (root / "uploads", root / ns / "uploads"):
            uploads.mkdir(parents=True)
            onnx.save(unary("relu", "Relu", TensorProto.FLOAT, ["batch", 4]), uploads / "relu.onnx")
        pool = {
            "apiVersion": API,
            "kind": "InferenceServer",
            "metadata": {"name": "pool", "namespace": ns},
            "spec": {"image": "img:1", "repository": {"claimName": "c", "subPath": "pool"}},
        }
        models = [
            {
                "apiVersion": API,
                "kind": "InferenceModel",
                "metadata": {"name": f"m{i:04d}", "namespace": ns},
                "spec": {
                    "server": "pool",
                    "platform": "onnxruntime_onnx",
                    "maxBatchSize": 8,
                    "inputs": [{"name": "IN", "dataType": "FP32", "dims": [4]}],
                    "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [4]}],
                    "instanceGroups": [{"count": 1, "kind": "KIND_CPU"}],
                    "versions": [{"version": 1, "source": {"path": "uploads/relu.onnx"}}],
                },
            }
            for i in range(args.models)
        ]
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [pool, *models]})
        )
        variants = []
        if args.baseline:
            package = baseline_package(args.baseline, work / "baseline")
            variants.append((f"baseline {args.baseline}", package, str(work / "baseline"), root / "pool"))
        variants.append(("current", "kubeinfer.operator", "", root / ns / "pool"))
        for name, module, path, repo in variants:
            clear_status(cluster, ns, [m["metadata"]["name"] for m in models])
            # a fresh server per variant, on the folder that operator renders into
            repo.mkdir(parents=True, exist_ok=True)
            server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "5", log_dir=logs)
            try:
                proxy = CountingProxy(server.base_url)
                results.append(measure(name, module, path, cluster, ns, root, proxy, args, logs))
            finally:
                server.terminate()
                server = None
    finally:
        if server is not None:
            server.terminate()
        cluster.down()
    summary: dict[str, Any] = {
        "benchmark": "operator-resync",
        "models": args.models,
        "resync_seconds": args.resync,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "results": results,
    }
    if len(results) == 2:
        base, cur = results
        summary["ratios_current_over_baseline"] = {
            k: (round(cur[k] / base[k], 3) if base[k] else None)
            for k in ("cpu_core_fraction", "api_requests_per_model_per_resync", "index_reads_per_model_per_resync")
        }
    print(json.dumps(summary, indent=2))
    out = HERE / "results" / f"operator-resync-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
