"""Repository agents (``model_repository_agents`` in config.pbtxt) on the real server, driven by tritonclient.

Triton's ``qa/L0_repoagent_checksum`` first: with a wrong MD5 the server does not start and its log says
``'<model>': Mismatched MD5 hash for file <file>``; with the right one it serves over HTTP and gRPC. Then what
Triton's test does not cover: an agent that is not found, a checksum path that leaves the model folder, and a
third-party agent installed as a Python package (the ``kubeinfer.repository_agents`` entry point) that sees
Triton's lifecycle: LOAD, LOAD_COMPLETE, and UNLOAD/UNLOAD_COMPLETE when the model is reloaded or unloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.support.server import start_server
from tests.support.waiting import wait_for

MODEL = "identity_int32"


def _config(agents: str, name: str = MODEL) -> str:
    return (
        textwrap.dedent(
            f"""
        name: "{name}"
        platform: "onnxruntime_onnx"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """
        )
        + agents
    )


def _checksum(*pairs: tuple[str, str]) -> str:
    parameters = ", ".join(f'{{ key: "{key}", value: "{value}" }}' for key, value in pairs)
    return f'model_repository_agents {{ agents [ {{ name: "checksum", parameters [ {parameters} ] }} ] }}\n'


def _repository(root: Path, agents: str, name: str = MODEL) -> Path:
    model = root / name
    (model / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["n"])],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), model / "1" / "model.onnx"
    )
    (model / "data_file").write_bytes(b"the data a model reads beside its file\n")
    (model / "config.pbtxt").write_text(_config(agents, name))
    return root


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()


def test_tritons_checksum_agent_test(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "models", "")
    model = repo / MODEL
    data_md5 = _md5(model / "data_file")
    (model / "config.pbtxt").write_text(
        _config(_checksum(("MD5:1/model.onnx", "invalid_checksum"), ("MD5:data_file", data_md5)))
    )
    # the config is set with an invalid checksum: the server fails to start, and says why
    server = start_server(repo, "--exit-on-error=true", wait=False)
    assert server.proc.wait(timeout=120) != 0
    assert f"'{MODEL}': Mismatched MD5 hash for file 1/model.onnx, expect: invalid_checksum, got: " in server.log()

    # the right checksum: the server runs, and the model answers over both protocols
    (model / "config.pbtxt").write_text(
        _config(_checksum(("MD5:1/model.onnx", _md5(model / "1" / "model.onnx")), ("MD5:data_file", data_md5)))
    )
    server = start_server(repo)
    try:
        for client in (
            httpclient.InferenceServerClient(server.http_url),
            grpcclient.InferenceServerClient(server.grpc_url),
        ):
            module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
            for shape in ([0], [7]):
                data = (16384 * np.random.randn(*shape)).astype(np.int32)
                request = module.InferInput("INPUT0", list(data.shape), "INT32")
                request.set_data_from_numpy(data)
                result = client.infer(MODEL, [request])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        server.terminate()


def test_an_unknown_agent_and_a_path_out_of_the_folder_fail_the_load(tmp_path: Path) -> None:
    repo = _repository(tmp_path / "models", "")
    model = repo / MODEL
    (tmp_path / "outside").write_bytes(b"not the model's")
    server = start_server(repo, "--model-control-mode=explicit", "--repoagent-directory=/opt/agents")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        cases = {
            'model_repository_agents { agents [ { name: "decrypt" } ] }\n': (
                "failed to load 'identity_int32': unable to find 'libtritonrepoagent_decrypt.so' for repo agent "
                "'decrypt', searched: /opt/agents"
            ),
            _checksum(("MD5:../../outside", _md5(tmp_path / "outside"))): (
                "failed to load 'identity_int32': failed to open text file for read ../../outside: "
            ),
            _checksum(("SHA1:data_file", "x")): "failed to load 'identity_int32': Unsupported checksum algorithm: SHA1",
            _checksum(("data_file", "x")): "failed to load 'identity_int32': failed to parse key: data_file",
            _checksum(("MD5:missing", "x")): (
                "failed to load 'identity_int32': failed to open text file for read missing: "
            ),
        }
        for agents, message in cases.items():
            (model / "config.pbtxt").write_text(_config(agents))
            with pytest.raises(InferenceServerException) as info:
                client.load_model(MODEL)
            assert message in str(info.value), agents
            assert not client.is_model_ready(MODEL)
        # the server goes on serving: the same model with agents it can satisfy loads
        (model / "config.pbtxt").write_text(_config(_checksum(("MD5:data_file", _md5(model / "data_file")))))
        client.load_model(MODEL)
        assert client.is_model_ready(MODEL)
    finally:
        server.terminate()


def _install_recording_agent(site: Path, record: Path) -> None:
    """A Python package that provides the agent ``recorder`` through the entry point, as a pip install does."""
    (site / "recording_agent.py").write_text(
        textwrap.dedent(
            f"""
            import json

            class Recorder:
                def model_action(self, action, model):
                    with open({str(record)!r}, "a") as out:
                        entry = {{"action": action.name, "model": model.config.name,
                                  "location": str(model.location), "parameters": dict(model.parameters)}}
                        out.write(json.dumps(entry) + "\\n")
                    if action.name == "LOAD" and model.parameters.get("refuse") == "yes":
                        from kubeinfer.server.repository.agents import AgentError
                        raise AgentError("the recorder refuses this model")
            """
        )
    )
    dist = site / "recording_agent-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: recording-agent\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kubeinfer.repository_agents]\nrecorder = recording_agent:Recorder\n")


def test_a_python_package_agent_sees_tritons_lifecycle(tmp_path: Path) -> None:
    site, record = tmp_path / "site", tmp_path / "actions.jsonl"
    site.mkdir()
    _install_recording_agent(site, record)
    agents = 'model_repository_agents { agents [ { name: "recorder", parameters [ { key: "k", value: "v" } ] } ] }\n'
    repo = _repository(tmp_path / "models", agents)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    server = start_server(repo, "--model-control-mode=explicit", f"--load-model={MODEL}", env=env)

    def actions() -> list[str]:
        lines = record.read_text().splitlines() if record.exists() else []
        return [json.loads(line)["action"] for line in lines]

    try:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready(MODEL)
        first = json.loads(record.read_text().splitlines()[0])
        assert first == {"action": "LOAD", "model": MODEL, "location": str(repo / MODEL), "parameters": {"k": "v"}}
        assert actions() == ["LOAD", "LOAD_COMPLETE"]
        # a reload: the new load's agents load, then the replaced load's are told it is gone
        client.load_model(MODEL)
        assert actions() == ["LOAD", "LOAD_COMPLETE", "LOAD", "LOAD_COMPLETE", "UNLOAD", "UNLOAD_COMPLETE"]
        # the agent refuses the next config: LOAD then LOAD_FAIL; the model that served goes on serving
        config = (
            (repo / MODEL / "config.pbtxt")
            .read_text()
            .replace('value: "v" }', 'value: "v" }, { key: "refuse", value: "yes" }')
        )
        (repo / MODEL / "config.pbtxt").write_text(config)
        with pytest.raises(InferenceServerException, match="the recorder refuses this model"):
            client.load_model(MODEL)
        assert actions()[6:] == ["LOAD", "LOAD_FAIL"]
        assert client.is_model_ready(MODEL)
        client.unload_model(MODEL)
        wait_for("the unload", lambda: not client.is_model_ready(MODEL), 30)
        wait_for("UNLOAD_COMPLETE", lambda: actions()[8:] == ["UNLOAD", "UNLOAD_COMPLETE"], 30)
    finally:
        server.terminate()


def test_the_entry_point_agent_is_found_by_the_installed_package_metadata(tmp_path: Path) -> None:
    """The same lookup the server does, in a fresh interpreter: importlib.metadata finds the package's agent."""
    site = tmp_path / "site"
    site.mkdir()
    _install_recording_agent(site, tmp_path / "actions.jsonl")
    code = "from kubeinfer.server.repository.agents import find_agent; print(type(find_agent('recorder')).__name__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Recorder"
