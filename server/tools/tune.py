"""``kubeinfer tune``: the batching and instance settings that serve the most within a latency budget.

    kubeinfer tune model_repository/resnet --p99-ms 50 --write        # a model folder: its own server
    kubeinfer tune --url 127.0.0.1:8000 -m resnet --p99-ms 50         # a running server in explicit mode

Each candidate configuration is loaded with a config override (the repository API's ``load`` with a
``config`` parameter, as Triton's Model Analyzer does), then measured by ``kubeinfer perf``'s machinery
at rising concurrency (1, 2, 4, ... ``--max-concurrency``) until p99 leaves the budget or throughput stops
growing; its score is the best throughput whose p99 is within ``--p99-ms``. The search is staged, as Model
Analyzer's quick search: (1) instance ``count`` × ``max_batch_size`` without queue delay, (2) the best of
those with each ``max_queue_delay_microseconds``, (3) the best so far with ``preferred_batch_size`` set to
its max batch size and half of it. Output: the table of every configuration tried, ``--json``, ``--plot``
(throughput against p99 for every level, the budget as a line). ``--write`` writes the winner into the
model's config.pbtxt (atomically; other fields kept, comments lost); the InferenceModel fields to set are
printed either way. A running server gets its original configuration back at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..config import config_from_dict, config_to_dict, config_to_text, load_config_file, pb
from ..repository import confined, publish
from .perf import wire
from .perf.load import Level, Setup, WorkerPool
from .perf.measure import Plan, measure_level
from .perf.model import PerfError, input_steps, model_info, parse_shapes, resolve_shapes
from .perf.server import ServerApi

#: stop raising concurrency when the next level gains less than this
MIN_GAIN = 1.05


@dataclass
class Candidate:
    instances: int
    max_batch_size: int
    delay_us: int = 0
    preferred: tuple[int, ...] = ()
    levels: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        pref = ",".join(map(str, self.preferred)) or "-"
        return f"count={self.instances} max_batch={self.max_batch_size} delay={self.delay_us}us preferred={pref}"

    def best(self, budget_ms: float) -> dict[str, Any] | None:
        ok = [lv for lv in self.levels if lv["errors"] == 0 and lv["p99_ms"] is not None and lv["p99_ms"] <= budget_ms]
        return max(ok, key=lambda lv: lv["throughput"]) if ok else None

    def score(self, budget_ms: float) -> float:
        best = self.best(budget_ms)
        return best["throughput"] if best else 0.0

    def apply(self, config: pb.ModelConfig) -> pb.ModelConfig:
        out = pb.ModelConfig()
        out.CopyFrom(config)
        if config.max_batch_size > 0:
            out.max_batch_size = self.max_batch_size
            db = out.dynamic_batching
            db.max_queue_delay_microseconds = self.delay_us
            del db.preferred_batch_size[:]
            db.preferred_batch_size.extend(self.preferred)
        groups = out.instance_group
        if not groups:
            groups.add()
        groups[0].count = self.instances
        del groups[1:]
        return out

    def as_dict(self, budget_ms: float) -> dict[str, Any]:
        best = self.best(budget_ms)
        return {
            "instances": self.instances,
            "max_batch_size": self.max_batch_size,
            "max_queue_delay_microseconds": self.delay_us,
            "preferred_batch_size": list(self.preferred),
            "within_budget": best is not None,
            "best": best,
            "error": self.error,
            "levels": self.levels,
        }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", nargs="?", type=Path, help="the model's folder (<repository>/<model>)")
    p.add_argument("-m", "--model-name", dest="model", default=None, help="the model (default: the folder's name)")
    p.add_argument("-u", "--url", default=None, help="a running server's HTTP host:port (explicit model control)")
    p.add_argument("--p99-ms", type=float, required=True, help="the latency budget: p99 in milliseconds")
    p.add_argument("-i", "--protocol", choices=["http", "grpc"], default="http", help="the protocol measured")
    p.add_argument("--instances", default="1,2", help="instance counts to try")
    p.add_argument("--max-batch-sizes", default="4,8,16,32,64", help="max_batch_size values to try")
    p.add_argument("--delays-us", default="100,500,2000", help="max_queue_delay_microseconds values to try")
    p.add_argument("--max-concurrency", type=int, default=64, help="the highest load level (requests in flight)")
    p.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 for inputs with variable dims")
    p.add_argument("--input-data", default="random", help="as kubeinfer perf's")
    p.add_argument("-p", "--measurement-interval", type=int, default=1000, help="window length in ms")
    p.add_argument("-r", "--max-trials", type=int, default=3, help="windows per level")
    p.add_argument("--warmup-seconds", type=float, default=0.5)
    p.add_argument("--server-arg", action="append", default=[], help="an extra kubeinfer-server flag (own server)")
    p.add_argument("--write", action="store_true", help="write the best configuration into the config.pbtxt")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument("-q", "--quiet", action="store_true")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise PerfError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or values[0] < 0:
        raise PerfError(f"{flag} {text!r}: expected non-negative integers")
    return values


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnServer:
    """A kubeinfer-server in explicit mode over a copy of the model folder (the original is not touched)."""

    def __init__(self, model_dir: Path, name: str, extra: list[str]) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="kubeinfer-tune-"))
        shutil.copytree(model_dir, self.tmp / "repo" / name, symlinks=False)
        self.http, self.grpc = _free_port(), _free_port()
        command = [sys.executable, "-m", "kubeinfer.server", "--model-repository", str(self.tmp / "repo")]
        command += ["--host", "127.0.0.1", "--http-port", str(self.http), "--grpc-port", str(self.grpc)]
        command += ["--metrics-port", str(_free_port()), "--model-control-mode", "explicit", *extra]
        self.log = self.tmp / "server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise PerfError(f"kubeinfer-server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.http}/v2/health/live", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise PerfError("kubeinfer-server did not start within 120 s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _load(http: httpx.Client, model: str, config: pb.ModelConfig | None) -> None:
    body = {"parameters": {"config": json.dumps(config_to_dict(config))}} if config is not None else {}
    answer = http.post(f"/v2/repository/models/{model}/load", json=body, timeout=600)
    if answer.status_code != 200:
        raise PerfError(f"loading '{model}': HTTP {answer.status_code} {answer.text[:500]}")


def _measure(
    candidate: Candidate,
    api: ServerApi,
    setups: list[Setup],
    plan: Plan,
    args: argparse.Namespace,
    log: Any,
) -> None:
    concurrency = 1
    previous = 0.0
    with WorkerPool(setups) as pool:
        while concurrency <= args.max_concurrency:
            level = measure_level(pool, api, plan, Level(concurrency=concurrency), None, None)
            candidate.levels.append(level)
            if log is not None:
                print(
                    f"  {candidate.label} c={concurrency}: {level['throughput']:.1f}/s p99 {level['p99_ms']} ms",
                    file=log,
                    flush=True,
                )
            if level["errors"] or level["p99_ms"] is None or level["p99_ms"] > args.p99_ms:
                return
            if previous and level["throughput"] < previous * MIN_GAIN:
                return
            previous = level["throughput"]
            concurrency *= 2


def run(args: argparse.Namespace) -> int:
    if (args.model_dir is None) == (args.url is None):
        raise PerfError("give a model folder or --url of a running server (explicit model control), not both")
    if args.model_dir is not None:
        if not (args.model_dir / "config.pbtxt").is_file():
            raise PerfError(f"{args.model_dir}: no config.pbtxt (give the model's folder, <repository>/<model>)")
        model = args.model or args.model_dir.resolve().name
    else:
        if not args.model:
            raise PerfError("--url needs -m MODEL")
        if args.write:
            raise PerfError("--write needs the model's folder; with --url the fields to set are printed")
        model = args.model
    log = None if args.quiet else sys.stderr
    own = OwnServer(args.model_dir, model, args.server_arg) if args.model_dir is not None else None
    url = f"127.0.0.1:{own.http}" if own else args.url.split("://")[-1]
    load_url = url
    if own and args.protocol == "grpc":
        url = f"127.0.0.1:{own.grpc}"
    http = httpx.Client(base_url=f"http://{load_url}")
    candidates: list[Candidate] = []
    try:
        _load(http, model, None)
        base_answer = http.get(f"/v2/models/{model}/config")
        if base_answer.status_code != 200:
            raise PerfError(f"model config of '{model}': HTTP {base_answer.status_code} {base_answer.text[:300]}")
        base = config_from_dict(base_answer.json())
        api = ServerApi(args.protocol, url, [])
        info = model_info(api.metadata(model, ""), api.config(model, ""), model, "")
        dims = resolve_shapes(info, parse_shapes(args.shape))
        steps = input_steps(info, dims, args.input_data, 1)
        declared = {i.name: i.datatype for i in info.inputs}
        host, _, port = url.rpartition(":")
        if args.protocol == "http":
            requests = tuple(wire.http_request(url, model, "", s, declared, (), True, True, []) for s in steps)
        else:
            requests = tuple(wire.grpc_request(model, "", s, declared, (), True) for s in steps)
        setups = [Setup(args.protocol, host, int(port), requests)]
        plan = Plan(model, "", 1, args.measurement_interval / 1000, args.warmup_seconds, 10.0, args.max_trials, 99)

        def evaluate(candidate: Candidate) -> Candidate:
            if log is not None:
                print(f"trying {candidate.label}", file=log, flush=True)
            try:
                _load(http, model, candidate.apply(base))
                _measure(candidate, api, setups, plan, args, log)
            except PerfError as exc:
                candidate.error = str(exc)
                if log is not None:
                    print(f"  refused: {exc}", file=log, flush=True)
            candidates.append(candidate)
            return candidate

        instances = _ints(args.instances, "--instances")
        if base.max_batch_size > 0:
            sizes = _ints(args.max_batch_sizes, "--max-batch-sizes")
            stage1 = [evaluate(Candidate(n, b)) for n in instances for b in sizes if b > 0]
            best = max(stage1, key=lambda c: c.score(args.p99_ms))
            for delay in _ints(args.delays_us, "--delays-us"):
                if delay > 0:
                    evaluate(Candidate(best.instances, best.max_batch_size, delay))
            best = max(candidates, key=lambda c: c.score(args.p99_ms))
            for preferred in sorted({best.max_batch_size, max(1, best.max_batch_size // 2)}):
                evaluate(Candidate(best.instances, best.max_batch_size, best.delay_us, (preferred,)))
        else:
            for n in instances:
                evaluate(Candidate(n, 0))
        api.close()
    finally:
        if own is not None:
            own.stop()
        else:
            try:
                _load(http, model, None)  # the server's own configuration back
            except (PerfError, httpx.HTTPError) as exc:
                print(f"kubeinfer tune: could not reload '{model}' with its own configuration: {exc}", file=sys.stderr)
        http.close()
    winner = max(candidates, key=lambda c: c.score(args.p99_ms))
    found = winner.best(args.p99_ms) is not None
    print(table(candidates, args.p99_ms, winner if found else None))
    document = {
        "model": model,
        "p99_budget_ms": args.p99_ms,
        "protocol": args.protocol,
        "best": winner.as_dict(args.p99_ms) if found else None,
        "tried": [c.as_dict(args.p99_ms) for c in candidates],
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    if args.plot:
        plot(args.plot, candidates, args.p99_ms, winner if found else None, model)
    if not found:
        print(f"kubeinfer tune: no configuration kept p99 within {args.p99_ms} ms; nothing written", file=sys.stderr)
        return 1
    print()
    print(inference_model_fields(winner, base))
    if args.write:
        path = args.model_dir / "config.pbtxt"
        text = config_to_text(winner.apply(load_config_file(path)))
        with confined.opened(confined.open_root(args.model_dir)) as folder:
            publish.replace_file(folder, "config.pbtxt", text)
        print(f"\nwrote {path}")
    return 0


def table(candidates: list[Candidate], budget_ms: float, winner: Candidate | None) -> str:
    rows = [
        ["", "count", "max_batch", "delay us", "preferred", "best c", "infer/s", "p99 ms", "avg batch", "in budget"]
    ]
    for c in candidates:
        best = c.best(budget_ms)
        server = (best or {}).get("server") or {}
        rows.append(
            [
                "*" if c is winner else "",
                str(c.instances),
                str(c.max_batch_size),
                str(c.delay_us),
                ",".join(map(str, c.preferred)) or "-",
                str(best["concurrency"]) if best else "-",
                f"{best['throughput']:.1f}" if best else "-",
                f"{best['p99_ms']:.2f}" if best else "-",
                str(server.get("avg_batch") or "-"),
                "yes" if best else ("error" if c.error else "no"),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows)


def inference_model_fields(winner: Candidate, base: pb.ModelConfig) -> str:
    lines = ["InferenceModel spec fields to set:", "spec:"]
    if base.max_batch_size > 0:
        lines.append(f"  maxBatchSize: {winner.max_batch_size}")
        lines.append("  dynamicBatching:")
        lines.append(f"    maxQueueDelayMicroseconds: {winner.delay_us}")
        if winner.preferred:
            lines.append(f"    preferredBatchSize: [{', '.join(map(str, winner.preferred))}]")
    kind = pb.ModelInstanceGroup.Kind.Name(base.instance_group[0].kind) if base.instance_group else "KIND_AUTO"
    lines.append("  instanceGroup:")
    lines.append(f"    - count: {winner.instances}")
    lines.append(f"      kind: {kind}")
    return "\n".join(lines)


def plot(path: Path, candidates: list[Candidate], budget_ms: float, winner: Candidate | None, model: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'kubeinfer[perf]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for i, c in enumerate(candidates):
        points = [lv for lv in c.levels if lv["p99_ms"] is not None]
        if not points:
            continue
        style = "o-" if c is winner else ".--"
        ax.plot(
            [lv["throughput"] for lv in points],
            [lv["p99_ms"] for lv in points],
            style,
            color=f"C{i % 10}",
            label=c.label,
            linewidth=2 if c is winner else 1,
        )
    ax.axhline(budget_ms, color="red", linewidth=1, label=f"p99 budget {budget_ms:g} ms")
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(f"kubeinfer tune {model}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
