"""``kubeinfer convert`` without a GPU: argument checks, profile shapes, the rendered config and the
repository layout; plus TensorRT profile selection. The engine build itself is in tests/gpu."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from kubeinfer.server.backends.tensorrt import choose_profile
from kubeinfer.server.config import parse_config_text, validate_config
from kubeinfer.server.examples import models
from kubeinfer.server.tools import convert
from kubeinfer.server.tools.cli import build_parser
from kubeinfer.server.tools.convert import ConvertError, ConvertOptions
from kubeinfer.server.vocabulary.errors import InvalidArgument


@pytest.fixture()
def resnet(tmp_path: Path) -> Path:
    path = tmp_path / "resnet.onnx"
    onnx.save(models.resnet18_cifar(seed=0), str(path))
    return path


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo"


def _options(onnx_path: Path, repo: Path, *argv: str) -> ConvertOptions:
    args = build_parser().parse_args(["convert", str(onnx_path), "--repository", str(repo), "--name", "m", *argv])
    return convert.options_from_args(args)


def test_defaults_give_one_profile_from_1_to_8(resnet: Path, repo: Path) -> None:
    options = _options(resnet, repo)
    convert.check_options(options)
    assert convert.batch_range(options) == (1, 8, 8)
    shapes = convert.profile_shapes(options, convert.read_signature(resnet))
    assert shapes == {"input": ([1, 3, 32, 32], [8, 3, 32, 32], [8, 3, 32, 32])}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--min-batch", "4", "--max-batch", "2"], "--min-batch <= --opt-batch <= --max-batch"),
        (["--opt-batch", "16", "--max-batch", "8"], "--min-batch <= --opt-batch <= --max-batch"),
        (["--max-batch", "0"], "--max-batch must be >= 1"),
        (["--int8"], "--int8 needs --calibration-data"),
        (["--workspace", "0"], "--workspace must be at least 1 MiB"),
        (["--version", "0"], "--version must be >= 1"),
        (["--instance-count", "0"], "--instance-count must be >= 1"),
        (["--int8", "--calibration-data", "/nope/calib.npy"], "calibration data '/nope/calib.npy' not found"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(resnet: Path, repo: Path, argv: list[str], message: str) -> None:
    with pytest.raises(ConvertError, match=message.replace("(", r"\(")):
        convert.check_options(_options(resnet, repo, *argv))


def test_missing_onnx_bad_name_and_missing_repository(resnet: Path, repo: Path, tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="not found"):
        convert.check_options(_options(tmp_path / "missing.onnx", repo))
    with pytest.raises(ConvertError, match="is not a folder"):
        convert.check_options(_options(resnet, tmp_path / "no-repo"))
    options = _options(resnet, repo)
    options.name = "../escape"
    with pytest.raises(ConvertError, match="invalid model name"):
        convert.check_options(options)


def test_calibration_data_only_with_int8_and_only_npy_or_npz(resnet: Path, repo: Path, tmp_path: Path) -> None:
    calib = tmp_path / "calib.npy"
    np.save(calib, np.zeros((16, 3, 32, 32), dtype=np.float32))
    with pytest.raises(ConvertError, match="only used with --int8"):
        convert.check_options(_options(resnet, repo, "--calibration-data", str(calib)))
    convert.check_options(_options(resnet, repo, "--int8", "--calibration-data", str(calib)))
    text = tmp_path / "calib.txt"
    text.write_text("x")
    with pytest.raises(ConvertError, match=".npy or .npz"):
        convert.check_options(_options(resnet, repo, "--int8", "--calibration-data", str(text)))


def test_calibration_shape_is_checked(resnet: Path, tmp_path: Path) -> None:
    sig = convert.read_signature(resnet)
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((4, 3, 32, 32), dtype=np.float64))
    samples = convert.load_calibration(good, sig)
    assert samples["input"].dtype == np.float32 and samples["input"].shape == (4, 3, 32, 32)
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((3, 32, 32), dtype=np.float32))
    with pytest.raises(ConvertError, match=r"expected \[N, 3, 32, 32\]"):
        convert.load_calibration(bad, sig)


def test_existing_version_needs_force(resnet: Path, repo: Path) -> None:
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.plan").write_bytes(b"old")
    with pytest.raises(ConvertError, match="pass --force"):
        convert.check_options(_options(resnet, repo))
    convert.check_options(_options(resnet, repo, "--force"))


def test_fixed_batch_model_refuses_batch_flags(tmp_path: Path, repo: Path) -> None:
    path = tmp_path / "fixed.onnx"
    onnx.save(models.add_sub(16, batched=False), str(path))
    sig = convert.read_signature(path)
    assert not sig.batching
    with pytest.raises(ConvertError, match="no dynamic batch dimension"):
        convert.profile_shapes(_options(path, repo, "--max-batch", "4"), sig)
    config = convert.render_config(_options(path, repo), sig)
    assert config.max_batch_size == 0
    assert [list(t.dims) for t in config.input] == [[16], [16]]
    assert not config.HasField("dynamic_batching")


def test_dynamic_non_batch_dims_need_an_input_shape(tmp_path: Path, repo: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
    )
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    sig = convert.read_signature(path)
    with pytest.raises(ConvertError, match="--input-shape x=3xNxN"):
        convert.profile_shapes(_options(path, repo), sig)
    shapes = convert.profile_shapes(_options(path, repo, "--input-shape", "x=3x64x48", "--max-batch", "2"), sig)
    assert shapes["x"] == ([1, 3, 64, 48], [2, 3, 64, 48], [2, 3, 64, 48])
    with pytest.raises(ConvertError, match="does not match"):
        convert.profile_shapes(_options(path, repo, "--input-shape", "x=4x64x48"), sig)
    with pytest.raises(ConvertError, match="unknown input"):
        convert.profile_shapes(_options(path, repo, "--input-shape", "nope=1"), sig)
    with pytest.raises(ConvertError, match="NAME=3x224x224"):
        _options(path, repo, "--input-shape", "x:3x64x48")


def test_rendered_config_serves_the_plan(resnet: Path, repo: Path) -> None:
    options = _options(resnet, repo, "--max-batch", "32", "--opt-batch", "16", "--instance-count", "2", "--gpus", "0")
    config = convert.render_config(options, convert.read_signature(resnet))
    text = convert.config_to_text(config)
    parsed = parse_config_text(text)
    validate_config(parsed, "m")
    assert parsed.name == "m" and parsed.platform == "tensorrt_plan"
    assert parsed.max_batch_size == 32
    assert [(t.name, list(t.dims)) for t in parsed.input] == [("input", [3, 32, 32])]
    assert [(t.name, list(t.dims)) for t in parsed.output] == [("output", [10])]
    assert parsed.HasField("dynamic_batching")
    (group,) = parsed.instance_group
    assert (group.kind, group.count, list(group.gpus)) == (parsed.instance_group[0].KIND_GPU, 2, [0])


def test_layout_and_atomic_write(resnet: Path, repo: Path) -> None:
    options = _options(resnet, repo, "--version", "3")
    layout = convert.plan_layout(options)
    assert layout.plan == repo / "m" / "3" / "model.plan"
    assert layout.config == repo / "m" / "config.pbtxt"
    assert layout.calibration_cache == repo / "m" / "3" / "calibration.cache"
    config_text = convert.config_to_text(convert.render_config(options, convert.read_signature(resnet)))
    convert.write_model(options, layout, b"PLAN-1", b"CACHE", config_text)
    assert layout.plan.read_bytes() == b"PLAN-1"
    assert layout.calibration_cache.read_bytes() == b"CACHE"
    assert layout.config.read_text() == config_text
    # a second version into the existing model folder; nothing staged is left behind
    options2 = _options(resnet, repo, "--version", "4")
    convert.write_model(options2, convert.plan_layout(options2), b"PLAN-2", None, config_text)
    options3 = _options(resnet, repo, "--version", "3", "--force")
    convert.write_model(options3, convert.plan_layout(options3), b"PLAN-3", None, config_text)
    assert layout.plan.read_bytes() == b"PLAN-3"
    assert not layout.calibration_cache.exists()
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["3", "4", "config.pbtxt"]
    assert sorted(p.name for p in repo.iterdir()) == ["m"]


def test_error_stats() -> None:
    ref = {"y": np.array([[1.0, -2.0, 4.0]], dtype=np.float32)}
    got = {"y": np.array([[1.5, -2.0, 3.0]], dtype=np.float32)}
    ((max_abs, max_rel),) = convert.error_stats(ref, got).values()
    assert max_abs == pytest.approx(1.0) and max_rel == pytest.approx(0.25)
    with pytest.raises(ConvertError, match="shape"):
        convert.error_stats(ref, {"y": np.zeros((2, 3), dtype=np.float32)})


def test_cli_reports_argument_errors_and_missing_tensorrt(resnet: Path, repo: Path) -> None:
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubeinfer.server.tools.cli",
            "convert",
            str(resnet),
            "--repository",
            str(repo),
            "--name",
            "m",
            "--int8",
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "--int8 needs --calibration-data" in bad.stderr
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        missing = subprocess.run(
            [
                sys.executable,
                "-m",
                "kubeinfer.server.tools.cli",
                "convert",
                str(resnet),
                "--repository",
                str(repo),
                "--name",
                "m",
            ],
            capture_output=True,
            text=True,
        )
        assert missing.returncode == 2
        assert "tensorrt is not installed: pip install kubeinfer[gpu]" in missing.stderr
        assert not (repo / "m").exists()  # nothing half-written


PROFILES = [
    {"x": ((1, 3), (4, 3), (4, 3))},
    {"x": ((5, 3), (16, 3), (16, 3))},
    {"x": ((1, 3), (32, 3), (32, 3))},
]


def test_choose_profile_takes_the_tightest_that_fits() -> None:
    assert choose_profile(PROFILES, {"x": (2, 3)}) == 0
    assert choose_profile(PROFILES, {"x": (8, 3)}) == 1
    assert choose_profile(PROFILES, {"x": (20, 3)}) == 2
    assert choose_profile(PROFILES, {"x": (2, 3)}, allowed=[2]) == 2
    with pytest.raises(InvalidArgument, match="fit no optimization profile"):
        choose_profile(PROFILES, {"x": (64, 3)})
    with pytest.raises(InvalidArgument, match="fit no optimization profile"):
        choose_profile(PROFILES, {"x": (2, 4)})
