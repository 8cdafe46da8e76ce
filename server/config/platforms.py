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
#: even if it also holds model.py. A backend's first row is its default platform (``backend: "tensorflow"``
#: alone is a SavedModel unless its default_model_filename or its version folder says GraphDef)
TABLE = (
    Platform(backend="tensorflow", platform="tensorflow_savedmodel", model_filename="model.savedmodel", folder=True),
    Platform(backend="tensorflow", platform="tensorflow_graphdef", model_filename="model.graphdef"),
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
#: backends built into the server (each once, in table order)
BUILTIN_BACKENDS = tuple(dict.fromkeys(p.backend for p in TABLE if p.backend))
BY_PLATFORM = {p.platform: p for p in TABLE if p.platform}
#: backend → its rows (tensorflow: SavedModel, then GraphDef)
_ROWS_BY_BACKEND: dict[str, tuple[Platform, ...]] = {
    b: tuple(p for p in TABLE if p.backend == b) for b in BUILTIN_BACKENDS
}


def row_for(config: pb.ModelConfig) -> Platform | None:
    """The table's row for ``config``: its platform's, else its backend's. For a backend serving several
    platforms (tensorflow) without a platform, the row whose file ``default_model_filename`` names, else the
    backend's first (Triton's AutoFill: ``model.graphdef`` means GraphDef, ``model.savedmodel`` SavedModel)."""
    row = BY_PLATFORM.get(config.platform)
    if row is not None:
        return row
    rows = _ROWS_BY_BACKEND.get(config.backend, ())
    named = [r for r in rows if r.model_filename == config.default_model_filename]
    return (named or rows or (None,))[0]


def platform_undecided(config: pb.ModelConfig) -> bool:
    """Whether the version folder's files pick ``config``'s platform: neither platform nor backend given, or a
    backend serving several platforms (tensorflow) without platform or default_model_filename."""
    if config.platform:
        return False
    if not config.backend:
        return True
    return not config.default_model_filename and len(_ROWS_BY_BACKEND.get(config.backend, ())) > 1


def backend_for(config: pb.ModelConfig) -> str:
    """The backend that serves ``config`` ("" for ensembles and unknown platforms)."""
    return config.backend or KNOWN_PLATFORMS.get(config.platform, "")


def model_filename(config: pb.ModelConfig) -> str:
    """The file each version folder must hold ("" when the table does not know one: ensembles, plugins)."""
    if config.default_model_filename:
        return config.default_model_filename
    row = row_for(config)
    return row.model_filename if row is not None else ""


def model_is_folder(config: pb.ModelConfig) -> bool:
    """Whether ``config``'s model "file" is a folder (its row says so: TensorFlow SavedModels)."""
    row = row_for(config)
    return row is not None and row.folder


def detect(files: Collection[str], folders: Collection[str] = (), backend: str = "") -> Platform | None:
    """The platform a version folder's entries imply (Triton's auto-complete without platform/backend):
    ``files`` are its plain files, ``folders`` its folders; a row matches only an entry of its kind, as
    Triton checks (a folder named model.onnx is not an ONNX model). ``backend``: only that backend's rows
    (a config naming backend "tensorflow" alone). Among one backend's rows the last match wins, as in
    Triton's AutoFill, which tests model.graphdef after model.savedmodel/."""
    found: Platform | None = None
    for row in TABLE:
        if backend and row.backend != backend:
            continue
        if found is not None and row.backend != found.backend:
            break
        if row.model_filename and row.model_filename in (folders if row.folder else files):
            found = row
    return found
