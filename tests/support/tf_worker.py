"""The test SavedModels of ``tf_models``, built and run in one child process.

TensorFlow and torch's compiler stack (openai-triton's LLVM, loaded by ``torch.export``) abort the process
when both are loaded into it, so the pytest process never imports tensorflow: every call here runs in a
spawned worker (started on first use, one per pytest process) and only paths and numpy arrays cross.
Same names as ``tf_models``; modules are named by their class (``save_module("Spin", path)``).
"""

from __future__ import annotations

import atexit
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

#: the input names of ``tf_models.Types`` (the worker checks that both lists agree)
TYPES = ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "flag", "text")
#: TensorFlow's first import and a SavedModel save take seconds; a hung worker fails the test, not the run
TIMEOUT_S = 600

_pool: ProcessPoolExecutor | None = None


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_pool.shutdown)
    return _pool


def _run(name: str, args: tuple[Any, ...]) -> Any:
    """In the worker: ``tf_models.<name>(*args)``."""
    from tests.support import tf_models

    assert tuple(tf_models.TYPES) == TYPES, "tf_worker.TYPES and tf_models.TYPES differ"
    return getattr(tf_models, name)(*args)


def _call(name: str, *args: Any) -> Any:
    return _executor().submit(_run, name, args).result(timeout=TIMEOUT_S)


def save_linear(path: Path, seed: int) -> None:
    _call("save_linear", path, seed)


def save_keras_classifier(path: Path, seed: int) -> None:
    _call("save_keras_classifier", path, seed)


def save_types(path: Path) -> None:
    _call("save_types", path)


def save_module(class_name: str, path: Path) -> None:
    _call("save_named_module", class_name, path)


def reference(path: Path, inputs: dict[str, np.ndarray], signature: str = "serving_default") -> dict[str, np.ndarray]:
    """The signature's outputs, computed by TensorFlow in the worker (eager TF2 loading)."""
    result: dict[str, np.ndarray] = _call("reference", path, inputs, signature)
    return result
