"""Peer benchmark: kubeinfer against real Triton 2.51, MLServer 1.7.1 and the in-process limit, one run.

    .venv/bin/python benchmarks/peers/run.py            # sets up what it needs (once), ~20 min on 2 cores
    .venv/bin/python benchmarks/peers/run.py --rounds 1 --models add_sub --window-ms 1500   # a quick look

Same ONNX files (ResNet-18 CIFAR, add_sub), same batching and onnxruntime settings for every server
(peers.py), all servers up at once and measured interleaved: for each point (model, protocol,
concurrency) every server is driven in turn by ``kubeinfer perf`` (closed loop, batch-1 requests,
binary tensors except MLServer's JSON REST), rotating who goes first, for ``--rounds`` rounds; a
server's figure is its median over the rounds. ResNet-18's in-process limit (onnxruntime alone at batch
1 and 16, best layout of sessions × threads) is measured in every round, right before its points.
Server CPU per request is the server's whole process tree (Triton's python stubs, MLServer's workers)
over the same windows: it stays meaningful when the load generator and other work share the cores.

Prints one table of ratios (kubeinfer/Triton, kubeinfer/MLServer, kubeinfer/limit), writes
``benchmarks/results/peers-<time>.json`` and ``.png``. A measurement, never a test: nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import peers  # noqa: E402
import results_file  # noqa: E402
from inprocess import measure  # noqa: E402
from loadgen import Tensor  # noqa: E402

SERVERS = ("kubeinfer", "triton", "mlserver")
LIMIT_BATCHES = (1, 16)


def perf_point(
    peer: peers.Peer,
    model: str,
    protocol: str,
    concurrency: int,
    args: argparse.Namespace,
    out: Path,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    """One ``kubeinfer perf`` level against ``peer``; ``extra``: more perf flags (e.g. --ssl-grpc-*)."""
    port = peer.http_port if protocol == "http" else peer.grpc_port
    command = [
        sys.executable,
        "-m",
        "kubeinfer.server.tools.cli",
        "perf",
        "-q",
        "-m",
        model,
        "-i",
        protocol,
        "-u",
        f"127.0.0.1:{port}",
        "--concurrency-range",
        str(concurrency),
        "-p",
        str(args.window_ms),
        "-r",
        str(args.windows),
        "--warmup-seconds",
        str(args.warmup),
        "--server-pid",
        str(peer.pid),
        "--processes",
        str(args.processes),
        "--json",
        str(out),
        *(extra or []),
    ]
    if protocol == "http" and not peer.http_binary:
        command += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if not out.exists():
        return {"error": done.stderr[-2000:] or done.stdout[-2000:]}
    (level,) = json.loads(out.read_text())["levels"]
    out.unlink()
    return level


def limits(
    onnx_files: dict[str, Path], seconds: float, layouts: list[dict[str, Any]] | None = None
) -> dict[str, dict[int, float]]:
    """Each model's best in-process rows/s per batch size; every layout measured is appended to ``layouts``
    (one session × all threads is what a client at concurrency 1 can reach, two sessions are not)."""
    out: dict[str, dict[int, float]] = {}
    for model, path in onnx_files.items():
        inputs, _ = peers.MODELS[model]
        tensors = [Tensor(n, t, [1, *d]) for n, t, d in inputs]
        result = measure(str(path), tensors, LIMIT_BATCHES, seconds)
        if layouts is not None:
            layouts.append({"model": model, "points": result["points"]})
        out[model] = {b: max(p["throughput"] for p in result["points"] if p["batch"] == b) for b in LIMIT_BATCHES}
    return out


def _limit(rnd: dict[str, Any], model: str, batch: int) -> float | None:
    """One round's limit (keys are ints in memory, strings once read back from the JSON file)."""
    by_batch = rnd.get(model) or {}
    value = by_batch.get(batch, by_batch.get(str(batch)))
    return None if value is None else float(value)


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    limit_rounds = report["limits"]
    for model in report["settings"]["models"]:
        for protocol in report["settings"]["protocols"]:
            for c in report["settings"]["concurrency"]:
                row: dict[str, Any] = {"model": model, "protocol": protocol, "concurrency": c}
                for server in report["settings"]["servers"]:
                    points = [
                        p
                        for p in report["points"]
                        if (p["model"], p["protocol"], p["concurrency"], p["server"]) == (model, protocol, c, server)
                    ]
                    ok = [p["level"] for p in points if "throughput" in p["level"]]
                    row[server] = _median([lv["throughput"] for lv in ok])
                    row[f"{server}_p50_ms"] = _median([lv["p50_ms"] for lv in ok])
                    row[f"{server}_cpu_us"] = _median([(lv.get("server_cpu") or {}).get("us_per_request") for lv in ok])
                    row[f"{server}_errors"] = sum(lv["total_errors"] for lv in ok) + len(points) - len(ok)
                # the in-process limit of the targets: batch 1 for c=1, batch 16 for c=16 (4: batch 1);
                # add_sub's is millions of rows/s, no yardstick for a server, so only ResNet-18 gets one
                batch = 16 if c >= 16 else 1
                values = [v for r in limit_rounds if (v := _limit(r, model, batch)) is not None]
                row["limit"] = _median(values)
                row["limit_batch"] = batch
                k = row.get("kubeinfer")
                for other in ("triton", "mlserver", "limit"):
                    row[f"vs_{other}"] = round(k / row[other], 2) if k and row.get(other) else None
                rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | protocol | c | kubeinfer /s | Triton /s | MLServer /s | limit /s (batch) | ×Triton | ×MLServer "
        "| ×limit | p50 ms k / T | CPU µs/req k / T / M |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:

        def f(v: Any) -> str:
            return "-" if v is None else (f"{v:.0f}" if isinstance(v, float) and v >= 10 else str(v))

        lines.append(
            f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {f(r.get('kubeinfer'))} | {f(r.get('triton'))} | "
            f"{f(r.get('mlserver'))} | {f(r.get('limit'))} ({r['limit_batch']}) | {f(r.get('vs_triton'))} | "
            f"{f(r.get('vs_mlserver'))} | {f(r.get('vs_limit'))} | "
            f"{f(r.get('kubeinfer_p50_ms'))} / {f(r.get('triton_p50_ms'))} | "
            f"{f(r.get('kubeinfer_cpu_us'))} / {f(r.get('triton_cpu_us'))} / {f(r.get('mlserver_cpu_us'))} |"
        )
    return "\n".join(lines)


