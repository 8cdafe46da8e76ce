"""GPU suite: every test here is marked ``gpu`` and needs an NVIDIA GPU.

Without one (or without tensorrt / onnxruntime-gpu) the tests skip with the reason. ``run.sh`` sets
KUBEINFER_GPU_STRICT=1, which turns those skips into failures: on a GPU machine a missing package
must not pass as a green run.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
from kubeinfer.server.runtime import devices

STRICT = os.environ.get("KUBEINFER_GPU_STRICT") == "1"


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if STRICT:
        pytest.fail(f"GPU suite (strict): {reason}")
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session", autouse=True)
def _needs_gpu() -> None:
    require(
        devices.gpu_count() > 0,
        "no NVIDIA GPU visible (nvidia-smi / CUDA_VISIBLE_DEVICES); run tests/gpu/run.sh on a GPU machine",
    )


@pytest.fixture(scope="session")
def tensorrt_available() -> None:
    require(importlib.util.find_spec("tensorrt") is not None, "tensorrt is not installed: pip install kubeinfer[gpu]")


def ort_providers() -> list[str]:
    import onnxruntime as ort

    return ort.get_available_providers()
