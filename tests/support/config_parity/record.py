"""Record what real Triton answers for ``models/`` into ``triton-2.51.json`` (not run by the tests).

Needs NVIDIA's ``tritonserver`` 2.51 from the nvidia-pytriton 0.7.0 wheel (python backend only, runs on
CPU; /work/shared/pitfalls.md): ``pip install nvidia-pytriton==0.7.0`` into a scratch virtualenv, then

    .venv/bin/python -m tests.support.config_parity.record --site-packages <scratch venv>/lib/python3.11/site-packages

The ONNX, PyTorch and TensorRT models are served there by Python-based stand-in backends named
``onnxruntime``/``pytorch``/``tensorrt`` (a backend folder holding ``model.py``): Triton's normalisation
depends on the backend's name, not on its library, so their platform, file name and instance defaults
are the real ones; only ``runtime`` reads ``"model.py"`` (Triton's mark of a Python-based backend; C++
backends leave it empty). Their version folders hold empty placeholder files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import tritonclient.grpc as grpcclient
from google.protobuf import json_format

from tests.support import processes
from tests.support.config_parity import RECORD, RECORDER, names, write_repository
from tests.support.server import free_port

STAND_INS = ("onnxruntime", "pytorch", "tensorrt")


def backends(site: Path, target: Path) -> Path:
    server = site / "pytriton" / "tritonserver"
    python = target / "python"
    python.mkdir(parents=True)
    for f in (server / "backends" / "python").glob("*"):
        if f.is_file():
            shutil.copy(f, python)
    stub = server / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    shutil.copy(stub / "triton_python_backend_stub", python)
    for name in STAND_INS:
        (target / name).mkdir()
        shutil.copy(RECORDER, target / name / "model.py")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site-packages", type=Path, required=True, help="where nvidia-pytriton is installed")
    args = parser.parse_args()
    site: Path = args.site_packages
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        repo = write_repository(root / "repo", names(), lambda _model, _file: b"")
        out = root / "out"
        out.mkdir()
        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
            # the stub imports numpy through the first python3 on PATH
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "CONFIG_PARITY_OUT": str(out),
        }
        command = [
            str(site / "pytriton" / "tritonserver" / "bin" / "tritonserver"),
            f"--model-repository={repo}",
            f"--backend-directory={backends(site, root / 'backends')}",
            f"--cache-directory={site / 'pytriton' / 'tritonserver' / 'caches'}",
            "--cache-config=local,size=1048576",
            "--allow-gpu-metrics=false",
            "--exit-on-error=false",
            f"--http-port={http_port}",
            f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
        ]
        log = (root / "triton.log").open("wb")
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            record = capture(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", out, proc)
        finally:
            processes.stop(proc, 60)
    RECORD.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {RECORD} ({len(record['models'])} models)")


def capture(base: str, grpc_url: str, out: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"tritonserver exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/v2/health/live", timeout=2).status_code == 200:
                index = httpx.post(f"{base}/v2/repository/index", json={}, timeout=10).json()
                if len(index) == len(names()) and all(row.get("state") != "LOADING" for row in index):
                    break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("tritonserver did not load the models in 300 s")
        time.sleep(1)
    grpc = grpcclient.InferenceServerClient(grpc_url)
    args_by_model: dict[str, dict[str, Any]] = {}
    for f in sorted(out.glob("*.json")):
        seen = json.loads(f.read_text(encoding="utf-8"))
        seen.pop("model_repository")  # a temporary path
        args_by_model.setdefault(seen["model_name"], {})[seen["model_instance_name"]] = seen
    models: dict[str, Any] = {}
    for row in index:
        name = row["name"]
        entry: dict[str, Any] = {"state": row["state"], "reason": row.get("reason", "")}
        if row["state"] == "READY":
            entry["http"] = httpx.get(f"{base}/v2/models/{name}/config", timeout=10).text
            config = grpc.get_model_config(name).config
            entry["grpc"] = json_format.MessageToDict(config, preserving_proto_field_name=True)
            entry["initialize"] = args_by_model.get(name, {})
        models[name] = entry
    server = httpx.get(f"{base}/v2", timeout=10).json()
    return {"server": {"name": server["name"], "version": server["version"]}, "models": models}


if __name__ == "__main__":
    main()
