"""Zero-downtime hot reload in poll mode, under continuous load over HTTP and gRPC.

The drill: 8 client threads (4 tritonclient.http, 4 tritonclient.grpc) send requests for its whole
length while the repository changes, written the way the atomic-write contract says (stage under a
dot-name, then rename; config last):

1. add version 2 (latest-1 policy): responses switch to version 2;
2. change the config (max_batch_size, dynamic batching): reloaded, the config API shows it;
3. add a corrupt version 3: version 2 keeps serving, the index shows version 3 UNAVAILABLE and why;
4. remove the model folder: unloaded, then 404 / NOT_FOUND.

Counted: zero failed or wrong responses while the model exists, and readiness never false.
"""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from kubeinfer.server.examples import models
from onnx import TensorProto, helper, numpy_helper

from tests.support.server import ServerProcess, start_server
from tests.support.waiting import wait_for

MODEL = "drill"
CONFIG = """
name: "drill"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
version_policy: {{ latest {{ num_versions: 1 }} }}
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
{extra}
"""
#: what OUTPUT0 adds to INPUT0 + INPUT1, per version: responses prove which version computed them
OFFSET = {"1": 0.0, "2": 100.0}


def add_sub_plus(offset: float) -> onnx.ModelProto:
    """add_sub whose OUTPUT0 is INPUT0 + INPUT1 + offset: a version 2 that computes something else."""
    shape = ["batch", 16]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["sum"]),
            helper.make_node("Add", ["sum", "offset"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub_plus",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("OUTPUT0", "OUTPUT1")],
        initializer=[numpy_helper.from_array(np.array([offset], np.float32), "offset")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# ---- writers that follow the atomic-write contract (server/repository/layout.py) ---------------------
def stage_model(repo: Path, name: str, config: str, versions: dict[int, bytes]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.staging-", dir=repo))
    (staging / "config.pbtxt").write_text(config)
    for v, data in versions.items():
        (staging / str(v)).mkdir()
        (staging / str(v) / "model.onnx").write_bytes(data)
    os.rename(staging, repo / name)


def stage_version(model_dir: Path, version: int, data: bytes) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.staging-", dir=model_dir))
    (staging / "model.onnx").write_bytes(data)
    os.rename(staging, model_dir / str(version))


def replace_config(model_dir: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".config.pbtxt.tmp-", dir=model_dir)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, model_dir / "config.pbtxt")


def remove_model(repo: Path, name: str) -> None:
    doomed = repo / f".{name}.removing-{os.getpid()}"
    os.rename(repo / name, doomed)
    shutil.rmtree(doomed)


# ---- load generator ---------------------------------------------------------------------------------
#: client threads, each numbered by its random seed
HTTP_CLIENTS, GRPC_CLIENTS = range(4), range(10, 14)
CLIENTS = {*HTTP_CLIENTS, *GRPC_CLIENTS}


@dataclass
class Outcome:
    #: the client thread's number: one thread's requests are sequential
    client: int
    started: float
    at: float
    protocol: str
    version: str = ""
    error: str = ""


@dataclass
class Load:
    server: ServerProcess
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: list[Outcome] = field(default_factory=list)
    not_ready: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def record(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def snapshot(self) -> list[Outcome]:
        with self.lock:
            return list(self.outcomes)

    def client_loop(self, protocol: str, seed: int) -> None:
        module = httpclient if protocol == "http" else grpcclient
        url = self.server.http_url if protocol == "http" else self.server.grpc_url
        client = module.InferenceServerClient(url)
        rng = np.random.default_rng(seed)
        try:
            while not self.stop.is_set():
                a = rng.standard_normal((2, 16)).astype(np.float32)
                b = rng.standard_normal((2, 16)).astype(np.float32)
                inputs = [module.InferInput("INPUT0", [2, 16], "FP32"), module.InferInput("INPUT1", [2, 16], "FP32")]
                inputs[0].set_data_from_numpy(a)
                inputs[1].set_data_from_numpy(b)
                started = time.monotonic()
                try:
                    result = client.infer(MODEL, inputs)
                except Exception as exc:  # every failure is counted
                    self.record(Outcome(seed, started, time.monotonic(), protocol, error=str(exc)))
                    time.sleep(0.02)  # pacing after a refusal, not synchronisation
                    continue
                response = result.get_response()
                version = response["model_version"] if protocol == "http" else response.model_version
                expected = a + b + OFFSET.get(version, np.nan)
                if version not in OFFSET or not np.allclose(result.as_numpy("OUTPUT0"), expected, atol=1e-4):
                    error = f"wrong result from v{version}"
                elif not np.allclose(result.as_numpy("OUTPUT1"), a - b, atol=1e-5):
                    error = "wrong OUTPUT1"
                else:
                    error = ""
                self.record(Outcome(seed, started, time.monotonic(), protocol, version, error))
        finally:
            client.close()

    def readiness_loop(self) -> None:
        with httpx.Client(base_url=self.server.base_url, timeout=10) as http:
            while not self.stop.is_set():
                try:
                    status = http.get("/v2/health/ready").status_code
                    if status != 200:
                        self.not_ready.append(f"HTTP {status}")
                except httpx.HTTPError as exc:
                    self.not_ready.append(repr(exc))
                time.sleep(0.05)

    def start(self) -> None:
        targets: list[tuple[Callable[..., None], tuple]] = [(self.readiness_loop, ())]
        targets += [(self.client_loop, ("http", i)) for i in HTTP_CLIENTS]
        targets += [(self.client_loop, ("grpc", i)) for i in GRPC_CLIENTS]
        for fn, args in targets:
            t = threading.Thread(target=fn, args=args, daemon=True)
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 90, server: ServerProcess | None = None) -> None:
    """The drill's wait: a longer bound under load, and the server's log when it fails."""
    wait_for(what, check, timeout, describe=(lambda: server.log()[-4000:]) if server else None)


def index(server: ServerProcess) -> dict[str, dict]:
    rows = httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
    return {r.get("version", ""): r for r in rows if r["name"] == MODEL}


def served_after(load: Load, since: float, protocol: str, version: str) -> bool:
    """A request of ``protocol`` sent after ``since`` was answered by ``version``."""
    return any(
        o.started > since and o.protocol == protocol and o.version == version and not o.error for o in load.snapshot()
    )


def every_client_sent_since(load: Load, since: float) -> bool:
    """Every client thread has an answer to a request sent after ``since``: as one thread's requests are
    sequential, everything the clients sent before ``since`` has been answered and recorded."""
    return {o.client for o in load.snapshot() if o.started > since} == CLIENTS


def load_failures(server: ServerProcess, version: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in httpx.get(server.metrics_url, timeout=10).text.splitlines()
        if line.startswith("kubeinfer_model_load_failures") and f'model="{MODEL}"' in line and f'"{version}"' in line
    ]


def test_reload_drill_under_load(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    model_dir = repo / MODEL
    v1 = add_sub_plus(0).SerializeToString()
    stage_model(repo, MODEL, CONFIG.format(max_batch_size=8, extra=""), {1: v1})
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5", log_dir=tmp_path)
    load = Load(server)
    try:
        load.start()
        t0 = time.monotonic()
        for protocol in ("http", "grpc"):
            wait_until(f"{protocol} clients served by version 1", lambda p=protocol: served_after(load, t0, p, "1"))

        # 1. a new version under the latest-1 policy: traffic moves to it, version 1 unloads
        t1 = time.monotonic()
        stage_version(model_dir, 2, add_sub_plus(OFFSET["2"]).SerializeToString())
        for protocol in ("http", "grpc"):
            wait_until(
                f"{protocol} clients served by version 2",
                lambda p=protocol: served_after(load, t1, p, "2"),
                server=server,
            )
        switched = min(o.at for o in load.snapshot() if o.version == "2")
        wait_until("version 1 unloaded", lambda: index(server).get("1", {}).get("state") in (None, "UNAVAILABLE"))
        unloaded = time.monotonic()
        wait_until("every client answered after the unload", lambda: every_client_sent_since(load, unloaded))
        # a request sent after a version 2 answer came back was routed after the switch: never version 1
        late_v1 = [o for o in load.snapshot() if o.version == "1" and o.started > switched]
        assert not late_v1, f"version 1 still answered {len(late_v1)} requests after the switch"

        # 2. a config change (config last, atomic replace): reloaded with the new settings
        replace_config(
            model_dir, CONFIG.format(max_batch_size=16, extra="dynamic_batching { max_queue_delay_microseconds: 1000 }")
        )
        config_url = f"{server.base_url}/v2/models/{MODEL}/config"
        wait_until(
            "config API shows max_batch_size 16",
            lambda: httpx.get(config_url, timeout=10).json().get("max_batch_size") == 16,
            server=server,
        )
        assert "dynamic_batching" in httpx.get(config_url, timeout=10).json()
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc.get_model_config(MODEL).config.max_batch_size == 16
        reloaded = time.monotonic()
        for protocol in ("http", "grpc"):
            wait_until(
                f"{protocol} clients served after the config reload",
                lambda p=protocol: served_after(load, reloaded, p, "2"),
            )

        # 3. a corrupt version 3: version 2 keeps serving; the index says why version 3 is unavailable
        stage_version(model_dir, 3, b"this is not an ONNX model")
        wait_until(
            "index shows version 3 UNAVAILABLE",
            lambda: index(server).get("3", {}).get("state") == "UNAVAILABLE",
            server=server,
        )
        rows = index(server)
        assert rows["3"]["reason"], rows
        assert "ONNX" in rows["3"]["reason"] or "onnx" in rows["3"]["reason"], rows["3"]["reason"]
        assert rows["2"]["state"] == "READY", rows
        grpc_rows = {m.version: m for m in grpc.get_model_repository_index().models if m.name == MODEL}
        assert grpc_rows["3"].state == "UNAVAILABLE" and grpc_rows["3"].reason == rows["3"]["reason"]
        assert httpx.get(f"{server.base_url}/v2/models/{MODEL}/versions/2/ready", timeout=10).status_code == 200
        assert load_failures(server, "3") == [1], "load failure metric missing"
        # two more polls (each one loads a new witness model): the failure is not retried into an outage
        failed_at = time.monotonic()
        for witness in ("witness1", "witness2"):
            stage_model(repo, witness, CONFIG.format(max_batch_size=8, extra="").replace(MODEL, witness), {1: v1})
            wait_until(
                f"{witness} loaded by a later poll",
                lambda w=witness: httpx.get(f"{server.base_url}/v2/models/{w}/ready", timeout=10).status_code == 200,
                server=server,
            )
        assert load_failures(server, "3") == [1], "an unchanged failed version was loaded again"
        for protocol in ("http", "grpc"):
            wait_until(
                f"{protocol} clients served by version 2", lambda p=protocol: served_after(load, failed_at, p, "2")
            )

        # 4. the folder goes away: unloaded, then 404 / NOT_FOUND
        removed_at = time.monotonic()
        remove_model(repo, MODEL)

        def not_found_everywhere() -> bool:
            recent = [o for o in load.snapshot() if o.started > removed_at]
            http_404 = any(o.protocol == "http" and o.error.startswith("[404]") for o in recent)
            grpc_nf = any(o.protocol == "grpc" and o.error.startswith("[StatusCode.NOT_FOUND]") for o in recent)
            return http_404 and grpc_nf

        wait_until("404 / NOT_FOUND after removal", not_found_everywhere, server=server)
        assert MODEL not in {
            r["name"] for r in httpx.post(f"{server.base_url}/v2/repository/index", json={}, timeout=10).json()
        }
        assert httpx.get(f"{server.base_url}/v2/models/{MODEL}/ready", timeout=10).status_code != 200
        grpc.close()
    finally:
        load.join()
        code = server.terminate()

    outcomes = load.snapshot()
    before_removal = [o for o in outcomes if o.at < removed_at]
    failed = [o for o in before_removal if o.error]
    ok = [o for o in before_removal if not o.error]
    assert not failed, (
        f"{len(failed)} failed requests while the model existed, e.g. {failed[:5]}\n{server.log()[-4000:]}"
    )
    assert {o.protocol for o in ok} == {"http", "grpc"}
    assert len(ok) > 200, f"only {len(ok)} requests made it: the load was not continuous"
    assert not load.not_ready, f"readiness went false: {load.not_ready[:5]}"
    assert code == 0
    print(f"\nreload drill: {len(ok)} successful requests, 0 failed; versions seen {sorted({o.version for o in ok})}")


def test_unload_releases_instances(tmp_path: Path) -> None:
    """After a reload the old version's ONNX Runtime sessions are closed and garbage: memory goes back.

    In-process on purpose: a weak reference is the one exact way to see that nothing still holds the
    session (RSS is too noisy to assert on).
    """
    from kubeinfer.server.runtime.registry import ModelRegistry

    repo = tmp_path / "repo"
    repo.mkdir()
    stage_model(repo, MODEL, CONFIG.format(max_batch_size=8, extra=""), {1: models.add_sub(16).SerializeToString()})

    async def scenario() -> None:
        registry = ModelRegistry(repo)
        await registry.load_model(MODEL)
        old = registry.resolve(MODEL)
        sessions = [weakref.ref(inst.session) for inst in old.pool.instances]
        assert all(ref() is not None for ref in sessions)
        stage_version(repo / MODEL, 2, add_sub_plus(OFFSET["2"]).SerializeToString())
        await registry.poll()
        assert registry.resolve(MODEL).version == 2
        # the old version retires in the background once drained
        await asyncio.gather(*registry.lifecycle.background)
        assert old.closed and old.pool.instances == []
        del old
        gc.collect()
        assert all(ref() is None for ref in sessions), "an unloaded session is still referenced"
        await registry.shutdown(10)

    asyncio.run(scenario())


def test_index_reports_the_config_each_version_was_loaded_from(tmp_path: Path) -> None:
    """A writer that replaced only config.pbtxt can tell when the server serves it: the HTTP index row
    of a serving version carries the sha1 of the config it was loaded from (gRPC keeps Triton's fields)."""
    import hashlib

    repo = tmp_path / "repo"
    repo.mkdir()
    model_dir = repo / MODEL
    first = CONFIG.format(max_batch_size=8, extra="")
    stage_model(repo, MODEL, first, {1: add_sub_plus(0).SerializeToString()})
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5", log_dir=tmp_path)
    try:
        digest = lambda text: hashlib.sha1(text.encode()).hexdigest()  # noqa: E731
        wait_until("version 1 READY", lambda: index(server).get("1", {}).get("state") == "READY", server=server)
        assert index(server)["1"]["config_digest"] == digest(first)

        second = CONFIG.format(max_batch_size=16, extra="")
        replace_config(model_dir, second)
        wait_until(
            "the new config's digest", lambda: index(server)["1"].get("config_digest") == digest(second), server=server
        )
        assert index(server)["1"]["state"] == "READY" and index(server)["1"]["reason"] == ""

        # a config the server refuses: the old one keeps serving, and the row says so
        broken = CONFIG.format(max_batch_size=16, extra="dynamic_batching { preferred_batch_size: [ 64 ] }")
        replace_config(model_dir, broken)
        wait_until(
            "reload failure in the index",
            lambda: index(server)["1"]["reason"].startswith("reload failed"),
            server=server,
        )
        row = index(server)["1"]
        assert row["state"] == "READY" and row["config_digest"] == digest(second)

        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        (entry,) = [m for m in grpc.get_model_repository_index().models if m.name == MODEL]
        assert entry.state == "READY" and entry.version == "1"
        grpc.close()
    finally:
        server.terminate()
