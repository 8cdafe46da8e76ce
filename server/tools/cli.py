"""``kubeinfer``: tools for model repositories. ``kubeinfer convert`` turns ONNX into a TensorRT plan."""

from __future__ import annotations

import argparse
import sys

from . import convert


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeinfer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    convert.add_arguments(
        sub.add_parser(
            "convert",
            help=convert.__doc__.splitlines()[0],
            description=convert.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "convert":
        try:
            options = convert.options_from_args(args)
            return convert.run(options)
        except convert.ConvertError as exc:
            print(f"kubeinfer convert: error: {exc}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
