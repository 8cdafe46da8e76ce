"""Facts stated in more than one place agree with their one home: the server's flag defaults (CLI, settings,
the operator's manifests, ``kubeinfer perf``), the header limit (``Limits``), the version policy's default,
the file-name limit in its messages, and the gRPC texts the Rust transport and the Python side both write."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from kubeinfer.operator.api import server_spec
from kubeinfer.server.app import ServerSettings
from kubeinfer.server.cli import build_parser
from kubeinfer.server.config import (
    MAX_FILE_NAME_BYTES,
    ConfigError,
    check_file_name,
    normalize_config,
    parse_config_text,
    version_policy,
)
from kubeinfer.server.http.protocol import BoundedHttpToolsProtocol, bounded_protocol
from kubeinfer.server.sharedmemory import SharedMemoryRegistry, system
from kubeinfer.server.tools.perf import cli as perf_cli
from kubeinfer.server.vocabulary import server_defaults
from kubeinfer.server.vocabulary.errors import InvalidArgument
from kubeinfer.server.vocabulary.limits import DEFAULT_LIMITS, Limits

ROOT = Path(__file__).resolve().parents[2]
RUST = ROOT / "server" / "grpc" / "rust" / "src"


def test_server_flag_defaults_have_one_home() -> None:
    ports = server_defaults.DEFAULT_PORTS
    parser = build_parser()
    assert {k: parser.get_default(f"{k}_port") for k in ports} == ports
    settings = ServerSettings(model_repository=Path("."))
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == tuple(ports.values())
    assert (
        parser.get_default("shutdown_timeout") == settings.shutdown_timeout == server_defaults.SHUTDOWN_TIMEOUT_SECONDS
    )
    assert (
        server_spec.DEFAULT_PORTS is ports and server_spec.SHUTDOWN_SECONDS == server_defaults.SHUTDOWN_TIMEOUT_SECONDS
    )
    assert perf_cli.DEFAULT_URL == {"http": f"localhost:{ports['http']}", "grpc": f"localhost:{ports['grpc']}"}


def test_the_header_limit_has_one_home() -> None:
    """``Limits`` holds the default; the CLI, the HTTP protocol and the limit tables of docs/server.md (the
    flag table) and SECURITY.md state the same number."""
    default = DEFAULT_LIMITS.max_header_bytes
    assert build_parser().get_default("max_header_bytes") == default == BoundedHttpToolsProtocol.max_header_bytes
    assert bounded_protocol(Limits(max_header_bytes=1234)).max_header_bytes == 1234
    assert default % 1024 == 0
    for doc in ("docs/server.md", "SECURITY.md"):
        rows = [line for line in (ROOT / doc).read_text().splitlines() if line.startswith("| `--max-header-bytes`")]
        assert rows and all(f"| {default // 1024} KiB |" in row for row in rows), (doc, rows)


def test_the_version_policy_default_has_one_home() -> None:
    """No version_policy: normalisation fills in, and selection applies, ``latest`` of the same count."""
    config = parse_config_text('platform: "onnxruntime_onnx"')
    newest = [1, 2, 3, 4][-version_policy.DEFAULT_NUM_VERSIONS :]
    assert version_policy.select_versions(config, [3, 1, 4, 2]) == newest
    normalize_config(config)
    assert config.version_policy.latest.num_versions == version_policy.DEFAULT_NUM_VERSIONS


def test_the_file_name_limit_in_its_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeinfer.server.config import validate

    monkeypatch.setattr(validate, "MAX_FILE_NAME_BYTES", 12)
    with pytest.raises(ConfigError) as info:
        validate.check_file_name("a" * 13, "default_model_filename")
    assert "is 13 bytes long (at most 12)" in str(info.value) and "at most 12 bytes)" in str(info.value)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match=f"at most {MAX_FILE_NAME_BYTES} bytes\\)"):
        check_file_name("a" * (MAX_FILE_NAME_BYTES + 1), "default_model_filename")
    assert system.NAME_MAX == MAX_FILE_NAME_BYTES
    with pytest.raises(InvalidArgument, match=f"up to {MAX_FILE_NAME_BYTES} characters"):
        SharedMemoryRegistry(enabled=True).register_system("r", "/" + "k" * (MAX_FILE_NAME_BYTES + 1), 0, 64)


def _python_strings(path: Path) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of a Python file (read, not imported: no built transport needed)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value.value
    return found


def _rust_strings() -> dict[str, str]:
    """``pub const NAME: &str = "text";`` of the Rust transport."""
    found = {}
    for path in sorted(RUST.glob("*.rs")):
        for name, text in re.findall(r'pub const (\w+): &str = "((?:[^"\\]|\\.)*)";', path.read_text()):
            found[name] = text.encode().decode("unicode_escape")
    return found


def test_grpc_texts_agree_between_the_rust_transport_and_python() -> None:
    rust = _rust_strings()
    python: dict[str, str] = {}
    for path in sorted((ROOT / "server" / "grpc").glob("*.py")):
        python.update(_python_strings(path))
    shared = sorted(set(rust) & set(python))
    assert "METHOD_NOT_FOUND" in shared, (sorted(rust), sorted(python))
    assert {n: rust[n] for n in shared} == {n: python[n] for n in shared}
    assert rust["METHOD_NOT_FOUND"] == "Method not found!"  # grpc-core's text, which Triton's clients see
