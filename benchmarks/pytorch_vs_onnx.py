"""PyTorch (TorchScript) beside ONNX Runtime: the same ResNet-18 CIFAR weights served side by side.

The TorchScript module carries exactly the weights of the ONNX example model (``resnet18_cifar(seed=0)``;
the largest output difference between the two is measured first and recorded). Then, on the same cores:

1. the in-process limit of each runtime, no server in the way: best rows/s over batch sizes, with one
   model using every core and with one model per core on its own thread (``instance_group { count: N }``);
   for TorchScript the second layout also shows whether forward releases the GIL (N threads ≈ N× one);
   the ``torch.export`` program of the same module is measured the same way;
2. both served by one ``kubeinfer-server`` (dynamic batching, same instance count) and driven over
   HTTP/gRPC at concurrency 1 and 16 (benchmarks/loadgen.py, its own process).

Results go to ``benchmarks/results/pytorch-<time>.json`` (git-ignored) and the ratios are printed.

    .venv/bin/python benchmarks/pytorch_vs_onnx.py [--seconds 5] [--instances 1] [--protocols http]

The machine is shared: compare numbers within one run. This is a measurement, never a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

# what the server's pytorch backend sets before it imports torch (see backends/pytorch/backend.py), so the
# in-process limit measures the runtime the way the server runs it
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import results_file  # noqa: E402
import serving  # noqa: E402
from inprocess import measure as measure_onnx  # noqa: E402
from loadgen import Tensor  # noqa: E402

from tests.support.server import start_server  # noqa: E402

INPUT = "INPUT__0:FP32:3x32x32"
serving.MODELS["resnet_torch"] = ([INPUT], ["OUTPUT__0"])
serving.MODELS["resnet_onnx"] = (["input:FP32:3x32x32"], ["output"])


def measure_torch(module: Any, batches: tuple[int, ...], seconds: float, cores: int) -> dict[str, Any]:
    """Rows/s of ``module`` per layout (models × intra-op threads) and batch size, as inprocess.measure."""
    import torch

    points = []
    previous = torch.get_num_threads()
    for models, threads in [(1, cores)] + ([(cores, 1), (1, 1)] if cores > 1 else []):
        torch.set_num_threads(threads)  # process-wide in PyTorch, as in the server
        for batch in batches:
            x = torch.from_numpy(np.random.default_rng(0).standard_normal((batch, 3, 32, 32)).astype(np.float32))
            with torch.inference_mode():
                for _ in range(2):
                    module(x)
            counts = [0] * models
            stop = time.perf_counter() + seconds

            def loop(i: int, x: Any = x, stop: float = stop, counts: list[int] = counts) -> None:
                with torch.inference_mode():
                    while time.perf_counter() < stop:
                        module(x)
                        counts[i] += 1

            start = time.perf_counter()
            workers = [threading.Thread(target=loop, args=(i,)) for i in range(models)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - start
            points.append(
                {
                    "sessions": models,
                    "threads_per_session": threads,
                    "batch": batch,
                    "throughput": round(sum(counts) * batch / elapsed, 1),
                }
            )
    torch.set_num_threads(previous)
    best = max(points, key=lambda p: p["throughput"])
    return {"points": points, "best": best, "limit": best["throughput"]}


def gil_free_share(forward: Any, seconds: float) -> float:
    """How much a pure-Python thread gets done while ``forward`` runs in a loop, relative to while it sleeps.

    A forward that holds the GIL starves the counting thread (share ≈ 0); one that releases it leaves the
    counter its pace (share ≈ 1, less whatever the cores it shares cost it).
    """

    def count_while(work: Any) -> int:
        stop = threading.Event()
        counter = [0]

        def spin() -> None:
            n = 0
            while not stop.is_set():
                n += 1
            counter[0] = n

        t = threading.Thread(target=spin)
        t.start()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            work()
        stop.set()
        t.join()
        return counter[0]

    forward()
    idle = count_while(lambda: time.sleep(0.01))
    busy = count_while(forward)
    return round(busy / idle, 3) if idle else 0.0


def parallel_gain(points: list[dict[str, Any]], cores: int) -> dict[int, float]:
    """Per batch: rows/s of ``cores`` threads × 1 intra-op thread over 1 thread × 1: ≈ cores if the GIL is free."""
    by = {(p["sessions"], p["threads_per_session"], p["batch"]): p["throughput"] for p in points}
    return {
        b: round(by[(cores, 1, b)] / by[(1, 1, b)], 2)
        for (_, _, b) in by
        if (cores, 1, b) in by and (1, 1, b) in by and by[(1, 1, b)] > 0
    }


def write_repository(
    root: Path, scripted: Any, onnx_bytes: bytes, instances: int, max_batch: int, torch_threads: int = 0
) -> Path:
    import torch

    repo = root / "repo"
    (repo / "resnet_torch" / "1").mkdir(parents=True)
    torch.jit.save(scripted, str(repo / "resnet_torch" / "1" / "model.pt"))
    (repo / "resnet_onnx" / "1").mkdir(parents=True)
    (repo / "resnet_onnx" / "1" / "model.onnx").write_bytes(onnx_bytes)
    for name, platform_name, inp, out in (
        ("resnet_torch", "pytorch_libtorch", "INPUT__0", "OUTPUT__0"),
        ("resnet_onnx", "onnxruntime_onnx", "input", "output"),
    ):
        (repo / name / "config.pbtxt").write_text(
            textwrap.dedent(f"""\
            name: "{name}"
            platform: "{platform_name}"
            max_batch_size: {max_batch}
            input [ {{ name: "{inp}" data_type: TYPE_FP32 dims: [ 3, 32, 32 ] }} ]
            output [ {{ name: "{out}" data_type: TYPE_FP32 dims: [ 10 ] }} ]
            dynamic_batching {{ }}
            instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
            """)
            + (
                f'parameters {{ key: "INTRA_OP_THREAD_COUNT" value {{ string_value: "{torch_threads}" }} }}\n'
                if torch_threads and name == "resnet_torch"
                else ""
            )
        )
    return repo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per served point")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--limit-seconds", type=float, default=2.0, help="seconds per in-process point")
    p.add_argument("--batches", default="1,16,64", help="batch sizes for the in-process limit")
    p.add_argument("--protocols", default="http")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--torch-threads", type=int, default=0, help="INTRA_OP_THREAD_COUNT (0: the backend's default)")
    p.add_argument("--no-limit", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)

    import torch
    from kubeinfer.server.examples import models

    from tests.support import torch_models as tm

    cores = os.cpu_count() or 1
    batches = tuple(int(b) for b in args.batches.split(","))
    report: dict[str, Any] = {
        **results_file.header(),
        "torch": torch.__version__,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "limit": {},
        "served": [],
    }
    net = tm.resnet18_cifar(seed=0)
    scripted = torch.jit.script(net)
    onnx_model = models.resnet18_cifar(seed=0)
    with tempfile.TemporaryDirectory(prefix="kubeinfer-bench-torch-") as tmp:
        root = Path(tmp)
        (root / "resnet.onnx").write_bytes(onnx_model.SerializeToString())
        import onnxruntime as ort

        x = np.random.default_rng(1).standard_normal((8, 3, 32, 32)).astype(np.float32)
        ours = ort.InferenceSession(str(root / "resnet.onnx"), providers=["CPUExecutionProvider"]).run(
            None, {"input": x}
        )[0]
        with torch.inference_mode():
            theirs = scripted(torch.from_numpy(x)).numpy()
        report["max_abs_difference_torchscript_vs_onnx"] = float(np.abs(ours - theirs).max())
        print(f"same weights: max |TorchScript - ONNX| = {report['max_abs_difference_torchscript_vs_onnx']:.2e}")
        if not args.no_limit:
            onnx_limit = measure_onnx(
                str(root / "resnet.onnx"),
                [Tensor.parse("input:FP32:3x32x32")],
                batches,
                args.limit_seconds,
                layouts=[(1, cores, False)] + ([(cores, 1, False)] if cores > 1 else []),
            )
            report["limit"]["onnxruntime"] = onnx_limit
            torch_limit = measure_torch(scripted, batches, args.limit_seconds, cores)
            torch_limit["parallel_gain"] = parallel_gain(torch_limit["points"], cores)
            report["limit"]["torchscript"] = torch_limit
            program = torch.export.export(
                net, (torch.zeros(2, 3, 32, 32),), dynamic_shapes=({0: torch.export.Dim("batch", max=256)},)
            )
            export_limit = measure_torch(program.module(), batches, args.limit_seconds, cores)
            export_limit["parallel_gain"] = parallel_gain(export_limit["points"], cores)
            report["limit"]["torch_export"] = export_limit
            x16 = torch.from_numpy(np.random.default_rng(2).standard_normal((16, 3, 32, 32)).astype(np.float32))
            onnx_session = ort.InferenceSession(str(root / "resnet.onnx"), providers=["CPUExecutionProvider"])
            exported = program.module()
            with torch.inference_mode():
                report["gil_free_share"] = {
                    "torchscript": gil_free_share(lambda: scripted(x16), args.limit_seconds),
                    "torch_export": gil_free_share(lambda: exported(x16), args.limit_seconds),
                    "onnxruntime": gil_free_share(
                        lambda: onnx_session.run(None, {"input": x16.numpy()}), args.limit_seconds
                    ),
                }
            print(f"GIL-free share of a counting thread during forward (1 = GIL released): {report['gil_free_share']}")
            for name, lim in report["limit"].items():
                best = lim["best"]
                print(
                    f"in-process limit {name:12} {lim['limit']:8.1f}/s (batch {best['batch']}, "
                    f"{best['sessions']} x {best['threads_per_session']} thread(s))"
                    + (f"  {cores} threads / 1 thread: {lim['parallel_gain']}" if "parallel_gain" in lim else ""),
                    flush=True,
                )
        repo = write_repository(
            root, scripted, onnx_model.SerializeToString(), args.instances, args.max_batch, args.torch_threads
        )
        server = start_server(repo, log_dir=root)
        try:
            for model in ("resnet_torch", "resnet_onnx"):
                for protocol in args.protocols.split(","):
                    for c in (int(c) for c in args.concurrency.split(",")):
                        r = serving.drive(server, protocol, model, model, c, args.seconds, args.warmup)
                        r["model"] = model
                        report["served"].append(r)
                        print(
                            f"{model:13} {protocol:4} c={c:<3} {r['throughput']:8.1f}/s  p50 {r['p50_ms']}ms "
                            f"p99 {r['p99_ms']}ms  avg batch {r['avg_batch']}  errors {r['errors']}",
                            flush=True,
                        )
        finally:
            server.terminate()
    report["summary"] = summarize(report)
    for line in report["summary"]:
        print(line)
    out = results_file.write(report, "pytorch", args.output)
    print(f"wrote {out}")
    return 0


def summarize(report: dict[str, Any]) -> list[str]:
    lines = []
    limits = report["limit"]
    if "torchscript" in limits and "onnxruntime" in limits:
        ratio = limits["torchscript"]["limit"] / limits["onnxruntime"]["limit"]
        lines.append(f"in-process limit TorchScript/ONNX Runtime: {ratio:.2f}")
    served: dict[tuple[str, str, int], float] = {
        (r["model"], r["protocol"], r["concurrency"]): r["throughput"] for r in report["served"]
    }
    for (model, protocol, c), value in sorted(served.items()):
        if model != "resnet_torch" or ("resnet_onnx", protocol, c) not in served:
            continue
        onnx = served[("resnet_onnx", protocol, c)]
        lines.append(
            f"served {protocol} c={c}: TorchScript {value:.0f}/s vs ONNX Runtime {onnx:.0f}/s ({value / onnx:.2f})"
        )
        key = "torchscript"
        if key in limits and limits[key]["limit"]:
            lines.append(f"  TorchScript served/limit c={c}: {value / limits[key]['limit']:.0%}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
