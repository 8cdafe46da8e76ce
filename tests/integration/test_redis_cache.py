"""Triton's redis response cache against a real Redis server (tests/support/redis_server.py): hits and misses in
the statistics and metrics, one Redis shared by two servers, password auth, an outage answered as misses, and
Triton's startup errors (triton-inference-server/redis_cache src/redis_cache.cc, qa/L0_response_cache/test.sh).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.runtime.cache import parse_cache_settings
from kubeinfer.server.runtime.redis_cache import MISSING_ADDRESS, RedisConfig
from onnx import TensorProto

from tests.support import models as test_models
from tests.support.redis_server import RedisServer, start_redis
from tests.support.repos import write_model
from tests.support.server import ServerProcess, free_port, start_server
from tests.support.waiting import wait_for

CONFIG = """
name: "cached"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
response_cache { enable: true }
"""
LABELS = '{model="cached",version="1"}'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("redis-cache") / "repo"
    write_model(repo, "cached", CONFIG, {1: test_models.binary("add", "Add", TensorProto.FLOAT, ["batch", 4])})
    return repo


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


def _redis_flags(port: int, *more: str) -> list[str]:
    """Triton's spelling: one ``--cache-config redis,KEY=VALUE`` per key."""
    flags = ["--cache-config", "redis,host=127.0.0.1", "--cache-config", f"redis,port={port}"]
    for item in more:
        flags += ["--cache-config", f"redis,{item}"]
    return flags


@pytest.fixture(scope="module")
def servers(repo: Path, redis: RedisServer) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    first = start_server(repo, *_redis_flags(redis.port), log_dir=repo.parent)
    try:
        second = start_server(repo, *_redis_flags(redis.port, "pool_size=2"), log_dir=repo.parent)
    except BaseException:
        first.terminate()
        raise
    yield first, second
    first.terminate()
    second.terminate()


