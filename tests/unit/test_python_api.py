"""Pure parts of the Python backend: Triton's auto-complete rules, error texts, generate shapes, and
per-instance imports of a model's sibling modules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kubeinfer.server.backends.python.model_api.triton_python_backend_utils import ModelConfig
from kubeinfer.server.backends.python.server_side.backend import exception_text
from kubeinfer.server.backends.python.stub.loader import ModelModule
from kubeinfer.server.http.generate import _shape
from kubeinfer.server.vocabulary.errors import InvalidArgument


def _config(**extra: object) -> ModelConfig:
    return ModelConfig({"name": "m", "max_batch_size": 0, "input": [], "output": [], **extra})


def test_auto_complete_rules_and_messages_are_tritons() -> None:
    config = _config(input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}])
    config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "Y", "data_type": "TYPE_INT32", "dims": [-1]})
    assert [t["name"] for t in config.as_dict()["output"]] == ["Y"]
    with pytest.raises(ValueError, match=r"^model 'm', tensor 'X': the model expects dims \[2\] but the model"):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
    with pytest.raises(
        ValueError, match="configuration expects datatype TYPE_FP32 for input 'X', model provides TYPE_INT8"
    ):
        config.add_input({"name": "X", "data_type": "TYPE_INT8", "dims": [4]})
    with pytest.raises(ValueError, match="contains property other than 'name', 'data_type' and 'dims'"):
        config.add_output({"name": "Z", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="is missing 'dims' property"):
        config.add_input({"name": "W", "data_type": "TYPE_FP32"})
    config.set_max_batch_size(8)
    with pytest.raises(ValueError, match="configuration specified max_batch_size 8, but in auto-complete-config"):
        config.set_max_batch_size(4)
    config.set_model_transaction_policy({"decoupled": True})
    with pytest.raises(ValueError, match="trying to change decoupled property"):
        config.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="tries to set scheduling_choice as 'dynamic_batching'"):
        _config(sequence_batching={}).set_dynamic_batching()


def test_exception_text_is_pybind11s_with_the_models_frames_only() -> None:
    def model_execute() -> None:
        raise ValueError("boom")

    try:
        model_execute()
    except ValueError as exc:
        text = exception_text(exc)
    head, _, frames = text.partition("\n\nAt:\n")
    assert head == "ValueError: boom"
    lines = frames.splitlines()
    assert lines[0].endswith("): model_execute") and lines[-1].endswith(
        "): test_exception_text_is_pybind11s_with_the_models_frames_only"
    )
    assert all(line.startswith("  ") and "(" in line for line in lines)


@pytest.mark.parametrize(
    ("count", "dims", "shape"),
    [(1, [1], [1]), (4, [-1], [4]), (6, [-1, 3], [2, 3]), (5, [-1, -1], [1, 5]), (1, [-1, 1], [1, 1])],
)
def test_generate_shapes(count: int, dims: list[int], shape: list[int]) -> None:
    assert _shape("x", count, dims) == shape


def test_generate_refuses_shapes_it_cannot_fill() -> None:
    with pytest.raises(InvalidArgument, match="The schema can not convert input 'x' to tensor with proper shape"):
        _shape("x", 2, [1])


def _model(root: Path, name: str, offset: int) -> Path:
    version = root / name / "1"
    (version / "pkg").mkdir(parents=True)
    (version / "helper.py").write_text(f"OFFSET = {offset}\ncalls = []\n")
    (version / "relative.py").write_text(f"VALUE = {offset}\n")
    (version / "pkg" / "__init__.py").write_text("")
    (version / "pkg" / "ops.py").write_text(f"def op():\n    return {offset}\n")
    (version / "model.py").write_text(
        "import helper\nfrom pkg.ops import op\nfrom . import relative\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        import helper as again\n"
        "        again.calls.append(1)\n"
        "        return (helper.OFFSET, relative.VALUE, op(), len(helper.calls), again is helper)\n"
    )
    return version / "model.py"


def test_each_instance_imports_its_own_siblings(tmp_path: Path) -> None:
    a1 = ModelModule(_model(tmp_path, "a", 1), "a")
    a2 = ModelModule(tmp_path / "a" / "1" / "model.py", "a")
    b = ModelModule(_model(tmp_path, "b", 2), "b")
    try:
        results = []
        for module in (a1, a1, a2, b):
            with module.active():
                results.append(module.model_class().execute([]))
        assert results == [(1, 1, 1, 1, True), (1, 1, 1, 2, True), (1, 1, 1, 1, True), (2, 2, 2, 1, True)]
        assert "helper" not in sys.modules and "pkg" not in sys.modules  # kept out between calls
    finally:
        for module in (a1, a2, b):
            module.unload()
    assert not [name for name in sys.modules if name.startswith(a1.package)]
