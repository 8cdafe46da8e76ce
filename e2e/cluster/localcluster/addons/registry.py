"""An OCI registry and the ORAS CLI for the tests: CNCF distribution's ``cmd/registry`` and ``oras``, built from
their pinned modules (``e2e/cluster/registry``, ``e2e/cluster/registry/oras``).

Build-only: ``build --addons registry`` (and ``ensure_built``) builds them, nothing starts them with the
cluster; the tests start a registry of their own (``tests/support/oci_registry.py``: a free port, filesystem
storage in the test's folder, htpasswd auth) and push to it with ``oras``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import gotool
from ..addons import support

# bump when the build below changes
REGISTRY_RECIPE = "v2 trimpath cgo=0 ldflags=-s,-w,version-stamps registry=wrapper-main oras=cmd/oras"
DISTRIBUTION = "github.com/distribution/distribution/v3"
ORAS = "oras.land/oras"


def registry_dir() -> Path:
    """``<cache>/addons/registry-<hash>``: ``registry`` (distribution v3's registry command with the local drivers
    only: ``e2e/cluster/registry/registry/main.go``), ``oras``, and ``REGISTRY_VERSION``/``ORAS_VERSION``."""
    key = support.key(
        REGISTRY_RECIPE.encode(),
        *support.module_files(
            "registry/go.mod",
            "registry/go.sum",
            "registry/registry/main.go",
            "registry/oras/go.mod",
            "registry/oras/go.sum",
        ),
    )

    def make(out: Path) -> None:
        jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
        dist = gotool.module_info("registry", DISTRIBUTION)
        # as upstream's Makefile stamps them (the revision too where the module proxy gives the commit)
        stamps = [
            f"-X {DISTRIBUTION}/version.version={dist['version']}",
            f"-X {DISTRIBUTION}/version.mainpkg={DISTRIBUTION}",
        ]
        if dist["commit"]:
            stamps.append(f"-X {DISTRIBUTION}/version.revision={dist['commit']}")
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", " ".join(["-s -w", *stamps]),
             "-o", str(out / "registry"), "./registry"],
            "registry",
        )  # fmt: skip
        oras = gotool.module_info("registry/oras", ORAS)
        # a release build: empty BuildMetadata, so `oras version` says the module's version alone
        stamps = [f"-X {ORAS}/internal/version.GitTreeState=clean"]
        if oras["commit"]:
            stamps.append(f"-X {ORAS}/internal/version.GitCommit={oras['commit']}")
        gotool.go(
            ["build", "-p", jobs, "-trimpath", "-ldflags", " ".join(["-s -w", *stamps]),
             "-o", str(out / "oras"), f"{ORAS}/cmd/oras"],
            "registry/oras",
        )  # fmt: skip
        (out / "REGISTRY_VERSION").write_text(dist["version"] + "\n")
        (out / "ORAS_VERSION").write_text(oras["version"] + "\n")

    return support.cached("registry", key, make)
