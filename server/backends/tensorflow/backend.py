"""The ``tensorflow`` backend: platforms ``tensorflow_savedmodel`` (``<version>/model.savedmodel/``) and
``tensorflow_graphdef`` (``<version>/model.graphdef``); see the package docstring."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np

from ...config import ConfigError, pb, sequence
from ...repository.model_files import pinned, pinned_tree
from ...vocabulary.errors import BackendError, Unavailable
from .. import settings
from ..base import Backend, BackendInstance, InstanceSpec, TensorBackendInstance
from . import graphdef, savedmodel
from .parameters import BACKEND, TFParameters, parse_parameters
from .savedmodel import Signature, shape_text

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install kubeinfer[tensorflow]"


def require_tensorflow() -> Any:
    # TensorFlow's C++ INFO lines (CPU features, oneDNN) on every start; warnings and errors still show
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise Unavailable(f"tensorflow is not installed: {INSTALL_HINT} ({exc})") from None
    return tf


def saved_model_folder(config: pb.ModelConfig, version_path: Path) -> tuple[Path, Path]:
    """(the folder to read, the path to name in messages): during a load the first is the repository's
    descriptor-pinned mirror of the SavedModel (``model_files.pinned_tree``)."""
    shown = TensorFlowBackend.model_path(config, version_path)
    try:
        return pinned_tree(shown), shown
    except FileNotFoundError:
        raise ConfigError(f"unable to find '{shown}' for model '{config.name}'") from None
    except NotADirectoryError:
        raise ConfigError(
            f"unable to load model '{config.name}': '{shown}' is not a folder (a SavedModel is one)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"unable to load model '{config.name}': {exc.strerror or exc}") from None


def read_signature(config: pb.ModelConfig, version_path: Path, params: TFParameters | None = None) -> Signature:
    """The serving signature the config selects (TF_GRAPH_TAG, TF_SIGNATURE_DEF), from saved_model.pb."""
    require_tensorflow()
    params = params or parse_parameters(config)
    folder, shown = saved_model_folder(config, version_path)
    saved = savedmodel.read_saved_model(folder, shown, config.name)
    tag = params.graph_tag or savedmodel.DEFAULT_TAG
    graph = savedmodel.meta_graph(saved, tag, config.name)
    key = params.signature_def or savedmodel.DEFAULT_SIGNATURE
    return savedmodel.signature(graph, key, bool(params.signature_def), tag, config.name)


def read_graph(config: pb.ModelConfig, version_path: Path) -> graphdef.Graph:
    """The GraphDef of a ``tensorflow_graphdef`` model, read through the repository's descriptor (``pinned``)."""
    require_tensorflow()
    shown = TensorFlowBackend.model_path(config, version_path)
    try:
        path = pinned(shown)
    except FileNotFoundError:
        raise ConfigError(f"unable to find '{shown}' for model '{config.name}'") from None
    except OSError as exc:
        raise ConfigError(f"unable to load model '{config.name}': {exc.strerror or exc}") from None
    return graphdef.read_graph(path, shown, config.name)


def _dims(t: pb.ModelInput | pb.ModelOutput) -> list[int]:
    return list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)


def _compare_dims(model: str, tensor: savedmodel.Tensor, dims: list[int], batching: bool, exact: bool) -> None:
    """Triton's CompareDims (tensorflow_utils.cc), with its messages."""
    shape = tensor.shape
    if batching:
        if not shape or shape[0] != -1:
            raise ConfigError(
                f"model '{model}', tensor '{tensor.name}': for the model to support batching the shape should have "
                "at least 1 dimension and the first dimension must be -1; but shape expected by the model is "
                f"{shape_text(shape)}"
            )
        full = [-1, *dims]
    else:
        full = dims
    fits = len(shape) == len(full) and all(m == c for m, c in zip(shape, full, strict=True) if exact or m != -1)
    if fits:
        return
    if batching:
        detail = (
            f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 followed by the "
            f"explicit tensor shape, making complete shape {shape_text(full)})"
        )
    else:
        detail = f"{len(full)} dimensions (shape {shape_text(full)})"
    raise ConfigError(
        f"model '{model}', tensor '{tensor.name}': the model expects {len(shape)} dimensions (shape "
        f"{shape_text(shape)}) but the model configuration specifies {detail}"
    )


def _wire_type(config_type: str) -> str:
    """Triton prints a model's type as TYPE_ + TRITONSERVER_DataTypeString: TYPE_BYTES for strings."""
    return "TYPE_BYTES" if config_type == "TYPE_STRING" else config_type


