"""What every part of the local cluster shares: its progress log, its error, and where things live (the pinned
Go modules, the cache folder, the run folder)."""

from __future__ import annotations

import os
from pathlib import Path

from . import scaffold

#: e2e/cluster: the pinned Go modules (``k8s/``, ``etcd/``, ...), ``system-packages`` and the CLI scripts
CLUSTER_DIR = Path(__file__).resolve().parent.parent

log = scaffold.progress("kubeinfer-cluster")


class ClusterError(RuntimeError):
    pass


def cache_dir() -> Path:
    """``KUBEINFER_CLUSTER_CACHE`` (default ~/.cache/kubeinfer-cluster): binaries, add-ons, the default run folder."""
    return scaffold.cache_folder("KUBEINFER_CLUSTER_CACHE", "kubeinfer-cluster")


def run_dir() -> Path:
    """``KUBEINFER_CLUSTER_RUN`` (default <cache>/run): PIDs, logs, PKI, etcd data, kubeconfig."""
    return Path(os.environ.get("KUBEINFER_CLUSTER_RUN") or cache_dir() / "run").expanduser()
