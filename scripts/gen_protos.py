"""Regenerates the committed protobuf/gRPC Python modules from the .proto files.

Run with the pinned ``grpcio-tools`` from the ``dev`` extra: ``python scripts/gen_protos.py``.
``--check`` regenerates into a temporary folder and fails when the committed files differ, so a
.proto edit without regeneration is caught by the test suite. The protos are laid out under
``kubeinfer/server/...`` so that generated imports name the installed package.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (folder in the repo, package path it is installed under, proto files): messages and .pyi only; the gRPC
# service is registered by hand from the descriptor (server/grpc/server.py), so no *_pb2_grpc.py
PROTOS = [
    ("server/config", "kubeinfer/server/config", ["model_config.proto"]),
    ("server/grpc", "kubeinfer/server/grpc", ["grpc_service.proto"]),
]


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    src = Path(tempfile.mkdtemp())
    produced: list[Path] = []
    try:
        for folder, pkg, files in PROTOS:
            for f in files:
                if not (ROOT / folder / f).exists():
                    continue
                dest = src / pkg / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / folder / f, dest)
        for _folder, pkg, files in PROTOS:
            for f in files:
                if not (src / pkg / f).exists():
                    continue
                args = ["protoc", f"-I{src}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(src / pkg / f)]
                if protoc.main(args) != 0:
                    raise SystemExit(f"protoc failed for {f}")
                stem = f[: -len(".proto")]
                for suffix in ("_pb2.py", "_pb2.pyi"):
                    produced.append(Path(pkg) / f"{stem}{suffix}")
    finally:
        shutil.rmtree(src)
    return produced


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed generated files are stale")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp())
    try:
        produced = generate(out)
        stale = []
        for rel in produced:
            folder = next(f for f, pkg, _ in PROTOS if str(rel).startswith(pkg))
            target = ROOT / folder / rel.name
            if args.check:
                if not target.exists() or not filecmp.cmp(out / rel, target, shallow=False):
                    stale.append(str(target.relative_to(ROOT)))
            else:
                shutil.copy(out / rel, target)
                print(f"wrote {target.relative_to(ROOT)}")
        if stale:
            print("stale generated files (run python scripts/gen_protos.py):", *stale, sep="\n  ")
            return 1
    finally:
        shutil.rmtree(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
