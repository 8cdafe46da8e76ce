"""Property-based fuzzing (hypothesis) of the request decoders and the config parser, in process.

Whatever bytes or structures arrive, a decoder either returns a request or raises a ``ServerError``
with a 4xx status (the gRPC code the same error maps to); never another exception (a 500) and never
a hang. Bounded: a fixed number of examples each, no deadline per example (shared 2-core machines).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubeinfer.server.config import ConfigError, config_from_dict, parse_config_text, validate_config
from kubeinfer.server.grpc import grpc_service_pb2 as pb
from kubeinfer.server.grpc.converters import request_from_pb
from kubeinfer.server.http.codec import decode_request
from kubeinfer.server.runtime.service import parse_config_override
from kubeinfer.server.vocabulary.errors import ServerError
from kubeinfer.server.vocabulary.limits import Limits

from tests.support.drills import report
from tests.support.fuzzing import PBTXT_PIECES, grpc_requests, http_bodies, json_values

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LIMITS = Limits(max_tensor_elements=1 << 16, max_request_elements=1 << 17)
COUNTS: dict[str, int] = {}
FAILURES: dict[str, int] = {}


def _only_client_errors(kind: str, fn: Any, *args: Any) -> None:
    COUNTS[kind] = COUNTS.get(kind, 0) + 1
    try:
        fn(*args)
    except ServerError as exc:
        if not 400 <= exc.http_status < 500:
            FAILURES[kind] = FAILURES.get(kind, 0) + 1
            raise AssertionError(f"{type(exc).__name__} {exc.http_status}: {exc.message}") from exc
    except Exception:
        FAILURES[kind] = FAILURES.get(kind, 0) + 1
        raise


@FUZZ
@given(http_bodies())
def test_http_decoder(body: tuple[bytes, str | None]) -> None:
    _only_client_errors("http", decode_request, body[0], body[1], "m", "", LIMITS)


@FUZZ
@given(grpc_requests())
def test_grpc_decoder(msg: pb.ModelInferRequest) -> None:
    _only_client_errors("grpc", request_from_pb, msg, LIMITS)


@FUZZ
@given(st.one_of(st.text(max_size=200), st.lists(PBTXT_PIECES, max_size=8).map(" ".join)))
def test_config_parser_and_validator(text: str) -> None:
    def parse_and_validate() -> None:
        try:
            validate_config(parse_config_text(text), "m")
        except ConfigError:
            pass

    _only_client_errors("config", parse_and_validate)


@FUZZ
@given(json_values)
def test_config_override_and_json_config(data: Any) -> None:
    _only_client_errors("override", parse_config_override, json.dumps(data))
    if isinstance(data, dict):

        def json_config() -> None:
            try:
                validate_config(config_from_dict(data), None)
            except ConfigError:
                pass

        _only_client_errors("json config", json_config)


@pytest.fixture(scope="module", autouse=True)
def summary() -> Any:
    yield
    for name, n in sorted(COUNTS.items()):
        report(f"fuzz in-process {name} decoder", inputs=n, crashes=FAILURES.get(name, 0))
