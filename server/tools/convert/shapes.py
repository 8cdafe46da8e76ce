"""The ONNX model's signature, the optimization profile's shapes it allows with the given flags, and the
config.pbtxt that serves the plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...config import ConfigError, pb, validate_config
from .messages import ConvertError
from .options import ConvertOptions, batch_range


@dataclass(frozen=True)
class Signature:
    """ONNX graph inputs/outputs as (name, config data type, dims with -1 for symbolic)."""

    inputs: list[tuple[str, str, list[int]]]
    outputs: list[tuple[str, str, list[int]]]

    @property
    def batching(self) -> bool:
        return all(d and d[0] == -1 for _, _, d in self.inputs)


def read_signature(onnx_path: Path) -> Signature:
    from ...backends.onnxruntime import _graph_signature

    try:
        inputs, outputs = _graph_signature(onnx_path)
    except ConfigError as exc:
        raise ConvertError(str(exc)) from None
    return Signature(list(inputs), list(outputs))


def profile_shapes(options: ConvertOptions, sig: Signature) -> dict[str, tuple[list[int], list[int], list[int]]]:
    """(min, opt, max) full shapes per input for the one optimization profile; checks the model's dims."""
    batch_flags = any(v is not None for v in (options.min_batch, options.opt_batch, options.max_batch))
    if not sig.batching and batch_flags:
        first = ", ".join(f"{n} {d}" for n, _, d in sig.inputs)
        raise ConvertError(
            f"the model has no dynamic batch dimension ({first}); drop --min-batch/--opt-batch/--max-batch "
            "or export the ONNX model with a dynamic first axis"
        )
    unknown = set(options.input_shapes) - {n for n, _, _ in sig.inputs}
    if unknown:
        raise ConvertError(
            f"--input-shape names unknown input(s) {', '.join(sorted(unknown))}; "
            f"the model's inputs are {', '.join(n for n, _, _ in sig.inputs)}"
        )
    lo, opt, hi = batch_range(options)
    shapes = {}
    for name, _, dims in sig.inputs:
        item = dims[1:] if sig.batching else dims
        given = options.input_shapes.get(name)
        if given is not None:
            if len(given) != len(item) or any(d != -1 and g != d for g, d in zip(given, item, strict=True)):
                raise ConvertError(
                    f"--input-shape {name}={'x'.join(map(str, given))} does not match the "
                    f"model's dims {item}" + (" (without the batch dimension)" if sig.batching else "")
                )
            if any(g < 1 for g in given):
                raise ConvertError(f"--input-shape {name} dims must be positive")
            item = given
        if -1 in item:
            raise ConvertError(
                f"input '{name}' has dynamic dims {item}; give them with --input-shape "
                f"{name}={'x'.join('N' if d == -1 else str(d) for d in item)}"
            )
        if sig.batching:
            shapes[name] = ([lo, *item], [opt, *item], [hi, *item])
        else:
            shapes[name] = (list(item), list(item), list(item))
    return shapes


def render_config(options: ConvertOptions, sig: Signature) -> pb.ModelConfig:
    """The config.pbtxt that serves the plan, built with the one ModelConfig schema and validated."""
    shapes = profile_shapes(options, sig)
    _, _, hi = batch_range(options)
    config = pb.ModelConfig(name=options.name, platform="tensorrt_plan")
    config.max_batch_size = hi if sig.batching else 0
    skip = 1 if sig.batching else 0
    for name, dtype, _ in sig.inputs:
        t = config.input.add(name=name, data_type=pb.DataType.Value(dtype))
        t.dims.extend(shapes[name][2][skip:])
    for name, dtype, dims in sig.outputs:
        out = config.output.add(name=name, data_type=pb.DataType.Value(dtype))
        out.dims.extend(dims[skip:] or [1])
    if config.max_batch_size > 1:
        config.dynamic_batching.SetInParent()
    config.instance_group.add(count=options.instance_count, kind=pb.ModelInstanceGroup.KIND_GPU, gpus=options.gpus)
    try:
        validate_config(config, options.name)
    except ConfigError as exc:
        raise ConvertError(f"rendered config is invalid: {exc}") from None
    return config