def _raw(report: dict[str, Any], server: str, model: str, protocol: str, c: int, key: str) -> float | None:
    """The unrounded median of one figure over the rounds (p50s of a few hundred µs need the digits)."""
    values = []
    for p in report["points"]:
        if (p["server"], p["model"], p["protocol"], p["concurrency"]) == (server, model, protocol, c):
            level = p["level"]
            value = (level.get("server_cpu") or {}).get("us_per_request") if key == "cpu" else level.get(key)
            if value is not None:
                values.append(value)
    return statistics.median(values) if values else None


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 12's targets (part 4), each with the figures of this run and whether it is met."""
    rows: list[dict[str, Any]] = []

    def ratio(what: str, ours: float | None, theirs: float | None, goal: float, higher: bool = True) -> None:
        value = ours / theirs if ours is not None and theirs else None
        met = value is not None and (value >= goal if higher else value <= goal)
        rows.append({"target": what, "goal": goal, "ratio": None if value is None else round(value, 2), "met": met})

    def k(model: str, protocol: str, c: int, key: str = "throughput") -> float | None:
        return _raw(report, "kubeinfer", model, protocol, c, key)

    def t(model: str, protocol: str, c: int, key: str = "throughput") -> float | None:
        return _raw(report, "triton", model, protocol, c, key)

    for protocol, goal in (("grpc", 1.0), ("http", 1.1)):
        ratio(
            f"add_sub c=16 {protocol}: throughput ×Triton", k("add_sub", protocol, 16), t("add_sub", protocol, 16), goal
        )
    for protocol in ("grpc", "http"):
        ratio(
            f"add_sub c=16 {protocol}: server CPU/request ÷ Triton's",
            k("add_sub", protocol, 16, "cpu"),
            t("add_sub", protocol, 16, "cpu"),
            1.0,
            higher=False,
        )
    for protocol in ("grpc", "http"):
        ratio(
            f"add_sub c=1 {protocol}: p50 ÷ Triton's",
            k("add_sub", protocol, 1, "p50_ms"),
            t("add_sub", protocol, 1, "p50_ms"),
            1.0,
            higher=False,
        )
    for protocol in ("grpc", "http"):
        ratio(
            f"ResNet-18 c=16 {protocol}: throughput ×Triton",
            k("resnet18", protocol, 16),
            t("resnet18", protocol, 16),
            1.05,
        )
    limit = {b: [v for r in report["limits"] if (v := _limit(r, "resnet18", b)) is not None] for b in LIMIT_BATCHES}
    one_call = one_call_limits(report, "resnet18")
    for protocol in ("grpc", "http"):
        for c, batch in ((16, 16), (1, 1)):
            values = limit[batch]
            ratio(
                f"ResNet-18 c={c} {protocol}: throughput × in-process batch {batch}",
                k("resnet18", protocol, c),
                statistics.median(values) if values else None,
                0.95,
            )
        # shown beside the target, never instead of it: what one caller reaches in-process
        ratio(
            f"ResNet-18 c=1 {protocol}: throughput × in-process batch 1, one call at a time",
            k("resnet18", protocol, 1),
            statistics.median(one_call) if one_call else None,
            0.95,
        )
    return rows


def one_call_limits(report: dict[str, Any], model: str) -> list[float]:
    """Each round's in-process batch-1 limit with one session (all threads), the only layout a client at
    concurrency 1 can use: it waits for each answer, so two sessions never run at once for it."""
    return [
        max(p["throughput"] for p in layout["points"] if p["sessions"] == 1 and p["batch"] == 1)
        for layout in report.get("limit_layouts", [])
        if layout["model"] == model and any(p["sessions"] == 1 and p["batch"] == 1 for p in layout["points"])
    ]


