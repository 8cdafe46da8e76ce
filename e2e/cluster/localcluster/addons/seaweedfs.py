"""SeaweedFS's ``weed`` for the tests' S3-compatible object store, built from its pinned module
(``e2e/cluster/seaweedfs``).

Build-only: ``build --addons seaweedfs`` (and ``ensure_built``) builds it, nothing starts it with the cluster;
the tests start a store of their own (``tests/support/s3_store.py``: ``weed server -s3``, master + volume +
filer + S3 gateway in one process, free ports, its data in the test's folder, S3 identities from a JSON file).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import gotool
from ..addons import support

# bump when the build below changes
SEAWEEDFS_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w,commit-stamp weed=weed"
SEAWEEDFS = "github.com/seaweedfs/seaweedfs"


def seaweedfs_dir() -> Path:
    """``<cache>/addons/seaweedfs-<hash>``: ``weed`` (upstream's default build: no extra tags, cgo off as in
    its release workflow and Dockerfile) and ``VERSION`` (``weed version``'s number and the module version)."""
    key = support.key(SEAWEEDFS_RECIPE.encode(), *support.module_files("seaweedfs/go.mod", "seaweedfs/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("seaweedfs", SEAWEEDFS)
        # upstream stamps the commit (`git rev-parse --short HEAD`); the proxy's pseudo-version ends with it
        commit = info["commit"][:12] or info["version"].rsplit("-", 1)[-1]
        stamp = f"-X {SEAWEEDFS}/weed/util/version.COMMIT={commit}"
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", f"-s -w {stamp}", "-o", str(out / "weed"),
             f"{SEAWEEDFS}/weed"],
            "seaweedfs",
        )  # fmt: skip
        (out / "VERSION").write_text(info["version"] + "\n")

    return support.cached("seaweedfs", key, make)
