"""The server's CPU while nothing changes: ``--model-control-mode poll`` over a repository of N models.

    .venv/bin/python benchmarks/server_poll_idle.py --models 1000                   # ~3 min
    .venv/bin/python benchmarks/server_poll_idle.py --models 1000 --baseline 667e7ae

Builds N copies of the example repository's ``add_sub`` (ONNX, two versions served) in a work folder,
starts ``kubeinfer-server`` in poll mode (``--poll-secs``, 5 by default, as the operator's pools run),
waits until every model's versions are READY, then reads the server process's CPU over ``--window``
seconds. With ``--baseline REF`` the server of that git revision is measured too, alternating round by
round with this checkout's. Prints each round and the medians; writes
``benchmarks/results/server-poll-idle-<N>-<time>.json``. A measurement, never a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

import operator_scale  # noqa: E402
import results_file  # noqa: E402
from operator_scale import cpu_seconds  # noqa: E402
from peers import free_port  # noqa: E402


def repository(root: Path, n: int) -> Path:
    from kubeinfer.server.examples import generate

    example = generate.write_repository(root / "example")
    repo = root / f"models-{n}"
    for i in range(n):
        name = f"m{i:05d}"
        shutil.copytree(example / "add_sub", repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return repo


def measure(repo: Path, n: int, pythonpath: str | None, args: argparse.Namespace) -> dict[str, Any]:
    http = free_port()
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    command = [
        sys.executable, "-m", "kubeinfer.server.cli", "--model-repository", str(repo),
        "--model-control-mode", "poll", "--repository-poll-secs", str(args.poll_secs),
        "--http-port", str(http), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
    ]  # fmt: skip
    started = time.monotonic()
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{http}"
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            try:
                rows = httpx.post(f"{url}/v2/repository/index", json={}, timeout=30).json()
                if len({r["name"] for r in rows if r.get("state") == "READY"}) >= n:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        ready = time.monotonic() - started
        time.sleep(args.poll_secs + 1)  # the first polls after the loads
        cpu0, wall0 = cpu_seconds(server.pid), time.monotonic()
        time.sleep(args.window)
        cpu1, wall1 = cpu_seconds(server.pid), time.monotonic()
        rss = int(Path(f"/proc/{server.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return {
            "all_ready_seconds": round(ready, 1),
            "idle_core_fraction": round((cpu1 - cpu0) / (wall1 - wall0), 4),
            "cpu_us_per_model_per_poll": round((cpu1 - cpu0) / (wall1 - wall0) * args.poll_secs / n * 1e6, 1),
            "rss_mb": round(rss / 2**20),
        }
    finally:
        server.terminate()
        server.wait(30)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=30.0, help="seconds of idle measured per round")
    p.add_argument("--poll-secs", type=float, default=5.0)
    p.add_argument("--baseline", metavar="REF", help="also measure the server of this git revision")
    args = p.parse_args()
    report: dict[str, Any] = {**results_file.header(), "settings": vars(args), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="kubeinfer-poll-idle-") as tmp:
        work = Path(tmp)
        repo = repository(work, args.models)
        variants: list[tuple[str, str | None]] = [("current", None)]
        if args.baseline:
            operator_scale.baseline_package(args.baseline, work / "baseline")
            variants.insert(0, (f"baseline {args.baseline}", str(work / "baseline")))
        for i in range(args.rounds):
            for label, pythonpath in variants:
                result = measure(repo, args.models, pythonpath, args)
                report["rounds"].append({"round": i, "server": label, **result})
                print(f"round {i + 1} {label}: {result}", flush=True)
    report["medians"] = {
        label: {
            key: statistics.median(r[key] for r in report["rounds"] if r["server"] == label)
            for key in ("all_ready_seconds", "idle_core_fraction", "cpu_us_per_model_per_poll", "rss_mb")
        }
        for label, _ in variants
    }
    print(report["medians"])
    print("wrote", results_file.write(report, f"server-poll-idle-{args.models}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
