"""The Python backend: Triton ``model.py`` files, each instance in its own stub process (as Triton runs
them) or, for a model that opts in, in the server's own process.

A stub process per instance (``stub_instance``) gives each instance its own interpreter and GIL (two
instances of a pure-Python model run in parallel), its own environment (``EXECUTION_ENV_PATH``), crash
isolation (a segfault fails that instance's requests and restarts it) and memory that comes back when the
model unloads. Tensors cross in shared memory (``ipc``). ``parameters { key: "KUBEINFER_IN_PROCESS"
value: { string_value: "true" } }`` runs a model's instances in the server's process instead
(``inprocess``): no copy and no process hop, and none of the above (docs/backends/python.md).

``auto_complete_config`` runs in a short-lived stub too (Triton's auto-complete stub), so importing
``model.py`` never happens in the server for a stub model.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

from ....config import ConfigError, config_from_dict, config_to_dict, config_to_triton_json, pb, sequence
from ....repository.model_files import pinned
from ....vocabulary.custom_metrics import CustomMetrics
from ....vocabulary.registry_view import RegistryView
from ...base import Backend, BackendInstance, InstanceSpec
from ...settings import setting
from .. import ipc
from ..model_api import context
from ..model_api import triton_python_backend_utils as pb_utils
from ..stub.loader import ModelLoadError, ModelModule
from ..stub.runner import exception_text as exception_text
from . import env_archive, envs
from .inprocess import InProcessHost, PythonInstance
from .stub_instance import StubInstance
from .stub_process import Launch, StubLost, StubProcess

log = logging.getLogger(__name__)

# existing Triton models do `import triton_python_backend_utils as pb_utils` (in-process models)
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

#: the config parameter that runs a model's instances in the server's process
IN_PROCESS = "KUBEINFER_IN_PROCESS"
#: the config parameter naming a model's own environment (Triton's)
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"


def in_process(config: pb.ModelConfig) -> bool:
    param = config.parameters.get(IN_PROCESS)
    return param is not None and param.string_value.strip().lower() in ("1", "true", "yes", "on")


def launch_for(config: pb.ModelConfig, version_path: Path) -> Launch:
    """The interpreter and environment a model's stubs run with, and the backend's stub settings
    (``--backend-config=python,<setting>=<value>``: Triton's ``stub-timeout-seconds`` and
    ``shm-default-byte-size``, and kubeinfer's ``stub-health-interval-seconds``, ``env-archive-max-bytes``
    and ``env-archive-max-entries``)."""
    param = config.parameters.get(EXECUTION_ENV_PATH)
    path = param.string_value if param is not None else ""
    if path:
        limits = env_archive.Limits(
            max_bytes=int(_positive("env-archive-max-bytes", float(env_archive.DEFAULT_MAX_BYTES))),
            max_entries=int(_positive("env-archive-max-entries", float(env_archive.DEFAULT_MAX_ENTRIES))),
        )
        python, env = envs.stub_environment(path, version_path.parent, limits)
    else:
        python, env = sys.executable, envs.base_env()
    return Launch(
        python=python,
        env=env,
        timeout=_positive("stub-timeout-seconds", 30.0),
        health_interval=_positive("stub-health-interval-seconds", 5.0),
        arena_bytes=int(_positive("shm-default-byte-size", float(1 << 20))),
    )


def _positive(key: str, default: float) -> float:
    value = setting("python", key)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"--backend-config python,{key}={value}: not a number") from None
    if number <= 0:
        raise ConfigError(f"--backend-config python,{key}={value}: must be greater than zero")
    return number


class PythonBackend(Backend):
    name: ClassVar[str] = "python"
    #: Triton's python backend sends each output with the datatype and shape execute gave it (an INT64
    #: where the config says INT32, a [1] where it says [-1, -1]); only outputs the config names go out
    checks_outputs: ClassVar[bool] = False

    def __init__(
        self, config: pb.ModelConfig, version_path: Path, version: int, context_view: RegistryView | None = None
    ) -> None:
        super().__init__(config, version_path, version, context_view)
        self.registry = context_view
        self.in_process = in_process(config)
        if self.in_process and context_view is not None:
            context.bind_host(InProcessHost(context_view))
        if self.in_process and EXECUTION_ENV_PATH in config.parameters:
            log.warning(
                "model '%s': %s is ignored: %s runs the model in the server's own interpreter",
                config.name,
                EXECUTION_ENV_PATH,
                IN_PROCESS,
            )
        #: model.py read once, at the load, through the model folder's descriptor (stubs restarted later get it)
        self.code = read_model_code(self.model_file())
        self.metrics: CustomMetrics = context_view.custom_metrics if context_view is not None else CustomMetrics()
        #: custom metric families this load creates belong to it (gone when it unloads)
        self.metrics_owner = f"{config.name}/{version}/{id(self):x}"
        self._launch: Launch | None = None
        self._live = 0
        self._lock = threading.Lock()

    # ---- auto-complete -------------------------------------------------------------------------
    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Let the model's optional ``auto_complete_config`` staticmethod fill inputs/outputs/batching."""
        model_file = cls.model_path(config, version_path)
        if in_process(config):
            completed = _auto_complete_here(config, model_file)
        else:
            completed = _auto_complete_in_stub(config, model_file, launch_for(config, version_path))
        if completed is not None:
            config.CopyFrom(config_from_dict(completed))

    # ---- instances -----------------------------------------------------------------------------
    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        info = context.InstanceInfo(
            model_name=self.config.name,
            model_version=self.version,
            instance_name=spec.instance_name or f"{spec.name}_{spec.index}",
            version_dir=self.version_path,
            metrics_owner=self.metrics_owner,
        )
        instance: BackendInstance
        if self.in_process:
            instance = PythonInstance(self, spec, info)
        else:
            if self._launch is None:
                self._launch = launch_for(self.config, self.version_path)
            loop = self.registry.loop if self.registry is not None and self.registry.loop is not None else None
            instance = StubInstance(
                self,
                info,
                self.initialize_args(spec, info),
                self._launch,
                loop or _private_loop(),
                self.registry,
                self.metrics,
            )
        with self._lock:
            self._live += 1
        return instance

    def output_names(self) -> list[str]:
        names = [t.name for t in self.config.output]
        # implicit state: the sequence batcher reads the state outputs of every step
        return names + sorted(sequence.state_output_names(self.config) - set(names))

    def initialize_args(self, spec: InstanceSpec, info: context.InstanceInfo) -> dict[str, str]:
        """``initialize(args)`` exactly as Triton fills it."""
        return {
            "model_config": config_to_triton_json(self.config),
            "model_instance_kind": spec.kind,
            "model_instance_name": info.instance_name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(self.version_path.parent),
            "model_version": str(self.version),
            "model_name": self.config.name,
        }

    def instance_closed(self) -> None:
        with self._lock:
            self._live -= 1
            last = self._live == 0
        if last:
            self.metrics.remove_owner(self.metrics_owner)


