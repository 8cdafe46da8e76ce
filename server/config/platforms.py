"""The platform → backend → default model file table, defined once (Triton's names).

Config validation, the backend loader, the backends, repository scanning and the operator's renderer all
read it, so a platform added here is known everywhere at once. Third-party backends (entry points of
``kubeinfer.backends``) are served by their ``backend`` name and bring their own default file name.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from . import model_config_pb2 as pb


@dataclass(frozen=True)
class Platform:
    #: ``backend`` in config.pbtxt ("" for ensembles, which run no backend)
    backend: str
    #: ``platform`` in config.pbtxt ("" where Triton names only the backend, as for python)
    platform: str
    #: the model file each version folder holds unless ``default_model_filename`` says otherwise
    model_filename: str
    #: the "file" is a folder (a TensorFlow SavedModel: ``saved_model.pb``, ``variables/``, ``assets/``)
    folder: bool = False


#: in auto-complete order (Triton's: TensorFlow first, Python last): a version folder with model.onnx is ONNX
#: even if it also holds model.py
TABLE = (
    Platform(backend="tensorflow", platform="tensorflow_savedmodel", model_filename="model.savedmodel", folder=True),
    Platform(backend="onnxruntime", platform="onnxruntime_onnx", model_filename="model.onnx"),
    Platform(backend="tensorrt", platform="tensorrt_plan", model_filename="model.plan"),
    # TorchScript (Triton's format) or, beyond Triton, a torch.export program: the archive tells which
    Platform(backend="pytorch", platform="pytorch_libtorch", model_filename="model.pt"),
    Platform(backend="python", platform="", model_filename="model.py"),
    Platform(backend="", platform="ensemble", model_filename=""),
)
#: every default model file name (the entries auto-complete looks at)
MODEL_FILENAMES = frozenset(p.model_filename for p in TABLE if p.model_filename)
#: platform → the backend that serves it
KNOWN_PLATFORMS = {p.platform: p.backend for p in TABLE if p.platform}
#: backends built into the server
BUILTIN_BACKENDS = tuple(p.backend for p in TABLE if p.backend)
BY_PLATFORM = {p.platform: p for p in TABLE if p.platform}
_FILE_BY_PLATFORM = {p.platform: p.model_filename for p in TABLE if p.platform}
_FILE_BY_BACKEND = {p.backend: p.model_filename for p in TABLE if p.backend}
_ROW_BY_BACKEND = {p.backend: p for p in TABLE if p.backend}


def backend_for(config: pb.ModelConfig) -> str:
    """The backend that serves ``config`` ("" for ensembles and unknown platforms)."""
    return config.backend or KNOWN_PLATFORMS.get(config.platform, "")


def model_filename(config: pb.ModelConfig) -> str:
    """The file each version folder must hold ("" when the table does not know one: ensembles, plugins)."""
    if config.default_model_filename:
        return config.default_model_filename
    return _FILE_BY_PLATFORM.get(config.platform) or _FILE_BY_BACKEND.get(config.backend) or ""


def model_is_folder(config: pb.ModelConfig) -> bool:
    """Whether ``config``'s model "file" is a folder (its backend's row says so: TensorFlow SavedModels)."""
    row = BY_PLATFORM.get(config.platform) or _ROW_BY_BACKEND.get(config.backend)
    return row is not None and row.folder


def detect(files: Collection[str], folders: Collection[str] = ()) -> Platform | None:
    """The platform a version folder's entries imply (Triton's auto-complete without platform/backend):
    ``files`` are its plain files, ``folders`` its folders; a row matches only an entry of its kind, as
    Triton checks (a folder named model.onnx is not an ONNX model)."""
    for row in TABLE:
        if row.model_filename and row.model_filename in (folders if row.folder else files):
            return row
    return None
