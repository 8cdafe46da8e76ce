"""The container images' inputs: per-role requirements, the build context, the tag the chart expects.

The images themselves are built and run by the e2e suite (scripts/images, e2e/test_node.py,
e2e/test_user_path.py); these checks keep the files they are built from consistent.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path, loader: SourceFileLoader | None = None):
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
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
        "orjson",
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
        (["onnxruntime", "grpc", "fastapi", "uvicorn", "orjson", "prometheus_client"], "kubeinfer.operator.cli"),
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


def test_inputs_hash_follows_the_context(tmp_path: Path) -> None:
    for entry in images.CONTEXT:
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
    first = images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path)
    (tmp_path / "server" / "pkg" / "__pycache__").mkdir()
    (tmp_path / "server" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    assert images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path) == first
    assert images.inputs_hash("Dockerfile.server", "base:2", {"EXTRAS": ""}, root=tmp_path) != first
    assert images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": "gpu"}, root=tmp_path) != first
    (tmp_path / "server" / "pkg" / "mod.py").write_text("x = 2\n")
    assert images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path) != first


def test_containerd_names_short_references_as_the_kubelet_does() -> None:
    assert images.normalized("kubeinfer-server:0.1.0") == "docker.io/library/kubeinfer-server:0.1.0"
    assert images.normalized("registry.example.com/ml/x:1") == "registry.example.com/ml/x:1"


def test_the_server_image_carries_the_rust_grpc_transport_and_hashes_its_inputs(tmp_path: Path) -> None:
    """scripts/images builds the transport on the host and ships it inside server/: the name the build script
    gives the library is the one scripts/images looks for and the wheel ships, and both the crate and the
    library change the server image's content hash (a crate change builds a new image)."""
    script = ROOT / "scripts" / "build_grpc_transport"  # a stdlib script without a .py suffix
    build = _load(
        "kubeinfer_build_grpc_transport", script, SourceFileLoader("kubeinfer_build_grpc_transport", str(script))
    )
    module = build.MODULE
    name = module.name
    assert name == "kubeinfer_grpc_transport.abi3.so"  # CPython's stable ABI: one file for every python3 >= 3.10
    assert module.parent == images.GRPC_TRANSPORT_DIR
    assert fnmatch.fnmatch(name, images.GRPC_TRANSPORT_GLOB), name
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch.fnmatch(name, pattern) for pattern in package_data["kubeinfer.server.grpc"]), package_data
    context = images.context_files()
    for src in build.sources():
        assert src.relative_to(ROOT) in context, f"{src} is not in the server image's hashed context"

    for entry in images.CONTEXT:  # a small copy of the context: the crate, then the library built from it
        dst = tmp_path / entry
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / entry).is_file():
            dst.write_bytes((ROOT / entry).read_bytes())
    (tmp_path / ".dockerignore").write_bytes((ROOT / ".dockerignore").read_bytes())
    (tmp_path / "Dockerfile.server").write_text("FROM scratch\n")
    crate = tmp_path / "server" / "grpc" / "rust" / "src"
    crate.mkdir(parents=True)
    (crate / "lib.rs").write_text("// v1\n")

    def digest() -> str:
        return images.inputs_hash("Dockerfile.server", "base:1", {"EXTRAS": ""}, root=tmp_path)

    first = digest()
    (crate / "lib.rs").write_text("// v2\n")
    second = digest()
    (tmp_path / "server" / "grpc" / name).write_bytes(b"\x7fELF built from v2")
    assert len({first, second, digest()}) == 3


def test_the_grpc_transport_build_removes_per_version_copies_that_would_shadow_it(tmp_path: Path) -> None:
    """Python tries the version-specific suffix before ``.abi3.so``: a ``.cpython-311-*.so`` left by an older
    build would be imported instead of the new abi3 build on 3.11, so the build script removes it."""
    import importlib.machinery

    script = ROOT / "scripts" / "build_grpc_transport"
    build = _load(
        "kubeinfer_build_grpc_transport", script, SourceFileLoader("kubeinfer_build_grpc_transport", str(script))
    )
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    assert suffixes.index(".abi3.so") > 0 and suffixes[0].startswith(".cpython-"), suffixes  # why it matters
    package = tmp_path / "server" / "grpc"
    package.mkdir(parents=True)
    stale = [
        package / "kubeinfer_grpc_transport.cpython-311-x86_64-linux-gnu.so",
        package / "kubeinfer_grpc_transport.so",
    ]
    kept = [
        package / "kubeinfer_grpc_transport.abi3.so",
        package / "kubeinfer_grpc_transport.pyi",
        package / "other.so",
    ]
    for f in stale + kept:
        f.write_bytes(b"x")
    build.ROOT, build.PACKAGE, build.MODULE = tmp_path, package, package / "kubeinfer_grpc_transport.abi3.so"
    build.remove_stale()
    assert sorted(package.iterdir()) == sorted(kept)
