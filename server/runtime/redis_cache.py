"""Triton's ``redis`` response cache: ``--cache-config redis,host=H --cache-config redis,port=P ...``.

Settings, defaults and startup errors follow triton-inference-server/redis_cache (README.md "Available
Configuration Options", src/redis_cache.cc ``RedisCache::Create``) and qa/L0_response_cache/test.sh:

* ``host`` and ``port`` are required; ``user`` (default ``default``), ``password``, ``db`` (0),
  ``connect_timeout`` / ``socket_timeout`` (milliseconds, 0 waits forever), ``pool_size`` (1 connection) and
  ``wait_timeout`` (milliseconds to wait for a pooled connection, 1000); the environment variables
  ``TRITONCACHE_REDIS_USERNAME`` / ``TRITONCACHE_REDIS_PASSWORD`` give credentials a flag overrides;
  ``tls_enabled=true`` with ``cert``, ``key``, ``cacert``, ``cacert_dir``.
* The server PINGs Redis at startup and does not start when it cannot (Triton: "Failed to initialize
  RedisCache: ..." with Redis's own NOAUTH / WRONGPASS texts).
* Once running, a failed lookup is a miss and a failed insert is skipped (Triton logs "Failed to retrieve
  key: ..." / "Failed to insert key: ..." and executes the request): a Redis outage never fails a request.
  We log the first error of an outage and its end (not every request), and while Redis is down we try it
  again at most every ``RETRY_SECONDS`` instead of paying a connection timeout on every request.
* Redis has no size here: its own ``maxmemory`` and eviction policy bound it, and entries have no expiry
  (Triton sets none). Triton's redis cache reports no cache-wide ``nv_cache_*`` gauges; the per-model hit and
  miss counts and durations (statistics and ``nv_cache_*_per_model``) are reported as for the local cache.

Differences: the key is our BLAKE2b request key (server/runtime/cache.py ``request_key``) under the prefix
``kubeinfer:response:``, and an entry is one Redis string in our own layout, not Triton's hash of buffers:
a Redis shared with Triton servers is safe, but they never answer each other's requests. ``connect_timeout``
and ``socket_timeout`` default to 1000 ms (Triton: 0, forever) so that a hung Redis cannot hold requests;
unknown keys and non-numeric numbers are refused (Triton ignores the first and reads the second as 0);
``sni`` is refused (the client sends ``host`` as the TLS server name).
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ..vocabulary import tensors
from .cache import ResponseCache

log = logging.getLogger("kubeinfer.server.cache")

#: the prefix of every entry's Redis key
KEY_PREFIX = b"kubeinfer:response:"
#: the layout of an entry: magic, header length, JSON header ([name, datatype, shape, nbytes] per output), data
MAGIC = b"KIRC1"
#: while Redis is unreachable, how often a request tries it again (the others are misses without I/O)
RETRY_SECONDS = 1.0

USERNAME_ENV = "TRITONCACHE_REDIS_USERNAME"
PASSWORD_ENV = "TRITONCACHE_REDIS_PASSWORD"

#: Triton's error when host or port is missing (src/redis_cache.cc)
MISSING_ADDRESS = (
    "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and 'port' in the "
    "configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config redis,port=6379 "
    "--model-repository=/models ..."
)

_INTEGERS = {"port", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout"}
_STRINGS = {"host", "user", "password", "cert", "key", "cacert", "cacert_dir"}
KEYS = _INTEGERS | _STRINGS | {"tls_enabled"}


class RedisCacheError(RuntimeError):
    """The cache could not be set up (the server does not start)."""


@dataclass(frozen=True, slots=True)
class RedisConfig:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    db: int = 0
    connect_timeout_ms: int = 1000
    socket_timeout_ms: int = 1000
    pool_size: int = 1
    wait_timeout_ms: int = 1000
    tls_enabled: bool = False
    cert: str | None = None
    key: str | None = None
    cacert: str | None = None
    cacert_dir: str | None = None

    def __repr__(self) -> str:  # never the password
        return f"RedisConfig(host={self.host!r}, port={self.port}, db={self.db}, tls={self.tls_enabled})"


def redis_config(settings: dict[str, str], env: dict[str, str] | None = None) -> RedisConfig:
    """The settings of every ``--cache-config redis,KEY=VALUE`` (the last of a key wins) → the cache's config."""
    env = dict(os.environ) if env is None else env
    for key in settings:
        if key == "sni":
            raise ValueError("--cache-config redis,sni=...: not supported (the TLS server name sent is the host)")
        if key not in KEYS:
            raise ValueError(f"--cache-config redis,{key}=...: unknown key (known: {', '.join(sorted(KEYS))})")
    if "host" not in settings or "port" not in settings:
        raise ValueError(MISSING_ADDRESS)
    numbers: dict[str, int] = {}
    for key in _INTEGERS & settings.keys():
        try:
            numbers[key] = int(settings[key])
        except ValueError:
            raise ValueError(f"--cache-config redis,{key}={settings[key]}: {key} must be an integer") from None
        if numbers[key] < 0:
            raise ValueError(f"--cache-config redis,{key}={settings[key]}: {key} must not be negative")
    if not 0 < numbers["port"] < 65536:
        raise ValueError(f"--cache-config redis,port={settings['port']}: not a TCP port")
    if numbers.get("pool_size", 1) < 1:
        raise ValueError("--cache-config redis,pool_size=0: the pool needs at least one connection")
    tls = settings.get("tls_enabled", "false")
    if tls not in ("true", "false"):
        raise ValueError(f"--cache-config redis,tls_enabled={tls}: true or false")
    tls_files = {k: settings[k] for k in ("cert", "key", "cacert", "cacert_dir") if k in settings}
    if tls_files and tls != "true":  # Triton reads them only with tls_enabled=true: say so instead of ignoring
        raise ValueError(f"--cache-config redis,{next(iter(tls_files))}=...: needs redis,tls_enabled=true")
    return RedisConfig(
        host=settings["host"],
        port=numbers["port"],
        user=settings.get("user", env.get(USERNAME_ENV)) or None,
        password=settings.get("password", env.get(PASSWORD_ENV)) or None,
        db=numbers.get("db", 0),
        connect_timeout_ms=numbers.get("connect_timeout", 1000),
        socket_timeout_ms=numbers.get("socket_timeout", 1000),
        pool_size=numbers.get("pool_size", 1),
        wait_timeout_ms=numbers.get("wait_timeout", 1000),
        tls_enabled=tls == "true",
        **tls_files,
    )


