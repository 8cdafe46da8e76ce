"""The container images' inputs: per-role requirements, the build context, the tag the chart expects.

The images themselves are built and run by the e2e suite (scripts/images, e2e/test_node.py,
e2e/test_user_path.py); these checks keep the files they are built from consistent.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


images = _load("kubeinfer_images_script", ROOT / "scripts" / "images.py")
image_requirements = _load("kubeinfer_image_requirements", ROOT / "scripts" / "image_requirements.py")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in reqs}


def test_plain_dependencies_are_the_union_of_the_image_roles() -> None:
    extras = PYPROJECT["optional-dependencies"]
    assert set(PYPROJECT["dependencies"]) == set(extras["server"]) | set(extras["operator"]) | set(extras["cpu"])


def test_a_gpu_server_image_gets_onnxruntime_gpu_only() -> None:
    """Both ONNX Runtime packages own the ``onnxruntime`` module: the CPU one would shadow the GPU one."""
    cpu = _names(image_requirements.requirements(["server"]))
    gpu = _names(image_requirements.requirements(["server", "gpu", "pytorch"]))
    assert "onnxruntime" in cpu and "onnxruntime-gpu" not in cpu
    assert "onnxruntime-gpu" in gpu and "onnxruntime" not in gpu
    assert "onnxruntime" not in _names(image_requirements.requirements(["operator"]))


def test_operator_image_carries_no_serving_stack() -> None:
    operator = _names(PYPROJECT["optional-dependencies"]["operator"])
    assert not operator & {
        "onnxruntime",
        "onnxruntime-gpu",
        "grpcio",
        "fastapi",
        "uvicorn",
        "prometheus-client",
    }
    assert not _names(PYPROJECT["optional-dependencies"]["server"]) & {"kopf", "kubernetes"}


def test_image_requirements_reads_the_extras_from_pyproject() -> None:
    pyproject = ROOT / "pyproject.toml"
    got = image_requirements.requirements(["operator"], pyproject)
    assert got == PYPROJECT["optional-dependencies"]["operator"]  # the pins survive
    both = image_requirements.requirements(["server", "gpu"], pyproject)
    assert both[: len(PYPROJECT["optional-dependencies"]["server"])] == PYPROJECT["optional-dependencies"]["server"]
    assert "onnxruntime-gpu>=1.18" in both and len(both) == len(set(both))
    with pytest.raises(SystemExit, match="unknown extra"):
        image_requirements.requirements(["no-such-extra"], pyproject)


@pytest.mark.parametrize(
    ("blocked", "module"),
    [
        # what the operator image lacks must not be needed to run the operator ...
        # (orjson is in both: the operator decodes its model watch and encodes its per-model writes with it)
        (["onnxruntime", "grpc", "fastapi", "uvicorn", "prometheus_client"], "kubeinfer.operator.cli"),
        # ... and the server image has no Kubernetes client
        (["kopf", "kubernetes"], "kubeinfer.server.cli"),
    ],
)
def test_each_role_imports_without_the_other_roles_packages(blocked: list[str], module: str) -> None:
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None  # import of it raises ImportError\n"
        f"import {module}\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_chart_default_image_is_what_the_build_tags() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "kubeinfer" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm" / "kubeinfer" / "values.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["version"] == images.project_version()
    assert values["image"]["repository"] == "kubeinfer-operator" and not values["image"]["tag"]


def test_one_version_everywhere() -> None:
    """pyproject.toml's version is the one the server reports (/v2 metadata) and the chart ships."""
    import kubeinfer.server

    chart = yaml.safe_load((ROOT / "helm" / "kubeinfer" / "Chart.yaml").read_text())
    assert kubeinfer.server.__version__ == PYPROJECT["version"] == chart["version"] == chart["appVersion"]


def test_dockerfiles_take_the_base_as_an_argument_and_copy_only_the_hashed_context() -> None:
    allowed = [line[1:] for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    assert sorted(allowed) == sorted(images.CONTEXT)
    for dockerfile in images.IMAGES.values():
        text = (ROOT / dockerfile).read_text()
        assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.M), dockerfile
        assert text.count("FROM ${BASE}") == 2 and "FROM deps AS build" in text, dockerfile
        deps_stage = text.split("FROM deps AS build")[0]
        copied = [s for line in re.findall(r"^COPY (.+?) \S+$", deps_stage, re.M) for s in line.split()]
        assert "constraints.txt" in copied and "pyproject.toml" in copied
        for src in copied:  # what the requirements layer depends on
            assert src in images.DEPS_CONTEXT, f"{dockerfile}'s deps stage copies {src}"
        for src in re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M):
            for item in src.split():
                assert item.rstrip("/") in images.CONTEXT, f"{dockerfile} copies {item}, not in the hashed context"
        assert re.search(r"^USER 1000:1000$", text, re.M), dockerfile


