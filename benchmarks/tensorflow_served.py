"""TensorFlow served beside TensorFlow in-process, on the same cores: what the server costs a SavedModel.

A small Keras CNN for 32x32x3 images (fixed seed) is exported as a SavedModel, and converted to ONNX with
``kubeinfer convert`` (tf2onnx; the largest output difference is recorded). Then:

1. the in-process limit of TensorFlow, no server in the way, run exactly as the server runs it (the tensorflow
   backend's session and instance code): best rows/s over batch sizes, with one session using every core and
   with one single-threaded session per core on its own thread (N threads ≈ N× one when Session.run releases
   the GIL); plus how much a pure-Python thread gets done while the session runs (1 = GIL released);
2. the SavedModel and its ONNX conversion served by one ``kubeinfer-server`` (dynamic batching, max batch 64,
   ``--instances`` each) and driven over HTTP/gRPC at concurrency 1 and 16 (benchmarks/loadgen.py, its own
   process).

Results go to ``benchmarks/results/tensorflow-<time>.json`` and the ratios are printed.

    .venv/bin/python benchmarks/tensorflow_served.py [--seconds 5] [--instances 2] [--protocols http,grpc]

The machine is shared: compare numbers within one run. This is a measurement, never a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import results_file  # noqa: E402
import serving  # noqa: E402
from pytorch_vs_onnx import gil_free_share  # noqa: E402

from tests.support.server import start_server  # noqa: E402

INPUT = "image:FP32:32x32x3"
serving.MODELS["cnn_tf"] = ([INPUT], ["output_0"])
serving.MODELS["cnn_onnx"] = ([INPUT], ["output_0"])


def save_cnn(path: Path, seed: int = 0) -> None:
    """Three conv blocks and a dense head (about 0.1 GFLOP per image), exported for serving."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    image = tf.keras.Input(shape=(32, 32, 3), name="image")
    x = image
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.GlobalAveragePooling2D()(x)
    logits = layers.Dense(10)(x)
    tf.keras.Model(image, logits).export(str(path), verbose=False)


def tf_session(saved: Path, intra: int, inter: int, per_session: bool) -> Any:
    """An instance of the server's tensorflow backend on ``saved`` (its session and run path), outside a server."""
    from kubeinfer.server.backends.tensorflow import TensorFlowBackend
    from kubeinfer.server.backends.tensorflow.backend import TensorFlowInstance, _Session, _Sessions, read_signature
    from kubeinfer.server.backends.tensorflow.parameters import parse_parameters
    from kubeinfer.server.config import pb

    config = pb.ModelConfig(name="cnn_tf", platform="tensorflow_savedmodel", default_model_filename=saved.name)
    for key, value in (
        ("TF_NUM_INTRA_THREADS", intra),
        ("TF_NUM_INTER_THREADS", inter),
        ("TF_USE_PER_SESSION_THREADS", int(per_session)),
    ):
        config.parameters[key].string_value = str(value)
    TensorFlowBackend.auto_complete_config(config, saved.parent)
    params = parse_parameters(config)
    sig = read_signature(config, saved.parent, params)
    session = _Sessions().take("", 1, lambda: _Session(config, sig, saved, saved, params, "/device:CPU:0"))
    return TensorFlowInstance(config, session)


