"""The model cache's admission rules (``server/runtime/model_cache.py``) against a fake lifecycle.

Whether a load may start, and what it may unload, is pure bookkeeping around the lifecycle's load and
unload: here a load is an event the test sets, so that the order of things is exact and nothing waits on
a clock. The same rules run against real server processes in tests/integration/test_model_cache_hostile.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubeinfer.server.config import pb
from kubeinfer.server.runtime import footprint
from kubeinfer.server.runtime.lifecycle import ModelEntry, ModelState, VersionState
from kubeinfer.server.runtime.model_cache import CacheSettings, ModelCache, SwapWindow
from kubeinfer.server.vocabulary.errors import InvalidArgument, Unavailable

MiB = 1 << 20


def test_the_swap_window_refuses_past_its_limit_until_the_oldest_leaves_it() -> None:
    window = SwapWindow(2, window=60.0)
    assert window.wait(0.0) == 0.0
    window.record(0.0)
    window.record(10.0)
    assert window.wait(30.0) == pytest.approx(30.0)  # the swap at 0 leaves the window at 60
    assert window.wait(60.0) == 0.0
    window.record(60.0)
    assert window.wait(61.0) == pytest.approx(9.0)  # now the one at 10 is the oldest


def test_a_swap_window_of_zero_is_no_limit() -> None:
    window = SwapWindow(0)
    for t in range(1000):
        window.record(float(t) / 100)
    assert window.wait(10.0) == 0.0


class FakeLifecycle:
    """Loads that finish when the test says so (``release``), each taking ``sizes[name]`` bytes."""

    def __init__(self, load_threads: int = 4) -> None:
        self.models: dict[str, ModelEntry] = {}
        self.load_threads = load_threads
        self.measure_footprint = False
        self.on_demand = False
        self.config_name = ""  # --model-config-name
        self.sizes: dict[str, int] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.unloaded: list[str] = []

    def release(self, name: str) -> None:
        self.gates.setdefault(name, asyncio.Event()).set()

    async def load_model(self, name: str, override: pb.ModelConfig | None = None) -> None:
        entry = self.models.get(name) or self.models.setdefault(name, ModelEntry(name))
        async with entry.lock:
            self.started.append(name)
            entry.states = {1: VersionState(ModelState.LOADING)}
            await self.gates.setdefault(name, asyncio.Event()).wait()
            mv = SimpleNamespace(
                footprint=footprint.Footprint(self.sizes.get(name, MiB)),
                inflight=0,
                scheduler=SimpleNamespace(holds_state=False),
                version=1,
                version_str="1",
            )
            entry.config = pb.ModelConfig(name=name, backend="fake")
            entry.serving = {1: mv}  # type: ignore[dict-item]
            entry.states = {1: VersionState(ModelState.READY)}

    async def unload_model(self, name: str, unload_dependents: bool = False, wait: bool = True) -> None:
        entry = self.models.get(name)
        if entry is not None:
            entry.serving = {}
            entry.states = {1: VersionState(ModelState.UNAVAILABLE, "unloaded")}
            self.unloaded.append(name)

    async def poll(self) -> None:
        pass


class FakeRegistry:
    def __init__(self, repository: Path, lifecycle: FakeLifecycle) -> None:
        self.lifecycle = lifecycle
        self.repository_path = repository

    def resolve(self, name: str, version: str = "", sequence: object = None) -> Any:
        entry = self.lifecycle.models[name]
        if not entry.serving:
            raise Unavailable(f"Request for unknown model: '{name}' has no available versions")
        return entry.serving[1]


def _cache(
    tmp_path: Path, names: list[str], load_threads: int = 4, **settings: Any
) -> tuple[ModelCache, FakeLifecycle]:
    for name in names:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "fake"\n')
    lifecycle = FakeLifecycle(load_threads)
    cache = ModelCache(FakeRegistry(tmp_path, lifecycle), CacheSettings(**settings))  # type: ignore[arg-type]
    return cache, lifecycle


def _run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))


async def _until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0.001)


def test_two_loads_run_at_once_each_within_its_reservation(tmp_path: Path) -> None:
    """A load that does not return does not stop another from starting and finishing (no lock across a
    load); while both run, the budget counts both reservations."""
    cache, lifecycle = _cache(tmp_path, ["slow", "fast"], memory_budget=10 * MiB)

    async def main() -> None:
        slow = asyncio.ensure_future(cache.resolve("slow", ""))
        await _until(lambda: "slow" in lifecycle.started)
        fast = asyncio.ensure_future(cache.resolve("fast", ""))
        await _until(lambda: "fast" in lifecycle.started)
        both = cache.committed()
        assert cache.used().host == 0 and both > 0  # two reservations
        lifecycle.release("fast")
        await fast
        assert not slow.done() and cache.loaded_names() == ["fast"]
        assert cache.committed() == MiB + both // 2  # fast's reading, slow's reservation
        lifecycle.release("slow")
        await slow
        assert cache.loaded_names() == ["fast", "slow"] and cache.committed() == 2 * MiB

    _run(main())


def test_loads_at_once_are_bounded_by_the_load_slots(tmp_path: Path) -> None:
    names = [f"m{i}" for i in range(6)]
    cache, lifecycle = _cache(tmp_path, names)

    async def main() -> None:
        waiting = [asyncio.ensure_future(cache.resolve(n, "")) for n in names]
        await _until(lambda: len(lifecycle.started) == 4)
        await asyncio.sleep(0.01)
        assert len(lifecycle.started) == 4  # --model-load-thread-count
        for n in names:
            lifecycle.release(n)
        await asyncio.gather(*waiting)
        assert sorted(lifecycle.started) == names

    _run(main())


def test_an_abandoned_load_keeps_its_slot_until_it_returns_then_is_unloaded_and_refused(tmp_path: Path) -> None:
    # one load at a time: the abandoned one keeps it
    cache, lifecycle = _cache(tmp_path, ["hang", "other"], load_threads=1, abandon_seconds=0.2, memory_budget=100 * MiB)

    async def main() -> None:
        with pytest.raises(Unavailable, match=r"'hang' has no available versions: its load did not finish within"):
            await cache.resolve("hang", "")
        with pytest.raises(Unavailable, match="not loaded again before that load has returned"):
            await cache.resolve("hang", "")
        assert "was abandoned" in lifecycle.models["hang"].states[1].reason  # what the index shows
        assert cache.used().host == 0 and cache.committed() > 0  # its reservation is still taken
        other = asyncio.ensure_future(cache.resolve("other", ""))
        await asyncio.sleep(0.02)
        assert "other" not in lifecycle.started  # the only slot is the abandoned load's
        lifecycle.release("hang")  # it returns: what it loaded goes, and its slot is free
        lifecycle.release("other")
        await other
        assert lifecycle.unloaded == ["hang"] and "hang" not in cache.loaded_names()
        (row,) = cache.index_rows(["hang"])
        assert row["state"] == "UNAVAILABLE" and "was abandoned" in row["reason"]
        with pytest.raises(Unavailable, match="a request loads it again in"):
            await cache.resolve("hang", "")
        # an explicit load retries at once (and is abandoned again here)
        lifecycle.gates["hang"] = asyncio.Event()
        with pytest.raises(InvalidArgument, match="failed to load 'hang': its load did not finish"):
            await cache.load_pinned("hang")
        lifecycle.release("hang")
        await _until(lambda: cache.known["hang"].orphan is None)
        await asyncio.sleep(0.25)  # the back-off
        lifecycle.gates["hang"] = asyncio.Event()
        lifecycle.release("hang")
        await cache.resolve("hang", "")  # a request loads it again
        assert cache.loaded_names() == ["hang", "other"]

    _run(main())


def test_a_model_over_the_whole_budget_is_refused_by_its_files_or_its_reading(tmp_path: Path) -> None:
    cache, lifecycle = _cache(tmp_path, ["files", "reading", "warm"], memory_budget=4 * MiB)
    (tmp_path / "files" / "1" / "model.bin").write_bytes(b"\0" * (5 * MiB))
    lifecycle.sizes["reading"] = 6 * MiB
    for name in ("files", "reading", "warm"):
        lifecycle.release(name)

    async def main() -> None:
        with pytest.raises(Unavailable, match=r"'files' .* it needs 5\.0 MiB \(estimated from its 5\.0 MiB of files\)"):
            await cache.resolve("files", "")
        assert "files" not in lifecycle.started
        await cache.resolve("warm", "")  # the backend's first load: its reading carries the runtime
        with pytest.raises(Unavailable, match=r"it needs 6\.0 MiB \(measured at its load\), more than the model "):
            await cache.resolve("reading", "")
        assert lifecycle.unloaded[-1] == "reading"
        with pytest.raises(Unavailable, match=r"measured at its last load"):
            await cache.resolve("reading", "")
        assert lifecycle.started.count("reading") == 1
        (row,) = cache.index_rows(["reading"])
        assert "more than the model cache's whole budget of 4.0 MiB" in row["reason"]

    _run(main())


def test_past_the_swap_limit_a_load_that_needs_room_is_refused_and_nothing_is_unloaded(tmp_path: Path) -> None:
    names = ["a", "b", "c", "d"]
    cache, lifecycle = _cache(tmp_path, names, memory_budget=int(2.5 * MiB), swaps_per_minute=1)
    for name in names:
        lifecycle.release(name)

    async def main() -> None:
        await cache.resolve("a", "")
        await cache.resolve("b", "")
        await cache.resolve("c", "")  # the one swap of this minute
        assert lifecycle.unloaded == ["a"]
        with pytest.raises(Unavailable, match=r"--model-cache-swaps-per-minute\); try again in [0-9]+s"):
            await cache.resolve("d", "")
        assert lifecycle.unloaded == ["a"] and cache.loaded_names() == ["b", "c"]
        await cache.load_pinned("d")  # the repository API is not limited
        assert cache.loaded_names() == ["c", "d"]

    _run(main())
