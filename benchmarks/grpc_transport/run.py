"""gRPC front ends compared in one run: grpc.aio (the product's), the Rust transport, real Triton 2.51.

    .venv/bin/python benchmarks/grpc_transport/run.py               # builds the transport if needed, ~6 min
    .venv/bin/python benchmarks/grpc_transport/run.py --rounds 1 --window-ms 1000   # a quick look
    .venv/bin/python benchmarks/grpc_transport/run.py --from benchmarks/results/grpc-transport-X.json

Servers, all up at once, same add_sub ONNX file and config (benchmarks/peers/peers.py):
- ``aio``: ``kubeinfer-server --grpc-transport grpcio`` (gRPC on grpc.aio);
- ``rust``: ``kubeinfer-server --grpc-transport rust`` (server/grpc/rust_server.py, 1 tokio thread);
- ``rust-tls``: the same over TLS (a throwaway CA; the load's client verifies the server);
- ``rust-base``: ``--grpc-transport rust`` of another install, ``--baseline-python``'s (e.g. a venv with
  main's build), to compare two builds of the transport in one run;
- ``triton``: the real tritonserver 2.51 from the nvidia-pytriton wheel (python backend + onnxruntime).

Each point is ``kubeinfer perf -i grpc`` (closed loop, batch-1, the server's process-tree CPU per
request), servers in turn with who goes first rotating, ``--rounds`` rounds, medians. Then the trivial
handler: ServerLive in a tight loop from one client (a raw grpcio channel), server CPU per RPC.
Prints the table with ratios to Triton, writes ``benchmarks/results/grpc-transport-<time>.json``.
A measurement, never a test: nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(BENCH / "peers"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))  # tests.support.https: the throwaway CA of rust-tls

import peers  # noqa: E402
import results_file  # noqa: E402

_spec = importlib.util.spec_from_file_location("peers_run", BENCH / "peers" / "run.py")
assert _spec is not None and _spec.loader is not None
peers_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers_run)

SERVERS = ("aio", "rust", "triton")
#: server name -> the kubeinfer install it runs from (sys.executable unless --baseline-python)
PYTHON: dict[str, str] = {}
#: perf's flags for a TLS server (set when rust-tls runs)
TLS_FLAGS: list[str] = []
MODEL = "add_sub"


def start_kubeinfer(repo: Path, logs: Path, transport: str, name: str, *flags: str) -> peers.Peer:
    http, grpc, metrics = peers.free_port(), peers.free_port(), peers.free_port()
    log = logs / f"{name}.log"
    command = [PYTHON.get(name, sys.executable), "-m", "kubeinfer.server", "--grpc-transport", transport, *flags]
    command += ["--model-repository", str(repo), "--host", "127.0.0.1", "--http-port", str(http)]
    command += ["--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    return peers.Peer(name, http, grpc, peers._spawn(name, command, log), log)


def start(name: str, repos: dict[str, Path], logs: Path) -> peers.Peer:
    if name == "aio":
        return start_kubeinfer(repos["kubeinfer"], logs, "grpcio", name)
    if name in ("rust", "rust-base"):
        return start_kubeinfer(repos["kubeinfer"], logs, "rust", name)
    if name == "rust-tls":
        from tests.support.https import make_ca_and_cert

        ca, cert, key = make_ca_and_cert(logs)
        TLS_FLAGS[:] = ["--ssl-grpc-use-ssl", "--ssl-grpc-root-certifications-file", str(ca)]
        tls = ["--grpc-use-ssl", "true", "--grpc-server-cert", str(cert), "--grpc-server-key", str(key)]
        return start_kubeinfer(repos["kubeinfer"], logs, "rust", name, *tls)
    if name == "triton":
        return peers.start_triton(repos["triton"], logs)
    raise SystemExit(f"unknown server {name!r}")


def trivial(peer: peers.Peer, seconds: float) -> dict[str, Any]:
    """ServerLive back to back from one client: the front end's own cost per RPC, nothing below it."""
    import grpc
    from kubeinfer.server.tools.perf.server import process_tree_cpu

    target = f"127.0.0.1:{peer.grpc_port}"
    if peer.name == "rust-tls":
        credentials = grpc.ssl_channel_credentials(Path(TLS_FLAGS[2]).read_bytes())
        opened = grpc.secure_channel(target, credentials)
    else:
        opened = grpc.insecure_channel(target)
    with opened as channel:
        live: Any = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        for _ in range(200):  # warm-up
            live(b"")
        calls = 0
        cpu0, t0 = process_tree_cpu(peer.pid), time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            live(b"")
            calls += 1
        elapsed, cpu = time.perf_counter() - t0, process_tree_cpu(peer.pid) - cpu0
    return {"rpcs_per_s": round(calls / elapsed, 1), "server_cpu_us_per_rpc": round(cpu / calls * 1e6, 1)}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    servers = report["settings"]["servers"]
    for c in report["settings"]["concurrency"]:
        for server in servers:
            levels = [
                p["level"]
                for p in report["points"]
                if (p["server"], p["concurrency"]) == (server, c) and "throughput" in p["level"]
            ]
            rows.append(
                {
                    "case": f"add_sub c={c}",
                    "server": server,
                    "throughput": _median([lv["throughput"] for lv in levels]),
                    "p50_ms": _median([lv["p50_ms"] for lv in levels]),
                    "cpu_us": _median([(lv.get("server_cpu") or {}).get("us_per_request") for lv in levels]),
                    "errors": sum(lv["total_errors"] for lv in levels),
                    "rounds": len(levels),
                }
            )
    for server in servers:
        runs = [t for t in report["trivial"] if t["server"] == server and "rpcs_per_s" in t]
        rows.append(
            {
                "case": "ServerLive c=1",
                "server": server,
                "throughput": _median([t["rpcs_per_s"] for t in runs]),
                "p50_ms": None,
                "cpu_us": _median([t["server_cpu_us_per_rpc"] for t in runs]),
                "errors": 0,
                "rounds": len(runs),
            }
        )
    by_case = {(r["case"], r["server"]): r for r in rows}
    for r in rows:
        triton = by_case.get((r["case"], "triton"))
        for key in ("throughput", "p50_ms", "cpu_us"):
            ours, theirs = r.get(key), (triton or {}).get(key)
            r[f"{key}_vs_triton"] = round(ours / theirs, 2) if ours is not None and theirs else None
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, digits: int = 0) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [
        "| case | server | /s | p50 ms | server CPU µs/req | /s ×Triton | p50 ÷Triton | CPU ÷Triton |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['server']} | {f(r['throughput'])} | {f(r['p50_ms'], 2)} | {f(r['cpu_us'])} | "
            f"{f(r['throughput_vs_triton'], 2)} | {f(r['p50_ms_vs_triton'], 2)} | {f(r['cpu_us_vs_triton'], 2)} |"
        )
    return "\n".join(lines)


