"""API calls are retried with backoff on conflicts, throttling, server errors and lost connections."""

from __future__ import annotations

import threading

import pytest
import urllib3
from kubeinfer.operator.kube.client import retried
from kubernetes.client.exceptions import ApiException


class Calls:
    def __init__(self, errors: list[BaseException], retry_seconds: float = 30.0) -> None:
        self.errors = errors
        self.retry_seconds = retry_seconds
        self.stop = threading.Event()
        self.retries = 0
        self.calls = 0

    @retried
    def call(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_conflicts_server_errors_and_lost_connections_are_retried():
    errors: list[BaseException] = [
        ApiException(status=409, reason="Conflict"),
        ApiException(status=503, reason="Service Unavailable"),
        ApiException(status=429, reason="Too Many Requests"),
        urllib3.exceptions.MaxRetryError(None, "/", "connection refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("connection reset"),
    ]
    c = Calls(errors)
    assert c.call() == "ok"
    assert c.calls == 6 and c.retries == 5


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_spec_errors_are_not(status):
    c = Calls([ApiException(status=status, reason="no")])
    with pytest.raises(ApiException):
        c.call()
    assert c.calls == 1


def test_retries_stop_at_the_deadline_or_on_shutdown():
    c = Calls([ApiException(status=503, reason="down")] * 100, retry_seconds=0.5)
    with pytest.raises(ApiException):
        c.call()
    assert 2 <= c.calls < 10
    stopped = Calls([ApiException(status=503, reason="down")] * 100)
    stopped.stop.set()
    with pytest.raises(ApiException):
        stopped.call()
    assert stopped.calls == 1
