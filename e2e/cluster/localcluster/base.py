"""What every part of the local cluster reports with, and where its pinned Go modules live."""

from __future__ import annotations

import sys
from pathlib import Path

#: e2e/cluster: the pinned Go modules (``k8s/``, ``etcd/``, ...), ``system-packages`` and the CLI scripts
CLUSTER_DIR = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[kubeinfer-cluster] {msg}", file=sys.stderr, flush=True)
