"""Runs the server exactly as KServe's Triton ServingRuntime does, inside private namespaces.

KServe's ``kserve-tritonserver`` ClusterServingRuntime (kserve/kserve config/runtimes/kserve-tritonserver.yaml)
starts the container with ``args`` and the image's own entry point. The ports (8080, 9000, 8002) and the
path (/mnt/models) are fixed there, so this script runs in a new network and mount namespace
(``unshare -rnm``): the loopback interface is its own, /mnt/models is a bind mount of the test's
repository, and nothing on the machine can collide with it. It prints one JSON line with what the
clients saw and exits.

Usage (from a test): unshare -rnm python -m tests.support.kserve_runtime <repository> <model>
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import processes

#: spec.containers[0].args of KServe's kserve-tritonserver ClusterServingRuntime, verbatim
KSERVE_TRITON_ARGS = [
    "tritonserver",
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]


def _prepare_namespace(repository: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", "/mnt"], check=True)
    os.makedirs("/mnt/models")
    subprocess.run(["mount", "--bind", str(repository), "/mnt/models"], check=True)


def main() -> int:
    repository, model = Path(sys.argv[1]), sys.argv[2]
    _prepare_namespace(repository)
    import httpx
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    # the image's ENTRYPOINT is kubeinfer-server; the runtime's args follow it unchanged
    entrypoint = str(Path(sys.executable).parent / "kubeinfer-server")
    log_path = Path(tempfile.mkstemp(prefix="kserve-runtime-", suffix=".log")[1])
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([entrypoint, *KSERVE_TRITON_ARGS], stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, object] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {log_path.read_text()}")
            try:
                if httpx.get("http://127.0.0.1:8080/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise TimeoutError(log_path.read_text())
        a = np.arange(4, dtype=np.float32).reshape(1, 4)
        b = np.ones((1, 4), dtype=np.float32)
        http = httpclient.InferenceServerClient("127.0.0.1:8080")
        inputs = [httpclient.InferInput("A", [1, 4], "FP32"), httpclient.InferInput("B", [1, 4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result["http"] = http.infer(model, inputs).as_numpy("OUT").tolist()
        result["http_ready"] = http.is_server_ready()
        grpc = grpcclient.InferenceServerClient("127.0.0.1:9000")
        ginputs = [grpcclient.InferInput("A", [1, 4], "FP32"), grpcclient.InferInput("B", [1, 4], "FP32")]
        ginputs[0].set_data_from_numpy(a)
        ginputs[1].set_data_from_numpy(b)
        result["grpc"] = grpc.infer(model, ginputs).as_numpy("OUT").tolist()
        result["grpc_model_ready"] = grpc.is_model_ready(model)
        metrics = httpx.get("http://127.0.0.1:8002/metrics", timeout=5).text
        result["metrics_success_line"] = next(
            (line for line in metrics.splitlines() if line.startswith("nv_inference_request_success{")), ""
        )
    except Exception as exc:  # reported to the test as data
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        code = processes.stop(proc, 60)
        result["exit_code"] = "killed" if code is processes.KILLED else code
        result["log"] = log_path.read_text(errors="replace")[-4000:]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
