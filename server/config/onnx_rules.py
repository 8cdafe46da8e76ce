"""How a config and an ONNX graph must agree: auto-complete from the graph, then the load check, in one place.

The ONNX Runtime backend applies both when it loads a version; the operator applies both, to a copy of the
config it renders, before the version goes live (its servers run with auto-complete on), so the operator's
early "this will not load" is the server's own load error, word for word. Pure: the graph comes as
``onnx_signature.Tensor`` lists (``onnx_signature.graph_tensors``), the answer as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from . import model_config_pb2 as pb
from . import sequence

if TYPE_CHECKING:  # onnx_signature imports onnx, which a server without ONNX models need not load
    from .onnx_signature import Tensor

#: Triton's ``default-max-batch-size`` (docs/user_guide/model_configuration.md): the max_batch_size an
#: auto-completed config of a batching graph gets unless ``--backend-config`` says otherwise
DEFAULT_MAX_BATCH_SIZE = 4


def complete(
    config: pb.ModelConfig, inputs: Sequence[Tensor], outputs: Sequence[Tensor], default_max_batch_size: int
) -> None:
    """Fill what ``config`` leaves out (max_batch_size, inputs, outputs, their types and dims) from the graph."""
    graph_batches = all(t.dims and t.dims[0] == -1 for t in [*inputs, *outputs])
    if not config.HasField("max_batch_size"):
        config.max_batch_size = default_max_batch_size if graph_batches else 0
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    # the sequence batcher feeds control and state inputs and consumes state outputs itself
    injected = sequence.injected_input_names(config) | sequence.state_output_names(config)
    for declared, found in ((config.input, inputs), (config.output, outputs)):
        known = {t.name: t for t in declared}
        for name, dtype, dims in found:
            if name in injected and name not in known:
                continue
            t = known.get(name)
            if t is None:
                if declared is config.input and known:
                    continue  # a partial input list is the user's choice (the check below names the rest)
                t = declared.add()
                t.name = name
            if t.data_type == pb.TYPE_INVALID:
                t.data_type = cast(pb.DataType, pb.DataType.Value(dtype))
            if not t.dims and not t.HasField("reshape"):
                t.dims.extend(dims[skip:] or [1])


def _dims_problem(kind: str, t: pb.ModelInput | pb.ModelOutput, dims: list[int], max_batch_size: int) -> str | None:
    # the model sees reshape.shape when there is one (Triton's onnxruntime backend compares that)
    shape = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
    model_dims = dims
    if max_batch_size > 0:
        if dims and (dims[0] == -1 or dims[0] >= max_batch_size):
            model_dims = dims[1:]
        else:
            return (
                f"{kind} '{t.name}' has shape {dims} in the ONNX model, which has no "
                f"variable batch dimension; set max_batch_size: 0 and dims: {dims}"
            )
    if len(model_dims) == len(shape) and all(
        m == -1 or c == -1 or m == c for m, c in zip(model_dims, shape, strict=True)
    ):
        return None
    what = "reshape.shape" if t.HasField("reshape") else "dims"
    batch_note = " (without the batch dimension)" if max_batch_size > 0 else ""
    hint = ""
    if t.HasField("reshape"):
        pass  # the client's dims are free; only reshape.shape meets the graph
    elif max_batch_size > 0 and len(shape) == len(model_dims) + 1:
        hint = "; dims must not include the batch dimension when max_batch_size > 0"
    elif max_batch_size <= 0 and len(shape) + 1 == len(model_dims):
        hint = "; with max_batch_size 0, dims include the batch dimension"
    return f"{kind} '{t.name}' has {what} {shape} in the config but {model_dims}{batch_note} in the ONNX model{hint}"


def mismatches(config: pb.ModelConfig, inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> list[str]:
    """Every way ``config`` contradicts the graph, in the server's load-error words; empty if they agree.

    The server fails the load with the first; the operator reports them all."""
    problems: list[str] = []
    for kind, declared, found in (("input", config.input, inputs), ("output", config.output, outputs)):
        graph = {t.name: t for t in found}
        for t in declared:
            if t.name not in graph:
                problems.append(
                    f"{kind} '{t.name}' is not in the ONNX model; the model's {kind}s are {', '.join(graph) or 'none'}"
                )
                continue
            _, dtype, dims = graph[t.name]
            want = pb.DataType.Name(t.data_type)
            if dtype != want:
                problems.append(f"{kind} '{t.name}' is {dtype} in the ONNX model but {want} in the config")
                continue
            problem = _dims_problem(kind, t, dims, config.max_batch_size)
            if problem is not None:
                problems.append(problem)
    declared_inputs = {t.name for t in config.input} | sequence.injected_input_names(config)
    undeclared = [t.name for t in inputs if t.name not in declared_inputs]
    if undeclared:
        # Triton's onnxruntime backend: "configuration expects N inputs, model provides M"
        problems.append(
            f"unable to load model '{config.name}', configuration expects {len(config.input)} inputs, "
            f"model provides {len(inputs)}: the config lacks {', '.join(undeclared)}"
        )
    return problems
