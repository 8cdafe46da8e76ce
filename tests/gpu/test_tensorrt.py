"""TensorRT on a GPU: ``kubeinfer convert`` FP16 and INT8 builds, then serving the plan with batching
on instances pinned to ``gpus: [0]``."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from kubeinfer.server.config import load_config_file
from kubeinfer.server.examples import models

from tests.support.server import ServerProcess, start_server

ERROR_LINE = re.compile(r"output '(\w+)': max abs error (\S+), max rel error (\S+)")


def _convert(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubeinfer.server.tools.cli", "convert", *argv],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tensorrt_available: None) -> Path:
    root = tmp_path_factory.mktemp("trt")
    onnx.save(models.resnet18_cifar(seed=0), str(root / "resnet.onnx"))
    (root / "repo").mkdir()
    rng = np.random.default_rng(0)
    np.save(root / "calib.npy", rng.standard_normal((64, 3, 32, 32)).astype(np.float32))
    return root


@pytest.fixture(scope="module")
def fp16_build(work: Path) -> subprocess.CompletedProcess[str]:
    return _convert(
        str(work / "resnet.onnx"),
        "--repository",
        str(work / "repo"),
        "--name",
        "resnet_fp16",
        "--fp16",
        "--min-batch",
        "1",
        "--opt-batch",
        "8",
        "--max-batch",
        "16",
        "--instance-count",
        "2",
        "--gpus",
        "0",
    )


def test_fp16_build_writes_plan_and_config_and_reports_accuracy(work: Path, fp16_build) -> None:  # type: ignore[no-untyped-def]
    assert fp16_build.returncode == 0, fp16_build.stderr
    model = work / "repo" / "resnet_fp16"
    assert (model / "1" / "model.plan").stat().st_size > 1_000_000
    config = load_config_file(model / "config.pbtxt")
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 16
    assert [list(g.gpus) for g in config.instance_group] == [[0]]
    errors = ERROR_LINE.findall(fp16_build.stdout)
    assert [e[0] for e in errors] == ["output"]
    assert float(errors[0][2]) < 0.05, fp16_build.stdout  # FP16 vs FP32 onnxruntime, relative to the logit range
    assert "speed-up" in fp16_build.stdout
    assert "building FP16 engine" in fp16_build.stderr  # progress is shown


def test_int8_build_calibrates_and_reuses_the_cache(work: Path) -> None:
    argv = [
        str(work / "resnet.onnx"),
        "--repository",
        str(work / "repo"),
        "--name",
        "resnet_int8",
        "--int8",
        "--fp16",
        "--calibration-data",
        str(work / "calib.npy"),
        "--opt-batch",
        "8",
        "--max-batch",
        "8",
    ]
    first = _convert(*argv)
    assert first.returncode == 0, first.stderr
    cache = work / "repo" / "resnet_int8" / "1" / "calibration.cache"
    assert cache.stat().st_size > 0
    assert "calibration batch" in first.stderr
    errors = ERROR_LINE.findall(first.stdout)
    assert errors and all(np.isfinite(float(e[1])) for e in errors)
    second = _convert(*argv, "--force", "--no-compare")
    assert second.returncode == 0, second.stderr
    assert "reusing calibration cache" in second.stderr
    assert cache.stat().st_size > 0


@pytest.fixture(scope="module")
def plan_server(work: Path, fp16_build) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    assert fp16_build.returncode == 0, fp16_build.stderr
    server = start_server(work / "repo", "--model-control-mode=explicit", "--load-model=resnet_fp16", log_dir=work)
    yield server
    server.terminate()


def test_plan_serves_batched_requests_matching_onnxruntime(work: Path, plan_server: ServerProcess) -> None:
    session = ort.InferenceSession(str(work / "resnet.onnx"), providers=["CPUExecutionProvider"])
    client = httpclient.InferenceServerClient(plan_server.http_url)
    config = client.get_model_config("resnet_fp16")
    assert config["instance_group"][0]["gpus"] == [0] and config["instance_group"][0]["count"] == 2
    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((b, 3, 32, 32)).astype(np.float32) for b in [1, 3, 8, 16] * 16]

    def call(x: np.ndarray) -> np.ndarray:
        c = httpclient.InferenceServerClient(plan_server.http_url, network_timeout=120)
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return c.infer("resnet_fp16", [inp]).as_numpy("output")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, samples))
    for x, got in zip(samples, results, strict=True):
        expected = session.run(None, {"input": x})[0]
        assert got.shape == expected.shape
        scale = float(np.abs(expected).max())
        assert float(np.abs(got - expected).max()) < 0.05 * scale
    stats = client.get_inference_statistics("resnet_fp16")["model_stats"][0]
    assert stats["inference_count"] == sum(len(x) for x in samples)
    assert stats["execution_count"] < len(samples)  # requests were batched together


def test_batch_outside_the_profile_is_refused(plan_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(plan_server.http_url)
    x = np.zeros((17, 3, 32, 32), dtype=np.float32)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(Exception, match="batch-size must be <= 16"):
        client.infer("resnet_fp16", [inp])