class TensorFlowBackend(Backend):
    name: ClassVar[str] = BACKEND

    def __init__(self, config: pb.ModelConfig, version_path: Path, version: int, context: Any = None) -> None:
        super().__init__(config, version_path, version, context)
        self.params = parse_parameters(config)
        self._sessions = _Sessions()
        self._graph: graphdef.Graph | None = None  # a GraphDef model's graph, read by the first session
        self._graph_lock = threading.Lock()

    @classmethod
    def auto_complete_config(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's AutoCompleteHelper: ``max_batch_size`` (the backend's default-max-batch-size when every
        signature tensor has a variable first dimension), dynamic batching, and inputs/outputs from the
        signature. An explicit ``max_batch_size: 0`` stays 0 (Triton cannot tell it from an absent one).
        A GraphDef gives nothing to fill (no shapes, no outputs): as in Triton, its config stays as written."""
        if graphdef.is_graphdef(config):
            return
        sig = read_signature(config, version_path)
        name = config.name
        signature_batches = all(t.batches for t in sig.inputs + sig.outputs)
        explicit = config.HasField("max_batch_size")
        if not signature_batches and config.max_batch_size > 0:
            raise ConfigError(
                f"unable to autofill for '{name}', configuration specified max-batch {config.max_batch_size} but "
                "model signature does not support batching"
            )
        batching = signature_batches
        if signature_batches and not explicit:
            hint: bool | None = None
            for hinted, find in ((config.input, sig.input), (config.output, sig.output)):
                for given in hinted:
                    dims, model_tensor = _dims(given), find(given.name)
                    if not dims or model_tensor is None:
                        continue
                    should = model_tensor.rank == len(dims) + 1
                    if hint is not None and hint != should:
                        raise ConfigError(
                            f"unable to autofill for '{name}', model tensor configurations are contradicting each "
                            "other in terms of whether batching is supported"
                        )
                    hint = should
            batching = batching if hint is None else hint
        if not explicit:
            config.max_batch_size = max(settings.default_max_batch_size(BACKEND), 0) if batching else 0
            if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
                config.dynamic_batching.SetInParent()
        skip = 1 if config.max_batch_size > 0 else 0
        injected = sequence.injected_input_names(config)
        for declared, found in ((config.input, sig.inputs), (config.output, sig.outputs)):
            known: dict[str, pb.ModelInput | pb.ModelOutput] = {t.name: t for t in declared}
            for tensor in found:
                t = known.get(tensor.name)
                if t is None:
                    if known or tensor.name in injected:
                        continue  # a partial list is the user's choice; the sequence batcher feeds controls
                    t = declared.add(name=tensor.name)
                if t.data_type == pb.TYPE_INVALID:
                    t.data_type = cast(pb.DataType, pb.DataType.Value(tensor.data_type))
                if not t.dims and not t.HasField("reshape"):
                    if tensor.rank == 0:
                        raise ConfigError(
                            f"Unable to autofill for '{name}': the rank of model tensor '{tensor.name}' is 0 which is "
                            "not supported"
                        )
                    dims = tensor.shape[skip:]
                    t.dims.extend(dims or [1])
                    if not dims:  # a [batch] tensor: dims [1] with an empty reshape, as Triton fills it
                        t.reshape.SetInParent()

    @classmethod
    def validate_model(cls, config: pb.ModelConfig, version_path: Path) -> None:
        """Triton's ValidateModelConfig and savedmodel:: / graphdef::ValidateTRITONTFModel, with their messages."""
        name = config.name
        tensors: list[pb.ModelInput | pb.ModelOutput] = [*config.input, *config.output]
        for t in tensors:
            dtype = pb.DataType.Name(t.data_type)
            if dtype not in savedmodel.SUPPORTED_CONFIG_TYPES:
                raise ConfigError(f"unsupported datatype '{dtype}' for tensor '{t.name}' for model '{name}'")
        if config.HasField("sequence_batching") and config.sequence_batching.state:
            raise ConfigError(
                f"model '{name}': implicit state (sequence_batching.state) is not supported by the tensorflow "
                "backend, as in Triton; keep the state in the request's inputs and outputs"
            )
        if graphdef.is_graphdef(config):
            graphdef.validate(config, read_graph(config, version_path))
            return
        sig = read_signature(config, version_path)
        batching = config.max_batch_size > 0
        controls = sequence.control_input_names(config)
        for control in sorted(controls):
            if sig.input(control) is None:
                raise ConfigError(
                    f"configuration specified sequence control '{control}', but model does not provide that input"
                )
        expected = len(config.input) + len(config.batch_input) + len(controls)
        if len(sig.inputs) != expected:
            raise ConfigError(
                f"unable to load model '{name}', configuration expects {len(config.input)} inputs, model provides "
                f"{len(sig.inputs)}"
            )
        for kind, declared, find, names in (
            ("input", config.input, sig.input, [t.name for t in sig.inputs]),
            ("output", config.output, sig.output, [t.name for t in sig.outputs]),
        ):
            for t in declared:
                tensor = find(t.name)
                if tensor is None:
                    raise ConfigError(
                        f"unexpected inference {kind} '{t.name}', allowed {kind}s are: {', '.join(sorted(names))}"
                    )
                if tensor.rank:
                    _compare_dims(name, tensor, _dims(t), batching, exact=kind == "output")
                want = pb.DataType.Name(t.data_type)
                if want != tensor.data_type:
                    raise ConfigError(
                        f"unable to load model '{name}', configuration expects datatype {want} for {kind} "
                        f"'{t.name}', model provides {_wire_type(tensor.data_type)}"
                    )

    def create_instance(self, spec: InstanceSpec) -> BackendInstance:
        device = _device(spec, self.config.name)
        _check_accelerators(self.config, spec)
        session = self._sessions.take(device or "", self.params.session_share_count, lambda: self._load(spec, device))
        try:
            return TensorFlowInstance(self.config, session)
        except BaseException:
            session.release()
            raise

    def _load(self, spec: InstanceSpec, device: str | None) -> _Session:
        if graphdef.is_graphdef(self.config):
            with self._graph_lock:
                if self._graph is None:
                    self._graph = read_graph(self.config, self.version_path)
            shown = self.model_path(self.config, self.version_path)
            return _Session(self.config, None, None, shown, self.params, device, graph=self._graph)
        sig = read_signature(self.config, self.version_path, self.params)
        folder, shown = saved_model_folder(self.config, self.version_path)
        return _Session(self.config, sig, folder, shown, self.params, device)


