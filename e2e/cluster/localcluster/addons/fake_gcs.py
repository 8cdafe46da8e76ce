"""fake-gcs-server, Google Cloud Storage's emulator, for the tests' ``gs://`` sources: built from its pinned module
(``e2e/cluster/fake-gcs``).

Build-only: ``build --addons fake-gcs`` (and ``ensure_built``) builds it, nothing starts it with the cluster; the
tests start an emulator of their own (``tests/support/gcs_store.py``: the JSON API, media downloads and uploads
over http on a free port, the filesystem backend in the test's folder).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import gotool
from ..addons import support

# bump when the build below changes
FAKE_GCS_RECIPE = "v1 trimpath cgo=0 ldflags=-s,-w fake-gcs-server=module-main"
FAKE_GCS = "github.com/fsouza/fake-gcs-server"


def fake_gcs_dir() -> Path:
    """``<cache>/addons/fake-gcs-<hash>``: ``fake-gcs-server`` (the module's main program, upstream's
    Dockerfile build: cgo off) and ``VERSION`` (the module version)."""
    key = support.key(FAKE_GCS_RECIPE.encode(), *support.module_files("fake-gcs/go.mod", "fake-gcs/go.sum"))

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        info = gotool.module_info("fake-gcs", FAKE_GCS)
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", "-s -w", "-o", str(out / "fake-gcs-server"), FAKE_GCS],
            "fake-gcs",
        )
        (out / "VERSION").write_text(info["version"] + "\n")

    return support.cached("fake-gcs", key, make)
