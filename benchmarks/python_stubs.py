"""Python models in stub processes against the same models in the server's process and on real Triton.

    .venv/bin/python benchmarks/python_stubs.py                 # ~10 min on 2 cores; sets Triton up once
    .venv/bin/python benchmarks/python_stubs.py --rounds 1 --window-ms 1500     # a quick look

Three servers up at once, driven in turn by ``kubeinfer perf`` (closed loop, HTTP, binary tensors),
rotating who goes first, for ``--rounds`` rounds; a figure is the median over the rounds:

* ``stubs``: kubeinfer, Python models in their own stub processes (the default);
* ``in-process``: kubeinfer with ``KUBEINFER_IN_PROCESS`` on every Python model (the old default);
* ``triton``: Triton 2.51 (the nvidia-pytriton wheel's tritonserver, python backend only, so only the
  Python models: no ONNX model, no pipeline).

Points: ``tiny`` (an identity on 16 floats: what the hand-off costs when there is no work), ``cpu_bound``
(pure-Python work, ~3 ms a request, ``count: 2``, 8 clients: what two processes
gain over one GIL), the example repository's ``preprocessor`` on 480x640 images (0.9 MB a request,
numpy work: what the copies cost), and the example ``cifar10_pipeline`` end to end (preprocessor ->
ResNet-18 -> postprocessor) on 32x32 and 480x640 images. Server CPU per request counts the server's
whole process tree (stubs included). Also the example preprocessor alone in a fresh process, with glibc's
default malloc settings and with the stubs' (page faults and CPU per call).
Writes ``benchmarks/results/python-stubs-<time>.json``.
A measurement, never a test: nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "peers"))

import peers  # noqa: E402
import results_file  # noqa: E402

SERVERS = ("stubs", "in-process", "triton")

CPU_BOUND = '''\
"""Pure-Python work: the GIL is held throughout (no numpy, no I/O)."""
import numpy as np
import triton_python_backend_utils as pb_utils


def work(n):
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            out = np.array([work(n)], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
'''

CPU_BOUND_CONFIG = """\
name: "cpu_bound"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

TINY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""

TINY_CONFIG = """\
name: "tiny"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

IN_PROCESS = '\nparameters { key: "KUBEINFER_IN_PROCESS" value: { string_value: "true" } }\n'

#: (label, model, servers, perf arguments)
POINTS: list[tuple[str, str, tuple[str, ...], list[str]]] = [
    ("tiny c=8", "tiny", SERVERS, ["--concurrency-range", "8"]),
    ("cpu_bound c=8", "cpu_bound", SERVERS, ["--concurrency-range", "8"]),
    ("preprocessor 480x640 c=8", "preprocessor", SERVERS, ["--concurrency-range", "8", "--shape", "IMAGE:480,640,3"]),
    (
        "pipeline 32x32 c=8",
        "cifar10_pipeline",
        ("stubs", "in-process"),
        ["--concurrency-range", "8", "--shape", "IMAGE:32,32,3"],
    ),
    (
        "pipeline 480x640 c=8",
        "cifar10_pipeline",
        ("stubs", "in-process"),
        ["--concurrency-range", "8", "--shape", "IMAGE:480,640,3"],
    ),
]


def repositories(root: Path, work: int) -> dict[str, Path]:
    from kubeinfer.server.examples import generate, python_models

    stubs = generate.write_repository(root / "stubs")
    for name, config, source in (("cpu_bound", CPU_BOUND_CONFIG, CPU_BOUND), ("tiny", TINY_CONFIG, TINY)):
        (stubs / name / "1").mkdir(parents=True)
        (stubs / name / "config.pbtxt").write_text(config)
        (stubs / name / "1" / "model.py").write_text(source)
    inproc = root / "in-process"
    shutil.copytree(stubs, inproc)
    for config in inproc.glob("*/config.pbtxt"):
        if 'backend: "python"' in config.read_text():
            config.write_text(config.read_text() + IN_PROCESS)
    triton = root / "triton"
    for name in ("cpu_bound", "preprocessor", "tiny"):
        shutil.copytree(stubs / name, triton / name)
    (triton / "preprocessor" / "1" / "model.py").write_text(python_models.source("preprocessor"))
    (root / "work").write_text(str(work))
    return {"stubs": stubs, "in-process": inproc, "triton": triton}


MALLOC_PROBE = """
import resource, sys, time, types
import numpy as np
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
from kubeinfer.server.examples import python_models
namespace = {}
exec(python_models.source("preprocessor"), namespace)
image = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
namespace["preprocess"](image)
faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
for _ in range(200):
    namespace["preprocess"](image)