#: the GPU execution accelerators Triton's TensorFlow backend knows (TF-TRT, GPU I/O, auto mixed precision)
_TF_ACCELERATORS = ("tensorrt", "gpu_io", "auto_mixed_precision")


def _check_accelerators(config: pb.ModelConfig, spec: InstanceSpec) -> None:
    """Triton's rules for ``optimization.execution_accelerators`` (tensorflow.cc CreateModel), its messages."""
    accelerators = config.optimization.execution_accelerators
    if accelerators.cpu_execution_accelerator:
        raise ConfigError("CPU Execution Accelerator is not supported in TensorFlow backend")
    gpu = list(accelerators.gpu_execution_accelerator)
    if not gpu:
        return
    if spec.kind != "GPU":
        log.warning("GPU Execution Accelerator will be ignored for model instance on CPU")
        return
    for accelerator in gpu:
        if accelerator.name not in _TF_ACCELERATORS:
            raise ConfigError(f"unknown Execution Accelerator '{accelerator.name}' is requested")
    raise ConfigError(
        f"model '{config.name}': GPU execution accelerators ({', '.join(a.name for a in gpu)}) are not supported "
        "by this server's TensorFlow backend (TF-TRT needs NVIDIA's TensorFlow build); remove them, or convert "
        "the SavedModel with `kubeinfer convert --tensorrt`"
    )


def _device(spec: InstanceSpec, model: str) -> str | None:
    """Where an instance's graph runs: KIND_CPU on the CPU, KIND_GPU on its GPU, KIND_MODEL where the
    SavedModel's graph places it (Triton's MODEL_DEVICE)."""
    if spec.kind == "MODEL":
        return None
    if spec.kind == "GPU":
        tf = require_tensorflow()
        gpus = tf.config.list_physical_devices("GPU")
        if spec.device_id >= len(gpus):
            raise ConfigError(
                f"instance '{spec.name}' of model '{model}' is KIND_GPU on gpu {spec.device_id} but this TensorFlow "
                f"({tf.__version__}) sees {len(gpus)} GPU(s); tensorflow-cpu has none "
                "(pip install tensorflow[and-cuda])"
            )
        return f"/device:GPU:{spec.device_id}"
    return "/device:CPU:0"