def serialize(outputs: dict[str, np.ndarray]) -> bytes:
    """One entry's value: names, datatypes, shapes and raw bytes of ``outputs``."""
    header = []
    parts: list[bytes | memoryview] = []
    for name, array in outputs.items():
        raw = tensors.to_raw(array)
        header.append([name, tensors.v2_datatype(array), list(array.shape), len(raw)])
        parts.append(raw)
    head = orjson.dumps(header)
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, *parts])


def deserialize(value: bytes) -> dict[str, np.ndarray]:
    if not value.startswith(MAGIC):
        raise ValueError("not an entry of this server's layout")
    start = len(MAGIC) + 4
    (length,) = struct.unpack_from("<I", value, len(MAGIC))
    header = orjson.loads(value[start : start + length])
    view = memoryview(value)
    offset = start + length
    outputs: dict[str, np.ndarray] = {}
    for name, datatype, shape, nbytes in header:
        outputs[name] = tensors.from_raw(name, datatype, shape, view[offset : offset + nbytes])
        offset += nbytes
    if offset != len(value):
        raise ValueError("entry length does not match its header")
    return outputs


def _redis_key(key: bytes) -> bytes:
    return KEY_PREFIX + key.hex().encode()


class RedisResponseCache(ResponseCache):
    """Response outputs in Redis, shared by every model of this server and by every server on the same Redis.

    ``lookup`` and ``insert`` do blocking I/O: callers on the event loop run them in a thread (``remote``).
    """

    remote = True

    def __init__(self, config: RedisConfig) -> None:
        super().__init__(0)
        import redis  # only servers with a redis cache import the client

        self.config = config
        self.errors = 0
        self._down = False
        self._retry_at = 0.0
        self._state = threading.Lock()
        options: dict[str, Any] = {
            "host": config.host,
            "port": config.port,
            "db": config.db,
            "username": config.user,
            "password": config.password,
            "socket_timeout": config.socket_timeout_ms / 1000 or None,
            "socket_connect_timeout": config.connect_timeout_ms / 1000 or None,
            "max_connections": config.pool_size,
            "timeout": config.wait_timeout_ms / 1000,
        }
        if config.tls_enabled:
            options |= {
                "connection_class": redis.SSLConnection,
                "ssl_certfile": config.cert,
                "ssl_keyfile": config.key,
                "ssl_ca_certs": config.cacert,
                "ssl_ca_path": config.cacert_dir,
            }
        self._pool = redis.BlockingConnectionPool(**options)  # type: ignore[no-untyped-call]
        self._client = redis.Redis(connection_pool=self._pool)
        self._redis = redis

    @property
    def enabled(self) -> bool:
        return True

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    def connect(self) -> None:
        """PING Redis (Triton does at startup); RedisCacheError with Triton's texts when it does not answer."""
        r = self._redis
        try:
            self._client.ping()
        except r.AuthenticationError as exc:  # redis-py strips the error code Triton's message keeps
            code = "WRONGPASS" if self.config.password else "NOAUTH"
            raise RedisCacheError(f"Failed to initialize RedisCache: {code} {exc}") from None
        except r.ConnectionError as exc:
            raise RedisCacheError(
                f"Failed to initialize RedisCache: failed to connect to Redis ({self.address}): {exc}"
            ) from None
        except r.RedisError as exc:
            raise RedisCacheError(f"Failed to initialize RedisCache: {exc}") from None
        log.info("response cache: Redis at %s (db %d)", self.address, self.config.db)

    def close(self) -> None:
        self._pool.disconnect()

    def _skip(self) -> bool:
        """True while Redis is down and not yet due for another try."""
        with self._state:
            if not self._down or time.monotonic() >= self._retry_at:
                if self._down:
                    self._retry_at = time.monotonic() + RETRY_SECONDS  # one request tries; the others skip
                return False
            return True

    def _failed(self, what: str, key: bytes, exc: Exception) -> None:
        with self._state:
            self.errors += 1
            first = not self._down
            if isinstance(exc, self._redis.RedisError):  # a broken entry is no outage
                self._down = True
                self._retry_at = time.monotonic() + RETRY_SECONDS
        if first:
            log.warning(
                "%s key: %s. %s: %s (Redis at %s: lookups are misses and inserts are skipped until it answers)",
                what,
                key.hex(),
                type(exc).__name__,
                exc,
                self.address,
            )

    def _answered(self) -> None:
        if self._down:
            with self._state:
                was_down, self._down = self._down, False
            if was_down:
                log.warning("Redis at %s answers again: the response cache is back", self.address)

    def lookup(self, key: bytes) -> dict[str, np.ndarray] | None:
        start = time.perf_counter_ns()
        outputs = None
        if not self._skip():
            try:
                value = self._client.get(_redis_key(key))
                self._answered()
                if value is not None:
                    assert isinstance(value, bytes)  # the client does not decode responses
                    outputs = deserialize(value)
            except Exception as exc:  # an outage or a broken entry: a miss, never a failed request
                self._failed("Failed to retrieve", key, exc)
        with self._lock:
            self.lookups += 1
            if outputs is None:
                self.misses += 1
            else:
                self.hits += 1
            self.lookup_ns += time.perf_counter_ns() - start
        return outputs

    def insert(self, key: bytes, outputs: dict[str, np.ndarray]) -> bool:
        start = time.perf_counter_ns()
        stored = False
        if not self._skip():
            try:
                self._client.set(_redis_key(key), serialize(outputs))
                self._answered()
                stored = True
            except Exception as exc:
                self._failed("Failed to insert", key, exc)
        with self._lock:
            self.inserts += stored
            self.insertion_ns += time.perf_counter_ns() - start
        return stored

    @property
    def entries(self) -> int:
        return 0  # not known without asking Redis (DBSIZE counts other keys too); Triton reports none

    @property
    def utilization(self) -> float:
        return 0.0