def measure_tf(saved: Path, batches: tuple[int, ...], seconds: float, cores: int) -> dict[str, Any]:
    """Rows/s per layout (sessions × intra-op threads) and batch size, as benchmarks/inprocess.measure."""
    points = []
    layouts = [(1, 0, False)] + ([(cores, 1, True), (1, 1, True)] if cores > 1 else [])
    for sessions, threads, per_session in layouts:
        runners = [tf_session(saved, threads, 1 if per_session else 0, per_session) for _ in range(sessions)]
        for batch in batches:
            x = np.random.default_rng(0).standard_normal((batch, 32, 32, 3)).astype(np.float32)
            for r in runners:
                r.run({"image": x}, ["output_0"])
            counts = [0] * sessions
            stop = time.perf_counter() + seconds

            def loop(
                i: int, x: Any = x, stop: float = stop, counts: list[int] = counts, runners: list = runners
            ) -> None:
                while time.perf_counter() < stop:
                    runners[i].run({"image": x}, ["output_0"])
                    counts[i] += 1

            start = time.perf_counter()
            workers = [threading.Thread(target=loop, args=(i,)) for i in range(sessions)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - start
            points.append(
                {
                    "sessions": sessions,
                    "threads_per_session": threads or "default",
                    "batch": batch,
                    "throughput": round(sum(counts) * batch / elapsed, 1),
                }
            )
        for r in runners:
            r.close()
    best = max(points, key=lambda p: p["throughput"])
    by = {(p["sessions"], p["threads_per_session"], p["batch"]): p["throughput"] for p in points}
    gain = {
        b: round(by[(cores, 1, b)] / by[(1, 1, b)], 2)
        for (_, _, b) in by
        if (cores, 1, b) in by and (1, 1, b) in by and by[(1, 1, b)] > 0
    }
    return {"points": points, "best": best, "limit": best["throughput"], "parallel_gain": gain}


def write_repository(root: Path, saved: Path, onnx_dir: Path | None, instances: int, max_batch: int) -> Path:
    import shutil

    repo = root / "repo"
    (repo / "cnn_tf" / "1").mkdir(parents=True)
    shutil.copytree(saved, repo / "cnn_tf" / "1" / "model.savedmodel")
    common = (
        f"max_batch_size: {max_batch}\ndynamic_batching {{ }}\n"
        f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n"
    )
    (repo / "cnn_tf" / "config.pbtxt").write_text('platform: "tensorflow_savedmodel"\n' + common)
    if onnx_dir is not None:
        (repo / "cnn_onnx" / "1").mkdir(parents=True)
        shutil.copy(onnx_dir / "1" / "model.onnx", repo / "cnn_onnx" / "1" / "model.onnx")
        (repo / "cnn_onnx" / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n' + common)
    return repo


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per served point")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--limit-seconds", type=float, default=2.0, help="seconds per in-process point")
    p.add_argument("--batches", default="1,4,8,16,64", help="batch sizes for the in-process limit")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--instances", type=int, default=2, help="instances per served model (Triton's CPU default: 2)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--no-onnx", action="store_true", help="serve the SavedModel only")
    p.add_argument("--no-limit", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)

    import tensorflow as tf

    cores = os.cpu_count() or 1
    batches = tuple(int(b) for b in args.batches.split(","))
    report: dict[str, Any] = {
        **results_file.header(),
        "tensorflow": tf.__version__,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "limit": {},
        "served": [],
    }
    with tempfile.TemporaryDirectory(prefix="kubeinfer-bench-tf-") as tmp:
        root = Path(tmp)
        saved = root / "export" / "model.savedmodel"
        saved.parent.mkdir()
        save_cnn(saved)
        onnx_dir = None
        if not args.no_onnx:
            (root / "converted").mkdir()
            done = subprocess.run(
                [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", str(saved), "--repository",
                 str(root / "converted"), "--name", "cnn_onnx", "--max-batch", str(args.max_batch)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            report["convert"] = done.stdout.strip().splitlines()
            print("\n".join(report["convert"]), flush=True)
            onnx_dir = root / "converted" / "cnn_onnx"
        if not args.no_limit:
            report["limit"]["tensorflow"] = limit = measure_tf(saved, batches, args.limit_seconds, cores)
            x = np.random.default_rng(2).standard_normal((16, 32, 32, 3)).astype(np.float32)
            one = tf_session(saved, 0, 0, False)
            report["gil_free_share"] = gil_free_share(lambda: one.run({"image": x}, ["output_0"]), args.limit_seconds)
            one.close()
            best = limit["best"]
            print(
                f"in-process limit TensorFlow {limit['limit']:8.1f}/s (batch {best['batch']}, {best['sessions']} x "
                f"{best['threads_per_session']} thread(s)); {cores} sessions / 1 session, 1 thread each: "
                f"{limit['parallel_gain']}; GIL-free share {report['gil_free_share']}",
                flush=True,
            )
        repo = write_repository(root, saved, onnx_dir, args.instances, args.max_batch)
        server = start_server(repo, log_dir=root)
        try:
            for model in ("cnn_tf",) + (() if onnx_dir is None else ("cnn_onnx",)):
                for protocol in args.protocols.split(","):
                    for c in (int(c) for c in args.concurrency.split(",")):
                        r = serving.drive(server, protocol, model, model, c, args.seconds, args.warmup)
                        r["model"] = model
                        report["served"].append(r)
                        print(
                            f"{model:9} {protocol:4} c={c:<3} {r['throughput']:8.1f}/s  p50 {r['p50_ms']}ms "
                            f"p99 {r['p99_ms']}ms  avg batch {r['avg_batch']}  errors {r['errors']}",
                            flush=True,
                        )
        finally:
            server.terminate()
    report["summary"] = summarize(report)
    for line in report["summary"]:
        print(line)
    out = results_file.write(report, "tensorflow", args.output)
    print(f"wrote {out}")
    return 0


def summarize(report: dict[str, Any]) -> list[str]:
    """Each served TensorFlow point against the in-process rate at the batch the server formed (the nearest
    measured batch at or below its average), and against its ONNX conversion served the same way."""
    lines = []
    points = report["limit"].get("tensorflow", {}).get("points", [])
    by_batch: dict[int, float] = {}
    for p in points:
        by_batch[p["batch"]] = max(by_batch.get(p["batch"], 0.0), p["throughput"])
    served = {(r["model"], r["protocol"], r["concurrency"]): r for r in report["served"]}
    for (model, protocol, c), r in sorted(served.items()):
        if model != "cnn_tf":
            continue
        value = r["throughput"]
        line = f"served {protocol} c={c}: TensorFlow {value:.0f}/s (avg batch {r['avg_batch']})"
        batches = [b for b in by_batch if b <= (r["avg_batch"] or 1)] or sorted(by_batch)[:1]
        if batches:
            b = max(batches)
            line += f" = {value / by_batch[b]:.0%} of in-process at batch {b} ({by_batch[b]:.0f}/s)"
        onnx = served.get(("cnn_onnx", protocol, c))
        if onnx:
            line += (
                f"; its ONNX conversion on onnxruntime {onnx['throughput']:.0f}/s ({value / onnx['throughput']:.2f})"
            )
        lines.append(line)
    return lines


if __name__ == "__main__":
    sys.exit(main())