print(round((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 200, 1),
      round((time.process_time() - cpu) / 200 * 1000, 3))
"""


def malloc_probe() -> dict[str, dict[str, float]]:
    """The example preprocessor on a 480x640 image in a fresh process: page faults and CPU ms a call, with
    glibc's default malloc settings and with the ones stubs get (``envs.MALLOC_TUNABLES``)."""
    from kubeinfer.server.backends.python.server_side import envs

    out = {}
    for label, tunables in (("glibc defaults", None), ("stub settings", envs.MALLOC_TUNABLES)):
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        done = subprocess.run([sys.executable, "-c", MALLOC_PROBE], capture_output=True, text=True, env=env)
        faults, ms = (float(v) for v in done.stdout.split())
        out[label] = {"page_faults_per_call": faults, "cpu_ms_per_call": ms}
    return out


def perf(
    peer: peers.Peer, model: str, extra: list[str], args: argparse.Namespace, out: Path, work: int
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "kubeinfer.server.tools.cli", "perf", "-q", "-m", model, "-i", "http",
        "-u", f"127.0.0.1:{peer.http_port}", "-p", str(args.window_ms), "-r", str(args.windows),
        "--warmup-seconds", str(args.warmup), "--server-pid", str(peer.pid), "--json", str(out), *extra,
    ]  # fmt: skip
    if model == "cpu_bound":
        data = out.with_name("cpu_bound_data.json")
        data.write_text(json.dumps({"data": [{"N": [work]}]}))
        command += ["--input-data", str(data)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if not out.exists():
        return {"error": done.stderr[-2000:] or done.stdout[-2000:]}
    (level,) = json.loads(out.read_text())["levels"]
    out.unlink()
    return dict(level)


def _value(level: dict[str, Any], key: str) -> float | None:
    value = level.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for label, _, servers, _ in POINTS:
        row: dict[str, Any] = {"point": label}
        for server in servers:
            levels = [p["level"] for p in report["points"] if p["point"] == label and p["server"] == server]
            tput = [v for lv in levels if (v := _value(lv, "throughput")) is not None]
            cpu = [v for lv in levels if (v := _value(lv.get("server_cpu") or {}, "us_per_request")) is not None]
            row[server] = round(statistics.median(tput), 1) if tput else None
            row[f"{server} cpu_us"] = round(statistics.median(cpu)) if cpu else None
        if row.get("stubs") and row.get("in-process"):
            row["stubs/in-process"] = round(row["stubs"] / row["in-process"], 2)
        if row.get("stubs") and row.get("triton"):
            row["stubs/triton"] = round(row["stubs"] / row["triton"], 2)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| point | stubs /s | in-process /s | Triton 2.51 /s | stubs / in-process | stubs / Triton "
        "| CPU µs/request: stubs, in-process, Triton |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r.get("stubs"), r.get("in-process"), r.get("triton"), r.get("stubs/in-process"), r.get("stubs/triton")]
        cpu = ", ".join("-" if r.get(f"{s} cpu_us") is None else str(r[f"{s} cpu_us"]) for s in SERVERS)
        lines.append(f"| {r['point']} | " + " | ".join("-" if c is None else str(c) for c in cells) + f" | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-ms", type=int, default=3000)
    p.add_argument("--windows", type=int, default=3, help="windows per point (perf's --max-trials)")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--work", type=int, default=60000, help="cpu_bound: loop iterations per request")
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--from", dest="saved", type=Path, help="print the table of a saved results file, run nothing")
    args = p.parse_args(argv)
    if args.saved:
        print(table(summarize(json.loads(args.saved.read_text()))))
        return 0
    servers = args.servers.split(",")
    if "triton" in servers:
        peers.venv("triton")
    report: dict[str, Any] = {
        **results_file.header(),
        "settings": {k: str(v) for k, v in vars(args).items() if k != "output"},
        "cpu_bound_model": CPU_BOUND,
        "points": [],
    }
    started = time.time()
    report["malloc_probe"] = malloc_probe()
    print(f"preprocessor in a fresh process: {json.dumps(report['malloc_probe'])}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kubeinfer-stubs-bench-") as tmp:
        root = Path(tmp)
        repos = repositories(root, args.work)
        running: dict[str, peers.Peer] = {}
        try:
            for name in servers:
                start = peers.start_triton if name == "triton" else peers.start_kubeinfer
                running[name] = _start(start, repos[name], root, name)
            for name, peer in running.items():
                peer.wait(["cpu_bound", "preprocessor", "tiny"] + (["cifar10_pipeline"] if name != "triton" else []))
                print(f"{name} ready (pid {peer.pid}, http {peer.http_port})", flush=True)
            n = 0
            for rnd in range(args.rounds):
                for label, model, point_servers, extra in POINTS:
                    order = [s for s in servers if s in point_servers]
                    first = n % len(order)
                    n += 1
                    for name in order[first:] + order[:first]:
                        level = perf(running[name], model, extra, args, root / "point.json", args.work)
                        report["points"].append({"round": rnd, "point": label, "server": name, "level": level})
                        shown = level.get("throughput", level.get("error", "?"))
                        print(f"[{time.time() - started:.0f}s] round {rnd + 1} {label} {name}: {shown}", flush=True)
        finally:
            for peer in running.values():
                peer.stop()
    report["summary"] = summarize(report)
    print()
    print(table(report["summary"]))
    out = results_file.write(report, "python-stubs", args.output)
    print(f"wrote {out}")
    return 0


def _start(start: Any, repo: Path, root: Path, name: str) -> peers.Peer:
    logs = root / f"logs-{name}"
    logs.mkdir()
    return start(repo, logs)  # type: ignore[no-any-return]


if __name__ == "__main__":
    sys.exit(main())