def targets_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| target (issue 12, part 4) | goal | measured | met |", "|---|---|---|---|"]
    for r in rows:
        sign = "≥" if "×" in r["target"] else "≤"
        shown = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"| {r['target']} | {sign} {r['goal']:.2f} | {shown} | {'yes' if r['met'] else '**no**'} |")
    return "\n".join(lines)


def chart(path: Path, rows: list[dict[str, Any]], servers: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['protocol']} c{r['concurrency']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.8), dpi=100)
    names = [*servers, "limit"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [r.get(name) or 0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(rows))], labels, fontsize=7)
    ax.set_ylabel("inferences/s (log)")
    ax.set_yscale("log")
    ax.set_title("kubeinfer vs Triton 2.51 vs MLServer 1.7.1, same cores, one run", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _shown(level: dict[str, Any]) -> str:
    if "throughput" not in level:
        return f"FAILED {level['error'][-300:]}"
    cpu = (level.get("server_cpu") or {}).get("us_per_request")
    return f"{level['throughput']:.1f}/s p50 {level['p50_ms']} ms, server cpu {cpu} us/req"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="add_sub,resnet18")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=2000)
    p.add_argument("--windows", type=int, default=3, help="windows per point (perf's --max-trials)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--processes", type=int, default=1, help="load processes per point")
    p.add_argument("--limit-seconds", type=float, default=2.0)
    p.add_argument("--no-limit", action="store_true")
    p.add_argument("--setup-only", action="store_true", help="build the peers' virtualenvs and stop")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--from", dest="saved", type=Path, help="print the tables of a saved results file, run nothing")
    args = p.parse_args(argv)
    if args.saved:
        saved = json.loads(args.saved.read_text())
        print(table(summarize(saved)))
        print()
        print(targets_table(targets(saved)))
        return 0
    models = args.models.split(",")
    protocols = args.protocols.split(",")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    servers = args.servers.split(",")
    for name in servers:
        if name != "kubeinfer":
            peers.venv(name)
    if args.setup_only:
        return 0
    from kubeinfer.server.examples import models as examples

    report: dict[str, Any] = {
        **results_file.header(),
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "output"},
            "models": models,
            "protocols": protocols,
            "concurrency": concurrency,
            "servers": servers,
        },
        "peers": peers.describe(),
        "limits": [],
        "limit_layouts": [],
        "points": [],
    }
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kubeinfer-peers-") as tmp:
        root = Path(tmp)
        onnx_files = {}
        builders = {"add_sub": lambda: examples.add_sub(16), "resnet18": lambda: examples.resnet18_cifar(seed=0)}
        for model in models:
            onnx_files[model] = root / f"{model}.onnx"
            onnx_files[model].write_bytes(builders[model]().SerializeToString())
        repos = peers.write_repositories(root / "repos", onnx_files)
        starters = {"kubeinfer": peers.start_kubeinfer, "triton": peers.start_triton, "mlserver": peers.start_mlserver}
        running: dict[str, peers.Peer] = {}
        try:
            for name in servers:
                running[name] = starters[name](repos[name], root)
            for peer in running.values():
                peer.wait(models)
                print(f"{peer.name} ready (pid {peer.pid}, http {peer.http_port}, grpc {peer.grpc_port})", flush=True)
            total = args.rounds * len(models) * len(protocols) * len(concurrency) * len(servers)
            done = 0
            point = 0
            for rnd in range(args.rounds):
                lim: dict[str, dict[int, float]] = {}
                report["limits"].append(lim)
                for model in models:
                    if not args.no_limit and model == "resnet18":
                        # right before the model's own points: the machine's load drifts within a round
                        lim.update(limits({model: onnx_files[model]}, args.limit_seconds, report["limit_layouts"]))
                        print(f"round {rnd + 1}: in-process limit {json.dumps(lim[model])}", flush=True)
                    for protocol in protocols:
                        for c in concurrency:
                            # who goes first rotates: a slow minute on the shared machine hits each in turn
                            first = point % len(servers)
                            point += 1
                            order = servers[first:] + servers[:first]
                            for name in order:
                                level = perf_point(running[name], model, protocol, c, args, root / "point.json")
                                done += 1
                                report["points"].append(
                                    {
                                        "round": rnd,
                                        "server": name,
                                        "model": model,
                                        "protocol": protocol,
                                        "concurrency": c,
                                        "level": level,
                                    }
                                )
                                elapsed = time.time() - started
                                print(
                                    f"[{done}/{total} {elapsed:.0f}s, ~{elapsed / done * (total - done):.0f}s left] "
                                    f"{model} {protocol} c={c} {name}: {_shown(level)}",
                                    flush=True,
                                )
        finally:
            for peer in running.values():
                peer.stop()
    rows = summarize(report)
    report["summary"] = rows
    report["targets"] = targets(report)
    print()
    print(table(rows))
    print()
    print(targets_table(report["targets"]))
    out = results_file.write(report, "peers", args.output)
    chart(out.with_suffix(".png"), rows, servers)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
