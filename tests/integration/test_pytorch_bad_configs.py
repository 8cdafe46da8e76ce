"""Bad PyTorch models and configs: each is UNAVAILABLE with a reason that says what to fix; the rest serve."""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support.server import ServerProcess, start_server

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed: pip install kubeinfer[pytorch]"
)

if importlib.util.find_spec("torch") is not None:
    import torch

    from tests.support import torch_models as tm

HEAD = 'name: "{name}"\nplatform: "pytorch_libtorch"\n'
CLASSIFIER_IO = """
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""

#: model name → (config body after platform, what version 1 holds, words the reason must contain)
CASES = {
    "too_many_inputs": (
        "max_batch_size: 4\n"
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] },'
        ' { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n',
        "classifier",
        "configuration expects 2 inputs, model provides 1: forward(x)",
    ),
    "no_inputs": (
        'max_batch_size: 4\noutput [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n',
        "classifier",
        "must contain at least one input, none were specified. The PyTorch backend does not auto-complete",
    ),
    "no_outputs": (
        'max_batch_size: 4\ninput [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]\n',
        "classifier",
        "must contain at least one output, none were specified",
    ),
    "pickled_module": (
        "max_batch_size: 4\n" + CLASSIFIER_IO,
        "torch.save",
        "was written by torch.save()",
    ),
    "not_an_archive": (
        "max_batch_size: 4\n" + CLASSIFIER_IO,
        "garbage",
        "model.pt is not a PyTorch archive",
    ),
    "output_index_out_of_range": (
        "max_batch_size: 4\n"
        'input [ { name: "A__0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "B__1" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUT__0" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "OUT__3" data_type: TYPE_FP32 dims: [ 3 ] } ]\n',
        "pair",
        "output 'OUT__3' refers to output index 3, but forward() returns 3 outputs",
    ),
    "input_index_out_of_range": (
        'max_batch_size: 4\ninput [ { name: "INPUT__5" data_type: TYPE_FP32 dims: [ 3, 16, 16 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 10 ] } ]\n',
        "classifier",
        "input 'INPUT__5' refers to input index 5, but forward(x) takes 1 input",
    ),
    "bad_parameter": (
        "max_batch_size: 4\n"
        + CLASSIFIER_IO
        + 'parameters { key: "INFERENCE_MODE" value { string_value: "maybe" } }\n',
        "classifier",
        "parameter 'INFERENCE_MODE' must be true or false, got 'maybe'",
    ),
    "batched_strings": (
        'max_batch_size: 4\ninput [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ 1 ] } ]\n',
        "words",
        "Triton only supports 1 dimensional List of String as input for 'INPUT__0'",
    ),
    "exported_fixed_batch": (
        'max_batch_size: 16\ndefault_model_filename: "model.pt2"\n' + CLASSIFIER_IO.replace("INPUT__0", "x"),
        "exported_static",
        "has shape [2, 3, 16, 16] with a fixed first dimension, but max_batch_size is 16",
    ),
    "exported_wrong_dtype": (
        'max_batch_size: 4\ndefault_model_filename: "model.pt2"\n'
        + CLASSIFIER_IO.replace("INPUT__0", "x").replace("TYPE_FP32 dims: [ 3", "TYPE_FP16 dims: [ 3"),
        "exported",
        "input 'x' is TYPE_FP16 in the config but the exported program's argument 'x' is TYPE_FP32",
    ),
    "exported_batch_too_large": (
        'max_batch_size: 64\ndefault_model_filename: "model.pt2"\n' + CLASSIFIER_IO.replace("INPUT__0", "x"),
        "exported",
        "the exported program accepts batches up to 16 but max_batch_size is 64",
    ),
}


def _write_file(kind: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "classifier":
        tm.save_torchscript(tm.classifier(1), path)
    elif kind == "pair":
        tm.save_torchscript(tm.Pair(), path)
    elif kind == "words":
        tm.save_torchscript(tm.Words(), path)
    elif kind == "torch.save":
        torch.save(tm.classifier(1), path)
    elif kind == "garbage":
        path.write_bytes(b"this is not a model")
    elif kind == "exported":
        tm.save_exported(tm.classifier(1), (torch.zeros(2, 3, 16, 16),), path.with_name("model.pt2"), max_batch=16)
    elif kind == "exported_static":
        torch.export.save(
            torch.export.export(tm.classifier(1), (torch.zeros(2, 3, 16, 16),)), str(path.with_name("model.pt2"))
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("pytorch_bad") / "repo"
    for name, (body, kind, _) in CASES.items():
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(HEAD.format(name=name) + textwrap.dedent(body))
        _write_file(kind, repo / name / "1" / "model.pt")
    (repo / "good").mkdir()
    (repo / "good" / "config.pbtxt").write_text(HEAD.format(name="good") + "max_batch_size: 4\n" + CLASSIFIER_IO)
    _write_file("classifier", repo / "good" / "1" / "model.pt")
    srv = start_server(repo, log_dir=repo.parent)
    yield srv
    srv.terminate()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_model_is_unavailable_with_what_to_fix(server: ServerProcess, name: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    rows = {r["name"]: r for r in client.get_model_repository_index()}
    assert rows[name]["state"] == "UNAVAILABLE", rows[name]
    assert CASES[name][2] in rows[name]["reason"], rows[name]["reason"]
    assert not client.is_model_ready(name)


def test_good_model_serves_beside_the_bad_ones(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    images = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    inp = httpclient.InferInput("INPUT__0", [2, 3, 16, 16], "FP32")
    inp.set_data_from_numpy(images)
    got = client.infer("good", [inp]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(got, tm.run(tm.classifier(1), images)[0], rtol=1e-5, atol=1e-5)
