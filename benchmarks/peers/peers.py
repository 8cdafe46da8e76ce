"""The peers: their virtual environments, model repositories and processes.

- kubeinfer: this checkout's ``kubeinfer-server`` (the running interpreter's environment).
- Triton 2.51: the real ``tritonserver`` binary inside the ``nvidia-pytriton`` wheel (python backend
  only, so the model is a ``model.py`` running the same ONNX file with onnxruntime; launched as
  ``/work/shared/pitfalls.md`` says: the wheel's libraries on LD_LIBRARY_PATH, a backend folder holding
  the python backend and its 3.x stub, the virtualenv's bin first on PATH for the stub's numpy/onnxruntime).
- MLServer 1.7.1: a small onnxruntime runtime (``OnnxModel`` below), adaptive batching, inference in the
  server process (``parallel_workers: 0``); its REST API has no binary tensors, so it gets JSON over HTTP.

Every server gets the same ONNX files, the same batching (up to 64 rows, no queue delay) and the same
onnxruntime settings (intra-op threads = cores, spinning off: kubeinfer's defaults). The virtual
environments live in ``~/.cache/kubeinfer/peers`` (outside the repository; ``KUBEINFER_PEERS_DIR``
moves them) and are built once: a marker holds the requirements they were built from.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CACHE = Path(os.environ.get("KUBEINFER_PEERS_DIR", Path.home() / ".cache" / "kubeinfer" / "peers"))
REQUIREMENTS = {
    "triton": ["nvidia-pytriton==0.7.0", "onnxruntime", "numpy"],
    # uvloop 0.22+ breaks MLServer's worker processes (pitfalls.md)
    "mlserver": ["mlserver==1.7.1", "onnxruntime", "uvloop<0.22"],
}

#: name → (inputs [(name, datatype, dims)], outputs [(name, datatype, dims)])
MODELS = {
    "add_sub": (
        [("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])],
        [("OUTPUT0", "FP32", [16]), ("OUTPUT1", "FP32", [16])],
    ),
    "resnet18": ([("input", "FP32", [3, 32, 32])], [("output", "FP32", [10])]),
}
MAX_BATCH = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- virtual environments --------------------------------------------------------------------------
def venv(name: str) -> Path:
    """The peer's virtualenv, built (or rebuilt when its requirements changed) with uv when it is at hand."""
    root = CACHE / name
    marker = root / ".kubeinfer-requirements"
    wanted = "\n".join(REQUIREMENTS[name])
    if marker.exists() and marker.read_text() == wanted and (root / "bin" / "python").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    print(f"setting up {name} in {root} ...", flush=True)
    if uv:
        env = {**os.environ, "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(CACHE.parent / "uv"))}
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(root)], check=True, env=env)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", str(root / "bin" / "python"), *REQUIREMENTS[name]],
            check=True,
            env=env,
        )
    else:
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        subprocess.run([str(root / "bin" / "pip"), "install", "-q", *REQUIREMENTS[name]], check=True)
    marker.write_text(wanted)
    return root