def read_model_code(model_file: Path) -> bytes:
    """model.py's bytes, read through the descriptor the runtime opened for this load (``pinned``): a symlink
    swapped in after the repository check cannot change what runs."""
    try:
        return pinned(model_file).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise ConfigError(f"python model file {model_file} not found") from None


def _auto_complete_here(config: pb.ModelConfig, model_file: Path) -> dict[str, Any] | None:
    label = f"model '{config.name}'"
    try:
        module = ModelModule(model_file, label, read_model_code(model_file))
    except ModelLoadError as exc:
        raise ConfigError(str(exc)) from None
    try:
        hook = getattr(module.model_class, "auto_complete_config", None)
        if hook is None:
            return None
        helper = pb_utils.ModelConfig(config_to_dict(config))
        with module.active():
            try:
                returned = hook(helper)
            except Exception as exc:
                raise ConfigError(f"{label}: auto_complete_config failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(returned, pb_utils.ModelConfig):
            raise ConfigError(
                f"auto_complete_config function in model '{config.name}' must return a valid pb.ModelConfig object."
            )
        return returned.as_dict()
    finally:
        module.unload()


def _auto_complete_in_stub(config: pb.ModelConfig, model_file: Path, launch: Launch) -> dict[str, Any] | None:
    """Triton's auto-complete stub: a process that imports ``model.py``, runs the hook, and ends."""
    code = read_model_code(model_file)
    loop = _private_loop()

    async def run() -> dict[str, Any]:
        proc = StubProcess(loop, config.name, launch, None, CustomMetrics(), "", lambda _p, _r: None)
        await proc.spawn()
        try:
            message = {
                "op": "autocomplete",
                "model_file": str(model_file),
                "code": base64.b64encode(code).decode(),
                "label": f"model '{config.name}'",
                "name": config.name,
                "config": config_to_dict(config),
            }
            return await proc.request(message, ("autocompleted",), launch.timeout * 4)
        finally:
            await proc.stop(finalize=False, timeout=0)

    try:
        answer = asyncio.run_coroutine_threadsafe(run(), loop).result()
    except (StubLost, asyncio.TimeoutError, OSError, ipc.ShmError) as exc:
        raise ConfigError(
            f"model '{config.name}': the auto-complete stub process failed ({type(exc).__name__}: {exc}); its "
            "output is in the server log"
        ) from None
    if "error" in answer:
        raise ConfigError(str(answer["error"]))
    completed = answer.get("config")
    return completed if isinstance(completed, dict) else None


_private: asyncio.AbstractEventLoop | None = None
_private_lock = threading.Lock()


def _private_loop() -> asyncio.AbstractEventLoop:
    """A loop on its own thread for stubs that run outside a server's loop (auto-complete, tools)."""
    global _private
    with _private_lock:
        if _private is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="python-stubs", daemon=True).start()
            _private = loop
        return _private