class _Session:
    """One TensorFlow session holding the SavedModel (as Triton's backend: ``LoadSavedModel`` into a session)
    or the GraphDef (imported into the session's graph, as Triton's ``session->Create(graph_def)``), run
    through callables; shared by up to MAX_SESSION_SHARE_COUNT instances. ``Session.run`` releases the GIL
    while the graph executes, so instances on separate threads run at the same time."""

    def __init__(
        self,
        config: pb.ModelConfig,
        sig: Signature | None,
        folder: Path | None,
        shown: Path,
        params: TFParameters,
        device: str | None,
        graph: graphdef.Graph | None = None,
    ) -> None:
        """A SavedModel: its signature ``sig`` and the ``folder`` to load; a GraphDef: ``graph`` to import."""
        tf = require_tensorflow()
        self.tf = tf
        proto = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=params.intra_op_threads,
            inter_op_parallelism_threads=params.inter_op_threads,
            use_per_session_threads=params.per_session_threads,
            allow_soft_placement=params.allow_soft_placement,
        )
        if config.optimization.HasField("graph"):
            # Triton's mapping of optimization.graph.level to TensorFlow's XLA JIT level
            level = config.optimization.graph.level
            jit = tf.compat.v1.OptimizerOptions
            proto.graph_options.optimizer_options.global_jit_level = (
                jit.OFF if level == -1 else jit.ON_1 if level == 1 else jit.ON_2 if level > 1 else jit.DEFAULT
            )
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph, config=proto)
        self.input_order = [t.name for t in config.input] + sorted(sequence.control_input_names(config))
        try:
            if graph is not None:
                with self.graph.as_default():
                    tf.compat.v1.import_graph_def(graphdef.placed(graph.graph_def, device), name="")
                # the config's names are nodes: their first tensors, as TensorFlow reads a bare node name
                feeds = {n: f"{n}:0" for n in self.input_order}
                fetches = {t.name: f"{t.name}:0" for t in config.output}
            else:
                assert sig is not None and folder is not None
                with self.graph.as_default(), self.graph.device(device) if device else contextlib.nullcontext():
                    _load_saved_model(tf, self.session, sig.tag, folder, device is not None)
                feeds = {t.name: t.graph_name for t in sig.inputs}
                fetches = {t.name: t.graph_name for t in sig.outputs}
            self.feeds = {n: self.graph.get_tensor_by_name(g) for n, g in feeds.items()}
            self.fetches = {n: self.graph.get_tensor_by_name(g) for n, g in fetches.items()}
        except (tf.errors.OpError, OSError, ValueError, KeyError, RuntimeError, TypeError) as exc:
            self.session.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"unable to load model '{config.name}' from {shown}: {first}") from None
        self._callables: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()
        self.users = 0

    def callable(self, outputs: tuple[str, ...]) -> Any:
        """A session callable feeding the inputs in ``input_order`` and fetching ``outputs`` (made once)."""
        found = self._callables.get(outputs)
        if found is None:
            with self._lock:
                found = self._callables.get(outputs)
                if found is None:
                    found = self.session.make_callable(
                        [self.fetches[n] for n in outputs], [self.feeds[n] for n in self.input_order]
                    )
                    self._callables[outputs] = found
        return found

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users <= 0
        if last:
            self._callables.clear()
            self.session.close()


class _LoaderNotice(logging.Filter):
    """Drops the deprecation notice TensorFlow logs on the first call of its v1 SavedModel loader: it points TF2
    users at ``tf.saved_model.load``, which cannot give each model its own session options."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "loader_impl) is deprecated" not in record.getMessage()


_NOTICE = _LoaderNotice()


def _load_saved_model(tf: Any, session: Any, tag: str, folder: Path, clear_devices: bool) -> None:
    """``tf.compat.v1.saved_model.loader.load``: the loader TensorFlow Serving and Triton use (as C++)."""
    logger = tf.get_logger()
    if _NOTICE not in logger.filters:
        logger.addFilter(_NOTICE)
    tf.compat.v1.saved_model.loader.load(session, [tag], str(folder), clear_devices=clear_devices)


class _Sessions:
    """MAX_SESSION_SHARE_COUNT: the sessions of one model version by device, each with its number of users."""

    def __init__(self) -> None:
        self._by_device: dict[str, list[_Session]] = {}
        self._lock = threading.Lock()

    def take(self, device: str, share: int, load: Any) -> _Session:
        with self._lock:
            for session in self._by_device.get(device, []):
                if 0 < session.users < share:
                    session.users += 1
                    return session
        session = cast(_Session, load())
        with self._lock:
            session.users += 1
            self._by_device.setdefault(device, []).append(session)
        return session


class TensorFlowInstance(TensorBackendInstance):
    # a session run never calls back into the server
    may_run_on_loop = True

    def __init__(self, config: pb.ModelConfig, session: _Session) -> None:
        self.config = config
        self.session = session
        self.batching = config.max_batch_size > 0
        self.output_names = [t.name for t in config.output]
        # a config ``reshape`` (a [batch] tensor's dims [1] with an empty reshape, too) is applied by the
        # runtime for every backend (``runtime.reshape``): tensors come and go in ``reshape.shape``
        self._errors = (session.tf.errors.OpError, ValueError, TypeError)

    def run(self, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        feeds = [inputs[name] for name in self.session.input_order]
        names = tuple(output_names)
        try:
            values = self.session.callable(names)(*feeds)
        except self._errors as exc:
            raise BackendError(f"TensorFlow execute failure: {_first_line(exc)}") from None
        return dict(zip(names, values, strict=True))

    def close(self) -> None:
        self.session.release()


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