def test_inputs_hash_follows_the_sources(tmp_path: Path) -> None:
    for entry in images.SOURCES:
        src = ROOT / entry
        dst = tmp_path / entry
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_file():
            dst.write_bytes(src.read_bytes())
        else:
            (dst / "pkg").mkdir(parents=True)
            (dst / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / ".dockerignore").write_text("*\n")
    (tmp_path / "Dockerfile.server").write_text("FROM scratch\n")

    def digest() -> str:
        return images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path)

    first = digest()
    (tmp_path / "server" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "server" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    assert digest() == first
    assert images.inputs_hash("Dockerfile.server", "base:2", {"EXTRAS": ""}, root=tmp_path) != first
    assert images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": "gpu"}, root=tmp_path) != first
    (tmp_path / "server" / "pkg" / "mod.py").write_text("x = 2\n")
    assert digest() != first


def test_the_rust_crate_is_hashed_and_its_build_outputs_are_not(tmp_path: Path) -> None:
    """The wheel compiles server/grpc/rust (setup.py): a crate change builds new images; cargo's target folder
    and a library `pip install -e .` left beside the sources are build outputs, not inputs."""
    for entry in images.SOURCES:
        dst = tmp_path / entry
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / entry).is_file():
            dst.write_bytes((ROOT / entry).read_bytes())
    (tmp_path / ".dockerignore").write_bytes((ROOT / ".dockerignore").read_bytes())
    (tmp_path / "Dockerfile.server").write_text("FROM scratch\n")
    crate = tmp_path / "server" / "grpc" / "rust"
    (crate / "src").mkdir(parents=True)
    (crate / "src" / "lib.rs").write_text("// v1\n")

    def digest() -> str:
        return images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path)

    first = digest()
    (crate / "target" / "release").mkdir(parents=True)
    (crate / "target" / "release" / "libkubeinfer_grpc_transport.so").write_bytes(b"\x7fELF")
    (crate.parent / "kubeinfer_grpc_transport.abi3.so").write_bytes(b"\x7fELF")
    assert digest() == first
    (crate / "src" / "lib.rs").write_text("// v2\n")
    assert digest() != first
    context = {str(p) for p in images.context_files()}
    assert "server/grpc/rust/Cargo.toml" in context and "server/grpc/rust/Cargo.lock" in context
    assert not any(p.startswith("server/grpc/rust/target/") for p in context)


def test_the_wheel_ships_the_transport_where_the_images_look_for_it() -> None:
    """scripts/images reads the wheel's file list for the library setup.py builds into the package."""
    setup = (ROOT / "setup.py").read_text()
    module = re.search(r'^MODULE = "([\w.]+)"$', setup, re.M)
    assert module and module.group(1) == images.GRPC_TRANSPORT_MODULE
    assert images.GRPC_TRANSPORT_FILE == module.group(1).replace(".", "/") + ".abi3.so"


def test_stale_refs_are_every_reference_to_earlier_builds_and_nothing_else() -> None:
    """Earlier builds stayed on the node: their buildah-named tags were never matched, and the CRI plugin's
    ``sha256:`` records pinned their layers after the tags went (9.4 GB of a node's content after a day)."""
    rows = [
        ("docker.io/library/kubeinfer-server:0.1.0", "sha256:new"),
        ("docker.io/library/kubeinfer-server:0.1.0-aaaaaaaaaaaa", "sha256:new"),
        ("sha256:1d-of-new", "sha256:new"),
        ("localhost/kubeinfer-server:0.1.0-bbbbbbbbbbbb", "sha256:old1"),
        ("sha256:1d-of-old1", "sha256:old1"),
        ("docker.io/library/kubeinfer-server:0.1.0-cccccccccccc", "sha256:old2"),
        ("sha256:1d-of-old2", "sha256:old2"),
        ("docker.io/library/kubeinfer-operator:0.1.0", "sha256:op"),
        ("sha256:1d-of-op", "sha256:op"),
        ("localhost/kubeinfer-operator:0.1.0-dddddddddddd", "sha256:op-old"),
        ("localhost/kubeinfer/pause:3.10.1", "sha256:pause"),
        ("sha256:1d-of-pause", "sha256:pause"),
        ("docker.io/library/kubeinfer-server-deps:0.1.0", "sha256:deps"),
    ]
    stale = images.stale_refs(rows, "kubeinfer-server:0.1.0", "sha256:new")
    assert sorted(stale) == [
        "docker.io/library/kubeinfer-server:0.1.0-cccccccccccc",
        "localhost/kubeinfer-server:0.1.0-bbbbbbbbbbbb",
        "sha256:1d-of-old1",
        "sha256:1d-of-old2",
    ]
    # the operator's load removes the operator's earlier build only (the server's are the server's load's)
    assert images.stale_refs(rows, "kubeinfer-operator:0.1.0", "sha256:op") == [
        "localhost/kubeinfer-operator:0.1.0-dddddddddddd"
    ]
