"""NVML is loaded in one place (``observability.nvml``) for both GPU readers: the /metrics GPU gauges and the
GPU memory a model load costs. On a machine without NVML both report nothing, and say nothing wrong."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from kubeinfer.server.observability import nvml
from kubeinfer.server.observability.system import GpuReader
from kubeinfer.server.runtime.footprint import GpuMemory


def test_without_nvml_both_readers_report_no_gpu() -> None:
    if nvml.library() is not None:
        pytest.skip("NVML loads here (a GPU machine): tests/gpu covers the readings")
    assert GpuReader().read() == []
    assert GpuMemory().read() == {}


def test_nvml_is_initialized_once_and_shared() -> None:
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed here: nothing to initialize (the readers' CPU path is above)")
    assert nvml.library() is nvml.library()


def test_optional_reads_a_field_or_gives_none() -> None:
    def unsupported() -> int:
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    assert nvml.optional(lambda: 7) == 7
    assert nvml.optional(unsupported) is None


def test_importing_the_readers_does_not_load_nvml() -> None:
    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed here: it could not be loaded anyway")
    probe = (
        "import sys, kubeinfer.server.observability.system, kubeinfer.server.runtime.footprint; "
        "print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("visible", "count"), [("0,1", 2), ("GPU-5f1c,GPU-9a2b,GPU-0d3e", 3), ("-1", 0), ("", 0)])
def test_cuda_visible_devices_decides_the_gpu_count(visible: str, count: int) -> None:
    probe = "from kubeinfer.server.runtime import devices; print(devices.gpu_count())"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env, timeout=60)
    assert int(out.stdout) == count


def test_without_cuda_visible_devices_nvml_counts_the_gpus() -> None:
    """The count comes from the same NVML the GPU gauges read: none on a machine where NVML does not load."""
    probe = (
        "from kubeinfer.server.observability import nvml; from kubeinfer.server.runtime import devices; "
        "lib = nvml.library(); print(devices.gpu_count(), 0 if lib is None else lib.nvmlDeviceGetCount())"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env, timeout=60)
    ours, nvml_count = out.stdout.split()
    assert ours == nvml_count
