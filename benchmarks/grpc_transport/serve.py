"""``kubeinfer-server`` with its gRPC listener served by the Rust transport instead of grpc.aio.

    .venv/bin/python benchmarks/grpc_transport/serve.py [--transport-threads N] <kubeinfer-server flags>

Everything else is the real server (HTTP, metrics, the runtime, shutdown): ``app.serve`` imports
``start_grpc_server`` when it starts the gRPC listener, and this script puts ``bridge.starter`` there.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build  # noqa: E402


def main(argv: list[str]) -> int:
    threads = 1
    if "--transport-threads" in argv:
        at = argv.index("--transport-threads")
        threads = int(argv[at + 1])
        del argv[at : at + 2]
    build.importable()
    import bridge
    from kubeinfer.server import cli
    from kubeinfer.server.grpc import server as grpc_server

    grpc_server.start_grpc_server = bridge.starter(threads)
    return int(cli.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
