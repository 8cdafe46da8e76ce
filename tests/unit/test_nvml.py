"""NVML is loaded in one place (``observability.nvml``) for both GPU readers: the /metrics GPU gauges and the
GPU memory a model load costs. On a machine without NVML both report nothing, and say nothing wrong."""

from __future__ import annotations

import importlib.util
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
