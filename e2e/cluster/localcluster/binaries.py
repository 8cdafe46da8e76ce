"""The control plane's and the node's binaries, built from the pinned Go modules into ``<cache>/bin-<hash>``.

The hash covers the modules' go.mod/go.sum and ``BUILD_RECIPE``, so a changed pin or recipe never reuses stale
binaries; the folder is built once, atomically (``scaffold.build_once``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from . import scaffold
from .base import CLUSTER_DIR, ClusterError, cache_dir, log
from .gotool import go, module_info

MODULES = ("k8s", "etcd", "kwok", "helm", "coredns")

# Bump when the build recipe below changes (tags, ldflags, outputs): it is part of the
# bin-<hash> name so a changed recipe never reuses stale binaries.
BUILD_RECIPE = "v2 tags=selinux,notest,grpcnotrace trimpath cgo=0 ldflags=-s,-w,version-stamps pause=gcc-static"
K8S_TAGS = "selinux,notest,grpcnotrace"
K8S_CMDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet", "kube-proxy")
BINARIES = K8S_CMDS + ("etcd", "kwok", "helm", "coredns", "pause")
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def pins_hash() -> str:
    h = hashlib.sha256(BUILD_RECIPE.encode())
    for mod in MODULES:
        for name in ("go.mod", "go.sum"):
            p = CLUSTER_DIR / mod / name
            h.update(f"\0{mod}/{name}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def bin_dir() -> Path:
    return cache_dir() / f"bin-{pins_hash()}"


def build(out: Path) -> None:
    """Build every binary into the (empty) folder ``out``, with version stamps as upstream's builds set them."""
    jobs = os.environ.get("KUBEINFER_GO_BUILD_P", "2")
    common = ["build", "-p", jobs, "-trimpath"]

    # Kubernetes: the four commands in one invocation so shared packages compile once.
    k8s = module_info("k8s", "k8s.io/kubernetes")
    v = k8s["version"]
    major, minor = v.lstrip("v").split(".")[:2]
    x = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        x += [
            f"-X {pkg}.gitVersion={v}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitCommit={k8s['commit']}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={k8s['time']}",
        ]
    go(
        [
            *common,
            "-tags",
            K8S_TAGS,
            "-ldflags",
            " ".join(["-s -w", *x]),
            "-o",
            str(out) + "/",
            *(f"k8s.io/kubernetes/cmd/{c}" for c in K8S_CMDS),
        ],
        "k8s",
    )

    # etcd: version is hard-coded in the module; stamp the commit only.
    etcd = module_info("etcd", "go.etcd.io/etcd/server/v3")
    sha = f" -X go.etcd.io/etcd/api/v3/version.GitSHA={etcd['commit'][:7]}" if etcd["commit"] else ""
    go([*common, "-ldflags", "-s -w" + sha, "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], "etcd")

    # kwok + its default stages (node initialize/heartbeat, pod ready/complete/delete).
    kwok = module_info("kwok", "sigs.k8s.io/kwok")
    go([*common, "-ldflags", "-s -w", "-o", str(out / "kwok"), "sigs.k8s.io/kwok/cmd/kwok"], "kwok")
    stages = []
    for rel in KWOK_STAGES:
        text = (Path(kwok["dir"]) / rel).read_text().strip()
        stages.append(f"# from sigs.k8s.io/kwok@{kwok['version']}/{rel}\n" + text.removeprefix("---\n"))
    (out / "kwok-stages.yaml").write_text("\n---\n".join(stages) + "\n")

    # helm v3: version stamps as in helm's Makefile.
    helm = module_info("helm", "helm.sh/helm/v3")
    cg = module_info("helm", "k8s.io/client-go")["version"].lstrip("v").split(".")
    kmaj, kmin = str(int(cg[0]) + 1), cg[1]
    hx = [
        f"-X helm.sh/helm/v3/internal/version.version={helm['version']}",
        f"-X helm.sh/helm/v3/internal/version.gitCommit={helm['commit']}",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor={kmaj}",
        f"-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor={kmin}",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor={kmaj}",
        f"-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor={kmin}",
    ]
    go([*common, "-ldflags", " ".join(["-s -w", *hx]), "-o", str(out / "helm"), "helm.sh/helm/v3/cmd/helm"], "helm")

    # CoreDNS for the worker node (wrapper module: upstream's plugins, only those the Corefile uses).
    coredns = module_info("coredns", "github.com/coredns/coredns")
    cx = f"-X github.com/coredns/coredns/coremain.GitCommit={coredns['commit'][:7]}" if coredns["commit"] else ""
    go([*common, "-ldflags", f"-s -w {cx}".strip(), "-o", str(out / "coredns"), "."], "coredns")

    # The pod sandbox ("pause") binary: Kubernetes' own build/pause/linux/pause.c at the pinned version,
    # compiled as upstream's Makefile does (static, -Os); localcluster/node/pause_image.py makes the sandbox image.
    pause_tag = pause_version(Path(k8s["dir"]))
    cc = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{pause_tag}-{v}"]
    src = Path(k8s["dir"]) / "build" / "pause" / "linux" / "pause.c"
    p = subprocess.run([*cc, "-o", str(out / "pause"), str(src)], capture_output=True, text=True)
    if p.returncode != 0:
        raise ClusterError(f"compiling {src} failed (gcc and libc6-dev are needed):\n{p.stderr}")
    subprocess.run(["strip", str(out / "pause")], check=False)
    (out / "pause.version").write_text(pause_tag + "\n")

    for b in BINARIES:
        if not (out / b).is_file():
            raise ClusterError(f"build finished but {out / b} is missing")
    (out / "VERSIONS").write_text(
        json.dumps(
            {
                "kubernetes": v,
                "etcd": etcd["version"],
                "kwok": kwok["version"],
                "helm": helm["version"],
                "coredns": coredns["version"],
                "pause": pause_tag,
            },
            indent=2,
        )
        + "\n"
    )


def pause_version(k8s_dir: Path) -> str:
    """The pause image tag Kubernetes' own Makefile builds at this version (``TAG ?= 3.10.1``)."""
    for line in (k8s_dir / "build" / "pause" / "Makefile").read_text().splitlines():
        if line.replace(" ", "").startswith("TAG?="):
            return line.split("=", 1)[1].strip()
    raise ClusterError("no TAG in build/pause/Makefile")


def ensure_built() -> tuple[Path, float, bool]:
    """Return (bin dir, seconds spent, built now?)."""
    t0 = time.monotonic()
    target = bin_dir()

    def make(out: Path) -> None:
        log(f"building binaries into {target} (cold build of Kubernetes takes a while)")
        build(out)

    if not scaffold.build_once(target, cache_dir() / ".build.lock", make):
        return target, time.monotonic() - t0, False
    dt = time.monotonic() - t0
    log(f"build took {dt:.0f}s")
    return target, dt, True