def _inputs(mod: Any, a: np.ndarray) -> list[Any]:
    inputs = [mod.InferInput("A", list(a.shape), "FP32"), mod.InferInput("B", list(a.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def _infer(server: ServerProcess, a: np.ndarray) -> None:
    out = httpclient.InferenceServerClient(server.http_url).infer("cached", _inputs(httpclient, a)).as_numpy("OUT")
    np.testing.assert_array_equal(out, a + a)


def _counts(server: ServerProcess) -> tuple[int, int, int]:
    """(cache hits, cache misses, executions) of "cached"."""
    stats = httpx.get(f"{server.base_url}/v2/models/cached/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"], stats["execution_count"]


def _delta(before: tuple[int, int, int], after: tuple[int, int, int]) -> tuple[int, ...]:
    return tuple(b - a for a, b in zip(before, after, strict=True))


def _metric(server: ServerProcess, line_start: str) -> float | None:
    for line in httpx.get(server.metrics_url).text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_identical_requests_hit_and_two_servers_share_redis(
    servers: tuple[ServerProcess, ServerProcess], redis: RedisServer
) -> None:
    first, second = servers
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    before1, before2 = _counts(first), _counts(second)
    _infer(first, a)  # a miss: executed and stored
    _infer(first, a)  # a hit
    grpc = grpcclient.InferenceServerClient(second.grpc_url)  # the other server, over gRPC: a hit too
    np.testing.assert_array_equal(grpc.infer("cached", _inputs(grpcclient, a)).as_numpy("OUT"), a + a)
    assert _delta(before1, _counts(first)) == (1, 1, 1)
    assert _delta(before2, _counts(second)) == (1, 0, 0)
    assert (_metric(first, f"nv_cache_num_hits_per_model{LABELS}") or 0) >= 1
    assert (_metric(first, f"nv_cache_num_misses_per_model{LABELS}") or 0) >= 1
    assert (_metric(second, f"nv_cache_hit_duration_per_model{LABELS}") or 0) > 0
    # Triton's redis cache reports no cache-wide gauges (entries and size are Redis's)
    assert _metric(first, "nv_cache_num_entries") is None
    assert _metric(first, "nv_cache_util") is None
    assert b"kubeinfer:response:" in redis.command("KEYS", "kubeinfer:response:*")


def test_other_inputs_miss(servers: tuple[ServerProcess, ServerProcess]) -> None:
    first, _ = servers
    before = _counts(first)
    _infer(first, np.full((1, 4), 5, dtype=np.float32))
    _infer(first, np.full((1, 4), 6, dtype=np.float32))
    assert _delta(before, _counts(first)) == (0, 2, 2)


def test_an_outage_is_a_miss_and_redis_back_hits_again(
    servers: tuple[ServerProcess, ServerProcess], redis: RedisServer
) -> None:
    first, _ = servers
    a = np.full((1, 4), 11, dtype=np.float32)
    _infer(first, a)
    redis.stop()
    try:
        before = _counts(first)
        for _ in range(3):  # every request succeeds: lookups are misses, inserts skipped
            _infer(first, a)
        assert _delta(before, _counts(first)) == (0, 3, 3)
        assert first.log().count("Failed to retrieve key: ") + first.log().count("Failed to insert key: ") == 1
    finally:
        redis.start()  # same port, empty (no persistence)

    def hits_again() -> bool:
        before = _counts(first)
        _infer(first, a)
        return _delta(before, _counts(first))[0] == 1

    wait_for("a cache hit once Redis is back", hits_again, timeout=15, interval=0.3, describe=first.log)
    assert "answers again: the response cache is back" in first.log()


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis-auth"), password="redis123!")
    yield server
    server.stop()


def test_password_from_flag_or_environment(repo: Path, redis_with_password: RedisServer) -> None:
    port = redis_with_password.port
    server = start_server(repo, *_redis_flags(port, "password=redis123!"), log_dir=repo.parent)
    try:
        a = np.full((1, 4), 3, dtype=np.float32)
        before = _counts(server)
        _infer(server, a)
        _infer(server, a)
        assert _delta(before, _counts(server)) == (1, 1, 1)
    finally:
        server.terminate()
    # TRITONCACHE_REDIS_PASSWORD (Triton's environment variable), user "default"
    env = {"TRITONCACHE_REDIS_USERNAME": "default", "TRITONCACHE_REDIS_PASSWORD": "redis123!"}
    server = start_server(repo, *_redis_flags(port), log_dir=repo.parent, env=env)
    try:
        before = _counts(server)
        _infer(server, np.full((1, 4), 3, dtype=np.float32))  # stored by the first server
        assert _delta(before, _counts(server)) == (1, 0, 0)
    finally:
        server.terminate()


def _fails_to_start(repo: Path, *flags: str) -> str:
    server = start_server(repo, *flags, log_dir=repo.parent, wait=False)
    try:
        code = server.proc.wait(90)
    finally:
        server.terminate(10)
    assert code != 0, server.log()
    return server.log()


def test_wrong_or_missing_password_stops_the_server(repo: Path, redis_with_password: RedisServer) -> None:
    port = redis_with_password.port
    log = _fails_to_start(repo, *_redis_flags(port, "password=wrong"))
    assert "Failed to initialize RedisCache: WRONGPASS" in log
    log = _fails_to_start(repo, *_redis_flags(port))
    assert "Failed to initialize RedisCache: NOAUTH" in log


def test_unreachable_redis_stops_the_server(repo: Path) -> None:
    port = free_port()
    log = _fails_to_start(repo, *_redis_flags(port))
    assert f"Failed to initialize RedisCache: failed to connect to Redis (127.0.0.1:{port})" in log
    assert "Connection refused" in log


def test_config_errors_with_tritons_texts() -> None:
    config = parse_cache_settings(["redis,host=r", "redis,port=6380", "redis,db=2", "redis,wait_timeout=50"])
    assert isinstance(config, RedisConfig)
    assert (config.host, config.port, config.db, config.wait_timeout_ms, config.pool_size) == ("r", 6380, 2, 50, 1)
    with pytest.raises(ValueError) as missing:
        parse_cache_settings(["redis,port=6379"])
    assert str(missing.value) == MISSING_ADDRESS
    assert "Must at a minimum specify 'host' and 'port'" in MISSING_ADDRESS
    with pytest.raises(ValueError, match="multiple cache configurations"):
        parse_cache_settings(["local,size=8192", "redis,host=r", "redis,port=1"])
    with pytest.raises(ValueError, match="port must be an integer"):
        parse_cache_settings(["redis,host=r", "redis,port=nonexistent"])
    with pytest.raises(ValueError, match="unknown key"):
        parse_cache_settings(["redis,host=r", "redis,port=1", "redis,size=10"])
    with pytest.raises(ValueError, match="needs redis,tls_enabled=true"):
        parse_cache_settings(["redis,host=r", "redis,port=1", "redis,cacert=/x"])
    assert "secret" not in repr(parse_cache_settings(["redis,host=r", "redis,port=1", "redis,password=secret"]))
