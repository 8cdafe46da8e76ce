"""``kubeinfer``: tools for model repositories and servers. ``kubeinfer convert`` turns ONNX into a TensorRT
plan, and a PyTorch model (TorchScript ``model.pt`` or a ``torch.export`` ``model.pt2``) or a TensorFlow
SavedModel into ONNX and optionally TensorRT; ``kubeinfer perf`` load-tests a running server (perf_analyzer's flags);
``kubeinfer tune`` searches batching and instance settings against a p99 budget."""

from __future__ import annotations

import argparse
import sys

from . import convert, convert_tf, convert_torch, perf, tune
from .perf.model import PerfError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    convert_parser = sub.add_parser(
        "convert",
        help="ONNX → TensorRT plan; PyTorch (model.pt/.pt2) or TensorFlow (model.savedmodel) → ONNX (→ TensorRT)",
        description=f"{convert.__doc__}\n{convert_torch.__doc__}\n{convert_tf.__doc__}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convert.add_arguments(convert_parser)
    convert_torch.add_arguments(convert_parser)
    convert_tf.add_arguments(convert_parser)
    perf_parser = sub.add_parser(
        "perf",
        help="load-test a KServe v2 server over HTTP or gRPC (perf_analyzer's flags)",
        description=perf.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    perf.add_arguments(perf_parser)
    tune_parser = sub.add_parser(
        "tune",
        help="search max_batch_size, preferred_batch_size, queue delay and instance count within a p99 budget",
        description=tune.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_arguments(tune_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        try:
            if convert_torch.is_torch_source(args.onnx):
                convert_torch.run(convert_torch.options_from_args(args))
                return 0
            if args.onnx.is_dir():  # a SavedModel is a folder
                convert_tf.run(convert_tf.options_from_args(args))
                return 0
            options = convert.options_from_args(args)
            return convert.run(options)
        except convert.ConvertError as exc:
            print(f"kubeinfer convert: error: {exc}", file=sys.stderr)
            return 2
    if args.command in ("perf", "tune"):
        try:
            return perf.run(args) if args.command == "perf" else tune.run(args)
        except PerfError as exc:
            print(f"kubeinfer {args.command}: error: {exc}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
