"""What a ``.pt``/``.pt2`` file holds, how to load it, and what its ``forward`` takes and returns.

The format is read from the archive, not from the file name:

- TorchScript (``torch.jit.save``: ``code/`` and ``data.pkl``) → ``torch.jit.load``, as Triton does;
- a ``torch.export`` program (``torch.export.save``: ``archive_format`` and ``models/*.json``) →
  ``torch.export.load(...).module()``, beyond Triton;
- a file from ``torch.save(model)`` / a state dict, or an AOTInductor package, is refused with the way
  to turn it into one of the two.

The file is read through the descriptor the runtime opened for the load (``model_files.pinned``).
"""

from __future__ import annotations

import inspect
import threading
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import ConfigError
from ...repository.model_files import pinned

# PyTorch deprecates TorchScript in favour of torch.export; Triton's PyTorch backend serves TorchScript, so
# loading it is this backend's job and the warning would only repeat on every load
warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated", category=FutureWarning)

#: torch.export.load keeps its deserializer in a module global ("_CURRENT_DESERIALIZER is already set" when
#: two models load on two threads at once): one load at a time
_EXPORT_LOAD_LOCK = threading.Lock()

TORCHSCRIPT = "TorchScript"
EXPORTED = "torch.export program"
SAVE_HINT = (
    "save a TorchScript module with torch.jit.save(torch.jit.script(model), 'model.pt') (or torch.jit.trace), "
    "or a torch.export program with torch.export.save(torch.export.export(model, example_inputs), 'model.pt2') "
    'and default_model_filename: "model.pt2"'
)


def detect_format(path: Path) -> str:
    """TORCHSCRIPT or EXPORTED, from the archive's members; ConfigError says what the file is instead."""
    try:
        with zipfile.ZipFile(pinned(path)) as archive:
            names = archive.namelist()
    except FileNotFoundError:
        raise ConfigError(f"model file '{path.name}' not found in version folder {path.parent.name}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(
            f"{path.name} is not a PyTorch archive ({exc}); the pytorch backend serves TorchScript and "
            f"torch.export files: {SAVE_HINT}"
        ) from None
    parts = {tuple(n.split("/")[1:]) for n in names}
    if any(p[:2] == ("data", "aotinductor") for p in parts):
        raise ConfigError(
            f"{path.name} is an AOTInductor package (torch._inductor.aoti_compile_and_package), which this server "
            "does not run; serve the torch.export program it was compiled from (torch.export.save)"
        )
    if ("archive_format",) in parts and any(p[:1] == ("models",) for p in parts):
        return EXPORTED
    if ("data.pkl",) in parts and any(p[:1] == ("code",) for p in parts):
        return TORCHSCRIPT
    if ("data.pkl",) in parts:
        raise ConfigError(
            f"{path.name} was written by torch.save() (a pickled module or state dict), which needs the model's "
            f"Python code to load; {SAVE_HINT}"
        )
    raise ConfigError(f"{path.name} is a zip archive but neither TorchScript nor a torch.export program; {SAVE_HINT}")


@dataclass
class Signature:
    """What ``forward`` takes and returns, as far as the file tells."""

    #: argument names without ``self``
    arguments: list[str]
    #: forward takes one ``Dict[str, Tensor]``: inputs go in by config name
    dict_input: bool = False
    #: number of results when known (1 for a Tensor, the arity of a tuple); None for lists/dicts
    results: int | None = None
    #: exported programs only: per argument, (torch dtype, shape with None for dynamic dims, max of dim 0)
    tensors: dict[str, tuple[Any, list[int | None], int | None]] = field(default_factory=dict)


@dataclass
class LoadedModule:
    format: str
    module: Any
    signature: Signature
    device: Any


def _load_error(path: Path, fmt: str, exc: Exception) -> ConfigError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(f"PyTorch cannot load {path.name} as {fmt}: {first}")


