"""kubeinfer perf's pure parts: what it reads from a server's metadata, its ranges, shapes and input data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from kubeinfer.server.tools.perf.cli import parse_range
from kubeinfer.server.tools.perf.load import Sample
from kubeinfer.server.tools.perf.measure import Window, is_stable
from kubeinfer.server.tools.perf.model import PerfError, input_steps, model_info, parse_shapes, resolve_shapes

ADD_SUB = {
    "name": "add_sub",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ],
    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
}


def test_the_config_apis_max_batch_size_decides_the_batch_dimension() -> None:
    info = model_info(ADD_SUB, {"name": "add_sub", "max_batch_size": 8}, "add_sub", "")
    assert info.max_batch_size == 8 and [i.dims for i in info.inputs] == [(16,), (16,)]
    unbatched = model_info(
        {**ADD_SUB, "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 16]}]},
        {"name": "m", "max_batch_size": 0},
        "m",
        "",
    )
    assert unbatched.max_batch_size == 0 and unbatched.inputs[0].dims == (-1, 16)


@pytest.mark.parametrize(
    "config", [None, {"max_batch_size": 0, "input": []}], ids=["no config API", "empty gRPC config"]
)
def test_without_a_config_a_leading_minus_one_is_the_batch_dimension(config: dict | None) -> None:
    # MLServer: no config API over HTTP, an empty config over gRPC, int64 dims as strings in gRPC metadata
    metadata = {**ADD_SUB, "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}]}
    info = model_info(metadata, config, "add_sub", "")
    assert info.max_batch_size > 0 and info.inputs[0].dims == (16,)


def test_ranges_shapes_and_their_mistakes() -> None:
    assert parse_range("1:16:4", int, "--concurrency-range") == [1, 5, 9, 13]
    assert parse_range("4", int, "--concurrency-range") == [4]
    assert parse_range("100:300:100", float, "--request-rate-range") == [100.0, 200.0, 300.0]
    with pytest.raises(PerfError, match="end is below the start"):
        parse_range("8:2", int, "--concurrency-range")
    assert parse_shapes(["IN:3,224,224", "X:2x2"]) == {"IN": (3, 224, 224), "X": (2, 2)}
    info = model_info(
        {"name": "m", "inputs": [{"name": "IN", "datatype": "FP32", "shape": [-1, -1, 4]}]},
        {"name": "m", "max_batch_size": 4},
        "m",
        "",
    )
    with pytest.raises(PerfError, match="variable dims"):
        resolve_shapes(info, {})
    with pytest.raises(PerfError, match="does not fit"):
        resolve_shapes(info, {"IN": (3, 5)})
    assert resolve_shapes(info, {"IN": (7, 4)}) == {"IN": (7, 4)}


def test_input_data_sources(tmp_path: Path) -> None:
    info = model_info(ADD_SUB, {"name": "add_sub", "max_batch_size": 8}, "add_sub", "")
    dims = resolve_shapes(info, {})
    (zero,) = input_steps(info, dims, "zero", 4)
    assert zero["INPUT0"].shape == (4, 16) and not zero["INPUT0"].any()
    (rand,) = input_steps(info, dims, "random", 2)
    assert rand["INPUT1"].dtype == np.float32 and rand["INPUT1"].shape == (2, 16)
    data = tmp_path / "data.json"
    data.write_text(
        json.dumps({"data": [{"INPUT0": list(range(16)), "INPUT1": {"content": [1] * 16, "shape": [16]}}] * 3})
    )
    steps = input_steps(info, dims, str(data), 2)
    assert len(steps) == 3 and steps[0]["INPUT0"].shape == (2, 16) and steps[0]["INPUT0"][1, 15] == 15
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "INPUT0.npy", np.ones((1, 16), np.float32))
    with pytest.raises(PerfError, match="no INPUT1.npy"):
        input_steps(info, dims, str(folder), 1)
    with pytest.raises(PerfError, match="larger than the model's max_batch_size 8"):
        input_steps(info, dims, "zero", 9)


def _window(throughput: float, p95_ms: float) -> Window:
    latencies = np.full(int(throughput), p95_ms / 1000)
    return Window(Sample(latencies=latencies, wall_s=1.0), None, None, 0.0)


def test_stability_needs_three_windows_within_the_percentage() -> None:
    assert not is_stable([_window(100, 5), _window(100, 5)], 95, 10)
    assert is_stable([_window(100, 5), _window(104, 5.2), _window(97, 4.9)], 95, 10)
    assert not is_stable([_window(100, 5), _window(130, 5), _window(100, 5)], 95, 10)
    assert not is_stable([_window(100, 5), _window(100, 8), _window(100, 5)], 95, 10)
