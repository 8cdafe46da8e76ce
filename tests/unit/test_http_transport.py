"""``--http-transport``: the flag, its environment default, and what each value picks (server/http/transport.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kubeinfer.server.cli import build_parser, settings_from_args
from kubeinfer.server.http import transport
from kubeinfer.server.http.transport import ENV, choose, default_transport, native_missing


def _settings(tmp_path: Path, *flags: str) -> str:
    args = build_parser(triton=False).parse_args(["--model-repository", str(tmp_path), *flags])
    return settings_from_args(args, triton=False).http_transport


def test_the_flag_then_the_environment_then_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert _settings(tmp_path) == "auto"
    monkeypatch.setenv(ENV, "native")
    assert _settings(tmp_path) == "native"
    assert _settings(tmp_path, "--http-transport", "asgi") == "asgi"
    monkeypatch.setenv(ENV, "uvicorn")
    with pytest.raises(ValueError, match="KUBEINFER_HTTP_TRANSPORT='uvicorn'"):
        default_transport()


def test_auto_keeps_uvicorn_in_this_phase_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=transport.__name__):
        assert choose("auto", tls=False) == "asgi"
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP served by uvicorn (--http-transport auto; the native transport is opt-in: native)"
    ]
    assert choose("asgi", tls=True) == "asgi"


def test_native_is_chosen_when_built_and_refused_with_the_reason_otherwise() -> None:
    with pytest.raises(SystemExit, match="cannot serve this server"):  # TLS, or no module
        choose("native", tls=True)
    missing = native_missing()
    if missing is None:
        assert choose("native", tls=False) == "native"
    else:
        with pytest.raises(SystemExit, match="no Rust transport module"):
            choose("native", tls=False)