def _site_packages(root: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return root / "lib" / version / "site-packages"


def triton_backends(root: Path) -> Path:
    """A --backend-directory holding the wheel's python backend and the stub for this Python."""
    target = root / "kubeinfer-backends"
    python = target / "python"
    if (python / "triton_python_backend_stub").exists():
        return target
    wheel = _site_packages(root) / "pytriton" / "tritonserver"
    python.mkdir(parents=True, exist_ok=True)
    for item in (wheel / "backends" / "python").iterdir():
        (python / item.name).unlink(missing_ok=True)
        (python / item.name).symlink_to(item)
    stub = (
        wheel
        / "python_backend_stubs"
        / f"{sys.version_info.major}.{sys.version_info.minor}"
        / "triton_python_backend_stub"
    )
    (python / stub.name).unlink(missing_ok=True)
    (python / stub.name).symlink_to(stub)
    return target


# ---- model repositories ----------------------------------------------------------------------------
def _dims(dims: list[int]) -> str:
    return ", ".join(map(str, dims))


def _tensors(kind: str, items: list[tuple[str, str, list[int]]]) -> str:
    body = ",\n".join(f'  {{ name: "{n}" data_type: TYPE_{t} dims: [ {_dims(d)} ] }}' for n, t, d in items)
    return f"{kind} [\n{body}\n]\n"


def config_pbtxt(name: str, backend_line: str, parameters: str = "") -> str:
    inputs, outputs = MODELS[name]
    return (
        f'name: "{name}"\n{backend_line}\nmax_batch_size: {MAX_BATCH}\n'
        + _tensors("input", inputs)
        + _tensors("output", outputs)
        + "dynamic_batching { }\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + parameters
    )


TRITON_MODEL_PY = '''\
"""The ONNX file run by onnxruntime inside Triton's python backend (kubeinfer's ORT settings)."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        parts = {n: [pb_utils.get_input_tensor_by_name(r, n).as_numpy() for r in requests] for n in self.inputs}
        rows = [a.shape[0] for a in parts[self.inputs[0]]]
        feed = {n: (np.concatenate(a) if len(a) > 1 else a[0]) for n, a in parts.items()}
        results = self.session.run(self.outputs, feed)
        responses, offset = [], 0
        for count in rows:
            tensors = [pb_utils.Tensor(n, r[offset : offset + count]) for n, r in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            offset += count
        return responses
'''

MLSERVER_RUNTIME = '''\
"""The ONNX file run by onnxruntime as an MLServer runtime (kubeinfer's ORT settings)."""
import os

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    async def load(self) -> bool:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = os.cpu_count() or 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        path = await get_model_uri(self._settings)
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feed = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        results = self.session.run(self.output_names, feed)
        outputs = [NumpyCodec.encode_output(n, r) for n, r in zip(self.output_names, results)]
        return InferenceResponse(model_name=self.name, outputs=outputs)
'''


def write_repositories(root: Path, onnx_files: dict[str, Path]) -> dict[str, Path]:
    repos = {"kubeinfer": root / "kubeinfer", "triton": root / "triton", "mlserver": root / "mlserver"}
    for name, onnx_file in onnx_files.items():
        k = repos["kubeinfer"] / name
        (k / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(onnx_file, k / "1" / "model.onnx")
        (k / "config.pbtxt").write_text(config_pbtxt(name, 'platform: "onnxruntime_onnx"'))
        t = repos["triton"] / name
        (t / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(onnx_file, t / "1" / "model.onnx")
        (t / "1" / "model.py").write_text(TRITON_MODEL_PY)
        (t / "config.pbtxt").write_text(config_pbtxt(name, 'backend: "python"'))
        m = repos["mlserver"] / name
        m.mkdir(parents=True, exist_ok=True)
        shutil.copy(onnx_file, m / "model.onnx")
        (m / "onnx_runtime.py").write_text(MLSERVER_RUNTIME)
        inputs, outputs = MODELS[name]
        settings = {
            "name": name,
            "implementation": "onnx_runtime.OnnxModel",
            "parameters": {"uri": "./model.onnx"},
            "max_batch_size": MAX_BATCH,
            "max_batch_time": 0.0005,
            "inputs": [{"name": n, "datatype": t, "shape": [-1, *d]} for n, t, d in inputs],
            "outputs": [{"name": n, "datatype": t, "shape": [-1, *d]} for n, t, d in outputs],
        }
        (m / "model-settings.json").write_text(json.dumps(settings, indent=1))
    return repos


# ---- processes -------------------------------------------------------------------------------------
@dataclass
class Peer:
    name: str
    http_port: int
    grpc_port: int
    proc: subprocess.Popen[bytes]
    log: Path
    #: the servers' HTTP APIs differ: MLServer has no binary tensors
    http_binary: bool = True
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ready(self, models: list[str]) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
        try:
            return all(
                httpx.get(f"http://127.0.0.1:{self.http_port}/v2/models/{m}/ready", timeout=2).status_code == 200
                for m in models
            )
        except httpx.HTTPError:
            return False

    def wait(self, models: list[str], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready(models):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _spawn(
    name: str, command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )


def start_kubeinfer(repo: Path, logs: Path) -> Peer:
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = str(Path(sysconfig.get_path("scripts")) / "kubeinfer-server")
    log = logs / "kubeinfer.log"
    command = [server, "--model-repository", str(repo), "--host", "127.0.0.1", "--http-port", str(http)]
    command += ["--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    return Peer("kubeinfer", http, grpc, _spawn("kubeinfer", command, log), log)


def start_triton(repo: Path, logs: Path) -> Peer:
    root = venv("triton")
    site = _site_packages(root)
    http, grpc, metrics = free_port(), free_port(), free_port()
    binary = site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    command = [
        str(binary),
        f"--model-repository={repo}",
        f"--backend-directory={triton_backends(root)}",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--log-verbose=0",
    ]
    env = {
        "LD_LIBRARY_PATH": f"{site / 'nvidia_pytriton.libs'}:{os.environ.get('LD_LIBRARY_PATH', '')}",
        "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
    }
    log = logs / "triton.log"
    return Peer("triton", http, grpc, _spawn("triton", command, log, env), log)


def start_mlserver(repo: Path, logs: Path) -> Peer:
    root = venv("mlserver")
    http, grpc, metrics = free_port(), free_port(), free_port()
    settings = {
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "host": "127.0.0.1",
        "parallel_workers": 0,
        "debug": False,
    }
    (repo / "settings.json").write_text(json.dumps(settings))
    log = logs / "mlserver.log"
    command = [str(root / "bin" / "mlserver"), "start", str(repo)]
    env = {"PATH": f"{root / 'bin'}:{os.environ['PATH']}"}
    return Peer("mlserver", http, grpc, _spawn("mlserver", command, log, env, cwd=repo), log, http_binary=False)


def describe() -> str:
    return textwrap.dedent(__doc__ or "").strip()
