"""``kubeinfer convert``'s flags for an ONNX → TensorRT build, and every check that needs no model: bad
arguments fail before anything slow starts."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from .layout import plan_layout
from .messages import ConvertError


@dataclass
class ConvertOptions:
    onnx: Path
    repository: Path
    name: str
    version: int = 1
    fp16: bool = False
    int8: bool = False
    calibration_data: Path | None = None
    min_batch: int | None = None
    opt_batch: int | None = None
    max_batch: int | None = None
    workspace_mib: int = 1024
    #: dims (without the batch dimension) for inputs whose non-batch dims are dynamic
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    instance_count: int = 1
    gpus: list[int] = field(default_factory=lambda: [0])
    force: bool = False
    compare: bool = True
    compare_runs: int = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "onnx", type=Path, help="the model to convert: model.onnx, model.pt/.pt2 or a model.savedmodel folder"
    )
    p.add_argument("--repository", type=Path, required=True, help="model repository folder")
    p.add_argument("--name", required=True, help="model name (the folder under the repository)")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--fp16", action="store_true", help="allow FP16 kernels")
    p.add_argument("--int8", action="store_true", help="allow INT8 kernels (needs --calibration-data)")
    p.add_argument(
        "--calibration-data", type=Path, help=".npy [N, ...] for a single-input model, or .npz keyed by input name"
    )
    p.add_argument("--min-batch", type=int, help="optimization profile: smallest batch (default 1)")
    p.add_argument("--opt-batch", type=int, help="optimization profile: batch to tune for (default --max-batch)")
    p.add_argument("--max-batch", type=int, help="optimization profile: largest batch (default 8)")
    p.add_argument("--workspace", type=int, default=1024, metavar="MIB", help="builder workspace limit in MiB")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=DxDxD",
        help="dims without batch for an input with dynamic non-batch dims; repeatable",
    )
    p.add_argument("--instance-count", type=int, default=1, help="instances per GPU in the rendered config")
    p.add_argument("--gpus", default="0", help="comma-separated GPU ids for the instance group")
    p.add_argument("--force", action="store_true", help="replace an existing version")
    p.add_argument("--no-compare", action="store_true", help="skip the accuracy/speed comparison")


def options_from_args(args: argparse.Namespace) -> ConvertOptions:
    shapes: dict[str, list[int]] = {}
    for item in args.input_shape:
        name, sep, dims = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise ConvertError(f"--input-shape '{item}' must look like NAME=3x224x224") from None
    try:
        gpus = [int(g) for g in str(args.gpus).split(",") if g.strip()]
    except ValueError:
        raise ConvertError(f"--gpus '{args.gpus}' must be comma-separated integers") from None
    return ConvertOptions(
        onnx=args.onnx,
        repository=args.repository,
        name=args.name,
        version=1 if args.version is None else args.version,  # PyTorch sources default to the next free one
        fp16=args.fp16,
        int8=args.int8,
        calibration_data=args.calibration_data,
        min_batch=args.min_batch,
        opt_batch=args.opt_batch,
        max_batch=args.max_batch,
        workspace_mib=args.workspace,
        input_shapes=shapes,
        instance_count=args.instance_count,
        gpus=gpus,
        force=args.force,
        compare=not args.no_compare,
    )


def check_options(options: ConvertOptions) -> None:
    """Argument checks that need no model: fail before anything slow starts."""
    from ...repository.layout import check_model_name
    from ...vocabulary.errors import InvalidArgument

    try:
        check_model_name(options.name)
    except InvalidArgument as exc:
        raise ConvertError(str(exc)) from None
    if not options.onnx.is_file():
        raise ConvertError(f"ONNX model '{options.onnx}' not found")
    if not options.repository.is_dir():
        raise ConvertError(f"model repository '{options.repository}' is not a folder")
    if options.version < 1:
        raise ConvertError(f"--version must be >= 1, got {options.version}")
    if options.workspace_mib < 1:
        raise ConvertError(f"--workspace must be at least 1 MiB, got {options.workspace_mib}")
    if options.instance_count < 1:
        raise ConvertError(f"--instance-count must be >= 1, got {options.instance_count}")
    if not options.gpus or any(g < 0 for g in options.gpus):
        raise ConvertError(f"--gpus must list device ids >= 0, got {options.gpus}")
    for flag, value in (
        ("--min-batch", options.min_batch),
        ("--opt-batch", options.opt_batch),
        ("--max-batch", options.max_batch),
    ):
        if value is not None and value < 1:
            raise ConvertError(f"{flag} must be >= 1, got {value}")
    lo, opt, hi = batch_range(options)
    if not lo <= opt <= hi:
        raise ConvertError(f"batch sizes must satisfy --min-batch <= --opt-batch <= --max-batch, got {lo}, {opt}, {hi}")
    if options.int8 and options.calibration_data is None:
        raise ConvertError("--int8 needs --calibration-data (a .npy or .npz of representative inputs)")
    if options.calibration_data is not None:
        if not options.int8:
            raise ConvertError("--calibration-data is only used with --int8")
        if not options.calibration_data.is_file():
            raise ConvertError(f"calibration data '{options.calibration_data}' not found")
        if options.calibration_data.suffix not in (".npy", ".npz"):
            raise ConvertError("calibration data must be a .npy or .npz file")
    layout = plan_layout(options)
    if layout.plan.exists() and not options.force:
        raise ConvertError(f"{layout.plan} exists; pass --force to replace version {options.version}")


def batch_range(options: ConvertOptions) -> tuple[int, int, int]:
    hi = options.max_batch if options.max_batch is not None else max(8, options.opt_batch or 1, options.min_batch or 1)
    lo = options.min_batch if options.min_batch is not None else 1
    opt = options.opt_batch if options.opt_batch is not None else hi
    return lo, opt, hi