def load(path: Path, device: Any) -> LoadedModule:
    """Load ``path`` onto ``device`` (a ``torch.device``)."""
    import torch

    fmt = detect_format(path)
    if fmt == TORCHSCRIPT:
        try:
            module = torch.jit.load(str(pinned(path)), map_location=device)
        except Exception as exc:  # torch raises RuntimeError/ValueError with C++ messages
            raise _load_error(path, fmt, exc) from None
        module.eval()
        return LoadedModule(fmt, module, torchscript_signature(module), device)
    try:
        with _EXPORT_LOAD_LOCK:
            program = torch.export.load(str(pinned(path)))
    except Exception as exc:
        raise _load_error(path, fmt, exc) from None
    signature = export_signature(program)
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return LoadedModule(fmt, program.module(), signature, device)


def torchscript_signature(module: Any) -> Signature:
    schema = module.forward.schema
    arguments = list(schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    kinds = [a.type.kind() for a in arguments]
    dict_input = len(arguments) == 1 and kinds[0] == "DictType"
    if not dict_input:
        if "DictType" in kinds:
            raise ConfigError(
                "Multiple inputs of kind DictType were detected. Only a single input of type Dict(str, Tensor) "
                "is supported."
            )
        for arg, kind in zip(arguments, kinds, strict=True):
            if kind not in ("TensorType", "ListType"):
                raise ConfigError(
                    f"An input of type '{arg.type}' was detected in the model (argument '{arg.name}'). Only a "
                    "single input of type Dict(str, Tensor) or input(s) of type Tensor are supported."
                )
    results: int | None = None
    if len(schema.returns) == 1:
        kind = schema.returns[0].type.kind()
        if kind == "TensorType":
            results = 1
        elif kind == "TupleType":
            results = len(schema.returns[0].type.elements())
    return Signature([a.name for a in arguments], dict_input, results)


def export_signature(program: Any) -> Signature:
    names: list[str] | None = None
    for entry in getattr(program, "module_call_graph", []) or []:
        if entry.fqn == "" and entry.signature is not None:
            names = list(getattr(entry.signature, "forward_arg_names", None) or [])
    if not names:
        names = list(inspect.signature(program.module().forward).parameters)
    out_spec = program.call_spec.out_spec
    results: int | None = None
    if out_spec is not None:
        if out_spec.is_leaf():
            results = 1
        elif out_spec.type in (tuple, list):
            results = out_spec.num_children
    tensors: dict[str, tuple[Any, list[int | None], int | None]] = {}
    user_inputs = list(program.graph_signature.user_inputs)
    if len(user_inputs) == len(names):
        nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        for arg, placeholder in zip(names, user_inputs, strict=True):
            value = nodes[placeholder].meta.get("val") if placeholder in nodes else None
            if value is None or not hasattr(value, "dtype"):
                continue
            shape = [d if isinstance(d, int) else None for d in value.shape]
            top = None
            if value.shape and not isinstance(value.shape[0], int):
                top = _upper_bound(program, value.shape[0])
            tensors[arg] = (value.dtype, shape, top)
    dict_input = len(names) == 1 and program.call_spec.in_spec is not None and _single_dict(program.call_spec.in_spec)
    return Signature(names, dict_input, results, tensors)


def _upper_bound(program: Any, dim: Any) -> int | None:
    """Largest value a symbolic dimension may take (None when unbounded)."""
    try:
        ranges = program.range_constraints[dim.node.expr]
        upper = ranges.upper
        return int(upper) if upper.is_finite else None
    except (KeyError, AttributeError, TypeError, ValueError):
        return None


def _single_dict(in_spec: Any) -> bool:
    """in_spec is ((args...), {kwargs}); True when the only arg is a dict."""

    def child(spec: Any, index: int) -> Any:
        return spec.child(index) if hasattr(spec, "child") else spec.children_specs[index]  # torch < 2.10

    try:
        args = child(in_spec, 0)
        return bool(args.num_children == 1 and child(args, 0).type is dict)
    except (AttributeError, IndexError):
        return False