def cpu_ratio(rows: list[dict[str, Any]], case: str, ours: str, theirs: str, key: str = "cpu_us") -> float | None:
    by_case = {(r["case"], r["server"]): r for r in rows}
    a, b = (by_case.get((case, server), {}).get(key) for server in (ours, theirs))
    return round(a / b, 3) if a is not None and b else None


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 12's gRPC targets (part 4) for every server that is not Triton, and issue 25's (CPU/request of this
    build within 1.1x of --baseline-python's, TLS within 1.2x of plain): met or not, by this run."""
    by_case = {(r["case"], r["server"]): r for r in rows}
    lines = []
    servers = {r["server"] for r in rows}
    for case in sorted({r["case"] for r in rows}):
        for ours, theirs, limit in (("rust", "rust-base", 1.1), ("rust-tls", "rust", 1.2)):
            if {ours, theirs} <= servers:
                r = cpu_ratio(rows, case, ours, theirs)
                met = r is not None and r <= limit
                lines.append(f"{case}: CPU/request {ours} ÷ {theirs} ≤ {limit}: {r} {'met' if met else 'NOT met'}")
    if "triton" not in servers:
        return lines
    for server in sorted(servers - {"triton"}):
        checks = (
            ("add_sub c=16 throughput ×Triton ≥ 1.00", by_case.get(("add_sub c=16", server), {}), "throughput", True),
            ("add_sub c=16 CPU/request ÷Triton ≤ 1.00", by_case.get(("add_sub c=16", server), {}), "cpu_us", False),
            ("add_sub c=1 p50 ÷Triton ≤ 1.00", by_case.get(("add_sub c=1", server), {}), "p50_ms", False),
        )
        for what, row, key, higher in checks:
            ratio = row.get(f"{key}_vs_triton")
            met = ratio is not None and (ratio >= 1.0 if higher else ratio <= 1.0)
            lines.append(f"{server}: {what}: {'-' if ratio is None else ratio} {'met' if met else 'NOT met'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default=",".join(SERVERS), help="of aio, rust, rust-tls, rust-base, triton")
    p.add_argument("--baseline-python", default=None, help="the interpreter of the install rust-base runs")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--windows", type=int, default=3, help="windows per point (perf's --max-trials)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--processes", type=int, default=1, help="load processes per point")
    p.add_argument("--trivial-seconds", type=float, default=3.0, help="ServerLive loop per server and round (0: off)")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--from", dest="saved", type=Path, help="print a saved run's table, run nothing")
    args = p.parse_args(argv)
    if args.saved:
        rows = summarize(json.loads(args.saved.read_text()))
        print(table(rows))
        print("\n".join(targets(rows)))
        return 0
    servers = args.servers.split(",")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    if "rust-base" in servers:
        if not args.baseline_python:
            raise SystemExit("rust-base needs --baseline-python")
        PYTHON["rust-base"] = args.baseline_python
    if "rust" in servers:
        from kubeinfer.server.grpc.transport import rust_missing

        if rust_missing() is not None:  # `pip install -e .` builds it (setup.py) when cargo is on PATH
            raise SystemExit(f"the Rust gRPC transport cannot be measured: {rust_missing()}")
    if "triton" in servers:
        peers.venv("triton")
    from kubeinfer.server.examples import models as examples

    report: dict[str, Any] = {
        **results_file.header(),
        "settings": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "output"},
            "servers": servers,
            "concurrency": concurrency,
            "model": MODEL,
        },
        "peers": peers.describe(),
        "points": [],
        "trivial": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kubeinfer-grpc-transport-") as tmp:
        root = Path(tmp)
        onnx = root / f"{MODEL}.onnx"
        onnx.write_bytes(examples.add_sub(16).SerializeToString())
        repos = peers.write_repositories(root / "repos", {MODEL: onnx})
        running: dict[str, peers.Peer] = {}
        try:
            for name in servers:
                running[name] = start(name, repos, root)
            for name, peer in running.items():
                peer.wait([MODEL])
                print(f"{name} ready (pid {peer.pid}, grpc {peer.grpc_port})", flush=True)
            point = 0
            for rnd in range(args.rounds):
                for c in concurrency:
                    first = point % len(servers)
                    point += 1
                    for name in servers[first:] + servers[:first]:
                        extra = TLS_FLAGS if name == "rust-tls" else []
                        level = peers_run.perf_point(running[name], MODEL, "grpc", c, args, root / "point.json", extra)
                        report["points"].append({"round": rnd, "server": name, "concurrency": c, "level": level})
                        print(
                            f"[{time.time() - started:.0f}s] round {rnd + 1} c={c} {name}: {peers_run._shown(level)}",
                            flush=True,
                        )
                if args.trivial_seconds > 0:
                    first = rnd % len(servers)
                    for name in servers[first:] + servers[:first]:
                        result = {"round": rnd, "server": name, **trivial(running[name], args.trivial_seconds)}
                        report["trivial"].append(result)
                        print(f"[{time.time() - started:.0f}s] round {rnd + 1} ServerLive {name}: {result}", flush=True)
        finally:
            for peer in running.values():
                peer.stop()
        for name in servers:
            if name.startswith("rust"):
                lines = (root / f"{running[name].name}.log").read_text().splitlines()
                report.setdefault("wakeups", {})[name] = [ln for ln in lines if "wake-ups" in ln]
    rows = summarize(report)
    report["summary"] = rows
    report["targets"] = targets(rows)
    print()
    print(table(rows))
    print("\n".join(report["targets"]))
    for name, lines in report.get("wakeups", {}).items():
        print(f"{name}: {' '.join(lines)[-120:]}")
    out = results_file.write(report, "grpc-transport", args.output)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
